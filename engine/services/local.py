"""What the local services need of the local backend (``engine.api.Hearth`` has it all): its stores, the
live context of the loaded model, and how to forget a conversation. A protocol, so a service names the
little it uses instead of reaching into the class."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Protocol

from engine.types import ModelInfo

if TYPE_CHECKING:
    from engine.checkpoint.store import CheckpointStore
    from engine.conversations import ConversationStore
    from engine.paths import HearthPaths
    from engine.session import ChatSessions


class LocalBackend(Protocol):
    paths: HearthPaths
    model_path: str | None  # the model named to load (None: the library's default)
    weights: str  # the precision it loads with

    @property
    def checkpoints(self) -> CheckpointStore: ...

    @property
    def conversations(self) -> ConversationStore: ...

    @property
    def sessions(self) -> ChatSessions | None:
        """The loaded model's live context; None without a model."""
        ...

    @property
    def model(self) -> ModelInfo | None: ...

    @property
    def chosen_tokens(self) -> Mapping[str, int]:
        """Chat → its token count since a version of its last reply was chosen (the sidebar's figure)."""
        ...

    def forget(self, conversation: str) -> None: ...
