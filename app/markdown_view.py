"""Message text as HTML for Qt's rich-text engine: CommonMark through markdown-it, code made readable.

Raw HTML in a message is escaped, never rendered (model output is untrusted text). Fenced code
becomes a shaded, padded monospace block with its language as a caption: Qt's rich text ignores
padding on ``<pre>``, so the block is wrapped in a one-cell table, which it does pad.
"""

from __future__ import annotations

import html
import re

from markdown_it import MarkdownIt
from PySide6.QtGui import QPalette

_MD = MarkdownIt("commonmark", {"html": False, "breaks": True}).enable(["table", "strikethrough"])
_FENCE = re.compile(r'<pre><code(?: class="language-([^"]*)")?>(.*?)</code></pre>', re.S)


def _mix(a, b, t: float) -> str:
    """A colour between palette colours a and b, as #rrggbb (t = 0 gives a)."""
    return "#{:02x}{:02x}{:02x}".format(*(round(x + (y - x) * t) for x, y in
                                            zip(a.getRgb()[:3], b.getRgb()[:3], strict=True)))


def style_sheet(palette: QPalette) -> str:
    base, text = palette.color(QPalette.ColorRole.Base), palette.color(QPalette.ColorRole.Text)
    return (f"pre, code {{ font-family: 'DejaVu Sans Mono', 'Consolas', 'Menlo', monospace; }}"
            f"code {{ background-color: {code_background(palette)}; }}"
            f".lang {{ color: {_mix(text, base, 0.45)}; font-size: small; }}"
            "table.md { border-collapse: collapse; }")


def code_background(palette: QPalette) -> str:
    return _mix(palette.color(QPalette.ColorRole.Base), palette.color(QPalette.ColorRole.Text), 0.08)


def to_html(text: str, palette: QPalette) -> str:
    bg = code_background(palette)

    def code_block(match: re.Match) -> str:
        # Qt's rich text honours bgcolor and cellpadding on tables, not CSS padding on <pre>.
        lang, body = match.group(1), match.group(2).rstrip("\n")
        caption = f'<div class="lang">{html.escape(lang)}</div>' if lang else ""
        return (f'<table class="code" width="100%" cellpadding="8" cellspacing="0" bgcolor="{bg}"><tr><td>'
                f"{caption}<pre>{body}</pre></td></tr></table>")

    body = _FENCE.sub(code_block, _MD.render(text))
    body = body.replace("<table>", '<table class="md" border="1" cellspacing="0" cellpadding="4">')
    return f"<html><head><style>{style_sheet(palette)}</style></head><body>{body}</body></html>"
