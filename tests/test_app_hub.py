"""The Models dialog's Hugging Face tab (issue 32): search GGUF repositories, a repository's GGUF files (size,
quantization, memory; a split GGUF as one file), a download with progress, Cancel and a retry that resumes,
a gated repository opened with a token pasted into the tab (kept in the secret store only), and no network
said plainly while the local models keep working. The hub is tests/hub_server.py: a real HTTP server on
127.0.0.1 answering the hub's endpoints over real files."""

from __future__ import annotations

import logging
import socket
from pathlib import Path

import pytest
from PySide6.QtCore import Qt

from tests.gguf_split import split_gguf
from tests.hub_server import HubServer
from tests.qt_helpers import TIMEOUT

REPO = "hearth-test/tiny-GGUF"
TINY = "tiny-Q8_0.gguf"
GATED = "hearth-test/gated-GGUF"
TOKEN = "hf_gatedtoken0123456789"
SHOTS = Path("/tmp")


@pytest.fixture
def hub(monkeypatch, tiny_gguf, tmp_path):
    server = HubServer()
    monkeypatch.setenv("HF_ENDPOINT", server.url)
    server.add_repo(REPO, {TINY: tiny_gguf}, downloads=1234, likes=56)
    folder = tmp_path / "split"
    folder.mkdir()
    parts = split_gguf(tiny_gguf, folder, 3, stem="tiny-split-Q8_0")
    server.add_repo("hearth-test/tiny-split-GGUF", {p.name: p for p in parts}, downloads=12, likes=1)
    server.add_repo(GATED, {"gated-Q8_0.gguf": tiny_gguf}, gated=True, token=TOKEN, downloads=7)
    yield server
    server.close()


def hub_tab(w):
    w.models.show_dialog()
    dialog = w.models.dialog
    dialog.tabs.setCurrentWidget(dialog.hub_panel)
    return dialog, dialog.hub_panel


def search(qtbot, panel, text: str) -> None:
    panel.query.clear()
    qtbot.keyClicks(panel.query, text)
    qtbot.mouseClick(panel.search_button, Qt.MouseButton.LeftButton)


def select_repo(qtbot, panel, repo: str) -> None:
    qtbot.waitUntil(lambda: any(r.id == repo for r in panel.repos), timeout=TIMEOUT)
    row = [r.id for r in panel.repos].index(repo)
    panel.repo_table.selectRow(row)
    qtbot.waitUntil(lambda: panel.repo == repo and bool(panel.files), timeout=TIMEOUT)


def select_file(panel, filename: str) -> None:
    row = [f.filename for f in panel.files].index(filename)
    panel.file_table.selectRow(row)


def download(qtbot, panel) -> None:
    assert panel.download_button.isEnabled()
    qtbot.mouseClick(panel.download_button, Qt.MouseButton.LeftButton)


def test_search_list_and_download_into_the_library(qtbot, windows, hub):
    w = windows()
    dialog, panel = hub_tab(w)
    search(qtbot, panel, "tiny")
    qtbot.waitUntil(lambda: panel.repo_table.rowCount() == 2, timeout=TIMEOUT)
    assert panel.repo_table.item(0, 0).text() == REPO  # most downloaded first
    assert panel.repo_table.item(0, 1).text() == "1,234" and panel.repo_table.item(0, 3).text() == "open"
    select_repo(qtbot, panel, REPO)
    assert panel.file_table.item(0, 0).text() == TINY
    assert panel.file_table.item(0, 1).text() == "Q8_0"
    assert panel.file_table.item(0, 2).text().endswith("KB")
    assert panel.file_table.item(0, 3).text().startswith("about ")
    dialog.resize(900, 620)
    dialog.grab().save(str(SHOTS / "hearth-hub-tab.png"))
    select_file(panel, TINY)
    progress = []
    panel.hub.worker.progress.connect(progress.append)
    download(qtbot, panel)
    qtbot.waitUntil(lambda: panel.downloading is None, timeout=TIMEOUT)
    assert panel.progress_text.text().startswith("Downloaded "), panel.message.text()
    qtbot.waitUntil(lambda: any(m.source == "hub" and m.status == "ready" for m in w.models.models.values()),
                    timeout=TIMEOUT)
    qtbot.waitUntil(lambda: any(dialog.models[name].source == "hub" for name in dialog.models), timeout=TIMEOUT)
    assert (w.config.paths.models / TINY).is_file()
    dialog.grab().save(str(SHOTS / "hearth-hub-downloaded.png"))
    assert panel.use_button.isVisible()
    chat = w.new_chat()
    qtbot.mouseClick(panel.use_button, Qt.MouseButton.LeftButton)  # the downloaded model for the open chat
    name = panel.installed_model.name
    qtbot.waitUntil(lambda: w.model_info is not None and w.model_info.key == name, timeout=TIMEOUT)
    assert w.store.get(chat).model_key == name


def test_a_split_gguf_is_one_file(qtbot, windows, hub):
    w = windows()
    _dialog, panel = hub_tab(w)
    search(qtbot, panel, "split")
    select_repo(qtbot, panel, "hearth-test/tiny-split-GGUF")
    assert panel.file_table.rowCount() == 1
    assert "one model in 3 parts" in panel.file_table.item(0, 0).text()
    select_file(panel, panel.files[0].filename)
    download(qtbot, panel)
    qtbot.waitUntil(lambda: panel.downloading is None, timeout=TIMEOUT)
    assert panel.progress_text.text().startswith("Downloaded "), panel.message.text()


def test_a_cut_download_is_retried_and_resumes(qtbot, windows, hub, real_home):
    real = real_home / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    if not real.is_file():
        pytest.skip("the real model is not in the test cache")
    hub.add_repo("hearth-test/SmolLM2-GGUF", {real.name: real}, downloads=99999)
    w = windows()
    _dialog, panel = hub_tab(w)
    search(qtbot, panel, "SmolLM2")
    select_repo(qtbot, panel, "hearth-test/SmolLM2-GGUF")
    select_file(panel, real.name)
    hub.cut_after = 5 << 20
    download(qtbot, panel)
    qtbot.waitUntil(lambda: panel.downloading is None, timeout=TIMEOUT)
    assert panel.message.isVisible() and panel.retry_button.isVisible()
    assert "Traceback" not in panel.message.text() and panel.progress_text.text() == "The download stopped."
    assert not (w.config.paths.models / real.name).exists()
    kept = (w.config.paths.models / ".downloads" / (real.name + ".part")).stat().st_size
    assert 0 < kept <= 5 << 20
    panel.grab().save(str(SHOTS / "hearth-hub-failed.png"))
    qtbot.mouseClick(panel.retry_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: panel.downloading is None and panel.progress_text.text().startswith("Downloaded"),
                    timeout=TIMEOUT)
    assert hub.downloads()[-1]["range"] == f"bytes={kept}-"  # it resumed where the cut left it
    assert not panel.retry_button.isVisible() and not panel.message.isVisible()


def test_cancel_stops_the_download_and_retry_resumes(qtbot, windows, hub, real_home):
    real = real_home / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    if not real.is_file():
        pytest.skip("the real model is not in the test cache")
    hub.add_repo("hearth-test/SmolLM2-GGUF", {real.name: real}, downloads=99999)
    hub.pause_s = 0.05  # after each MiB: slow enough to cancel
    w = windows()
    _dialog, panel = hub_tab(w)
    search(qtbot, panel, "SmolLM2")
    select_repo(qtbot, panel, "hearth-test/SmolLM2-GGUF")
    select_file(panel, real.name)
    download(qtbot, panel)
    qtbot.waitUntil(lambda: panel.progress.value() > 0 and "/s" in panel.progress_text.text(), timeout=TIMEOUT)
    assert panel.cancel_button.isVisible() and not panel.download_button.isEnabled()
    assert " of " in panel.progress_text.text()  # "12.0 MB of 88.0 MB · 20.0 MB/s · about 4 s left"
    qtbot.mouseClick(panel.cancel_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: panel.downloading is None, timeout=TIMEOUT)
    assert panel.progress_text.text() == "Download cancelled." and panel.retry_button.isVisible()
    assert "resume" in panel.message.text()
    hub.pause_s = 0.0
    qtbot.mouseClick(panel.retry_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: panel.downloading is None and panel.progress_text.text().startswith("Downloaded"),
                    timeout=TIMEOUT)
    assert (hub.downloads()[-1]["range"] or "").startswith("bytes=")  # resumed, not from the start


def test_a_gated_repository_opens_with_a_token_kept_in_the_secret_store(qtbot, windows, hub, caplog):
    caplog.set_level(logging.DEBUG)
    w = windows()
    _dialog, panel = hub_tab(w)
    qtbot.waitUntil(lambda: panel.token_note.text() == "no token saved", timeout=TIMEOUT)
    assert panel.token.echoMode() == panel.token.EchoMode.Password and not panel.forget_token.isEnabled()
    search(qtbot, panel, "gated")
    qtbot.waitUntil(lambda: panel.repo_table.rowCount() == 1, timeout=TIMEOUT)
    assert panel.repo_table.item(0, 3).text() == "gated: needs a token"
    panel.repo_table.selectRow(0)
    qtbot.waitUntil(lambda: bool(panel.files) or panel.message.isVisible(), timeout=TIMEOUT)
    if panel.files:  # the hub lists a gated repo's files; the download is what needs the token
        select_file(panel, "gated-Q8_0.gguf")
        download(qtbot, panel)
        qtbot.waitUntil(lambda: panel.downloading is None, timeout=TIMEOUT)
    assert "token" in panel.message.text(), panel.message.text()
    qtbot.keyClicks(panel.token, TOKEN)
    qtbot.mouseClick(panel.save_token, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: panel.token_note.text() == "a token is saved", timeout=TIMEOUT)
    assert panel.token.text() == "" and panel.forget_token.isEnabled()
    panel.repo = None  # list again, now with the token
    panel.repo_table.clearSelection()
    panel.repo_table.selectRow(0)
    qtbot.waitUntil(lambda: bool(panel.files), timeout=TIMEOUT)
    select_file(panel, "gated-Q8_0.gguf")
    download(qtbot, panel)
    qtbot.waitUntil(lambda: panel.downloading is None, timeout=TIMEOUT)
    assert panel.progress_text.text().startswith("Downloaded"), panel.message.text()
    data = w.config.paths.data
    holding = [p.name for p in data.rglob("*") if p.is_file() and not p.is_symlink() and TOKEN.encode() in p.read_bytes()]
    assert set(holding) <= {"secrets.json"}
    assert TOKEN not in caplog.text
    qtbot.mouseClick(panel.forget_token, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: panel.token_note.text() == "no token saved", timeout=TIMEOUT)


def test_bad_input_is_refused_in_words(qtbot, windows, hub):
    w = windows()
    _dialog, panel = hub_tab(w)
    search(qtbot, panel, "   ")
    assert "Type part of a model's name" in panel.message.text()
    search(qtbot, panel, "no-such-model-anywhere")
    qtbot.waitUntil(lambda: "No GGUF repositories match" in panel.message.text(), timeout=TIMEOUT)
    search(qtbot, panel, "x" * 500)
    qtbot.waitUntil(lambda: "at most" in panel.message.text(), timeout=TIMEOUT)
    assert panel.search_button.isEnabled()
    panel._save_token()  # nothing pasted
    assert "Paste an access token" in panel.message.text()


def test_without_the_network_it_says_so_and_local_models_keep_working(qtbot, windows, monkeypatch):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
    w = windows()
    dialog, panel = hub_tab(w)
    search(qtbot, panel, "tiny")
    qtbot.waitUntil(lambda: panel.message.isVisible(), timeout=TIMEOUT)
    assert "cannot be reached" in panel.message.text() and "keep working" in panel.message.text()
    assert panel.search_button.isEnabled()
    dialog.resize(900, 420)
    dialog.grab().save(str(SHOTS / "hearth-hub-offline.png"))
    dialog.tabs.setCurrentIndex(0)
    qtbot.waitUntil(lambda: dialog.table.rowCount() > 0, timeout=TIMEOUT)  # the local models are listed still


@pytest.mark.parametrize("status", [429, 503, 500])
def test_a_hub_that_refuses_says_so_plainly(qtbot, windows, hub, status):
    w = windows()
    _dialog, panel = hub_tab(w)
    hub.api_status = status
    search(qtbot, panel, "tiny")
    qtbot.waitUntil(lambda: panel.message.isVisible() and panel.search_button.isEnabled(), timeout=TIMEOUT)
    text = panel.message.text()
    assert text and "Traceback" not in text and "{" not in text, text
    hub.api_status = None
    search(qtbot, panel, "tiny")  # and it works again once the hub answers
    qtbot.waitUntil(lambda: panel.repo_table.rowCount() == 2, timeout=TIMEOUT)
