"""The conversation events the window reacts to, and the one dispatcher that hands each to its handlers.

The engine worker sends every conversation event on one signal (``EngineWorker.event``) as the engine's
own typed object (``engine.types``: ``Accepted``, ``Resumed``, ``Token``, ``Finished`` …), or, where the
engine's event carries no conversation (an error) or the worker knows more than the engine said (an
opening's rebuild), as one of the small records below. ``TurnControl`` takes each on the UI thread, keeps
its turn bookkeeping, and dispatches by type once: the handlers registered for that type (the chat pane's,
the window's, the badges') run in the order they were registered. No event is re-signalled on the way.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from engine.errors import HearthError
from engine.types import Resume


# what the worker adds to the engine's events ------------------------------------------------------------
@dataclass(frozen=True)
class Rebuilding:
    """Opening the chat found its saved context unusable: it is being rebuilt (a turn's rebuild is not this)."""

    conversation: str
    resume: Resume


@dataclass(frozen=True)
class TurnFailed:
    """The turn failed; before ``Accepted`` its message was not stored."""

    conversation: str
    error: HearthError


@dataclass(frozen=True)
class OpenFailed:
    """Opening or forgetting the chat failed."""

    conversation: str
    error: HearthError


# what a turn means for the window (``TurnControl`` makes these from the worker's events) ------------------
@dataclass(frozen=True)
class TurnStarted:
    """A turn was requested: show the pending message and an empty reply."""

    conversation: str


@dataclass(frozen=True)
class PrefillProgress:
    """A long prefill's progress, with the time it has left, estimated from its pace so far."""

    conversation: str
    done: int
    total: int
    left_ms: float


@dataclass(frozen=True)
class LiveUpdate:
    """The reply's figures while it is written (``turns.LiveFigures``), a few times a second at most."""

    conversation: str
    figures: object


@dataclass(frozen=True)
class ReplyFailed:
    """The turn failed after its message was stored (or with nothing to store): why, in words."""

    conversation: str
    message: str


@dataclass(frozen=True)
class MessageRefused:
    """The engine did not store the message: it goes back to the composer, with its attachments."""

    conversation: str
    text: str
    message: str
    attachments: tuple = ()  # engine.api.Attachment: the files it carried


Handler = Callable[[object], object]


class EventDispatcher:
    """Event type → its handlers, in the order they were registered; a handler registered for a base
    class gets its subclasses too."""

    def __init__(self) -> None:
        self._handlers: dict[type, list[Handler]] = {}

    def on(self, kind: type, handler: Handler) -> None:
        self._handlers.setdefault(kind, []).append(handler)

    def on_each(self, handlers: dict[type, Handler]) -> None:
        for kind, handler in handlers.items():
            self.on(kind, handler)

    def dispatch(self, event: object) -> None:
        for kind in type(event).__mro__:
            for handler in tuple(self._handlers.get(kind, ())):
                handler(event)
