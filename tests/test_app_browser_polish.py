"""Issue 18, the conversation browser and import: each defect reproduced with real widgets, the real
engine (tiny model), a real SQLite store and real files (defects 1, 2, 6, 7, 8, 9)."""

from __future__ import annotations

import json

import pytest
from PySide6.QtCore import Qt
from PySide6.QtGui import QColor
from PySide6.QtWidgets import QMessageBox

from app.browser import ACTIONS, MENU_ACTIONS
from app.browser_widgets import NOTHING_SELECTED
from app.sidebar import BADGE_ROLE, TOKENS_ROLE
from engine.api import COPY_SUFFIX, DuplicatePolicy, apply_duplicates, find_duplicates, read_document

from .checkpoint_names import chain_block_paths, only_conv_path
from .qt_helpers import TIMEOUT, new_chat_with_turn
from .test_cli import assert_clean_error, run_cli


def open_browser(qtbot, w):
    w.show_browser()
    b = w.browser
    qtbot.waitUntil(lambda: b.usage_label.text() != "Saved context: …", timeout=TIMEOUT)
    return b


def export_all(browser, path) -> list[str]:
    browser.table.selectAll()
    ids = browser.selected_ids()
    assert browser.transfers.export_selected(str(path), "json") == len(ids)
    return ids


def duplicates_box(qtbot, browser) -> QMessageBox:
    qtbot.waitUntil(lambda: browser.transfers.duplicates_box is not None and browser.transfers.duplicates_box.isVisible(),
                    timeout=TIMEOUT)
    return browser.transfers.duplicates_box


def answer(qtbot, browser, choice: str) -> None:
    """Click "Skip them", "Import as copies" or "Cancel import" and wait for the import to end."""
    box = duplicates_box(qtbot, browser)
    button = next(b for b in box.buttons() if b.objectName() == choice)
    qtbot.mouseClick(button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: browser.transfers._import_cancel is None, timeout=TIMEOUT)


def cell(browser, conversation: str, column: int) -> str:
    row = browser.ids_shown().index(conversation)
    return browser.proxy.index(row, column).data()


@pytest.fixture
def two_saved(qtbot, windows):
    """A window with two chats that have context: the first saved on disk, the second live."""
    w = windows()
    saved = new_chat_with_turn(qtbot, w, "a chat about lighthouses")
    live = new_chat_with_turn(qtbot, w, "a chat about owls")
    qtbot.waitUntil(lambda: w.sidebar.badge(saved) == "saved" and w.sidebar.badge(live) == "live", timeout=TIMEOUT)
    return w, saved, live


# 1 ----------------------------------------------------------------------------------------------------------
def test_defect1_import_keeps_sidebar_badges_and_token_counts(qtbot, two_saved, tmp_path):
    w, saved, live = two_saved
    tokens = {cid: w.sidebar.item_for(cid).data(TOKENS_ROLE) for cid in (saved, live)}
    assert all(tokens.values())
    browser = open_browser(qtbot, w)
    path = tmp_path / "all.json"
    export_all(browser, path)
    # As in the session that found it: the list was rebuilt and its badges lost; nothing asked the
    # engine again, so they stayed "none" with no token counts until a turn or a restart.
    for item in (w.sidebar.item(i) for i in range(w.sidebar.count())):
        item.setData(BADGE_ROLE, "none")
        item.setData(TOKENS_ROLE, None)
    assert browser.transfers.import_file(str(path), duplicates="copy")
    qtbot.waitUntil(lambda: len(browser.transfers.imported_ids) == 2, timeout=TIMEOUT)
    copies = browser.transfers.imported_ids
    # The engine's answer arrives after the request: every badge is right once it is in.
    qtbot.waitUntil(lambda: w.sidebar.badge(saved) == "saved" and w.sidebar.badge(live) == "live", timeout=TIMEOUT)
    assert all(w.sidebar.badge(c) == "none" for c in copies)
    assert {cid: w.sidebar.item_for(cid).data(TOKENS_ROLE) for cid in (saved, live)} == tokens


# 2 ----------------------------------------------------------------------------------------------------------
def test_defect1_every_bulk_change_of_the_browser_asks_the_engine_again(qtbot, two_saved):
    w, saved, live = two_saved
    browser = open_browser(qtbot, w)
    asked: list = []
    w.host.request_states.connect(lambda: asked.append(True))
    browser.table.selectRow(browser.ids_shown().index(saved))
    browser.duplicate_selected()
    assert len(asked) == 1
    browser.table.selectRow(0)
    browser.delete_selected()
    browser.undo_delete()
    assert len(asked) == 3


def test_defect2_import_of_chats_already_here_asks_and_skip_imports_nothing_twice(qtbot, two_saved, tmp_path):
    w, saved, live = two_saved
    browser = open_browser(qtbot, w)
    path = tmp_path / "all.json"
    export_all(browser, path)
    before = len(w.store.list())
    assert browser.transfers.import_file(str(path))
    box = duplicates_box(qtbot, browser)
    assert "All 2 conversations in this file are already here" in box.text() and "a chat about lighthouses" in box.text()
    assert box.defaultButton().objectName() == "skip"
    answer(qtbot, browser, "skip")
    assert len(w.store.list()) == before and browser.transfers.imported_ids == []
    assert "Imported 0 conversations; skipped 2 already here." == browser.verify_result.text()


def test_defect2_import_as_copies_marks_them_and_fills_their_cells(qtbot, two_saved, tmp_path):
    w, saved, live = two_saved
    browser = open_browser(qtbot, w)
    path = tmp_path / "all.json"
    export_all(browser, path)
    assert browser.transfers.import_file(str(path))
    answer(qtbot, browser, "copy")
    copies = browser.transfers.imported_ids
    assert len(copies) == 2 and not {saved, live} & set(copies)
    titles = sorted(w.store.get(c).title for c in copies)
    originals = sorted(w.store.get(c).title for c in (saved, live))
    assert titles == sorted(t + COPY_SUFFIX for t in originals)
    assert "2 of them as copies" in browser.verify_result.text()
    # Tokens and Context filled by the quick check the import asks for, without Verify all.
    qtbot.waitUntil(lambda: all(cell(browser, c, 8) == "none" for c in copies), timeout=TIMEOUT)
    assert all(cell(browser, c, 5) == "—" for c in copies)
    assert cell(browser, saved, 8) == "valid" and cell(browser, saved, 5) not in ("", "—")
    # A second import of the same file finds the copies too (their content is already here).
    assert browser.transfers.import_file(str(path))
    assert "All 2 conversations" in duplicates_box(qtbot, browser).text()
    answer(qtbot, browser, "cancel")
    assert browser.verify_result.text() == "Nothing was imported."
    assert len(w.store.list()) == 4


def test_defect2_a_file_without_duplicates_imports_without_asking(qtbot, two_saved, tmp_path):
    w, saved, live = two_saved
    browser = open_browser(qtbot, w)
    doc = {"format": "hearth.conversations", "version": 1, "conversations": [
        {"id": None, "title": "brand new", "system_prompt": "", "settings": {}, "model": "", "created_ms": 5,
         "updated_ms": 5, "messages": [{"role": "user", "content": "never seen", "created_ms": 5}]}]}
    path = tmp_path / "new.json"
    path.write_text(json.dumps(doc))
    assert browser.transfers.import_file(str(path))
    qtbot.waitUntil(lambda: browser.transfers._import_cancel is None, timeout=TIMEOUT)
    assert browser.transfers.duplicates_box is None and len(browser.transfers.imported_ids) == 1


def test_defect2_a_bundle_of_chats_already_here_asks_too_and_copies_keep_their_context(qtbot, two_saved, tmp_path):
    from engine.types import BundleExported, BundleImported

    from .qt_helpers import on_ui_thread

    w, saved, live = two_saved
    browser = open_browser(qtbot, w)
    browser.table.selectRow(browser.ids_shown().index(saved))
    done: list = []
    on_ui_thread(w.worker.bundle_done, lambda r: done.append(r))
    bundle = tmp_path / "one.hearth"
    browser.transfers.export_bundle(str(bundle))
    qtbot.waitUntil(lambda: bool(done), timeout=TIMEOUT)
    assert isinstance(done[-1], BundleExported)
    assert browser.transfers.import_bundle(str(bundle))
    assert "The conversation in this file is already here" in duplicates_box(qtbot, browser).text()
    answer(qtbot, browser, "copy")
    [copy] = browser.transfers.imported_ids
    assert copy != saved and w.store.get(copy).title == w.store.get(saved).title + COPY_SUFFIX
    qtbot.waitUntil(lambda: len(done) == 2, timeout=TIMEOUT)
    assert isinstance(done[-1], BundleImported) and done[-1].used == (copy,)
    qtbot.waitUntil(lambda: "1 imported as copies marked “(imported)”." in browser.verify_result.text(),
                    timeout=TIMEOUT)
    # Its saved context, installed for the copy, fills its cells and its badge without Verify all.
    qtbot.waitUntil(lambda: cell(browser, copy, 8) == "valid" and w.sidebar.badge(copy) == "saved", timeout=TIMEOUT)
    assert cell(browser, copy, 5) == cell(browser, saved, 5)
    assert browser.transfers.import_bundle(str(bundle))
    answer(qtbot, browser, "skip")
    assert browser.transfers.imported_ids == [] and "skipped 1 already here" in browser.verify_result.text()


def test_defect2_engine_finds_duplicates_by_id_and_by_content(tmp_path):
    from engine.conversations import ConversationStore
    from engine.transfer import export_json

    store = ConversationStore(tmp_path / "c.db")
    a = store.create(title="alpha")
    store.append(a.id, "user", "hello alpha")
    b = store.create(title="beta")
    store.append(b.id, "user", "hello beta")
    export_json(store, [a.id, b.id], tmp_path / "x.json")
    convs = read_document(tmp_path / "x.json")
    assert find_duplicates(store, convs) == [0, 1]
    convs[0]["id"] = None  # content alone
    convs[1]["messages"][0]["content"] = "changed"  # id alone
    assert find_duplicates(store, convs) == [0, 1]
    convs[1]["id"] = None  # neither: new
    assert find_duplicates(store, convs) == [0]
    assert [c["title"] for c in apply_duplicates(convs, [0], DuplicatePolicy.COPY)] == ["alpha (imported)", "beta"]
    assert [c["title"] for c in apply_duplicates(convs, [0], "skip")] == ["beta"]
    with pytest.raises(ValueError):
        apply_duplicates(convs, [0], "merge")
    store.close()


def test_defect2_cli_import_skips_duplicates_by_default_and_copies_on_request(tmp_path):
    home = tmp_path / "home"
    doc = {"format": "hearth.conversations", "version": 1, "conversations": [
        {"id": "abc123", "title": "dup me", "system_prompt": "", "settings": {}, "model": "", "created_ms": 7,
         "updated_ms": 7, "messages": [{"role": "user", "content": "hi", "created_ms": 7}]}]}
    path = tmp_path / "one.json"
    path.write_text(json.dumps(doc))
    first = run_cli("conversations", "import", str(path), "--json", home=home)
    assert first.returncode == 0 and json.loads(first.stdout)["imported"] == 1
    again = run_cli("conversations", "import", str(path), "--json", home=home)
    assert again.returncode == 0 and json.loads(again.stdout) == {"imported": 0, "ids": [], "skipped": 1, "copied": 0}
    human = run_cli("conversations", "import", str(path), home=home)
    assert "skipped 1 already here (--duplicates copy imports them as copies)" in human.stdout
    copy = run_cli("conversations", "import", str(path), "--duplicates", "copy", "--json", home=home)
    result = json.loads(copy.stdout)
    assert result["imported"] == 1 and result["copied"] == 1 and result["ids"][0] != "abc123"
    listed = run_cli("conversations", "ls", "--json", home=home)
    assert sorted(c["title"] for c in json.loads(listed.stdout)["conversations"]) == ["dup me", "dup me (imported)"]
    bad = run_cli("conversations", "import", str(path), "--duplicates", "merge", home=home)
    assert bad.returncode != 0 and "Traceback" not in bad.stderr
    assert "error: argument --duplicates: invalid choice: 'merge'" in bad.stderr.splitlines()[-1]
    # A bad file still says what is wrong in one line before anything is looked up.
    (tmp_path / "bad.json").write_text("{not json")
    assert_clean_error(run_cli("conversations", "import", str(tmp_path / "bad.json"), home=home), "not valid JSON")


# 6 ----------------------------------------------------------------------------------------------------------
def test_defect6_verify_all_damaged_shows_the_same_everywhere(qtbot, two_saved):
    w, saved, live = two_saved
    w.new_chat()  # the owls chat is saved to disk too
    qtbot.waitUntil(lambda: w.sidebar.badge(live) == "saved", timeout=TIMEOUT)
    chain = only_conv_path(w.config.paths.checkpoints, saved)
    damaged = chain_block_paths(w.config.paths.checkpoints, chain)[-1]  # a row of its last block
    data = bytearray(damaged.read_bytes())
    data[-7] ^= 0x01
    damaged.write_bytes(bytes(data))
    browser = open_browser(qtbot, w)
    assert w.sidebar.badge(saved) == "saved"  # a header check cannot see a flipped payload byte
    browser.verify_all()
    qtbot.waitUntil(lambda: browser.verify_result.text().startswith("Checked"), timeout=TIMEOUT)
    assert w.sidebar.badge(saved) == "damaged" and w.sidebar.badge(live) == "saved"
    assert cell(browser, saved, 8) == "damaged" and cell(browser, live, 8) == "valid"
    browser.table.selectRow(browser.ids_shown().index(saved))
    assert "damaged" in browser.preview_status.text()
    # Another quick check (the browser reopened) does not un-damage it: the file has not changed since.
    browser.check_contexts(full=False)
    w.sidebar.set_badges(w.contexts.badges())
    assert w.sidebar.badge(saved) == "damaged"
    # Opening the chat rebuilds it: every view moves on together.
    w.open_conversation(saved)
    qtbot.waitUntil(lambda: w.sidebar.badge(saved) == "live", timeout=TIMEOUT)
    assert cell(browser, saved, 8) == "valid" and "damaged" not in browser.preview_status.text()


def test_defect6_the_registry_keeps_a_check_until_the_file_changes(qtbot):
    from app.context_status import ContextStatusRegistry
    from engine.types import ContextBadge, ContextHealth, ContextReport, ContextState, ContextStatus

    reg = ContextStatusRegistry()
    seen: list = []
    reg.changed.connect(seen.append)
    saved = ContextState(ContextBadge.SAVED, 40, "m")
    reg.set_states({"a": saved, "b": ContextState(ContextBadge.LIVE, 9, "m")})
    assert (reg.badge("a"), reg.badge("b"), reg.badge("c")) == ("saved", "live", "none")
    reg.add_report(ContextReport(True, {"a": ContextStatus("a", ContextHealth.DAMAGED, "checksum", "bad record"),
                                        "b": ContextStatus("b", ContextHealth.NONE)}, 0, 0))
    assert seen[-1] == {"a", "b"}
    assert reg.badge("a") == "damaged" and reg.status("a").health == "damaged" and "bad record" in reg.describe("a")
    assert reg.badge("b") == "live"  # what is in memory is used, whatever the disk says
    reg.set_states({"a": saved, "b": ContextState(ContextBadge.LIVE, 9, "m")})  # the same list again
    assert reg.badge("a") == "damaged"
    reg.set_rebuilding("a")
    assert reg.badge("a") == "rebuilding" and reg.badges()["a"].badge == "rebuilding"
    reg.end_rebuilding("a")
    assert reg.badges()["a"].badge == "saved"  # named, so the sidebar drops "rebuilding"
    reg.add_report(ContextReport(True, {"a": ContextStatus("a", ContextHealth.DAMAGED, "checksum")}, 0, 0))
    reg.set_states({"a": ContextState(ContextBadge.SAVED, 52, "m")})  # saved anew: the check is out of date
    assert reg.badge("a") == "saved" and reg.status("a").health == "valid" and reg.status("a").tokens == 52
    reg.mark_dropped(["a"])
    assert reg.badge("a") == "none" and reg.status("a").health == "none"


def test_defect6_dropping_context_shows_none_in_sidebar_and_browser(qtbot, two_saved):
    w, saved, live = two_saved
    browser = open_browser(qtbot, w)
    browser.table.selectRow(browser.ids_shown().index(saved))
    browser.drop_selected_context()
    assert w.sidebar.badge(saved) == "none" and cell(browser, saved, 8) == "none"
    assert "none" in browser.preview_status.text()
    qtbot.waitUntil(lambda: w.contexts.states.get(saved) is None, timeout=TIMEOUT)
    assert w.sidebar.badge(saved) == "none"


# 7 ----------------------------------------------------------------------------------------------------------
@pytest.fixture
def listed(qtbot, windows):
    """A window whose store holds chats whose titles run opposite to their activity, and its browser."""
    w = windows(wait_ready=False)
    for i, title in enumerate(["alpha", "bravo", "charlie", "delta"]):
        c = w.store.create(title=title)
        w.store.append(c.id, "user", f"topic {title} garden")
        with w.store._write() as db:  # activity: alpha newest
            db.execute("UPDATE conversations SET updated_ms = ? WHERE id = ?", (1_000_000 - i * 1000, c.id))
    w.reload_list()
    w.show_browser()
    return w.browser


def test_defect7_browser_default_order_is_last_activity_newest_first(qtbot, listed):
    header = listed.table.horizontalHeader()
    assert (header.sortIndicatorSection(), header.sortIndicatorOrder()) == (3, Qt.SortOrder.DescendingOrder)
    titles = [listed.proxy.index(r, 0).data() for r in range(listed.proxy.rowCount())]
    assert titles == ["alpha", "bravo", "charlie", "delta"]
    listed.query.setText("garden")
    assert [listed.proxy.index(r, 0).data() for r in range(listed.proxy.rowCount())] == titles
    listed.table.sortByColumn(0, Qt.SortOrder.DescendingOrder)  # the person's choice is kept
    listed.query.setText("topic")
    assert [listed.proxy.index(r, 0).data() for r in range(listed.proxy.rowCount())] == titles[::-1]


# 8 ----------------------------------------------------------------------------------------------------------
def test_defect8_preview_follows_the_selection_and_never_shows_a_deleted_chat(qtbot, listed):
    b = listed
    assert b.preview.empty_hint.text() == NOTHING_SELECTED and not b.preview.messages
    assert "Start the conversation" not in b.preview.empty_hint.text()
    b.table.selectRow(0)
    qtbot.waitUntil(lambda: not b.preview.loading, timeout=TIMEOUT)
    assert "alpha" in b.preview_title.text() and [m.text for m in b.preview.messages] == ["topic alpha garden"]
    b.table.selectAll()
    assert b.preview_title.text() == "4 conversations selected" and not b.preview.messages
    b.table.clearSelection()
    assert b.preview_title.text() == "" and b.preview.empty_hint.text() == NOTHING_SELECTED
    b.table.selectRow(0)
    b.delete_selected()
    assert b.preview_title.text() == "" and not b.preview.messages and b.preview_status.text() == ""
    assert b.preview.empty_hint.text() == NOTHING_SELECTED


# 9 ----------------------------------------------------------------------------------------------------------
def test_defect9_a_long_message_never_widens_the_window(qtbot, listed):
    b = listed
    qtbot.waitExposed(b)
    width = b.width()
    long = "Checked 1000: " + ", ".join(f"chat {i} damaged (checksum)" for i in range(80))
    b.verify_result.setText(long)
    qtbot.wait(50)
    assert b.width() == width and b.verify_result.text() == long
    label = b.verify_result  # wrapped on its own line: read whole (issue 27: it was cut at 1,100 px)
    assert label.wordWrap() and label.height() >= label.heightForWidth(label.width())


def test_defect9_every_column_is_visible_at_the_default_size(qtbot, listed):
    b = listed
    qtbot.waitExposed(b)
    header = b.table.horizontalHeader()
    assert header.length() <= b.table.viewport().width()
    assert b.table.horizontalScrollBar().maximum() == 0
    assert all(header.sectionSize(c) >= 40 and not header.isSectionHidden(c) for c in range(header.count()))


def test_defect9_toolbar_and_context_menu_offer_every_action_with_shortcut_and_name(qtbot, listed):
    b = listed
    keys = [a[0] for a in ACTIONS if a[0]]
    assert list(b.buttons) == keys
    for key, act in b.buttons.items():
        assert not act.shortcut().isEmpty(), key
        assert b.toolbar.widgetForAction(act).accessibleName(), key
    assert not b.findChildren(type(b.verify_button), "") or all(
        btn.accessibleName() for btn in b.findChildren(type(b.verify_button)))
    rect = b.table.visualRect(b.proxy.index(2, 0))
    menu = b.context_menu(rect.center())
    assert b.selected_ids() == [b.ids_shown()[2]]  # right-clicking a row selects it
    assert [a for a in menu.actions() if not a.isSeparator()] == [b.buttons[k] for k in MENU_ACTIONS if k]
    menu.close()
    b.table.setFocus()
    qtbot.keyClick(b.table, Qt.Key.Key_Delete)  # the shortcut works from the table
    assert b.undo_bar.isVisible() and len(b.ids_shown()) == 3


def test_defect9_search_snippets_are_vertically_centred_and_not_clipped(qtbot, listed):
    b = listed
    b.query.setText("garden")
    qtbot.waitExposed(b)
    rect = b.table.visualRect(b.proxy.index(0, 1))
    image = b.table.viewport().grab(rect).toImage()
    background = QColor(image.pixel(1, 1))
    inked = [y for y in range(image.height())
             if any(abs(QColor(image.pixel(x, y)).lightness() - background.lightness()) > 60
                    for x in range(2, image.width() - 2))]
    assert inked, "the snippet was not drawn"
    above, below = inked[0], image.height() - 1 - inked[-1]
    assert above >= 1 and below >= 1  # nothing cut at the top or bottom
    assert abs(above - below) <= 4  # centred like the plain cells beside it


# 16 (in the browser too) ----------------------------------------------------------------------------------------
def test_defect16_browser_rename_uses_the_wide_dialog_and_refuses_a_blank_title(qtbot, listed):
    b = listed
    b.table.selectRow(0)
    cid = b.selected_ids()[0]
    dialog = b.rename_selected()
    assert dialog is not None and dialog.isVisible() and dialog.width() >= 420
    assert dialog.edit.text() == "alpha" and dialog.edit.selectedText() == "alpha"
    dialog.edit.setText("   ")
    assert not dialog.ok.isEnabled() and dialog.hint.text()
    dialog.edit.setText("alpha, renamed in the browser")
    qtbot.mouseClick(dialog.ok, Qt.MouseButton.LeftButton)
    assert b.store.get(cid).title == "alpha, renamed in the browser"
    qtbot.waitUntil(lambda: "alpha, renamed in the browser" in [b.proxy.index(r, 0).data()
                                                                for r in range(b.proxy.rowCount())], timeout=TIMEOUT)



# bundle import on the command line: the same --duplicates as the JSON import ---------------------------------------
def test_defect2_cli_bundle_import_skips_duplicates_by_default_and_copies_on_request(tmp_path):
    home = tmp_path / "home"
    doc = {"format": "hearth.conversations", "version": 1, "conversations": [
        {"id": "bundled1", "title": "in the bundle", "system_prompt": "", "settings": {}, "model": "",
         "created_ms": 9, "updated_ms": 9, "messages": [{"role": "user", "content": "hello", "created_ms": 9}]}]}
    (tmp_path / "one.json").write_text(json.dumps(doc))
    assert run_cli("conversations", "import", str(tmp_path / "one.json"), home=home).returncode == 0
    bundle = tmp_path / "one.hearth"
    exported = run_cli("bundle", "export", "bundled1", "--out", str(bundle), home=home)
    assert exported.returncode == 0, exported.stderr
    again = run_cli("bundle", "import", str(bundle), "--json", home=home)
    assert again.returncode == 0, again.stderr
    result = json.loads(again.stdout)
    assert (result["imported"], result["skipped"], result["copied"], result["conversations"]) == (0, 1, 0, [])
    human = run_cli("bundle", "import", str(bundle), home=home)
    assert human.returncode == 0 and "skipped 1 already here (--duplicates copy imports them as copies)" in human.stdout
    copy = run_cli("bundle", "import", str(bundle), "--duplicates", "copy", "--json", home=home)
    result = json.loads(copy.stdout)
    [row] = result["conversations"]
    assert (result["imported"], result["skipped"], result["copied"]) == (1, 0, 1)
    assert row["id"] != "bundled1" and row["original_id"] == "bundled1" and row["title"] == "in the bundle" + COPY_SUFFIX
    listed = run_cli("conversations", "ls", "--json", home=home)
    assert sorted(c["title"] for c in json.loads(listed.stdout)["conversations"]) == [
        "in the bundle", "in the bundle" + COPY_SUFFIX]
    bad = run_cli("bundle", "import", str(bundle), "--duplicates", "merge", home=home)
    assert bad.returncode != 0 and "Traceback" not in bad.stderr
    assert "error: argument --duplicates: invalid choice: 'merge'" in bad.stderr.splitlines()[-1]
    listed = run_cli("conversations", "ls", "--json", home=home)
    assert len(json.loads(listed.stdout)["conversations"]) == 2  # the refused import stored nothing


def test_defect2_engine_bundle_import_refuses_an_unknown_duplicates_policy(tmp_path):
    from engine.api import Hearth, bundles, resolve_paths, to_document

    hearth = Hearth(resolve_paths(tmp_path / "home").ensure())
    try:
        conv = hearth.conversations.create(title="kept once")
        hearth.conversations.append(conv.id, "user", "hi")
        bundle = tmp_path / "b.hearth"
        bundles(hearth).export_bundle(bundle, to_document(hearth.conversations, [conv.id]), [conv.id])
        with pytest.raises(ValueError, match="merge"):
            bundles(hearth).import_bundle(bundle, duplicates="merge")
        assert [c.title for c in hearth.conversations.list()] == ["kept once"]
        assert bundles(hearth).import_bundle(bundle, duplicates=DuplicatePolicy.SKIP).skipped == 1
        assert len(hearth.conversations.list()) == 1
    finally:
        hearth.close()
