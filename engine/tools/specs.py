"""What the MCP tool host gives and takes, without the SDK: the limits it works within, a server's state, a
tool as the model is offered it, a call's outcome, and the pure text helpers they need (secrets blotted out,
MCP tool names as OpenAI function names).

Kept apart from the host's machinery (sessions.py, connection.py, listing.py) so that importing the engine's
façade costs no ``import mcp``: only starting a ``ToolHost`` loads the SDK."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum

DEFAULT_CALL_TIMEOUT_S = 60.0
DEFAULT_START_TIMEOUT_S = 30.0
MAX_RESULT_CHARS = 32_000  # what one result may give the model; the rest is cut with a note saying so

MAX_TOOLS_PER_SERVER = 128
MAX_TOOLS_EXAMINED = 4 * MAX_TOOLS_PER_SERVER  # a listing of thousands of unusable tools is not read to its end
MAX_TOOL_NAME_CHARS = 256  # MCP asks for 1-128; the function name is cut to 64 anyway
MAX_TOOL_JSON_CHARS = 64 * 1024  # one tool's listing (name, description, schema) as JSON
MAX_DESCRIPTION_CHARS = 4 * 1024
MAX_LIST_PAGES = 16  # tools/list pages followed; a paginator that never ends cannot hang a start
MAX_FUNCTION_CHARS = 64  # OpenAI's function names: 1-64 of [a-zA-Z0-9_-]
STDERR_TAIL_BYTES = 4 * 1024
REDACTED = "•••"
POLL_S = 0.05  # how often a waiting caller looks at its CancelToken
STDERR_SETTLE_S = 2.0  # after a server stopped, how long to wait for the rest of its stderr
PROBE_TIMEOUT_S = 5.0  # a liveness check (tools/list) after a timed-out call or a closed stderr
CALL_GRACE_S = 5.0  # past the call's own timeout, how long before the host gives up on the SDK's answer
STOP_TIMEOUT_S = 12.0  # the SDK stops a stdio server in at most ~6 s (stdin closed, SIGTERM, SIGKILL)
MAX_ERROR_CHARS = 600
HTTP_TIMEOUT_S = 30.0
HTTP_READ_TIMEOUT_S = 300.0

_FUNCTION_BAD = re.compile(r"[^a-zA-Z0-9_-]")


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


# --- small helpers ------------------------------------------------------------------------------------------


def redact(text: str, secrets: Iterable[str]) -> str:
    """``text`` with every secret value replaced by •••; the longest first, so one that holds another goes whole."""
    for secret in sorted({s for s in secrets if s}, key=len, reverse=True):
        text = text.replace(secret, REDACTED)
    return text


def sanitize_function(name: str) -> str:
    """An MCP tool's name as an OpenAI function name: other characters become '_', at most 64, never empty."""
    return _FUNCTION_BAD.sub("_", name)[:MAX_FUNCTION_CHARS] or "tool"


def unique_function(name: str, used: set[str]) -> str:
    """``name``, or ``name`` with a _2, _3, ... suffix (still at most 64 characters) when ``used`` has it."""
    n = 2
    candidate = name
    while candidate in used:
        suffix = f"_{n}"
        candidate = name[:MAX_FUNCTION_CHARS - len(suffix)] + suffix
        n += 1
    return candidate


def one_line(text: object, limit: int = MAX_ERROR_CHARS) -> str:
    """``text`` on one line (runs of whitespace made one space), cut to ``limit`` characters with an ellipsis."""
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[:limit - 1] + "…"


def describe(exc: BaseException | None) -> str:
    """An exception as its type and message (the type alone when it has none)."""
    if exc is None:
        return "an unknown error"
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
