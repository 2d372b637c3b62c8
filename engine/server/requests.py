"""An OpenAI request made into the engine's ``ServeRequest``, refusing what Hearth cannot honour."""

from __future__ import annotations

from dataclasses import dataclass

from engine.api import check_id
from engine.errors import ConversationError
from engine.server.errors import ApiError
from engine.server.schemas import RANDOM_SEED, ChatRequest, CompletionRequest, Message, _Sampling
from engine.server.tool_checks import arguments_text, check_answers, require_tool, template_kwargs, tool_names
from engine.types import (
    ResponseFormat,
    ResponseFormatKind,
    SamplingParams,
    ServeRequest,
    ToolChoice,
    ToolChoiceMode,
)

CONVERSATION_HEADER = "x-hearth-conversation"


@dataclass(frozen=True)
class Planned:
    request: ServeRequest
    model: str | None  # None: the loaded model
    max_tokens_given: bool  # False: generate until the reply ends or the context is full (as OpenAI)


def _bad(message: str, param: str, code: str = "invalid_value") -> ApiError:
    return ApiError(400, message, param=param, code=code)


def sampling(body: _Sampling) -> SamplingParams:
    """OpenAI's knobs over Hearth's defaults; temperature 0 (or top_p 0) is greedy. No repetition
    penalty: OpenAI's API has presence/frequency penalties instead, and clients expect none otherwise."""
    seed = None if body.seed == RANDOM_SEED else body.seed
    if body.temperature == 0 or body.top_p == 0:
        return SamplingParams(greedy=True, repetition_penalty=1.0, seed=seed, prompt_lookup=body.prompt_lookup)
    defaults = SamplingParams()
    return SamplingParams(temperature=defaults.temperature if body.temperature is None else body.temperature,
                          top_p=defaults.top_p if body.top_p is None else body.top_p, repetition_penalty=1.0,
                          seed=seed, prompt_lookup=body.prompt_lookup)


def conversation(body: _Sampling, header: str | None) -> str | None:
    """The stored conversation a request binds to: X-Hearth-Conversation, else ``user`` when it is a
    valid id (OpenAI's ``user`` is any end-user label, so one that is not an id is simply not used)."""
    if header is not None:
        try:
            return check_id(header.strip())
        except ConversationError as exc:
            raise _bad(str(exc), "X-Hearth-Conversation") from None
    if body.user:
        try:
            return check_id(body.user)
        except ConversationError:
            return None
    return None


def _common(body: _Sampling) -> None:
    if body.n != 1:
        raise _bad(f"n={body.n}: Hearth writes one choice per request, so n must be 1", "n", "unsupported_value")


def chat_message(m: Message, i: int) -> dict:
    """One OpenAI message as the engine takes it (``ServeRequest.messages``)."""
    role = "system" if m.role == "developer" else m.role
    out: dict = {"role": role, "content": m.text()}
    if role == "tool":
        if m.tool_call_id is None:
            raise _bad("a message with role 'tool' needs tool_call_id: the id of the call it answers",
                       f"messages.{i}.tool_call_id")
        out["tool_call_id"] = m.tool_call_id
        if m.name:
            out["name"] = m.name
    if m.tool_calls:
        if role != "assistant":
            raise _bad("only an assistant message carries tool_calls", f"messages.{i}.tool_calls")
        out["tool_calls"] = [{"id": c.id, "type": "function",
                              "function": {"name": c.function.name, "arguments": arguments_text(
                                  c.function.arguments, f"messages.{i}.tool_calls.{j}.function.arguments")}}
                             for j, c in enumerate(m.tool_calls)]
    if role == "assistant" and m.reasoning_content:
        out["reasoning_content"] = m.reasoning_content
    return out


def chat_tools(body: ChatRequest) -> tuple[tuple[dict, ...], ToolChoice]:
    """The request's function tools as the template receives them, and its tool_choice."""
    specs = body.tools or []
    names = tool_names((t.function.name for t in specs), "tools")
    tools = []
    for i, t in enumerate(specs):
        f = t.function
        if f.parameters is not None and f.parameters.get("type", "object") != "object":
            raise _bad("a function's parameters must be a JSON schema of type 'object'", f"tools.{i}.function.parameters")
        spec = {"name": f.name, "description": f.description, "parameters": f.parameters}
        tools.append({"type": "function", "function": {k: v for k, v in spec.items() if v is not None}})
    choice = body.tool_choice
    if choice is None or choice == "auto":
        return tuple(tools), ToolChoice()
    if choice == "none":
        return tuple(tools), ToolChoice(ToolChoiceMode.NONE)
    if not tools:
        raise _bad("tool_choice asks for a tool call, but the request has no tools", "tool_choice")
    if choice == "required":
        return tuple(tools), ToolChoice(ToolChoiceMode.REQUIRED)
    require_tool(choice.function.name, names, "tool_choice.function.name")
    return tuple(tools), ToolChoice(ToolChoiceMode.FUNCTION, choice.function.name)


def chat_request(body: ChatRequest, header: str | None) -> Planned:
    _common(body)
    if body.top_logprobs is not None and not body.logprobs:
        raise _bad("top_logprobs needs logprobs set to true", "top_logprobs")
    messages = tuple(chat_message(m, i) for i, m in enumerate(body.messages))
    if not any(m.role == "user" for m in body.messages):
        raise _bad("messages has no user message to answer", "messages")
    check_answers(messages, lambda i: f"messages.{i}.tool_call_id")
    tools, choice = chat_tools(body)
    fmt = None
    if body.response_format is not None and body.response_format.type != "text":
        spec = body.response_format.json_schema
        if body.response_format.type == "json_schema" and (spec is None or spec.schema_ is None):
            raise _bad("response_format json_schema needs json_schema.schema", "response_format.json_schema")
        if choice.mode in (ToolChoiceMode.REQUIRED, ToolChoiceMode.FUNCTION):
            raise _bad("response_format cannot be combined with a tool_choice that forces a call: the reply "
                       "is either the call or the formatted text", "response_format")
        fmt = ResponseFormat(ResponseFormatKind(body.response_format.type), spec.schema_ if spec else None,
                             spec.name if spec else "")
    variables = template_kwargs(body.chat_template_kwargs, "chat_template_kwargs")
    if body.reasoning_effort is not None:
        variables.setdefault("reasoning_effort", body.reasoning_effort)
    limit = body.max_completion_tokens or body.max_tokens
    request = ServeRequest(messages=messages, params=sampling(body), max_tokens=limit or 1,
                           stop=body.stop_strings(), presence_penalty=body.presence_penalty,
                           frequency_penalty=body.frequency_penalty,
                           top_logprobs=(body.top_logprobs or 0) if body.logprobs else None,
                           response_format=fmt, conversation=conversation(body, header), tools=tools,
                           tool_choice=choice, parallel_tool_calls=body.parallel_tool_calls,
                           template_kwargs=variables)
    return Planned(request, body.model, limit is not None)


def completion_request(body: CompletionRequest, header: str | None) -> Planned:
    _common(body)
    if body.best_of not in (None, 1):
        raise _bad("best_of must be 1", "best_of", "unsupported_value")
    if body.echo:
        raise _bad("echo is not supported", "echo", "unsupported_value")
    if body.suffix:
        raise _bad("suffix (fill-in-the-middle) is not supported", "suffix", "unsupported_value")
    prompt = body.prompt
    if isinstance(prompt, list):
        if len(prompt) != 1:
            raise _bad("prompt must be one string (Hearth writes one completion per request)", "prompt")
        prompt = prompt[0]
    if not prompt:
        raise _bad("prompt is empty", "prompt")
    request = ServeRequest(prompt=prompt, params=sampling(body), max_tokens=body.max_tokens or 1,
                           stop=body.stop_strings(), presence_penalty=body.presence_penalty,
                           frequency_penalty=body.frequency_penalty, top_logprobs=body.logprobs,
                           conversation=conversation(body, header))
    return Planned(request, body.model, body.max_tokens is not None)
