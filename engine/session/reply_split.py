"""A turn's reply as it streams, split into thinking, the visible reply and tool calls (issue 30), for the
turn path (engine/session/turn.py): the window's own turns on a model whose template thinks, and server
requests bound to a conversation. The parsing is engine/text/reply_parse.py's; this adds what a stored turn
needs beside it: how long the model thought (from its first thinking piece to its first reply piece, what
the window shows as "Thought for N s") and a plain pass-through when there is nothing to split, so a turn on
a model that neither thinks nor was given tools streams and stores exactly what it did before."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from engine.generation import Engine
from engine.session.reply_plan import plan_reply
from engine.text.reply_format import opens_thinking, reply_format_for
from engine.text.reply_parse import ReplyParser
from engine.types import PieceKind, ReplyPiece, ServeRequest, ToolCall, ToolChoice


class ReplySplit:
    """Feed it the decode's text pieces; it gives back the pieces by kind, and at the end the reply's parts."""

    def __init__(self, parser: ReplyParser | None = None) -> None:
        self._parser = parser  # None: every piece is visible text
        self._plain: list[str] = []
        self._thinking_from: float | None = None
        self._thought_ms: int | None = None

    @property
    def splits(self) -> bool:
        return self._parser is not None

    def feed(self, text: str) -> list[ReplyPiece]:
        if self._parser is None:
            self._plain.append(text)
            return [ReplyPiece(PieceKind.CONTENT, text)]  # every step, as before (its Token moves the meter)
        return self._timed(self._parser.feed(text))

    def finish(self) -> list[ReplyPiece]:
        pieces = [] if self._parser is None else self._timed(self._parser.finish())
        if self._thinking_from is not None and self._thought_ms is None:  # it thought to the end
            self._thought_ms = self._ms_since_thinking()
        return pieces

    def _timed(self, pieces: list[ReplyPiece]) -> list[ReplyPiece]:
        for p in pieces:
            if p.kind == PieceKind.REASONING and self._thinking_from is None:
                self._thinking_from = time.perf_counter()
            elif p.kind != PieceKind.REASONING and self._thinking_from is not None and self._thought_ms is None:
                self._thought_ms = self._ms_since_thinking()
        return pieces

    def _ms_since_thinking(self) -> int:
        return int(round((time.perf_counter() - self._thinking_from) * 1000))

    @property
    def content(self) -> str:
        return "".join(self._plain) if self._parser is None else self._parser.content

    @property
    def reasoning(self) -> str:
        return "" if self._parser is None else self._parser.reasoning

    @property
    def tool_calls(self) -> tuple[ToolCall, ...]:
        return () if self._parser is None else tuple(self._parser.tool_calls)

    @property
    def thought_ms(self) -> int | None:
        """From the first thinking piece to the first piece of the reply (None: it did not think)."""
        return self._thought_ms


@dataclass(frozen=True)
class TurnReply:
    """A window turn's prompt, how its reply splits, and what decoding needs for that (the thinking markers
    the parser must see as text, where the vocabulary holds them as control tokens)."""

    prompt: bytes
    split: ReplySplit
    decoding: dict = field(default_factory=dict)


def turn_reply(engine: Engine, messages: list[dict], tools: tuple[dict, ...] = (),
               tool_choice: ToolChoice | None = None) -> TurnReply:
    """A window turn's reply (no tools are offered): a parser when the template thinks (a generation prompt
    that opens the thinking block, as DeepSeek-R1 distills' does, starts it thinking), else the plain
    pass-through. A chat with no tool calls or results in its history renders as it always did; one with them
    (a conversation an agent used through the server) through the template's inputs, as the server's requests
    render it (engine/session/reply_plan.py).

    With ``tools`` (a window or CLI turn in a tool loop, issue 33) the template is given them as a server request
    gives them, the reply is parsed for calls, and ``tool_choice`` required or a named function constrains the
    decoding to a call (the plan's grammar)."""
    request = ServeRequest(messages=tuple(messages), tools=tuple(tools), tool_choice=tool_choice or ToolChoice())
    plan = plan_reply(engine.template, request, messages)
    if tools or any("tool_calls" in m or m["role"] == "tool" for m in messages):
        prompt = plan.render(engine.template)
    else:
        prompt = engine.render(messages)
    if not plan.fmt.thinks and not plan.calls_wanted:
        return TurnReply(prompt.encode("utf-8"), ReplySplit())
    return TurnReply(prompt.encode("utf-8"), ReplySplit(plan.parser(prompt)), plan.decoding(prompt, {}))


def continue_reply(engine: Engine, messages: list[dict], tools: tuple[dict, ...] = ()) -> TurnReply:
    """The prompt of a Continue and how its reply splits: the chat up to the last reply as a turn would render
    it, then that reply's text with no end-of-turn, so the model writes on where it stopped. A reply the
    length limit stopped while it was still thinking (no visible text yet) writes on in its thinking: the
    thinking block is open in the prompt, with the thinking so far."""
    head, last = messages[:-1], messages[-1]
    before = turn_reply(engine, head, tools)  # the tools stay in the prompt: the KV up to the reply is reused
    fmt = reply_format_for(engine.template.source)
    thinking = last.get("reasoning_content") or ""
    if not thinking or last["content"] or not fmt.thinks:
        return TurnReply(before.prompt + last["content"].encode("utf-8"), ReplySplit())
    text = before.prompt.decode("utf-8")
    if not opens_thinking(fmt, text):  # Qwen3 leaves the model to open it
        text += fmt.think_open + "\n"
    return TurnReply((text + thinking).encode("utf-8"), ReplySplit(ReplyParser(fmt, in_thinking=True)),
                     before.decoding)
