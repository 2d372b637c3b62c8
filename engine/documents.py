"""Documents attached to a chat message: reading a file into text, bounded, and the one format the model reads.

``read_attachment`` reads a file (plain text, source code, Markdown, CSV, JSON, HTML, PDF, DOCX) into an
``Attachment``: its name, size, SHA-256 and extracted text, so nothing later depends on the file staying
where it was. A file that cannot be read is refused with an ``AttachmentError`` whose ``reason`` is stable
and whose message names the file, the reason and, for a cap, the cap. Every size and count is capped while
reading (docs/documents.md lists the caps), so a huge or hostile file costs a bounded amount of work.

``compose_message`` is THE format of a user message with attachments: every file first (``[File: NAME]``,
its text, ``[End of file: NAME]``), then the typed words. Files first, so chats that share documents share a
prompt prefix and the saved context of one serves the other.
"""

from __future__ import annotations

import hashlib
import io
import logging
import os
import stat
import zipfile
from collections.abc import Sequence
from html.parser import HTMLParser
from pathlib import Path

from engine.errors import AttachmentError
from engine.types import Attachment

log = logging.getLogger(__name__)

__all__ = [
    "Attachment", "AttachmentError", "KINDS", "MAX_ATTACHMENTS", "MAX_DOCX_MEMBERS", "MAX_DOCX_UNPACKED_BYTES",
    "MAX_DOCX_XML_BYTES", "MAX_FILE_BYTES", "MAX_HTML_BYTES", "MAX_NAME_CHARS", "MAX_PDF_CONTENT_BYTES",
    "MAX_PDF_PAGE_CONTENT_BYTES", "MAX_PDF_PAGES", "MAX_TEXT_CHARS", "REASONS", "attachment_block",
    "attachment_from_text", "check_attachments", "compose_message", "kind_for", "read_attachment",
]

# the caps (docs/documents.md) ---------------------------------------------------------------------------------
MAX_FILE_BYTES = 32 << 20  # the file as it is on disk
MAX_TEXT_CHARS = 2_000_000  # the extracted text of one file (~500k tokens: more than any context holds)
MAX_PDF_PAGES = 2_000
# pypdf reads a page's drawing instructions at ~0.5 MB/s and worse on one huge page (5 MB: 24 s): bound both
MAX_PDF_PAGE_CONTENT_BYTES = 2 << 20  # one page's content streams and the forms it draws, decoded
MAX_PDF_CONTENT_BYTES = 16 << 20  # the whole document's
MAX_HTML_BYTES = 8 << 20  # the stdlib parser reads tag-dense markup at ~1 MB/s: this bounds a page to seconds
MAX_DOCX_UNPACKED_BYTES = 256 << 20  # a DOCX's members as the zip declares them, unpacked (a zip bomb stops here)
MAX_DOCX_XML_BYTES = 32 << 20  # its XML parts, unpacked: what lxml parses into memory (~10x) and python-docx walks
MAX_DOCX_MEMBERS = 10_000
MAX_ATTACHMENTS = 16  # files on one message
MAX_NAME_CHARS = 255

KINDS = ("text", "markdown", "code", "csv", "json", "html", "pdf", "docx")
REASONS = ("too_large", "binary", "encoding", "encrypted", "image_only", "unreadable", "unsupported", "empty",
           "too_many")

_MARKDOWN = {".md", ".markdown", ".mdown", ".mkd"}
_CSV = {".csv", ".tsv"}
_JSON = {".json", ".geojson"}
_HTML = {".html", ".htm", ".xhtml"}
_CODE = {
    ".py", ".pyi", ".js", ".mjs", ".cjs", ".ts", ".tsx", ".jsx", ".c", ".h", ".cc", ".cpp", ".cxx", ".hpp", ".hh",
    ".cs", ".java", ".kt", ".kts", ".scala", ".go", ".rs", ".rb", ".php", ".pl", ".pm", ".swift", ".m", ".mm",
    ".sh", ".bash", ".zsh", ".fish", ".ps1", ".bat", ".cmd", ".sql", ".r", ".jl", ".lua", ".dart", ".ex", ".exs",
    ".erl", ".hs", ".ml", ".mli", ".fs", ".clj", ".lisp", ".el", ".vim", ".css", ".scss", ".sass", ".less",
    ".vue", ".svelte", ".xml", ".yaml", ".yml", ".toml", ".ini", ".cfg", ".conf", ".proto", ".graphql", ".tex",
    ".cmake", ".mk", ".gradle", ".zig", ".nim", ".v", ".sv", ".vhd", ".asm", ".s", ".diff", ".patch",
}
_CODE_NAMES = {"makefile", "dockerfile", "cmakelists.txt", "rakefile", "gemfile", "justfile"}
# formats Hearth does not read (saying so beats calling them binary)
_UNSUPPORTED = {
    ".doc", ".xls", ".xlsx", ".ppt", ".pptx", ".odt", ".ods", ".odp", ".rtf", ".epub", ".pages", ".key",
    ".png", ".jpg", ".jpeg", ".gif", ".bmp", ".tif", ".tiff", ".webp", ".heic", ".svgz", ".ico",
    ".zip", ".gz", ".tgz", ".bz2", ".xz", ".7z", ".rar", ".tar", ".zst",
    ".mp3", ".wav", ".flac", ".ogg", ".m4a", ".mp4", ".mkv", ".mov", ".avi", ".webm",
    ".exe", ".dll", ".so", ".dylib", ".bin", ".o", ".a", ".class", ".jar", ".pyc", ".wasm",
    ".gguf", ".onnx", ".safetensors", ".sqlite", ".db", ".hkv",
}
_OLE_MAGIC = b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1"  # an encrypted DOCX is kept in an OLE compound file
# control characters that do not occur in text (tab, newline, form feed, carriage return do; so does escape,
# in logs with terminal colours)
_CONTROL = {c for c in range(32) if c not in (9, 10, 12, 13, 27)} | {127}
_CONTROL_SHARE = 0.01  # more than this share of them in the first 64 KiB: not text


def _refuse(name: str, reason: str, why: str) -> AttachmentError:
    return AttachmentError(f"{name or 'the file'} cannot be attached: {why}", reason, name)


def _size_words(n: int) -> str:
    """A cap in words: whole MiB as MiB, else bytes (so a figure just over a cap never reads as equal to it)."""
    return f"{n >> 20} MiB" if n >= 1 << 20 and n % (1 << 20) == 0 else f"{n:,} bytes"


def clean_name(name: str) -> str:
    """The name as the message shows it: no folders, no control characters (a name cannot break the format's
    lines), at most MAX_NAME_CHARS."""
    base = name.replace("\\", "/").rsplit("/", 1)[-1]
    base = "".join("?" if ord(c) < 32 or ord(c) == 127 else c for c in base).strip()
    return base[:MAX_NAME_CHARS] or "file"


def kind_for(name: str) -> str | None:
    """The kind a file's name says (by extension); "text" for names Hearth does not know (they are read as
    text, or refused as binary); None for a format Hearth does not read."""
    lower = name.lower()
    ext = os.path.splitext(lower)[1]
    if ext == ".pdf":
        return "pdf"
    if ext == ".docx":
        return "docx"
    if ext in _UNSUPPORTED:
        return None
    if ext in _MARKDOWN:
        return "markdown"
    if ext in _CSV:
        return "csv"
    if ext in _JSON:
        return "json"
    if ext in _HTML:
        return "html"
    if ext in _CODE or lower in _CODE_NAMES:
        return "code"
    return "text"


# reading a file ------------------------------------------------------------------------------------------------
def read_attachment(path: str | Path, *, max_bytes: int = MAX_FILE_BYTES, max_chars: int = MAX_TEXT_CHARS,
                    max_pages: int = MAX_PDF_PAGES, max_unpacked: int = MAX_DOCX_UNPACKED_BYTES,
                    max_html: int = MAX_HTML_BYTES) -> Attachment:
    """The file at ``path`` as an attachment (its text extracted); AttachmentError when it cannot be read.
    The caps are parameters so tests need not write 32 MiB; front ends use the defaults."""
    path = Path(path)
    name = clean_name(path.name)
    kind = kind_for(path.name)
    if kind is None:
        raise _refuse(name, "unsupported", f"Hearth does not read {os.path.splitext(path.name)[1]} files (it reads "
                      "plain text, source code, Markdown, CSV, JSON, HTML, PDF and DOCX)")
    data = _read_bounded(path, name, max_bytes)
    if not data:
        raise _refuse(name, "empty", "the file is empty")
    sha = hashlib.sha256(data).hexdigest()
    pages = None
    if kind == "pdf":
        text, pages = _pdf_text(data, name, max_chars, max_pages)
    elif kind == "docx":
        text = _docx_text(data, name, max_chars, max_unpacked)
    else:
        if kind == "html" and len(data) > max_html:
            raise _refuse(name, "too_large", f"it is {len(data):,} bytes of HTML, more than the "
                          f"{_size_words(max_html)} of HTML Hearth reads")
        text = _decode(data, name)
        if kind == "html":
            text = html_text(text)
    text = _normalise(text)
    if not text.strip():
        if kind == "pdf":
            raise _refuse(name, "image_only", "the PDF has no text to extract (its pages are probably scanned "
                          "images; Hearth does not read text from images)")
        raise _refuse(name, "empty", "it has no text")
    _check_chars(text, name, max_chars)
    return Attachment(name, len(data), sha, kind, text, pages)


def attachment_from_text(name: str, text: str, kind: str = "text") -> Attachment:
    """An attachment of text already in hand (pasted text, tests): its size and SHA-256 are its UTF-8 bytes'."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {', '.join(KINDS)}, not {kind!r}")
    name = clean_name(name)
    if not isinstance(text, str):
        raise _refuse(name, "unreadable", "its content is not text")
    if "\x00" in text:
        raise _refuse(name, "binary", "it holds NUL characters, so it is not text")
    data = text.encode("utf-8", errors="surrogatepass")
    normal = _normalise(text)
    if not normal.strip():
        raise _refuse(name, "empty", "it has no text")
    _check_chars(normal, name, MAX_TEXT_CHARS)
    return Attachment(name, len(data), hashlib.sha256(data).hexdigest(), kind, normal)


def _read_bounded(path: Path, name: str, max_bytes: int) -> bytes:
    """The file's bytes, refusing one over ``max_bytes`` before reading it (and one that grew meanwhile)."""
    try:
        with open(path, "rb") as f:
            st = os.fstat(f.fileno())
            if not stat.S_ISREG(st.st_mode):
                raise _refuse(name, "unreadable", "it is not a regular file")
            if st.st_size > max_bytes:
                raise _refuse(name, "too_large", f"it is {st.st_size:,} bytes, more than the "
                              f"{_size_words(max_bytes)} a file may be")
            data = f.read(max_bytes + 1)
    except IsADirectoryError:
        raise _refuse(name, "unreadable", "it is a folder, not a file") from None
    except OSError as exc:
        raise _refuse(name, "unreadable", f"it could not be read ({exc.strerror or exc})") from None
    if len(data) > max_bytes:
        raise _refuse(name, "too_large", f"it is more than the {_size_words(max_bytes)} a file may be")
    return data


def _check_chars(text: str, name: str, max_chars: int) -> None:
    if len(text) > max_chars:
        raise _refuse(name, "too_large", f"its text is {len(text):,} characters, more than the {max_chars:,} "
                      "a file may hold")


def _normalise(text: str) -> str:
    """One newline convention (the model and the token counts see the same text whatever the file used)."""
    return text.replace("\r\n", "\n").replace("\r", "\n")


def _decode(data: bytes, name: str) -> str:
    """UTF-8 (with or without a BOM) or UTF-16 with a BOM; anything else is refused, never guessed (a
    single-byte encoding such as Latin-1 cannot be told from another, and a wrong guess changes the text)."""
    if data.startswith(b"\xef\xbb\xbf"):
        data, encoding = data[3:], "utf-8"
    elif data.startswith((b"\xff\xfe", b"\xfe\xff")):
        encoding = "utf-16"
    else:
        encoding = "utf-8"
        if b"\x00" in data[:1 << 16] or _controls(data[:1 << 16]):
            raise _refuse(name, "binary", "it is binary data, not text")
    try:
        text = data.decode(encoding)
    except UnicodeDecodeError:
        if encoding == "utf-8" and b"\x00" in data:
            raise _refuse(name, "binary", "it is binary data, not text") from None
        raise _refuse(name, "encoding", f"it is not valid {'UTF-16' if encoding == 'utf-16' else 'UTF-8'} text "
                      "(save it as UTF-8 and attach it again)") from None
    if "\x00" in text:
        raise _refuse(name, "binary", "it holds NUL characters, so it is not text")
    return text


def _controls(head: bytes) -> bool:
    return bool(head) and sum(1 for b in head if b in _CONTROL) > _CONTROL_SHARE * len(head)


# HTML: the text, without scripts and styles ---------------------------------------------------------------------
_BLOCKS = {"p", "div", "br", "li", "ul", "ol", "tr", "table", "section", "article", "header", "footer", "h1",
           "h2", "h3", "h4", "h5", "h6", "pre", "blockquote", "hr", "dt", "dd", "title", "main", "nav", "aside"}


class _TextOnly(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self._skip = 0

    def handle_starttag(self, tag: str, attrs: list) -> None:
        if tag in ("script", "style", "template", "noscript"):
            self._skip += 1
        elif tag in _BLOCKS:
            self.parts.append("\n")
        elif tag in ("td", "th"):
            self.parts.append("\t")

    def handle_endtag(self, tag: str) -> None:
        if tag in ("script", "style", "template", "noscript"):
            self._skip = max(0, self._skip - 1)
        elif tag in _BLOCKS:
            self.parts.append("\n")

    def handle_data(self, data: str) -> None:
        if not self._skip:
            self.parts.append(data)


def html_text(html: str) -> str:
    """The text of an HTML page (stdlib parser): scripts and styles dropped, blocks on their own lines,
    runs of blank lines and spaces squeezed."""
    parser = _TextOnly()
    parser.feed(html)
    parser.close()
    lines = [" ".join(line.split()) for line in "".join(parser.parts).splitlines()]
    out: list[str] = []
    for line in lines:
        if line or (out and out[-1]):
            out.append(line)
    return "\n".join(out).strip()


# PDF (pypdf) ------------------------------------------------------------------------------------------------------
def _pdf_text(data: bytes, name: str, max_chars: int, max_pages: int) -> tuple[str, int]:
    try:
        import pypdf
        from pypdf.errors import DependencyError, FileNotDecryptedError, LimitReachedError, PyPdfError
    except ImportError:  # pragma: no cover - a dependency of Hearth
        raise _refuse(name, "unsupported", "reading PDF files needs the pypdf package") from None
    logging.getLogger("pypdf").setLevel(logging.ERROR)  # its warnings about odd files are not the person's
    try:
        reader = pypdf.PdfReader(io.BytesIO(data), strict=False)
        if reader.is_encrypted:
            try:  # many PDFs are encrypted with an empty password only to restrict printing: those open
                opened = reader.decrypt("")
            except (DependencyError, NotImplementedError):  # AES needs the optional 'cryptography' package
                raise _refuse(name, "encrypted", "the PDF is encrypted with AES, which Hearth can open only with "
                              "the 'cryptography' package installed") from None
            if not opened:
                raise _refuse(name, "encrypted", "the PDF is protected by a password")
        count = len(reader.pages)
        if count > max_pages:
            raise _refuse(name, "too_large", f"the PDF has {count:,} pages, more than the {max_pages:,} Hearth reads")
        content = 0  # sized first (decoding is fast), so a refusal comes before any slow extraction
        for number, page in enumerate(reader.pages, start=1):
            drawn = _page_content_bytes(page)
            if drawn > MAX_PDF_PAGE_CONTENT_BYTES:
                raise _refuse(name, "too_large", f"page {number} holds {drawn:,} bytes of drawing instructions, more "
                              f"than the {_size_words(MAX_PDF_PAGE_CONTENT_BYTES)} Hearth reads from one page")
            content += drawn
            if content > MAX_PDF_CONTENT_BYTES:
                raise _refuse(name, "too_large", f"its pages hold more than the {_size_words(MAX_PDF_CONTENT_BYTES)} "
                              "of drawing instructions Hearth reads from one PDF")
        texts, total = [], 0
        for page in reader.pages:
            text = page.extract_text() or ""
            total += len(text)
            if total > max_chars:
                raise _refuse(name, "too_large", f"its text is more than the {max_chars:,} characters a file may hold")
            texts.append(text.strip())
    except AttachmentError:
        raise
    except FileNotDecryptedError:
        raise _refuse(name, "encrypted", "the PDF is protected by a password") from None
    except LimitReachedError:  # a compressed stream that unpacks to more than pypdf allows (a bomb)
        raise _refuse(name, "too_large", "a stream in the PDF unpacks to more than pypdf's limit "
                      f"({pypdf.filters.ZLIB_MAX_OUTPUT_LENGTH:,} bytes)") from None
    except (PyPdfError, ValueError, KeyError, TypeError, AttributeError, IndexError, RecursionError,
            OSError, AssertionError, ZeroDivisionError) as exc:  # pypdf's own limits (LimitReachedError) too
        log.info("pypdf could not read %s: %r", name, exc)
        raise _refuse(name, "unreadable", f"it is not a PDF Hearth can read ({type(exc).__name__})") from None
    return "\n\n".join(t for t in texts if t), count


def _page_content_bytes(page: object) -> int:
    """The decoded size of what pypdf's text extraction walks on a page: its content streams and the form
    XObjects it draws (nested ones too, each once). Decoding is fast (and pypdf caps each stream's output);
    walking the operators is what is slow."""
    contents = page.get_contents()  # type: ignore[attr-defined]
    total = len(contents.get_data()) if contents is not None else 0
    seen: set[int] = set()
    stack = [(page.get("/Resources"), 0)]  # type: ignore[attr-defined]
    while stack and total <= MAX_PDF_PAGE_CONTENT_BYTES:
        resources, depth = stack.pop()
        resources = resources.get_object() if resources is not None else None
        if not hasattr(resources, "get") or depth > 8:
            continue
        xobjects = resources.get("/XObject")
        xobjects = xobjects.get_object() if xobjects is not None else None
        if not hasattr(xobjects, "values"):
            continue
        for ref in xobjects.values():
            obj = ref.get_object()
            if id(obj) in seen or not hasattr(obj, "get_data") or obj.get("/Subtype") != "/Form":
                continue
            seen.add(id(obj))
            total += len(obj.get_data())
            stack.append((obj.get("/Resources"), depth + 1))
    return total


# DOCX (python-docx) ---------------------------------------------------------------------------------------------
def _docx_text(data: bytes, name: str, max_chars: int, max_unpacked: int) -> str:
    if data.startswith(_OLE_MAGIC):
        raise _refuse(name, "encrypted", "the document is protected by a password (or is an old .doc file "
                      "renamed .docx)")
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as z:
            members = z.infolist()
            if len(members) > MAX_DOCX_MEMBERS:
                raise _refuse(name, "too_large", f"the DOCX holds {len(members):,} parts, more than the "
                              f"{MAX_DOCX_MEMBERS:,} Hearth reads")
            unpacked = sum(m.file_size for m in members)
            if unpacked > max_unpacked:
                raise _refuse(name, "too_large", f"the DOCX unpacks to {unpacked:,} bytes, more than the "
                              f"{_size_words(max_unpacked)} Hearth reads")
            xml = sum(m.file_size for m in members if m.filename.lower().endswith((".xml", ".rels")))
            if xml > MAX_DOCX_XML_BYTES:
                raise _refuse(name, "too_large", f"the DOCX holds {xml:,} bytes of XML, more than the "
                              f"{_size_words(MAX_DOCX_XML_BYTES)} Hearth reads")
    except zipfile.BadZipFile:
        raise _refuse(name, "unreadable", "it is not a DOCX Hearth can read (not a zip package)") from None
    try:
        import docx
        from docx.table import Table
        from docx.text.paragraph import Paragraph
    except ImportError:  # pragma: no cover - a dependency of Hearth
        raise _refuse(name, "unsupported", "reading DOCX files needs the python-docx package") from None
    try:
        document = docx.Document(io.BytesIO(data))
        parts, total = [], 0
        for child in document.element.body.iterchildren():
            tag = child.tag.rsplit("}", 1)[-1]
            if tag == "p":
                text = Paragraph(child, document).text
            elif tag == "tbl":
                text = _table_text(Table(child, document))
            else:
                continue
            total += len(text) + 1
            if total > max_chars:
                raise _refuse(name, "too_large", f"its text is more than the {max_chars:,} characters a file may hold")
            parts.append(text)
    except AttachmentError:
        raise
    except Exception as exc:  # python-docx and lxml raise many kinds on a damaged package
        log.info("python-docx could not read %s: %r", name, exc)
        raise _refuse(name, "unreadable", f"it is not a DOCX Hearth can read ({type(exc).__name__})") from None
    return "\n".join(parts).strip()


def _table_text(table: object) -> str:
    """A table a row a line, cells between ' | ' (a merged cell is said once)."""
    lines = []
    for row in table.rows:  # type: ignore[attr-defined]
        cells: list[str] = []
        seen: set[int] = set()
        for cell in row.cells:
            if id(cell._tc) in seen:
                continue
            seen.add(id(cell._tc))
            cells.append(" ".join(cell.text.split()))
        lines.append(" | ".join(cells))
    return "\n".join(lines)


# the message the model reads ------------------------------------------------------------------------------------
def check_attachments(attachments: Sequence[Attachment]) -> None:
    """At most MAX_ATTACHMENTS on a message; each an Attachment of a known kind."""
    if len(attachments) > MAX_ATTACHMENTS:
        raise AttachmentError(f"a message can carry at most {MAX_ATTACHMENTS} files; this one has "
                              f"{len(attachments)}", "too_many")
    for a in attachments:
        if not isinstance(a, Attachment):
            raise TypeError(f"an attachment must be an engine.types.Attachment, not {type(a).__name__}")
        if a.kind not in KINDS:
            raise AttachmentError(f"{a.name} cannot be attached: its kind {a.kind!r} is not one Hearth reads",
                                  "unsupported", a.name)


def attachment_block(attachment: Attachment) -> str:
    """One file as the model reads it: ``[File: NAME]``, the text, ``[End of file: NAME]`` (no newline after)."""
    return f"[File: {attachment.name}]\n{attachment.text.strip(chr(10))}\n[End of file: {attachment.name}]"


def compose_message(typed_text: str, attachments: Sequence[Attachment]) -> str:
    """The user message the model reads: each file's block in order, a blank line between, then (after a blank
    line) the typed text. No attachments: the typed text as it is. Deterministic: the same files and words
    give the same bytes, so chats on the same documents share a prompt prefix."""
    check_attachments(attachments)
    if not attachments:
        return typed_text
    blocks = "\n\n".join(attachment_block(a) for a in attachments)
    return f"{blocks}\n\n{typed_text}" if typed_text.strip() else blocks
