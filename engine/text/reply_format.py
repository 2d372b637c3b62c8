"""How a chat template speaks tools and thinking, read from its source, and what it is given to render.

A template is foreign data; nothing here runs it. ``reply_format_for`` looks for the markers each tool
style is spelled with (docs/tool-calls.md has the table). A template that shows no style Hearth parses
gets the built-in fallback: the tools described in the system prompt and calls written as Hermes-style
``<tool_call>`` tags, which ``template_inputs`` renders as plain text turns the template can express.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from engine.errors import PromptError
from engine.types import ToolChoice, ToolChoiceMode

MAX_TOOLS = 128  # OpenAI's own limit on a request's tools
MAX_TOOL_BYTES = 64 * 1024  # one tool's JSON (its schema, mostly): bounds what the grammar compiler is given
NAME_PATTERN = re.compile(r"[a-zA-Z0-9_-]{1,64}")  # OpenAI's pattern for function names

HERMES, LLAMA3_JSON, MISTRAL, MISTRAL_ARGS, FALLBACK = "hermes", "llama3_json", "mistral", "mistral_args", "fallback"
TOOL_CALL_OPEN, TOOL_CALL_CLOSE = "<tool_call>", "</tool_call>"
PYTHON_TAG = "<|python_tag|>"
MISTRAL_CALLS, MISTRAL_ARGS_MARK, MISTRAL_CALL_ID = "[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"

FALLBACK_HEADER = (
    "# Tools\n\n"
    "You may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n"
    "<tools>"
)
FALLBACK_FOOTER = (
    "\n</tools>\n\n"
    "To call a function, reply with a JSON object holding its name and arguments within "
    "<tool_call></tool_call> XML tags:\n"
    "<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n'
    "</tool_call>\n"
    "Each result comes back to you within <tool_response></tool_response> XML tags."
)


@dataclass(frozen=True)
class ReplyFormat:
    """``tool_style``: how the model writes a call ("hermes", "llama3_json", "mistral", "mistral_args",
    "fallback");
    ``native_tools``: the template renders ``tools``, tool calls and tool messages itself;
    ``think_open``/``think_close``: the thinking markers ("" when the template has none);
    ``string_arguments``: the template writes a call's arguments given as a JSON string as they are
    (Qwen's tests ``arguments is string``), so the client's echo renders byte for byte."""

    tool_style: str = FALLBACK
    native_tools: bool = False
    think_open: str = ""
    think_close: str = ""
    string_arguments: bool = False

    @property
    def thinks(self) -> bool:
        return bool(self.think_open and self.think_close)


def reply_format_for(template_source: str) -> ReplyFormat:
    """The tool style and thinking markers ``template_source`` (a chat template's Jinja) shows."""
    src = template_source or ""
    renders_tools = bool(re.search(r"\btools\b", src)) and "tool_calls" in src
    if MISTRAL_CALLS in src:
        style = MISTRAL_ARGS if MISTRAL_ARGS_MARK in src else MISTRAL
    elif TOOL_CALL_OPEN in src and TOOL_CALL_CLOSE in src:
        style = HERMES
    elif PYTHON_TAG in src or ("<|start_header_id|>" in src and '"parameters"' in src):
        style = LLAMA3_JSON
    else:
        style = FALLBACK
    native = style != FALLBACK and renders_tools
    thinks = THINK_OPEN in src and THINK_CLOSE in src
    return ReplyFormat(
        tool_style=style if native else FALLBACK,
        native_tools=native,
        think_open=THINK_OPEN if thinks else "",
        think_close=THINK_CLOSE if thinks else "",
        string_arguments=native and bool(re.search(r"arguments\s+is\s+string", src)),
    )


def check_tools(tools: object) -> list[dict]:
    """OpenAI function tools, checked and bounded, as plain JSON dicts; a PromptError says what is wrong."""
    if tools is None:
        return []
    if not isinstance(tools, (list, tuple)):
        raise PromptError("tools must be a list of {\"type\": \"function\", \"function\": {...}} objects")
    if len(tools) > MAX_TOOLS:
        raise PromptError(f"tools has {len(tools)} entries; at most {MAX_TOOLS} are accepted")
    checked: list[dict] = []
    names: set[str] = set()
    for i, tool in enumerate(tools):
        if not isinstance(tool, Mapping):
            raise PromptError(f"tools[{i}] must be an object")
        if tool.get("type") != "function":
            raise PromptError(f"tools[{i}] has type {tool.get('type')!r}; only \"function\" tools are supported")
        function = tool.get("function")
        if not isinstance(function, Mapping):
            raise PromptError(f"tools[{i}].function must be an object with a name")
        name = function.get("name")
        if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name):
            raise PromptError(f"tools[{i}].function.name must be 1 to 64 letters, digits, '_' or '-' (got {_shown(name)})")
        if name in names:
            raise PromptError(f"tools[{i}].function.name {name!r} is used by another tool; names must be unique")
        names.add(name)
        if "description" in function and function["description"] is not None and not isinstance(function["description"], str):
            raise PromptError(f"tools[{i}].function.description must be text")
        parameters = function.get("parameters")
        if parameters is not None:
            if not isinstance(parameters, Mapping):
                raise PromptError(f"tools[{i}].function.parameters must be a JSON Schema object")
            if parameters.get("type", "object") != "object":
                raise PromptError(f"tools[{i}].function.parameters must describe an object (type \"object\"), "
                                  f"not {parameters.get('type')!r}")
        try:
            text = json.dumps(tool, ensure_ascii=False, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise PromptError(f"tools[{i}] is not valid JSON: {exc}") from None
        if len(text.encode()) > MAX_TOOL_BYTES:
            raise PromptError(f"tools[{i}] ({name}) is {len(text.encode()):,} bytes of JSON; at most "
                              f"{MAX_TOOL_BYTES:,} are accepted")
        checked.append(json.loads(text))  # plain dicts and lists, detached from the caller's objects
    return checked


def check_tool_choice(choice: ToolChoice, tools: Sequence[Mapping]) -> ToolChoice:
    """``choice`` if ``tools`` (checked ones) can satisfy it; a PromptError otherwise."""
    if not isinstance(choice, ToolChoice):
        raise PromptError("tool_choice must be \"auto\", \"none\", \"required\" or a named function")
    try:
        mode = ToolChoiceMode(choice.mode)
    except ValueError:
        raise PromptError(f"tool_choice {choice.mode!r} is not one of auto, none, required, function") from None
    if mode == ToolChoiceMode.REQUIRED and not tools:
        raise PromptError("tool_choice is \"required\" but the request offers no tools")
    if mode == ToolChoiceMode.FUNCTION:
        if not tools:
            raise PromptError(f"tool_choice names the function {choice.name!r} but the request offers no tools")
        if choice.name not in tool_names(tools):
            raise PromptError(f"tool_choice names the function {choice.name!r}, which is not among the tools "
                              f"({', '.join(sorted(tool_names(tools)))})")
    return ToolChoice(mode, choice.name)


def tool_names(tools: Iterable[Mapping]) -> set[str]:
    """The function names of OpenAI tool dicts."""
    names = set()
    for tool in tools:
        function = tool.get("function") if isinstance(tool, Mapping) else None
        if isinstance(function, Mapping) and isinstance(function.get("name"), str):
            names.add(function["name"])
    return names


def template_inputs(fmt: ReplyFormat, messages: Sequence[Mapping], tools: Sequence[Mapping] = ()
                    ) -> tuple[list[dict], list[dict] | None]:
    """The messages and tools as the template receives them.

    A native template gets the tools and the calls with their arguments as objects (transformers'
    convention; a template ``tojson``s them), or as the JSON text itself where it writes text as it is.
    Any other template gets the fallback: a system-prompt section describing the tools, each call as
    ``<tool_call>`` text in the assistant's turn, and tool results as user turns in ``<tool_response>``."""
    if fmt.native_tools:
        out = [_native_message(fmt, i, m) for i, m in enumerate(messages)]
        return out, [dict(t) for t in tools] or None
    return _fallback_messages(messages, tools), None


def opens_thinking(fmt: ReplyFormat, prompt_text: str) -> bool:
    """The prompt ends inside an open thinking block (DeepSeek-R1 distills end it with "<think>\\n")."""
    if not fmt.thinks:
        return False
    opened = prompt_text.rfind(fmt.think_open)
    if opened < 0 or prompt_text.rfind(fmt.think_close) > opened:
        return False
    return not prompt_text[opened + len(fmt.think_open):].strip()


def reply_markers(fmt: ReplyFormat) -> tuple[str, ...]:
    """The marker texts the reply parser reads for ``fmt``. A vocabulary may hold some as control tokens
    (Llama's ``<|python_tag|>``, Mistral's ``[TOOL_CALLS]``), which a decoder hides: their text must still
    reach the parser."""
    calls = {HERMES: (TOOL_CALL_OPEN, TOOL_CALL_CLOSE), FALLBACK: (TOOL_CALL_OPEN, TOOL_CALL_CLOSE),
             LLAMA3_JSON: (PYTHON_TAG,), MISTRAL: (MISTRAL_CALLS,),
             MISTRAL_ARGS: (MISTRAL_CALLS, MISTRAL_ARGS_MARK, MISTRAL_CALL_ID)}[fmt.tool_style]
    return tuple(m for m in (fmt.think_open, fmt.think_close) if m) + calls


def fallback_system_section(tools: Sequence[Mapping]) -> str:
    """The fallback's description of ``tools`` (docs/tool-calls.md quotes it)."""
    lines = "".join("\n" + json.dumps(t, ensure_ascii=False) for t in tools)
    return FALLBACK_HEADER + lines + FALLBACK_FOOTER


def call_text(name: str, arguments: str) -> str:
    """A call as the fallback (and Hermes) writes it: ``arguments`` is JSON object text, kept as it is."""
    return f'{TOOL_CALL_OPEN}\n{{"name": {json.dumps(name, ensure_ascii=False)}, "arguments": {arguments}}}\n{TOOL_CALL_CLOSE}'


# --- native ------------------------------------------------------------------------------------------

def _native_message(fmt: ReplyFormat, i: int, message: Mapping) -> dict:
    m = dict(message)
    calls = m.pop("tool_calls", None)
    if calls:  # Llama's template tests ``'tool_calls' in message``: the key is there only with calls
        m["tool_calls"] = [_native_call(fmt, i, j, c) for j, c in enumerate(calls)]
    if fmt.tool_style in (MISTRAL, MISTRAL_ARGS) and m.get("role") == "tool" and isinstance(m.get("tool_call_id"), str):
        m["tool_call_id"] = _mistral_id(m["tool_call_id"])
    return m


def _native_call(fmt: ReplyFormat, i: int, j: int, call: Mapping) -> dict:
    if not isinstance(call, Mapping) or not isinstance(call.get("function"), Mapping):
        raise PromptError(f"message {i} tool call {j} needs a function with a name")
    function = dict(call["function"])
    arguments = function.get("arguments", "{}")
    if isinstance(arguments, str) and not fmt.string_arguments:
        function["arguments"] = _arguments_object(i, j, arguments)
    elif isinstance(arguments, str):
        _arguments_object(i, j, arguments)  # still checked: a template given broken JSON would echo it
    out = {**call, "type": call.get("type", "function"), "function": function}
    if fmt.tool_style in (MISTRAL, MISTRAL_ARGS):  # Mistral's templates refuses ids that are not 9 letters or digits
        out["id"] = _mistral_id(str(call.get("id", "")))
    return out


def _arguments_object(i: int, j: int, text: str) -> dict:
    try:
        value = json.loads(text)
    except ValueError:
        raise PromptError(f"message {i} tool call {j} arguments are not valid JSON") from None
    if not isinstance(value, dict):
        raise PromptError(f"message {i} tool call {j} arguments must be a JSON object")
    return value


def _mistral_id(call_id: str) -> str:
    """A call id as Mistral's template requires (9 letters or digits): the same id always maps to the
    same one, so a call and its result still pair up and the prompt renders the same bytes each time."""
    if len(call_id) == 9 and call_id.isascii() and call_id.isalnum():
        return call_id
    digest = int.from_bytes(hashlib.sha256(call_id.encode()).digest()[:8], "big")
    alphabet = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
    chars = []
    for _ in range(9):
        digest, k = divmod(digest, len(alphabet))
        chars.append(alphabet[k])
    return "".join(chars)


# --- fallback ----------------------------------------------------------------------------------------

def _fallback_messages(messages: Sequence[Mapping], tools: Sequence[Mapping]) -> list[dict]:
    out: list[dict] = []
    for i, m in enumerate(messages):
        role = m.get("role")
        if role == "tool":
            result = f"<tool_response>\n{m.get('content', '')}\n</tool_response>"
            if out and out[-1].get("_tool_results"):  # results of one turn's calls share one user turn
                out[-1]["content"] += "\n" + result
            else:
                out.append({"role": "user", "content": result, "_tool_results": True})
            continue
        plain = {k: v for k, v in m.items() if k not in ("tool_calls", "tool_call_id", "name")}
        calls = m.get("tool_calls") or []
        if calls:
            texts = [_fallback_call(i, j, c) for j, c in enumerate(calls)]
            plain["content"] = "\n".join(([m["content"]] if m.get("content") else []) + texts)
        out.append(plain)
    for m in out:
        m.pop("_tool_results", None)
    if tools:
        section = fallback_system_section(tools)
        if out and out[0].get("role") == "system":
            out[0] = {**out[0], "content": (out[0]["content"] + "\n\n" + section) if out[0]["content"] else section}
        else:
            out.insert(0, {"role": "system", "content": section})
    return out


def _fallback_call(i: int, j: int, call: Mapping) -> str:
    function = call.get("function") if isinstance(call, Mapping) else None
    if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
        raise PromptError(f"message {i} tool call {j} needs a function with a name")
    arguments = function.get("arguments", "{}")
    if isinstance(arguments, str):
        _arguments_object(i, j, arguments)
    else:
        arguments = json.dumps(arguments, ensure_ascii=False)
    return call_text(function["name"], arguments)


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:79] + "…"
