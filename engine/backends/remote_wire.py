"""What OpenAI-compatible servers send, read defensively: server-sent events (vLLM, SGLang, llama.cpp's server,
Ollama and Hearth differ in where ``usage`` goes, whether ``[DONE]`` ends the stream, ``data:`` with or without
a space, keep-alive comments, llama.cpp's ``timings``), their error bodies, and ``/v1/models``.

Every size from the network is bounded: a line, a whole reply, a model list. Errors name the server, never
its key (the key is only ever in the request's Authorization header).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from engine.remotes import RemoteError
from engine.types import StopReason

MAX_LINE_BYTES = 1 << 20  # one SSE line: a chunk is a few hundred bytes; a megabyte is not a chunk
MAX_REPLY_CHARS = 4 << 20  # a whole reply's text (max_tokens bounds it on any honest server)
MAX_STREAM_BYTES = 256 << 20  # a whole stream, keep-alive comments and JSON wrapping included
MAX_BODY_BYTES = 8 << 20  # a non-streamed body: /v1/models, a whole completion, an error
MAX_MODELS = 1000  # models one server lists (Ollama with many pulls lists dozens)
MAX_MODEL_ID_CHARS = 256
MAX_ERROR_CHARS = 300  # how much of a server's error text is quoted

FINISH = {"stop": StopReason.EOS, "eos": StopReason.EOS, "length": StopReason.LENGTH, "abort": StopReason.CANCELLED}


@dataclass
class StreamState:
    """What a stream said so far: the text (and thinking), why it ended, usage and llama.cpp's timings."""

    text: list[str] = field(default_factory=list)
    reasoning: list[str] = field(default_factory=list)
    chars: int = 0
    stop: StopReason | None = None
    usage: dict = field(default_factory=dict)
    timings: dict = field(default_factory=dict)

    @property
    def reply(self) -> str:
        return "".join(self.text)

    def cached_tokens(self) -> int | None:
        """The server's prefix-cache hit for the prompt: ``usage.prompt_tokens_details.cached_tokens`` (vLLM
        with --enable-prompt-tokens-details, SGLang with --enable-cache-report, newer llama.cpp, Hearth), else
        llama.cpp's ``timings.cache_n``; None when the server does not say."""
        details = self.usage.get("prompt_tokens_details")
        if isinstance(details, dict) and _count(details.get("cached_tokens")) is not None:
            return _count(details.get("cached_tokens"))
        return _count(self.timings.get("cache_n"))

    def prompt_tokens(self) -> int:
        n = _count(self.usage.get("prompt_tokens"))
        if n is None:  # llama.cpp without usage: what it read fresh plus what it reused
            n = (_count(self.timings.get("prompt_n")) or 0) + (_count(self.timings.get("cache_n")) or 0)
        return n

    def completion_tokens(self) -> int | None:
        n = _count(self.usage.get("completion_tokens"))
        return n if n is not None else _count(self.timings.get("predicted_n"))


def _count(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def lines(chunks: Iterable[bytes], server: str) -> Iterator[str]:
    """The stream's lines (without their end), each at most MAX_LINE_BYTES; CRLF, CR and LF all end one."""
    pending, total = b"", 0
    for chunk in chunks:
        total += len(chunk)
        if total > MAX_STREAM_BYTES:  # an endless stream of comments or empty events: no reply grows, yet it never ends
            raise RemoteError(f"server {server} sent more than {MAX_STREAM_BYTES / 2**20:g} MiB for one reply; the rest "
                              "was not read")
        pending += chunk
        start = 0
        while True:
            lf, cr = pending.find(b"\n", start), pending.find(b"\r", start)
            cut = min(i for i in (lf, cr) if i >= 0) if lf >= 0 or cr >= 0 else -1
            if cut < 0 or (cut == cr and cut == len(pending) - 1):  # a CR last: its LF may be in the next chunk
                break
            yield _decoded(pending[start:cut], server)
            start = cut + (2 if cut == cr and pending[cut + 1:cut + 2] == b"\n" else 1)
        pending = pending[start:]
        if len(pending) > MAX_LINE_BYTES:
            raise RemoteError(f"server {server} sent a line longer than {MAX_LINE_BYTES >> 20} MiB: that is no "
                              "reply stream")
    if pending.rstrip(b"\r"):
        yield _decoded(pending.rstrip(b"\r"), server)


def _decoded(line: bytes, server: str) -> str:
    if len(line) > MAX_LINE_BYTES:
        raise RemoteError(f"server {server} sent a line longer than {MAX_LINE_BYTES >> 20} MiB: that is no reply stream")
    return line.decode("utf-8", errors="replace")


def events(text_lines: Iterable[str], server: str) -> Iterator[dict]:
    """The JSON objects of a server-sent event stream, up to ``[DONE]`` (or its end). ``data:`` with or
    without its space, an event's several data lines joined, comments (``: keep-alive``) and other fields
    skipped."""
    data: list[str] = []
    for line in text_lines:
        if not line:  # the blank line that ends an event
            if data:
                payload = "\n".join(data)
                data = []
                if payload.strip() == "[DONE]":
                    return
                yield json_object(payload, server)
            continue
        if line.startswith(":"):
            continue
        name, _, value = line.partition(":")
        if name == "data":
            data.append(value[1:] if value.startswith(" ") else value)
    if data:  # a stream that ends without the blank line
        payload = "\n".join(data)
        if payload.strip() != "[DONE]":
            yield json_object(payload, server)


def json_object(payload: str, server: str) -> dict:
    try:
        value = json.loads(payload)
    except (ValueError, RecursionError):
        raise RemoteError(f"server {server} sent something that is not JSON in its reply stream: "
                          f"{_quote(payload)}") from None
    if not isinstance(value, dict):
        raise RemoteError(f"server {server} sent a stream event that is not a JSON object: {_quote(payload)}")
    return value


def feed(state: StreamState, chunk: dict, server: str) -> tuple[str, str]:
    """Take one chunk into ``state``; (the visible text it adds, the thinking it adds). A chunk with an
    ``error`` (vLLM, SGLang and Hearth send one when the engine fails mid-reply) raises RemoteError."""
    if "error" in chunk:
        raise RemoteError(f"server {server} failed mid-reply: {error_text(chunk['error'])}")
    if isinstance(chunk.get("usage"), dict):  # vLLM and Ollama: a last chunk with no choices; llama.cpp: with them
        state.usage = chunk["usage"]
    if isinstance(chunk.get("timings"), dict):  # llama.cpp's server: cache_n, prompt_n, predicted_n
        state.timings = chunk["timings"]
    text, thought = [], []
    choices = chunk.get("choices")
    for choice in choices if isinstance(choices, list) else ():
        if not isinstance(choice, dict) or choice.get("index", 0) != 0:
            continue
        delta = choice.get("delta", choice.get("message"))  # a whole answer (stream ignored) has "message"
        if isinstance(delta, dict):
            piece = delta.get("content")
            thinking = delta.get("reasoning_content") or delta.get("reasoning")  # vLLM/SGLang/llama.cpp; Ollama
        else:  # /v1/completions
            piece, thinking = choice.get("text"), None
        if isinstance(piece, str) and piece:
            text.append(piece)
        if isinstance(thinking, str) and thinking:
            thought.append(thinking)
        finish = choice.get("finish_reason")
        if isinstance(finish, str) and finish:  # OpenAI's "stop" covers an end of turn and a stop string
            state.stop = FINISH.get(finish, StopReason.EOS)
    added, thinking = "".join(text), "".join(thought)
    state.chars += len(added) + len(thinking)
    if state.chars > MAX_REPLY_CHARS:
        raise RemoteError(f"server {server} sent a reply longer than {MAX_REPLY_CHARS >> 20} M characters; "
                          "the rest was not read")
    if added:
        state.text.append(added)
    if thinking:
        state.reasoning.append(thinking)
    return added, thinking


def error_text(error: object) -> str:
    """An error object's message: OpenAI's ``{"message"}``, Ollama's plain string, FastAPI's ``detail``."""
    if isinstance(error, dict):
        for key in ("message", "detail", "error"):
            if isinstance(error.get(key), str | dict):
                return error_text(error[key])
        return _quote(json.dumps(error)[:MAX_ERROR_CHARS])
    if isinstance(error, str):
        return _quote(error)
    return _quote(str(error))


def body_message(status: int, content_type: str, body: bytes) -> str:
    """What a refusal's body says, in a line: the JSON error's message, else a note that it is a web page
    (a proxy's or the wrong address), else the start of its text."""
    text = body[:MAX_BODY_BYTES].decode("utf-8", errors="replace")
    if "json" in content_type or text.lstrip().startswith("{"):
        try:
            value = json.loads(text)
        except (ValueError, RecursionError):
            value = None
        if isinstance(value, dict):
            return error_text(value.get("error", value))
    if "html" in content_type or text.lstrip()[:15].lower().startswith(("<!doctype", "<html")):
        return "it answered with a web page, not the API (is the address right, or is a proxy in the way?)"
    return _quote(text) or f"HTTP {status} with no explanation"


def _quote(text: str) -> str:
    """A server's words, shortened and on one line (a hostile server could send anything)."""
    one = " ".join(text.split())
    return one if len(one) <= MAX_ERROR_CHARS else one[:MAX_ERROR_CHARS] + "…"


@dataclass(frozen=True)
class ListedModel:
    id: str
    context_length: int = 0  # vLLM's max_model_len, llama.cpp's meta.n_ctx_train; 0 when untold


def listed_models(value: object, server: str) -> list[ListedModel]:
    """``/v1/models``'s ``data``, bounded: at most MAX_MODELS ids of at most MAX_MODEL_ID_CHARS, no control
    characters (an id goes into a picker and a terminal)."""
    data = value.get("data") if isinstance(value, dict) else None
    if not isinstance(data, list):
        raise RemoteError(f"server {server} did not list its models as an OpenAI-compatible server does "
                          "(GET /v1/models gave no 'data' list)")
    out: list[ListedModel] = []
    for entry in data[:MAX_MODELS]:
        if not isinstance(entry, dict):
            continue
        mid = entry.get("id")
        if not isinstance(mid, str) or not mid or len(mid) > MAX_MODEL_ID_CHARS or not mid.isprintable():
            continue
        meta = entry.get("meta") if isinstance(entry.get("meta"), dict) else {}
        context = _count(entry.get("max_model_len")) or _count(meta.get("n_ctx_train")) or 0
        out.append(ListedModel(mid, context))
    return out
