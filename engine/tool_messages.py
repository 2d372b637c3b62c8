"""A reply's tool calls as the store keeps them: the JSON text of OpenAI's list
(``[{"id", "type": "function", "function": {"name", "arguments"}}]``, arguments a JSON string), bounded, and
read back into ``ToolCall``s. The same list is what ``Message.as_chat`` gives the chat template and what an
export carries, so one shape goes everywhere. Every function raises ValueError with the problem in words;
the callers say where (ConversationError from the store, PromptError from a request, TransferError from an
import)."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence

from engine.text.template_render import MAX_ID_CHARS, MAX_TOOL_CALLS
from engine.types import ToolCall, openai_tool_calls

MAX_CALLS = MAX_TOOL_CALLS  # calls in one message, as a request may carry them (and the parser makes at most)
MAX_ARGUMENTS_CHARS = 256 << 10  # one call's arguments
MAX_CALLS_CHARS = 1 << 20  # the whole list as stored
NAME_PATTERN = re.compile(r"[A-Za-z0-9_.:-]{1,128}")  # OpenAI's function names (64) and then some
_ID_PATTERN = re.compile(r"[\x21-\x7e]+")  # printable ASCII, no spaces


def check_id(call_id: object, what: str = "a tool call id") -> str:
    if not isinstance(call_id, str) or not call_id:
        raise ValueError(f"{what} must be non-empty text")
    if len(call_id) > MAX_ID_CHARS or not _ID_PATTERN.fullmatch(call_id):
        raise ValueError(f"{what} {call_id[:40]!r} is not an id: use 1–{MAX_ID_CHARS} printable ASCII characters "
                         "without spaces")
    return call_id


def check_name(name: object, what: str = "a tool's name") -> str:
    if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name):
        shown = name[:40] if isinstance(name, str) else name
        raise ValueError(f"{what} {shown!r} is not a function name: use 1–128 letters, digits, '_', '.', ':' or '-'")
    return name


def check_calls(calls: Sequence[ToolCall]) -> tuple[ToolCall, ...]:
    """The calls, checked: at most MAX_CALLS, each with an id, a function name and arguments that are the
    JSON text of an object (what a template parses), within MAX_ARGUMENTS_CHARS."""
    calls = tuple(calls)
    if len(calls) > MAX_CALLS:
        raise ValueError(f"{len(calls)} tool calls in one message; at most {MAX_CALLS}")
    for i, c in enumerate(calls):
        if not isinstance(c, ToolCall):
            raise ValueError(f"tool call {i + 1} is not a ToolCall")
        check_id(c.id, f"tool call {i + 1}'s id")
        check_name(c.name, f"tool call {i + 1}'s name")
        _check_arguments(c.arguments, f"tool call {i + 1} ({c.name})")
    return calls


def _check_arguments(arguments: object, what: str) -> None:
    if not isinstance(arguments, str):
        raise ValueError(f"{what}: arguments must be a JSON string, not {type(arguments).__name__}")
    if len(arguments) > MAX_ARGUMENTS_CHARS:
        raise ValueError(f"{what}: arguments are {len(arguments):,} characters; at most {MAX_ARGUMENTS_CHARS:,}")
    try:
        parsed = json.loads(arguments)
    except (ValueError, RecursionError):
        raise ValueError(f"{what}: arguments are not valid JSON") from None
    if not isinstance(parsed, dict):
        raise ValueError(f"{what}: arguments must be a JSON object, not {type(parsed).__name__}")


def from_openai(listed: object) -> tuple[ToolCall, ...]:
    """OpenAI's ``tool_calls`` list (a request's history, an import) as checked ``ToolCall``s."""
    if not isinstance(listed, list):
        raise ValueError(f"tool_calls must be a list, not {type(listed).__name__}")
    if len(listed) > MAX_CALLS:
        raise ValueError(f"{len(listed)} tool calls in one message; at most {MAX_CALLS}")
    calls = []
    for i, item in enumerate(listed):
        fn = item.get("function") if isinstance(item, dict) else None
        if not isinstance(fn, dict) or item.get("type", "function") != "function":
            raise ValueError(f'tool call {i + 1} must be {{"id", "type": "function", "function": {{"name", '
                             '"arguments"}}}')
        calls.append(ToolCall(item.get("id"), fn.get("name"), fn.get("arguments"), i))
    return check_calls(calls)


def to_json(calls: Sequence[ToolCall]) -> str | None:
    """The stored text of ``calls`` (None: no calls, stored as NULL), checked and bounded."""
    calls = check_calls(calls)
    if not calls:
        return None
    text = json.dumps(openai_tool_calls(calls), ensure_ascii=False, separators=(",", ":"))
    if len(text) > MAX_CALLS_CHARS:
        raise ValueError(f"the tool calls are {len(text):,} characters of JSON; at most {MAX_CALLS_CHARS:,}")
    return text


def from_json(text: str | None) -> tuple[ToolCall, ...]:
    """The calls stored as ``text`` (None or "": none); ValueError when it is not such a list."""
    if not text:
        return ()
    if len(text) > MAX_CALLS_CHARS:
        raise ValueError(f"the stored tool calls are {len(text):,} characters; at most {MAX_CALLS_CHARS:,}")
    try:
        listed = json.loads(text)
    except (ValueError, RecursionError):
        raise ValueError("the stored tool calls are not valid JSON") from None
    return from_openai(listed)


def pretty_arguments(text: str) -> str:
    """JSON text (a call's arguments, a tool's result) indented for reading; anything else as it is (a model's
    output and a tool's are anyone's)."""
    try:
        return json.dumps(json.loads(text), ensure_ascii=False, indent=2)
    except (ValueError, RecursionError):
        return text
