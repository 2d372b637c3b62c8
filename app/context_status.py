"""One source of truth for each conversation's saved-context status, shared by the sidebar's badge, the
browser's Context and Tokens columns and its preview.

Two kinds of news arrive from the engine thread: the list of saved and live contexts
(``cache_states``, after every turn, drop, import...) and the result of checking files (``checkpoint_report``:
a quick header check or Verify all). A check outranks the list for as long as that conversation's entry in
the list stays what it was when the check came back: a file Verify all called damaged shows as damaged
everywhere, until it is rebuilt, dropped or saved anew.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from PySide6.QtCore import QObject, Signal, Slot

from app.conversation_events import EventDispatcher, OpenFailed, Rebuilding
from engine.types import ContextBadge, ContextHealth, ContextReport, ContextState, ContextStatus, Rebuilt

DAMAGED_BADGE = "damaged"  # the sidebar's badge for a file a check found damaged (not an engine state)
_BADGE_OF_HEALTH = {ContextHealth.DAMAGED: DAMAGED_BADGE, ContextHealth.NONE: str(ContextBadge.NONE),
                    ContextHealth.STALE: str(ContextBadge.STALE)}


class ContextStatusRegistry(QObject):
    """Fed by the engine worker's signals; ``changed`` says which conversations' status moved."""

    changed = Signal(object)  # set[str] of conversation ids

    def __init__(self, worker: QObject | None = None, parent: QObject | None = None,
                 events: EventDispatcher | None = None):
        """``events``: the window's dispatcher of conversation events (``TurnControl.events``); without
        one, the worker's events are dispatched here (a browser on its own)."""
        super().__init__(parent)
        self.states: dict[str, ContextState] = {}  # the engine's list of saved and live contexts
        self.statuses: dict[str, ContextStatus] = {}  # the last check of each conversation's file
        self._checked_against: dict[str, ContextState | None] = {}  # the list's entry when the check came back
        self._rebuilding: set[str] = set()
        self._were_rebuilding: set[str] = set()  # named in every badge list, so none keeps a stale "rebuilding"
        if worker is not None:
            worker.cache_states.connect(self.set_states)
            worker.checkpoint_report.connect(self.add_report)
            if events is None:
                events = self._own_events = EventDispatcher()
                worker.conversation_event.connect(self._on_event)
        if events is not None:
            events.on_each({Rebuilding: lambda e: self.set_rebuilding(e.conversation),
                            Rebuilt: lambda e: self.end_rebuilding(e.conversation),
                            OpenFailed: lambda e: self.end_rebuilding(e.conversation)})

    @Slot(object)
    def _on_event(self, event: object) -> None:
        self._own_events.dispatch(event)

    # news from the engine ---------------------------------------------------------------------------------
    def set_states(self, states: Mapping[str, ContextState]) -> None:
        moved = {cid for cid in set(self.states) | set(states) if self.states.get(cid) != states.get(cid)}
        self.states = dict(states)
        for cid in moved:
            # The file changed since it was checked: the check no longer describes it.
            if cid in self._checked_against and self._checked_against[cid] != states.get(cid):
                del self._checked_against[cid]
            if cid not in self._checked_against:
                self.statuses[cid] = self._status_from_state(cid)
        named = self._rebuilding & set(states)
        self._rebuilding -= named
        self.changed.emit(moved | named)

    def add_report(self, report: ContextReport) -> None:
        for cid, status in report.items.items():
            self.statuses[cid] = status
            self._checked_against[cid] = self.states.get(cid)
        self.changed.emit(set(report.items))

    def set_rebuilding(self, conversation: str) -> None:
        self._rebuilding.add(conversation)
        self._were_rebuilding.add(conversation)
        self._checked_against.pop(conversation, None)  # a rebuild replaces the damaged file
        self.changed.emit({conversation})

    def end_rebuilding(self, conversation: str) -> None:
        """The rebuild finished or failed: the badge says what the list of contexts says again."""
        if conversation in self._rebuilding:
            self._rebuilding.discard(conversation)
            self.changed.emit({conversation})

    def mark_dropped(self, conversations: Iterable[str]) -> None:
        """The window asked for these contexts to go: show it before the engine thread confirms."""
        ids = set(conversations)
        for cid in ids:
            self.statuses[cid] = ContextStatus(cid, ContextHealth.NONE)
            self._checked_against[cid] = self.states.get(cid)
        self.changed.emit(ids)

    # what the views show -------------------------------------------------------------------------------------
    def status(self, conversation: str) -> ContextStatus | None:
        """The browser's Context and Tokens cells; None before any news of the conversation."""
        return self.statuses.get(conversation)

    def badge(self, conversation: str) -> str:
        """The sidebar's badge: rebuilding, damaged, live, saved, stale or none."""
        if conversation in self._rebuilding:
            return str(ContextBadge.REBUILDING)
        state = self.states.get(conversation)
        if state is not None and state.badge == ContextBadge.LIVE:
            return str(ContextBadge.LIVE)  # what is in memory is what the next turn uses, whatever the file says
        if conversation in self._checked_against:
            health = self.statuses[conversation].health
            if health in _BADGE_OF_HEALTH:
                return _BADGE_OF_HEALTH[health]
        return str(state.badge) if state is not None else str(ContextBadge.NONE)

    def badges(self) -> dict[str, ContextState]:
        """Every conversation with news, as the sidebar takes them (badge, tokens, model)."""
        out = {}
        for cid in set(self.states) | set(self._checked_against) | self._rebuilding | self._were_rebuilding:
            state = self.states.get(cid)
            status = self.statuses.get(cid)
            tokens = state.tokens if state is not None else (status.tokens if status is not None else 0)
            out[cid] = ContextState(self.badge(cid), tokens, state.model if state is not None else "")  # type: ignore[arg-type]
        return out

    def describe(self, conversation: str) -> str:
        """One line for the preview: the same status the badge and the Context column show."""
        status = self.statuses.get(conversation)
        badge = self.badge(conversation)
        if status is not None and conversation in self._checked_against and status.health == ContextHealth.DAMAGED:
            why = f" — {status.message.rstrip('.')}" if status.message else ""
            return f"Saved context: damaged{why}. It is rebuilt when the chat is opened."
        words = {"live": "in memory", "saved": "saved on disk", "stale": "saved by another model",
                 "rebuilding": "being rebuilt", "none": "none (read from the text when opened)"}
        return f"Saved context: {words.get(badge, badge)}."

    def _status_from_state(self, conversation: str) -> ContextStatus:
        state = self.states.get(conversation)
        if state is None:
            return ContextStatus(conversation, ContextHealth.NONE)
        health = ContextHealth.STALE if state.badge == ContextBadge.STALE else ContextHealth.VALID
        old = self.statuses.get(conversation)
        return ContextStatus(conversation, health, tokens=state.tokens, bytes=old.bytes if old else 0,
                             model=state.model, others=old.others if old else ())
