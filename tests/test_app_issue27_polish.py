"""Issue 27 item 23: what a new user saw cut off, mis-worded or misleading in the window and the browser
at the default 1,100 px — each through the real widgets, the real engine and a real store."""

from __future__ import annotations

from pathlib import Path

import pytest
from PySide6.QtCore import Qt
from PySide6.QtGui import QColor
from PySide6.QtWidgets import QApplication, QFileDialog, QLabel, QMessageBox, QStyleOptionViewItem

from app.config import AppConfig
from app.sidebar import SUBTITLE_ROLE
from app.text import model_label, plural, short_model_label
from engine.api import COPY_SUFFIX
from engine.paths import resolve_paths
from engine.types import BundleExported, BundleImported, ModelInfo

from .qt_helpers import TIMEOUT, new_chat_with_turn, on_ui_thread, send, wait_idle
from .test_app_browser_polish import answer, duplicates_box, open_browser

WIDTH = 1100  # the window's default width
LONG_TITLE = "Planning the lighthouse keepers' reunion dinner and the seating for everyone"


def shown_whole(label: QLabel) -> bool:
    """The label's whole text is on screen: wrapped into enough lines, or on one line that holds it."""
    if label.wordWrap():
        return label.height() >= label.heightForWidth(label.width())
    return label.fontMetrics().horizontalAdvance(label.text()) <= label.contentsRect().width()


@pytest.fixture
def real_config(real_model_home) -> AppConfig:
    return AppConfig(resolve_paths(real_model_home).ensure(), model=None, weights="int4", provider="cpu")


# the status line ------------------------------------------------------------------------------------------------
@pytest.mark.real_model
def test_how_the_turn_started_fits_the_status_bar_at_1100_px(qtbot, windows, real_config):
    """"continued from memory (39 tokens kept) · read 14 new t…": the model's file name and the server
    switch's URL took the room."""
    w = windows(real_config)
    w.resize(WIDTH, 700)
    new_chat_with_turn(qtbot, w, "hello there")
    send(qtbot, w, "and again")
    wait_idle(qtbot, w)
    qtbot.wait(50)
    resume, model = w.status.resume, w.status.model
    assert "read" in resume.text() and "new tokens" in resume.text()
    assert resume.elided() == resume.text(), (resume.text(), resume.width())
    # "SmolLM2-135M-Instruct.Q4_1 ·…" (capped at 200 px) beside a line that held ~440 px, mostly blank: the
    # model is named whole too, at worst without its file's ".Q4_1", and the line takes only its text's room
    assert model.text() == model_label(w.model_info)
    assert model.elided() in (model.text(), short_model_label(w.model_info)), model.elided()
    assert resume.width() <= resume.text_width() + 1
    w.resize(700, 700)  # really too narrow: both cut, each whole in its tooltip
    qtbot.waitUntil(lambda: w.width() == 700 and "…" in resume.elided(), timeout=TIMEOUT)
    assert resume.text() in resume.toolTip()
    assert model.elided().endswith("…") and model.elided().startswith("SmolLM2")
    assert model.toolTip().startswith(model.text())


def test_the_model_label_drops_the_file_names_quantization_first():
    info = ModelInfo("SmolLM2-135M-Instruct.Q4_1", "cpu", "int4", 8192)
    assert model_label(info) == "SmolLM2-135M-Instruct.Q4_1 · int4 · CPU"
    assert short_model_label(info) == "SmolLM2-135M-Instruct · int4 · CPU"
    for stem, name in (("gemma-3-270m-q4_k_m", "gemma-3-270m"), ("Qwen2.5-7B-Instruct-IQ4_XS", "Qwen2.5-7B-Instruct"),
                       ("phi-3-mini-F16", "phi-3-mini"), ("Q4_0", "Q4_0"), ("tiny", "tiny")):
        assert short_model_label(ModelInfo(stem, "cuda", "fp16", 1)) == f"{name} · fp16 · CUDA"


def test_a_refused_model_file_does_not_leave_adding_on_the_status_line(qtbot, windows, monkeypatch):
    """File → Open model file… on README.md: the refusal dialog came, "Adding README.md…" stayed."""
    w = windows()
    readme = Path(__file__).resolve().parent.parent / "README.md"
    monkeypatch.setattr(QFileDialog, "getOpenFileName", lambda *a, **k: (str(readme), ""))
    shown: list[str] = []
    monkeypatch.setattr(QMessageBox, "warning", lambda parent, title, text: shown.append(text))
    action = next(a for a in w.menuBar().actions()[0].menu().actions() if a.text() == "&Open model file…")
    action.trigger()
    assert w.status.resume.text() == "Adding README.md…"
    qtbot.waitUntil(lambda: bool(shown), timeout=TIMEOUT)
    assert "could not be added" in shown[0]
    assert w.status.resume.text() == "⚠ README.md was not added"


# last activity --------------------------------------------------------------------------------------------------
def test_renaming_or_pinning_keeps_the_last_activity(qtbot, windows):
    w = windows()
    c = w.store.create(title="old chat")
    w.store.append(c.id, "user", "hello")
    with w.store._write() as db:  # last active long ago
        db.execute("UPDATE conversations SET updated_ms = ? WHERE id = ?", (1_000_000, c.id))
    w.reload_list()
    w.sidebar.setCurrentItem(w.sidebar.item_for(c.id))
    qtbot.waitUntil(lambda: w.current == c.id, timeout=TIMEOUT)
    w.act_pin.trigger()
    assert w.sidebar.is_pinned(c.id)
    w.act_rename.trigger()
    dialog = next(d for d in QApplication.topLevelWidgets() if d.isVisible() and hasattr(d, "edit") and hasattr(d, "ok"))
    dialog.edit.setText("renamed chat")
    qtbot.mouseClick(dialog.ok, Qt.MouseButton.LeftButton)
    assert w.store.get(c.id).title == "renamed chat"
    assert w.store.get(c.id).updated_ms == 1_000_000
    w.reload_list()
    assert "just now" not in w.sidebar.item_for(c.id).data(SUBTITLE_ROLE)


# wording --------------------------------------------------------------------------------------------------------
def test_plural_says_one_thing_in_the_singular():
    assert plural(1, "conversation") == "1 conversation" and plural(2, "saved context") == "2 saved contexts"
    assert plural(1_024, "match", "matches") == "1,024 matches" and plural(0, "chat") == "0 chats"


# the browser ----------------------------------------------------------------------------------------------------
@pytest.fixture
def copied(qtbot, windows, tmp_path):
    """A chat with a long title exported as a bundle and imported again as a copy, the browser at 1,100 px."""
    w = windows()
    w.resize(WIDTH, 700)
    saved = new_chat_with_turn(qtbot, w, "a chat about lighthouses")
    w.store.rename(saved, LONG_TITLE)
    w.reload_list()
    b = open_browser(qtbot, w)
    b.resize(WIDTH, 740)
    b.table.selectRow(b.ids_shown().index(saved))
    done: list = []
    on_ui_thread(w.worker.bundle_done, lambda r: done.append(r))
    bundle = tmp_path / "one.hearth"
    b.transfers.export_bundle(str(bundle))
    qtbot.waitUntil(lambda: bool(done), timeout=TIMEOUT)
    assert isinstance(done[-1], BundleExported)
    exported = b.verify_result.text()
    assert b.transfers.import_bundle(str(bundle))
    question = duplicates_box(qtbot, b).text()
    answer(qtbot, b, "copy")
    [copy] = b.transfers.imported_ids
    qtbot.waitUntil(lambda: len(done) == 2 and isinstance(done[-1], BundleImported), timeout=TIMEOUT)
    qtbot.waitUntil(lambda: "imported as copies" in b.verify_result.text(), timeout=TIMEOUT)
    return w, b, saved, copy, exported, question


def test_counts_read_as_english(copied):
    w, b, saved, copy, exported, question = copied
    assert exported == "Exported 1 conversation with 1 saved context."
    assert question.startswith("The conversation in this file is already here") and "1 of the 1" not in question
    assert b.verify_result.text().startswith("Saved context used for 1 conversation")
    assert "(s)" not in b.verify_result.text()


def test_the_result_line_is_read_whole_at_1100_px(qtbot, copied):
    w, b, *_ = copied
    qtbot.waitExposed(b)
    qtbot.wait(50)
    assert b.width() <= WIDTH + 1 and len(b.verify_result.text()) > 60
    assert shown_whole(b.verify_result) and shown_whole(b.usage_label)


def test_an_imported_copy_shows_its_suffix_and_its_model_in_both_lists(qtbot, copied):
    w, b, saved, copy, *_ = copied
    # the sidebar: its title cut before " (imported)", and the model the export named
    w.sidebar.grab()  # paints every row
    drawn = w.sidebar.itemDelegate().drawn_titles
    assert drawn[copy].endswith(COPY_SUFFIX) and drawn[copy] != drawn[saved] and "…" in drawn[copy]
    model = w.store.get(copy).model
    assert model and w.sidebar.item_for(copy).data(SUBTITLE_ROLE).endswith(model)
    # the browser's Title column
    qtbot.waitExposed(b)
    index = b.proxy.index(b.ids_shown().index(copy), 0)
    option = QStyleOptionViewItem()
    option.initFrom(b.table)
    option.rect = b.table.visualRect(index)
    option.widget = b.table
    b.table.itemDelegateForColumn(0).initStyleOption(option, index)
    assert option.text.endswith(COPY_SUFFIX) and "…" in option.text
    assert option.fontMetrics.horizontalAdvance(option.text) <= option.rect.width()


def test_the_sort_arrow_points_down_while_newest_first_and_esc_or_ctrl_w_closes(qtbot, copied):
    w, b, *_ = copied
    header = b.table.horizontalHeader()
    assert (header.sortIndicatorSection(), header.sortIndicatorOrder()) == (3, Qt.SortOrder.DescendingOrder)
    assert arrow_points(header, 3) == "down"
    b.table.sortByColumn(3, Qt.SortOrder.AscendingOrder)
    assert arrow_points(header, 3) == "up"
    b.table.sortByColumn(3, Qt.SortOrder.DescendingOrder)
    for key, modifier in ((Qt.Key.Key_Escape, Qt.KeyboardModifier.NoModifier),
                          (Qt.Key.Key_W, Qt.KeyboardModifier.ControlModifier)):
        w.show_browser()
        b.activateWindow()
        qtbot.waitUntil(lambda: QApplication.activeWindow() is b, timeout=TIMEOUT)
        qtbot.keyClick(b.table, key, modifier)
        qtbot.waitUntil(lambda: not b.isVisible(), timeout=TIMEOUT)


def arrow_points(header, section: int) -> str:
    """Which way the sort arrow drawn in ``section`` points: its widest row of dark pixels is at the top
    (▼, "down") or at the bottom (▲, "up")."""
    image = header.grab().toImage()
    left = header.sectionViewportPosition(section)
    right = left + header.sectionSize(section)
    text_right = left + (header.sectionSize(section) + header.fontMetrics().horizontalAdvance("Last activity")) // 2
    rows = []
    for y in range(image.height()):
        dark = sum(1 for x in range(text_right + 2, right - 1)
                   if QColor(image.pixel(x, y)).lightness() < 120)
        if dark:
            rows.append(dark)
    assert rows, "no arrow drawn"
    return "down" if rows[0] > rows[-1] else "up"


def test_esc_in_the_search_box_clears_the_search_before_it_closes_the_browser(qtbot, windows):
    """Esc typed in the search box closed the whole browser, the search with it (as a find bar: Esc clears
    what is typed, and only an empty box or focus elsewhere closes)."""
    w = windows()
    w.store.create(title="lighthouse notes")
    w.reload_list()
    b = open_browser(qtbot, w)
    b.activateWindow()
    qtbot.waitUntil(lambda: QApplication.activeWindow() is b, timeout=TIMEOUT)
    b.query.setFocus()
    qtbot.keyClicks(b.query, "lighthouse")
    qtbot.keyClick(b.query, Qt.Key.Key_Escape)
    assert b.query.text() == "" and b.isVisible()
    qtbot.keyClick(b.query, Qt.Key.Key_Escape)  # the box is empty now: Esc closes
    qtbot.waitUntil(lambda: not b.isVisible(), timeout=TIMEOUT)
    # text left in the box with the focus in the list: Esc closes, the search stays for the next opening
    w.show_browser()
    b.activateWindow()
    qtbot.waitUntil(lambda: QApplication.activeWindow() is b, timeout=TIMEOUT)
    qtbot.keyClicks(b.query, "notes")
    b.table.setFocus()
    qtbot.keyClick(b.table, Qt.Key.Key_Escape)
    qtbot.waitUntil(lambda: not b.isVisible(), timeout=TIMEOUT)
    assert b.query.text() == "notes"
