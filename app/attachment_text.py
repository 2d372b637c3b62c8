"""The words the composer and the transcript use for attachments: a chip's caption, an attachment's
description, and the total of a message with its attachments against the model's context."""

from __future__ import annotations

from dataclasses import dataclass

from app.text import byte_size, count, display_safe, plural

KIND_NAMES = {"pdf": "PDF", "docx": "Word", "markdown": "Markdown", "csv": "CSV", "json": "JSON", "html": "HTML",
              "code": "code", "text": "text"}


def kind_name(kind: str) -> str:
    return KIND_NAMES.get(kind, kind)


def describe(name: str, kind: str, size: int, pages: int | None) -> str:
    """'report.pdf · PDF · 12.3 KB · 3 pages' (the name made display-safe: it is anyone's)."""
    parts = [display_safe(name), kind_name(kind), byte_size(size)]
    if pages:
        parts.append(plural(pages, "page"))
    return " · ".join(parts)


def chip_tokens(tokens: int | None) -> str:
    return "counting…" if tokens is None else plural(tokens, "token")


@dataclass(frozen=True)
class Total:
    """What the composer's total line says, and whether it is a warning (the message will not fit)."""

    text: str
    warning: bool


def total_text(tokens: int, limit: int | None, used: int, policy: str | None) -> Total:
    """The message with its attachments against the context: '≈7,900 tokens with your message; the context
    holds 8,192, 6,100 already used', a warning when they will not fit, and what the chat's context
    policy then does (``policy``: "stop" or "drop_oldest"; None: "stop")."""
    head = f"≈{count(tokens)} tokens with your message"
    if not limit:
        return Total(head, False)
    numbers = f"the context holds {count(limit)}, {count(used)} already used"
    if tokens > limit:
        return Total(f"⚠ {head}: more than the model reads at once ({count(limit)}). "
                     "Remove an attachment or send less of it.", True)
    if used + tokens > limit:
        then = ("older messages will leave the model's view to make room" if policy == "drop_oldest"
                else "it will be refused: remove an attachment, or start a new chat with these documents")
        return Total(f"⚠ {head} will not fit: {numbers}. If sent, {then}.", True)
    return Total(f"{head}; {numbers}", False)
