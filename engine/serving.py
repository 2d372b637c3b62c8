"""The server's requests, engine side: checking a ``ServeRequest``, binding it to a stored conversation,
passing its decoding options to the engine, and reporting the result (engine/session/serve.py ties them up,
running a bound request down the window's turn path; the prompt cache itself is engine/session/prompt_cache.py).

Binding (``X-Hearth-Conversation`` / ``user``): the stored conversation must be a prefix of the request's
messages (system prompt included); the messages past it are stored, the reply is stored after decoding,
and the request runs on the conversation's own chat checkpoint, so the window and the browser show it
and a chat turn there continues it. A request whose history disagrees with what is stored (an edited or
dropped message) is refused with a ``PromptError`` naming the first differing message: storing it as a
silent branch would leave the window showing a history the client never sent. One exception: a retry.
A stored reply cut off before its client had it all (the client went away, or the server stopped: finish
``cancelled`` / ``interrupted``) was never seen by that client, so a request that sends the history before
it again writes it anew; the cut reply is kept as an earlier version of the new one (``set_aside_reply``).

An agent's turns bind the same way (issue 30): tool results (role "tool", with the ``tool_call_id`` they answer)
and replies that call tools are stored with those fields, and the history comparison covers them (a call's
id, function and arguments — arguments equal as JSON —, a result's call id), never a reply's thinking, which
clients do not send back; the model reads the stored thinking, which is what it wrote.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from engine import tool_messages
from engine.conversations import ConversationStore, agent_row, check_id
from engine.errors import ConversationError, PromptError
from engine.generation import Engine
from engine.session.reports import ResumeReport
from engine.text.chat_template import validate_messages
from engine.types import CacheReport, Message, ResponseFormatKind, ServeRequest, StopReason

# GenerationResult.stop_reason → OpenAI's finish_reason ("stop": an end-of-turn token or a stop string)
FINISH_REASONS = {"eos": "stop", "stop": "stop", "length": "length", "context_full": "length",
                  "cancelled": "cancelled"}
TOOL_CALLS = "tool_calls"  # the finish reason of a reply that called tools
# What a request's message may carry to the template (OpenAI's fields for tool calls and thinking)
MESSAGE_KEYS = ("role", "content", "tool_calls", "tool_call_id", "name", "reasoning_content")
# How a stored reply ended when its client never had all of it: a request that stops before it is a retry.
CUT_FINISHES = (str(StopReason.CANCELLED), str(StopReason.INTERRUPTED))


def request_messages(request: ServeRequest) -> list[dict] | None:
    """Check ``request`` and return its messages as plain dicts (None for a raw prompt); PromptError
    (or ConversationError for a bad conversation id) says what is wrong."""
    if (request.messages is None) == (request.prompt is None):
        raise PromptError("a request needs either messages (a chat) or a prompt (a raw completion), not both")
    request.params.validate()
    if not isinstance(request.max_tokens, int) or request.max_tokens < 1:
        raise PromptError(f"max_tokens must be at least 1 (got {request.max_tokens!r})")
    if request.conversation is not None:
        check_id(request.conversation)
        if request.prompt is not None:
            raise PromptError("a conversation can be bound only to a chat request (messages), not a raw prompt")
    if request.prompt is not None:
        if not isinstance(request.prompt, str) or not request.prompt:
            raise PromptError("the prompt is empty: write something to continue")
        _check_text(request.prompt, "the prompt")
        return None
    messages = [dict(m) if isinstance(m, Mapping) else m for m in request.messages]
    validate_messages(messages)
    for i, m in enumerate(messages):
        _check_text(m["content"], f"message {i + 1}")
        if m["role"] == "tool" and not m.get("tool_call_id"):  # as OpenAI's API: a result names its call
            raise PromptError(f"message {i + 1} is a tool result without a tool_call_id: say which call it answers")
    return [{k: m[k] for k in MESSAGE_KEYS if k in m and m[k] is not None} for m in messages]


def _check_text(text: str, what: str) -> None:
    """Text the store and the tokenizer can encode: a lone surrogate (a JSON ``\\ud800``) cannot be."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise PromptError(f"{what} holds a lone surrogate, which is not a character: send valid Unicode") from None


def check_options(request: ServeRequest) -> None:
    """What ``Engine.generate`` would refuse in the request's decoding options, refused now: a bound
    request must fail before its messages are stored."""
    from engine.sampling import check_penalty, check_top_logprobs
    from engine.text.constrained import grammar_for
    from engine.text.stop_strings import check_stop_strings

    check_stop_strings(request.stop or ())
    check_penalty("presence penalty", request.presence_penalty)
    check_penalty("frequency penalty", request.frequency_penalty)
    if request.top_logprobs is not None:
        try:
            check_top_logprobs(request.top_logprobs)
        except ValueError as exc:
            raise PromptError(str(exc)) from None
    if request.response_format is not None:
        grammar_for(request.response_format)
    from engine.session.reply_plan import check_reply_options

    check_reply_options(request)


def generation_options(request: ServeRequest) -> dict:
    """The decoding options the request sets, as keyword arguments for ``Engine.generate`` (which checks
    their values: bad ones are PromptErrors before any model work)."""
    wanted: dict = {}
    if request.stop:
        wanted["stop"] = tuple(request.stop)
    if request.presence_penalty:
        wanted["presence_penalty"] = request.presence_penalty
    if request.frequency_penalty:
        wanted["frequency_penalty"] = request.frequency_penalty
    if request.response_format is not None and request.response_format.kind != ResponseFormatKind.TEXT:
        wanted["response_format"] = request.response_format
    return wanted


@dataclass(frozen=True)
class Binding:
    """What a bound request adds to its conversation, worked out without writing anything."""

    conversation: str
    exists: bool
    system: str | None  # the system prompt to store (a new conversation's), else None
    new: list[Message]  # the messages past what is stored (their seq not known yet)
    chat: list[dict]  # the conversation as the model will read it
    retry: int | None = None  # the seq of the cut-off last reply this request writes again (see the docstring)


def plan_binding(conversations: ConversationStore, conversation: str, messages: list[dict]) -> Binding:
    """How the request binds to ``conversation`` (by the rule in the module docstring); PromptError when
    it cannot. Nothing is stored: the caller checks the result fits the context first."""
    system = messages[0]["content"] if messages[0]["role"] == "system" else None
    if any(m["role"] == "system" for m in messages[1:]):
        raise PromptError("a bound conversation takes one system prompt, as the first message")
    body = messages[1:] if system is not None else messages
    conv = conversations.get(conversation)
    held = conversations.messages(conversation) if conv is not None else []
    stored = [m.as_chat() for m in held]
    stored_system = conv.system_prompt if conv is not None else ""
    set_system = None
    if not stored and system is not None and system != stored_system:
        set_system = system
    elif (system or "") != stored_system:
        raise PromptError(f"conversation {conversation} has another system prompt than this request: send its "
                          "stored history, or use a new conversation id")
    retry = _cut_reply(conversations, conversation, held, body)
    offset = 1 if system is not None else 0
    if retry is not None:
        stored = stored[:-1]  # set aside when stored: the model answers what came before it
    else:
        _check_history(conversation, stored, body, offset)
    new = [_new_message(m, len(stored) + i + 1 + offset) for i, m in enumerate(body[len(stored):])]
    system_now = set_system if set_system is not None else stored_system
    chat = ([{"role": "system", "content": system_now}] if system_now else []) + stored + [m.as_chat() for m in new]
    return Binding(conversation, conv is not None, set_system, new, chat, retry)


def _new_message(m: Mapping, number: int) -> Message:
    """A request's message to store, with an agent's fields checked as the store checks them (PromptError
    naming the request's message ``number``, before anything is stored)."""
    try:
        calls = tool_messages.from_openai(m["tool_calls"]) if m.get("tool_calls") else ()
        reasoning = m.get("reasoning_content") or ""
        message = Message(-1, m["role"], m["content"], reasoning=reasoning if isinstance(reasoning, str) else "",
                          tool_calls=calls, tool_call_id=m.get("tool_call_id") or "", name=m.get("name") or "")
        agent_row(message.role, message.reasoning, None, message.tool_calls, message.tool_call_id, message.name)
    except (ValueError, ConversationError) as exc:
        raise PromptError(f"message {number}: {exc}") from None
    return message


def same_message(sent: Mapping, stored: Mapping) -> bool:
    """A request's message is the stored one: role, text, and an agent's fields (a call's arguments equal as
    JSON, so a client that re-serialises them still matches); a reply's thinking is not compared."""
    if sent["role"] != stored["role"] or sent["content"] != stored["content"]:
        return False
    if (sent.get("tool_call_id") or "") != (stored.get("tool_call_id") or ""):
        return False
    return _calls_key(sent.get("tool_calls")) == _calls_key(stored.get("tool_calls"))


def _calls_key(listed: object) -> list | None:
    """Calls as (id, name, parsed arguments), for comparing; None when they do not read as calls."""
    if not listed:
        return []
    try:
        return [(c.id, c.name, json.loads(c.arguments)) for c in tool_messages.from_openai(listed)]
    except (ValueError, RecursionError):
        return None


def _cut_reply(conversations: ConversationStore, conversation: str, held: list[Message],
               body: list[dict]) -> int | None:
    """The seq of the stored last reply when it was cut off (CUT_FINISHES) and ``body`` is exactly the
    history before it: the client retries a reply it never had. None otherwise."""
    if not held or held[-1].role != "assistant" or len(body) != len(held) - 1:
        return None
    if not all(same_message(b, m.as_chat()) for b, m in zip(body, held, strict=False)):
        return None
    facts = conversations.reply_facts(conversation).get(held[-1].seq)
    return held[-1].seq if facts is not None and facts.finish in CUT_FINISHES else None


def _check_history(conversation: str, stored: list[dict], body: list[dict], offset: int) -> None:
    """PromptError unless the stored messages begin ``body``. Messages are numbered as the request numbers
    them (``offset``: 1 when it starts with a system prompt), so "message 2" is the request's second."""
    count = len(stored) + offset
    for i, m in enumerate(stored):
        if i >= len(body):
            raise PromptError(f"conversation {conversation} holds {count} message(s) and this request only "
                              f"{len(body) + offset}: it lacks the stored {m['role']} message {i + 1 + offset}; send "
                              "the stored history unchanged, or use a new conversation id")
        if not same_message(body[i], m):
            raise PromptError(f"conversation {conversation} holds {count} message(s) and this request's message "
                              f"{i + 1 + offset} differs from the stored one: send the stored history unchanged, "
                              "or use a new conversation id")


def store_binding(conversations: ConversationStore, binding: Binding) -> list[dict]:
    """Store what ``plan_binding`` found (creating the conversation, setting a cut reply aside); the conversation
    as the model reads it."""
    cid = binding.conversation
    conversations.ensure(cid)
    if binding.retry is not None:  # kept as an earlier version of the reply about to be written
        conversations.set_aside_reply(cid)
    if binding.system is not None:
        conversations.set_system_prompt(cid, binding.system)
    for m in binding.new:
        conversations.append(cid, m.role, m.content, reasoning=m.reasoning, tool_calls=m.tool_calls,
                             tool_call_id=m.tool_call_id, name=m.name)
    return conversations.chat_messages(cid)


def cache_report(report: ResumeReport) -> CacheReport:
    return CacheReport(report.source, str(report.reason) if report.reason else None, report.reused_tokens,
                       report.prefilled_tokens, report.restore_ms, report.restored_tokens)


def history_text(engine: Engine, messages: Sequence[dict] | None, prompt: bytes, reply: str,
                 render: Callable[[], str] | None = None) -> bytes | None:
    """What the next request of this thread starts with: the conversation with the reply as history
    renders it (a raw prompt: the prompt and the reply); None when the template cannot render it.
    ``render``: renders it (a chat request's reply plan: its tools, calls and template variables), else the
    template with ``messages`` and the reply as plain text."""
    if messages is None:
        return prompt + reply.encode("utf-8")
    try:
        if render is not None:
            return render().encode("utf-8")
        return engine.template.render([*messages, {"role": "assistant", "content": reply}],
                                      add_generation_prompt=False).encode("utf-8")
    except Exception:  # a template that refuses the history shape: only the prompt is sure
        return None
