"""Real document files for the attachment tests and the benchmark: PDFs with text (a content stream written by
hand, Type1 Helvetica), blank and encrypted PDFs (pypdf), DOCX with paragraphs and a table (python-docx)."""

from __future__ import annotations

from pathlib import Path


def _escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace("(", "\\(").replace(")", "\\)")


def text_pdf_bytes(pages: list[list[str]], form_bytes: int = 0) -> bytes:
    """A valid PDF (with its xref table) whose page i shows the lines pages[i] in Helvetica; with
    ``form_bytes``, every page also draws one form XObject whose own content stream is that long."""
    n = len(pages)
    font = 3 + 2 * n  # object numbers: 1 catalog, 2 pages, then (page, contents) pairs, the font, the form
    form = f" /XObject << /Fm1 {font + 1} 0 R >>" if form_bytes else ""
    objects: list[bytes] = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        (f"<< /Type /Pages /Kids [{' '.join(f'{3 + 2 * i} 0 R' for i in range(n))}] /Count {n} >>").encode(),
    ]
    for i, lines in enumerate(pages):
        objects.append((f"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents {4 + 2 * i} 0 R "
                        f"/Resources << /Font << /F1 {font} 0 R >>{form} >> >>").encode())
        ops = ["BT", "/F1 11 Tf", "14 TL", "50 740 Td"]
        for line in lines:
            ops += [f"({_escape(line)}) Tj", "T*"]
        ops.append("ET")
        if form_bytes:
            ops.append("/Fm1 Do")
        stream = "\n".join(ops).encode("latin-1")
        objects.append(b"<< /Length %d >>\nstream\n" % len(stream) + stream + b"\nendstream")
    objects.append(b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica /Encoding /WinAnsiEncoding >>")
    if form_bytes:
        body = (b"0 0 m 1 1 l S\n" * (form_bytes // 14 + 1))[:form_bytes]
        objects.append(b"<< /Type /XObject /Subtype /Form /BBox [0 0 612 792] /Length %d >>\nstream\n" % len(body)
                       + body + b"\nendstream")
    out = bytearray(b"%PDF-1.4\n%\xe2\xe3\xcf\xd3\n")
    offsets = []
    for number, body in enumerate(objects, start=1):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % number + body + b"\nendobj\n"
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    out += b"".join(b"%010d 00000 n \n" % o for o in offsets)
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objects) + 1, xref)
    return bytes(out)


def flate_bomb_pdf_bytes(unpacked: int) -> bytes:
    """A one-page PDF whose content stream is ``unpacked`` bytes of spaces, deflated (a few KiB on disk)."""
    import zlib

    stream = zlib.compress(b" " * unpacked, 9)
    objects = [b"<< /Type /Catalog /Pages 2 0 R >>", b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
               b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 4 0 R >>",
               b"<< /Length %d /Filter /FlateDecode >>\nstream\n" % len(stream) + stream + b"\nendstream"]
    out = bytearray(b"%PDF-1.4\n")
    offsets = []
    for number, body in enumerate(objects, start=1):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % number + body + b"\nendobj\n"
    xref = len(out)
    out += b"xref\n0 5\n0000000000 65535 f \n" + b"".join(b"%010d 00000 n \n" % o for o in offsets)
    out += b"trailer\n<< /Size 5 /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % xref
    return bytes(out)


def write_text_pdf(path: Path, pages: list[list[str]]) -> Path:
    path.write_bytes(text_pdf_bytes(pages))
    return path


def write_blank_pdf(path: Path, pages: int = 2) -> Path:
    """Pages with nothing to extract: what a scanned document looks like to a text extractor."""
    from pypdf import PdfWriter

    writer = PdfWriter()
    for _ in range(pages):
        writer.add_blank_page(width=612, height=792)
    with open(path, "wb") as f:
        writer.write(f)
    return path


def write_encrypted_pdf(path: Path, lines: list[str], password: str = "secret") -> Path:
    """A text PDF encrypted with a user password (RC4, which pypdf does without extra packages)."""
    import io

    from pypdf import PdfReader, PdfWriter

    writer = PdfWriter(clone_from=PdfReader(io.BytesIO(text_pdf_bytes([lines]))))
    writer.encrypt(user_password=password, owner_password=password + "-owner", algorithm="RC4-128")
    with open(path, "wb") as f:
        writer.write(f)
    return path


def write_docx(path: Path, paragraphs: list[str], table: list[list[str]] | None = None) -> Path:
    import docx

    document = docx.Document()
    for text in paragraphs:
        document.add_paragraph(text)
    if table:
        t = document.add_table(rows=len(table), cols=len(table[0]))
        for r, row in enumerate(table):
            for c, value in enumerate(row):
                t.cell(r, c).text = value
        document.add_paragraph("After the table.")
    document.save(str(path))
    return path
