"""The saved-conversation browser over real widgets, a real SQLite store of generated conversations
and the real engine (tiny model) for the saved-context actions."""

from __future__ import annotations

import json

import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QMessageBox

from engine.checkpoint.store import conversation_file
from engine.types import BundleExported, BundleImported, Resumed

from .checkpoint_names import as_checkpoint_file, conv_paths, only_conv_path
from .qt_helpers import TIMEOUT, new_chat_with_turn, on_event, send, wait_idle

TOPICS = ["river delta sediment", "crème brûlée caramel", "C++ templates (SFINAE)", "東京 天気 予報",
          "quantum entanglement", "sourdough starter", "Rust borrow checker", "naïve café résumé"]


@pytest.fixture
def browser(qtbot, windows):
    """A window whose store holds generated conversations, and its browser."""
    w = windows()
    for i in range(40):
        topic = TOPICS[i % len(TOPICS)]
        c = w.store.create(model="tiny int4" if i % 3 else "other model")
        w.store.append(c.id, "user", f"Question {i} about {topic}?")
        w.store.append(c.id, "assistant", f"Answer {i}: something about {topic}, item-{i}.")
    w.reload_list()
    w.show_browser()
    b = w.browser
    qtbot.waitUntil(lambda: b.usage_label.text() != "Saved context: …", timeout=TIMEOUT)
    b.window_ = w
    return b


def shown_titles(b) -> list[str]:
    return [b.proxy.index(r, 0).data() for r in range(b.proxy.rowCount())]


def type_query(qtbot, b, text: str) -> None:
    """Type one character at a time (QTest's key clicks only know ASCII; this reaches the same
    textChanged → search path for any text)."""
    b.query.clear()
    for ch in text:
        b.query.insert(ch)


def test_lists_everything_and_sorts_by_column(browser):
    assert browser.proxy.rowCount() == 40
    browser.table.sortByColumn(4, Qt.SortOrder.DescendingOrder)  # messages
    assert browser.proxy.index(0, 4).data() == "2"
    browser.table.sortByColumn(0, Qt.SortOrder.AscendingOrder)
    titles = shown_titles(browser)
    assert titles == sorted(titles, key=str.lower)


def test_search_updates_as_you_type_with_highlighted_snippets(qtbot, browser):
    type_query(qtbot, browser, "sourd")
    assert browser.proxy.rowCount() == 5  # prefix match while typing
    assert "<b>sourdough</b>" in browser.proxy.index(0, 1).data()
    type_query(qtbot, browser, "zeppelin")
    assert browser.proxy.rowCount() == 0
    type_query(qtbot, browser, "creme brulee")  # accents folded
    assert browser.proxy.rowCount() == 5
    type_query(qtbot, browser, "東京")
    assert browser.proxy.rowCount() == 5


@pytest.mark.parametrize("typed", ['"', '"river del', "(((", "-", "-river", "C++", "SFINAE)", "a AND", "NEAR(",
                                   "*", "item-3", "naïve café", "🙂", "'; DROP TABLE messages; --", "%", "^col:x"])
def test_anything_typed_in_the_search_box_never_raises(qtbot, browser, typed):
    type_query(qtbot, browser, typed)
    assert browser.proxy.rowCount() >= 0
    assert "⚠" not in browser.preview_title.text()
    assert browser.store.messages(browser.ids_shown()[0] if browser.ids_shown() else "none") is not None


def test_filters_by_model_and_status(qtbot, browser):
    browser.model_filter.setCurrentIndex(browser.model_filter.findData("other model"))
    assert browser.proxy.rowCount() == 14
    browser.model_filter.setCurrentIndex(0)
    browser.status_filter.setCurrentIndex(3)  # damaged: none yet
    assert browser.proxy.rowCount() == 0
    browser.status_filter.setCurrentIndex(4)  # no saved context: all of them
    assert browser.proxy.rowCount() == 40


def test_preview_and_open_resume_in_the_main_window(qtbot, browser):
    w = browser.window_
    conv = new_chat_with_turn(qtbot, w, "a chat about lighthouses")
    w.new_chat()  # move away: the lighthouse chat is saved on disk
    type_query(qtbot, browser, "lighthouses")
    # The browser lists a chat made since it opened once the window's store check (a timer) reloads it.
    qtbot.waitUntil(lambda: browser.proxy.rowCount() == 1, timeout=TIMEOUT)
    browser.table.selectRow(0)
    # Older messages render a few per event-loop turn; on a busy machine the first may not be in yet.
    qtbot.waitUntil(lambda: not browser.preview.loading, timeout=TIMEOUT)
    assert [m.text for m in browser.preview.messages][0] == "a chat about lighthouses"
    reports = []

    on_event(w.worker, Resumed, lambda e: reports.append((e.conversation, e.resume)))
    browser.open_selected()
    qtbot.waitUntil(lambda: any(c == conv for c, _ in reports), timeout=TIMEOUT)
    assert w.current == conv
    report = next(r for c, r in reports if c == conv)
    assert report.source == "disk" and report.prefilled_tokens == 0


def test_the_preview_shows_each_replys_caption_as_the_chat_does(qtbot, browser):
    """Issue 27 item 19: why a reply ended and which model wrote it, in the preview too."""
    w = browser.window_
    conv = new_chat_with_turn(qtbot, w, "a chat about lanterns", {"temperature": 0.0, "max_new_tokens": 3})
    w.store.append(conv, "user", "and candles?")
    w.store.append(conv, "assistant", "Candles are", "interrupted", "qwen2_5-0_5b q4")
    w.open_conversation(conv)
    qtbot.waitUntil(lambda: not w.transcript.loading and len(w.transcript.messages) == 4, timeout=TIMEOUT)
    in_chat = [m.note.text() for m in w.transcript.messages if m.role == "assistant"]
    assert in_chat == [f"reached the length limit · {w.model_info.label}", "cut off before it ended · qwen2_5-0_5b q4"]
    type_query(qtbot, browser, "lanterns")
    qtbot.waitUntil(lambda: browser.proxy.rowCount() == 1, timeout=TIMEOUT)  # listed once the window's check ran
    browser.table.selectRow(0)
    qtbot.waitUntil(lambda: not browser.preview.loading and len(browser.preview.messages) == 4, timeout=TIMEOUT)
    assert [m.note.text() for m in browser.preview.messages if m.role == "assistant"] == in_chat
    assert [m.note.text() for m in browser.preview.messages if m.role == "user"] == ["", ""]


def test_delete_several_then_undo_then_delete_for_good(qtbot, browser):
    type_query(qtbot, browser, "sourdough")
    browser.table.selectAll()
    ids = browser.selected_ids()
    assert len(ids) == 5
    browser.delete_selected()
    assert browser.undo_bar.isVisible() and "Deleted 5 chats" in browser.undo_label.text()
    assert browser.proxy.rowCount() == 0 and browser.window_.sidebar.item_for(ids[0]) is None
    qtbot.mouseClick(browser.undo_button, Qt.MouseButton.LeftButton)
    assert browser.proxy.rowCount() == 5 and browser.window_.sidebar.item_for(ids[0]) is not None
    browser.table.selectAll()
    browser.delete_selected()
    browser.undo_timer.setInterval(10)  # let the undo window run out now
    browser.undo_timer.start()
    qtbot.waitUntil(lambda: not browser.undo_bar.isVisible(), timeout=TIMEOUT)
    assert all(browser.store.get(i) is None for i in ids)


def test_export_import_round_trip_through_the_browser(qtbot, browser, tmp_path):
    type_query(qtbot, browser, "quantum")
    browser.table.selectAll()
    path = tmp_path / "quantum.json"
    assert browser.transfers.export_selected(str(path), "json") == 5
    md = tmp_path / "quantum.md"
    assert browser.transfers.export_selected(str(md), "md") == 5 and "## You" in md.read_text()
    ids = browser.selected_ids()
    before = json.loads(path.read_text())["conversations"]
    browser.store.purge(ids)
    browser.refresh()
    assert browser.transfers.import_file(str(path))  # on the import thread
    qtbot.waitUntil(lambda: bool(browser.transfers.imported_ids), timeout=TIMEOUT)
    assert sorted(browser.transfers.imported_ids) == sorted(ids)
    after = [c for c in json.loads(json.dumps(before))]
    from engine.transfer import to_document

    again = to_document(browser.store, [c["id"] for c in before])["conversations"]
    assert again == after
    type_query(qtbot, browser, "quantum")
    assert browser.proxy.rowCount() == 5


@pytest.mark.parametrize("content,needle", [
    ("{not json", "not valid JSON"),
    ('{"format": "hearth.conversations", "version": 1, "conversations": [{"title": 3}]}', "conversations[0]"),
])
def test_a_malformed_import_says_what_is_wrong_and_imports_nothing(qtbot, browser, tmp_path, content, needle):
    path = tmp_path / "bad.json"
    path.write_text(content)
    assert browser.transfers.import_file(str(path))
    qtbot.waitUntil(lambda: bool(browser.findChildren(QMessageBox, "browserWarning")), timeout=TIMEOUT)
    box = browser.findChildren(QMessageBox, "browserWarning")[-1]
    assert "Nothing was imported" in box.text() and needle in box.text()
    box.done(0)
    assert browser.proxy.rowCount() == 40


def test_duplicate_as_branch_copies_messages_and_saved_context(qtbot, browser):
    w = browser.window_
    conv = new_chat_with_turn(qtbot, w, "the original chat")
    type_query(qtbot, browser, "original")
    browser.table.selectRow(0)
    browser.duplicate_selected()
    type_query(qtbot, browser, "original")
    assert browser.proxy.rowCount() == 2
    branch = next(i for i in browser.ids_shown() if i != conv)
    qtbot.waitUntil(lambda: bool(conv_paths(w.config.paths.checkpoints, branch)), timeout=TIMEOUT)


def test_verify_all_finds_a_planted_damaged_checkpoint_and_drop_context(qtbot, browser):
    w = browser.window_
    convs = []
    for text in ("first saved chat", "second saved chat"):
        convs.append(new_chat_with_turn(qtbot, w, text))
    w.new_chat()
    damaged = only_conv_path(w.config.paths.checkpoints, convs[0])
    data = bytearray(damaged.read_bytes())
    data[-7] ^= 0x01
    damaged.write_bytes(bytes(data))
    browser.verify_all()
    qtbot.waitUntil(lambda: browser.verify_result.text().startswith("Checked"), timeout=TIMEOUT)
    assert "1 damaged" in browser.verify_result.text() and "1 valid" in browser.verify_result.text()
    assert browser.checkpoints[convs[0]].health == "damaged"
    assert browser.checkpoints[convs[0]].reason == "checksum"
    assert browser.checkpoints[convs[1]].health == "valid" and browser.checkpoints[convs[1]].tokens > 0
    browser.status_filter.setCurrentIndex(3)
    assert browser.ids_shown() == [convs[0]]
    browser.table.selectRow(0)
    browser.drop_selected_context()
    qtbot.waitUntil(lambda: not damaged.exists(), timeout=TIMEOUT)
    assert w.store.get(convs[0]) is not None  # the chat stays


def test_budget_and_reclaim_space(qtbot, browser):
    w = browser.window_
    w.new_chat()
    send(qtbot, w, "something to save")
    wait_idle(qtbot, w)
    browser.budget.setValue(100)
    browser.apply_budget()
    qtbot.waitUntil(lambda: "of 100 MiB" in browser.usage_label.text(), timeout=TIMEOUT)
    stray = w.config.paths.checkpoints / "conv-0123456789abcdef0123456789abcdef.hkv"
    stray.write_bytes(b"HEARTHKV" + bytes(300))  # saved context of no conversation
    browser.reclaim()
    qtbot.waitUntil(lambda: not stray.exists(), timeout=TIMEOUT)
    qtbot.waitUntil(lambda: browser.verify_result.text().startswith("Reclaimed space"), timeout=TIMEOUT)


@pytest.mark.real_model
def test_a_chats_contexts_for_two_models_count_in_its_row_so_the_rows_and_the_total_agree(
        qtbot, windows, real_home, tiny_gguf, tiny_dir, tiny_converted, tmp_path):
    """Issue 27 item 21: a chat that ran on the real model and on the tiny one keeps a saved context for each;
    its row showed only the tiny model's, while the disk line's "chats" counted both."""
    from app.browser_model import COLUMNS, ID_ROLE
    from app.config import AppConfig
    from engine.api import Hearth, resolve_paths
    from engine.types import SamplingParams, TurnRequest

    tiny_converted("int4")
    home = tmp_path / "two-models"
    (home / "converted").mkdir(parents=True)
    (home / "models").symlink_to(real_home / "models")
    for made in [*(tiny_dir / "converted").iterdir(), *(real_home / "converted").iterdir()]:
        if not (home / "converted" / made.name).exists():  # the same conversion may be in both
            (home / "converted" / made.name).symlink_to(made)  # both models' conversions, shared, not copied
    paths = resolve_paths(home).ensure()
    for model in (None, str(tiny_gguf)):  # the default (real) model, then the tiny one
        hearth = Hearth(paths, model=model, weights="int4", provider="cpu")
        hearth.load()
        hearth.run_turn(TurnRequest("both", "Hi.", SamplingParams.greedy_params(), 2), create=True)
        if model is None:  # a chat only the real model ran: its row shows that context, as stale
            hearth.run_turn(TurnRequest("real-only", "Hello.", SamplingParams.greedy_params(), 2), create=True)
        hearth.close()
    w = windows(AppConfig(paths, model=str(tiny_gguf), weights="int4", provider="cpu"))
    new_chat_with_turn(qtbot, w, "tiny only")
    w.show_browser()
    b = w.browser
    qtbot.waitUntil(lambda: b.proxy.rowCount() == 3 and all(b.contexts.status(i) is not None for i in b.ids_shown()),
                    timeout=TIMEOUT)
    qtbot.waitUntil(lambda: all(b.contexts.status(i).disk_bytes for i in b.ids_shown()), timeout=TIMEOUT)
    b.check_contexts(full=False)  # the usage line and the rows from one report
    qtbot.waitUntil(lambda: b.usage_label.text() != "Saved context: …", timeout=TIMEOUT)
    both = b.contexts.status("both")
    assert both.bytes > 0 and len(both.others) == 1 and both.others[0][1] > 0  # the real model's, kept
    rows = sum(b.contexts.status(i).disk_bytes for i in b.ids_shown())
    listed_apart = sum(b.usage.by_kind.get(kind, 0) for kind in ("prefix", "api", "orphan"))
    assert rows + listed_apart == b.usage.bytes and b.usage.by_kind["conversation"] == rows
    row = next(r for r in range(b.proxy.rowCount()) if b.proxy.index(r, 0).data(ID_ROLE) == "both")
    size = b.proxy.index(row, COLUMNS.index("Size"))
    assert size.data() == f"{both.disk_bytes / 2**20:.1f} MiB"
    tip = size.data(Qt.ItemDataRole.ToolTipRole)
    assert f"kept for {both.others[0][0]}" in tip and f"for {both.model}" in tip, tip


def test_hearth_browse_opens_the_browser(qtbot, config):
    from app.main_window import MainWindow

    w = MainWindow(config, start_engine=False)
    qtbot.addWidget(w)
    w.show_browser()
    assert w.browser.isVisible() and w.browser.windowTitle().startswith("Saved conversations")
    w.browser.close()
    w.host.stop()


# bundles: conversations with their saved context ------------------------------------------------------
def test_bundle_round_trip_reuses_the_saved_context(qtbot, browser, tmp_path):
    from .qt_helpers import on_ui_thread

    w = browser.window_
    conv = new_chat_with_turn(qtbot, w, "a bundled chat about owls")
    type_query(qtbot, browser, "owls")
    browser.table.selectRow(0)
    bundle = tmp_path / "owls.hearth"
    done: list = []
    on_ui_thread(w.worker.bundle_done, lambda r: done.append(r))
    browser.transfers.export_bundle(str(bundle))
    qtbot.waitUntil(lambda: bool(done), timeout=TIMEOUT)
    assert isinstance(done[-1], BundleExported) and (done[-1].conversations, done[-1].contexts) == (1, 1)
    w.delete_chat(conv)  # gone: chat and saved context
    qtbot.waitUntil(lambda: not conv_paths(w.config.paths.checkpoints, conv), timeout=TIMEOUT)
    ids = import_bundle(qtbot, browser, bundle)
    assert ids == [conv]
    qtbot.waitUntil(lambda: len(done) == 2, timeout=TIMEOUT)
    assert isinstance(done[-1], BundleImported) and done[-1].used == (conv,) and done[-1].rebuilt == {}
    reports: list = []
    on_event(w.worker, Resumed, lambda e: reports.append((e.conversation, e.resume)))
    w.open_conversation(conv)
    qtbot.waitUntil(lambda: any(c == conv for c, _ in reports), timeout=TIMEOUT)
    report = next(r for c, r in reports if c == conv)
    assert report.source == "disk" and report.prefilled_tokens == 0


def test_a_bundle_from_another_model_keeps_the_chat_and_rebuilds_its_context(qtbot, browser, tmp_path, tiny_dir):
    from engine.bundle import write_bundle
    from engine.install_key import install_key
    from engine.model.synthetic import SyntheticSpec, write_synthetic_gguf
    from engine.transfer import to_document

    w = browser.window_
    conv = new_chat_with_turn(qtbot, w, "made by another model, supposedly")
    doc = to_document(w.store, [conv])
    # The same chat's context, but written by a differently seeded model.
    from engine.checkpoint.store import CheckpointStore
    from engine.generation import Engine
    from engine.model.convert import ensure_converted
    from engine.session import ChatSessions

    other = Engine.load(ensure_converted(write_synthetic_gguf(tiny_dir / "bundle-other.gguf", SyntheticSpec(seed=9)),
                                         "int4", tiny_dir / "converted"), "cpu")
    sessions = ChatSessions(other, CheckpointStore(tmp_path / "other-store"), adaptive=False)
    sessions.sync(conv, w.store.chat_messages(conv))
    sessions.save("turn")
    bundle = tmp_path / "foreign.hearth"
    # Signed with this installation's key: trusted, so only the model fingerprint can turn it away.
    theirs = sessions.store.path(conversation_file(conv, sessions.identity.model_fp))
    write_bundle(bundle, doc, {conv: theirs}, install_key(w.config.paths.data))
    done: list = []
    from .qt_helpers import on_ui_thread

    on_ui_thread(w.worker.bundle_done, lambda r: done.append(r))
    new_ids = import_bundle(qtbot, browser, bundle)
    assert len(new_ids) == 1 and new_ids[0] != conv  # the id was taken: a copy
    qtbot.waitUntil(lambda: bool(done), timeout=TIMEOUT)
    assert done[-1].used == () and dict(done[-1].rebuilt) == {new_ids[0]: "model_mismatch"}
    assert "rebuilt when opened — the saved context was made by a different model" in browser.verify_result.text()
    assert not conv_paths(w.config.paths.checkpoints, new_ids[0])


@pytest.mark.parametrize("trust", [False, True])
def test_context_from_another_installation_is_rebuilt_unless_trusted(qtbot, browser, tmp_path, trust):
    from .qt_helpers import on_ui_thread

    w = browser.window_
    conv = new_chat_with_turn(qtbot, w, "a chat someone else sends")
    bundle = tmp_path / "foreign.hearth"
    from engine.bundle import write_bundle
    from engine.transfer import to_document

    done: list = []
    on_ui_thread(w.worker.bundle_done, lambda r: done.append(r))
    browser.transfers.export_bundle(str(tmp_path / "mine.hearth"))  # saves the live context first
    qtbot.waitUntil(lambda: bool(done), timeout=TIMEOUT)
    import os

    write_bundle(bundle, to_document(w.store, [conv]), {conv: as_checkpoint_file(only_conv_path(w.config.paths.checkpoints, conv))},
                 os.urandom(32))  # another installation's key
    new_ids = import_bundle(qtbot, browser, bundle, trust)
    qtbot.waitUntil(lambda: len(done) == 2, timeout=TIMEOUT)
    if trust:
        assert done[-1].used == tuple(new_ids) and "(trusted by you)" in browser.verify_result.text()
    else:
        assert done[-1].used == () and dict(done[-1].rebuilt) == {new_ids[0]: "untrusted"}
        assert "saved context from another installation: rebuilt" in browser.verify_result.text()
    assert bool(conv_paths(w.config.paths.checkpoints, new_ids[0])) == trust


def import_bundle(qtbot, browser, path, trust=None) -> list[str]:
    """Start a bundle import and wait for its conversations (the import thread's part) to land."""
    assert browser.transfers.import_bundle(str(path), trust=trust, duplicates="copy")  # chats already here: copies
    qtbot.waitUntil(lambda: browser.transfers._import_cancel is None, timeout=TIMEOUT)
    return browser.transfers.imported_ids


def test_a_bundle_imports_off_the_ui_thread_with_progress(qtbot, browser, tmp_path):
    """The conversations go in on the import thread, behind the same progress dialog as a JSON import."""
    path = tmp_path / "big.hearth"
    doc = {"format": "hearth.conversations", "version": 1, "conversations": [
        {"id": f"big-{i}", "title": f"chat {i}", "system_prompt": "", "settings": {}, "model": "", "created_ms": 1,
         "updated_ms": 1, "messages": [{"role": "user", "content": "hello", "created_ms": 1}]} for i in range(2500)]}
    _zip(path, {"conversations.json": json.dumps(doc).encode()})
    before = len(browser.store.list())
    assert browser.transfers.import_bundle(str(path))
    assert browser.transfers.import_progress is not None and browser.transfers.import_progress.isVisible()
    qtbot.waitUntil(lambda: browser.transfers._import_cancel is None, timeout=TIMEOUT)
    assert len(browser.transfers.imported_ids) == 2500 and len(browser.store.list()) == before + 2500


def test_the_trust_question_warns_plainly_and_defaults_to_rebuilding(browser):
    box = browser.transfers.trust_question()
    assert "forged" in box.text() and "trust" in box.text()
    assert box.buttonRole(box.defaultButton()) == QMessageBox.ButtonRole.RejectRole
    box.deleteLater()


@pytest.mark.parametrize("make,needle", [
    (lambda p: p.write_bytes(b"not a zip"), "not a zip archive"),
    (lambda p: _zip(p, {"readme.txt": b"hi"}), "no conversations.json"),
    (lambda p: _zip(p, {"conversations.json": b"{oops"}), "not valid JSON"),
    (lambda p: _zip(p, {"conversations.json": _doc_bytes(), "../escape.hkv": b"x"}), "unexpected entry"),
    (lambda p: _zip(p, {"conversations.json": _doc_bytes(), "context/stranger.hkv": b"x"}), "belongs to no conversation"),
])
def test_malformed_bundles_import_nothing(qtbot, browser, tmp_path, make, needle):
    path = tmp_path / "bad.hearth"
    make(path)
    before, stored = list(browser.transfers.imported_ids), len(browser.store.list())
    assert import_bundle(qtbot, browser, path) == before  # nothing new was imported
    assert len(browser.store.list()) == stored
    qtbot.waitUntil(lambda: bool(browser.findChildren(QMessageBox, "browserWarning")), timeout=TIMEOUT)
    box = browser.findChildren(QMessageBox, "browserWarning")[-1]
    assert needle in box.text()
    box.done(0)
    assert browser.proxy.rowCount() == 40 and browser.store.get("b1") is None


def _zip(path, entries: dict) -> None:
    import zipfile

    with zipfile.ZipFile(path, "w") as z:
        for name, data in entries.items():
            z.writestr(name, data)


def _doc_bytes() -> bytes:
    return json.dumps({"format": "hearth.conversations", "version": 1, "conversations": [
        {"id": "b1", "title": "t", "system_prompt": "", "settings": {}, "model": "", "created_ms": 1,
         "updated_ms": 1, "messages": [{"role": "user", "content": "hi", "created_ms": 1}]}]}).encode()
