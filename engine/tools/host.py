"""The running MCP servers: started when a chat first needs them, stopped with the app, each with its state
and tools; a call runs with a timeout and Stop, and every failure becomes a readable ``ToolOutcome``.

One asyncio loop on a daemon thread owns every server (the ``mcp`` SDK is async; its transports' task groups
must be entered and left by one task, so each server has an owner task that holds its connection open until
it is told to stop). The public methods are blocking and thread-safe: they hand a coroutine to the loop and
wait, polling the caller's CancelToken, so Stop ends a wait at once. A server's stderr goes through a pipe
into a bounded tail (never the app's own stderr), and the secrets a server was given (its environment's
values, its headers) are blotted out of every error, stderr tail and log line.

This module is light: the records and limits live in specs.py (re-exported here), and the machinery on the
SDK (sessions.py, connection.py, listing.py) is imported only when a ``ToolHost`` is made, so importing the
engine's façade costs no ``import mcp``."""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import time
import weakref
from collections.abc import Iterable
from typing import TYPE_CHECKING

from engine.tools.config import ToolConfigError, ToolRegistry
from engine.tools.specs import (
    CALL_GRACE_S,
    DEFAULT_CALL_TIMEOUT_S,
    DEFAULT_START_TIMEOUT_S,
    HTTP_READ_TIMEOUT_S,
    HTTP_TIMEOUT_S,
    MAX_DESCRIPTION_CHARS,
    MAX_ERROR_CHARS,
    MAX_FUNCTION_CHARS,
    MAX_LIST_PAGES,
    MAX_RESULT_CHARS,
    MAX_TOOL_JSON_CHARS,
    MAX_TOOL_NAME_CHARS,
    MAX_TOOLS_EXAMINED,
    MAX_TOOLS_PER_SERVER,
    POLL_S,
    PROBE_TIMEOUT_S,
    REDACTED,
    STDERR_SETTLE_S,
    STDERR_TAIL_BYTES,
    STOP_TIMEOUT_S,
    ServerState,
    ServerStatus,
    ToolOutcome,
    ToolSpec,
    one_line,
    redact,
    sanitize_function,
)
from engine.types import CancelToken

if TYPE_CHECKING:
    from engine.tools.sessions import Core

__all__ = [
    "CALL_GRACE_S", "DEFAULT_CALL_TIMEOUT_S", "DEFAULT_START_TIMEOUT_S", "HTTP_READ_TIMEOUT_S", "HTTP_TIMEOUT_S",
    "MAX_DESCRIPTION_CHARS", "MAX_ERROR_CHARS", "MAX_FUNCTION_CHARS", "MAX_LIST_PAGES", "MAX_RESULT_CHARS",
    "MAX_TOOL_JSON_CHARS", "MAX_TOOL_NAME_CHARS", "MAX_TOOLS_EXAMINED", "MAX_TOOLS_PER_SERVER", "POLL_S",
    "PROBE_TIMEOUT_S", "REDACTED", "STDERR_SETTLE_S", "STDERR_TAIL_BYTES", "STOP_TIMEOUT_S",
    "ServerState", "ServerStatus", "ToolHost", "ToolOutcome", "ToolSpec", "redact", "sanitize_function",
]


class _Stopped(Exception):
    """The caller's CancelToken was set while it waited (or the host closed meanwhile)."""


class ToolHost:
    """Thread-safe; its own asyncio loop on a daemon thread. Methods block their caller (never the UI thread)."""

    def __init__(self, registry: ToolRegistry, *, start_timeout_s: float = DEFAULT_START_TIMEOUT_S,
                 call_timeout_s: float = DEFAULT_CALL_TIMEOUT_S, max_result_chars: int = MAX_RESULT_CHARS):
        # the SDK loads here, with the first host, not when the engine's façade is imported
        from engine.tools.sessions import Core

        self._call_timeout_s = float(call_timeout_s)
        self._core: Core = Core(registry, float(start_timeout_s), int(max_result_chars))
        # a host nobody closed still stops its servers: when it is collected, or when Python exits
        self._finalizer = weakref.finalize(self, self._core.shutdown)

    def status(self) -> list[ServerStatus]:
        """Every configured server's state now (no I/O)."""
        try:
            return self._wait(self._core.status(None))
        except _Stopped:
            return self._core.closed_statuses()

    def ensure(self, names: Iterable[str] | None = None, cancel: CancelToken | None = None) -> list[ServerStatus]:
        """Start the enabled servers (or those named) that are not running, list their tools; a failure is a
        FAILED status, never an exception. A server that failed to start stays FAILED until ``restart``; one
        that crashed after it was ready is started again, once. Stop ends the wait (a start goes on)."""
        wanted = None if names is None else tuple(names)
        try:
            return self._wait(self._core.ensure(wanted), cancel)
        except _Stopped:
            return self.status()

    def tools(self, names: Iterable[str] | None = None, cancel: CancelToken | None = None) -> list[ToolSpec]:
        """``ensure``, then the enabled tools of the ready servers."""
        statuses = self.ensure(names, cancel)
        return [spec for st in statuses if st.state is ServerState.READY for spec in st.tools if spec.enabled]

    def call(self, function: str, arguments: str, cancel: CancelToken | None = None,
             timeout_s: float | None = None) -> ToolOutcome:
        """Run the tool the model calls ``function`` with ``arguments`` (JSON text of an object). Never raises for
        the tool's or its server's failure: a crash, a hang past the timeout, Stop, invalid JSON-RPC, a huge
        result or a tool that raises come back as ``ToolOutcome(is_error=True)`` in plain words."""
        began = time.monotonic()

        def done(text: str, is_error: bool = True, cut_from: int | None = None) -> ToolOutcome:
            return ToolOutcome(text=text, is_error=is_error, cut_from=cut_from,
                               elapsed_ms=int((time.monotonic() - began) * 1000))

        try:
            args = json.loads(arguments) if arguments and arguments.strip() else {}
        except (ValueError, TypeError) as exc:
            return done(f"the arguments for {function!r} are not valid JSON ({one_line(exc, 200)}); "
                        "send them as a JSON object")
        if not isinstance(args, dict):
            return done(f"the arguments for {function!r} must be a JSON object, not {_json_kind(args)}")
        timeout = self._call_timeout_s if timeout_s is None else float(timeout_s)
        try:
            text, is_error, cut_from = self._wait(self._core.call(function, args, timeout), cancel)
        except _Stopped:
            if self._core.closed:
                return done("the tool host is closed: no tool can run now")
            return done(f"stopped: the call to {function!r} was stopped before it finished")
        except ToolConfigError as exc:
            return done(f"the tools' configuration cannot be read: {exc}")
        return done(text, is_error, cut_from)

    def restart(self, name: str) -> ServerStatus:
        """Stop ``name`` if it runs and start it again (also after it failed to start)."""
        try:
            return self._wait(self._core.restart(name))
        except _Stopped:
            raise ToolConfigError("the tool host is closed") from None

    def close(self) -> None:
        """Stop every server (and the loop); idempotent."""
        self._finalizer()

    def _wait(self, coro, cancel: CancelToken | None = None):
        """Run ``coro`` on the loop and wait for it, looking at ``cancel`` every POLL_S."""
        if self._core.closed:
            coro.close()
            raise _Stopped
        try:
            fut = asyncio.run_coroutine_threadsafe(coro, self._core.loop)
        except RuntimeError:  # the loop closed meanwhile
            coro.close()
            raise _Stopped from None
        while True:
            try:
                return fut.result(timeout=POLL_S)
            except concurrent.futures.TimeoutError:
                if cancel is not None and cancel.cancelled:
                    fut.cancel()
                    raise _Stopped from None
                if not self._core.thread.is_alive():
                    raise _Stopped from None
            except concurrent.futures.CancelledError:  # the loop cancelled it on its way down (close)
                raise _Stopped from None


def _json_kind(value: object) -> str:
    return {list: "an array", str: "a string", bool: "true or false", int: "a number", float: "a number",
            type(None): "null"}.get(type(value), type(value).__name__)
