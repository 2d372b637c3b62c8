"""What the browser lists and previews, apart from its widgets: the search and its filters as one
``ListingQuery``, the rows it finds (the store's summaries with the shared context registry's status), the
models to filter by, and the one selected chat's preview.

``BrowserWindow`` reads its search bar into a query, renders the rows this returns and forwards what the
person does. The store reads are the UI thread's, as they always were: a search is one indexed FTS query,
the per-conversation facts one grouped query (~140 ms at 10,000 chats, so on a change, not per keystroke).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from app.context_status import ContextStatusRegistry
from app.text import reply_notes
from engine.api import ConversationStore, fts_query, search, snippet_html
from engine.errors import ConversationError
from engine.types import ContextHealth, Conversation, Message

log = logging.getLogger(__name__)
MAX_MATCHES = 200  # a search shows the newest matches; refine it to see others
MAX_LISTED = 1_000_000  # no words: every conversation
STATUSES = ("any", "valid", "stale", "damaged", "none")


@dataclass(frozen=True)
class ListingQuery:
    text: str = ""
    since_ms: int | None = None
    until_ms: int | None = None
    model: str | None = None
    status: str = "any"  # one of STATUSES


@dataclass(frozen=True)
class Listing:
    rows: list[dict]
    capped: bool = False  # a search hit its cap: there may be more (the title says "+")
    error: str = ""  # why the search failed, in words ("" when it did not)


@dataclass(frozen=True)
class Preview:
    conversation: Conversation
    context: str  # its saved context, described
    messages: list[tuple[int, str, str]] = field(default_factory=list)
    notes: dict[int, str] = field(default_factory=dict)  # seq → the caption under each reply
    files: dict[int, tuple[tuple, str]] = field(default_factory=dict)  # seq → (attachments, typed text)
    agents: dict[int, Message] = field(default_factory=dict)  # seq → messages with thinking, tool calls or results


class BrowserListing:
    def __init__(self, store: ConversationStore, contexts: ContextStatusRegistry):
        self.store, self.contexts = store, contexts
        self.summaries: dict[str, dict] = {}

    def reload(self) -> None:
        """Re-read the per-conversation facts (called when chats change, here or in the main window)."""
        self.summaries = {s["id"]: s for s in self.store.summaries()}

    def health(self, conversation: str) -> str:
        status = self.contexts.status(conversation)
        return status.health if status is not None else ContextHealth.NONE

    def find(self, query: ListingQuery) -> Listing:
        """The rows for ``query`` (cheap: on every keystroke)."""
        limit = MAX_MATCHES if fts_query(query.text) else MAX_LISTED  # a listing is one indexed query
        error = ""
        try:
            hits = search(self.store, query.text, since_ms=query.since_ms, until_ms=query.until_ms,
                          model=query.model, limit=limit)
        except ConversationError as exc:
            error, hits = str(exc), []
        if query.status != "any":
            hits = [h for h in hits if self.health(h.conversation) == query.status]
        rows = [{**s, "snippet": snippet_html(h.snippet), "checkpoint": self.contexts.status(h.conversation)}
                for h in hits if (s := self.summaries.get(h.conversation)) is not None]
        return Listing(rows, len(hits) == limit and limit == MAX_MATCHES, error)

    def models(self) -> list[str]:
        return self.store.models()

    def preview(self, conversation: str) -> Preview | None:
        """The chat to preview as stored now; None when it is gone."""
        conv = self.store.get(conversation)
        if conv is None:
            return None
        try:  # the captions the chat pane shows under replies: why each ended, which model wrote it
            notes = reply_notes(self.store.reply_facts(conv.id))
        except ConversationError as exc:  # the replies show without them; the database's trouble shows elsewhere
            log.warning("could not read how the replies of %s ended: %s", conv.id, exc)
            notes = {}
        stored = self.store.messages(conv.id)
        messages = [(m.seq, m.role, m.content) for m in stored]
        files = {m.seq: (m.attachments, m.typed_text) for m in stored if m.attachments}
        agents = {m.seq: m for m in stored if m.agentic}
        return Preview(conv, self.contexts.describe(conv.id), messages, notes, files, agents)
