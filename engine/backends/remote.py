"""The remote backend (docs/architecture.md, "Backends"; docs/remote.md): turns run on an OpenAI-compatible
server over HTTP — vLLM, SGLang, llama.cpp's server, Ollama, another Hearth — while the conversation text
stays here, in this data dir's SQLite store, the truth it is for every backend.

A remote chat is a Hearth chat: the turn rule holds (the message is stored before the request; the reply is
stored as it streams, so a dropped connection keeps what arrived), Stop closes the stream, regenerate makes
a new version, Continue sends the partial reply last and appends what comes. Each turn sends the stored
messages unchanged, so the server's prefix cache serves the repeated part; what it reports of that is
``Finished.server_cached_tokens``.

``capabilities`` says what it lacks: no saved context here (no ``Resumed``/``Rebuilt``, no saved-context
services, no bundles' contexts), no kernel facts, no constrained output or logprobs. Records carry
``local=None``. HTTP, retries and errors are engine/backends/remote_http.py; the wire's shapes
remote_wire.py.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

from engine.backends import remote_wire as wire
from engine.backends.local import open_conversations
from engine.backends.remote_http import DEFAULT_READ_TIMEOUT_S, RemoteModelError, RemoteStoppedError, ServerClient
from engine.conversations import ConversationStore, check_id
from engine.errors import ConversationError, HearthError, ModelNotLoadedError, PromptError, TurnCancelledError
from engine.paths import HearthPaths
from engine.remotes import RemoteError, RemoteRegistry, RemoteServer, split_model_key
from engine.turn_checks import check_message, check_rewrite, user_content
from engine.types import (
    DEFAULT_MAX_NEW_TOKENS,
    Accepted,
    CancelToken,
    Capabilities,
    Completion,
    EventSink,
    Finished,
    LibraryModel,
    ModelInfo,
    ModelOrigin,
    ModelStatus,
    PieceKind,
    ResponseFormat,
    Resume,
    SamplingParams,
    SaveResult,
    SetupProgress,
    StopReason,
    Timings,
    Token,
    TurnRequest,
    Waiting,
)

log = logging.getLogger(__name__)

FLUSH_S = 0.5  # the streaming reply is written to the store this often: a crash loses at most this much
LIST_TIMEOUT_S = 5.0


def _noop(_event: object) -> None:
    pass


def sampling_body(params: SamplingParams | None) -> dict:
    """The request's sampling fields. Greedy is temperature 0 (every engine reads it so); otherwise OpenAI's
    temperature and top_p, and top_k, min_p and repetition_penalty, which vLLM, SGLang, llama.cpp's server
    and Hearth accept beside them (Ollama's OpenAI endpoint ignores what it does not know)."""
    params = params or SamplingParams()
    if params.greedy:
        body: dict = {"temperature": 0.0}
    else:
        body = {"temperature": params.temperature, "top_p": params.top_p, "top_k": params.top_k,
                "min_p": params.min_p, "repetition_penalty": params.repetition_penalty}
    if params.seed is not None:
        body["seed"] = params.seed
    return body


class RemoteBackend:
    """A backend over one OpenAI-compatible server. Used from one thread, as every backend is."""

    capabilities = Capabilities(saved_context=False, constrained_output=False, tools=False, raw_completion=True,
                                logprobs=False, model_switching=True, serving=False, local_facts=False)

    def __init__(self, paths: HearthPaths, server: RemoteServer, api_key: str | None, *, model: str | None = None,
                 conversations: ConversationStore | None = None, timeout_s: float = DEFAULT_READ_TIMEOUT_S):
        """``model``: the server's model id (or NAME/MODEL); None: the first it lists. ``conversations``: a
        store to share (the window's): used, never closed, here."""
        self.paths = paths.ensure()
        self.server = server
        self.model_name = _model_id(server, model)
        self._client = ServerClient(server, api_key, timeout_s)
        self._info: ModelInfo | None = None
        self._conversations = conversations
        self._own_store = conversations is None

    # models --------------------------------------------------------------------------------------------
    @property
    def model(self) -> ModelInfo | None:
        return self._info

    @property
    def model_key(self) -> str:
        """``NAME/MODEL``: what a conversation remembers, and what ``hearth-cli chat --model`` takes."""
        if self._info is not None:
            return self._info.key
        return self.server.model_key(self.model_name) if self.model_name else ""

    def list_models(self) -> list[LibraryModel]:
        return [LibraryModel(self.server.model_key(m.id), m.id, ModelOrigin.REMOTE, None, ModelStatus.READY,
                             context_length=m.context_length) for m in self._client.models()]

    def load(self, progress: Callable[[SetupProgress], None] | None = None,
             cancel: CancelToken | Callable[[], bool] | None = None, *, force: bool = False) -> ModelInfo:
        """Reach the server and check it lists the model: nothing to convert or load here."""
        self._info = self._described(self.model_name)
        self.model_name = self._info.name
        return self._info

    def switch_model(self, model: str | None, weights: str | None = None,
                     progress: Callable[[SetupProgress], None] | None = None, *, force: bool = False,
                     cancel: CancelToken | Callable[[], bool] | None = None) -> ModelInfo:
        """Another model of the same server (``NAME/OTHER`` or the bare id); one that fails keeps the current."""
        wanted = _model_id(self.server, model) if model is not None else self.model_name
        if self._info is not None and wanted == self._info.name:
            return self._info
        self._info = self._described(wanted)
        self.model_name = self._info.name
        return self._info

    def _described(self, wanted: str | None) -> ModelInfo:
        listed = self._client.models()
        if not listed:
            raise RemoteModelError(f"server {self.server.name} lists no models")
        chosen = listed[0] if wanted is None else next((m for m in listed if m.id == wanted), None)
        if chosen is None:
            names = ", ".join(m.id for m in listed[:8]) + (", …" if len(listed) > 8 else "")
            raise RemoteModelError(f"server {self.server.name} has no model {wanted!r} (it lists {names})")
        # what an OpenAI-compatible server tells of a model: its id, at most a context length
        return ModelInfo(chosen.id, "remote", "", chosen.context_length, f"served by {self.server.name}", kind="chat",
                         key=self.server.model_key(chosen.id))

    def unload(self) -> None:
        self._info = None

    # conversations and turns --------------------------------------------------------------------------
    @property
    def conversations(self) -> ConversationStore:
        """The conversation text, kept here whatever runs the model."""
        if self._conversations is None:
            self._conversations = open_conversations(self.paths, backup=True)
        return self._conversations

    def open_conversation(self, conversation: str, on_event: EventSink | None = None,
                          cancel: CancelToken | None = None, *, max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
                          context_policy: str | None = None) -> Resume | None:
        self._require_model()
        return None  # no context is kept here: the server's prefix cache serves the repeated part

    def run_turn(self, request: TurnRequest, on_event: EventSink | None = None,
                 cancel: CancelToken | None = None, *, create: bool = False) -> Finished:
        """The turn rule over HTTP: the message is stored first, the reply as it streams (a stopped or
        broken one keeps what arrived), the model remembered, then Finished."""
        emit = on_event or _noop
        cid = check_id(request.conversation)
        request.params.validate()
        if request.max_new_tokens < 1:
            raise PromptError("the longest reply must be at least 1 token")
        check_message(request)
        check_rewrite(request)
        with self._turn_lock(cid, emit, cancel):
            convs = self.conversations
            set_aside = self._set_aside(cid) if request.regenerate else None
            try:
                user_seq = self._store_message(cid, request, create)
                emit(Accepted(cid, user_seq, tuple(convs.messages(cid))))
                info = self._require_model()  # after storing, as the local backend: nothing typed is lost
                return self._answer(cid, request, info, emit, cancel)
            finally:
                if set_aside is not None and convs.restore_reply(cid, set_aside):
                    log.info("the regenerate of %s wrote nothing: its last reply is back", cid)

    def _set_aside(self, cid: str) -> int:
        try:
            return self.conversations.set_aside_reply(cid)
        except ConversationError as exc:
            raise PromptError(str(exc)) from None

    def _store_message(self, cid: str, request: TurnRequest, create: bool) -> int | None:
        convs = self.conversations
        conv = convs.get(cid) if create else convs.require(cid)
        system = (conv.system_prompt if conv is not None else "") if request.system_prompt is None \
            else request.system_prompt
        content = user_content(request)
        stored = [m.as_chat() for m in convs.messages(cid)] if conv is not None else []
        chat = ([{"role": "system", "content": system}] if system else []) + stored + \
            ([] if content is None else [{"role": "user", "content": content}])
        if request.continue_reply and (not chat or chat[-1]["role"] != "assistant"):
            raise PromptError("the conversation does not end in a reply, so there is none to continue")
        if not any(m["role"] == "user" for m in chat):
            raise PromptError("the conversation has no message to answer")
        if conv is None:
            conv = convs.ensure(cid, system)
        if system != conv.system_prompt:
            convs.set_system_prompt(cid, system)
        if content is None:
            return None
        return convs.append(cid, "user", content, attachments=tuple(request.attachments),
                            typed_text=request.user_message).seq

    def _answer(self, cid: str, request: TurnRequest, info: ModelInfo, emit: EventSink,
                cancel: CancelToken | None) -> Finished:
        convs = self.conversations
        messages = convs.chat_messages(cid)  # unchanged from turn to turn: the server's prefix cache hits
        continued = request.continue_reply
        last = convs.messages(cid)[-1] if continued else None
        body = {"messages": messages, "max_tokens": request.max_new_tokens, **sampling_body(request.params)}
        if continued:  # vLLM and SGLang continue the last message so; llama.cpp's server does on its own
            body.update(continue_final_message=True, add_generation_prompt=False)
        writer = ReplyWriter(convs, cid, info, last.seq if last is not None else None)

        def on_piece(text: str, thinking: str) -> None:
            if thinking:
                emit(Token(cid, thinking, kind=str(PieceKind.REASONING)))
            if text:
                emit(Token(cid, text))
            writer.add(text, thinking)

        try:
            state, timings = self._stream("/v1/chat/completions", body, cancel, on_piece)
        except RemoteError as exc:
            kept = writer.close(StopReason.INTERRUPTED)
            if kept:
                raise RemoteStoppedError(f"{exc}; the {kept:,} characters that arrived are kept, and Continue "
                                         "writes on from there") from None
            raise
        stop = _stop_of(state, cancel)
        writer.close(stop)
        before = last.content if last is not None else ""
        prompt = state.prompt_tokens()
        done = state.completion_tokens() or 0
        finished = Finished(cid, before + state.reply, (), stop, writer.seq, prompt, prompt + done,
                            info.context_length, timings, info, continued=continued,
                            server_cached_tokens=state.cached_tokens(), reasoning="".join(state.reasoning))
        emit(finished)
        return finished

    def count_tokens(self, text: str) -> int:
        """An estimate (OpenAI's API has no tokenize endpoint): ~4 UTF-8 bytes a token, as English text runs."""
        self._require_model()
        return -(-len(text.encode("utf-8", errors="surrogatepass")) // 4)

    def complete(self, messages: list[dict], params: SamplingParams | None = None,
                 max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS, on_text: Callable[[str], None] | None = None,
                 cancel: CancelToken | None = None, *, top_logprobs: int | None = None,
                 stop: Sequence[str] = (), presence_penalty: float = 0.0, frequency_penalty: float = 0.0,
                 response_format: ResponseFormat | None = None) -> Completion:
        _refuse_unsupported(top_logprobs, response_format)
        body = {"messages": messages, "max_tokens": max_new_tokens, "stop": list(stop) or None,
                "presence_penalty": presence_penalty or None, "frequency_penalty": frequency_penalty or None,
                **sampling_body(params)}
        return self._completion("/v1/chat/completions", body, on_text, cancel)

    def complete_raw(self, prompt: str, params: SamplingParams | None = None,
                     max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS, on_text: Callable[[str], None] | None = None,
                     cancel: CancelToken | None = None, *, top_logprobs: int | None = None,
                     stop: Sequence[str] = (), presence_penalty: float = 0.0, frequency_penalty: float = 0.0,
                     response_format: ResponseFormat | None = None) -> Completion:
        if not prompt:
            raise PromptError("the prompt is empty: write something to continue")
        _refuse_unsupported(top_logprobs, response_format)
        body = {"prompt": prompt, "max_tokens": max_new_tokens, "stop": list(stop) or None,
                "presence_penalty": presence_penalty or None, "frequency_penalty": frequency_penalty or None,
                **sampling_body(params)}
        return self._completion("/v1/completions", body, on_text, cancel)

    def forget(self, conversation: str) -> None:
        """Nothing of a conversation is kept on the server by Hearth: nothing to drop."""

    def close(self) -> SaveResult | None:
        if self._conversations is not None and self._own_store:
            self._conversations.close()
            self._conversations = None
        self._client.close()
        return None

    # HTTP ---------------------------------------------------------------------------------------------
    def _require_model(self) -> ModelInfo:
        if self._info is None:
            raise ModelNotLoadedError("the model is not loaded yet")
        return self._info

    def _completion(self, path: str, body: dict, on_text: Callable[[str], None] | None,
                    cancel: CancelToken | None) -> Completion:
        info = self._require_model()

        def shown(text: str, _thinking: str) -> None:
            if text and on_text is not None:
                on_text(text)

        state, timings = self._stream(path, body, cancel, shown)
        return Completion((), (), state.reply, _stop_of(state, cancel), timings, info)

    def _stream(self, path: str, body: dict, cancel: CancelToken | None,
                on_piece: Callable[[str, str], None]) -> tuple[wire.StreamState, Timings]:
        """Stream one request; (what it said, timings measured here). A Stop shuts the connection, which
        stops the server at its next token."""
        info = self._require_model()
        body = {k: v for k, v in body.items() if v is not None}
        body.update(model=info.name, stream=True, stream_options={"include_usage": True})
        state = wire.StreamState()
        started, first = time.perf_counter(), None
        with self._client.stream(path, body, cancel) as chunks:
            for chunk in chunks:
                text, thinking = wire.feed(state, chunk, self.server.name)
                if (text or thinking) and first is None:
                    first = time.perf_counter()
                if text or thinking:
                    on_piece(text, thinking)
        if state.stop is None and not (cancel is not None and cancel.cancelled):
            raise RemoteStoppedError(f"server {self.server.name} stopped mid-reply: the stream ended without "
                                     "saying why")
        ended = time.perf_counter()
        ttft = ((first or ended) - started) * 1000
        decode_ms = (ended - (first or ended)) * 1000
        done = state.completion_tokens() or len(state.text)
        timings = Timings(ttft_ms=ttft, decode_ms=decode_ms, prefill_tokens=state.prompt_tokens(),
                          decode_tokens_per_s=done / (decode_ms / 1000) if decode_ms > 0 else 0.0)
        return state, timings

    @contextmanager
    def _turn_lock(self, cid: str, emit: EventSink, cancel: CancelToken | None) -> Iterator[None]:
        """The conversation's turn lock, as the local backend takes it: the text store is shared with every
        other Hearth process on this data dir."""
        from engine.turn_lock import DEFAULT_TURN_WAIT_S, TurnLock

        def give_up() -> HearthError | None:
            if cancel is not None and cancel.cancelled:
                return TurnCancelledError(f"stopped while conversation {cid} was busy; nothing was stored")
            return None

        with TurnLock(self.paths.turn_locks, cid, DEFAULT_TURN_WAIT_S).held(lambda: emit(Waiting(cid)), give_up):
            yield


class ReplyWriter:
    """The streaming reply into the store: the first piece makes the message (or, for a Continue, writes on
    the last one), later pieces are appended every FLUSH_S, and ``close`` writes the rest with why it ended."""

    def __init__(self, convs: ConversationStore, cid: str, info: ModelInfo, seq: int | None):
        self.convs, self.cid, self.seq = convs, cid, seq
        self.label, self.key = info.label.strip(), info.key
        self.continued = seq is not None
        self._text: list[str] = []
        self._thinking: list[str] = []
        self._flushed = time.monotonic()
        self.written = 0  # characters of text stored

    def add(self, text: str, thinking: str) -> None:
        if text:
            self._text.append(text)
        if thinking:
            self._thinking.append(thinking)
        if self.seq is None and self._text or time.monotonic() - self._flushed >= FLUSH_S:
            self._flush(None)

    def close(self, stop: StopReason) -> int:
        """Store what is left, with ``stop``; the characters of reply stored this turn."""
        if not self.written and not self._text and not self._thinking and stop in (StopReason.CANCELLED,
                                                                                  StopReason.INTERRUPTED):
            return 0  # stopped or broken before a word: nothing to keep (a regenerate gets its last reply back,
            # a Continue's reply keeps why it ended before)
        self._flush(str(stop))
        return self.written

    def _flush(self, finish: str | None) -> None:
        text, thinking = "".join(self._text), "".join(self._thinking)
        self._text, self._thinking = [], []
        self._flushed = time.monotonic()
        if self.seq is None:
            self.seq = self.convs.append(self.cid, "assistant", text, finish, self.label, reasoning=thinking).seq
        elif text or thinking or finish is not None:
            self.convs.extend_reply(self.cid, self.seq, text, finish, self.label, reasoning=thinking)
        self.written += len(text)
        if text or self.written and finish is not None:
            self.convs.set_model(self.cid, self.label, self.key)


def _stop_of(state: wire.StreamState, cancel: CancelToken | None) -> StopReason:
    if cancel is not None and cancel.cancelled:
        return StopReason.INTERRUPTED if cancel.interrupted else StopReason.CANCELLED
    return state.stop or StopReason.EOS


def _refuse_unsupported(top_logprobs: int | None, response_format: ResponseFormat | None) -> None:
    if top_logprobs is not None or response_format is not None:
        raise PromptError("this backend reports no logprobs and constrains no output (see its capabilities)")


def _model_id(server: RemoteServer, model: str | None) -> str | None:
    """The server's id for ``model``: ``lab/llama`` → ``llama`` for server lab; a bare id as it is."""
    if model is None:
        return None
    split = split_model_key(model)
    if split is not None and split[0] == server.name:
        return split[1]
    return model


# building one from a model key, and every server's models ---------------------------------------------
def open_remote(paths: HearthPaths, key: str, *, conversations: ConversationStore | None = None,
                timeout_s: float = DEFAULT_READ_TIMEOUT_S) -> RemoteBackend | None:
    """The backend for ``NAME/MODEL`` when NAME is an added server, else None (a library model, a path).
    Not loaded: ``load()`` reaches the server."""
    registry = RemoteRegistry(paths.data)
    found = registry.find(key)
    if found is None:
        return None
    server, model = found
    return RemoteBackend(paths, server, registry.api_key(server.name), model=model, conversations=conversations,
                         timeout_s=timeout_s)


def remote_models(paths: HearthPaths, timeout_s: float = LIST_TIMEOUT_S,
                  ) -> list[tuple[RemoteServer, list[LibraryModel] | str]]:
    """Every added server's models, or in plain words why it could not list them; asked in parallel, so one
    dead server costs ``timeout_s`` once, not once per server."""
    registry = RemoteRegistry(paths.data)
    servers = registry.servers()
    if not servers:
        return []

    def ask(server: RemoteServer) -> list[LibraryModel] | str:
        client = RemoteBackend(paths, server, registry.api_key(server.name), timeout_s=timeout_s)
        try:
            return client.list_models()
        except HearthError as exc:
            return str(exc)
        finally:
            client.close()

    with ThreadPoolExecutor(max_workers=min(8, len(servers)), thread_name_prefix="remote-models") as pool:
        return list(zip(servers, pool.map(ask, servers), strict=True))
