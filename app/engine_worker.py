"""The engine on its own thread: the window's only way to run the model or touch checkpoints.

``EngineWorker`` lives in a QThread. The window calls its slots through queued signals, so requests
run one after another in the order they were made (a message sent during a rebuild waits for it),
and the worker reports back through signals. Nothing here blocks the UI thread; stopping is a
``CancelToken`` the window sets directly, checked by the engine before every forward pass.
"""

from __future__ import annotations

import logging
import time
import traceback
from pathlib import Path

from PySide6.QtCore import QObject, QThread, Signal, Slot

from app.config import AppConfig
from engine.checkpoint.store import CheckpointStore
from engine.errors import HearthError, ModelFileError
from engine.generation import CancelToken
from engine.sampling import SamplingParams
from engine.session import REBUILT, ChatSessions

log = logging.getLogger(__name__)


class EngineWorker(QObject):
    # model set-up
    needs_model = Signal()  # the default model is not installed
    setup_progress = Signal(str, int, int)  # stage ("download", "convert"), done, total
    setup_failed = Signal(str)
    ready = Signal(object)  # {"model", "provider", "weights", "context", "note"}
    # conversations
    resumed = Signal(str, object)  # conversation, ResumeReport.as_dict()
    rebuilding = Signal(str, object)  # conversation, report of the failure being rebuilt from
    rebuild_progress = Signal(str, int, int)
    rebuilt = Signal(str, object)  # conversation, {"ms", "tokens", "cancelled"}
    prefill_progress = Signal(str, int, int)
    token = Signal(str, str)  # conversation, text piece
    turn_finished = Signal(str, object)  # conversation, {"text", "stop_reason", "timings", "save", "context"}
    failed = Signal(str, str)  # conversation ("" for none), message in plain words
    cache_states = Signal(object)  # conversation → {"badge": "live" | "saved" | "stale", "tokens": n}
    stopped = Signal()
    # saved-context management (the browser)
    checkpoint_progress = Signal(int, int)  # checked, total
    checkpoint_report = Signal(object)  # {"full", "items": {conversation: {status, reason, tokens, bytes}}, "bytes", "budget"}
    bundle_done = Signal(object)  # export: {"ok", "conversations", "contexts"}; import: {"ok", "used", "rebuilt"}

    def __init__(self, config: AppConfig):
        super().__init__()
        self.config = config
        self.engine = None
        self.sessions: ChatSessions | None = None

    # model ----------------------------------------------------------------------------------------------
    @Slot()
    def load(self) -> None:
        from engine.loader import load_engine

        try:
            paths = self.config.paths
            engine, converted, _ = load_engine(
                paths, model=self.config.model, weights=self.config.weights, provider=self.config.provider,
                convert_progress=lambda d, t: self.setup_progress.emit("convert", d, t))
            store = CheckpointStore(paths.checkpoints)
        except ModelFileError as exc:
            if self.config.model is None and "not installed" in str(exc):
                self.needs_model.emit()
            else:
                self.setup_failed.emit(str(exc))
            return
        except HearthError as exc:
            self.setup_failed.emit(str(exc))
            return
        except Exception as exc:  # a bug: say so instead of dying silently on a thread
            log.error("loading the model failed:\n%s", traceback.format_exc())
            self.setup_failed.emit(f"loading the model failed unexpectedly: {exc}")
            return
        self.engine = engine
        self.sessions = ChatSessions(engine, store)
        self.ready.emit({"model": converted.gguf_path.stem, "provider": engine.provider,
                         "weights": converted.precision, "context": engine.context_length,
                         "note": engine.runner.provider_note})
        self._emit_cache_states()

    @Slot()
    def fetch_model(self) -> None:
        """Download the default model (first run), then load it."""
        from engine.model.fetch import default_model, fetch_model

        try:
            fetch_model(default_model(), self.config.paths.models,
                        progress=lambda d, t: self.setup_progress.emit("download", d, t))
        except HearthError as exc:
            self.setup_failed.emit(str(exc))
            return
        except OSError as exc:
            self.setup_failed.emit(f"could not save the model: {exc.strerror or exc}")
            return
        self.load()

    # conversations -------------------------------------------------------------------------------------
    @Slot(str, object, object)
    def open_conversation(self, conversation: str, messages: list, cancel: CancelToken) -> None:
        """Make ``conversation`` live: restore its checkpoint (no prefill); rebuild it if that failed."""
        if self.sessions is None:
            return
        try:
            if not any(m["role"] == "user" for m in messages):
                self.sessions.switch_away()
                self._emit_cache_states()
                return
            _, report = self.sessions.prepare(conversation, messages)
            self.resumed.emit(conversation, report.as_dict())
            if report.source == REBUILT:
                self._rebuild(conversation, messages, report.as_dict(), cancel)
        except HearthError as exc:
            self.failed.emit(conversation, str(exc))
        except Exception as exc:
            log.error("opening %s failed:\n%s", conversation, traceback.format_exc())
            self.failed.emit(conversation, f"opening the conversation failed unexpectedly: {exc}")
        self._emit_cache_states()

    def _rebuild(self, conversation: str, messages: list, report: dict, cancel: CancelToken) -> None:
        self.rebuilding.emit(conversation, report)
        started = time.perf_counter()
        logits, prompt, _ = self.sessions.sync(
            conversation, messages, lambda d, t: self.rebuild_progress.emit(conversation, d, t), cancel)
        self.rebuilt.emit(conversation, {"ms": (time.perf_counter() - started) * 1000, "tokens": len(prompt),
                                         "cancelled": logits is None})

    @Slot(str, object, object, object)
    def generate(self, conversation: str, messages: list, settings: dict, cancel: CancelToken) -> None:
        if self.sessions is None:
            self.failed.emit(conversation, "the model is not loaded")
            return
        try:
            params = sampling_from_settings(settings)
            turn = self.sessions.generate(
                conversation, messages, params, int(settings.get("max_new_tokens", 512)),
                on_text=lambda piece: self.token.emit(conversation, piece),
                progress=lambda d, t: self.prefill_progress.emit(conversation, d, t),
                cancel=cancel, on_ready=lambda r: self.resumed.emit(conversation, r.as_dict()))
        except HearthError as exc:
            self.failed.emit(conversation, str(exc))
            self._emit_cache_states()
            return
        except Exception as exc:
            log.error("generation failed:\n%s", traceback.format_exc())
            self.failed.emit(conversation, f"generation failed unexpectedly: {exc}")
            self._emit_cache_states()
            return
        result = turn.generation
        self.turn_finished.emit(conversation, {
            "text": result.text, "stop_reason": result.stop_reason, "timings": result.timings.as_dict(),
            "save": turn.save.as_dict() if turn.save else None,
            "context": len(self.engine.tokens), "new_tokens": len(result.tokens)})
        self._emit_cache_states()

    @Slot(str)
    def forget(self, conversation: str) -> None:
        """The conversation was deleted or cleared: drop its live state and its checkpoints."""
        if self.sessions is not None:
            self.sessions.forget(conversation)
        else:  # the model never loaded: still delete the files
            from engine.checkpoint.store import conversation_file

            (self.config.paths.checkpoints / conversation_file(conversation)).unlink(missing_ok=True)
        self._emit_cache_states()

    # saved context, for the browser -------------------------------------------------------------------
    @Slot(object, bool, object)
    def inspect_checkpoints(self, conversations: list, full: bool, cancel: CancelToken) -> None:
        """Status of each conversation's checkpoint: a quick header check, or every checksum (full)."""
        from engine.checkpoint.status import NONE, checkpoint_status

        store = self._store()
        if store is None:
            return
        identity = self.sessions.identity if self.sessions else None
        vocab = self.engine.tokenizer.vocab_size if self.engine else None
        items = {}
        for i, cid in enumerate(conversations):
            if cancel.cancelled:
                break
            entry = store.conversation_entry(cid)
            if entry is None:
                items[cid] = {"status": NONE, "reason": None, "tokens": 0, "bytes": 0}
            else:
                status, problem, tokens = checkpoint_status(store.path(entry.name), identity, vocab, full)
                items[cid] = {"status": status, "reason": problem.reason if problem else None,
                              "message": str(problem) if problem else "", "tokens": tokens, "bytes": entry.bytes}
            if full:
                self.checkpoint_progress.emit(i + 1, len(conversations))
        self.checkpoint_report.emit({"full": full, "items": items, "bytes": store.total_bytes(),
                                     "budget": store.budget_bytes, "cancelled": cancel.cancelled})

    @Slot(object)
    def drop_context(self, conversations: list) -> None:
        """Delete saved context but keep the chats (their context is rebuilt when next used)."""
        for cid in conversations:
            self.forget(cid)
        self._report_usage()

    @Slot(str, str)
    def copy_context(self, source: str, target: str) -> None:
        """Give a branch its source's saved context, so it opens without a prefill (the frontiers past
        the branch point simply stop matching its text)."""
        import shutil

        from engine.checkpoint.store import conversation_file

        store = self._store()
        if store is None or store.conversation_entry(source) is None:
            return
        try:
            with store.lock.held():
                shutil.copyfile(store.path(conversation_file(source)), store.path(conversation_file(target)))
            store.reconcile()
            store.conversation_entry(target)
        except OSError as exc:
            log.warning("could not copy the saved context of %s: %s", source, exc)
        self._emit_cache_states()

    @Slot(object)
    def set_budget(self, budget_bytes: int) -> None:
        store = self._store()
        if store is not None:
            store.set_budget(budget_bytes)
            store.enforce_budget(protect={self.sessions.active} if self.sessions and self.sessions.active else ())
            self._report_usage()

    @Slot(object)
    def reclaim(self, live_conversations: list) -> None:
        """Remove leftovers and the saved context of deleted chats, then evict down to the budget."""
        store = self._store()
        if store is not None:
            store.gc(set(live_conversations))
            self._report_usage()
            self._emit_cache_states()

    @Slot(str, object, object)
    def export_bundle(self, path: str, document: dict, conversations: list) -> None:
        """Write conversations with their saved context into one file (the live one is saved first)."""
        from engine.bundle import write_bundle

        store = self._store()
        try:
            if self.sessions is not None and self.sessions.active in conversations:
                self.sessions.save("switch")
            contexts = {}
            if store is not None:
                for cid in conversations:
                    entry = store.conversation_entry(cid)
                    if entry is not None:
                        contexts[cid] = store.path(entry.name)
            added = write_bundle(Path(path), document, contexts)
        except OSError as exc:
            self.bundle_done.emit({"ok": False, "error": f"the bundle could not be written: {exc.strerror or exc}"})
            return
        self.bundle_done.emit({"ok": True, "export": True, "conversations": len(conversations), "contexts": added})

    @Slot(str, object, object)
    def import_bundle_contexts(self, path: str, entries: dict, owners: dict) -> None:
        """Install a bundle's saved contexts for their (new) conversations, each only if it verifies
        against this model; the others are rebuilt when opened."""
        from engine.bundle import install_contexts

        store = self._store()
        if store is None:
            self.bundle_done.emit({"ok": True, "export": False, "used": [], "rebuilt": {
                owners[k]: "the model is not loaded" for k in entries if k in owners}})
            return
        report = install_contexts(Path(path), entries, owners, store, self.sessions.identity,
                                  self.engine.tokenizer.vocab_size)
        self.bundle_done.emit({"ok": True, "export": False, **report})
        self._emit_cache_states()

    def _store(self):
        if self.sessions is not None:
            return self.sessions.store
        return None

    def _report_usage(self) -> None:
        store = self._store()
        if store is not None:
            self.checkpoint_report.emit({"full": False, "items": {}, "bytes": store.total_bytes(),
                                         "budget": store.budget_bytes, "cancelled": False})

    @Slot()
    def shutdown(self) -> None:
        """Save what is live; the window waits for ``stopped`` before it lets the process end."""
        try:
            if self.sessions is not None:
                self.sessions.close()
                self.sessions.store.close()
        finally:
            self.stopped.emit()

    def _emit_cache_states(self) -> None:
        if self.sessions is None:
            return
        states = {}
        for e in self.sessions.store.entries(kind="conversation"):
            if e.conversation:
                badge = "saved" if e.model_fp == self.sessions.identity.model_fp else "stale"
                states[e.conversation] = {"badge": badge, "tokens": e.tokens}
        if self.sessions.active and self.engine.tokens:
            states[self.sessions.active] = {"badge": "live", "tokens": len(self.engine.tokens)}
        self.cache_states.emit(states)


def sampling_from_settings(settings: dict) -> SamplingParams:
    """A chat's sampling settings (from its settings dialog) as engine parameters; bad values raise."""
    defaults = SamplingParams()
    try:
        seed = settings.get("seed")
        params = SamplingParams(
            temperature=float(settings.get("temperature", defaults.temperature)),
            top_k=int(settings.get("top_k", defaults.top_k)),
            top_p=float(settings.get("top_p", defaults.top_p)),
            min_p=float(settings.get("min_p", defaults.min_p)),
            repetition_penalty=float(settings.get("repeat_penalty", defaults.repetition_penalty)),
            seed=None if seed is None else int(seed),
        )
        int(settings.get("max_new_tokens", 1))
    except (TypeError, ValueError) as exc:
        raise HearthError(f"this chat's settings are not valid ({exc}); fix them in Chat settings") from None
    params.validate()
    return params


class EngineHost(QObject):
    """Owns the worker's thread and the queued signals the window uses to call it."""

    request_load = Signal()
    request_fetch = Signal()
    request_open = Signal(str, object, object)
    request_generate = Signal(str, object, object, object)
    request_forget = Signal(str)
    request_shutdown = Signal()
    request_inspect = Signal(object, bool, object)
    request_drop_context = Signal(object)
    request_copy_context = Signal(str, str)
    request_set_budget = Signal(object)  # bytes: may not fit a 32-bit int
    request_reclaim = Signal(object)
    request_export_bundle = Signal(str, object, object)
    request_import_bundle = Signal(str, object, object)

    def __init__(self, config: AppConfig, parent: QObject | None = None):
        super().__init__(parent)
        self.thread = QThread()
        self.thread.setObjectName("hearth-engine")
        self.worker = EngineWorker(config)
        self.worker.moveToThread(self.thread)
        self.request_load.connect(self.worker.load)
        self.request_fetch.connect(self.worker.fetch_model)
        self.request_open.connect(self.worker.open_conversation)
        self.request_generate.connect(self.worker.generate)
        self.request_forget.connect(self.worker.forget)
        self.request_shutdown.connect(self.worker.shutdown)
        self.request_inspect.connect(self.worker.inspect_checkpoints)
        self.request_drop_context.connect(self.worker.drop_context)
        self.request_copy_context.connect(self.worker.copy_context)
        self.request_set_budget.connect(self.worker.set_budget)
        self.request_reclaim.connect(self.worker.reclaim)
        self.request_export_bundle.connect(self.worker.export_bundle)
        self.request_import_bundle.connect(self.worker.import_bundle_contexts)
        self.thread.start()

    def stop(self, timeout_ms: int = 15000) -> bool:
        """Save and stop the worker thread; True if it finished in time."""
        from PySide6.QtCore import QEventLoop, QTimer

        if not self.thread.isRunning():
            return True
        loop = QEventLoop()
        self.worker.stopped.connect(loop.quit)
        QTimer.singleShot(timeout_ms, loop.quit)
        self.request_shutdown.emit()
        loop.exec()
        self.thread.quit()
        return self.thread.wait(timeout_ms)
