"""Documents in the window (the tiny model: 256 tokens of context): files dropped on the message box, pasted,
or chosen with the paperclip become chips with their token counts; a file that cannot be read is refused
with its reason and nothing is attached or sent; sending stores the files with the message and the
transcript shows each as a collapsed block that expands to its text; "New chat with these documents"
fills a new chat's message box from what is stored. Real files (a PDF and a DOCX made here), the real
engine thread, real SQLite, real widgets."""

from __future__ import annotations

import io
import os
from pathlib import Path

import pytest
from PySide6.QtCore import QMimeData, QPointF, Qt, QUrl
from PySide6.QtGui import QDragEnterEvent, QDropEvent, QGuiApplication
from PySide6.QtWidgets import QFileDialog, QToolButton

from app.attachment_block import DISPLAY_CHARS
from app.attachment_text import total_text
from app.browser import MENU_ACTIONS
from app.main_window import MainWindow
from engine.api import MAX_ATTACHMENTS, MAX_FILE_BYTES, attachment_block, attachment_from_text

from .qt_helpers import TIMEOUT, use_settings, wait_idle

SHOTS = Path("/tmp/i29-shots")
NOTE = "The heron nests by the mill pond. Its eggs hatch in May."
QUICK = {"temperature": 0.0, "max_new_tokens": 4}


def mime_with(paths) -> QMimeData:
    mime = QMimeData()
    mime.setUrls([QUrl.fromLocalFile(str(p)) for p in paths])
    return mime


def drop_files(w: MainWindow, paths) -> None:
    """Drag the files over the message box and drop them, as a file manager does."""
    mime = mime_with(paths)
    actions, buttons, mods = Qt.DropAction.CopyAction, Qt.MouseButton.LeftButton, Qt.KeyboardModifier.NoModifier
    enter = QDragEnterEvent(QPointF(10, 10).toPoint(), actions, mime, buttons, mods)
    w.composer.dragEnterEvent(enter)
    assert enter.isAccepted()
    w.composer.dropEvent(QDropEvent(QPointF(10, 10), actions, mime, buttons, mods))


def chips_ready(w: MainWindow, n: int):
    """Until ``n`` chips show their token counts (read on the reader's thread, counted on the engine's)."""
    return lambda: (len(w.tray.chips) == n and not w.chat.attachments.reading
                    and all(c.tokens.text().endswith("tokens") for c in w.tray.chips.values()))


def counted(w: MainWindow, text: str) -> int:
    """The tokens of ``text`` on the loaded model (asked between turns: the engine thread is idle)."""
    return w.worker.hearth.count_tokens(text)


@pytest.fixture
def note(tmp_path) -> Path:
    path = tmp_path / "heron notes.txt"
    path.write_text(NOTE + "\n", encoding="utf-8")
    return path


def test_a_dropped_file_is_a_chip_with_its_name_and_tokens_and_the_x_removes_it(qtbot, windows, note, tmp_path):
    w = windows()
    w.new_chat()
    drop_files(w, [note])
    chip = next(iter(w.tray.chips.values()))
    assert chip.tokens.text() in ("reading…", "counting…") or chip.tokens.text().endswith("tokens")
    qtbot.waitUntil(chips_ready(w, 1), timeout=TIMEOUT)
    (attachment,) = w.chat.attachments.attachments()
    assert attachment.name == "heron notes.txt" and attachment.text.strip() == NOTE
    assert chip.label.text() == "heron notes.txt"
    tokens = counted(w, attachment_block(attachment))
    assert chip.tokens.text() == f"{tokens:,} tokens"
    assert w.tray.isVisible() and w.tray.total.text().startswith(f"≈{tokens:,} tokens with your message")
    assert "the context holds 256" in w.tray.total.text()
    # a model file dropped on the message box is left to the window (it adds models to the library)
    model = tmp_path / "other.gguf"
    model.write_bytes(b"GGUF")
    mime = mime_with([model])
    enter = QDragEnterEvent(QPointF(5, 5).toPoint(), Qt.DropAction.CopyAction, mime, Qt.MouseButton.LeftButton,
                            Qt.KeyboardModifier.NoModifier)
    w.composer.dragEnterEvent(enter)
    assert not enter.isAccepted() and len(w.tray.chips) == 1
    # the × removes it; so does Delete on the focused chip
    qtbot.mouseClick(chip.remove_button, Qt.MouseButton.LeftButton)
    assert not w.tray.chips and not w.chat.attachments.attachments() and not w.tray.isVisible()
    drop_files(w, [note])
    qtbot.waitUntil(chips_ready(w, 1), timeout=TIMEOUT)
    again = next(iter(w.tray.chips.values()))
    assert again.remove_button.accessibleName() == "Remove the attachment heron notes.txt"
    drop_files(w, [note])  # the same file again: attached once
    qtbot.waitUntil(lambda: "heron notes.txt is attached already." in w.tray.problem.text(), timeout=TIMEOUT)
    assert list(w.tray.chips.values()) == [again] and len(w.chat.attachments.attachments()) == 1
    again.setFocus()
    qtbot.keyClick(again, Qt.Key.Key_Delete)
    assert not w.tray.chips


def test_a_pasted_file_is_attached_and_a_pasted_text_stays_text(qtbot, windows, note):
    w = windows()
    w.new_chat()
    QGuiApplication.clipboard().setMimeData(mime_with([note]))
    w.composer.setFocus()
    w.composer.paste()
    qtbot.waitUntil(chips_ready(w, 1), timeout=TIMEOUT)
    assert w.composer.toPlainText() == ""  # the file, not its path
    long_text = "word " * 20_000
    QGuiApplication.clipboard().setText(long_text)
    w.composer.paste()
    assert w.composer.toPlainText() == long_text and len(w.tray.chips) == 1


def test_the_paperclip_reads_the_chosen_files_and_remembers_the_folder(qtbot, windows, note, tmp_path):
    from docx import Document

    w = windows()
    w.new_chat()
    doc = Document()
    doc.add_paragraph("Minutes of the pond society.")
    path = tmp_path / "minutes.docx"
    doc.save(str(path))
    dialog = w.chat.choose_files()
    assert isinstance(dialog, QFileDialog) and dialog.fileMode() == QFileDialog.FileMode.ExistingFiles
    dialog.setDirectory(str(tmp_path))
    dialog.filesSelected.emit([str(note), str(path)])
    dialog.close()
    qtbot.waitUntil(chips_ready(w, 2), timeout=TIMEOUT)
    names = [a.name for a in w.chat.attachments.attachments()]
    assert names == ["heron notes.txt", "minutes.docx"]
    assert w.chat.attachments.attachments()[1].text.strip() == "Minutes of the pond society."
    assert Path(w.settings.value("attach_folder")) == tmp_path
    assert w.chat.choose_files().directory().absolutePath() == str(tmp_path)  # where it was last


def test_a_file_that_cannot_be_read_is_refused_with_its_reason_and_nothing_is_sent(qtbot, windows, tmp_path):
    w = windows()
    conv = w.new_chat()
    use_settings(w, QUICK)
    binary = tmp_path / "data.txt"
    binary.write_bytes(bytes(range(256)) * 64)
    drop_files(w, [binary])
    qtbot.waitUntil(lambda: w.tray.problem.text() != "", timeout=TIMEOUT)
    assert not w.tray.chips and not w.chat.attachments.attachments()
    assert w.tray.problem.text().startswith("⚠ data.txt cannot be attached: ")
    assert w.tray.problem.isVisible()
    huge = tmp_path / "huge.log"
    with huge.open("wb") as f:  # sparse: larger than the cap without writing it
        f.truncate(MAX_FILE_BYTES + 1)
    drop_files(w, [huge])
    qtbot.waitUntil(lambda: "huge.log" in w.tray.problem.text(), timeout=TIMEOUT)
    assert "32 MiB" in w.tray.problem.text() and not w.tray.chips
    SHOTS.mkdir(exist_ok=True)
    w.chat.grab().save(str(SHOTS / "composer-refused-file.png"))
    # Enter with nothing typed and nothing attached sends nothing
    w.composer.setFocus()
    qtbot.keyClick(w.composer, Qt.Key.Key_Return)
    assert not w.turns.running() and w.store.messages(conv) == []
    # an image-only PDF (a page with no text) is refused too, with its reason
    from pypdf import PdfWriter

    blank = PdfWriter()
    blank.add_blank_page(200, 200)
    buf = io.BytesIO()
    blank.write(buf)
    pdf = tmp_path / "scan.pdf"
    pdf.write_bytes(buf.getvalue())
    drop_files(w, [pdf, binary])  # both refused: each reason on its own line
    qtbot.waitUntil(lambda: w.tray.problem.text().count("\n") == 1, timeout=TIMEOUT)
    assert w.tray.problem.text().startswith("⚠ scan.pdf cannot be attached")
    assert w.tray.problem.text().split("\n")[1].startswith("⚠ data.txt cannot be attached")
    assert not w.tray.chips and w.store.messages(conv) == []
    # a folder, and a file gone before it was read
    folder = tmp_path / "a folder"
    folder.mkdir()
    drop_files(w, [folder, tmp_path / "gone.txt"])
    qtbot.waitUntil(lambda: w.tray.problem.text().count("\n") == 1, timeout=TIMEOUT)
    assert "a folder" in w.tray.problem.text().split("\n")[0] and "gone.txt" in w.tray.problem.text().split("\n")[1]
    assert not w.tray.chips and w.store.messages(conv) == []


def test_more_files_than_a_message_holds_are_not_attached(qtbot, windows, tmp_path):
    w = windows()
    w.new_chat()
    paths = []
    for i in range(MAX_ATTACHMENTS + 2):
        p = tmp_path / f"n{i}.txt"
        p.write_text(f"note {i}")
        paths.append(p)
    drop_files(w, paths)
    assert len(w.tray.chips) == MAX_ATTACHMENTS
    assert f"at most {MAX_ATTACHMENTS} attachments" in w.tray.problem.text()


def test_the_total_warns_when_the_message_will_not_fit(qtbot, windows, tmp_path):
    w = windows()
    w.new_chat()
    long = tmp_path / "long.md"
    long.write_text("\n".join(f"Line {i} of the long report about herons and their ponds." for i in range(80)))
    drop_files(w, [long])
    qtbot.waitUntil(chips_ready(w, 1), timeout=TIMEOUT)
    total = w.tray.total.text()
    assert total.startswith("⚠ ≈") and "more than the model reads at once (256)" in total
    assert "font-weight: bold" in w.tray.total.styleSheet()
    SHOTS.mkdir(exist_ok=True)
    w.chat.grab().save(str(SHOTS / "composer-too-long-warning.png"))
    # the words for a message that fits alone but not beside what the chat holds, under each policy
    assert total_text(100, 256, 200, None).text == ("⚠ ≈100 tokens with your message will not fit: the context "
                                                    "holds 256, 200 already used. If sent, it will be refused: "
                                                    "remove an attachment, or start a new chat with these documents.")
    assert "older messages will leave the model's view" in total_text(100, 256, 200, "drop_oldest").text
    assert total_text(100, 256, 20, None) == total_text(100, 256, 20, "stop")
    assert not total_text(100, 256, 20, None).warning
    assert total_text(100, None, 0, None).text == "≈100 tokens with your message"


def test_sending_stores_the_file_and_the_transcript_shows_a_collapsed_block_that_expands(qtbot, windows, note):
    w = windows()
    conv = w.new_chat()
    use_settings(w, QUICK)
    drop_files(w, [note])
    qtbot.waitUntil(chips_ready(w, 1), timeout=TIMEOUT)
    (attachment,) = w.chat.attachments.attachments()
    w.composer.setPlainText("Where does the heron nest?")
    both = counted(w, attachment_block(attachment)) + counted(w, "Where does the heron nest?")
    qtbot.waitUntil(lambda: w.tray.total.text().startswith(f"≈{both:,} tokens"), timeout=TIMEOUT)  # typed words count
    SHOTS.mkdir(exist_ok=True)
    w.chat.grab().save(str(SHOTS / "composer-with-chips.png"))
    qtbot.keyClick(w.composer, Qt.Key.Key_Return)
    assert not w.tray.chips and w.composer.toPlainText() == ""  # sent: the chips went with it
    wait_idle(qtbot, w)
    user = w.store.messages(conv)[0]
    assert user.attachments == (attachment,) and user.typed_text == "Where does the heron nest?"
    assert user.content.startswith("[File: heron notes.txt]\n" + NOTE)
    shown = w.transcript.messages[0]
    assert shown.text == user.content and shown.body.toPlainText() == "Where does the heron nest?"
    (block,) = shown.attachment_blocks
    assert not block.expanded and block.text_view is None  # collapsed: its text not even laid out
    assert block.toggle.text() == "heron notes.txt · text · 57 B"
    qtbot.mouseClick(block.toggle, Qt.MouseButton.LeftButton)
    assert block.expanded and block.text_view.isVisible() and block.shown_text() == attachment.text.rstrip("\n")
    assert block.text_view.isReadOnly()
    w.grab().save(str(SHOTS / "transcript-expanded-block.png"))
    qtbot.mouseClick(block.toggle, Qt.MouseButton.LeftButton)
    assert not block.text_view.isVisible()
    # a restart draws the same from the store
    windows.close(w)
    again = windows()
    qtbot.waitUntil(lambda: not again.transcript.loading and bool(again.transcript.messages), timeout=TIMEOUT)
    assert [b.attachment for b in again.transcript.messages[0].attachment_blocks] == [attachment]


def test_files_alone_are_sent_as_the_message(qtbot, windows, note):
    w = windows()
    conv = w.new_chat()
    use_settings(w, QUICK)
    drop_files(w, [note])
    qtbot.waitUntil(chips_ready(w, 1), timeout=TIMEOUT)
    qtbot.keyClick(w.composer, Qt.Key.Key_Return)
    wait_idle(qtbot, w)
    user = w.store.messages(conv)[0]
    assert user.typed_text == "" and user.content == attachment_block(user.attachments[0])
    assert not w.transcript.messages[0].body.isVisible()  # no typed words to show: only the block


def test_attachment_text_is_shown_as_plain_text_and_a_long_one_is_cut_until_show_all(qtbot):
    from app.attachment_block import AttachmentBlock

    html_like = attachment_from_text("page.html", "<b>bold?</b> <a href='x'>link</a>\n" + "x" * (DISPLAY_CHARS + 50))
    block = AttachmentBlock(html_like)
    qtbot.addWidget(block)
    block.set_expanded(True)
    shown = block.shown_text()
    assert shown.startswith("<b>bold?</b> <a href='x'>link</a>")  # the markup as characters, not rendered
    assert len(shown) == DISPLAY_CHARS and block.show_all is not None
    qtbot.mouseClick(block.show_all, Qt.MouseButton.LeftButton)
    assert block.shown_text() == html_like.text and block.show_all.isHidden()


def send_with_file(qtbot, w, path, words: str) -> None:
    """Attach ``path`` by dropping it on the composer, type ``words``, send, and wait for the reply."""
    use_settings(w, QUICK)
    drop_files(w, [path])
    qtbot.waitUntil(chips_ready(w, 1), timeout=TIMEOUT)
    w.composer.setPlainText(words)
    qtbot.keyClick(w.composer, Qt.Key.Key_Return)
    wait_idle(qtbot, w)


def test_new_chat_with_these_documents_fills_a_new_chats_message_box_from_the_store(qtbot, windows, note):
    w = windows()
    source = w.new_chat()
    w.store.set_system_prompt(source, "You answer about birds.")
    send_with_file(qtbot, w, note, "Where?")
    stored = w.store.messages(source)[0].attachments
    assert w.act_documents.isEnabled()  # Chat → New chat with these documents, for the chat shown
    os.remove(note)  # nothing is read again: the new chat takes the stored text
    button = w.transcript.messages[0].documents_button
    assert button is not None and button.isVisible()
    qtbot.mouseClick(button, Qt.MouseButton.LeftButton)
    target = w.current
    assert not w.act_documents.isEnabled()  # the new chat has no files of its own yet
    assert target != source and w.store.get(target).system_prompt == "You answer about birds."
    assert w.store.get(target).settings == w.store.get(source).settings
    assert w.chat.attachments.attachments() == stored and not w.tray.problem.text()
    qtbot.waitUntil(chips_ready(w, 1), timeout=TIMEOUT)
    w.composer.setPlainText("When do the eggs hatch?")
    qtbot.keyClick(w.composer, Qt.Key.Key_Return)
    wait_idle(qtbot, w)
    first = w.store.messages(target)[0]
    assert first.attachments == stored and first.typed_text == "When do the eggs hatch?"
    # the new chat's first message starts as the source's did: the files' blocks come first
    assert first.content.startswith(attachment_block(stored[0]))
    # from the browser: the selected chat's files, in a new chat of the window
    w.show_browser()
    b = w.browser
    rows = b.ids_shown()
    b.table.selectRow(rows.index(source))
    assert b.selected_ids() == [source]
    qtbot.waitUntil(lambda: not b.preview.loading, timeout=TIMEOUT)  # the newest messages are drawn first
    preview = b.preview.messages[0]
    assert [blk.attachment for blk in preview.attachment_blocks] == list(stored)
    assert preview.documents_button is None  # the preview is read only: the browser's action does it
    qtbot.wait(200)  # the preview's messages settle to their heights
    b.grab().save(str(SHOTS / "browser-preview-with-attachment.png"))
    ext = b.toolbar.findChild(QToolButton, "qt_toolbar_ext_button")
    assert ext is None or not ext.isVisible()  # every action fits on the toolbar (its short text there)
    assert b.toolbar.widgetForAction(b.buttons["documents"]).text() == "New chat with files"
    assert "documents" in [k for k in MENU_ACTIONS if k]
    assert b.buttons["documents"] in b.context_menu(b.table.visualRect(b.model.index(rows.index(source), 0))
                                                    .center()).actions()
    b.buttons["documents"].trigger()
    assert w.current not in (source, target) and w.chat.attachments.attachments() == stored


def test_a_refused_message_gives_its_files_back(qtbot, windows, tmp_path):
    w = windows()
    conv = w.new_chat()
    use_settings(w, QUICK)
    long = tmp_path / "long.md"
    long.write_text("\n".join(f"Line {i} of the long report about herons and their ponds." for i in range(80)))
    drop_files(w, [long])
    qtbot.waitUntil(chips_ready(w, 1), timeout=TIMEOUT)
    (attachment,) = w.chat.attachments.attachments()
    w.composer.setPlainText("Summarise it")
    qtbot.keyClick(w.composer, Qt.Key.Key_Return)
    qtbot.waitUntil(lambda: w.transcript.context_limit.isVisible(), timeout=TIMEOUT)
    wait_idle(qtbot, w)
    assert w.store.messages(conv) == []  # too long for the model: not stored
    assert w.composer.toPlainText() == "Summarise it" and w.chat.attachments.attachments() == (attachment,)


def test_the_total_counts_what_the_chat_already_holds(qtbot, windows, tmp_path):
    w = windows()
    w.new_chat()
    use_settings(w, QUICK)
    w.composer.setPlainText("Tell me about herons and the pond where they nest in the spring.")
    qtbot.keyClick(w.composer, Qt.Key.Key_Return)
    wait_idle(qtbot, w)
    used = w.status.used
    assert 0 < used < 200
    lines: list[str] = []
    while counted(w, attachment_block(attachment_from_text("pond.txt", "\n".join(lines) or "x"))) <= 256 - used + 4:
        lines.append(f"Line {len(lines)} about the pond.")
    path = tmp_path / "pond.txt"
    path.write_text("\n".join(lines))
    drop_files(w, [path])
    qtbot.waitUntil(chips_ready(w, 1), timeout=TIMEOUT)
    tokens = next(iter(w.chat.attachments.drafts.values())).tokens
    assert tokens < 256 < tokens + used  # fits alone, not beside what the chat holds
    assert w.tray.total.text() == total_text(tokens, 256, used, None).text
    assert f"the context holds 256, {used:,} already used" in w.tray.total.text() and "will not fit" in w.tray.total.text()
    # the chat drops its oldest messages from now on: the total says what will happen then
    use_settings(w, {**QUICK, "context_policy": "drop_oldest"})
    w.chat.attachments.refresh_total()
    assert "older messages will leave the model's view" in w.tray.total.text()


def test_editing_a_message_with_files_edits_its_words_and_its_files(qtbot, windows, note, tmp_path):
    w = windows()
    conv = w.new_chat()
    send_with_file(qtbot, w, note, "Where?")
    seq = w.store.messages(conv)[0].seq
    w.chat.begin_edit(seq)
    assert w.composer.toPlainText() == "Where?"  # the words, not the files' text
    assert [a.name for a in w.chat.attachments.attachments()] == ["heron notes.txt"]
    other = tmp_path / "other.csv"
    other.write_text("bird,eggs\nheron,4\n")
    drop_files(w, [other])
    qtbot.waitUntil(chips_ready(w, 2), timeout=TIMEOUT)
    first = next(iter(w.tray.chips.values()))
    qtbot.mouseClick(first.remove_button, Qt.MouseButton.LeftButton)
    w.composer.setPlainText("How many eggs?")
    qtbot.keyClick(w.composer, Qt.Key.Key_Return)
    wait_idle(qtbot, w)
    edited = w.store.messages(conv)[0]
    assert [a.name for a in edited.attachments] == ["other.csv"] and edited.typed_text == "How many eggs?"
    assert edited.content.startswith("[File: other.csv]\nbird,eggs")
    assert [b.attachment.name for b in w.transcript.messages[0].attachment_blocks] == ["other.csv"]
    # Esc on an edit puts nothing back: no chips are left over
    w.chat.begin_edit(seq)
    w.chat.cancel_edit()
    assert not w.tray.chips and w.composer.toPlainText() == ""


def test_send_waits_for_a_file_still_being_read(qtbot, windows, note):
    w = windows()
    conv = w.new_chat()
    use_settings(w, QUICK)
    drop_files(w, [note])
    w.chat.send("Hi")  # before the event loop ran: the reader's answer cannot have arrived
    assert "heron notes.txt is still being read" in w.status.resume.text()
    assert not w.turns.running() and w.store.messages(conv) == []
    qtbot.waitUntil(chips_ready(w, 1), timeout=TIMEOUT)
    w.chat.send("Hi")
    wait_idle(qtbot, w)
    assert [a.name for a in w.store.messages(conv)[0].attachments] == ["heron notes.txt"]


def test_the_chat_menus_new_chat_with_these_documents_takes_the_shown_chats_files(qtbot, windows, note):
    w = windows()
    source = w.new_chat()
    send_with_file(qtbot, w, note, "Where?")
    stored = w.store.messages(source)[0].attachments
    assert w.act_documents.isEnabled()
    w.act_documents.trigger()  # Chat → New chat with these documents (Ctrl+Shift+D)
    assert w.current != source and w.chat.attachments.attachments() == stored
    assert not w.act_documents.isEnabled()
