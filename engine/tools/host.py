"""The running MCP servers: started when a chat first needs them, stopped with the app, each with its state
and tools; a call runs with a timeout and Stop, and every failure becomes a readable ``ToolOutcome``.

STUB: the body is filled in by its own change; the shapes below are the contract."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum

from engine.tools.config import ToolRegistry
from engine.types import CancelToken

DEFAULT_CALL_TIMEOUT_S = 60.0
DEFAULT_START_TIMEOUT_S = 30.0
MAX_RESULT_CHARS = 32_000  # what one result may give the model; the rest is cut with a note saying so


class ServerState(StrEnum):
    STOPPED = "stopped"  # not started yet (or stopped)
    STARTING = "starting"
    READY = "ready"
    FAILED = "failed"


@dataclass(frozen=True)
class ToolSpec:
    """One tool as its server lists it, and the function name the model is offered for it (unique across
    servers, OpenAI's 1–64 of [a-zA-Z0-9_-])."""

    server: str
    name: str  # the MCP tool's own name
    function: str  # what the model calls
    description: str
    parameters: dict  # the input JSON schema (an object schema)
    enabled: bool = True  # the person's switch (config's disabled_tools)

    def openai(self) -> dict:
        """The tool as a chat request offers it (``TurnRequest.tools``)."""
        return {"type": "function", "function": {"name": self.function, "description": self.description,
                                                 "parameters": self.parameters}}


@dataclass(frozen=True)
class ServerStatus:
    name: str
    state: ServerState
    tools: tuple[ToolSpec, ...] = ()
    error: str = ""  # why it failed, in plain words
    stderr_tail: str = ""  # the last few KiB of its stderr (stdio)


@dataclass(frozen=True)
class ToolOutcome:
    """What a call gave: the text the model and the person read (bounded), whether it is an error."""

    text: str
    is_error: bool = False
    cut_from: int | None = None  # the result's length in characters when it was cut to MAX_RESULT_CHARS
    elapsed_ms: int = 0


class ToolHost:
    """Thread-safe; its own asyncio loop on a daemon thread. Methods block their caller (never the UI thread)."""

    def __init__(self, registry: ToolRegistry, *, start_timeout_s: float = DEFAULT_START_TIMEOUT_S,
                 call_timeout_s: float = DEFAULT_CALL_TIMEOUT_S, max_result_chars: int = MAX_RESULT_CHARS):
        raise NotImplementedError

    def status(self) -> list[ServerStatus]:
        """Every configured server's state now (no I/O)."""
        raise NotImplementedError

    def ensure(self, names: Iterable[str] | None = None, cancel: CancelToken | None = None) -> list[ServerStatus]:
        """Start the enabled servers (or those named) that are not running, list their tools; a failure is a
        FAILED status, never an exception."""
        raise NotImplementedError

    def tools(self, names: Iterable[str] | None = None, cancel: CancelToken | None = None) -> list[ToolSpec]:
        """``ensure``, then the enabled tools of the ready servers."""
        raise NotImplementedError

    def call(self, function: str, arguments: str, cancel: CancelToken | None = None,
             timeout_s: float | None = None) -> ToolOutcome:
        """Run the tool the model calls ``function`` with ``arguments`` (JSON text of an object). Never raises for
        the tool's or its server's failure: a crash, a hang past the timeout, Stop, invalid JSON-RPC, a huge
        result or a tool that raises come back as ``ToolOutcome(is_error=True)`` in plain words."""
        raise NotImplementedError

    def restart(self, name: str) -> ServerStatus:
        raise NotImplementedError

    def close(self) -> None:
        """Stop every server (and the loop); idempotent."""
        raise NotImplementedError
