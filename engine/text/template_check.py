"""A file's chat template is tried once, in the template worker's child process, before it is trusted.

The render runs where engine/text/template_worker.py bounds it: the sandbox's limits, a memory ceiling
and a kill past the time limit. A template that runs past its time is refused like any other failure;
it is never tried again in this process, where a C-level call cannot be stopped. The verdict is kept
per template text for the life of the process.
"""

from __future__ import annotations

import hashlib
import logging
import threading

from engine.errors import HearthError
from engine.text.chat_template import ChatTemplate, one_line

log = logging.getLogger(__name__)

RENDER_SECONDS = 2.0  # each trial render; a real template takes milliseconds

# A conversation every chat template should accept: alternating turns, no system message (some
# templates refuse one).
SAMPLE = [
    {"role": "user", "content": "Hello! Can you help me with something?"},
    {"role": "assistant", "content": "Of course. What do you need?"},
    {"role": "user", "content": "Write one sentence about the sea."},
]

_verdicts: dict[str, str] = {}  # sha256 of (template, bos, eos) → "" (it renders) or why not
_lock = threading.Lock()


def template_problem(source: str, bos: str = "", eos: str = "", seconds: float = RENDER_SECONDS) -> str:
    """"" when the template renders the sample conversation within its limits, else why not (one line)."""
    key = hashlib.sha256("\x00".join((source, bos, eos)).encode("utf-8", "surrogatepass")).hexdigest()
    with _lock:  # one check per template, even when two threads load the same model
        if key not in _verdicts:
            _verdicts[key] = trial_render(source, bos, eos, seconds)
            if _verdicts[key]:
                log.warning("chat template refused: %s", _verdicts[key])
        return _verdicts[key]


def trial_render(source: str, bos: str, eos: str, seconds: float = RENDER_SECONDS) -> str:
    """Compile and render the sample, with and without the generation prompt: "" or the failure."""
    try:
        template = ChatTemplate(source, bos, eos, name="it", isolated=True)
        template.render(SAMPLE, add_generation_prompt=True, seconds=seconds)
        template.render(SAMPLE[:2], add_generation_prompt=False, seconds=seconds)
    except HearthError as exc:
        return one_line(exc)
    except Exception as exc:  # noqa: BLE001 (anything else the template provokes)
        return f"it failed: {type(exc).__name__}: {one_line(exc)}"
    return ""
