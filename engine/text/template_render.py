"""A chat template compiled and rendered in this process, in the bounded sandbox of template_limits.py: what
built-in templates use, and what the template worker's child runs for a file's own template. Below both
chat_template.py and template_worker.py, so neither climbs to the other."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from engine.errors import PromptError, TemplateError, UnsupportedModelError
from engine.text import template_limits

ROLES = ("system", "user", "assistant", "tool")
RENDER_SECONDS = 5.0  # a real template renders a long conversation in milliseconds
MAX_TOOL_CALLS = 64  # in one assistant message (a reply is parsed to at most this many: reply_parse.py)
MAX_ID_CHARS = 256  # a tool call id (OpenAI's are ~30 characters)
MAX_VARIABLES = 32  # chat_template_kwargs: a handful of switches (enable_thinking, reasoning_effort)
MAX_VARIABLE_BYTES = 64 * 1024
# Names a template variable may not take: the ones every render sets itself.
_RESERVED = frozenset(("messages", "tools", "add_generation_prompt", "bos_token", "eos_token", "raise_exception",
                       "strftime_now", "range", "namespace"))
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")


def one_line(exc: BaseException, limit: int = 300) -> str:
    """An exception as a short single line: the template's errors are shown to the user as they are."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= limit else text[: limit - 1] + "…"


class LocalTemplate:
    """``source`` compiled here; ``name`` is how errors call it ("the chat template in model.gguf")."""

    def __init__(self, source: str, bos_token: str = "", eos_token: str = "", name: str = "the model's chat template"):
        self.name = name
        self.bos_token, self.eos_token = bos_token, eos_token
        self._template = self._compile(source)

    def _compile(self, source: str):
        from jinja2 import TemplateSyntaxError

        def raise_exception(message: str) -> None:
            raise TemplateError(f"refused these messages: {message}")

        env = template_limits.BoundedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.filters["tojson"] = template_limits.bounded_filter("tojson", _tojson)
        env.globals["raise_exception"] = raise_exception
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(str(fmt)[:200])
        # Folding constants runs template code: under a render's budget, so a hostile constant is not
        # folded (jinja leaves whatever raises to the render, where the same limit refuses it).
        token = template_limits.rendering_with(template_limits.Budget.for_input(0, 0, RENDER_SECONDS))
        try:
            return env.from_string(source)
        except TemplateSyntaxError as exc:
            raise UnsupportedModelError(f"{self.name} is not valid Jinja: {one_line(exc)}") from exc
        except Exception as exc:  # a file's template: too long, too deeply nested, a literal too large
            raise UnsupportedModelError(f"{self.name} cannot be compiled: {type(exc).__name__}: {one_line(exc)}") from exc
        finally:
            template_limits.done_rendering(token)

    def render(self, messages: list[dict], add_generation_prompt: bool = True,
               seconds: float = RENDER_SECONDS, *, tools: list[dict] | None = None,
               variables: Mapping[str, Any] | None = None) -> str:
        """The prompt text; a TemplateError naming the template if it fails or runs past its limits.
        ``tools`` (OpenAI function tools) and ``variables`` (``chat_template_kwargs``) reach the template as
        top-level names, as Hugging Face's ``apply_chat_template`` passes them."""
        validate_messages(messages)
        extra = check_variables(variables)
        chars = (input_chars(messages, tools) + len(json.dumps(extra, ensure_ascii=False)) + len(self.bos_token)
                 + len(self.eos_token))
        token = template_limits.rendering_with(template_limits.Budget.for_input(chars, len(messages), seconds))
        try:
            return "".join(self._template.generate(
                **extra, messages=messages, tools=tools or None, add_generation_prompt=add_generation_prompt,
                bos_token=self.bos_token, eos_token=self.eos_token,
            ))
        except TemplateError as exc:  # a limit, or the template's raise_exception
            raise TemplateError(f"{self.name} {exc}") from None
        except MemoryError:  # the template worker's address-space ceiling (engine/text/template_worker.py)
            raise TemplateError(f"{self.name} ran out of memory") from None
        except Exception as exc:  # noqa: BLE001 (the template is foreign code: any failure is its own)
            raise TemplateError(f"{self.name} failed to render: {type(exc).__name__}: {one_line(exc)}") from None
        finally:
            template_limits.done_rendering(token)


def _tojson(value: Any, indent: int | str | None = None, ensure_ascii: bool = False, separators: Any = None,
            sort_keys: bool = False) -> str:
    """``tojson`` as Hugging Face transformers defines it for chat templates (keys in order, no HTML escaping),
    so a tool's schema and a call's arguments render to the bytes the model was trained on and a client's echo
    of ``json.dumps``'d arguments renders to the same bytes as the call it made."""
    if separators is not None:
        separators = tuple(separators)
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def input_chars(messages: list[dict], tools: list[dict] | None = None) -> int:
    """The size of what a render is given (its output budget grows with it)."""
    size = 0
    for m in messages:
        size += len(m["content"])
        for key in ("tool_calls", "reasoning_content", "tool_call_id", "name"):
            if key in m:
                size += len(json.dumps(m[key], ensure_ascii=False, default=str))
    return size + (len(json.dumps(tools, ensure_ascii=False, default=str)) if tools else 0)


def check_variables(variables: Mapping[str, Any] | None) -> dict:
    """``chat_template_kwargs`` checked: a few JSON values under identifier names that no render sets itself."""
    if not variables:
        return {}
    if not isinstance(variables, Mapping):
        raise PromptError("chat_template_kwargs must be an object of names and values")
    if len(variables) > MAX_VARIABLES:
        raise PromptError(f"chat_template_kwargs has {len(variables)} entries; at most {MAX_VARIABLES} are accepted")
    for name in variables:
        if not isinstance(name, str) or not _NAME.match(name):
            raise PromptError(f"chat_template_kwargs name {str(name)[:80]!r} is not a template variable name")
        if name in _RESERVED:
            raise PromptError(f"chat_template_kwargs may not set {name!r}: the request itself says what it is")
    try:
        size = len(json.dumps(dict(variables), ensure_ascii=False, allow_nan=False))
    except (TypeError, ValueError):
        raise PromptError("chat_template_kwargs values must be JSON (text, numbers, true/false, null, lists, objects)") from None
    if size > MAX_VARIABLE_BYTES:
        raise PromptError(f"chat_template_kwargs is {size:,} bytes as JSON; at most {MAX_VARIABLE_BYTES:,} are accepted")
    return dict(variables)


def validate_messages(messages: object) -> None:
    """Messages must be a non-empty list of {"role", "content"} with text content; an assistant message may
    carry ``tool_calls`` and ``reasoning_content``, a tool message ``tool_call_id`` and ``name``."""
    if not isinstance(messages, list) or not messages:
        raise PromptError("messages must be a non-empty list of {\"role\", \"content\"} objects")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or "role" not in m or "content" not in m:
            raise PromptError(f"message {i} must be an object with \"role\" and \"content\"")
        if m["role"] not in ROLES:
            raise PromptError(f"message {i} has role {m['role']!r}; use one of: {', '.join(ROLES)}")
        if not isinstance(m["content"], str):
            raise PromptError(f"message {i} content must be text")
        _check_tool_fields(i, m)
    if not any(m["content"].strip() for m in messages if m["role"] == "user"):
        raise PromptError("the prompt is empty: write a message first")


def _check_tool_fields(i: int, m: dict) -> None:
    calls = m.get("tool_calls")
    if calls is not None:
        if m["role"] != "assistant":
            raise PromptError(f"message {i} has tool_calls, which only an assistant message may carry")
        if not isinstance(calls, list) or len(calls) > MAX_TOOL_CALLS:
            raise PromptError(f"message {i} tool_calls must be a list of at most {MAX_TOOL_CALLS} calls")
        for j, call in enumerate(calls):
            function = call.get("function") if isinstance(call, dict) else None
            if not isinstance(function, dict) or not isinstance(function.get("name"), str) or not function["name"]:
                raise PromptError(f"message {i} tool call {j} needs a function with a name")
            if not isinstance(function.get("arguments"), (str, dict)):
                raise PromptError(f"message {i} tool call {j} arguments must be a JSON string or an object")
            if not isinstance(call.get("id", ""), str) or len(call.get("id", "")) > MAX_ID_CHARS:
                raise PromptError(f"message {i} tool call {j} id must be text of at most {MAX_ID_CHARS} characters")
    for key in ("tool_call_id", "name", "reasoning_content"):
        value = m.get(key)
        if value is not None and not isinstance(value, str):
            raise PromptError(f"message {i} {key} must be text")
    if m["role"] == "tool":
        call_id = m.get("tool_call_id")
        if call_id is not None and len(call_id) > MAX_ID_CHARS:
            raise PromptError(f"message {i} tool_call_id is longer than {MAX_ID_CHARS} characters")
