"""Attachment benchmark (not a test): how fast each kind of document is read into text
(engine/documents.py), and what hitting each cap costs, on files generated here.

    python bench/documents.py [--repeat 3] [--tokenizer MODEL.gguf]

Prints one line per case (the best of --repeat runs) and writes bench/results/documents.json.
Text kinds are measured in MB/s of file, PDF and DOCX in pages (paragraphs) per second too.
With ``--tokenizer``: how many prompt tokens chats on the same ~5,600-token document share with the first
(the model's own chat template and tokenizer; no model is run), i.e. what a block store can reuse.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
import time
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from engine import documents  # noqa: E402
from engine.errors import AttachmentError  # noqa: E402
from tests.document_files import write_docx, write_text_pdf  # noqa: E402

log = logging.getLogger("bench.documents")
LINE = "The quick brown fox jumps over the lazy dog while Hearth keeps every context it computed. "


def make_files(d: Path) -> dict[str, tuple[Path, int]]:
    """name -> (path, units): units are pages for the PDF, paragraphs for the DOCX, else 0."""
    out: dict[str, tuple[Path, int]] = {}
    body = (LINE * 1) + "\n"
    text = d / "big.txt"
    text.write_text(body * 20_000)  # ~1.8 MB: under the 2,000,000-character cap
    out["text 1.8 MB"] = (text, 0)
    md = d / "notes.md"
    md.write_text(("# Heading\n\n* " + body) * 18_000)
    out["markdown 1.9 MB"] = (md, 0)
    code = d / "module.py"
    code.write_text("def f(x):\n    return x * 2  # doubles\n" * 45_000)
    out["code 1.8 MB"] = (code, 0)
    csv = d / "table.csv"
    csv.write_text("id,name,amount,note\n" + "".join(f"{i},item {i},{i * 3.5},{LINE[:40]}\n" for i in range(25_000)))
    out["csv 1.8 MB"] = (csv, 0)
    js = d / "data.json"
    js.write_text(json.dumps([{"id": i, "name": f"item {i}", "tags": ["a", "b"], "note": LINE} for i in range(11_000)]))
    out["json 1.7 MB"] = (js, 0)
    html = d / "page.html"
    html.write_text("<html><head><style>p{}</style><script>var x=1;</script></head><body>"
                    + "<div><h2>Part</h2><p>" + LINE + "</p><table><tr><td>a</td><td>b</td></tr></table></div>" * 10_000
                    + "</body></html>")
    out["html 0.5 MB, tag-dense (a tag every ~15 bytes)"] = (html, 0)
    prose = d / "article.html"
    prose.write_text("<html><body>" + ("<p>" + LINE * 20 + "</p>\n") * 1000 + "</body></html>")
    out["html 1.8 MB, prose"] = (prose, 0)
    for pages in (100, 1000):
        pdf = write_text_pdf(d / f"doc{pages}.pdf", [[f"{p}: {LINE}"] * 18 for p in range(pages)])
        out[f"pdf {pages} pages"] = (pdf, pages)
    paragraphs = 5000
    docx = write_docx(d / "report.docx", [LINE * 2] * paragraphs, [["name", "value"]] + [[f"r{i}", str(i)]
                                                                                         for i in range(200)])
    out[f"docx {paragraphs} paragraphs + a 201-row table"] = (docx, paragraphs)
    return out


def make_caps(d: Path) -> dict[str, tuple[Path, dict]]:
    """Files that hit each cap, with the caps they are read under."""
    out: dict[str, tuple[Path, dict]] = {}
    big = d / "over.txt"
    with open(big, "wb") as f:
        f.truncate(documents.MAX_FILE_BYTES + 1)  # sparse: refused by its size before a byte is read
    out[f"file over {documents.MAX_FILE_BYTES >> 20} MiB"] = (big, {})
    chars = d / "chars.txt"
    chars.write_text("x" * (documents.MAX_TEXT_CHARS + 1))
    out[f"text over {documents.MAX_TEXT_CHARS:,} characters"] = (chars, {})
    pdf = write_text_pdf(d / "pages.pdf", [[f"page {p}"] for p in range(documents.MAX_PDF_PAGES + 1)])
    out[f"pdf of {documents.MAX_PDF_PAGES + 1:,} pages"] = (pdf, {})
    bomb = write_docx(d / "bomb.docx", ["tiny"])
    with zipfile.ZipFile(bomb, "a", compression=zipfile.ZIP_DEFLATED) as z:
        with z.open("word/padding.xml", "w", force_zip64=True) as member:
            block = b"\0" * (1 << 20)
            for _ in range((documents.MAX_DOCX_UNPACKED_BYTES >> 20) + 1):
                member.write(block)
    out[f"docx unpacking past {documents.MAX_DOCX_UNPACKED_BYTES >> 20} MiB ({bomb.stat().st_size >> 10} KiB file)"] = (
        bomb, {})
    return out


def prefix_sharing(gguf_path: Path) -> dict:
    """Prompt tokens of four chats on one document (system prompt, then the files and a question), and how
    many each shares with the first."""
    from engine.model.gguf_file import GGUFModel
    from engine.text.builtin_templates import template_for
    from engine.text.tokenizer import Tokenizer

    gguf = GGUFModel(gguf_path)
    tokenizer = Tokenizer.from_gguf(gguf)
    template = template_for(gguf, tokenizer)
    para = LINE * 2
    doc = documents.attachment_from_text("report.md", "\n\n".join(f"## Section {i}\n{para}" for i in range(150)),
                                         "markdown")
    questions = ("What does section 3 say?", "Summarise the report in one line.", "Is anything repeated?",
                 "1. List the headings")
    ids = [tokenizer.encode(template.render([{"role": "system", "content": "You are a helpful assistant."},
                                             {"role": "user", "content": documents.compose_message(q, [doc])}]))
           for q in questions]

    def common(a: list[int], b: list[int]) -> int:
        n = 0
        while n < min(len(a), len(b)) and a[n] == b[n]:
            n += 1
        return n

    return {"model": gguf_path.name, "document_tokens": len(tokenizer.encode(documents.attachment_block(doc))),
            "prompt_tokens": [len(i) for i in ids], "shared_with_first": [common(ids[0], i) for i in ids[1:]]}


def best_of(repeat: int, fn) -> tuple[float, object]:
    best, result = float("inf"), None
    for _ in range(repeat):
        started = time.perf_counter()
        try:
            result = fn()
        except AttachmentError as exc:
            result = exc
        best = min(best, time.perf_counter() - started)
    return best, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--tokenizer", type=Path, metavar="MODEL.gguf", help="also measure prompt-prefix sharing")
    args = parser.parse_args()
    results: dict[str, dict] = {"reading": {}, "caps": {}}
    with tempfile.TemporaryDirectory(prefix="hearth-docs-") as tmp:
        d = Path(tmp)
        for name, (path, units) in make_files(d).items():
            seconds, a = best_of(args.repeat, lambda p=path: documents.read_attachment(p))
            if isinstance(a, AttachmentError):
                raise SystemExit(f"{name}: refused: {a}")
            size = path.stat().st_size
            row = {"file_bytes": size, "chars": len(a.text), "s": round(seconds, 4),
                   "mb_per_s": round(size / seconds / 1e6, 1)}
            if units:
                row["units_per_s"] = round(units / seconds)
            results["reading"][name] = row
            per = f", {row['units_per_s']:,} {'pages' if 'pdf' in name else 'paragraphs'}/s" if units else ""
            print(f"{name:<45} {size / 1e6:7.2f} MB  {seconds * 1000:8.1f} ms  {row['mb_per_s']:7.1f} MB/s{per}")
        for name, (path, caps) in make_caps(d).items():
            seconds, err = best_of(args.repeat, lambda p=path, c=caps: documents.read_attachment(p, **c))
            reason = err.reason if isinstance(err, AttachmentError) else "read"
            results["caps"][name] = {"reason": reason, "s": round(seconds, 4), "message": str(err)}
            print(f"refused: {name:<60} {seconds * 1000:8.1f} ms  ({reason}: {err})")
    if args.tokenizer is not None:
        shared = results["prefix"] = prefix_sharing(args.tokenizer)
        print(f"prefix sharing ({shared['model']}): document block {shared['document_tokens']:,} tokens; prompts "
              f"{shared['prompt_tokens']}; shared with chat 1: {shared['shared_with_first']}")
    out = ROOT / "bench" / "results"
    out.mkdir(exist_ok=True)
    (out / "documents.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
