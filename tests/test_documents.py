"""Documents attached to messages (engine/documents.py): every kind read from a real file made here, every
refusal fed the file that causes it, the one message format, and real turns on the tiny model."""

from __future__ import annotations

import hashlib
import zipfile
from pathlib import Path

import pytest

from engine.api import (
    MAX_ATTACHMENTS,
    Attachment,
    AttachmentError,
    attachment_block,
    attachment_from_text,
    compose_message,
    read_attachment,
)
from engine.documents import REASONS, clean_name, html_text, kind_for
from engine.errors import HearthError, PromptError
from engine.types import SamplingParams, TurnRequest

from .document_files import flate_bomb_pdf_bytes, text_pdf_bytes, write_blank_pdf, write_docx, write_encrypted_pdf, write_text_pdf

GREEDY = SamplingParams.greedy_params()


def refused(path: Path, reason: str, **caps) -> AttachmentError:
    with pytest.raises(AttachmentError) as info:
        read_attachment(path, **caps)
    err = info.value
    assert err.reason == reason and err.reason in REASONS
    assert isinstance(err, HearthError)
    assert path.name in str(err)  # the message names the file
    return err


# the kinds ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("name", "kind"), [
    ("notes.txt", "text"), ("README.md", "markdown"), ("main.py", "code"), ("lib.rs", "code"),
    ("Makefile", "code"), ("data.csv", "csv"), ("table.tsv", "csv"), ("config.json", "json"),
    ("page.html", "html"), ("paper.pdf", "pdf"), ("report.docx", "docx"), ("no_extension", "text"),
    ("photo.PNG", None), ("sheet.xlsx", None),
])
def test_the_kind_comes_from_the_extension(name, kind):
    assert kind_for(name) == kind


def test_plain_text_is_read_with_its_size_and_hash(tmp_path):
    data = b"first line\r\nsecond line\r\n"
    path = tmp_path / "notes.txt"
    path.write_bytes(data)
    a = read_attachment(path)
    assert a == Attachment("notes.txt", len(data), hashlib.sha256(data).hexdigest(), "text",
                           "first line\nsecond line\n")
    path.unlink()  # nothing depends on the file staying where it was
    assert "second line" in compose_message("?", [a])


@pytest.mark.parametrize(("name", "body", "kind"), [
    ("a.md", "# Title\n\n* item\n", "markdown"), ("b.py", "def f():\n    return 1\n", "code"),
    ("c.csv", "name,age\nann,3\n", "csv"), ("d.json", '{"a": [1, 2],\n "b": null}', "json"),
])
def test_text_kinds_keep_their_text_as_written(tmp_path, name, body, kind):
    path = tmp_path / name
    path.write_text(body, encoding="utf-8")
    a = read_attachment(path)
    assert (a.kind, a.text, a.pages) == (kind, body, None)  # JSON as written: not re-formatted


def test_html_keeps_the_text_and_drops_scripts_and_styles(tmp_path):
    path = tmp_path / "page.html"
    path.write_text("<html><head><title>T</title><style>p{color:red}</style><script>alert('x')</script></head>"
                    "<body><h1>Heading</h1><p>One &amp; two</p><p>Three</p><table><tr><td>a</td><td>b</td></tr>"
                    "</table></body></html>", encoding="utf-8")
    a = read_attachment(path)
    assert a.kind == "html"
    assert "alert" not in a.text and "color" not in a.text
    assert a.text.splitlines() == ["T", "", "Heading", "", "One & two", "", "Three", "", "a b"]
    assert html_text("<p>x</p><script>never</script>") == "x"


@pytest.mark.parametrize(("bom", "encoding"), [(b"\xef\xbb\xbf", "utf-8"), (b"\xff\xfe", "utf-16-le"),
                                               (b"\xfe\xff", "utf-16-be")])
def test_utf8_with_a_bom_and_utf16_with_a_bom_are_read(tmp_path, bom, encoding):
    path = tmp_path / "t.txt"
    path.write_bytes(bom + "Grüße, 世界\n".encode(encoding))
    assert read_attachment(path).text == "Grüße, 世界\n"


def test_a_text_pdf_is_read_page_by_page(tmp_path):
    path = write_text_pdf(tmp_path / "paper.pdf", [["Hearth reads (PDF) text", "line two"], ["Page two"]])
    a = read_attachment(path)
    assert (a.kind, a.pages) == ("pdf", 2)
    assert a.text == "Hearth reads (PDF) text\nline two\n\nPage two"
    assert a.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_pdf_encrypted_with_an_empty_password_is_read(tmp_path):
    path = write_encrypted_pdf(tmp_path / "open.pdf", ["readable by anyone"], password="")
    assert read_attachment(path).text == "readable by anyone"


def test_a_docx_gives_its_paragraphs_and_tables_in_order(tmp_path):
    path = write_docx(tmp_path / "report.docx", ["Intro paragraph.", "Second."], [["Name", "Qty"], ["bolts", "12"]])
    a = read_attachment(path)
    assert a.kind == "docx"
    assert a.text == "Intro paragraph.\nSecond.\nName | Qty\nbolts | 12\nAfter the table."


# every refusal, fed the file that causes it -----------------------------------------------------------------------
def test_a_file_over_the_size_cap_is_refused_before_it_is_read(tmp_path):
    path = tmp_path / "big.txt"
    path.write_text("x" * 2000)
    err = refused(path, "too_large", max_bytes=1000)
    assert "1,000 bytes" in str(err)
    assert read_attachment(path, max_bytes=2000).size == 2000


def test_html_over_its_own_cap_is_refused(tmp_path):
    path = tmp_path / "huge.html"
    path.write_text("<p>" + "x" * 3000 + "</p>")
    assert "HTML" in str(refused(path, "too_large", max_html=2000))
    assert read_attachment(path, max_html=4000).text == "x" * 3000


def test_text_over_the_character_cap_is_refused(tmp_path):
    path = tmp_path / "long.md"
    path.write_text("y" * 501)
    assert "500" in str(refused(path, "too_large", max_chars=500))


def test_a_pdf_over_the_page_cap_is_refused(tmp_path):
    path = write_text_pdf(tmp_path / "many.pdf", [[f"page {i}"] for i in range(5)])
    assert "5 pages" in str(refused(path, "too_large", max_pages=4))
    assert read_attachment(path, max_pages=5).pages == 5


def test_a_pdf_whose_text_runs_past_the_cap_stops_there(tmp_path):
    path = write_text_pdf(tmp_path / "wordy.pdf", [["w" * 80] * 10] * 3)
    refused(path, "too_large", max_chars=1000)


def test_a_pdf_page_with_too_many_drawing_instructions_is_refused_before_extraction(tmp_path):
    from engine.documents import MAX_PDF_PAGE_CONTENT_BYTES

    lines = ["x" * 90] * (MAX_PDF_PAGE_CONTENT_BYTES // 96 + 100)  # one page of text past the cap
    err = refused(write_text_pdf(tmp_path / "dense.pdf", [["page one"], lines]), "too_large")
    assert "page 2 holds" in str(err) and "2 MiB" in str(err)
    # the same through a form XObject the page draws (what extraction walks too)
    form = tmp_path / "form.pdf"
    form.write_bytes(text_pdf_bytes([["text"]], form_bytes=MAX_PDF_PAGE_CONTENT_BYTES + 10))
    assert "page 1 holds" in str(refused(form, "too_large"))
    small = tmp_path / "small-form.pdf"
    small.write_bytes(text_pdf_bytes([["drawn beside a form"]], form_bytes=1000))
    assert read_attachment(small).text == "drawn beside a form"


def test_a_pdf_whose_pages_together_draw_too_much_is_refused_before_extraction(tmp_path):
    import time

    from engine.documents import MAX_PDF_CONTENT_BYTES, MAX_PDF_PAGE_CONTENT_BYTES

    per_page = MAX_PDF_PAGE_CONTENT_BYTES - 4096
    path = tmp_path / "heavy.pdf"
    path.write_bytes(text_pdf_bytes([["p"]] * (MAX_PDF_CONTENT_BYTES // per_page + 1), form_bytes=per_page))
    started = time.perf_counter()
    err = refused(path, "too_large")
    assert "16 MiB" in str(err)
    assert time.perf_counter() - started < 5  # sized, not extracted: extraction would take a minute


def test_a_pdf_stream_that_unpacks_past_pypdfs_limit_is_refused(tmp_path):
    import pypdf

    path = tmp_path / "bomb.pdf"
    path.write_bytes(flate_bomb_pdf_bytes(pypdf.filters.ZLIB_MAX_OUTPUT_LENGTH + (1 << 20)))
    assert path.stat().st_size < 1 << 20
    assert "unpacks to more than" in str(refused(path, "too_large"))


def test_a_docx_that_unpacks_past_the_cap_is_refused_before_it_is_opened(tmp_path):
    path = write_docx(tmp_path / "bomb.docx", ["tiny"])
    with zipfile.ZipFile(path, "a", compression=zipfile.ZIP_DEFLATED) as z:
        z.writestr("word/padding.xml", b"\0" * (4 << 20))  # compresses to a few KiB
    assert path.stat().st_size < 1 << 20
    err = refused(path, "too_large", max_unpacked=2 << 20)
    assert "2 MiB" in str(err)


def test_a_docx_with_too_much_xml_is_refused_before_it_is_parsed(tmp_path):
    from engine.documents import MAX_DOCX_XML_BYTES

    path = write_docx(tmp_path / "bloated.docx", ["tiny"])
    with zipfile.ZipFile(path, "a", compression=zipfile.ZIP_DEFLATED) as z:
        z.writestr("word/bloat.xml", b" " * (MAX_DOCX_XML_BYTES + 1))
    assert "bytes of XML" in str(refused(path, "too_large"))


def test_a_docx_with_too_many_parts_is_refused(tmp_path):
    from engine.documents import MAX_DOCX_MEMBERS

    path = write_docx(tmp_path / "parts.docx", ["tiny"])
    with zipfile.ZipFile(path, "a") as z:
        for i in range(MAX_DOCX_MEMBERS):
            z.writestr(f"customXml/p{i}.bin", b"")
    assert f"{MAX_DOCX_MEMBERS:,}" in str(refused(path, "too_large"))


def test_an_encrypted_pdf_is_refused(tmp_path):
    err = refused(write_encrypted_pdf(tmp_path / "locked.pdf", ["secret"]), "encrypted")
    assert "password" in str(err)


def test_an_encrypted_docx_is_refused(tmp_path):
    path = tmp_path / "locked.docx"  # Office keeps an encrypted document in an OLE compound file
    path.write_bytes(b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1" + b"\0" * 1000)
    refused(path, "encrypted")


def test_a_pdf_of_images_only_is_refused(tmp_path):
    err = refused(write_blank_pdf(tmp_path / "scan.pdf"), "image_only")
    assert "images" in str(err)


def test_binary_data_is_refused(tmp_path):
    path = tmp_path / "blob.dat"
    path.write_bytes(bytes(range(256)) * 8)
    refused(path, "binary")
    controls = tmp_path / "controls.txt"  # no NUL, but control characters no text has
    controls.write_bytes(b"ab\x01\x02\x03\x04\x05\x06cd" * 50)
    refused(controls, "binary")


def test_a_log_with_terminal_colours_is_text(tmp_path):
    path = tmp_path / "build.log"
    path.write_bytes(b"\x1b[32mok\x1b[0m step\n" * 200)
    assert read_attachment(path).text.startswith("\x1b[32mok")


def test_text_in_another_encoding_is_refused_not_guessed(tmp_path):
    path = tmp_path / "latin1.txt"
    path.write_bytes("café crème, déjà vu\n".encode("latin-1"))
    err = refused(path, "encoding")
    assert "UTF-8" in str(err)
    broken16 = tmp_path / "broken16.txt"  # a BOM, then a lone surrogate
    broken16.write_bytes(b"\xff\xfe" + "ok".encode("utf-16-le") + b"\x00\xd8")
    refused(broken16, "encoding")


def test_an_empty_file_is_refused(tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_bytes(b"")
    refused(empty, "empty")
    blank = tmp_path / "blank.md"
    blank.write_text("  \n\n\t\n")
    refused(blank, "empty")


def test_formats_hearth_does_not_read_are_refused_by_name(tmp_path):
    path = tmp_path / "photo.png"
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + b"\0" * 100)
    err = refused(path, "unsupported")
    assert ".png" in str(err) and "PDF" in str(err)


def test_files_that_cannot_be_read_are_refused(tmp_path):
    refused(tmp_path / "missing.txt", "unreadable")
    folder = tmp_path / "folder.txt"
    folder.mkdir()
    refused(folder, "unreadable")
    fake_pdf = tmp_path / "fake.pdf"
    fake_pdf.write_bytes(b"%PDF-1.4\n this is not a real PDF at all \n%%EOF")
    refused(fake_pdf, "unreadable")
    fake_docx = tmp_path / "fake.docx"
    fake_docx.write_bytes(b"PK but no zip")
    refused(fake_docx, "unreadable")
    not_word = tmp_path / "other.docx"  # a real zip that is not a Word package
    with zipfile.ZipFile(not_word, "w") as z:
        z.writestr("hello.txt", "hi")
    refused(not_word, "unreadable")


def test_a_truncated_pdf_is_refused_or_read_but_never_crashes(tmp_path):
    data = text_pdf_bytes([["first page text"], ["second page text"]])
    for cut in (len(data) // 3, len(data) // 2, len(data) - 40):
        path = tmp_path / f"cut{cut}.pdf"
        path.write_bytes(data[:cut])
        try:
            a = read_attachment(path)
        except AttachmentError as err:
            assert err.reason in ("unreadable", "image_only")
        else:
            assert "page text" in a.text


def test_more_than_the_cap_of_attachments_is_refused():
    files = [attachment_from_text(f"f{i}.txt", f"text {i}") for i in range(MAX_ATTACHMENTS + 1)]
    assert compose_message("q", files[:MAX_ATTACHMENTS])
    with pytest.raises(AttachmentError) as info:
        compose_message("q", files)
    assert info.value.reason == "too_many" and str(MAX_ATTACHMENTS) in str(info.value)


def test_attachment_from_text_checks_what_it_is_given():
    a = attachment_from_text("pasted.txt", "some\r\npasted text")
    assert (a.text, a.size, a.sha256) == ("some\npasted text", 17, hashlib.sha256(b"some\r\npasted text").hexdigest())
    with pytest.raises(AttachmentError) as info:
        attachment_from_text("x.txt", "a\x00b")
    assert info.value.reason == "binary"
    with pytest.raises(AttachmentError) as info:
        attachment_from_text("x.txt", " \n ")
    assert info.value.reason == "empty"
    with pytest.raises(ValueError, match="kind"):
        attachment_from_text("x.txt", "text", kind="spreadsheet")


def test_a_name_cannot_break_the_format():
    assert clean_name("/home/me/a\nb].txt") == "a?b].txt"
    assert clean_name("C:\\docs\\x.txt") == "x.txt"
    assert len(clean_name("n" * 1000)) == 255


# the one message format ---------------------------------------------------------------------------------------
def test_the_message_is_the_files_then_the_typed_text():
    a = attachment_from_text("a.txt", "alpha\n")
    b = attachment_from_text("b.md", "# beta", "markdown")
    assert attachment_block(a) == "[File: a.txt]\nalpha\n[End of file: a.txt]"
    assert compose_message("What differs?", [a, b]) == (
        "[File: a.txt]\nalpha\n[End of file: a.txt]\n\n[File: b.md]\n# beta\n[End of file: b.md]\n\nWhat differs?")
    assert compose_message("", [a]) == "[File: a.txt]\nalpha\n[End of file: a.txt]"
    assert compose_message("plain", []) == "plain"
    # the same files start every message that carries them: chats on them share a prompt prefix
    assert compose_message("other question", [a, b]).startswith(compose_message("", [a, b]))
    assert compose_message("What differs?", [a, b]) == compose_message("What differs?", (a, b))


# real turns on the tiny model ---------------------------------------------------------------------------------
def test_a_turn_with_an_attachment_stores_it_and_answers(hearth, tmp_path):
    path = tmp_path / "facts.md"
    path.write_text("The capital is Paris.\n")
    doc = read_attachment(path)
    done = hearth.run_turn(TurnRequest("d1", "What is the capital?", GREEDY, 6, attachments=(doc,)), create=True)
    assert done.reply
    user, reply = hearth.conversations.messages("d1")
    assert user.content == compose_message("What is the capital?", [doc])
    assert (user.attachments, user.typed_text) == ((doc,), "What is the capital?")
    assert (reply.content, reply.attachments, reply.typed_text) == (done.reply, (), done.reply)
    assert hearth.conversations.get("d1").title == "What is the capital?"
    # the reply is exactly the reply to the composed text typed in by hand
    same = hearth.run_turn(TurnRequest("d2", compose_message("What is the capital?", [doc]), GREEDY, 6), create=True)
    assert same.reply == done.reply


def test_a_message_of_files_alone_is_a_message(hearth):
    doc = attachment_from_text("only.txt", "just a file")
    hearth.run_turn(TurnRequest("d3", "", GREEDY, 3, attachments=(doc,)), create=True)
    user = hearth.conversations.messages("d3")[0]
    assert (user.content, user.typed_text) == (compose_message("", [doc]), "")
    assert hearth.conversations.get("d3").title == "only.txt"


def test_bad_attachment_turns_store_nothing(hearth):
    docs = tuple(attachment_from_text(f"f{i}.txt", "x") for i in range(MAX_ATTACHMENTS + 1))
    with pytest.raises(AttachmentError) as info:
        hearth.run_turn(TurnRequest("d4", "q", GREEDY, 3, attachments=docs), create=True)
    assert info.value.reason == "too_many"
    with pytest.raises(PromptError, match="new message"):
        hearth.run_turn(TurnRequest("d4", None, GREEDY, 3, attachments=docs[:1]), create=True)
    assert hearth.conversations.get("d4") is None
    big = attachment_from_text("big.txt", "word " * 2000)
    with pytest.raises(PromptError, match="tokens, but the model reads at most"):
        hearth.run_turn(TurnRequest("d4", "q", GREEDY, 3, attachments=(big,)), create=True)
    assert hearth.conversations.get("d4") is None


def test_count_tokens_counts_what_the_model_reads(hearth):
    doc = attachment_from_text("c.txt", "one two three four five six")
    whole = hearth.count_tokens(compose_message("and a question", [doc]))
    alone = hearth.count_tokens(attachment_block(doc))
    assert 0 < alone < whole
    assert hearth.count_tokens("") == 0


def test_pdf_bytes_in_memory_are_not_needed_later(tmp_path):
    path = write_text_pdf(tmp_path / "gone.pdf", [["kept text"]])
    a = read_attachment(path)
    path.write_bytes(b"changed")
    assert a.text == "kept text" and a.size == len(text_pdf_bytes([["kept text"]]))


def test_a_bundle_carries_the_attachments_and_import_keeps_them(hearth, tmp_path, tiny_dir, tiny_gguf):
    from engine.api import Hearth, bundles, resolve_paths
    from engine.transfer import to_document

    doc = read_attachment(write_docx(tmp_path / "brief.docx", ["The brief.", "Two lines."]))
    hearth.run_turn(TurnRequest("b1", "summarise", GREEDY, 4, attachments=(doc,)), create=True)
    path = tmp_path / "out.hearth"
    bundles(hearth).export_bundle(path, to_document(hearth.conversations, ["b1"]), ["b1"])
    home = tmp_path / "elsewhere"
    home.mkdir()
    (home / "converted").symlink_to(tiny_dir / "converted")
    other = Hearth(resolve_paths(home).ensure(), model=str(tiny_gguf), provider="cpu")
    try:
        imported = bundles(other).import_bundle(path)
        (new,) = imported.conversations
        user = other.conversations.messages(new)[0]
        assert (user.attachments, user.typed_text) == ((doc,), "summarise")
        assert user.content == hearth.conversations.messages("b1")[0].content
    finally:
        other.close()
