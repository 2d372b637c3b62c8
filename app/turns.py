"""Turn control on the UI thread: which chats have a turn in flight, their cancel tokens, the message not
yet stored and the reply so far, driven by the engine worker's one event signal.

The turn rule is the API's (``Hearth.run_turn``): the engine stores the user's message under the
conversation's turn lock before any model work, stores the reply, then saves the context. So this
class never writes a message: it sends a ``TurnRequest`` and reports what the engine did as typed events
(``app.conversation_events``), dispatched once by type to the handlers the pane and the window registered
on ``events``. Until ``Accepted`` the message is only shown (pending); a turn that fails before it was
never stored (``MessageRefused``: the text goes back to the composer).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from PySide6.QtCore import QObject, Slot

from app.conversation_events import (
    EventDispatcher,
    LiveUpdate,
    MessageRefused,
    PrefillProgress,
    ReplyFailed,
    TurnFailed,
    TurnStarted,
)
from app.engine_worker import EngineHost
from app.settings_dialog import turn_settings
from engine.api import Attachment, ConversationStore, compose_message
from engine.errors import ContextFullError, HearthError
from engine.types import (
    Accepted,
    CancelToken,
    Finished,
    Progress,
    ProgressPhase,
    Token,
    ToolChoice,
    TurnRequest,
    Waiting,
)

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
    reasoning: str = ""  # the reply's thinking streamed so far (a template that thinks)
    prefill_started: float | None = None
    kind: str = "send"  # "send", "answer", "regenerate" or "continue"
    live: LiveFigures | None = None  # the reply's speed so far, once the engine has the turn
    attachments: tuple[Attachment, ...] = ()  # the files the message carries (stored with it)
    sent: bool = False  # the request went to the engine (a turn may wait for its chat's tools to be listed first)

    @property
    def pending(self) -> str | None:
        """The message to show as not yet stored, if any: the whole message, as the engine stores it."""
        if self.accepted or self.message is None:
            return None
        return compose_message(self.message, self.attachments) if self.attachments else self.message

    @property
    def pending_files(self) -> tuple[tuple[Attachment, ...], str] | None:
        """(The attachments, the typed text) of the pending message when it carries files."""
        return (self.attachments, self.message or "") if self.attachments and self.pending is not None else None


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
    attachments: tuple[Attachment, ...] = ()  # its files, given back with it


class TurnControl(QObject):
    """Its ``events`` dispatcher gets, in order: ``TurnStarted``; ``Waiting``; ``Accepted``; ``PrefillProgress``
    (long prefills only); ``Token``; ``LiveUpdate``; ``Finished``; ``ReplyFailed`` / ``MessageRefused`` /
    ``ContextLimitHit`` — for the turns it has in flight — and the opening events as the worker sent them
    (``Resumed``, ``Rebuilding``, ``Progress`` of a rebuild, ``Rebuilt``, ``OpenFailed``, ``ChatTokens``)."""

    def __init__(self, host: EngineHost, store: ConversationStore, parent: QObject | None = None,
                 effective: Callable[[str, Mapping], dict] | None = None):
        """``effective(conversation, its own settings)``: the settings its turns use (Preferences and its
        model's values under the chat's own); None: the chat's own over the built-in defaults."""
        super().__init__(parent)
        self.host, self.store = host, store
        self.effective = effective or (lambda _conversation, own: dict(own))
        self._turns: dict[str, Turn] = {}
        self._opening: dict[str, list[CancelToken]] = {}  # rebuilds on opening a chat, also stopped by Stop
        # The tool loop's hooks (app/tool_loop.py; issue 33): the tools a turn offers — None while the chat's
        # servers are being started, then the callback sends it —, whether a tool call runs in a chat, and Stop.
        self.tools_for: Callable[[str, str, Callable[[], None]], tuple | None] = lambda _c, _k, _go: ((), ToolChoice())
        self.tool_busy: Callable[[str | None], bool] = lambda _c: False
        self.tool_stop: Callable[[str | None], None] = lambda _c: None
        self.events = EventDispatcher()
        # A turn's events update the bookkeeping here first, then reach the handlers (the pane draws from it).
        self._bookkeeping = {Waiting: self._on_waiting, Accepted: self._on_accepted, Progress: self._on_progress,
                             Token: self._on_token, Finished: self._on_finished, TurnFailed: self._on_failed}
        host.worker.conversation_event.connect(self._on_event)

    @Slot(object)
    def _on_event(self, event: object) -> None:
        """One event of the worker, on the UI thread: a turn's through the bookkeeping, the rest as it came."""
        keep = self._bookkeeping.get(type(event))
        if keep is not None:
            keep(event)
        else:
            self.events.dispatch(event)

    # state ----------------------------------------------------------------------------------------------
    def turn(self, conversation: str | None) -> Turn | None:
        return self._turns.get(conversation) if conversation else None

    def running(self, conversation: str | None = None) -> bool:
        """A turn is in flight in ``conversation`` (in any chat when None)."""
        if conversation is None:
            return bool(self._turns) or self.tool_busy(None)
        return conversation in self._turns or self.tool_busy(conversation)

    # requests -------------------------------------------------------------------------------------------
    def send(self, conversation: str, message: str, attachments: tuple[Attachment, ...] = ()) -> None:
        """Ask the engine to store ``message`` (with ``attachments``: the files it carries) and answer it."""
        self._request(conversation, message, attachments=tuple(attachments))

    def answer(self, conversation: str) -> None:
        """Ask the engine to answer what is stored (after an edit, or to regenerate the last reply)."""
        self._request(conversation, None)

    def regenerate(self, conversation: str) -> None:
        """Write the last reply again; the engine keeps the one it replaces as an earlier version."""
        self._request(conversation, None, "regenerate")

    def continue_reply(self, conversation: str, text_so_far: str, thought_so_far: str = "") -> None:
        """Write on at the end of the last reply (``text_so_far``, with ``thought_so_far`` its thinking), in the
        same message."""
        self._request(conversation, None, "continue", text_so_far, thought=thought_so_far)

    def _request(self, conversation: str, message: str | None, kind: str = "", reply: str = "",
                 attachments: tuple[Attachment, ...] = (), thought: str = "") -> None:
        if conversation in self._turns:
            return  # one reply at a time per chat
        try:
            own = self.store.require(conversation).settings
            effective = self.effective(conversation, own)
            params, max_new_tokens = turn_settings(effective)
        except HearthError as exc:
            if message is None:
                self.events.dispatch(ReplyFailed(conversation, str(exc)))
            else:
                self.events.dispatch(MessageRefused(conversation, message, str(exc), attachments))
            return
        kind = kind or ("send" if message is not None else "answer")
        turn = self._turns[conversation] = Turn(conversation, CancelToken(), message, reply=reply, kind=kind,
                                                attachments=attachments, reasoning=thought)
        self.events.dispatch(TurnStarted(conversation))

        def go() -> None:
            if self._turns.get(conversation) is not turn or turn.sent:
                return  # stopped while its tools were being listed (``stop`` said so)
            offered = self.tools_for(conversation, kind, go)
            if offered is None:
                return  # the chat's tool servers are starting: ``go`` again once they are listed
            tools, choice = offered
            turn.sent = True
            request = TurnRequest(conversation, message, params, max_new_tokens,
                                  context_policy=effective.get("context_policy"),  # the chat's own, else the default
                                  regenerate=kind == "regenerate", continue_reply=kind == "continue",
                                  attachments=attachments, tools=tuple(tools), tool_choice=choice)
            self.host.request_turn.emit(request, turn.cancel)

        go()

    def open(self, conversation: str) -> None:
        """Make the chat live in the engine (restore its saved context; rebuild it if unusable)."""
        token = CancelToken()
        self._opening.setdefault(conversation, []).append(token)
        self.host.request_open.emit(conversation, token)

    def stop(self, conversation: str | None, tools: bool = True) -> None:
        """Stop the chat's reply, its prefill or its rebuild (and with ``tools``, its tool call); a stopped reply
        keeps what was written."""
        if conversation in self._turns:
            turn = self._turns[conversation]
            turn.cancel.cancel()
            if not turn.sent:  # it waited for the chat's tools: nothing reached the engine, nothing was stored
                self._on_failed(TurnFailed(conversation, HearthError("stopped before it was sent")))
        for token in self._opening.pop(conversation, []):
            token.cancel()
        if tools:
            self.tool_stop(conversation)

    def stop_all(self, tools: bool = True) -> None:
        for conversation in list(self._turns) + list(self._opening):
            self.stop(conversation, tools)

    def interrupt_all(self) -> None:
        """Hearth is closing: stop every turn and rebuild; a reply cut off is stored as interrupted (its
        caption says so and Continue is offered), not as one the person stopped."""
        for turn in self._turns.values():
            turn.cancel.interrupt()
        self.stop_all(tools=False)  # a tool call is cut off by the tool worker's own stop: it stays "running"

    def forget(self, conversation: str) -> None:
        """The chat is being deleted: stop its work and report nothing more about it."""
        self.stop(conversation)
        self._turns.pop(conversation, None)

    # the worker's events ----------------------------------------------------------------------------------
    def _on_waiting(self, event: Waiting) -> None:
        if (turn := self._turns.get(event.conversation)) is not None:
            turn.waiting = True
            self.events.dispatch(event)

    def _on_accepted(self, accepted: Accepted) -> None:
        if (turn := self._turns.get(accepted.conversation)) is not None:
            turn.accepted, turn.waiting = True, False
            turn.live = LiveFigures(time.monotonic())
            self.events.dispatch(accepted)

    def _on_progress(self, event: Progress) -> None:
        if event.phase != ProgressPhase.PREFILL:
            self.events.dispatch(event)  # a rebuild's, on opening
            return
        turn, done, total = self._turns.get(event.conversation), event.done, event.total
        if turn is None or total < PROGRESS_MIN_TOKENS:
            return
        if turn.prefill_started is None:
            turn.prefill_started = time.monotonic()
        left_ms = (time.monotonic() - turn.prefill_started) / max(done, 1) * (total - done) * 1000
        self.events.dispatch(PrefillProgress(event.conversation, done, total, left_ms))

    def _on_token(self, event: Token) -> None:
        turn = self._turns.get(event.conversation)
        if turn is None:
            return
        if event.context_tokens and turn.live is not None:  # first: the piece's figures then count it
            turn.live.context_tokens = event.context_tokens
        if event.kind == "reasoning":
            turn.reasoning += event.text
        else:
            turn.reply += event.text
        self.events.dispatch(event)
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
            self.events.dispatch(LiveUpdate(turn.conversation, live))

    def _on_finished(self, finished: Finished) -> None:
        if self._turns.pop(finished.conversation, None) is not None:
            self.events.dispatch(finished)

    def _on_failed(self, failed: TurnFailed) -> None:
        conversation, error = failed.conversation, failed.error
        turn = self._turns.pop(conversation, None)
        if turn is None:
            return
        if isinstance(error, ContextFullError):  # refused before anything was stored, either way
            self.events.dispatch(ContextLimitHit(conversation, turn.message, error, turn.attachments))
        elif turn.accepted or turn.message is None:
            self.events.dispatch(ReplyFailed(conversation, str(error)))
        else:  # refused before it was stored: nothing typed may be lost
            self.events.dispatch(MessageRefused(conversation, turn.message, str(error), turn.attachments))
