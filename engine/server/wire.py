"""Engine results in OpenAI's wire format: whole responses, stream chunks, usage and logprobs, plus
Hearth's own report of how the prompt's context was obtained (the ``hearth`` object and headers)."""

from __future__ import annotations

import time
import uuid

from engine.server.backend import Served
from engine.types import CacheReport, PieceKind, ReplyPiece, ServeResult, ToolCall

CACHE_HEADER, CACHED_TOKENS_HEADER = "X-Hearth-Cache", "X-Hearth-Cached-Tokens"
# OpenAI's finish reasons; a generation cut short (client gone, server stopping) ended, so "stop"
FINISH = {"stop": "stop", "length": "length", "cancelled": "stop"}


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def now() -> int:
    return int(time.time())


def cache_headers(cache: CacheReport) -> dict[str, str]:
    return {CACHE_HEADER: str(cache.source), CACHED_TOKENS_HEADER: str(cache.cached_tokens)}


def hearth_object(result: ServeResult) -> dict:
    """How the prompt's context was obtained, and the engine's own time to the first token (a streamed tool
    call reaches the client only once it is whole, so a client's own first-token time is later)."""
    cache = result.cache
    return {"source": str(cache.source), "reason": cache.reason, "reused_tokens": cache.reused_tokens,
            "prefilled_tokens": cache.prefilled_tokens, "restore_ms": round(cache.restore_ms, 3),
            "ttft_ms": round(result.timings.ttft_ms, 3) if result.timings is not None else None,
            # prompt lookup (the request's prompt_lookup): tokens drafted, and how many the model agreed with
            "drafted_tokens": result.timings.drafted_tokens if result.timings is not None else 0,
            "accepted_tokens": result.timings.accepted_tokens if result.timings is not None else 0}


def usage(result: ServeResult) -> dict:
    return {"prompt_tokens": result.prompt_tokens, "completion_tokens": result.completion_tokens,
            "total_tokens": result.prompt_tokens + result.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": result.cache.cached_tokens}}


def finish_reason(result: ServeResult) -> str:
    return FINISH.get(result.finish_reason, result.finish_reason)


def _entry(text: str, logprob: float) -> dict:
    return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8"))}


def chat_logprobs(served: Served) -> dict | None:
    if not served.result.logprobs:
        return None
    texts = served.token_texts
    return {"content": [dict(_entry(texts[lp.token], lp.logprob),
                             top_logprobs=[_entry(texts[t], v) for t, v in lp.top])
                        for lp in served.result.logprobs], "refusal": None}


def completion_logprobs(served: Served) -> dict | None:
    if not served.result.logprobs:
        return None
    texts, offsets, at = served.token_texts, [], 0
    for lp in served.result.logprobs:
        offsets.append(at)
        at += len(texts[lp.token])
    return {"tokens": [texts[lp.token] for lp in served.result.logprobs],
            "token_logprobs": [lp.logprob for lp in served.result.logprobs],
            "top_logprobs": [{texts[t]: v for t, v in lp.top} for lp in served.result.logprobs],
            "text_offset": offsets}


def tool_call_object(call: ToolCall) -> dict:
    return {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}


def chat_message(result: ServeResult) -> dict:
    """The reply as OpenAI's ``message``: content null when it only calls tools; the thinking apart
    (``reasoning_content``, as llama.cpp's server and DeepSeek's API send it)."""
    message: dict = {"role": "assistant", "content": result.text if result.text or not result.tool_calls else None,
                     "refusal": None}
    if result.tool_calls:
        message["tool_calls"] = [tool_call_object(c) for c in result.tool_calls]
    if result.reasoning:
        message["reasoning_content"] = result.reasoning
    return message


def chat_completion(served: Served, rid: str, created: int) -> dict:
    r = served.result
    return {"id": rid, "object": "chat.completion", "created": created, "model": served.model,
            "choices": [{"index": 0, "message": chat_message(r), "logprobs": chat_logprobs(served),
                         "finish_reason": finish_reason(r)}],
            "usage": usage(r), "hearth": hearth_object(r)}


def text_completion(served: Served, rid: str, created: int) -> dict:
    r = served.result
    return {"id": rid, "object": "text_completion", "created": created, "model": served.model,
            "choices": [{"index": 0, "text": r.text, "logprobs": completion_logprobs(served),
                         "finish_reason": finish_reason(r)}],
            "usage": usage(r), "hearth": hearth_object(r)}


class ChunkMaker:
    """The stream's chunks for one request, chat or text completion."""

    def __init__(self, chat: bool, rid: str, model: str, created: int):
        self.chat, self.rid, self.model, self.created = chat, rid, model, created
        self.obj = "chat.completion.chunk" if chat else "text_completion"

    def _chunk(self, choices: list[dict], **extra) -> dict:
        return {"id": self.rid, "object": self.obj, "created": self.created, "model": self.model,
                "choices": choices, **extra}

    def _choice(self, text: str | None, finish: str | None = None, logprobs: dict | None = None, role: bool = False) -> dict:
        if self.chat:
            delta = {} if text is None else {"content": text}
            if role:
                delta["role"] = "assistant"
            return {"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish}
        return {"index": 0, "text": text or "", "logprobs": logprobs, "finish_reason": finish}

    def first(self) -> dict:
        return self._chunk([self._choice("", role=True)])

    def text(self, piece: str) -> dict:
        return self._chunk([self._choice(piece)])

    def _delta(self, delta: dict) -> dict:
        return self._chunk([{"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}])

    def piece(self, piece: ReplyPiece) -> list[dict]:
        """A chat reply's piece as OpenAI streams it: content and ``reasoning_content`` deltas, and a call as
        ``delta.tool_calls`` by index: first its index, id, type and name with empty arguments, then the
        arguments (whole: the engine hands over a call only once it parsed)."""
        if piece.kind == PieceKind.REASONING:
            return [self._delta({"reasoning_content": piece.text})] if piece.text else []
        if piece.kind == PieceKind.TOOL_CALL and piece.call is not None:
            call = piece.call
            head = {"index": call.index, "id": call.id, "type": "function",
                    "function": {"name": call.name, "arguments": ""}}
            return [self._delta({"tool_calls": [head]}),
                    self._delta({"tool_calls": [{"index": call.index, "function": {"arguments": call.arguments}}]})]
        return [self.text(piece.text)] if piece.text else []

    def last(self, served: Served) -> list[dict]:
        """The end: the logprobs (all at once: pieces of text are not whole tokens) and the finish reason
        with the ``hearth`` report, then usage when asked (``stream_options.include_usage``)."""
        logprobs = (chat_logprobs if self.chat else completion_logprobs)(served)
        chunks = [self._chunk([self._choice(None if self.chat else "", finish_reason(served.result), logprobs)],
                              hearth=hearth_object(served.result))]
        return chunks

    def usage(self, served: Served) -> dict:
        return self._chunk([], usage=usage(served.result), hearth=hearth_object(served.result))
