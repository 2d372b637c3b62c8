"""The FastAPI application: OpenAI's endpoints over one ``ModelHost``, behind the guards."""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections.abc import AsyncIterator
from concurrent.futures import Future

from fastapi import FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.middleware.cors import CORSMiddleware

from engine.errors import HearthError
from engine.server.backend import ModelHost, Served
from engine.server.config import ServerSettings
from engine.server.errors import ApiError, error_body, from_engine
from engine.server.guards import BodyLimit, HostGuard, JsonOnly, KeyGuard, OriginGuard
from engine.server.json_body import read_object
from engine.server.requests import CONVERSATION_HEADER, Planned, chat_request, completion_request
from engine.server.runner import QueueFullError, RunnerClosedError
from engine.server.schemas import ChatRequest, CompletionRequest
from engine.server.wire import ChunkMaker, cache_headers, chat_completion, new_id, now, text_completion
from engine.types import CancelToken

log = logging.getLogger(__name__)
# pydantic names the member of a union it tried ("str", "list[str]"): not part of the field's name
_UNION_TAG = re.compile(r"^(str|int|float|bool|none|[\w-]+\[.*\])$")
RETRY_AFTER_S = 1
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


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
    def models() -> dict:
        return {"object": "list", "data": [_model_object(m.name) for m in host.ready_models()]}

    @app.get("/v1/models/{name:path}")
    def model(name: str) -> dict:
        return _model_object(host.require_model(name).name)

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        body = await _parse(request, ChatRequest)
        planned = chat_request(body, request.headers.get(CONVERSATION_HEADER))
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        return await _answer(request, host, planned, chat=True, stream=body.stream, include_usage=include_usage)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        body = await _parse(request, CompletionRequest)
        planned = completion_request(body, request.headers.get(CONVERSATION_HEADER))
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        return await _answer(request, host, planned, chat=False, stream=body.stream, include_usage=include_usage)

    # outermost last: Host first, then Origin, CORS (so preflights need no key and a listed page can
    # read its errors), the key, the body's type, the body size: all before the body is read
    app.add_middleware(BodyLimit, limit=settings.max_body_bytes)
    app.add_middleware(JsonOnly)
    app.add_middleware(KeyGuard, api_key=settings.api_key)
    if settings.cors_origins:  # off unless listed; only the listed origins are echoed, never "*"
        app.add_middleware(CORSMiddleware, allow_origins=list(settings.cors_origins), allow_methods=["GET", "POST"],
                           allow_headers=["Authorization", "Content-Type", "X-Hearth-Conversation"],
                           expose_headers=["X-Hearth-Cache", "X-Hearth-Cached-Tokens"])
    app.add_middleware(OriginGuard, allowed_origins=settings.cors_origins, embedded=settings.embedded)
    app.add_middleware(HostGuard, bound_host=settings.host, allowed_hosts=settings.allowed_hosts)
    return app


def _model_object(name: str) -> dict:
    return {"id": name, "object": "model", "created": 0, "owned_by": "hearth"}


def _errors(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def api_error(_request: Request, exc: ApiError) -> JSONResponse:
        return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)

    @app.exception_handler(HearthError)
    async def engine_error(_request: Request, exc: HearthError) -> JSONResponse:
        error = from_engine(exc)
        return JSONResponse(error.body(), status_code=error.status)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_request: Request, exc: StarletteHTTPException) -> JSONResponse:
        message = "no such endpoint" if exc.status_code == 404 else str(exc.detail)
        return JSONResponse(error_body(exc.status_code, message), status_code=exc.status_code,
                            headers=getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def bug(_request: Request, exc: Exception) -> JSONResponse:
        log.exception("request failed")
        return JSONResponse(error_body(500, f"internal error: {type(exc).__name__}: {exc}"), status_code=500)


async def _parse(request: Request, schema: type[BaseModel]) -> BaseModel:
    """The body validated against ``schema``; 400 naming the first bad field."""
    data = await run_in_threadpool(read_object, await request.body())  # a large body: not on the event loop
    try:
        return schema.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        param = ".".join(str(p) for p in first["loc"] if not _UNION_TAG.match(str(p))) or None
        raise ApiError(400, f"{param}: {first['msg']}" if param else first["msg"], param=param,
                       code="invalid_value") from None


class _Bridge:
    """Carries the engine thread's text pieces and its end into the event loop, in order."""

    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.events: asyncio.Queue = asyncio.Queue()
        self.cancel = CancelToken()

    def _put(self, event: tuple) -> None:
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, event)
        except RuntimeError:  # the loop is gone (shutting down): nobody is listening
            pass

    def on_text(self, piece: str) -> None:
        self._put(("text", piece))

    def attach(self, future: Future) -> None:
        future.add_done_callback(lambda f: self._put(("done", f)))


async def _until_disconnect(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _or_disconnect(request: Request, awaitable) -> tuple[bool, object]:
    """(True, result) when ``awaitable`` finished first; (False, None) when the client went away."""
    work = asyncio.ensure_future(awaitable)
    gone = asyncio.ensure_future(_until_disconnect(request))
    try:
        await asyncio.wait({work, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
    if work.done():
        return True, work.result()
    work.cancel()
    return False, None


def _result(future: Future, chat: bool) -> Served:
    try:
        return future.result()
    except HearthError as exc:
        raise from_engine(exc, "messages" if chat else "prompt") from None


async def _answer(request: Request, host: ModelHost, planned: Planned, *, chat: bool, stream: bool,
                  include_usage: bool) -> Response:
    await run_in_threadpool(host.require_model, planned.model)
    bridge = _Bridge()
    try:
        future = host.serve(planned.model, planned.request, bridge.on_text if stream else (lambda _p: None),
                            bridge.cancel, max_tokens_given=planned.max_tokens_given)
    except QueueFullError as exc:
        raise ApiError(429, f"the server is busy ({exc}); retry shortly", code="queue_full",
                       headers={"Retry-After": str(RETRY_AFTER_S)}) from None
    except RunnerClosedError as exc:
        raise ApiError(503, str(exc), code="shutting_down") from None
    bridge.attach(future)
    rid, created = new_id("chatcmpl" if chat else "cmpl"), now()
    if not stream:
        try:
            finished, _ = await _or_disconnect(request, asyncio.wrap_future(future))
        except HearthError:  # refused: _result answers it, naming the field
            finished = True
        if not finished:
            bridge.cancel.cancel()
            return Response(status_code=499)
        served = _result(future, chat)
        body = (chat_completion if chat else text_completion)(served, rid, created)
        return JSONResponse(body, headers=cache_headers(served.result.cache))
    # Streaming: hold the response until the first text or the end, so a request the engine refuses
    # (a prompt longer than the context, a model that cannot load) still gets its proper status.
    started, first = await _or_disconnect(request, bridge.events.get())
    if not started:
        bridge.cancel.cancel()
        return Response(status_code=499)
    headers = dict(SSE_HEADERS)
    if first[0] == "done":
        served = _result(future, chat)
        headers.update(cache_headers(served.result.cache))
    maker = ChunkMaker(chat, rid, planned.model, created)
    return StreamingResponse(_events(first, bridge, future, maker, include_usage), media_type="text/event-stream",
                             headers=headers)


def _sse(data: dict | str) -> str:
    return f"data: {data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)}\n\n"


async def _events(first: tuple, bridge: _Bridge, future: Future, maker: ChunkMaker,
                  include_usage: bool) -> AsyncIterator[str]:
    try:
        yield _sse(maker.first())
        kind, value = first
        while kind == "text":
            yield _sse(maker.text(value))
            kind, value = await bridge.events.get()
        try:
            served = _result(future, maker.chat)
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
