"""A second backend (docs/architecture.md, "Backends"): turns run on an OpenAI-compatible server over HTTP — in the tests,
Hearth's own server on 127.0.0.1 (tests/server_helpers.py) — while the conversation text stays here, in
this data dir's SQLite store, as the truth it is for every backend.

It implements ``engine.backends.Backend`` and says in ``capabilities`` what it lacks: no saved context
on disk (so no ``Resumed``/``Rebuilt`` events, no saved-context services, no bundles' contexts), no kernel
facts, no constrained output or logprobs through it. Its records carry ``local=None``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

import httpx

from engine.api import DEFAULT_MAX_NEW_TOKENS, HearthPaths, check_id, compose_message, open_conversations
from engine.errors import HearthError, ModelNotLoadedError, PromptError, TurnCancelledError
from engine.types import (
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

FINISH = {"stop": StopReason.EOS, "length": StopReason.LENGTH}


def _noop(_event: object) -> None:
    pass


def _sampling(params: SamplingParams | None) -> dict:
    """OpenAI's knobs for ``params`` (greedy is temperature 0; Hearth's server reads it so)."""
    params = params or SamplingParams()
    body: dict = {"temperature": 0.0} if params.greedy else {"temperature": params.temperature, "top_p": params.top_p}
    if params.seed is not None:
        body["seed"] = params.seed
    return body


class RemoteBackend:
    """A backend over an OpenAI-compatible server. Used from one thread, as every backend is."""

    capabilities = Capabilities(saved_context=False, constrained_output=False, tools=False, raw_completion=True,
                                logprobs=False, model_switching=False, serving=False, local_facts=False)

    def __init__(self, paths: HearthPaths, base_url: str, *, api_key: str = "none", model: str | None = None,
                 timeout_s: float = 120.0):
        self.paths = paths.ensure()
        self.base_url = base_url.rstrip("/")
        self.model_name = model  # None: the first model the server lists
        self._http = httpx.Client(base_url=self.base_url, timeout=timeout_s,
                                  headers={"Authorization": f"Bearer {api_key}"})
        self._info: ModelInfo | None = None
        self._conversations = None

    # models --------------------------------------------------------------------------------------------
    @property
    def model(self) -> ModelInfo | None:
        return self._info

    @property
    def model_key(self) -> str:
        return self._info.key if self._info is not None else (self.model_name or "")

    def list_models(self) -> list[LibraryModel]:
        listed = self._get("/v1/models")["data"]
        return [LibraryModel(m["id"], m["id"], ModelOrigin.CATALOG, None, ModelStatus.READY) for m in listed]

    def load(self, progress: Callable[[SetupProgress], None] | None = None,
             cancel: CancelToken | Callable[[], bool] | None = None, *, force: bool = False) -> ModelInfo:
        """Reach the server and take its model: nothing to convert or load here."""
        names = [m.name for m in self.list_models()]
        name = self.model_name or (names[0] if names else None)
        if name is None or name not in names:
            raise HearthError(f"the server at {self.base_url} has no model {name or ''} ready (it lists {names})")
        # what an OpenAI-compatible server tells of a model: its name; no provider, precision or context length
        self._info = ModelInfo(name, "remote", "", 0, f"served by {self.base_url}", kind="chat", key=name)
        return self._info

    def switch_model(self, model: str | None, weights: str | None = None,
                     progress: Callable[[SetupProgress], None] | None = None, *, force: bool = False,
                     cancel: CancelToken | Callable[[], bool] | None = None) -> ModelInfo:
        if self._info is not None and model in (None, self._info.key):
            return self._info
        raise HearthError("this backend runs the server's model; it cannot switch models")

    def unload(self) -> None:
        self._info = None

    # conversations and turns --------------------------------------------------------------------------
    @property
    def conversations(self):
        """The conversation text, kept here whatever runs the model."""
        if self._conversations is None:
            self._conversations = open_conversations(self.paths, backup=True)
        return self._conversations

    def open_conversation(self, conversation: str, on_event: EventSink | None = None,
                          cancel: CancelToken | None = None, *, max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
                          context_policy: str | None = None) -> Resume | None:
        self._require_model()
        return None  # no context is kept anywhere: each turn sends the whole conversation

    def run_turn(self, request: TurnRequest, on_event: EventSink | None = None,
                 cancel: CancelToken | None = None, *, create: bool = False) -> Finished:
        """The turn rule over HTTP: the message is stored first, the reply (a stopped one too) before Finished."""
        emit = on_event or _noop
        cid = check_id(request.conversation)
        request.params.validate()
        if request.attachments and request.user_message is None:
            raise PromptError("attached files go with a new message: this turn has none")
        if request.user_message is not None and not request.user_message.strip() and not request.attachments:
            raise PromptError("the message is empty: write something to say")
        content = None if request.user_message is None else compose_message(request.user_message, request.attachments)
        if request.regenerate or request.continue_reply:
            raise PromptError("this backend neither regenerates nor continues a reply")
        with self._turn_lock(cid, emit, cancel):
            convs = self.conversations
            if create:
                convs.ensure(cid)
            if request.system_prompt is not None:
                convs.set_system_prompt(cid, request.system_prompt)
            user_seq = None
            if content is not None:  # the files' text, then the words, as the local backend stores them
                user_seq = convs.append(cid, "user", content, attachments=tuple(request.attachments),
                                        typed_text=request.user_message).seq
            emit(Accepted(cid, user_seq, tuple(convs.messages(cid))))
            info = self._require_model()  # after storing, as the local backend: nothing typed is lost
            body = {"messages": convs.chat_messages(cid), "max_tokens": request.max_new_tokens,
                    **_sampling(request.params)}
            text, stop, usage, timings = self._stream("/v1/chat/completions", body, cancel,
                                                      lambda piece: emit(Token(cid, piece)))
            reply_seq = None
            if text or stop != StopReason.CANCELLED:  # a stopped reply keeps what was written
                reply_seq = convs.append(cid, "assistant", text, str(stop), info.label).seq
                convs.set_model(cid, info.label, info.key)
        prompt = usage.get("prompt_tokens", 0)
        finished = Finished(cid, text, (), stop, reply_seq, prompt, prompt + usage.get("completion_tokens", 0),
                            info.context_length, timings, info)
        emit(finished)
        return finished

    def count_tokens(self, text: str) -> int:
        """An estimate (the server has no tokenize endpoint): ~4 UTF-8 bytes a token, as English text runs."""
        self._require_model()
        return -(-len(text.encode("utf-8", errors="surrogatepass")) // 4)

    def complete(self, messages: list[dict], params: SamplingParams | None = None,
                 max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS, on_text: Callable[[str], None] | None = None,
                 cancel: CancelToken | None = None, *, top_logprobs: int | None = None,
                 stop: Sequence[str] = (), presence_penalty: float = 0.0, frequency_penalty: float = 0.0,
                 response_format: ResponseFormat | None = None) -> Completion:
        self._refuse_unsupported(top_logprobs, response_format)
        body = {"messages": messages, "max_tokens": max_new_tokens, "stop": list(stop) or None,
                "presence_penalty": presence_penalty, "frequency_penalty": frequency_penalty, **_sampling(params)}
        return self._completion("/v1/chat/completions", body, on_text, cancel)

    def complete_raw(self, prompt: str, params: SamplingParams | None = None,
                     max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS, on_text: Callable[[str], None] | None = None,
                     cancel: CancelToken | None = None, *, top_logprobs: int | None = None,
                     stop: Sequence[str] = (), presence_penalty: float = 0.0, frequency_penalty: float = 0.0,
                     response_format: ResponseFormat | None = None) -> Completion:
        if not prompt:
            raise PromptError("the prompt is empty: write something to continue")
        self._refuse_unsupported(top_logprobs, response_format)
        body = {"prompt": prompt, "max_tokens": max_new_tokens, "stop": list(stop) or None,
                "presence_penalty": presence_penalty, "frequency_penalty": frequency_penalty, **_sampling(params)}
        return self._completion("/v1/completions", body, on_text, cancel)

    def forget(self, conversation: str) -> None:
        """Nothing of a conversation is kept on the server: nothing to drop."""

    def close(self) -> SaveResult | None:
        if self._conversations is not None:
            self._conversations.close()
            self._conversations = None
        self._http.close()
        return None

    # HTTP ---------------------------------------------------------------------------------------------
    def _require_model(self) -> ModelInfo:
        if self._info is None:
            raise ModelNotLoadedError("the model is not loaded yet")
        return self._info

    @staticmethod
    def _refuse_unsupported(top_logprobs: int | None, response_format: ResponseFormat | None) -> None:
        if top_logprobs is not None or response_format is not None:
            raise PromptError("this backend reports no logprobs and constrains no output (see its capabilities)")

    def _completion(self, path: str, body: dict, on_text: Callable[[str], None] | None,
                    cancel: CancelToken | None) -> Completion:
        info = self._require_model()
        text, stop, _usage, timings = self._stream(path, body, cancel, on_text or (lambda _piece: None))
        return Completion((), (), text, stop, timings, info)

    def _get(self, path: str) -> dict:
        try:
            response = self._http.get(path)
        except httpx.HTTPError as exc:
            raise HearthError(f"the server at {self.base_url} cannot be reached: {exc}") from None
        if response.status_code != 200:
            raise HearthError(f"the server said {response.status_code}: {response.text[:200]}")
        return response.json()

    def _stream(self, path: str, body: dict, cancel: CancelToken | None,
                on_text: Callable[[str], None]) -> tuple[str, StopReason, dict, Timings]:
        """Stream one request; returns (text, why it ended, usage, timings measured here). A cancel closes the
        connection, which stops the server at its next token."""
        info = self._require_model()
        body = {k: v for k, v in body.items() if v is not None}
        body.update(model=info.key, stream=True, stream_options={"include_usage": True})
        pieces: list[str] = []
        stop, usage = StopReason.CANCELLED, {}
        started, first = time.perf_counter(), None
        try:
            with self._http.stream("POST", path, json=body) as response:
                if response.status_code != 200:
                    response.read()
                    raise _error(response)
                for chunk in _events(response):
                    if "error" in chunk:
                        raise HearthError(chunk["error"].get("message", "the server failed mid-reply"))
                    usage = chunk.get("usage") or usage
                    for choice in chunk.get("choices", ()):
                        piece = choice.get("delta", {}).get("content") if "delta" in choice else choice.get("text")
                        if piece:
                            first = first or time.perf_counter()
                            pieces.append(piece)
                            on_text(piece)
                        if choice.get("finish_reason"):  # OpenAI's "stop" covers an end of turn and a stop string
                            stop = FINISH.get(choice["finish_reason"], StopReason.EOS)
                    if cancel is not None and cancel.cancelled:
                        stop = StopReason.CANCELLED
                        break
        except httpx.HTTPError as exc:
            raise HearthError(f"the server at {self.base_url} failed: {exc}") from None
        ended = time.perf_counter()
        ttft = ((first or ended) - started) * 1000
        decode_ms = (ended - (first or ended)) * 1000
        done = usage.get("completion_tokens", len(pieces))
        timings = Timings(ttft_ms=ttft, decode_ms=decode_ms,
                          decode_tokens_per_s=done / (decode_ms / 1000) if decode_ms > 0 else 0.0)
        return "".join(pieces), stop, usage, timings

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


def _events(response: httpx.Response) -> Iterator[dict]:
    """The JSON objects of a server-sent event stream, up to ``[DONE]``."""
    for line in response.iter_lines():
        if not line.startswith("data: "):
            continue
        data = line[len("data: "):]
        if data == "[DONE]":
            return
        yield json.loads(data)


def _error(response: httpx.Response) -> HearthError:
    try:
        message = response.json()["error"]["message"]
    except (ValueError, KeyError, TypeError):
        message = response.text[:200]
    kind = PromptError if response.status_code == 400 else HearthError
    return kind(f"the server refused the request ({response.status_code}): {message}")
