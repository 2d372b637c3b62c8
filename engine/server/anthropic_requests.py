"""An Anthropic Messages request made into the engine's ``ServeRequest`` (OpenAI-shaped messages, as the
chat template reads them), refusing what Hearth cannot honour with a 400 that names the field.

How Anthropic's shapes map:
- ``system`` (a string or text blocks, joined by a blank line) → a leading system message;
- a user message's text blocks → a user message; each ``tool_result`` block → a ``tool`` message
  (``tool_call_id`` = its ``tool_use_id``; ``is_error`` prefixes "Error: "), in block order;
- an assistant message's text → its content, ``tool_use`` blocks → ``tool_calls`` (input as JSON text),
  ``thinking`` → ``reasoning_content`` (``redacted_thinking`` cannot be read and is left out);
- ``cache_control`` on a block (or the system prompt, or a tool) → a save point after the message holding it;
- ``thinking`` → the template's ``enable_thinking`` (and ``thinking_budget``, a token budget).
Ids Hearth made (``call_<hex>``) are shown as ``toolu_<hex>`` and read back as they were made.
"""

from __future__ import annotations

import json
import re

from engine.api import check_id
from engine.errors import ConversationError
from engine.server.anthropic_schemas import (
    AnthropicMessage,
    CountTokensRequest,
    MessagesRequest,
    TextBlock,
    UnreadableBlock,
)
from engine.server.requests import Planned
from engine.server.tool_checks import bad, check_answers, require_tool, tool_names
from engine.types import (
    ResponseFormat,
    ResponseFormatKind,
    SamplingParams,
    ServeRequest,
    ToolChoice,
    ToolChoiceMode,
)

MAX_CACHE_BREAKPOINTS = 4  # as Anthropic
# output_config.effort as the reasoning_effort templates know (gpt-oss's low / medium / high)
EFFORT = {"low": "low", "medium": "medium", "high": "high", "xhigh": "high", "max": "high"}
JOIN = "\n\n"  # between the text blocks of one message (and of the system prompt)
_OUR_ID = re.compile(r"(call|toolu)_([0-9a-f]{24})")


def engine_id(client_id: str) -> str:
    """A tool-use id as the engine made it: ``toolu_<hex>`` of ours back to ``call_<hex>``."""
    m = _OUR_ID.fullmatch(client_id)
    return f"call_{m.group(2)}" if m else client_id


def anthropic_id(call_id: str) -> str:
    """The engine's ``call_<hex>`` as Anthropic's ``toolu_<hex>``; any other id as it is."""
    m = _OUR_ID.fullmatch(call_id)
    return f"toolu_{m.group(2)}" if m else call_id


def _system(system: str | list[TextBlock] | None) -> tuple[str | None, int]:
    """The system prompt's text (None without one) and how many cache breakpoints it carries."""
    if system is None:
        return None, 0
    if isinstance(system, str):
        return system, 0
    return JOIN.join(b.text for b in system), sum(bool(b.cache_control) for b in system)


def _unreadable(block: UnreadableBlock, param: str) -> None:
    raise bad(f"{block.type} blocks are not supported: Hearth's models read text", param, "unsupported_value")


def _result_text(content, param: str) -> str:
    if isinstance(content, str):
        return content
    parts = []
    for k, part in enumerate(content):
        if isinstance(part, UnreadableBlock):
            _unreadable(part, f"{param}.{k}")
        parts.append(part.text)
    return JOIN.join(parts)


def _user(m: AnthropicMessage, i: int) -> tuple[list[dict], bool]:
    if isinstance(m.content, str):
        return [{"role": "user", "content": m.content}], False
    out: list[dict] = []
    texts: list[str] = []
    marked = False

    def flush() -> None:
        if texts:
            out.append({"role": "user", "content": JOIN.join(texts)})
            texts.clear()

    for j, b in enumerate(m.content):
        param = f"messages.{i}.content.{j}"
        marked = marked or bool(getattr(b, "cache_control", None))
        if b.type == "text":
            texts.append(b.text)
        elif b.type == "tool_result":
            flush()
            text = _result_text(b.content, f"{param}.content")
            out.append({"role": "tool", "tool_call_id": engine_id(b.tool_use_id),
                        "content": f"Error: {text}" if b.is_error else text})
        elif isinstance(b, UnreadableBlock):
            _unreadable(b, param)
        else:
            raise bad(f"a user message cannot hold a {b.type} block (only the assistant's can)", f"{param}.type")
    flush()
    if not out:
        raise bad("a user message needs at least one text or tool_result block", f"messages.{i}.content")
    return out, marked


def _assistant(m: AnthropicMessage, i: int) -> tuple[list[dict], bool]:
    if isinstance(m.content, str):
        return [{"role": "assistant", "content": m.content}], False
    texts, thinking, calls, marked = [], [], [], False
    for j, b in enumerate(m.content):
        param = f"messages.{i}.content.{j}"
        marked = marked or bool(getattr(b, "cache_control", None))
        if b.type == "text":
            texts.append(b.text)
        elif b.type == "tool_use":
            calls.append({"id": engine_id(b.id), "type": "function",
                          "function": {"name": b.name, "arguments": json.dumps(b.input, ensure_ascii=False)}})
        elif b.type == "thinking":
            thinking.append(b.thinking)
        elif b.type == "redacted_thinking":
            continue  # encrypted by another service: nothing a local model can read
        elif isinstance(b, UnreadableBlock):
            _unreadable(b, param)
        else:
            raise bad(f"an assistant message cannot hold a {b.type} block (only the user's can)", f"{param}.type")
    message: dict = {"role": "assistant", "content": JOIN.join(texts)}
    if calls:
        message["tool_calls"] = calls
    if thinking:
        message["reasoning_content"] = JOIN.join(thinking)
    return [message], marked


def _tools(body: CountTokensRequest) -> tuple[tuple[dict, ...], ToolChoice, bool, bool]:
    """(tools as the template receives them, the tool choice, parallel calls allowed, a tool breakpoint)."""
    specs = body.tools or []
    names = tool_names((t.name for t in specs), "tools")
    tools = []
    for i, t in enumerate(specs):
        if t.type not in (None, "custom"):
            raise bad(f"the server tool '{t.type}' is not supported: Hearth runs only client tools (name, "
                      "description, input_schema)", f"tools.{i}.type", "unsupported_value")
        if t.input_schema is None:
            raise bad("a tool needs input_schema: a JSON schema of its input", f"tools.{i}.input_schema")
        if t.input_schema.get("type", "object") != "object":
            raise bad("a tool's input_schema must be a JSON schema of type 'object'", f"tools.{i}.input_schema")
        spec = {"name": t.name, "description": t.description, "parameters": t.input_schema}
        tools.append({"type": "function", "function": {k: v for k, v in spec.items() if v is not None}})
    marked = any(t.cache_control for t in specs)
    choice = body.tool_choice
    if choice is None or choice.type == "auto":
        mode = ToolChoice()
    elif choice.type == "none":
        mode = ToolChoice(ToolChoiceMode.NONE)
    elif not tools:
        raise bad(f"tool_choice {choice.type!r} asks for a tool call, but the request has no tools", "tool_choice")
    elif choice.type == "any":
        mode = ToolChoice(ToolChoiceMode.REQUIRED)
    else:
        if not choice.name:
            raise bad("tool_choice of type 'tool' needs the tool's name", "tool_choice.name")
        require_tool(choice.name, names, "tool_choice.name")
        mode = ToolChoice(ToolChoiceMode.FUNCTION, choice.name)
    parallel = not (choice is not None and choice.disable_parallel_tool_use)
    return tuple(tools), mode, parallel, marked


def _thinking(body: CountTokensRequest, max_tokens: int | None) -> dict:
    t = body.thinking
    effort = body.output_config.effort if body.output_config else None
    variables = {"reasoning_effort": EFFORT[effort]} if effort else {}
    if t is None:
        return variables
    if t.type == "disabled":
        return {**variables, "enable_thinking": False}
    if t.type == "adaptive":
        return {**variables, "enable_thinking": True}
    if t.budget_tokens is None:
        raise bad("thinking of type 'enabled' needs budget_tokens", "thinking.budget_tokens")
    if max_tokens is not None and t.budget_tokens >= max_tokens:
        raise bad(f"max_tokens ({max_tokens}) must be greater than thinking.budget_tokens ({t.budget_tokens})",
                  "thinking.budget_tokens")
    return {**variables, "enable_thinking": True, "thinking_budget": t.budget_tokens}


def prompt_parts(body: CountTokensRequest, max_tokens: int | None = None) -> tuple[tuple[dict, ...], tuple[dict, ...],
                                                                                    ToolChoice, bool, dict, tuple[int, ...]]:
    """(messages, tools, tool choice, parallel, template variables, save points) of a request."""
    messages: list[dict] = []
    points: list[int] = []
    system, system_marked = _system(body.system)
    if system is not None:
        messages.append({"role": "system", "content": system})
    tools, choice, parallel, tools_marked = _tools(body)
    if (system_marked or tools_marked) and messages:
        points.append(len(messages))
    for i, m in enumerate(body.messages):
        made, marked = (_user if m.role == "user" else _assistant)(m, i)
        messages.extend(made)
        if marked:
            points.append(len(messages))
    if body.cache_control is not None:  # automatic caching: a breakpoint on the last block
        points.append(len(messages))
    breakpoints = (system_marked + sum(bool(t.cache_control) for t in body.tools or []) + _block_marks(body)
                   + (body.cache_control is not None))
    if breakpoints > MAX_CACHE_BREAKPOINTS:
        raise bad(f"a request may carry at most {MAX_CACHE_BREAKPOINTS} blocks with cache_control, found {breakpoints}",
                  "messages")
    if body.messages[-1].role != "user":
        raise bad("the last message must be the user's: Hearth does not continue a prefilled assistant reply",
                  f"messages.{len(body.messages) - 1}.role", "unsupported_value")
    check_answers(messages, lambda _i: "messages")
    return tuple(messages), tools, choice, parallel, _thinking(body, max_tokens), tuple(sorted(set(points)))


def _block_marks(body: CountTokensRequest) -> int:
    count = 0
    for m in body.messages:
        if not isinstance(m.content, str):
            count += sum(bool(getattr(b, "cache_control", None)) for b in m.content)
    return count


def sampling(body: MessagesRequest) -> SamplingParams:
    """Anthropic's knobs over Hearth's defaults (no repetition penalty, as on the OpenAI endpoints);
    temperature 0 is greedy; top_k 0 is off."""
    if body.temperature == 0 or body.top_p == 0:
        return SamplingParams(greedy=True, repetition_penalty=1.0)
    d = SamplingParams()
    return SamplingParams(temperature=d.temperature if body.temperature is None else body.temperature,
                          top_p=d.top_p if body.top_p is None else body.top_p,
                          top_k=d.top_k if body.top_k is None else body.top_k, repetition_penalty=1.0)


def bound_conversation(header: str | None) -> str | None:
    """X-Hearth-Conversation: store the exchange into that conversation."""
    if header is None:
        return None
    try:
        return check_id(header.strip())
    except ConversationError as exc:
        raise bad(str(exc), "X-Hearth-Conversation") from None


def output_format(body: MessagesRequest, choice: ToolChoice) -> ResponseFormat | None:
    """``output_config.format``: structured output, as ``response_format`` json_schema on the OpenAI side."""
    spec = body.output_config.format if body.output_config else None
    if spec is None:
        return None
    if choice.mode in (ToolChoiceMode.REQUIRED, ToolChoiceMode.FUNCTION):
        raise bad("output_config.format cannot be combined with a tool_choice that forces a call",
                  "output_config.format")
    return ResponseFormat(ResponseFormatKind.JSON_SCHEMA, spec.schema_, "output")


def messages_request(body: MessagesRequest, header: str | None) -> Planned:
    messages, tools, choice, parallel, variables, points = prompt_parts(body, body.max_tokens)
    stop = tuple(s for s in body.stop_sequences or () if s)
    request = ServeRequest(messages=messages, params=sampling(body), max_tokens=body.max_tokens, stop=stop,
                           conversation=bound_conversation(header), tools=tools, tool_choice=choice,
                           parallel_tool_calls=parallel, template_kwargs=variables, save_points=points,
                           response_format=output_format(body, choice))
    return Planned(request, body.model, True)
