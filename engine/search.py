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
import unicodedata
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


@dataclass
class Term:
    words: list[str]
    prefix: bool  # the last word matches as a prefix

    def fts(self) -> str:
        return '"' + " ".join(self.words) + '"' + ("*" if self.prefix else "")


def parse_query(text: str, typing: bool = True) -> tuple[list[Term], list[Term]]:
    """(terms to find, terms to exclude) in a search-box text."""
    positive: list[Term] = []
    negative: list[Term] = []
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
        (negative if negate else positive).append(Term(words, prefix))
    return positive, negative


def fts_query(text: str, typing: bool = True) -> str | None:
    """An FTS5 query for a search-box text, or None when it holds no words to look for."""
    positive, negative = parse_query(text, typing)
    if not positive:  # FTS5 cannot start from an exclusion alone
        return None
    return " AND ".join(t.fts() for t in positive) + "".join(f" NOT {t.fts()}" for t in negative)


def _fold(word: str) -> str:
    """Case- and accent-insensitive form, as the unicode61 tokenizer compares words."""
    return "".join(ch for ch in unicodedata.normalize("NFKD", word.casefold()) if not unicodedata.combining(ch))


def make_snippet(content: str, terms: list[Term], context_words: int = 12) -> str:
    """A few words around the first match in ``content``, matched words between the markers.

    Done here rather than with FTS5's snippet(): asking FTS5 for the snippets of a few hundred chosen
    rows re-runs the whole match once per row (seconds on 200,000 messages)."""
    wanted = [(_fold(w), t.prefix and j == len(t.words) - 1) for t in terms for j, w in enumerate(t.words)]
    words = list(_WORD.finditer(content))

    def hit(word: str) -> bool:
        f = _fold(word)
        return any(f.startswith(w) if pre else f == w for w, pre in wanted)

    first = next((i for i, w in enumerate(words) if hit(w.group(0))), None)
    if first is None:
        return content[: context_words * 8]
    lo, hi = max(0, first - context_words // 3), min(len(words), first + context_words)
    out, pos = [], words[lo].start()
    for w in words[lo:hi]:
        out.append(content[pos : w.start()])
        out.append(f"{MARK_START}{w.group(0)}{MARK_END}" if hit(w.group(0)) else w.group(0))
        pos = w.end()
    return ("…" if lo else "") + "".join(out) + ("…" if hi < len(words) else "")


def search(store: ConversationStore, text: str, *, since_ms: int | None = None, until_ms: int | None = None,
           model: str | None = None, limit: int = 200, typing: bool = True) -> list[Hit]:
    """Conversations matching ``text`` (titles first, then by their most recent matching message), one
    hit per conversation, each with a snippet of its newest match.

    Matches are walked newest first (FTS5 reads its index in rowid order and stops at the LIMIT), in
    pages, until ``limit`` conversations pass the filters: the cost follows the results shown, not the
    number of matches, which is what keeps a one-letter prefix on 200,000 messages interactive.
    With no words in ``text``: every conversation passing the filters, most recent first.
    """
    filters, args = ["deleted_ms IS NULL"], {"limit": limit}
    if since_ms is not None:
        filters.append("updated_ms >= :since")
        args["since"] = since_ms
    if until_ms is not None:
        filters.append("updated_ms <= :until")
        args["until"] = until_ms
    if model:
        filters.append("model = :model")
        args["model"] = model
    where = " AND ".join(filters)
    query = fts_query(text, typing)
    if query is None:
        rows = store.read(f"SELECT id, title, updated_ms FROM conversations WHERE {where} "
                          "ORDER BY updated_ms DESC LIMIT :limit", args)
        return [Hit(r[0], r[1], r[2], "", None, 0.0) for r in rows]
    try:
        return _search(store, query, where, args, limit, text, typing)
    except ConversationError as exc:  # fts_query only builds valid queries; say so plainly if one is not
        raise ConversationError(f"search failed for {text!r}: {exc}") from None


def _search(store: ConversationStore, query: str, where: str, args: dict, limit: int, text: str,
            typing: bool) -> list[Hit]:
    hits: dict[str, Hit] = {}
    title_rows = store.read(
        f"SELECT c.id, c.title, c.updated_ms FROM title_fts JOIN conversations c ON c.rowid = title_fts.rowid "
        f"WHERE title_fts MATCH :q AND {where.replace('deleted_ms', 'c.deleted_ms')} "
        "ORDER BY title_fts.rowid DESC LIMIT :limit", {**args, "q": query})
    for order, (cid, title, updated) in enumerate(title_rows):
        hits[cid] = Hit(cid, title, updated, "", None, -1e9 + order)
    best_message: dict[str, int] = {}  # conversation → rowid of its newest matching message
    before, page = 1 << 62, max(4 * limit, 400)
    while len(hits) < limit:
        rows = store.read("SELECT m.id, m.conversation_id FROM message_fts f JOIN messages m ON m.id = f.rowid "
                          "WHERE message_fts MATCH :q AND f.rowid < :before ORDER BY f.rowid DESC LIMIT :page",
                          {"q": query, "before": before, "page": page})
        if not rows:
            break
        before = rows[-1][0]
        fresh = {cid for _, cid in rows if cid not in hits and cid not in best_message}
        allowed = _passing(store, fresh, where, args)
        for rowid, cid in rows:
            if cid in allowed and cid not in best_message:
                best_message[cid] = rowid
                if cid not in hits:
                    title, updated = allowed[cid]
                    hits[cid] = Hit(cid, title, updated, "", None, float(len(hits)))
        for rowid, cid in rows:  # a title hit still wants the snippet of its newest matching message
            if cid in hits and cid not in best_message:
                best_message[cid] = rowid
        if len(rows) < page:
            break
    _add_snippets(store, text, hits, best_message, typing)
    return sorted(hits.values(), key=lambda h: h.rank)[:limit]


def _passing(store: ConversationStore, ids: set[str], where: str, args: dict) -> dict[str, tuple[str, int]]:
    """Of ``ids``, those passing the filters: id → (title, updated_ms)."""
    if not ids:
        return {}
    marks = ",".join(f":id{i}" for i in range(len(ids)))
    params = {**args, **{f"id{i}": cid for i, cid in enumerate(ids)}}
    rows = store.read(f"SELECT id, title, updated_ms FROM conversations WHERE id IN ({marks}) AND {where}", params)
    return {r[0]: (r[1], r[2]) for r in rows}


def _add_snippets(store: ConversationStore, query_text: str, hits: dict[str, Hit], best: dict[str, int],
                  typing: bool) -> None:
    if not best:
        return
    terms, _ = parse_query(query_text, typing)
    by_rowid = {rowid: cid for cid, rowid in best.items()}
    marks = ",".join(str(int(r)) for r in by_rowid)
    for rowid, seq, content in store.read(f"SELECT id, seq, content FROM messages WHERE id IN ({marks})"):
        hit = hits[by_rowid[rowid]]
        hit.snippet, hit.seq = make_snippet(content, terms), seq


def snippet_html(snippet: str) -> str:
    """The snippet escaped for Qt rich text, matched words in bold."""
    import html

    return html.escape(snippet).replace(MARK_START, "<b>").replace(MARK_END, "</b>")
