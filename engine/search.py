"""Full-text search over saved conversations (SQLite FTS5), safe for whatever a person types.

People type FTS syntax by accident or half-way: quotes, ``*``, ``-``, parentheses, ``AND``/``NEAR``.
``fts_query`` never passes their text to FTS5 as syntax. It keeps only words (runs of letters and
digits, as the unicode61 tokenizer sees them), quotes each, and understands three things a search
box is expected to: ``"a phrase"`` (an unclosed quote runs to the end), ``-word`` to exclude, and
``word*`` as a prefix. The last word matches as a prefix while it is being typed. So a query is
always valid FTS5, and a text with no words at all is simply "no query".
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from engine.conversations import ConversationError, ConversationStore

MARK_START, MARK_END = "\x02", "\x03"  # around matched words in snippets
_TOKEN = re.compile(r'-?"[^"]*"?|[^\s"]+')
_WORD = re.compile(r"\w+", re.UNICODE)


@dataclass
class Hit:
    conversation: str
    title: str
    updated_ms: int
    snippet: str  # matched words between MARK_START and MARK_END; "" when only the title matched
    seq: int | None  # the best-matching message, None for a title match
    rank: float


def fts_query(text: str, typing: bool = True) -> str | None:
    """An FTS5 query for a search-box text, or None when it holds no words to look for."""
    positive, negative = [], []
    text = text.replace("(", " ").replace(")", " ")  # grouping is never what a search box means here
    tokens = list(_TOKEN.finditer(text))
    for i, m in enumerate(tokens):
        tok = m.group(0)
        negate = tok.startswith("-") and len(tok) > 1
        tok = tok[1:] if negate else tok
        phrase = tok.startswith('"')
        words = _WORD.findall(tok.replace("_", " "))
        if not words:
            continue
        last = i == len(tokens) - 1 and m.end() == len(text)  # still being typed
        prefix = tok.endswith("*") or (typing and last and not phrase and not negate)
        term = '"' + " ".join(words) + '"' + ("*" if prefix else "")
        (negative if negate else positive).append(term)
    if not positive:  # FTS5 cannot start from an exclusion alone
        return None
    query = " AND ".join(positive)
    return query + "".join(f" NOT {n}" for n in negative)


def search(store: ConversationStore, text: str, *, since_ms: int | None = None, until_ms: int | None = None,
           model: str | None = None, limit: int = 200, typing: bool = True) -> list[Hit]:
    """Conversations matching ``text`` (titles and messages), best first, one hit per conversation.

    With no words in ``text``, every conversation passing the filters, most recent first.
    """
    filters, args = ["c.deleted_ms IS NULL"], {"limit": limit}
    if since_ms is not None:
        filters.append("c.updated_ms >= :since")
        args["since"] = since_ms
    if until_ms is not None:
        filters.append("c.updated_ms <= :until")
        args["until"] = until_ms
    if model:
        filters.append("c.model = :model")
        args["model"] = model
    where = " AND ".join(filters)
    query = fts_query(text, typing)
    if query is None:
        rows = store.read(f"SELECT c.id, c.title, c.updated_ms FROM conversations c WHERE {where} "
                          "ORDER BY c.updated_ms DESC LIMIT :limit", args)
        return [Hit(r[0], r[1], r[2], "", None, 0.0) for r in rows]
    args["q"] = query
    try:
        titles = store.read(
            f"SELECT c.id, c.title, c.updated_ms, bm25(title_fts) FROM title_fts "
            f"JOIN conversations c ON c.rowid = title_fts.rowid WHERE title_fts MATCH :q AND {where} "
            "ORDER BY bm25(title_fts) LIMIT :limit", args)
        messages = store.read(
            f"SELECT c.id, c.title, c.updated_ms, m.seq, "
            f"snippet(message_fts, 0, '{MARK_START}', '{MARK_END}', '…', 12), bm25(message_fts) "
            f"FROM message_fts JOIN messages m ON m.id = message_fts.rowid "
            f"JOIN conversations c ON c.id = m.conversation_id WHERE message_fts MATCH :q AND {where} "
            "ORDER BY bm25(message_fts) LIMIT :limit", args)
    except ConversationError as exc:  # fts_query only builds valid queries; keep the box alive regardless
        raise ConversationError(f"search failed for {text!r}: {exc}") from None
    best: dict[str, Hit] = {}
    for cid, title, updated, rank in titles:
        best[cid] = Hit(cid, title, updated, "", None, rank - 1.0)  # a title match ranks first
    for cid, title, updated, seq, snip, rank in messages:
        hit = best.get(cid)
        if hit is None:
            best[cid] = Hit(cid, title, updated, snip, seq, rank)
        elif not hit.snippet:
            hit.snippet, hit.seq = snip, seq
    return sorted(best.values(), key=lambda h: h.rank)[:limit]


def snippet_html(snippet: str) -> str:
    """The snippet escaped for Qt rich text, matched words in bold."""
    import html

    return html.escape(snippet).replace(MARK_START, "<b>").replace(MARK_END, "</b>")
