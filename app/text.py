"""Small wordings the window shows: ages, counts, and how a turn started."""

from __future__ import annotations

import time


def count(n: int) -> str:
    return f"{n:,}"


def age(ms: int, now_ms: int | None = None) -> str:
    """'just now', '5 min ago', '3 h ago', 'yesterday', '12 Mar'."""
    now_ms = now_ms if now_ms is not None else int(time.time() * 1000)
    seconds = max(0, (now_ms - ms) // 1000)
    if seconds < 60:
        return "just now"
    if seconds < 3600:
        return f"{seconds // 60} min ago"
    if seconds < 86400:
        return f"{seconds // 3600} h ago"
    if seconds < 2 * 86400:
        return "yesterday"
    return time.strftime("%d %b %Y" if seconds > 300 * 86400 else "%d %b", time.localtime(ms / 1000))


def duration(ms: float) -> str:
    if ms < 1000:
        return f"{ms:.0f} ms"
    if ms < 60_000:
        return f"{ms / 1000:.1f} s"
    return f"{int(ms // 60_000)} min {int(ms % 60_000 // 1000)} s"


def resume_summary(report: dict) -> str:
    """How a turn started, e.g. 'resumed 1,843 tokens from disk in 41 ms · re-reading would take ≈ 19 s'."""
    source = report.get("source")
    reused, prefilled = report.get("reused_tokens", 0), report.get("prefilled_tokens", 0)
    estimate = report.get("prefill_estimate_ms")
    if source == "disk":
        text = f"resumed {count(report.get('restored_tokens', reused))} tokens from disk in {duration(report['restore_ms'])}"
        if estimate:
            text += f" · re-reading would take ≈ {duration(estimate)}"
    elif source == "live":
        text = f"continued from memory ({count(reused)} tokens kept)"
    elif source == "rebuilt":
        text = f"rebuilt: {report.get('plain') or report.get('reason')}"
    else:
        return f"read {count(prefilled)} tokens from scratch" if prefilled else "started from scratch"
    if prefilled:
        text += f" · read {count(prefilled)} new tokens"
    return text
