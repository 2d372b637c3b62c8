"""The backend protocol: what any front end (the window's worker, the CLI, the terminal chat) needs from any
engine, local or remote.

A backend lists, loads and switches models; opens a conversation (making its context ready, where it keeps
one); runs a turn as a stream of typed events (``engine.types``: [Waiting], Accepted, Progress*, [Resumed],
Token*, Finished — to an ``EventSink``, Finished also returned); completes text stored nowhere; forgets a
conversation; and closes. Cancelling is the ``CancelToken`` a call takes: set it from any thread and the
call ends soon after, with what was written so far (a turn's ``StopReason.CANCELLED``).

What only a local engine knows (where a turn's context came from, how its save went, which kernels run)
travels in the records' optional ``local`` part (``Finished.local``, ``ModelInfo.local``): a remote backend
leaves it None and front ends show what they can without it. ``capabilities`` says what a backend can do
beyond the core, so a front end hides what it cannot (the browser's saved contexts, raw completions…).

Saved-context administration and bundles are not part of the protocol: they are services over a local
backend's checkpoint store (``engine.api.saved_contexts``, ``engine.api.bundles``), offered where
``capabilities.saved_context`` is true.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from engine.types import (
    DEFAULT_MAX_NEW_TOKENS,
    CancelToken,
    Capabilities,
    Completion,
    EventSink,
    Finished,
    LibraryModel,
    ModelInfo,
    ResponseFormat,
    Resume,
    SamplingParams,
    SaveResult,
    SetupProgress,
    TurnRequest,
)

if TYPE_CHECKING:
    from engine.conversations import ConversationStore


@runtime_checkable
class Backend(Protocol):
    """One engine a front end drives from one thread (a ``CancelToken`` may be set from any)."""

    @property
    def capabilities(self) -> Capabilities:
        """What this backend can do beyond the core (constant for its life)."""
        ...

    # models --------------------------------------------------------------------------------------------
    @property
    def model(self) -> ModelInfo | None:
        """The loaded model, or None."""
        ...

    @property
    def model_key(self) -> str:
        """The model this backend runs, as a conversation remembers it (a library name, a path, a remote id)."""
        ...

    def list_models(self) -> list[LibraryModel]:
        """The models this backend can load (``LibraryModel.name`` is what ``switch_model`` takes)."""
        ...

    def load(self, progress: Callable[[SetupProgress], None] | None = None,
             cancel: CancelToken | Callable[[], bool] | None = None, *, force: bool = False) -> ModelInfo:
        """Make the model ready (the local engine: convert and load it; a remote one: reach it)."""
        ...

    def switch_model(self, model: str | None, weights: str | None = None,
                     progress: Callable[[SetupProgress], None] | None = None, *, force: bool = False,
                     cancel: CancelToken | Callable[[], bool] | None = None) -> ModelInfo:
        """Run another model (None: the default) from now on; one that fails leaves the previous model."""
        ...

    def unload(self) -> None:
        """Free what the model holds; ``load`` brings it back."""
        ...

    def count_tokens(self, text: str) -> int:
        """How many tokens ``text`` is to the model (an attached file's, a whole message's, before sending);
        exact where the backend has the tokenizer, else its best estimate. ModelNotLoadedError without a model."""
        ...

    # conversations and turns ----------------------------------------------------------------------------
    @property
    def conversations(self) -> ConversationStore:
        """The conversation text its turns store into: this data dir's SQLite store, the truth for every
        backend (a remote one keeps the text here too and sends it with each turn)."""
        ...

    def open_conversation(self, conversation: str, on_event: EventSink | None = None,
                          cancel: CancelToken | None = None, *, max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
                          context_policy: str | None = None) -> Resume | None:
        """The chat is about to be used: make its context ready where the backend keeps one (events:
        Resumed, Progress, Rebuilt). None: nothing was resumed (always, for a backend without saved context)."""
        ...

    def run_turn(self, request: TurnRequest, on_event: EventSink | None = None,
                 cancel: CancelToken | None = None, *, create: bool = False) -> Finished:
        """One turn of a stored conversation by the turn rule (engine/api.py): the message is stored before
        any model work, the reply (a stopped one too) before anything else; events in order to ``on_event``."""
        ...

    def complete(self, messages: list[dict], params: SamplingParams | None = None,
                 max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS, on_text: Callable[[str], None] | None = None,
                 cancel: CancelToken | None = None, *, top_logprobs: int | None = None,
                 stop: Sequence[str] = (), presence_penalty: float = 0.0, frequency_penalty: float = 0.0,
                 response_format: ResponseFormat | None = None) -> Completion:
        """A reply to ``messages`` stored nowhere."""
        ...

    def complete_raw(self, prompt: str, params: SamplingParams | None = None,
                     max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS, on_text: Callable[[str], None] | None = None,
                     cancel: CancelToken | None = None, *, top_logprobs: int | None = None,
                     stop: Sequence[str] = (), presence_penalty: float = 0.0, frequency_penalty: float = 0.0,
                     response_format: ResponseFormat | None = None) -> Completion:
        """A continuation of ``prompt`` read as it is (``capabilities.raw_completion``; else a PromptError)."""
        ...

    def forget(self, conversation: str) -> None:
        """The conversation was deleted or cleared: drop whatever the backend holds of it."""
        ...

    def close(self) -> SaveResult | None:
        """Save what is live (where the backend saves) and let go of everything."""
        ...
