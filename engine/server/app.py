"""The FastAPI application: OpenAI's endpoints and Anthropic's Messages API over one ``ModelHost``, behind
the guards. Errors take the shape of the API whose path was asked (engine/server/errors.py)."""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections.abc import AsyncIterator

from fastapi import FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.middleware.cors import CORSMiddleware

from engine.errors import HearthError
from engine.server import anthropic_wire
from engine.server.anthropic_requests import messages_request, prompt_parts
from engine.server.anthropic_schemas import CountTokensRequest, MessagesRequest
from engine.server.backend import ModelHost
from engine.server.config import ServerSettings
from engine.server.errors import ApiError, from_engine, shaped
from engine.server.guards import BodyLimit, HostGuard, JsonOnly, KeyGuard, OriginGuard
from engine.server.json_body import read_object
from engine.server.pending import Pending, or_disconnect, queued, result_of
from engine.server.requests import CONVERSATION_HEADER, Planned, chat_request, completion_request
from engine.server.schemas import ChatRequest, CompletionRequest
from engine.server.wire import ChunkMaker, cache_headers, chat_completion, new_id, now, text_completion

log = logging.getLogger(__name__)
# pydantic names the member of a union it tried ("str", "list[str]"): not part of the field's name
_UNION_TAG = re.compile(r"^(str|int|float|bool|none|[\w-]+\[.*\])$")
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
ANTHROPIC_VERSION = "anthropic-version"  # the header Anthropic's clients send with every request


def create_app(host: ModelHost, settings: ServerSettings) -> FastAPI:
    app = FastAPI(title="Hearth", docs_url=None, redoc_url=None, openapi_url=None)
    _errors(app)

    @app.get("/health")
    def health() -> JSONResponse:
        ok = host.state in ("ready", "unloaded")
        body = {"status": host.state, "model": host.hearth.model_key if ok else None}
        if host.problem:
            body["problem"] = host.problem
        return JSONResponse(body, status_code=200 if ok else 503)

    @app.get("/v1/models")
    def models(request: Request) -> dict:
        current = host.loaded_name()
        names = [m.name for m in host.ready_models()]
        if ANTHROPIC_VERSION in request.headers:  # Anthropic's client lists models at the same path
            return anthropic_wire.model_list(names, current)
        return {"object": "list", "data": [_model_object(n, n == current) for n in names]}

    @app.get("/v1/models/{name:path}")
    def model(name: str, request: Request) -> dict:
        found = host.require_model(name).name
        if ANTHROPIC_VERSION in request.headers:
            return anthropic_wire.model_object(found, found == host.loaded_name())
        return _model_object(found, found == host.loaded_name())

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        body = await _parse(request, ChatRequest)
        planned = chat_request(body, request.headers.get(CONVERSATION_HEADER))
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        return await _answer(request, host, settings, planned, chat=True, stream=body.stream,
                             include_usage=include_usage)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        body = await _parse(request, CompletionRequest)
        planned = completion_request(body, request.headers.get(CONVERSATION_HEADER))
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        return await _answer(request, host, settings, planned, chat=False, stream=body.stream,
                             include_usage=include_usage)

    @app.post("/v1/messages")
    async def messages(request: Request) -> Response:
        body = await _parse(request, MessagesRequest)
        planned = messages_request(body, request.headers.get(CONVERSATION_HEADER))
        return await _answer_anthropic(request, host, settings, planned, stream=body.stream)

    @app.post("/v1/messages/count_tokens")
    async def count_tokens(request: Request) -> dict:
        body = await _parse(request, CountTokensRequest)
        messages, tools, _choice, _parallel, variables, _points = prompt_parts(body)
        model = (await run_in_threadpool(host.resolve_model, body.model, settings.any_model)).name
        future = queued(lambda: host.count_prompt(model, messages, tools, variables))
        finished, tokens = await or_disconnect(request, asyncio.wrap_future(future))
        if not finished:
            return Response(status_code=499)
        return anthropic_wire.count_body(tokens)

    # outermost last: Host first, then Origin, CORS (so preflights need no key and a listed page can
    # read its errors), the key, the body's type, the body size: all before the body is read
    app.add_middleware(BodyLimit, limit=settings.max_body_bytes)
    app.add_middleware(JsonOnly)
    app.add_middleware(KeyGuard, api_key=settings.api_key)
    if settings.cors_origins:  # off unless listed; only the listed origins are echoed, never "*"
        app.add_middleware(CORSMiddleware, allow_origins=list(settings.cors_origins), allow_methods=["GET", "POST"],
                           allow_headers=["Authorization", "Content-Type", "X-Hearth-Conversation", "x-api-key",
                                          "anthropic-version", "anthropic-beta"],
                           expose_headers=["X-Hearth-Cache", "X-Hearth-Cached-Tokens"])
    app.add_middleware(OriginGuard, allowed_origins=settings.cors_origins, embedded=settings.embedded)
    app.add_middleware(HostGuard, bound_host=settings.host, allowed_hosts=settings.allowed_hosts)
    return app


def _model_object(name: str, loaded: bool) -> dict:
    """OpenAI's model object; ``loaded`` (Hearth's) marks the one in memory, which a request naming no model runs."""
    return {"id": name, "object": "model", "created": 0, "owned_by": "hearth", "loaded": loaded}


def _error_response(request: Request, error: ApiError) -> JSONResponse:
    status, body = error.shaped(request.url.path)
    return JSONResponse(body, status_code=status, headers=error.headers or None)


def _errors(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError) -> JSONResponse:
        return _error_response(request, exc)

    @app.exception_handler(HearthError)
    async def engine_error(request: Request, exc: HearthError) -> JSONResponse:
        return _error_response(request, from_engine(exc))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        message = "no such endpoint" if exc.status_code == 404 else str(exc.detail)
        status, body = shaped(request.url.path, exc.status_code, message)
        return JSONResponse(body, status_code=status, headers=getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def bug(request: Request, exc: Exception) -> JSONResponse:
        log.exception("request failed")
        status, body = shaped(request.url.path, 500, f"internal error: {type(exc).__name__}: {exc}")
        return JSONResponse(body, status_code=status)


async def _parse(request: Request, schema: type[BaseModel]) -> BaseModel:
    """The body validated against ``schema``; 400 naming the first bad field."""
    data = await run_in_threadpool(read_object, await request.body())  # a large body: not on the event loop
    try:
        return schema.model_validate(data)
    except ValidationError as exc:
        # the deepest error: a value that fits no member of a union fails each, and the shallow failures
        # ("content: Input should be a valid string") hide the one that says what is wrong inside it
        first = max(exc.errors(), key=lambda e: len(e["loc"]))
        param = _field(first["loc"], data)
        raise ApiError(400, f"{param}: {first['msg']}" if param else first["msg"], param=param,
                       code="invalid_value") from None


def _field(loc: tuple, data: object) -> str | None:
    """An error's place as the client wrote it: pydantic's path less the union members it names (a member's
    tag, such as "str" or "tool_use", or a model's class name), which are not fields of the request."""
    parts, node = [], data
    for i, part in enumerate(loc):
        if isinstance(node, dict) and part in node or isinstance(node, list) and isinstance(part, int) \
                and 0 <= part < len(node):
            parts.append(str(part))
            node = node[part]
        elif i == len(loc) - 1 and not _UNION_TAG.match(str(part)):  # a missing field is named last
            parts.append(str(part))
    return ".".join(parts) or None


async def _resolve(host: ModelHost, settings: ServerSettings, planned: Planned) -> str:
    return (await run_in_threadpool(host.resolve_model, planned.model, settings.any_model)).name


async def _answer(request: Request, host: ModelHost, settings: ServerSettings, planned: Planned, *, chat: bool,
                  stream: bool, include_usage: bool) -> Response:
    model = await _resolve(host, settings, planned)
    started = Pending(host, planned, model, stream=stream, pieces=chat)
    param = "messages" if chat else "prompt"
    rid, created = new_id("chatcmpl" if chat else "cmpl"), now()
    if not stream:
        served = await started.whole(request, param)
        if served is None:
            return Response(status_code=499)
        body = (chat_completion if chat else text_completion)(served, rid, created)
        return JSONResponse(body, headers=cache_headers(served.result.cache))
    first = await started.first(request)
    if first is None:
        return Response(status_code=499)
    headers = dict(SSE_HEADERS)
    if first[0] == "done":
        headers.update(cache_headers(result_of(started.future, param).result.cache))
    maker = ChunkMaker(chat, rid, model, created)
    return StreamingResponse(_events(first, started, maker, include_usage), media_type="text/event-stream",
                             headers=headers)


async def _answer_anthropic(request: Request, host: ModelHost, settings: ServerSettings, planned: Planned, *,
                            stream: bool) -> Response:
    model = await _resolve(host, settings, planned)
    started = Pending(host, planned, model, stream=stream, pieces=True, ready=True)
    mid = anthropic_wire.message_id()
    if not stream:
        served = await started.whole(request, "messages")
        if served is None:
            return Response(status_code=499)
        return JSONResponse(anthropic_wire.message(served, mid), headers=cache_headers(served.result.cache))
    first = await started.first(request)
    if first is None:
        return Response(status_code=499)
    headers = dict(SSE_HEADERS)
    if first[0] == "done":
        headers.update(cache_headers(result_of(started.future, "messages").result.cache))
    maker = anthropic_wire.EventMaker(mid, model)
    return StreamingResponse(_anthropic_events(first, started, maker, request.url.path),
                             media_type="text/event-stream", headers=headers)


def _sse(data: dict | str) -> str:
    return f"data: {data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)}\n\n"


async def _events(first: tuple, started: Pending, maker: ChunkMaker, include_usage: bool) -> AsyncIterator[str]:
    bridge, future = started.bridge, started.future
    try:
        yield _sse(maker.first())
        kind, value = first
        while kind != "done":
            for chunk in maker.piece(value):
                yield _sse(chunk)
            kind, value = await bridge.events.get()
        try:
            served = result_of(future, "messages" if maker.chat else "prompt")
        except ApiError as exc:  # the stream has begun: the error goes in it, as OpenAI's does
            yield _sse(exc.body())
        else:
            for chunk in maker.last(served):
                yield _sse(chunk)
            if include_usage:
                yield _sse(maker.usage(served))
        yield _sse("[DONE]")
    finally:
        if not future.done():  # the client went away mid-stream: stop at the next token
            bridge.cancel.cancel()


async def _anthropic_events(first: tuple, started: Pending, maker: anthropic_wire.EventMaker,
                            path: str) -> AsyncIterator[str]:
    bridge, future = started.bridge, started.future
    try:
        kind, value = first
        ready = None
        if kind == "ready":  # the prompt's size and what came from cache: message_start's usage
            ready = value
            kind, value = await bridge.events.get()
        for event in maker.start(ready):
            yield event
        while kind != "done":
            for event in maker.piece(value):
                yield event
            kind, value = await bridge.events.get()
        try:
            served = result_of(future, "messages")
        except ApiError as exc:  # the stream has begun: Anthropic's error event
            yield maker.error(exc.shaped(path)[1])
        else:
            for event in maker.end(served):
                yield event
    finally:
        if not future.done():
            bridge.cancel.cancel()
