"""The model side of the server: which library model is loaded, and one request served on it.

Everything that touches ``Hearth`` runs on the engine thread (``EngineRunner``); this module's public
methods only queue work there and hand back Futures.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field

from engine.api import Hearth, HearthPaths, ModelLibrary
from engine.errors import HearthError, ModelNotFoundError
from engine.server.errors import ApiError
from engine.server.runner import EngineRunner
from engine.types import (
    CacheReport,
    CancelToken,
    LibraryModel,
    ModelStatus,
    ReplyPiece,
    ServeRequest,
    ServeResult,
)

log = logging.getLogger(__name__)


class AnyCancel(CancelToken):
    """Cancelled when any of its tokens is: the client's (disconnect, shutdown) or a stop string's."""

    def __init__(self, *tokens: CancelToken):
        super().__init__()
        self.tokens = tokens

    @property
    def cancelled(self) -> bool:
        return self._event.is_set() or any(t.cancelled for t in self.tokens)


@dataclass(frozen=True)
class Served:
    """A finished request: the engine's result and, for logprobs, each token id's text."""

    result: ServeResult
    model: str  # the library name that answered
    token_texts: dict[int, str] = field(default_factory=dict)


class ModelHost:
    """Owns the one ``Hearth`` (used only on the runner's thread) and the library model it runs."""

    def __init__(self, paths: HearthPaths, runner: EngineRunner, *, model: str | None = None, weights: str = "int4",
                 provider: str = "auto", threads: int | None = None, idle_unload_s: float | None = None,
                 hearth: Hearth | None = None):
        self.paths, self.runner, self.weights = paths, runner, weights
        self.library = ModelLibrary(paths, weights=weights)
        self.default_model = model or self.library.default_name()
        self._last_loaded = self.default_model
        self.bundled = self._bundled_default(self.default_model)
        self.hearth = hearth or Hearth(paths, model=None if self.bundled else self.default_model, weights=weights,
                                       provider=provider, threads=threads)
        self.state = "starting"  # starting → loading → ready | failed; unloaded after --idle-unload
        self.problem = ""  # why the last load failed
        self.idle_unload_s = idle_unload_s
        self._last_used = time.monotonic()
        self._active: set[CancelToken] = set()
        self._lock = threading.Lock()
        self._idle_timer: threading.Timer | None = None
        self.last_result: ServeResult | None = None  # the latest request's, cut short or not (for /health and tests)

    # models ---------------------------------------------------------------------------------------------
    def _bundled_default(self, name: str) -> bool:
        """A packaged build ships the default model converted, without its GGUF: the library lists it as
        not downloaded, yet it runs (``Hearth`` with no model named finds the bundled conversion)."""
        if name != self.library.default_name():
            return False
        try:
            return Hearth(self.paths, model=None, weights=self.weights).locate_model().bundled
        except HearthError:
            return False

    def _runnable(self, model: LibraryModel) -> bool:
        return model.status == ModelStatus.READY or (model.name == self.default_model and self.bundled)

    @property
    def current(self) -> str:
        """The loaded model (the window may have switched it), else the one loaded last or to load first:
        what a request that names no model runs on."""
        if self.hearth.model is not None and self.hearth.model_key:
            return self.hearth.model_key
        return self._last_loaded

    def loaded_name(self) -> str | None:
        """The model in memory now (None after --idle-unload freed it, or before the first load)."""
        return self.current if self.hearth.model is not None else None

    def ready_models(self) -> list[LibraryModel]:
        """The models a request may name, the loaded one (or the one about to load) first."""
        ready = [m for m in self.library.models() if self._runnable(m)]
        return sorted(ready, key=lambda m: m.name != self.current)

    def resolve_model(self, name: str | None, any_model: bool = False) -> LibraryModel:
        """The model a request runs on: the one it names; the loaded one when it names none (as Ollama and
        LM Studio do), or names one the library does not know and ``any_model`` is set (``--any-model``:
        clients written for one hosted model name). ApiError 404 otherwise."""
        if name is None:
            return self.require_model(self.current)
        if any_model:
            try:
                self.library.get(name)
            except ModelNotFoundError:
                return self.require_model(self.current)
        return self.require_model(name)

    def require_model(self, name: str) -> LibraryModel:
        """The library model ``name``, ready to load; ApiError 404 otherwise."""
        try:
            model = self.library.get(name)
        except ModelNotFoundError:
            raise ApiError(404, f"The model '{name}' does not exist in this Hearth's library; GET /v1/models "
                                "lists the ones it can run", param="model", code="model_not_found") from None
        if not self._runnable(model):
            why = model.problem or str(model.status)
            raise ApiError(404, f"The model '{name}' cannot be run here: {why}", param="model", code="model_not_found")
        return model

    def start(self) -> Future:
        """Load the default model on the engine thread (requests queue behind it)."""
        return self.runner.submit(lambda: self._ensure(self.default_model), bounded=False)

    def _ensure(self, name: str) -> None:
        """Make ``name`` the loaded model (one model in memory at a time). Engine thread only."""
        hearth = self.hearth
        if hearth.model is not None and hearth.model_key == name:
            return
        self.state = "loading"
        try:
            bundled = name == self.default_model and self.bundled  # loaded by not naming it (see above)
            if hearth.model is None and hearth.model_path == (None if bundled else name):
                hearth.load()
            else:
                hearth.switch_model(None if bundled else name)
        except HearthError as exc:  # switch_model brings the previous model back when it can
            self.state, self.problem = ("ready" if hearth.model is not None else "failed"), str(exc)
            raise
        self.state, self.problem, self._last_loaded = "ready", "", name
        log.info("model %s loaded", name)

    # serving --------------------------------------------------------------------------------------------
    def serve(self, model: str, request: ServeRequest, on_text: Callable[[str], None] | None, cancel: CancelToken, *,
              max_tokens_given: bool = True, on_piece: Callable[[ReplyPiece], None] | None = None,
              on_ready: Callable[[int, CacheReport], None] | None = None) -> Future:
        """Queue one request; the Future gives ``Served``. QueueFullError at once when the queue is full.
        ``max_tokens_given`` False: the reply may run to the end of the context, as OpenAI's does.
        ``on_text`` gets the visible reply's pieces; ``on_piece`` every piece by kind (thinking, text, calls)."""
        def job() -> Served:
            if cancel.cancelled:  # its client went away while it waited
                raise ApiError(499, "the client closed the request")
            self._ensure(model)
            nonlocal request
            if not max_tokens_given:
                request = dataclasses.replace(request, max_tokens=self.hearth.model.context_length)
            result = serve_on(self.hearth, request, on_text, cancel, on_piece, on_ready)
            self.last_result = result
            texts = {}
            for lp in result.logprobs:
                for token in (lp.token, *(t for t, _ in lp.top)):
                    if token not in texts:
                        texts[token] = self.hearth.token_text(token)
            return Served(result, model, texts)

        with self._lock:
            self._active.add(cancel)
        future = self.runner.submit(job)
        future.add_done_callback(lambda _f: self._finished(cancel))
        return future

    def count_prompt(self, model: str, messages: tuple, tools: tuple = (), template_kwargs: dict | None = None) -> Future:
        """Queue a count of the tokens ``messages`` (and ``tools``) render to on ``model``, the generation
        prompt included (Anthropic's count_tokens); the Future gives an int."""
        def job() -> int:
            self._ensure(model)
            prompt = self.hearth.render_prompt(list(messages), tools=list(tools), template_kwargs=template_kwargs)
            return self.hearth.count_tokens(prompt)

        return self.runner.submit(job)

    def _finished(self, cancel: CancelToken) -> None:
        with self._lock:
            self._active.discard(cancel)
            self._last_used = time.monotonic()
        self._schedule_idle_unload()

    def cancel_all(self) -> None:
        """Shutting down: every generation stops at its next token."""
        with self._lock:
            for token in self._active:
                token.cancel()

    # --idle-unload ---------------------------------------------------------------------------------------
    def _schedule_idle_unload(self) -> None:
        if not self.idle_unload_s:
            return
        with self._lock:
            if self._idle_timer is not None:
                self._idle_timer.cancel()
            self._idle_timer = threading.Timer(self.idle_unload_s, self._idle)
            self._idle_timer.daemon = True
            self._idle_timer.start()

    def _idle(self) -> None:
        def unload() -> None:
            with self._lock:
                idle = not self._active and time.monotonic() - self._last_used >= self.idle_unload_s
            if idle and self.hearth.model is not None:
                self.hearth.unload()
                self.state = "unloaded"
                log.info("model unloaded after %g s idle", self.idle_unload_s)

        try:
            self.runner.submit(unload, bounded=False)
        except Exception as exc:  # shutting down: nothing to unload
            log.debug("idle unload not queued: %s", exc)

    def close(self):
        """Engine thread: save what is live and close the stores; Hearth.close's SaveResult."""
        if self._idle_timer is not None:
            self._idle_timer.cancel()
        return self.hearth.close()


# the engine call ------------------------------------------------------------------------------------------
def serve_on(hearth: Hearth, request: ServeRequest, on_text: Callable[[str], None] | None, cancel: CancelToken,
             on_piece: Callable[[ReplyPiece], None] | None = None,
             on_ready: Callable[[int, CacheReport], None] | None = None) -> ServeResult:
    """``Hearth.serve``: the prompt cache, constrained decoding, stop strings and penalties."""
    if on_piece is None and on_ready is None:
        return hearth.serve(request, on_text, cancel)
    return hearth.serve(request, on_text, cancel, on_piece=on_piece, on_ready=on_ready)
