"""A reply split as it streams: thinking, visible text and tool calls, in the template's own format.

``ReplyParser`` is fed the reply's text in pieces of any size and gives back ``ReplyPiece``s. It never
gives out text it would later take back: a possible partial marker at the end of what it has is held
until the next piece decides it, and a call is buffered until it closes and parses. The result is the
same however the text is cut (``parse_reply`` is the parser fed the whole text at once), because each
decision waits until the text it depends on has arrived.

What counts as a call (docs/tool-calls.md): a call of a tool that was offered, whose arguments are a
JSON object; anything else the model wrote that looks like a call comes back as visible text. A call's
``arguments`` is the exact JSON text the model wrote for the object, so a client that echoes it back
renders the same prompt bytes.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from json.decoder import scanstring

from engine.text.reply_format import (
    FALLBACK,
    HERMES,
    LLAMA3_JSON,
    MISTRAL,
    MISTRAL_ARGS,
    MISTRAL_ARGS_MARK,
    MISTRAL_CALL_ID,
    MISTRAL_CALLS,
    NAME_PATTERN,
    PYTHON_TAG,
    TOOL_CALL_CLOSE,
    TOOL_CALL_OPEN,
    ReplyFormat,
)
from engine.types import PieceKind, ReplyPiece, ToolCall

MAX_CALL_CHARS = 256 * 1024  # one call's text, its markers included (Llama's and Mistral's: the whole call list)
MAX_CALLS = 64  # calls in one reply; later ones are dropped

_START, _THINK, _TEXT, _CALL, _REGION, _PLAIN, _LEAD = "start", "think", "text", "call", "region", "plain", "lead"


def new_call_id() -> str:
    """An OpenAI-style call id: ``call_`` and 24 hex digits."""
    return "call_" + secrets.token_hex(12)


@dataclass(frozen=True)
class ParsedReply:
    content: str
    reasoning: str
    tool_calls: tuple[ToolCall, ...]
    pieces: tuple[ReplyPiece, ...]


class ReplyParser:
    """Splits one reply. ``tools``: the tools offered (OpenAI tool dicts or their names; True accepts any
    name, False or empty parses no calls); ``in_thinking``: the prompt left a thinking block open, so the
    reply starts inside it; ``parallel`` False keeps the first call only; ``new_id`` makes call ids."""

    def __init__(self, fmt: ReplyFormat, *, tools: bool | Iterable[str | Mapping] = False, in_thinking: bool = False,
                 parallel: bool = True, new_id: Callable[[], str] = new_call_id):
        self._fmt = fmt
        self._any_name = tools is True
        self._names = frozenset() if isinstance(tools, bool) else frozenset(_names(tools))
        self._calls_on = self._any_name or bool(self._names)
        self._parallel, self._new_id = parallel, new_id
        self._pending = ""  # text received and not yet decided
        self._scan_from = 0  # where in _pending the next marker search starts (the text before is known free)
        self._state = _THINK if (in_thinking and fmt.thinks) else (_START if fmt.thinks else self._body_state())
        self._content: list[str] = []
        self._reasoning: list[str] = []
        self._calls: list[ToolCall] = []
        self._out: list[ReplyPiece] = []
        self._held_nl = ""  # trailing newlines of the visible text, kept until it is known they are not a call's
        self._drop_nl = False  # newlines right after the thinking block or a call are not visible text
        self._think_held = ""
        self._think_started = False
        self._finished = False
        self._steps = {_START: self._step_start, _THINK: self._step_think, _TEXT: self._step_text,
                       _CALL: self._step_call, _REGION: self._step_region, _PLAIN: self._step_plain,
                       _LEAD: self._step_lead}

    # --- the interface --------------------------------------------------------------------------------
    def feed(self, text: str) -> list[ReplyPiece]:
        """The pieces ``text`` (the next part of the reply) completes; possibly none."""
        if self._finished:
            raise RuntimeError("the reply parser was already finished")
        # concatenated through a local that holds the only reference, so CPython grows the string in place
        # rather than copying a long pending call on every piece
        pending, self._pending = self._pending, ""
        pending += text
        self._pending = pending
        self._run(final=False)
        return self._take()

    def finish(self) -> list[ReplyPiece]:
        """The end of the reply: whatever was held back, decided (an unclosed call becomes text)."""
        if not self._finished:
            self._run(final=True)
            self._finished = True
            if self._held_nl and not self._drop_nl:
                self._emit(PieceKind.CONTENT, self._held_nl)
            self._held_nl = ""
        return self._take()

    @property
    def content(self) -> str:
        return "".join(self._content)

    @property
    def reasoning(self) -> str:
        return "".join(self._reasoning)

    @property
    def tool_calls(self) -> list[ToolCall]:
        return list(self._calls)

    # --- the machine ----------------------------------------------------------------------------------
    def _body_state(self) -> str:
        if not self._calls_on:
            return _PLAIN
        return _LEAD if self._fmt.tool_style == LLAMA3_JSON else _TEXT

    def _run(self, final: bool) -> None:
        while self._steps[self._state](final):
            pass

    def _go(self, state: str, consumed: int) -> bool:
        self._pending = self._pending[consumed:]
        self._state, self._scan_from = state, 0
        return True

    def _step_start(self, final: bool) -> bool:
        opener = self._fmt.think_open
        if self._pending.startswith(opener):
            return self._go(_THINK, len(opener))
        if opener.startswith(self._pending) and not final:
            return False  # maybe the opening marker, still arriving
        return self._go(self._body_state(), 0)

    def _step_think(self, final: bool) -> bool:
        close = self._fmt.think_close
        at = self._pending.find(close, self._scan_from)
        if at >= 0:
            self._think_text(self._pending[:at])
            self._think_held = ""  # the newlines before the closing marker are the template's
            self._drop_nl = True
            return self._go(self._body_state(), at + len(close))
        if final:  # never closed: all of it was thinking
            self._think_text(self._pending)
            self._think_held, self._pending = "", ""
            return False
        keep = _partial_suffix(self._pending, close)
        self._think_text(self._pending[: len(self._pending) - keep])
        self._pending = self._pending[len(self._pending) - keep:]
        self._scan_from = 0
        return False

    def _step_plain(self, final: bool) -> bool:
        if self._pending:
            self._visible(self._pending, hold=False)  # no call can follow: newlines go out as they come
            self._pending = ""
        return False

    def _marker(self) -> str:
        style = self._fmt.tool_style
        if style in (MISTRAL, MISTRAL_ARGS):
            return MISTRAL_CALLS
        if style == LLAMA3_JSON:
            return PYTHON_TAG
        return TOOL_CALL_OPEN  # hermes and the fallback

    def _step_text(self, final: bool) -> bool:
        marker = self._marker()
        at = self._pending.find(marker, self._scan_from)
        if at >= 0:
            self._visible(self._pending[:at])
            return self._go(_CALL if self._fmt.tool_style in (HERMES, FALLBACK) else _REGION, at)
        keep = 0 if final else _partial_suffix(self._pending, marker)
        self._visible(self._pending[: len(self._pending) - keep])
        self._pending = self._pending[len(self._pending) - keep:]
        self._scan_from = 0
        return False

    def _step_lead(self, final: bool) -> bool:
        """Llama's bare JSON call is the whole reply: decided by its first character that is not a space."""
        body = self._pending.lstrip()
        if not body:
            if final:
                return self._go(_TEXT, 0)
            return False
        if body.startswith("{"):
            return self._go(_REGION, 0)
        return self._go(_TEXT, 0)  # text; a <|python_tag|> later in it may still start calls

    def _step_call(self, final: bool) -> bool:
        """Hermes: ``<tool_call>`` JSON ``</tool_call>``; _pending starts with the opening marker."""
        limit = MAX_CALL_CHARS
        at = self._pending.find(TOOL_CALL_CLOSE, max(self._scan_from, len(TOOL_CALL_OPEN)), limit)
        if at >= 0:
            end = at + len(TOOL_CALL_CLOSE)
            inner = self._pending[len(TOOL_CALL_OPEN):at]
            call = _call_from(_object_members(inner.strip()), self._accepts)
            self._take_calls([call] if call else None, self._pending[:end])
            return self._go(_TEXT, end)
        if len(self._pending) >= limit or final:  # too long, or cut off: what it wrote is text
            self._visible(self._pending[:limit])
            return self._go(_TEXT, min(limit, len(self._pending)))
        self._scan_from = max(0, len(self._pending) - len(TOOL_CALL_CLOSE) + 1)
        return False

    def _step_region(self, final: bool) -> bool:
        """Llama (a JSON call, or ``<|python_tag|>`` calls) and Mistral (``[TOOL_CALLS]`` then a list, or
        ``[TOOL_CALLS]name[ARGS]{...}`` each): the calls run to the end of the reply, so they are decided
        when it ends."""
        if len(self._pending) > MAX_CALL_CHARS:
            self._visible(self._pending)
            self._pending = ""
            self._state = _PLAIN
            return False
        if not final:
            return False
        parse = {MISTRAL: _mistral_calls, MISTRAL_ARGS: _mistral_args_calls}.get(self._fmt.tool_style, _llama_calls)
        calls = parse(self._pending, self._accepts)
        self._take_calls(calls, self._pending)
        self._pending = ""
        return False

    # --- output ---------------------------------------------------------------------------------------
    def _accepts(self, name: str) -> bool:
        return self._any_name or name in self._names

    def _take_calls(self, calls: list[tuple[str, str]] | None, raw: str) -> None:
        """Parsed calls replace their text; None (they did not parse) gives the text back as visible."""
        if not calls:
            self._visible(raw)
            return
        self._held_nl, self._drop_nl = "", True
        for name, arguments in calls:
            # parallel_tool_calls false: one call per reply, as OpenAI returns it; the rest are dropped,
            # and so is any call past MAX_CALLS
            if (self._calls and not self._parallel) or len(self._calls) >= MAX_CALLS:
                continue
            call = ToolCall(id=self._new_id(), name=name, arguments=arguments, index=len(self._calls))
            self._calls.append(call)
            self._out.append(ReplyPiece(PieceKind.TOOL_CALL, "", call))

    def _visible(self, text: str, hold: bool = True) -> None:
        if not text:
            return
        text = self._held_nl + text
        if self._drop_nl:
            text = text.lstrip("\n")
            if not text:
                self._held_nl = ""
                return
            self._drop_nl = False
        body = text.rstrip("\n") if hold else text
        self._held_nl = text[len(body):]
        if body:
            self._emit(PieceKind.CONTENT, body)

    def _think_text(self, text: str) -> None:
        if not text:
            return
        text = self._think_held + text
        if not self._think_started:
            text = text.lstrip("\n")  # the newline after <think> is the template's
        body = text.rstrip("\n")
        self._think_held = text[len(body):]
        if body:
            self._think_started = True
            self._emit(PieceKind.REASONING, body)

    def _emit(self, kind: PieceKind, text: str) -> None:
        (self._content if kind == PieceKind.CONTENT else self._reasoning).append(text)
        if self._out and self._out[-1].kind == kind:  # one piece per kind and run, however the text came
            self._out[-1] = ReplyPiece(kind, self._out[-1].text + text)
        else:
            self._out.append(ReplyPiece(kind, text))

    def _take(self) -> list[ReplyPiece]:
        out, self._out = self._out, []
        return out


def parse_reply(fmt: ReplyFormat, text: str, *, tools: bool | Iterable[str | Mapping] = False,
                in_thinking: bool = False, parallel: bool = True,
                new_id: Callable[[], str] = new_call_id) -> ParsedReply:
    """A whole reply, split: what ``ReplyParser`` gives for it in any pieces."""
    parser = ReplyParser(fmt, tools=tools, in_thinking=in_thinking, parallel=parallel, new_id=new_id)
    pieces = parser.feed(text) + parser.finish()
    return ParsedReply(parser.content, parser.reasoning, tuple(parser.tool_calls), tuple(_merged(pieces)))


# --- the formats' grammar ----------------------------------------------------------------------------

def _llama_calls(text: str, accepts: Callable[[str], bool]) -> list[tuple[str, str]] | None:
    """``{"name": ..., "parameters": {...}}``, optionally after ``<|python_tag|>``, several joined by ';'."""
    calls, i, n = [], 0, len(text)
    while True:
        i = _skip_space(text, i)
        if text.startswith(PYTHON_TAG, i):
            i = _skip_space(text, i + len(PYTHON_TAG))
        found = _object_at(text, i)
        if found is None:
            return None
        members, i = found
        call = _call_from(members, accepts)
        if call is None:
            return None
        calls.append(call)
        i = _skip_space(text, i)
        if i < n and text[i] == ";":
            i = _skip_space(text, i + 1)
        if i >= n:
            return calls


def _mistral_calls(text: str, accepts: Callable[[str], bool]) -> list[tuple[str, str]] | None:
    """``[TOOL_CALLS]`` then a JSON list of ``{"name", "arguments"[, "id"]}``, and nothing after it."""
    if not text.startswith(MISTRAL_CALLS):
        return None
    i = _skip_space(text, len(MISTRAL_CALLS))
    if not text.startswith("[", i):
        return None
    calls = []
    i = _skip_space(text, i + 1)
    while True:
        found = _object_at(text, i)
        if found is None:
            return None
        members, i = found
        call = _call_from(members, accepts)
        if call is None:
            return None
        calls.append(call)
        i = _skip_space(text, i)
        if text.startswith(",", i):
            i = _skip_space(text, i + 1)
            continue
        if text.startswith("]", i) and not text[i + 1:].strip():
            return calls
        return None


def _mistral_args_calls(text: str, accepts: Callable[[str], bool]) -> list[tuple[str, str]] | None:
    """Mistral's newer calls (Small 3.2, Devstral): ``[TOOL_CALLS]name[ARGS]{...}``, one after another,
    a ``[CALL_ID]id`` before ``[ARGS]`` allowed, and nothing else."""
    calls, i, n = [], 0, len(text)
    while True:
        i = _skip_space(text, i)
        if i >= n and calls:
            return calls
        if not text.startswith(MISTRAL_CALLS, i):
            return None
        i += len(MISTRAL_CALLS)
        end = text.find(MISTRAL_ARGS_MARK, i)
        if end < 0:
            return None
        name, has_id, call_id = text[i:end].partition(MISTRAL_CALL_ID)
        if not NAME_PATTERN.fullmatch(name) or not accepts(name) or (has_id and not call_id.isalnum()):
            return None
        found = _object_at(text, end + len(MISTRAL_ARGS_MARK))
        if found is None:
            return None
        _members, i = found
        calls.append((name, text[end + len(MISTRAL_ARGS_MARK):i]))


def _call_from(members: dict | None, accepts: Callable[[str], bool]) -> tuple[str, str] | None:
    """(name, arguments text) from an object's members, if it is a call of an offered tool."""
    if not members:
        return None
    name = members.get("name")
    args = members.get("arguments", members.get("parameters"))
    if name is None or args is None or not isinstance(name[0], str) or not isinstance(args[0], dict):
        return None
    if not accepts(name[0]):
        return None
    return name[0], args[1]


def _object_members(text: str) -> dict | None:
    """The members of the JSON object that is all of ``text``: key → (value, its exact text)."""
    found = _object_at(text, 0)
    if found is None or found[1] != len(text):
        return None
    return found[0]


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not JSON")  # Python's json reads NaN and Infinity; a call's arguments may not


_DECODER = json.JSONDecoder(parse_constant=_no_constant)


def _object_at(text: str, i: int) -> tuple[dict, int] | None:
    """The JSON object starting at ``text[i]``: its members (key → (value, exact text)) and where it ends."""
    if not text.startswith("{", i):
        return None
    members: dict[str, tuple[object, str]] = {}
    i = _skip_space(text, i + 1)
    if text.startswith("}", i):
        return members, i + 1
    try:
        while True:
            if not text.startswith('"', i):
                return None
            key, i = scanstring(text, i + 1)
            i = _skip_space(text, i)
            if not text.startswith(":", i):
                return None
            start = _skip_space(text, i + 1)
            value, i = _DECODER.raw_decode(text, start)
            members[key] = (value, text[start:i])
            i = _skip_space(text, i)
            if text.startswith(",", i):
                i = _skip_space(text, i + 1)
                continue
            if text.startswith("}", i):
                return members, i + 1
            return None
    except (ValueError, RecursionError):
        return None


def _skip_space(text: str, i: int) -> int:
    n = len(text)
    while i < n and text[i] in " \t\n\r":
        i += 1
    return i


def _partial_suffix(text: str, marker: str) -> int:
    """How many characters at the end of ``text`` could be the start of ``marker``."""
    for k in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-k:]):
            return k
    return 0


def _names(tools: Iterable[str | Mapping]) -> Iterable[str]:
    for tool in tools:
        if isinstance(tool, str):
            yield tool
        elif isinstance(tool, Mapping):
            function = tool.get("function")
            if isinstance(function, Mapping) and isinstance(function.get("name"), str):
                yield function["name"]


def _merged(pieces: Iterable[ReplyPiece]) -> list[ReplyPiece]:
    out: list[ReplyPiece] = []
    for piece in pieces:
        if out and piece.kind != PieceKind.TOOL_CALL and out[-1].kind == piece.kind:
            out[-1] = ReplyPiece(piece.kind, out[-1].text + piece.text)
        else:
            out.append(piece)
    return out
