"""The open chat's state, apart from its widgets: which chat is shown, the message being edited, what is
remembered of each chat between visits (messages outside the model's view, its last refusal, why its last
message has no reply), and the store's answers the pane draws from.

``ChatPane`` renders it and forwards what the person does; the typed events of a turn
(app/conversation_events.py) update it before the pane draws. The store reads and the small writes here
(an edit, a chosen version, a chat's settings) are the UI thread's own WAL connection's, as they always
were: well under a millisecond, no model or file work.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from app.context_blocks import too_long_alone_text
from app.text import reply_notes
from app.turns import ContextLimitHit, Turn, TurnControl
from engine.api import ConversationStore
from engine.errors import ConversationError
from engine.types import Accepted, ContextPolicy, Conversation, Message, ReplyVersions

Stored = list[tuple[int, str, str]]  # (seq, role, text) of stored messages
log = logging.getLogger(__name__)


class ToolResultShown:
    """A tool's result as the transcript draws it: the stored message, and how its call ended (``run_state``:
    "done", "error", "denied", "abandoned", or "" for a result an agent's request stored through the server)."""

    def __init__(self, message: Message, run_state: str):
        self.message, self.run_state = message, run_state

    def __getattr__(self, name: str):
        return getattr(self.message, name)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ToolResultShown) and (self.message, self.run_state) == (other.message, other.run_state)

    __hash__ = None  # type: ignore[assignment]


@dataclass(frozen=True)
class NextStep:
    """What to offer under the last message when no turn writes into the chat: the refusal it last had
    (``limit``: its words, and whether dropping older messages can help), a way to answer or edit a last
    message without a reply (``unanswered``: why, when known), or nothing ("")."""

    kind: str
    message: str = ""
    can_drop: bool = False


class ChatSessionModel:
    def __init__(self, store: ConversationStore, turns: TurnControl):
        self.store, self.turns = store, turns
        self.conversation: str | None = None
        self.editing: int | None = None  # the seq of the message being edited
        self.limit_hit: ContextLimitHit | None = None  # the refusal the error block is about
        self.chosen_version = 0  # the version last chosen with ‹ ›, for the status line once its tokens are counted
        self._dropped: dict[str, int] = {}  # chat → stored messages outside the model's view, as last reported
        self._limits: dict[str, ContextLimitHit] = {}  # chat → its last refusal, shown again on coming back
        self._no_reply_reasons: dict[str, str] = {}  # chat → why its last message has no reply, when known
        self._files: dict[int, tuple[tuple, str]] = {}  # seq → (attachments, typed text), as last read of the chat shown
        self._agents: dict[int, Message] = {}  # seq → the messages with thinking, tool calls or a tool's result, likewise

    # the chat shown and its turn ------------------------------------------------------------------------
    def shows(self, conversation: str | None) -> bool:
        return conversation == self.conversation

    @property
    def busy(self) -> bool:
        return self.turns.running(self.conversation)

    def turn(self) -> Turn | None:
        return self.turns.turn(self.conversation)

    # the store's answers ----------------------------------------------------------------------------------
    def messages(self, conversation: str | None = None) -> list[Message]:
        messages = self.store.messages(conversation or self.conversation)
        if self.shows(conversation or self.conversation):
            self._note_files(messages)
        return messages

    def _note_files(self, messages: list[Message]) -> None:
        self._files = {m.seq: (tuple(m.attachments), m.typed_text) for m in messages if m.attachments}
        runs = self.store.tool_runs(self.conversation) if any(m.role == "tool" for m in messages) else {}
        self._agents = {m.seq: ToolResultShown(m, runs.get(m.tool_call_id, "")) if m.role == "tool" else m
                        for m in messages if m.agentic}

    def agents(self) -> dict[int, Message]:
        """seq → each message of the chat shown with a reply's thinking or tool calls, or a tool's result."""
        return dict(self._agents) if self.conversation is not None else {}

    def files(self) -> dict[int, tuple[tuple, str]]:
        """seq → (its attachments, the typed text) of each message of the chat shown that carries files."""
        return dict(self._files) if self.conversation is not None else {}

    def documents_of(self, conversation: str, seq: int | None = None) -> tuple:
        """The attachments of message ``seq`` of ``conversation``; None: every file of the chat, once each, in
        the order they were first attached (``ConversationStore.documents``)."""
        if seq is None:
            return self.store.documents(conversation)
        return next((m.attachments for m in self.store.messages(conversation) if m.seq == seq), ())

    def stored(self, conversation: str | None = None) -> Stored:
        return [(m.seq, m.role, m.content) for m in self.messages(conversation)]

    def without_continued(self, stored: Stored) -> Stored:
        """What to draw of ``stored``: a Continue's reply streams below, from its stored text on."""
        turn = self.turn()
        if turn is not None and turn.kind == "continue" and stored and stored[-1][1] == "assistant":
            return stored[:-1]
        return stored

    def accepted_stored(self, accepted: Accepted) -> Stored:
        if self.shows(accepted.conversation):
            self._note_files(list(accepted.messages))
        return self.without_continued([(m.seq, m.role, m.content) for m in accepted.messages])

    def reply_notes(self) -> dict[int, str]:
        """seq → each stored reply's caption: why it stopped and which model wrote it, as the store keeps
        them (so they are there after a restart too)."""
        if self.conversation is None:
            return {}
        try:
            facts = self.store.reply_facts(self.conversation)
        except ConversationError as exc:  # the replies show without captions; the database's trouble shows elsewhere
            log.warning("could not read how the replies ended: %s", exc)
            return {}
        return reply_notes(facts)

    def reply_versions(self, seq: int) -> ReplyVersions | None:
        try:
            return self.store.reply_versions(self.conversation, seq)
        except ConversationError as exc:  # no ‹ ›; the database's trouble shows elsewhere (or the window is closing:
            log.warning("could not read the versions of the last reply: %s", exc)  # a late open_failed after it)
            return None

    def continuable_seq(self) -> int | None:
        """The last reply's seq when the length limit stopped it or Hearth's closing cut it off (the store
        says, so it outlives a restart)."""
        if self.conversation is None:
            return None
        try:
            return self.store.continuable_reply(self.conversation)
        except ConversationError as exc:  # Continue is not offered; the database's trouble shows elsewhere
            log.warning("could not tell whether the last reply can be continued: %s", exc)
            return None

    def message(self, seq: int) -> Message | None:
        return next((m for m in self.messages() if m.seq == seq), None)

    # what the events say --------------------------------------------------------------------------------
    def dropped(self) -> int:
        return self._dropped.get(self.conversation, 0)

    def note_dropped(self, conversation: str, count: int) -> None:
        self._dropped[conversation] = count

    def turn_started(self, conversation: str) -> None:
        self._limits.pop(conversation, None)
        self._no_reply_reasons.pop(conversation, None)

    def note_no_reply(self, conversation: str, reason: str) -> None:
        self._no_reply_reasons[conversation] = reason

    def note_limit(self, hit: ContextLimitHit) -> None:
        self._limits[hit.conversation] = hit

    def forget_limit(self, conversation: str) -> None:
        self._limits.pop(conversation, None)
        self.limit_hit = None

    def next_step(self, entries: Stored) -> NextStep | None:
        """What to offer under the last message; None while a turn writes into the chat (or none is shown)."""
        conv = self.conversation
        if conv is None or self.turns.running(conv):
            return None
        if conv in self._limits:
            hit = self.limit_hit = self._limits[conv]
            # A message refused in a chat with no earlier ones is too long by itself: dropping older
            # messages or a new chat cannot help (the engine's "stop" wording suggests both).
            earlier = sum(role == "user" for _seq, role, _text in entries) - (hit.message is None)
            message = str(hit.error)
            if hit.error.policy == ContextPolicy.STOP and earlier <= 0:
                message = too_long_alone_text(hit.error.tokens, hit.error.limit)
            return NextStep("limit", message, hit.error.policy == ContextPolicy.STOP and earlier > 0)
        if entries and entries[-1][1] == "user":
            return NextStep("unanswered", self._no_reply_reasons.get(conv, ""))
        if entries and entries[-1][1] == "tool":  # a tool loop stopped (or Hearth closed) before the model read them
            return NextStep("unanswered", "The model has not read the tool results yet.")
        return NextStep("")

    # what the person does (the store's small writes) ------------------------------------------------------
    def save_edit(self, conversation: str, text: str, attachments: tuple = ()) -> None:
        """The edited message (its typed text and the files it now carries) replaces the one being edited (the
        replies after it go); ConversationError."""
        self.store.edit(conversation, self.editing, text, attachments=tuple(attachments))

    def choose_version(self, seq: int, index: int) -> str:
        """The chat continues with version ``index`` of its last reply: its text. ConversationError."""
        text = self.store.choose_version(self.conversation, seq, index)
        self.chosen_version = index
        return text

    def refused_chat(self) -> Conversation | None:
        """The chat the error block's refusal was in, as stored now."""
        return self.store.get(self.limit_hit.conversation) if self.limit_hit is not None else None

    def copy_prompt_and_settings(self, source: Conversation, target: str) -> None:
        """A new chat takes another chat's system prompt and settings (the refused chat's, or the one whose
        documents start it). ConversationError."""
        self.store.set_system_prompt(target, source.system_prompt)
        self.store.set_settings(target, dict(source.settings))

    def drop_oldest_from_now_on(self, conv: Conversation) -> None:
        """The chat drops its oldest messages from the model's view from now on. ConversationError."""
        self.store.set_settings(conv.id, {**conv.settings, "context_policy": str(ContextPolicy.DROP_OLDEST)})
