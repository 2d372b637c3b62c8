"""A request on its way through the engine thread, seen from the event loop: queued (or refused: a full
queue, a closing server), its pieces carried into the loop in order, and the client's disconnect, which
stops its generation."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from concurrent.futures import Future

from fastapi import Request

from engine.errors import HearthError
from engine.server.backend import ModelHost, Served
from engine.server.errors import ApiError, from_engine
from engine.server.requests import Planned
from engine.server.runner import QueueFullError, RunnerClosedError
from engine.types import CacheReport, CancelToken, PieceKind, ReplyPiece

RETRY_AFTER_S = 1


class Bridge:
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
        self._put(("piece", ReplyPiece(PieceKind.CONTENT, piece)))

    def on_other_piece(self, piece: ReplyPiece) -> None:
        """Thinking and calls: the visible text comes through ``on_text``, which every path of the engine
        calls (a request bound to a conversation, too), in the same order as these."""
        if piece.kind != PieceKind.CONTENT:
            self._put(("piece", piece))

    def on_ready(self, prompt_tokens: int, cache: CacheReport) -> None:
        """The prompt is in the context (a stateless request): what Anthropic's ``message_start`` reports."""
        self._put(("ready", (prompt_tokens, cache)))

    def attach(self, future: Future) -> None:
        future.add_done_callback(lambda f: self._put(("done", f)))


async def until_disconnect(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def or_disconnect(request: Request, awaitable: Awaitable) -> tuple[bool, object]:
    """(True, result) when ``awaitable`` finished first; (False, None) when the client went away."""
    work = asyncio.ensure_future(awaitable)
    gone = asyncio.ensure_future(until_disconnect(request))
    try:
        await asyncio.wait({work, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
    if work.done():
        return True, work.result()
    work.cancel()
    return False, None


def result_of(future: Future, prompt_param: str) -> Served:
    try:
        return future.result()
    except HearthError as exc:
        raise from_engine(exc, prompt_param) from None


def queued(submit: Callable[[], Future]) -> Future:
    """``submit()``'s Future; a full queue or a closing server answered as the API says."""
    try:
        return submit()
    except QueueFullError as exc:
        raise ApiError(429, f"the server is busy ({exc}); retry shortly", code="queue_full",
                       headers={"Retry-After": str(RETRY_AFTER_S)}) from None
    except RunnerClosedError as exc:
        raise ApiError(503, str(exc), code="shutting_down") from None


class Pending:
    """A request queued on the engine: its bridge, Future and the library model that runs it. ``pieces``: a
    chat reply, whose thinking and calls stream apart from its text."""

    def __init__(self, host: ModelHost, planned: Planned, model: str, *, stream: bool, pieces: bool,
                 ready: bool = False):
        """``ready``: the stream's first event may be ("ready", (prompt_tokens, cache)), before any piece."""
        self.bridge = Bridge()
        self.model = model
        on_text = self.bridge.on_text if stream else None
        on_piece = self.bridge.on_other_piece if pieces and stream else None
        on_ready = self.bridge.on_ready if ready and stream else None
        self.future = queued(lambda: host.serve(model, planned.request, on_text, self.bridge.cancel,
                                                 max_tokens_given=planned.max_tokens_given, on_piece=on_piece,
                                                 on_ready=on_ready))
        self.bridge.attach(self.future)

    async def whole(self, request: Request, prompt_param: str) -> Served | None:
        """The finished request; None when the client went away first (the generation is then stopped)."""
        try:
            finished, _ = await or_disconnect(request, asyncio.wrap_future(self.future))
        except HearthError:  # refused: result_of answers it, naming the field
            finished = True
        if not finished:
            self.bridge.cancel.cancel()
            return None
        return result_of(self.future, prompt_param)

    async def first(self, request: Request) -> tuple | None:
        """Streaming: the first piece or the end, so a request the engine refuses (a prompt longer than the
        context, a model that cannot load) still gets its proper status; None when the client went away."""
        started, first = await or_disconnect(request, self.bridge.events.get())
        if not started:
            self.bridge.cancel.cancel()
            return None
        return first
