"""What a worker thread's job reports when it fails: "" or why, in words (app/remote_worker.py, app/tool_worker.py).
An engine error is already in words; a disk error says what was being done; anything else is a bug, whose
traceback goes to the log and whose message names only its type (it may hold what a secret store returned)."""

from __future__ import annotations

import logging
import traceback
from collections.abc import Callable

from engine.errors import HearthError

log = logging.getLogger(__name__)


def guarded(what: str, call: Callable[[], object]) -> str:
    """Run ``call``; "" or why it failed, in words."""
    try:
        call()
        return ""
    except HearthError as exc:
        return str(exc)
    except OSError as exc:
        return f"{what} failed: {exc.strerror or exc}"
    except Exception as exc:  # a bug: the traceback to the log, the person told plainly
        log.error("%s failed:\n%s", what, traceback.format_exc())
        return f"{what} failed unexpectedly: {type(exc).__name__}"
