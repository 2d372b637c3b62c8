"""A reply's caption in words: why it ended and which model wrote it, as the store keeps them.

One wording for every place that shows it: the window's note under a reply, the browser's preview and
the Markdown export (the JSON export and bundles carry the stored values themselves).
"""

from __future__ import annotations

from engine.types import StopReason

# Why a reply ended, when that is worth saying: one that simply ended (an end of turn, a stop string) says
# nothing.
STOP_NOTES = {StopReason.CANCELLED: "stopped", StopReason.LENGTH: "reached the length limit",
              StopReason.CONTEXT_FULL: "the context window is full",
              StopReason.INTERRUPTED: "cut off before it ended"}  # Hearth closed, or a server's connection broke


def reply_caption(finish: str | None, model: str) -> str:
    """Why the reply ended (unless it simply ended) and the model that wrote it, joined by " · "; "" when
    neither is known (replies from before schema 8, one the person edited)."""
    parts = [STOP_NOTES[StopReason(finish)]] if finish in STOP_NOTES else []
    if model:
        parts.append(model)
    return " · ".join(parts)
