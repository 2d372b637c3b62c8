"""Turn control on the UI thread: which chats have a turn in flight, their cancel tokens, the message not
yet stored and the reply so far, driven by the engine worker's signals.

The turn rule is the API's (``Hearth.run_turn``): the engine stores the user's message under the
conversation's turn lock before any model work, stores the reply, then saves the context. So this
class never writes a message: it sends a ``TurnRequest`` and reports what the engine did, as signals
the window turns into widgets. Until ``accepted`` the message is only shown (pending); a turn that
fails before it was never stored (``refused``: the text goes back to the composer).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from PySide6.QtCore import QObject, Signal

from app.engine_worker import EngineHost
from app.settings_dialog import turn_settings
from engine.api import ConversationStore
from engine.errors import ContextFullError, HearthError
from engine.types import Accepted, CancelToken, Finished, TurnRequest

PROGRESS_MIN_TOKENS = 128  # shorter prefills finish before a progress bar would help
LIVE_FIGURES_S = 0.25  # how often the status bar's live speed and context meter change while a reply is written


@dataclass
class Turn:
    conversation: str
    cancel: CancelToken
    message: str | None  # the user's message until the engine stored it; None: answering what is stored
    accepted: bool = False
    waiting: bool = False  # another Hearth process holds the conversation
    reply: str = ""  # streamed so far (a Continue: the reply it writes on, then what it adds)
    prefill_started: float | None = None
    kind: str = "send"  # "send", "answer", "regenerate" or "continue"
    live: LiveFigures | None = None  # the reply's speed so far, once the engine has the turn

    @property
    def pending(self) -> str | None:
        """The message to show as not yet stored, if any."""
        return None if self.accepted else self.message


@dataclass
class LiveFigures:
    """A reply's figures while it is written, measured here as its pieces arrive (the engine's own
    timings replace them when it finishes): time to the first piece from when the engine took the turn,
    pieces per second since then, and the tokens in the context."""

    accepted_at: float
    first_at: float | None = None
    pieces: int = 0
    context_tokens: int = 0
    shown_at: float = 0.0  # when the status bar last showed them

    @property
    def ttft_ms(self) -> float | None:
        return None if self.first_at is None else (self.first_at - self.accepted_at) * 1000

    def tokens_per_s(self, now: float) -> float | None:
        if self.first_at is None or self.pieces < 2 or now <= self.first_at:
            return None
        return (self.pieces - 1) / (now - self.first_at)


@dataclass(frozen=True)
class ContextLimitHit:
    """A turn refused because the chat no longer fits the model's context (nothing was stored)."""

    conversation: str
    message: str | None  # the message that was not stored (given back to be sent again); None: an answer
    error: ContextFullError


class TurnControl(QObject):
    started = Signal(str)  # a turn was requested: show the pending message and an empty reply
    waiting = Signal(str)  # another process is answering in this chat first
    accepted = Signal(str, object)  # Accepted: the message is stored; what is stored now
    progress = Signal(str, int, int, float)  # prefill done, total, estimated ms left (long prefills only)
    token = Signal(str, str)
    finished = Signal(str, object)  # Finished: the reply is stored
    failed = Signal(str, str)  # the turn failed after its message was stored (or with nothing to store)
    refused = Signal(str, str, str)  # conversation, the message that was NOT stored, why
    context_full = Signal(str, object)  # ContextLimitHit: instead of refused/failed, when the chat is too long
    live = Signal(str, object)  # LiveFigures while the reply is written (a few times a second at most)

    def __init__(self, host: EngineHost, store: ConversationStore, parent: QObject | None = None,
                 effective: Callable[[str, Mapping], dict] | None = None):
        """``effective(conversation, its own settings)``: the settings its turns use (Preferences and its
        model's values under the chat's own); None: the chat's own over the built-in defaults."""
        super().__init__(parent)
        self.host, self.store = host, store
        self.effective = effective or (lambda _conversation, own: dict(own))
        self._turns: dict[str, Turn] = {}
        self._opening: dict[str, list[CancelToken]] = {}  # rebuilds on opening a chat, also stopped by Stop
        w = host.worker
        w.waiting.connect(self._on_waiting)
        w.accepted.connect(self._on_accepted)
        w.prefill_progress.connect(self._on_progress)
        w.token.connect(self._on_token)
        w.turn_finished.connect(self._on_finished)
        w.turn_failed.connect(self._on_failed)
        w.context_in_use.connect(self._on_context_in_use)

    # state ----------------------------------------------------------------------------------------------
    def turn(self, conversation: str | None) -> Turn | None:
        return self._turns.get(conversation) if conversation else None

    def running(self, conversation: str | None = None) -> bool:
        """A turn is in flight in ``conversation`` (in any chat when None)."""
        return bool(self._turns) if conversation is None else conversation in self._turns

    # requests -------------------------------------------------------------------------------------------
    def send(self, conversation: str, message: str) -> None:
        """Ask the engine to store ``message`` and answer it."""
        self._request(conversation, message)

    def answer(self, conversation: str) -> None:
        """Ask the engine to answer what is stored (after an edit, or to regenerate the last reply)."""
        self._request(conversation, None)

    def regenerate(self, conversation: str) -> None:
        """Write the last reply again; the engine keeps the one it replaces as an earlier version."""
        self._request(conversation, None, "regenerate")

    def continue_reply(self, conversation: str, text_so_far: str) -> None:
        """Write on at the end of the last reply (``text_so_far``), in the same message."""
        self._request(conversation, None, "continue", text_so_far)

    def _request(self, conversation: str, message: str | None, kind: str = "", reply: str = "") -> None:
        if conversation in self._turns:
            return  # one reply at a time per chat
        try:
            own = self.store.require(conversation).settings
            effective = self.effective(conversation, own)
            params, max_new_tokens = turn_settings(effective)
        except HearthError as exc:
            if message is None:
                self.failed.emit(conversation, str(exc))
            else:
                self.refused.emit(conversation, message, str(exc))
            return
        kind = kind or ("send" if message is not None else "answer")
        turn = self._turns[conversation] = Turn(conversation, CancelToken(), message, reply=reply, kind=kind)
        self.started.emit(conversation)
        request = TurnRequest(conversation, message, params, max_new_tokens,
                              context_policy=effective.get("context_policy"),  # the chat's own, else the default
                              regenerate=kind == "regenerate", continue_reply=kind == "continue")
        self.host.request_turn.emit(request, turn.cancel)

    def open(self, conversation: str) -> None:
        """Make the chat live in the engine (restore its saved context; rebuild it if unusable)."""
        token = CancelToken()
        self._opening.setdefault(conversation, []).append(token)
        self.host.request_open.emit(conversation, token)

    def stop(self, conversation: str | None) -> None:
        """Stop the chat's reply, its prefill or its rebuild; a stopped reply keeps what was written."""
        if conversation in self._turns:
            self._turns[conversation].cancel.cancel()
        for token in self._opening.pop(conversation, []):
            token.cancel()

    def stop_all(self) -> None:
        for conversation in list(self._turns) + list(self._opening):
            self.stop(conversation)

    def interrupt_all(self) -> None:
        """Hearth is closing: stop every turn and rebuild; a reply cut off is stored as interrupted (its
        caption says so and Continue is offered), not as one the person stopped."""
        for turn in self._turns.values():
            turn.cancel.interrupt()
        self.stop_all()

    def forget(self, conversation: str) -> None:
        """The chat is being deleted: stop its work and report nothing more about it."""
        self.stop(conversation)
        self._turns.pop(conversation, None)

    # the worker's events ----------------------------------------------------------------------------------
    def _on_waiting(self, conversation: str) -> None:
        if (turn := self._turns.get(conversation)) is not None:
            turn.waiting = True
            self.waiting.emit(conversation)

    def _on_accepted(self, conversation: str, accepted: Accepted) -> None:
        if (turn := self._turns.get(conversation)) is not None:
            turn.accepted, turn.waiting = True, False
            turn.live = LiveFigures(time.monotonic())
            self.accepted.emit(conversation, accepted)

    def _on_progress(self, conversation: str, done: int, total: int) -> None:
        turn = self._turns.get(conversation)
        if turn is None or total < PROGRESS_MIN_TOKENS:
            return
        if turn.prefill_started is None:
            turn.prefill_started = time.monotonic()
        left_ms = (time.monotonic() - turn.prefill_started) / max(done, 1) * (total - done) * 1000
        self.progress.emit(conversation, done, total, left_ms)

    def _on_token(self, conversation: str, piece: str) -> None:
        if (turn := self._turns.get(conversation)) is not None:
            turn.reply += piece
            self.token.emit(conversation, piece)
            self._count_piece(turn)

    def _count_piece(self, turn: Turn) -> None:
        live = turn.live
        if live is None:
            return
        now = time.monotonic()
        live.pieces += 1
        if live.first_at is None:
            live.first_at = now
        if live.pieces == 1 or now - live.shown_at >= LIVE_FIGURES_S:  # a label update per piece is waste
            live.shown_at = now
            self.live.emit(turn.conversation, live)

    def _on_context_in_use(self, conversation: str, tokens: int) -> None:
        if (turn := self._turns.get(conversation)) is not None and turn.live is not None:
            turn.live.context_tokens = tokens

    def _on_finished(self, conversation: str, finished: Finished) -> None:
        if self._turns.pop(conversation, None) is not None:
            self.finished.emit(conversation, finished)

    def _on_failed(self, conversation: str, error: HearthError) -> None:
        turn = self._turns.pop(conversation, None)
        if turn is None:
            return
        if isinstance(error, ContextFullError):  # refused before anything was stored, either way
            self.context_full.emit(conversation, ContextLimitHit(conversation, turn.message, error))
        elif turn.accepted or turn.message is None:
            self.failed.emit(conversation, str(error))
        else:  # refused before it was stored: nothing typed may be lost
            self.refused.emit(conversation, turn.message, str(error))
