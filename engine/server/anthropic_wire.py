"""Engine results in the Anthropic Messages API's wire format: the whole message, and the stream's
events (``message_start``, ``ping``, ``content_block_start``/``delta``/``stop`` per block,
``message_delta``, ``message_stop``; ``error`` once the stream has begun)."""

from __future__ import annotations

import json
import logging
import uuid

from engine.server.anthropic_requests import anthropic_id
from engine.server.backend import Served
from engine.types import CacheReport, PieceKind, ReplyPiece, ServeResult, ToolCall

log = logging.getLogger(__name__)


def message_id() -> str:
    return f"msg_{uuid.uuid4().hex[:24]}"


def stop_reason(result: ServeResult) -> str:
    """OpenAI's finish reason as Anthropic's stop reason; a reply cut short (client gone) ended its turn."""
    if result.finish_reason == "tool_calls" or (result.tool_calls and result.finish_reason != "length"):
        return "tool_use"
    if result.finish_reason == "length":
        return "max_tokens"
    if result.stop_sequence is not None:
        return "stop_sequence"
    return "end_turn"


def usage(result: ServeResult) -> dict:
    """Anthropic's usage: the prompt is input + cache read (the live or saved context reused) + cache
    creation (what this request wrote to saved context)."""
    read = min(result.cache.reused_tokens, result.prompt_tokens)
    created = min(result.cache.saved_tokens, result.prompt_tokens - read)
    return {"input_tokens": result.prompt_tokens - read - created, "output_tokens": result.completion_tokens,
            "cache_read_input_tokens": read, "cache_creation_input_tokens": created}


def _input(call: ToolCall) -> dict:
    """A call's arguments as the object Anthropic's ``input`` is (the engine hands over only calls that parsed)."""
    try:
        value = json.loads(call.arguments)
    except ValueError:
        log.warning("a tool call's arguments are not JSON: %.100r", call.arguments)
        return {}
    return value if isinstance(value, dict) else {}


def tool_use(call: ToolCall) -> dict:
    return {"type": "tool_use", "id": anthropic_id(call.id), "name": call.name, "input": _input(call)}


def content(result: ServeResult) -> list[dict]:
    """The reply's blocks: its thinking, its text, its calls (an empty text block when there is nothing else,
    as the stream has)."""
    blocks: list[dict] = []
    if result.reasoning:
        blocks.append({"type": "thinking", "thinking": result.reasoning, "signature": ""})
    if result.text or not (result.tool_calls or result.reasoning):
        blocks.append({"type": "text", "text": result.text})
    blocks.extend(tool_use(c) for c in result.tool_calls)
    return blocks


def message(served: Served, mid: str) -> dict:
    r = served.result
    return {"id": mid, "type": "message", "role": "assistant", "model": served.model, "content": content(r),
            "stop_reason": stop_reason(r), "stop_sequence": r.stop_sequence, "usage": usage(r)}


def model_object(name: str, loaded: bool) -> dict:
    """Anthropic's model object; ``loaded`` (Hearth's) marks the one in memory."""
    return {"type": "model", "id": name, "display_name": name, "created_at": "1970-01-01T00:00:00Z", "loaded": loaded}


def model_list(names: list[str], current: str) -> dict:
    """Anthropic's page of models (one page: a library is small), the loaded one first."""
    return {"data": [model_object(n, n == current) for n in names], "has_more": False,
            "first_id": names[0] if names else None, "last_id": names[-1] if names else None}


def count_body(tokens: int) -> dict:
    return {"input_tokens": tokens}


def event(kind: str, data: dict) -> str:
    return f"event: {kind}\ndata: {json.dumps({'type': kind, **data}, ensure_ascii=False)}\n\n"


class EventMaker:
    """One streamed message's events: opens a block when a piece of another kind arrives, closes the last
    at the end. ``message_start`` carries the prompt's usage when the engine reported it before the first
    token (a stateless request; a bound one: zeros), ``message_delta`` the totals, with what this request
    saved as cache creation (known only at the end)."""

    def __init__(self, mid: str, model: str):
        self.mid, self.model = mid, model
        self.index = -1
        self.open: str | None = None  # the open block's kind: "thinking", "text"

    def start(self, ready: tuple[int, CacheReport] | None = None) -> list[str]:
        prompt, read = (ready[0], ready[1].reused_tokens) if ready is not None else (0, 0)
        start_usage = {"input_tokens": prompt - read, "output_tokens": 0, "cache_read_input_tokens": read,
                       "cache_creation_input_tokens": 0}
        shell = {"id": self.mid, "type": "message", "role": "assistant", "model": self.model, "content": [],
                 "stop_reason": None, "stop_sequence": None, "usage": start_usage}
        return [event("message_start", {"message": shell}), event("ping", {})]

    def _close(self) -> list[str]:
        if self.open is None:
            return []
        out = []
        if self.open == "thinking":  # Anthropic closes a thinking block with its signature (none here)
            out.append(event("content_block_delta", {"index": self.index,
                                                     "delta": {"type": "signature_delta", "signature": ""}}))
        out.append(event("content_block_stop", {"index": self.index}))
        self.open = None
        return out

    def _open(self, kind: str, block: dict) -> list[str]:
        out = self._close()
        self.index += 1
        self.open = kind
        out.append(event("content_block_start", {"index": self.index, "content_block": block}))
        return out

    def piece(self, piece: ReplyPiece) -> list[str]:
        if piece.kind == PieceKind.TOOL_CALL and piece.call is not None:
            out = self._open("tool_use", {**tool_use(piece.call), "input": {}})
            out.append(event("content_block_delta", {"index": self.index, "delta": {
                "type": "input_json_delta", "partial_json": piece.call.arguments}}))
            return out + self._close()
        if not piece.text:
            return []
        if piece.kind == PieceKind.REASONING:
            out = [] if self.open == "thinking" else self._open("thinking", {"type": "thinking", "thinking": "",
                                                                            "signature": ""})
            return out + [event("content_block_delta", {"index": self.index,
                                                         "delta": {"type": "thinking_delta", "thinking": piece.text}})]
        out = [] if self.open == "text" else self._open("text", {"type": "text", "text": ""})
        return out + [event("content_block_delta", {"index": self.index,
                                                    "delta": {"type": "text_delta", "text": piece.text}})]

    def end(self, served: Served) -> list[str]:
        r = served.result
        out = self._close()
        if self.index < 0:  # nothing was written: one empty text block, as the whole message has
            out += self._open("text", {"type": "text", "text": ""}) + self._close()
        out.append(event("message_delta", {"delta": {"stop_reason": stop_reason(r), "stop_sequence": r.stop_sequence},
                                           "usage": usage(r)}))
        out.append(event("message_stop", {}))
        return out

    @staticmethod
    def error(body: dict) -> str:
        """An error once the stream has begun (Anthropic's ``event: error``); ``body`` is the error object."""
        return f"event: error\ndata: {json.dumps(body, ensure_ascii=False)}\n\n"
