"""What a chat request's reply is, before and after decoding: the model's reply format (its tool-call style and
thinking markers), the messages and tools as the template receives them, the grammar of a forced tool call, and
the parser that splits the streamed reply into thinking, visible text and tool calls.

Shared by the server's stateless requests (engine/session/serve.py) and ``hearth-cli render``; the formats,
parser and grammars themselves are engine/text/reply_format.py, reply_parse.py and tool_grammar.py.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from engine.errors import PromptError
from engine.generation import GenerationResult, Step
from engine.text.chat_template import ChatTemplate
from engine.text.reply_format import (
    ReplyFormat,
    check_tool_choice,
    check_tools,
    opens_thinking,
    reply_format_for,
    reply_markers,
    template_inputs,
)
from engine.text.reply_parse import ReplyParser
from engine.text.tokenizer import Tokenizer
from engine.types import PieceKind, ReplyPiece, ServeRequest, ToolCall, ToolChoice, ToolChoiceMode

PieceFn = Callable[[ReplyPiece], None]
# template_kwargs["thinking_budget"]: the most tokens a forced call's thinking block may take (Anthropic's
# thinking.budget_tokens); a small model left to think freely may never close the block
THINKING_BUDGET_KEY = "thinking_budget"
MAX_THINKING_BUDGET = 1 << 20
_PROBE = "\x01"  # a user message no real prompt has at this point: where the probe begins, the prefix ends


@dataclass
class ReplyPlan:
    fmt: ReplyFormat
    messages: list[dict]  # the conversation as the template receives it
    tools: list[dict] | None  # as the template receives them (None: none, or the fallback put them in a message)
    variables: dict = field(default_factory=dict)
    choice: ToolChoice = field(default_factory=ToolChoice)
    parallel: bool = True
    offered: list[dict] = field(default_factory=list)  # the request's tools, checked (the parser's allow-list)
    source: list[dict] = field(default_factory=list)  # the request's own messages (before template_inputs)

    def render(self, template: ChatTemplate, add_generation_prompt: bool = True) -> str:
        return template.render(self.messages, add_generation_prompt, tools=self.tools, variables=self.variables)

    def render_prefix(self, template: ChatTemplate, count: int) -> str:
        """The rendering of the first ``count`` messages, without the generation prompt (a save point's text).
        Before any user message (a system prompt's breakpoint) a probe user message follows, as a template
        refuses a conversation without one: the caller keeps only what agrees with the whole prompt."""
        head = self.messages[:count]
        if not any(m["role"] == "user" and m["content"].strip() for m in head):
            head = [*head, {"role": "user", "content": _PROBE}]
        return template.render(head, False, tools=self.tools, variables=self.variables)

    def first_block(self, template: ChatTemplate) -> bytes:
        """The system prompt (tools included) and the first user message: a server thread's key."""
        first_user = next((i for i, m in enumerate(self.messages) if m["role"] == "user"), len(self.messages) - 1)
        return self.render_prefix(template, first_user + 1).encode("utf-8")

    @property
    def calls_wanted(self) -> bool:
        return bool(self.offered) and self.choice.mode != ToolChoiceMode.NONE

    def grammar(self, prompt_text: str, response_format: bool = False) -> str | None:
        """The llguidance grammar of a forced call (tool_choice required or a named function), else of a
        thinking budget (``template_kwargs["thinking_budget"]`` on a model that thinks), else None. A reply
        under a ``response_format`` keeps that constraint alone (the budget is not applied to it)."""
        budget = self.variables.get(THINKING_BUDGET_KEY)
        if budget is not None and (isinstance(budget, bool) or not isinstance(budget, int)
                                   or not 1 <= budget <= MAX_THINKING_BUDGET):
            raise PromptError(f"{THINKING_BUDGET_KEY} must be a whole number of tokens from 1 to {MAX_THINKING_BUDGET}")
        from engine.text.tool_grammar import thinking_grammar, tool_grammar

        think = opens_thinking(self.fmt, prompt_text)
        first = self.variables.get("enable_thinking") is True
        if self.offered and self.choice.mode in (ToolChoiceMode.REQUIRED, ToolChoiceMode.FUNCTION):
            return tool_grammar(self.fmt, self.offered, self.choice, self.parallel, think=think, think_budget=budget,
                                think_first=first)
        if budget is None or response_format:
            return None
        return thinking_grammar(self.fmt, think=think, think_budget=budget, think_first=first)

    def decoding(self, prompt_text: str, options: dict) -> dict:
        """``options`` (``Engine.decode``'s keyword arguments) with what this plan adds: the grammar of a forced
        call or a thinking budget, and the markers the parser must see as text."""
        grammar = self.grammar(prompt_text, response_format="response_format" in options)
        if grammar is not None:
            options = {**options, "grammar": grammar}
        if self.markers:
            options = {**options, "show_specials": self.markers}
        return options

    @property
    def markers(self) -> tuple[str, ...]:
        """The marker texts the parser must see even where the vocabulary holds them as control tokens."""
        return reply_markers(self.fmt) if (self.fmt.thinks or self.calls_wanted) else ()

    def parser(self, prompt_text: str) -> ReplyParser:
        return ReplyParser(self.fmt, tools=self.offered if self.calls_wanted else False,
                           in_thinking=opens_thinking(self.fmt, prompt_text), parallel=self.parallel)

    def render_next(self, template: ChatTemplate, content: str, calls: Sequence[ToolCall]) -> str:
        """The rendering the next request of an agent starts with: this reply appended as the client sends it
        back (visible text and calls; OpenAI's clients do not resend the thinking), no generation prompt."""
        reply: dict = {"role": "assistant", "content": content}
        if calls:
            reply["tool_calls"] = [wire_call(c) for c in calls]
        messages, _ = template_inputs(self.fmt, [*self.source, reply], self.offered)
        return template.render(messages, False, tools=self.tools, variables=self.variables)


def wire_call(call: ToolCall) -> dict:
    """A call in OpenAI's message shape."""
    return {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}


def plan_reply(template: ChatTemplate, request: ServeRequest, messages: list[dict]) -> ReplyPlan:
    """The plan for ``request`` (its messages already checked); PromptError for bad tools or tool_choice."""
    fmt = reply_format_for(template.source)
    offered = check_tools(list(request.tools)) if request.tools else []
    check_tool_choice(request.tool_choice, offered)
    variables = dict(request.template_kwargs or {})
    template_messages, template_tools = template_inputs(fmt, messages, offered)
    return ReplyPlan(fmt, template_messages, template_tools, variables, request.tool_choice,
                     request.parallel_tool_calls, offered, source=list(messages))


def save_point_tokens(tokenizer: Tokenizer, prompt: Sequence[int], lead_len: int, text: bytes,
                      prefixes: Iterable[bytes]) -> list[int]:
    """Token counts of ``prompt`` at each save point: the last token boundary at or before where the prompt's
    text stops agreeing with the prefix's rendering (a template may render a prefix slightly otherwise)."""
    from engine.session.prefix import common_prefix_len

    ids = np.asarray(prompt[lead_len:], dtype=np.int64)
    ends = np.cumsum(tokenizer.byte_lengths[ids]) if ids.size else np.zeros(0, dtype=np.int64)
    points = set()
    for prefix in prefixes:
        upto = common_prefix_len(prefix, text)
        n = int(np.searchsorted(ends, upto, side="right")) + lead_len
        if lead_len < n < len(prompt):
            points.add(n)
    return sorted(points)


@dataclass
class SplitReply:
    """A decoded reply, split: ``result.text`` stays the raw text the model wrote (it is what the KV holds)."""

    result: GenerationResult
    content: str
    reasoning: str
    calls: tuple[ToolCall, ...]


def run_split(steps: Iterable[Step | GenerationResult], parser: ReplyParser, on_text: Callable[[str], None] | None,
              on_piece: PieceFn | None) -> SplitReply:
    """Run a decode to its result, feeding each piece through ``parser``: visible text to ``on_text``, every
    piece to ``on_piece``."""

    def emit(pieces: list[ReplyPiece]) -> None:
        for piece in pieces:
            if on_piece is not None:
                on_piece(piece)
            if on_text is not None and piece.kind == PieceKind.CONTENT and piece.text:
                on_text(piece.text)

    for step in steps:
        if isinstance(step, GenerationResult):
            emit(parser.finish())
            return SplitReply(step, parser.content, parser.reasoning, tuple(parser.tool_calls))
        emit(parser.feed(step.text))
    raise RuntimeError("a decode ended without its result")


def check_reply_options(request: ServeRequest) -> None:
    """What only the reply plan can refuse, refused before anything is stored (a bound request)."""
    if request.response_format is not None and request.tools and request.tool_choice.mode in (
            ToolChoiceMode.REQUIRED, ToolChoiceMode.FUNCTION):
        raise PromptError("a forced tool call (tool_choice required or a named function) cannot also follow a "
                          "response_format: the reply is the call")
