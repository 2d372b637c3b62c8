"""JSON import limits (issue 15, items 4 and 5): hostile files fail with the project's own error and
import nothing; large files go in batches that let other writers in, all or nothing, cancellable; the
window imports off its UI thread. Real files, real SQLite, real widgets."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PySide6.QtWidgets import QMessageBox, QProgressDialog, QPushButton

from engine.conversations import ConversationStore
from engine.errors import HearthError, ImportCancelledError, TransferError
from engine.transfer import MAX_IMPORT_BYTES, import_json
from engine.types import CancelToken

from .qt_helpers import TIMEOUT

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def store(tmp_path) -> ConversationStore:
    s = ConversationStore(tmp_path / "conversations.db")
    yield s
    s.close()


def conversation(i: int, content: str = "hi", **extra) -> dict:
    return {"id": f"c{i}", "title": f"chat {i}", "system_prompt": "", "settings": {}, "model": "", "created_ms": 1,
            "updated_ms": 2, "messages": [{"role": "user", "content": content, "created_ms": 1}], **extra}


def write_doc(path: Path, conversations: list[dict]) -> Path:
    path.write_text(json.dumps({"format": "hearth.conversations", "version": 1, "conversations": conversations}))
    return path


def count(db: Path, table: str = "conversations") -> int:
    with sqlite3.connect(db) as con:
        return con.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0]


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "engine.cli", *args], capture_output=True, text=True, cwd=REPO,
                          timeout=300)


# hostile input ------------------------------------------------------------------------------------------
def test_deep_nesting_is_a_clean_error(store, tmp_path):
    path = tmp_path / "deep.json"
    path.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(TransferError, match="nests lists or objects too deeply"):
        import_json(store, path)
    assert count(store.path) == 0


def test_deep_settings_are_refused_naming_the_conversation(store, tmp_path):
    nested: dict = {}
    for _ in range(40):
        nested = {"k": nested}
    path = write_doc(tmp_path / "deep-settings.json", [conversation(0), conversation(1, settings=nested)])
    with pytest.raises(TransferError, match=r"conversations\[1\]\.settings.*nested more than 32"):
        import_json(store, path)
    assert count(store.path) == 0


@pytest.mark.parametrize("where,conv", [
    (r"conversations\[1\]\.messages\[0\]\.content: character 3 is a lone UTF-16 surrogate \(U\+D800\)",
     conversation(1, "abc\ud800")),
    (r"conversations\[1\]\.title", conversation(1, title="x\udfff")),
    (r"conversations\[1\]\.settings\['a'\]", conversation(1, settings={"a": "é\udc00"})),
])
def test_a_lone_surrogate_is_a_clean_error_naming_the_message(store, tmp_path, where, conv):
    path = write_doc(tmp_path / "surrogate.json", [conversation(0), conv])  # json.dumps writes "\ud800"
    assert "\\ud" in path.read_text()
    with pytest.raises(TransferError, match=where):
        import_json(store, path)
    assert count(store.path) == 0


def test_a_file_over_the_bound_is_refused_before_it_is_read(store, tmp_path):
    path = tmp_path / "huge.json"
    with path.open("wb") as fh:  # sparse: no disk used, and reading it would take seconds
        fh.truncate(MAX_IMPORT_BYTES + 1)
    if os.geteuid() != 0:
        path.chmod(0)  # unreadable: the size is the reason given, so the file was never opened
    started = time.monotonic()
    with pytest.raises(TransferError, match=f"an import may be at most {MAX_IMPORT_BYTES >> 20} MiB"):
        import_json(store, path)
    assert time.monotonic() - started < 1
    assert MAX_IMPORT_BYTES == 256 << 20


def test_the_cli_prints_one_line_and_exits_non_zero(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text("[" * 100_000)
    proc = cli("conversations", "import", str(path), "--data-dir", str(tmp_path / "home"))
    assert proc.returncode != 0
    assert proc.stderr.startswith("hearth-cli: error: bad.json nests lists") and proc.stderr.count("\n") == 1
    assert "Traceback" not in proc.stderr
    surrogate = write_doc(tmp_path / "s.json", [conversation(0, "\ud800")])
    proc = cli("conversations", "import", str(surrogate), "--data-dir", str(tmp_path / "home"))
    assert proc.returncode != 0 and "conversations[0].messages[0].content" in proc.stderr


def test_the_cli_imports_a_good_file(tmp_path):
    path = write_doc(tmp_path / "good.json", [conversation(i) for i in range(3)])
    proc = cli("conversations", "import", str(path), "--data-dir", str(tmp_path / "home"), "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == {"imported": 3, "ids": ["c0", "c1", "c2"], "skipped": 0, "copied": 0}


# large imports ------------------------------------------------------------------------------------------
def test_a_large_import_lands_completely_in_batches_that_let_other_writers_in(store, tmp_path):
    n = 20_000
    path = write_doc(tmp_path / "large.json", [conversation(i, f"message {i}") for i in range(n)])
    other = ConversationStore(store.path)  # a second connection, as the CLI or the window would have
    seen: list[tuple[int, int, int]] = []

    def progress(done: int, total: int) -> None:
        # between batches: the other connection can write, and sees none of the import yet
        other.create(f"other-{done}")
        seen.append((done, total, len(other.list())))

    ids = import_json(store, path, progress=progress)
    assert len(ids) == n and ids[0] == "c0" and ids[-1] == f"c{n - 1}"
    assert [d for d, _, _ in seen] == list(range(0, n + 1, 1000))
    assert all(visible == i + 1 for i, (_, _, visible) in enumerate(seen))  # only the other's rows showed
    assert len(other.list()) == n + len(seen)  # now everything shows
    assert store.messages("c19999")[0].content == "message 19999"
    assert count(store.path, "imports") == 0
    other.close()


def test_cancel_mid_import_removes_everything_it_added(store, tmp_path):
    store.create("mine")
    path = write_doc(tmp_path / "large.json", [conversation(i) for i in range(5_000)])
    cancel = CancelToken()

    def progress(done: int, total: int) -> None:
        if done >= 3000:
            cancel.cancel()

    with pytest.raises(ImportCancelledError, match="cancelled; the 3,000 conversations it had added were removed"):
        import_json(store, path, progress=progress, cancel=cancel)
    assert [c.id for c in store.list()] == ["mine"]
    assert count(store.path) == 1 and count(store.path, "messages") == 0 and count(store.path, "imports") == 0


def test_a_failure_mid_import_removes_everything_it_added(store, tmp_path):
    path = write_doc(tmp_path / "large.json", [conversation(i) for i in range(3_000)])

    def progress(done: int, total: int) -> None:
        if done == 2000:  # a failure between batches, after two were stored
            raise TransferError("the disk went away")

    with pytest.raises(TransferError, match="the disk went away; the 2,000 conversations it had added were removed"):
        import_json(store, path, progress=progress)
    assert count(store.path) == 0


def test_an_abandoned_import_stays_hidden_and_the_next_import_removes_it(store, tmp_path):
    stale = store.begin_import()
    store.insert_batch([{**conversation(7), "id": "orphan"}], stale)  # its process "died" here
    assert store.list() == []
    with sqlite3.connect(store.path) as con:
        con.execute("UPDATE imports SET beat_ms = 0")
    import_json(store, write_doc(tmp_path / "one.json", [conversation(1)]))
    assert [c.id for c in store.list()] == ["c1"] and count(store.path) == 1  # the orphan row is gone


# fuzz -------------------------------------------------------------------------------------------------------
_scalars = st.none() | st.booleans() | st.integers(-(2**60), 2**60) | st.floats(allow_nan=False) | st.text(max_size=8)
_json = st.recursive(_scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner,
                                                                                            max_size=4), max_leaves=20)
_message = st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant", "robot", 3]), "content": st.text(max_size=6)
                                  | _json, "created_ms": st.integers(-5, 2**54) | _json})
_conversation = st.fixed_dictionaries(
    {"title": st.text(max_size=6) | _json, "system_prompt": st.text(max_size=4), "settings": st.dictionaries(
        st.text(max_size=4), _json, max_size=3) | _json, "model": st.text(max_size=4), "created_ms": st.integers(0, 9),
     "updated_ms": st.integers(0, 9), "messages": st.lists(_message, max_size=3) | _json},
    optional={"id": st.text(max_size=6) | st.sampled_from(["a", "b"]) | _json})
_document = st.fixed_dictionaries({"format": st.just("hearth.conversations") | _json, "version": st.just(1) | _json,
                                   "conversations": st.lists(_conversation | _json, max_size=4) | _json}) | _json


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                 HealthCheck.too_slow])
@given(doc=_document, raw_tail=st.sampled_from(["", "]", "\\ud800", "[[[[", "\"", "{"]))
def test_fuzzed_documents_only_raise_hearths_own_errors(tmp_path, doc, raw_tail):
    path = tmp_path / "fuzz.json"
    text = json.dumps(doc)
    path.write_text(text + raw_tail if raw_tail and len(text) % 3 == 0 else text, encoding="utf-8",
                    errors="surrogatepass")
    fuzz_store = ConversationStore(tmp_path / "fuzz.db")
    try:
        import_json(fuzz_store, path)
        exported = [c.id for c in fuzz_store.list()]
        assert len(exported) == len(set(exported))
    except HearthError:
        pass  # the project's own error: anything else fails the test
    finally:
        fuzz_store.close()
        (tmp_path / "fuzz.db").unlink()


# the window ---------------------------------------------------------------------------------------------------
@pytest.fixture
def browser(qtbot, windows):
    w = windows()
    w.store.create("existing")
    w.reload_list()
    w.show_browser()
    return w.browser


def test_the_window_imports_off_the_ui_thread_and_cancel_removes_it(qtbot, browser, tmp_path):
    path = write_doc(tmp_path / "large.json", [conversation(i) for i in range(20_000)])
    ticks: list[float] = []
    timer_id = browser.startTimer(20)
    browser.timerEvent = lambda _event: ticks.append(time.monotonic())  # the UI thread's event loop ticking
    assert browser.transfers.import_file(str(path))
    dialog = browser.findChild(QProgressDialog, "importProgress")
    assert dialog is not None and dialog.isVisible()
    qtbot.waitUntil(lambda: dialog.value() >= 2000, timeout=TIMEOUT)  # batches are landing
    assert len(ticks) > 3  # the UI kept processing events meanwhile
    assert browser.store.get("c0") is None  # stored, but hidden until the last batch
    dialog.findChild(QPushButton).click()  # the dialog's Cancel button
    qtbot.waitUntil(lambda: browser.transfers.import_progress is None, timeout=TIMEOUT)
    qtbot.waitUntil(lambda: bool(browser.findChildren(QMessageBox, "browserWarning")), timeout=TIMEOUT)
    box = browser.findChildren(QMessageBox, "browserWarning")[-1]
    assert "Nothing was imported: the import was cancelled" in box.text() and "were removed" in box.text()
    box.done(0)
    browser.killTimer(timer_id)
    assert [c.id for c in browser.store.list()] == ["existing"]
    assert count(browser.store.path) == 1


def test_the_window_shows_a_bad_file_in_a_dialog(qtbot, browser, tmp_path):
    path = write_doc(tmp_path / "bad.json", [conversation(0), conversation(1, "oops\ud800")])
    assert browser.transfers.import_file(str(path))
    qtbot.waitUntil(lambda: bool(browser.findChildren(QMessageBox, "browserWarning")), timeout=TIMEOUT)
    box = browser.findChildren(QMessageBox, "browserWarning")[-1]
    assert "Nothing was imported" in box.text() and "conversations[1].messages[0].content" in box.text()
    assert "lone UTF-16 surrogate" in box.text()
    box.done(0)
    assert browser.buttons["import"].isEnabled()
    assert browser.proxy.rowCount() == 1
