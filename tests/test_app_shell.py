"""The window's shell (issue 18): theme, text size, menus, dialogs, keyboard help, and the sidebar's
filter, date groups and pins — real widgets (pytest-qt, offscreen), real SQLite, the tiny model."""

from __future__ import annotations

import datetime as dt
import json
import sqlite3
import time
from pathlib import Path

import pytest
from PySide6.QtCore import QObject, QPoint, QSettings, Qt, QUrl, Slot
from PySide6.QtGui import QColor, QDesktopServices, QGuiApplication, QKeySequence, QPalette
from PySide6.QtWidgets import QAbstractButton, QApplication, QMessageBox, QWidget

from app.data_dialog import DataLocationsDialog
from app.shortcuts_dialog import plain, window_actions
from app.sidebar import BADGE_COLORS, OLDER, PINNED, PREVIOUS_WEEK, TODAY, YESTERDAY, date_group
from app.text_size import MAX_PT, MIN_PT, default_size
from app.theme import MIN_CONTRAST, ThemeMode, apply_palette, apply_saved_theme, contrast, error_colour, palette
from engine.api import hearth_version
from engine.conversations import MIGRATIONS, ConversationStore
from engine.errors import ConversationError

from .test_cli import run_cli

DAY_MS = 24 * 3600 * 1000
R, G = QPalette.ColorRole, QPalette.ColorGroup


@pytest.fixture(autouse=True)
def light_afterwards(qapp):
    """The palette is app-wide: leave the light one for the tests that follow, whatever happened here."""
    yield
    apply_palette(False)


def chat_row(cid: str, title: str, updated_ms: int) -> dict:
    return {"id": cid, "title": title, "system_prompt": "", "settings": {}, "model": "", "created_ms": updated_ms,
            "updated_ms": updated_ms, "messages": [{"role": "user", "content": title, "created_ms": updated_ms}]}


def days_ago(n: int) -> int:
    """Noon, ``n`` local days ago (noon: never on the other side of midnight)."""
    day = dt.date.today() - dt.timedelta(days=n)
    return int(dt.datetime.combine(day, dt.time(12)).timestamp() * 1000)


def with_chats(w, rows: list[dict]) -> None:
    w.store.insert_full(rows)
    w.reload_list()


def list_order(w) -> list[str]:
    return [w.sidebar.item(i).data(Qt.ItemDataRole.UserRole) for i in range(w.sidebar.count())]


# defect 13: the File menu ------------------------------------------------------------------------------
def test_defect13_file_menu_has_browse_before_quit_and_quit_last(qtbot, windows):
    w = windows(wait_ready=False)
    file_menu = w.menuBar().actions()[0].menu()
    names = [plain(a.text()) if not a.isSeparator() else "---" for a in file_menu.actions()]
    assert names == ["New chat", "Open model file", "Models", "Browse conversations", "---", "Quit"]
    browse = file_menu.actions()[3]
    assert browse.shortcut() == QKeySequence("Ctrl+B")


# defect 16: dialogs ------------------------------------------------------------------------------------
class UrlCatcher(QObject):
    """Receives file:// URLs instead of the desktop's file manager (Qt's own URL-handler hook)."""

    def __init__(self):
        super().__init__()
        self.opened: list[str] = []

    @Slot(QUrl)
    def handle(self, url: QUrl) -> None:
        self.opened.append(url.toLocalFile())


@pytest.fixture
def url_catcher():
    catcher = UrlCatcher()
    QDesktopServices.setUrlHandler("file", catcher, "handle")
    yield catcher
    QDesktopServices.unsetUrlHandler("file")


def test_defect16_data_locations_elide_paths_in_the_middle_and_open_each_folder(qtbot, windows, url_catcher):
    w = windows(wait_ready=False)
    dialog = w.show_data_locations()
    qtbot.waitExposed(dialog)
    p = w.config.paths
    assert [label.path for label in dialog.paths] == [str(p.conversations_db), str(p.checkpoints), str(p.models),
                                                     str(p.converted), str(w.config.settings_file)]
    for label in dialog.paths:
        assert not label.wordWrap() and "\n" not in label.text()  # one line: never broken mid-word
        assert label.toolTip() == label.path
        assert label.fontMetrics().horizontalAdvance(label.text()) <= label.width()
    narrow = dialog.paths[1]
    narrow.resize(120, narrow.height())  # too narrow for the path: shortened in the middle, both ends kept
    assert "…" in narrow.text() and narrow.text()[0] == narrow.path[0] and narrow.text()[-1] == narrow.path[-1]
    dialog.copy_buttons[1].click()
    assert QGuiApplication.clipboard().text() == str(p.checkpoints)
    dialog.open_buttons[1].click()
    dialog.open_buttons[0].click()  # the database is a file: its folder is opened
    assert url_catcher.opened == [str(p.checkpoints), str(p.conversations_db.parent)]


def test_defect16_open_folder_that_is_gone_says_so(qtbot, url_catcher, tmp_path):
    gone = tmp_path / "checkpoints"  # e.g. deleted by hand to reclaim space
    dialog = DataLocationsDialog([("Saved context", gone, "a cache, safe to delete")])
    qtbot.addWidget(dialog)
    dialog.show()
    dialog.open_buttons[0].click()
    problem = dialog.findChild(QMessageBox, "folder-problem")
    assert problem is not None and problem.isVisible()
    assert "does not exist" in problem.text() and str(gone) in problem.text()
    assert url_catcher.opened == []


def test_defect16_about_shows_the_version_and_the_model(qtbot, windows):
    w = windows()
    box = w.show_about()
    assert f"Hearth {hearth_version()}" in box.text() and hearth_version() == "0.1.0"
    assert w.model_info.name in box.text()


def test_defect16_rename_dialog_is_wide_prefilled_and_selected(qtbot, windows):
    w = windows(wait_ready=False)
    conv = w.new_chat()
    w.store.rename(conv, "A rather long title about planning the garden for next spring")
    dialog = w.rename_current()
    qtbot.waitExposed(dialog)
    assert dialog.width() >= 420
    assert dialog.edit.text() == "A rather long title about planning the garden for next spring"
    assert dialog.edit.selectedText() == dialog.edit.text()  # typing replaces it
    qtbot.keyClicks(dialog.edit, "Garden plans")
    dialog.ok.click()
    assert w.store.get(conv).title == "Garden plans"
    assert w.sidebar.item_for(conv).text() == "Garden plans"


def test_defect16_rename_refuses_a_blank_title(qtbot, windows):
    w = windows(wait_ready=False)
    conv = w.new_chat()
    w.store.rename(conv, "Kept")
    dialog = w.rename_current()
    dialog.edit.setText("   ")
    assert not dialog.ok.isEnabled() and dialog.hint.text() == "A title cannot be empty."
    dialog.edit.setText("x" * 1000)  # pasted junk: cut to a usable length
    assert len(dialog.title()) == 200 and dialog.ok.isEnabled()
    dialog.reject()
    assert w.store.get(conv).title == "Kept"


def test_rename_of_a_chat_deleted_meanwhile_says_so(qtbot, windows):
    w = windows(wait_ready=False)
    conv = w.new_chat()
    dialog = w.rename_current()
    ConversationStore(w.config.paths.conversations_db).delete(conv)  # e.g. hearth-cli, while the dialog is open
    dialog.edit.setText("New title")
    dialog.ok.click()
    assert w.notice.isVisible() and "could not be renamed" in w.notice.message.text()


# dark mode ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dark", [False, True], ids=["light", "dark"])
def test_theme_palettes_have_readable_contrast(qtbot, dark):
    pal = palette(dark)
    pairs = [(R.Text, R.Base), (R.WindowText, R.Window), (R.ButtonText, R.Button), (R.HighlightedText, R.Highlight),
             (R.ToolTipText, R.ToolTipBase), (R.PlaceholderText, R.Base), (R.Link, R.Base), (R.Text, R.AlternateBase)]
    for fg, bg in pairs:
        assert contrast(pal.color(fg), pal.color(bg)) >= MIN_CONTRAST, (fg, bg)
    for fg, bg in [(R.WindowText, R.Window), (R.Text, R.Base)]:  # dim notes are drawn disabled: still readable
        assert contrast(pal.color(G.Disabled, fg), pal.color(bg)) >= MIN_CONTRAST, (fg, bg)
    for bg in (R.Window, R.Base):  # error text in dialogs (Preferences, Chat settings, Models, first run)
        assert contrast(QColor(error_colour(pal)), pal.color(bg)) >= MIN_CONTRAST, bg


def test_sidebar_badges_are_readable():
    for badge, colour in BADGE_COLORS.items():
        assert contrast(QColor("white"), QColor(colour)) >= MIN_CONTRAST, badge


def body_html(w) -> str:
    return w.transcript.messages[-1].body.toHtml()


def test_dark_mode_redraws_the_transcript_and_is_remembered(qtbot, windows):
    w = windows()
    chat = w.new_chat()
    w.notice.say("Something to know")
    # Stored, not only drawn: the window redraws a chat from the store when it hears of a change (its own
    # new chat's row, a model becoming ready), and a transcript drawn by hand came back empty then.
    w.store.append(chat, "user", "Show me code")
    w.store.append(chat, "assistant", "Here:\n\n```python\nprint('hi')\n```")
    w.chat.show_chat(chat)
    qtbot.waitUntil(lambda: len(w.transcript.messages) == 2 and not w.transcript.loading)
    w.set_theme(ThemeMode.LIGHT)
    qtbot.waitUntil(lambda: QApplication.palette().color(R.Base).name() == "#ffffff")
    # Shown and polished in light colours (a body's style sheet fixes its palette when polished).
    qtbot.waitUntil(lambda: all(m.body.palette().color(R.Text).name() == "#1c1c1c" for m in w.transcript.messages))
    light = body_html(w)
    w.set_theme(ThemeMode.DARK)
    assert QApplication.palette().color(R.Window).name() == "#202226"
    qtbot.waitUntil(lambda: body_html(w) != light)  # the code block's shading follows the theme
    for message in w.transcript.messages:  # and the text itself: light on dark, readable
        body = message.body
        assert contrast(body.palette().color(R.Text), QApplication.palette().color(R.Base)) >= MIN_CONTRAST
    notice = w.notice.message  # its banner has a style sheet, which once kept the old palette
    assert contrast(notice.palette().color(R.WindowText), QApplication.palette().color(R.Window)) >= MIN_CONTRAST
    assert w.theme_actions[ThemeMode.DARK].isChecked()
    assert w.sidebar.palette().color(R.Base).name() == "#17181b"
    windows.close(w)
    again = windows(wait_ready=False)
    assert again.theme.mode == ThemeMode.DARK and again.theme_actions[ThemeMode.DARK].isChecked()
    assert QApplication.palette().color(R.Base).name() == "#17181b"
    again.set_theme(ThemeMode.SYSTEM)


def test_system_theme_follows_the_os_scheme(qtbot, windows):
    w = windows(wait_ready=False)
    w.set_theme(ThemeMode.SYSTEM)
    w.theme.on_system_scheme_changed(Qt.ColorScheme.Dark)  # what QStyleHints reports when the OS switches
    assert w.theme.dark and QApplication.palette().color(R.Base).name() == "#17181b"
    w.theme.on_system_scheme_changed(Qt.ColorScheme.Light)
    assert not w.theme.dark and QApplication.palette().color(R.Base).name() == "#ffffff"
    w.set_theme(ThemeMode.LIGHT)  # a chosen theme stays, whatever the OS does
    w.theme.on_system_scheme_changed(Qt.ColorScheme.Dark)
    assert not w.theme.dark
    w.set_theme(ThemeMode.SYSTEM)


def test_unknown_theme_in_the_settings_file_follows_the_system(qtbot, windows, config):
    settings = QSettings(str(config.settings_file), QSettings.Format.IniFormat)
    settings.setValue("theme", "purple")
    settings.sync()
    w = windows(wait_ready=False)
    assert w.theme.mode == ThemeMode.SYSTEM and w.theme_actions[ThemeMode.SYSTEM].isChecked()


@pytest.mark.parametrize(("stored", "dark"), [("dark", True), ("Light", False), ("", False), ("🙂", False)])
def test_the_saved_theme_applies_before_the_window_exists(qapp, tmp_path, stored, dark):
    settings_file = tmp_path / "window.ini"
    settings = QSettings(str(settings_file), QSettings.Format.IniFormat)
    settings.setValue("theme", stored)
    settings.sync()
    apply_saved_theme(settings_file)  # offscreen, the system's scheme is unknown: light
    assert QApplication.palette().color(R.Base).name() == ("#17181b" if dark else "#ffffff")


# text size ----------------------------------------------------------------------------------------------
def test_text_size_keys_are_bounded_and_remembered(qtbot, windows):
    w = windows(wait_ready=False)
    w.new_chat()
    w.transcript.add(3, "assistant", "Some **reply** text.")
    base = default_size()
    assert w.composer.font().pointSize() == base
    keys = {seq.toString() for seq in w.act_larger.shortcuts()}
    assert keys == {"Ctrl+=", "Ctrl++"}
    w.activateWindow()
    qtbot.waitUntil(w.isActiveWindow)
    qtbot.keyClick(w.composer, Qt.Key.Key_Equal, Qt.KeyboardModifier.ControlModifier)  # Ctrl+= as typed
    assert w.composer.font().pointSize() == base + 1
    body = w.transcript.messages[-1].body
    assert body.font().pointSize() == base + 1 and body.document().defaultFont().pointSize() == base + 1
    for _ in range(40):
        if w.act_larger.isEnabled():
            w.act_larger.trigger()
    assert w.composer.font().pointSize() == MAX_PT and not w.act_larger.isEnabled()
    for _ in range(40):
        if w.act_smaller.isEnabled():
            w.act_smaller.trigger()
    assert w.transcript.font().pointSize() == MIN_PT and not w.act_smaller.isEnabled()
    w.act_larger.trigger()
    windows.close(w)
    again = windows(wait_ready=False)
    assert again.composer.font().pointSize() == MIN_PT + 1
    again.act_reset_text.trigger()
    assert again.composer.font().pointSize() == base and again.settings.value("text_size") is None


@pytest.mark.parametrize(("stored", "expected"), [("huge", None), ("99", MAX_PT), ("-3", MIN_PT)])
def test_bad_text_size_in_the_settings_file_is_clamped_or_ignored(qtbot, windows, config, stored, expected):
    settings = QSettings(str(config.settings_file), QSettings.Format.IniFormat)
    settings.setValue("text_size", stored)
    settings.sync()
    w = windows(wait_ready=False)
    assert w.composer.font().pointSize() == (expected if expected is not None else default_size())


# keyboard help -----------------------------------------------------------------------------------------
def test_keyboard_shortcuts_dialog_lists_every_action_and_none_share_a_shortcut(qtbot, windows):
    w = windows(wait_ready=False)
    assert {s.toString() for s in w.act_shortcuts.shortcuts()} == {"F1", "Ctrl+/"}
    dialog = w.show_shortcuts()
    qtbot.waitExposed(dialog)
    listed = {(action, keys) for _where, action, keys in dialog.listed()}
    with_keys = [(plain(a.text()), a) for _where, a in window_actions(w) if not a.shortcut().isEmpty()]
    assert len(with_keys) >= 15
    for name, act in with_keys:
        native = " or ".join(s.toString(QKeySequence.SequenceFormat.NativeText) for s in act.shortcuts())
        assert (name, native) in listed, name
    assert ("Browse conversations", "Ctrl+B") in listed and ("Keyboard shortcuts", "F1 or Ctrl+/") in listed
    seen: dict[str, str] = {}
    for act in w.findChildren(type(w.act_new)):
        for seq in act.shortcuts():
            key = seq.toString()
            assert key not in seen, f"{key} is both {seen[key]!r} and {act.text()!r}"
            seen[key] = act.text()
    # Adding an action later: it shows up without touching the dialog.
    extra = w._action("Something new", "Ctrl+Alt+J", lambda: None, w.view_menu)
    assert ("Something new", extra.shortcut().toString(QKeySequence.SequenceFormat.NativeText)) in {
        (a, k) for _w, a, k in w.show_shortcuts().listed()}


def test_every_new_control_has_an_accessible_name(qtbot, windows):
    w = windows(wait_ready=False)
    conv = w.new_chat()
    assert conv
    dialogs = [w.show_shortcuts(), w.show_data_locations(), w.rename_current()]
    controls: list[QWidget] = [w.filter_box]
    for d in dialogs:
        assert d.accessibleName() or d.windowTitle()
        controls += [c for c in d.findChildren(QWidget) if c.focusPolicy() != Qt.FocusPolicy.NoFocus
                     and c.isVisibleTo(d) and not c.objectName().startswith("qt_")]
    for c in controls:
        name = c.accessibleName() or (c.text() if isinstance(c, QAbstractButton) else "")
        assert name.strip(), f"{type(c).__name__} in {c.window().windowTitle()!r} has no accessible name"


# the sidebar: filter, groups, pins ---------------------------------------------------------------------------
def test_sidebar_filter_narrows_by_title_and_esc_clears(qtbot, windows):
    w = windows(wait_ready=False)
    with_chats(w, [chat_row("a", "Garden plans", days_ago(0)), chat_row("b", "Tax return", days_ago(0)),
                   chat_row("c", "garden tools", days_ago(3))])
    w.activateWindow()
    qtbot.waitUntil(w.isActiveWindow)
    w.act_filter.trigger()
    qtbot.waitUntil(w.filter_box.hasFocus)
    qtbot.keyClicks(w.filter_box, "GARDEN")
    assert w.sidebar.visible_ids() == ["a", "c"]
    assert w.sidebar.headers() == [(TODAY, "a"), (PREVIOUS_WEEK, "c")]  # groups of what is shown
    qtbot.keyClick(w.filter_box, Qt.Key.Key_Down)
    assert w.sidebar.hasFocus() and w.current in ("a", "c")
    w.filter_box.setFocus()
    qtbot.keyClick(w.filter_box, Qt.Key.Key_Escape)
    assert w.filter_box.text() == "" and w.sidebar.visible_ids() == ["a", "b", "c"]
    qtbot.keyClicks(w.filter_box, "nothing like this")
    assert w.sidebar.visible_ids() == []  # the list says so (painted), and nothing is opened
    w.filter_box.clear()


def test_sidebar_groups_by_last_activity_and_keys_skip_headers(qtbot, windows):
    w = windows(wait_ready=False)
    with_chats(w, [chat_row("t", "today", days_ago(0)), chat_row("y", "yesterday", days_ago(1)),
                   chat_row("w", "this week", days_ago(5)), chat_row("o", "long ago", days_ago(40))])
    assert list_order(w) == ["t", "y", "w", "o"]
    assert w.sidebar.headers() == [(TODAY, "t"), (YESTERDAY, "y"), (PREVIOUS_WEEK, "w"), (OLDER, "o")]
    assert w.sidebar.count() == 4  # headers are drawn, not items: rows are chats
    w.sidebar.setCurrentItem(w.sidebar.item_for("t"))
    w.sidebar.setFocus()
    for expected in ("y", "w", "o"):
        qtbot.keyClick(w.sidebar, Qt.Key.Key_Down)
        assert w.current == expected
    qtbot.keyClick(w.sidebar, Qt.Key.Key_Up)
    assert w.current == "w"
    # A click on a header selects nothing; a click below it selects its chat.
    rect = w.sidebar.visualItemRect(w.sidebar.item_for("y"))
    qtbot.mouseClick(w.sidebar.viewport(), Qt.MouseButton.LeftButton, pos=QPoint(20, rect.top() + 4))
    assert w.current == "w"
    qtbot.mouseClick(w.sidebar.viewport(), Qt.MouseButton.LeftButton, pos=QPoint(20, rect.bottom() - 10))
    assert w.current == "y"


def test_date_groups_at_the_edges():
    today = dt.date(2026, 3, 10)

    def at(day: dt.date, hour: int) -> int:
        return int(dt.datetime.combine(day, dt.time(hour)).timestamp() * 1000)

    assert date_group(at(today, 0), today) == TODAY
    assert date_group(at(today - dt.timedelta(days=1), 23), today) == YESTERDAY
    assert date_group(at(today - dt.timedelta(days=7), 12), today) == PREVIOUS_WEEK
    assert date_group(at(today - dt.timedelta(days=8), 12), today) == OLDER
    assert date_group(at(today + dt.timedelta(days=2), 12), today) == TODAY  # a clock set back: not "Older"


def test_pin_to_top_keeps_a_chat_first_across_restarts_and_in_the_cli(qtbot, windows):
    w = windows(wait_ready=False)
    with_chats(w, [chat_row("new", "newest", days_ago(0)), chat_row("old", "the plan", days_ago(30))])
    before = w.store.get("old").updated_ms
    menu = w.sidebar_menu("old")
    pin = next(a for a in menu.actions() if a.text() == "Pin to top")
    pin.trigger()
    assert list_order(w) == ["old", "new"] and w.sidebar.headers() == [(PINNED, "old"), (TODAY, "new")]
    assert w.store.get("old").updated_ms == before  # pinning is not activity
    w.sidebar.setCurrentItem(w.sidebar.item_for("old"))
    assert w.act_pin.isChecked()
    fresh = w.new_chat()  # a new chat goes to the top of the unpinned ones
    assert list_order(w) == ["old", fresh, "new"]
    windows.close(w)
    again = windows(wait_ready=False)
    assert list_order(again)[0] == "old" and again.sidebar.group_of("old") == PINNED
    listing = run_cli("conversations", "ls", "--json", home=Path(again.config.paths.data))
    assert listing.returncode == 0, listing.stderr
    pinned = {c["id"]: c["pinned"] for c in json.loads(listing.stdout)["conversations"]}
    assert pinned == {"old": True, "new": False, fresh: False}
    human = run_cli("conversations", "ls", home=Path(again.config.paths.data)).stdout
    assert "[pinned] the plan" in human and "[pinned] newest" not in human
    again.sidebar.setCurrentItem(again.sidebar.item_for("old"))
    again.act_pin.trigger()  # Chat → Pin to top, unchecked: unpinned
    assert again.store.pinned_ids() == set() and list_order(again)[-1] == "old"
    assert [a.text() for a in again.sidebar_menu("old").actions()][0] == "Pin to top"


def test_pinning_a_chat_deleted_meanwhile_says_so(qtbot, windows):
    w = windows(wait_ready=False)
    conv = w.new_chat()
    ConversationStore(w.config.paths.conversations_db).delete(conv)
    w.set_pinned(conv, True)
    assert w.notice.isVisible() and "could not be pinned" in w.notice.message.text()
    with pytest.raises(ConversationError, match="no conversation"):
        w.store.set_pinned("no-such-chat", True)


def test_a_database_from_before_pins_is_upgraded_with_nothing_pinned(tmp_path):
    path = tmp_path / "conversations.db"
    db = sqlite3.connect(path)
    for i, script in enumerate(MIGRATIONS[:4], start=1):
        db.executescript(script + f"; PRAGMA user_version = {i};")
    now = int(time.time() * 1000)
    db.execute("INSERT INTO conversations (id, title, created_ms, updated_ms) VALUES ('old', 'kept', ?, ?)", (now, now))
    db.commit()
    db.close()
    store = ConversationStore(path)
    assert store.pinned_ids() == set() and store.get("old").title == "kept"
    store.set_pinned("old", True)
    assert store.pinned_ids() == {"old"}
    store.close()
