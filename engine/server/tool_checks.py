"""Checks both APIs make on tools and the history a client sends back, before the engine sees them:
duplicate or unknown tool names, tool results that answer no call, arguments that are not JSON objects,
template variables past their bounds. Each refusal is an ``ApiError`` 400 naming the field."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence

from engine.server.errors import ApiError

MAX_ARGUMENTS_CHARS = 256 * 1024  # one call's arguments in the history
MAX_TEMPLATE_KWARGS_BYTES = 16 * 1024  # chat_template_kwargs as JSON: switches, not documents
MAX_KWARG_NAME = 64


def bad(message: str, param: str | None, code: str = "invalid_value") -> ApiError:
    return ApiError(400, message, param=param, code=code)


def tool_names(names: Iterable[str], param: str) -> set[str]:
    """The tools' names; a name given twice is a 400 (a call could not say which it meant)."""
    seen: set[str] = set()
    for i, name in enumerate(names):
        if name in seen:
            raise bad(f"two tools are named '{name}': tool names must be unique", f"{param}.{i}")
        seen.add(name)
    return seen


def require_tool(name: str, names: set[str], param: str) -> None:
    """A tool_choice naming a tool must name one of the request's."""
    if name not in names:
        listed = ", ".join(sorted(names)[:10]) or "none"
        raise bad(f"tool_choice names the tool '{name}', which is not among the request's tools ({listed})", param)


def arguments_text(raw: str | Mapping, param: str) -> str:
    """A call's arguments as OpenAI's wire carries them: the JSON text of an object (a dict is written as
    ``json.dumps`` writes it; "" is read as no arguments, as some clients send for a call without any)."""
    if isinstance(raw, Mapping):
        return json.dumps(raw, ensure_ascii=False)
    if raw.strip() == "":
        return "{}"
    if len(raw) > MAX_ARGUMENTS_CHARS:
        raise bad(f"a tool call's arguments may be at most {MAX_ARGUMENTS_CHARS:,} characters", param)
    try:
        value = json.loads(raw)
    except ValueError as exc:
        raise bad(f"a tool call's arguments must be the JSON text of an object: {exc}", param) from None
    if not isinstance(value, dict):
        raise bad(f"a tool call's arguments must be a JSON object, got {type(value).__name__}", param)
    return raw


def check_answers(messages: Sequence[Mapping], param_of: Callable[[int], str]) -> None:
    """Every tool message answers a call an earlier assistant message made (by its id), as OpenAI requires;
    ``param_of(i)`` names message i's id field in the client's request."""
    called: set[str] = set()
    for i, message in enumerate(messages):
        for call in message.get("tool_calls") or ():
            called.add(call["id"])
        if message["role"] == "tool" and message["tool_call_id"] not in called:
            raise bad(f"the tool result for '{message['tool_call_id'][:100]}' answers no tool call made earlier in "
                      "the conversation", param_of(i))


def template_kwargs(kwargs: Mapping | None, param: str) -> dict:
    """``chat_template_kwargs`` bounded: names are identifiers, the whole is small JSON."""
    if not kwargs:
        return {}
    for name in kwargs:
        if not name.isidentifier() or len(name) > MAX_KWARG_NAME:
            raise bad(f"'{name[:100]}' is not a template variable name (letters, digits and _, at most "
                      f"{MAX_KWARG_NAME} characters)", f"{param}.{name[:100]}")
    if len(json.dumps(kwargs, ensure_ascii=False).encode()) > MAX_TEMPLATE_KWARGS_BYTES:
        raise bad(f"{param} may be at most {MAX_TEMPLATE_KWARGS_BYTES:,} bytes of JSON", param)
    return dict(kwargs)
