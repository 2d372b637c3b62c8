"""Message text as HTML for Qt's rich-text engine: CommonMark through markdown-it, code made readable.

Raw HTML in a message is escaped, never rendered (model output is untrusted text). Fenced code
becomes a shaded, padded monospace block, syntax-highlighted by Pygments, with a caption row: its
language and a Copy link (``copy:N`` copies code block N exactly). Qt's rich text ignores padding on
``<pre>``, so the block is wrapped in a one-cell table, which it does pad. Bare http/https/mailto URLs
become links. Colours come from the palette, so the same code reads on light and dark themes.
"""

from __future__ import annotations

import html
import re
import threading
from dataclasses import dataclass, field
from functools import lru_cache

from markdown_it import MarkdownIt
from markdown_it.token import Token
from pygments.lexers import get_lexer_by_name
from pygments.styles import get_style_by_name
from pygments.util import ClassNotFound
from PySide6.QtGui import QColor, QPalette

from app.theme import contrast

COPY_SCHEME = "copy"  # href="copy:3": the Copy link of the message's fourth code block
OPENABLE_SCHEMES = ("http", "https", "mailto")  # links in model output that may open outside Hearth
_BARE_URL = re.compile(r"(?:https?://|mailto:)[^\s<>\"'`]+", re.I)
_URL_TRAILING = ".,;:!?)]}*_'\""  # sentence punctuation after a URL, not part of it
HIGHLIGHT_MAX_CHARS = 200_000  # longer blocks are shown plain: lexing them would stall the window


@dataclass
class Rendered:
    html: str
    codes: list[str] = field(default_factory=list)  # each code block's exact text, by its Copy link's index


# colours ------------------------------------------------------------------------------------------------------
def _mix(a: QColor, b: QColor, t: float) -> str:
    """A colour between palette colours a and b, as #rrggbb (t = 0 gives a)."""
    return "#{:02x}{:02x}{:02x}".format(*(round(x + (y - x) * t) for x, y in
                                            zip(a.getRgb()[:3], b.getRgb()[:3], strict=True)))


def is_dark(palette: QPalette) -> bool:
    return palette.color(QPalette.ColorRole.Base).lightness() < 128


def code_background(palette: QPalette) -> str:
    return _mix(palette.color(QPalette.ColorRole.Base), palette.color(QPalette.ColorRole.Text), 0.08)


def style_sheet(palette: QPalette) -> str:
    base, text = palette.color(QPalette.ColorRole.Base), palette.color(QPalette.ColorRole.Text)
    return (f"pre, code {{ font-family: 'DejaVu Sans Mono', 'Consolas', 'Menlo', monospace; }}"
            f"code {{ background-color: {code_background(palette)}; }}"
            "pre { white-space: pre-wrap; }"  # long lines wrap: the transcript never scrolls sideways
            f".lang {{ color: {_mix(text, base, 0.35)}; font-size: small; }}"
            f"a.copy {{ font-size: small; }}"
            "table.md { border-collapse: collapse; }")


@lru_cache(maxsize=8)
def _token_colours(dark: bool, background: str, text: str) -> dict:
    """Pygments token type → (colour or None, bold, italic), each colour readable on ``background``: a style
    made for light or dark backgrounds, and any colour too faint there pulled towards the text colour."""
    style = get_style_by_name("monokai" if dark else "default")
    bg, fg = QColor(background), QColor(text)
    table = {}
    for ttype, spec in style:
        colour = spec["color"]
        if colour:
            c = QColor(f"#{colour}")
            for _ in range(4):
                if contrast(c, bg) >= 4.0:
                    break
                c = QColor(_mix(c, fg, 0.4))
            colour = c.name()
        table[ttype] = (colour, spec["bold"], spec["italic"])
    return table


# Looked up ahead of time: the first lookup of a language's lexer imports its module (~30 ms for Python),
# which would otherwise be a stall the first time a chat with that language is drawn.
COMMON_LANGUAGES = ("python", "bash", "javascript", "typescript", "json", "c", "cpp", "rust", "go", "java",
                    "html", "css", "sql", "yaml", "toml")
_warmed = threading.Event()


def warm_up_highlighting() -> None:
    """Load Pygments' styles and the common languages' lexers on a background thread, once per process.
    Imports hold the GIL only in short slices, so the window keeps drawing meanwhile."""
    if _warmed.is_set():
        return
    _warmed.set()

    def load() -> None:
        for name in ("default", "monokai"):
            get_style_by_name(name)
        for language in COMMON_LANGUAGES:
            try:
                get_lexer_by_name(language)
            except ClassNotFound:  # a Pygments without it: highlight() shows such code plain
                pass

    threading.Thread(target=load, name="hearth-pygments-warm-up", daemon=True).start()


@lru_cache(maxsize=512)
def highlight(code: str, language: str, dark: bool, background: str, text: str) -> str:
    """``code`` as escaped HTML with coloured spans. Cached: while a reply streams, the finished blocks
    above the one being written are the same every re-render, so only the growing one is lexed again."""
    if not language or len(code) > HIGHLIGHT_MAX_CHARS:
        return html.escape(code)
    try:
        lexer = get_lexer_by_name(language, stripnl=False, ensurenl=False)
    except ClassNotFound:
        return html.escape(code)
    colours = _token_colours(dark, background, text)
    runs: list[list] = []  # [css, text]: neighbouring tokens of one look share a span (fewer to lay out)
    for ttype, value in lexer.get_tokens(code):
        colour, bold, italic = colours.get(ttype, (None, False, False))
        css = (f"color:{colour};" if colour else "") + ("font-weight:bold;" if bold else "") + \
              ("font-style:italic;" if italic else "")
        if runs and (runs[-1][0] == css or value.isspace()):  # spaces take the look of what they follow
            runs[-1][1] += value
        else:
            runs.append([css, value])
    return "".join(f'<span style="{css}">{html.escape(value)}</span>' if css else html.escape(value)
                   for css, value in runs)


# Markdown ------------------------------------------------------------------------------------------------------
def _split_urls(text: str) -> list[tuple[str, bool]]:
    """``text`` as (piece, is_url) runs; a URL's trailing sentence punctuation stays text."""
    runs, at = [], 0
    for m in _BARE_URL.finditer(text):
        url = m.group(0).rstrip(_URL_TRAILING)
        if len(url) <= len("mailto:") or url.endswith("://"):
            continue
        runs.append((text[at:m.start()], False))
        runs.append((url, True))
        at = m.start() + len(url)
    runs.append((text[at:], False))
    return [r for r in runs if r[0]]


def _linkify(state) -> None:
    """Core rule: bare URLs in text (not inside a link already, not in code) become links."""
    for block in state.tokens:
        if block.type != "inline" or not block.children:
            continue
        children, depth = [], 0
        for tok in block.children:
            depth += tok.type == "link_open"
            depth -= tok.type == "link_close"
            if tok.type != "text" or depth or not _BARE_URL.search(tok.content):
                children.append(tok)
                continue
            for piece, is_url in _split_urls(tok.content):
                if is_url:
                    children.append(Token("link_open", "a", 1, attrs={"href": piece}))
                    children.append(Token("text", "", 0, content=piece))
                    children.append(Token("link_close", "a", -1))
                else:
                    children.append(Token("text", "", 0, content=piece))
        block.children = children


def _code_block(code: str, language: str, env: dict, writing: bool = False) -> str:
    palette: QPalette = env["palette"]
    codes: list[str] = env["codes"]
    index = len(codes)
    code = code[:-1] if code.endswith("\n") else code  # the fence's own line end is not the code's
    codes.append(code)
    bg = code_background(palette)
    body = highlight(code, language, is_dark(palette), bg,
                     palette.color(QPalette.ColorRole.Text).name())
    label = html.escape(language) if language else "code"
    link = palette.color(QPalette.ColorRole.Link).name()
    caption = (f'<table width="100%" cellpadding="0" cellspacing="0"><tr><td class="lang">{label}</td>'
               f'<td align="right"><a class="copy" style="color:{link}" href="{COPY_SCHEME}:{index}" '
               f'title="Copy this code">Copy</a></td></tr></table>')
    if writing:
        # The block the model is still writing: a shaded <pre> without the table, so the lines that stream
        # in are appended without laying the table out again (see MessageWidget.show_partial); it gets
        # its table, padding and Copy link when its fence closes.
        return (f'<p class="lang">{label} · writing…</p>'
                f'<pre style="background-color:{bg}">{body}</pre>\n')
    # Qt's rich text honours bgcolor and cellpadding on tables, not CSS padding on <pre>.
    return (f'<table class="code" width="100%" cellpadding="8" cellspacing="0" bgcolor="{bg}"><tr><td>'
            f"{caption}<pre>{body}</pre></td></tr></table>\n")


def _fence(_renderer, tokens, idx, _options, env) -> str:
    tok = tokens[idx]
    language = tok.info.strip().split(maxsplit=1)[0] if tok.info.strip() else ""
    writing = env.get("open_fence", False) and not any(t.type == "fence" for t in tokens[idx + 1:])
    return _code_block(tok.content, language, env, writing)


def _indented(_renderer, tokens, idx, _options, env) -> str:
    return _code_block(tokens[idx].content, "", env)


def _parser() -> MarkdownIt:
    md = MarkdownIt("commonmark", {"html": False, "breaks": True}).enable(["table", "strikethrough"])
    md.core.ruler.push("bare_urls", _linkify)
    md.add_render_rule("fence", _fence)
    md.add_render_rule("code_block", _indented)
    return md


_MD = _parser()


def render(text: str, palette: QPalette, first_code: int = 0) -> Rendered:
    """The message as a full HTML document, with the exact text of each code block (for its Copy link).
    ``first_code``: the index of its first code block's Copy link (a part of a message rendered on its own)."""
    env = {"palette": palette, "codes": [None] * first_code, "open_fence": in_open_fence(text)}
    body = _MD.render(text, env)
    body = body.replace("<table>", '<table class="md" border="1" cellspacing="0" cellpadding="4">')
    return Rendered(f"<html><head><style>{style_sheet(palette)}</style></head><body>{body}</body></html>",
                    env["codes"][first_code:])


def prepare(text: str, palette: QPalette) -> None:
    """Highlight the message's code blocks into ``highlight``'s cache (the costly part of ``render``), so
    that rendering it later is quick: lets a caller split the work over two turns of the event loop."""
    render(text, palette)


_INLINE_MARKUP = set("*_`[]<>#|~\\!&:")  # characters that can change how the text before them renders


def in_open_fence(text: str) -> bool:
    """Whether ``text`` ends inside a fenced code block that is not closed yet."""
    fence = ""
    for line in text.splitlines():
        stripped = line.strip()
        if fence:
            if stripped.startswith(fence) and not stripped.strip(fence[0]):
                fence = ""
        elif stripped.startswith(("```", "~~~")):
            fence = stripped[:3]
    return bool(fence)


def appendable(previous: str, text: str) -> str | None:
    """How a reply being written grew, when appending the new characters as they are shows the same as
    rendering it again: more lines of a code block still open, or plain words in the paragraph being
    written. None when it needs rendering again (a block began or ended, Markdown may apply)."""
    if not previous or not text.startswith(previous) or len(text) == len(previous):
        return None
    added = text[len(previous):]
    if in_open_fence(previous):
        lines_after = previous.rsplit("\n", 1)[-1] + added
        fence_marker = any(line.lstrip().startswith(("```", "~~~")) for line in lines_after.split("\n"))
        return added if not fence_marker and in_open_fence(text) else None
    if previous.endswith("\n") or "\n" in added or _INLINE_MARKUP & set(added) or "http" in added \
            or _INLINE_MARKUP & set(previous[-2:]):
        return None
    return added


def to_html(text: str, palette: QPalette) -> str:
    return render(text, palette).html


def copy_index(href: str) -> int | None:
    """The code block a Copy link names (``copy:N``), or None for any other link."""
    scheme, _, rest = href.partition(":")
    return int(rest) if scheme == COPY_SCHEME and rest.isdigit() else None
