"""The window on a remote server (issue 32): a server added in the Models dialog's Servers tab (typed into
the real widgets), its models in the picker as NAME/MODEL, turns streamed from it into the transcript and
stored here, Stop, what the server said of its cache, the `remote` badge, plain errors (a refused key, an
unreachable server, bad input), a chat moved local → remote → local, and the key kept out of every file
but the secret store and out of the log. The remote is a real Hearth server on 127.0.0.1 with its own
data dir (tests/server_helpers.py)."""

from __future__ import annotations

import logging
import socket
from pathlib import Path

import pytest
from PySide6.QtCore import Qt

from engine.api import ModelLibrary, resolve_paths
from engine.server.config import ServerSettings
from engine.types import Finished, ResumeSource, StopReason, Token
from tests.qt_helpers import TIMEOUT, collect_dispatched, send, use_settings, wait_idle
from tests.server_helpers import LiveServer

KEY = "lab-secret-key-4242"
TINY = "tiny"
SHOTS = Path("/tmp")


@pytest.fixture
def server(tmp_path, tiny_dir, tiny_gguf, tiny_converted):
    """A real Hearth server on the tiny model, with its own data dir, asking for KEY."""
    tiny_converted("int4")
    home = tmp_path / "server-home"
    home.mkdir()
    (home / "converted").symlink_to(tiny_dir / "converted")
    paths = resolve_paths(home).ensure()
    assert ModelLibrary(paths).add(tiny_gguf).name == TINY
    live = LiveServer(paths, TINY, ServerSettings(api_key=KEY))
    yield live
    live.close()


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def servers_tab(qtbot, w):
    w.models.show_dialog()
    dialog = w.models.dialog
    dialog.tabs.setCurrentWidget(dialog.servers)
    return dialog, dialog.servers


def add_server(qtbot, panel, name: str, url: str, key: str = ""):
    """Type a server into the Add dialog and press Add, as a person would."""
    qtbot.mouseClick(panel.add_button, Qt.MouseButton.LeftButton)
    add = panel.add_dialog
    assert add is not None and add.isVisible()
    add.name.clear()
    add.url.clear()
    add.key.clear()
    qtbot.keyClicks(add.name, name)
    qtbot.keyClicks(add.url, url)
    if key:
        qtbot.keyClicks(add.key, key)
    assert add.key.echoMode() == add.key.EchoMode.Password
    qtbot.mouseClick(add.add_button, Qt.MouseButton.LeftButton)
    return add


def wait_row(qtbot, panel, name: str, status_has: str = ""):
    qtbot.waitUntil(lambda: panel.server_row(name) is not None and status_has in panel.server_row(name).text(3),
                    timeout=TIMEOUT)
    return panel.server_row(name)


def pick(w, key: str) -> None:
    index = w.models.picker.findData(key)
    assert index >= 0, f"{key} is not offered by the picker"
    w.models.picker.setCurrentIndex(index)
    w.models.picker.activated.emit(index)


def wait_model(qtbot, w, key: str) -> None:
    qtbot.waitUntil(lambda: w.model_info is not None and w.model_info.key == key, timeout=TIMEOUT)


def files_holding(root: Path, text: str) -> list[str]:
    found = []
    for path in root.rglob("*"):
        if path.is_file() and not path.is_symlink():
            try:
                if text.encode() in path.read_bytes():
                    found.append(path.name)
            except OSError:
                pass
    return found


def test_a_server_added_in_the_dialog_runs_chats_that_stream_and_are_stored_here(qtbot, windows, server, caplog):
    caplog.set_level(logging.DEBUG)
    w = windows()
    dialog, panel = servers_tab(qtbot, w)
    add = add_server(qtbot, panel, "lab", server.base, KEY)
    row = wait_row(qtbot, panel, "lab", "model")
    qtbot.waitUntil(lambda: not add.isVisible(), timeout=TIMEOUT)  # it closed: the server was added
    assert add.key.text() == ""  # the dialog forgot the key
    assert row.text(2) == "yes" and row.text(1) == server.base
    assert [row.child(i).data(0, Qt.ItemDataRole.UserRole) for i in range(row.childCount())] == ["lab/tiny"]
    dialog.resize(900, 480)
    dialog.grab().save(str(SHOTS / "hearth-servers-tab.png"))
    # the picker lists the server's model under its name
    qtbot.waitUntil(lambda: w.models.picker.findData("lab/tiny") >= 0, timeout=TIMEOUT)
    picker = w.models.picker
    heading = picker.findText(f"lab — {server.base}")
    assert heading >= 0 and not picker.model().item(heading).isEnabled()  # a heading, not a choice
    picker.showPopup()
    picker.view().window().grab().save(str(SHOTS / "hearth-picker-remote.png"))
    picker.hidePopup()
    chat = w.new_chat()
    use_settings(w, {"temperature": 0.0, "max_new_tokens": 8})
    dialog.close()
    pick(w, "lab/tiny")
    wait_model(qtbot, w, "lab/tiny")
    assert "lab" in w.status.model.text()  # the provider shown is the server's name
    tokens = collect_dispatched(w.turns, Token)
    finished = collect_dispatched(w.turns, Finished)
    send(qtbot, w, "Name three rivers.")
    wait_idle(qtbot, w)
    assert tokens and finished and finished[-1][1].local is None  # streamed from the server
    stored = w.store.messages(chat)
    assert [m.role for m in stored] == ["user", "assistant"] and stored[1].content == finished[-1][1].reply
    assert w.store.get(chat).model_key == "lab/tiny"
    first = w.status.resume.text()
    assert "cached" in first  # "the server had N of M tokens cached", or that it did not say
    send(qtbot, w, "And three lakes?")
    wait_idle(qtbot, w)
    last = finished[-1][1]
    assert last.server_cached_tokens is not None  # Hearth's server reports its prefix cache
    assert 0 < last.server_cached_tokens <= last.prompt_tokens
    assert w.status.resume.text() == (f"the server had {last.server_cached_tokens:,} of "
                                      f"{last.prompt_tokens:,} tokens cached")
    qtbot.waitUntil(lambda: w.sidebar.badge(chat) == "remote", timeout=TIMEOUT)
    w.resize(1100, 700)
    w.grab().save(str(SHOTS / "hearth-remote-chat.png"))
    # the key: in the secret store only, never in the log
    data = w.config.paths.data
    assert set(files_holding(data, KEY)) <= {"secrets.json"}
    assert KEY not in caplog.text


def test_stop_closes_the_stream_and_keeps_what_arrived(qtbot, windows, server):
    w = windows()
    _dialog, panel = servers_tab(qtbot, w)
    add_server(qtbot, panel, "lab", server.base, KEY)
    row = wait_row(qtbot, panel, "lab", "model")
    chat = w.new_chat()
    use_settings(w, {"temperature": 0.8, "max_new_tokens": 400})
    assert not panel.use_button.isEnabled()  # nothing chosen yet
    panel.tree.setCurrentItem(row.child(0))
    assert panel.use_button.isEnabled()
    qtbot.mouseClick(panel.use_button, Qt.MouseButton.LeftButton)  # "Use for this chat" in the Servers tab
    wait_model(qtbot, w, "lab/tiny")
    # the chat remembers its model once the window hears "ready", a moment after the worker says it
    qtbot.waitUntil(lambda: w.store.get(chat).model_key == "lab/tiny", timeout=TIMEOUT)
    qtbot.waitUntil(lambda: w.models.picker.currentData() == "lab/tiny", timeout=TIMEOUT)  # it follows a moment later
    qtbot.wait(300)
    assert not w.models.dialog.message.isVisible() and not panel.message.isVisible()  # no error anywhere
    w.models.dialog.close()
    finished = collect_dispatched(w.turns, Finished)
    send(qtbot, w, "Write a long story about a lighthouse keeper.")
    qtbot.waitUntil(lambda: w.turns.turn(chat) is not None and len(w.turns.turn(chat).reply) > 0, timeout=TIMEOUT)
    w.stop()
    wait_idle(qtbot, w)
    assert finished and finished[-1][1].stop_reason in (StopReason.CANCELLED, StopReason.EOS)
    stored = w.store.messages(chat)
    assert stored[0].role == "user"
    if finished[-1][1].stop_reason == StopReason.CANCELLED:
        assert len(finished[-1][1].reply) < 1600
    assert w.send_button.isEnabled()


def test_a_refused_key_says_so_plainly_and_never_shows_the_key(qtbot, windows, server, caplog):
    caplog.set_level(logging.DEBUG)
    w = windows()
    _dialog, panel = servers_tab(qtbot, w)
    wrong = "not-the-right-key-777"
    add_server(qtbot, panel, "lab", server.base, wrong)
    row = wait_row(qtbot, panel, "lab")
    qtbot.waitUntil(lambda: row.text(3) != "" or panel.server_row("lab").text(3) != "", timeout=TIMEOUT)
    status = panel.server_row("lab").text(3)
    assert status and wrong not in status and "Traceback" not in status
    w.models.dialog.close()
    w.new_chat()
    w.models.choose("lab/tiny")  # a refused key lists no models: the picker cannot offer it
    banner = w.models.server_banner
    qtbot.waitUntil(lambda: banner.isVisible(), timeout=TIMEOUT)
    note = banner.message.text()
    assert "lab/tiny cannot be used now" in note and wrong not in note and "Traceback" not in note
    qtbot.waitUntil(lambda: w.models.loaded == w.model_info.key, timeout=TIMEOUT)  # the local model answers meanwhile
    assert "Loading" not in w.status.model.text()
    assert banner.isVisible()
    assert wrong not in caplog.text
    w.grab().save(str(SHOTS / "hearth-remote-refused.png"))


def test_an_unreachable_server_shows_why_in_its_row(qtbot, windows):
    w = windows()
    dialog, panel = servers_tab(qtbot, w)
    add_server(qtbot, panel, "gone", f"http://127.0.0.1:{closed_port()}", "some-key-123456")
    qtbot.waitUntil(lambda: panel.server_row("gone") is not None and panel.server_row("gone").text(3) != "",
                    timeout=TIMEOUT)
    row = panel.server_row("gone")
    assert row.childCount() == 0 and "model" not in row.text(3)
    assert "some-key-123456" not in row.text(3)
    assert not panel.use_button.isEnabled()
    # the picker says it too, greyed, and offers nothing to choose from it
    assert w.models.picker.findData("gone/tiny") < 0
    picker = w.models.picker
    qtbot.waitUntil(lambda: any(picker.itemText(i).strip().startswith("cannot list its models")
                                for i in range(picker.count())), timeout=TIMEOUT)
    note = next(i for i in range(picker.count()) if picker.itemText(i).strip().startswith("cannot list its models"))
    assert not picker.model().item(note).isEnabled()
    dialog.tabs.setCurrentIndex(0)
    dialog.resize(980, 520)
    dialog.grab().save(str(SHOTS / "hearth-models-local-tab.png"))
    dialog.tabs.setCurrentWidget(panel)
    dialog.resize(900, 420)
    dialog.grab().save(str(SHOTS / "hearth-servers-unreachable.png"))
    # removing it
    panel.tree.setCurrentItem(row)
    assert panel.remove_button.isEnabled()
    qtbot.mouseClick(panel.remove_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: panel.server_row("gone") is None, timeout=TIMEOUT)
    assert "some-key-123456" not in (w.config.paths.data / "secrets.json").read_text() \
        if (w.config.paths.data / "secrets.json").exists() else True


@pytest.mark.parametrize("name, url, why", [
    ("", "http://127.0.0.1:1", "name"),
    ("Lab Server", "http://127.0.0.1:1", "cannot name a server"),
    ("lab", "ftp://example.org", "not a server address"),
    ("lab", "http://user:pw@example.org", "own field"),
    ("lab", "http://example.org/?q=1", "query"),
])
def test_bad_input_in_the_add_dialog_is_refused_in_words(qtbot, windows, name, url, why):
    w = windows()
    _dialog, panel = servers_tab(qtbot, w)
    add = add_server(qtbot, panel, name, url)
    qtbot.waitUntil(lambda: add.error.isVisible(), timeout=TIMEOUT)
    assert why in add.error.text() and add.isVisible() and add.add_button.isEnabled()
    assert not (w.config.paths.data / "remotes.json").exists()


def test_a_second_server_of_the_same_name_is_refused(qtbot, windows, server):
    w = windows()
    _dialog, panel = servers_tab(qtbot, w)
    add_server(qtbot, panel, "lab", server.base, KEY)
    wait_row(qtbot, panel, "lab", "model")
    add = add_server(qtbot, panel, "lab", "http://127.0.0.1:9")
    qtbot.waitUntil(lambda: add.error.isVisible(), timeout=TIMEOUT)
    assert "exists already" in add.error.text()


def test_a_chat_moved_local_remote_local_resumes_its_saved_context(qtbot, windows, server):
    w = windows()
    local = w.model_info.key
    _dialog, panel = servers_tab(qtbot, w)
    add_server(qtbot, panel, "lab", server.base, KEY)
    wait_row(qtbot, panel, "lab", "model")
    w.models.dialog.close()
    finished = collect_dispatched(w.turns, Finished)
    chat = w.new_chat()
    use_settings(w, {"temperature": 0.0, "max_new_tokens": 6})
    send(qtbot, w, "Name three rivers.")
    wait_idle(qtbot, w)
    assert finished[-1][1].local is not None
    pick(w, "lab/tiny")
    wait_model(qtbot, w, "lab/tiny")
    send(qtbot, w, "And three lakes?")
    wait_idle(qtbot, w)
    assert finished[-1][1].local is None and w.store.get(chat).model_key == "lab/tiny"
    qtbot.waitUntil(lambda: w.sidebar.badge(chat) == "remote", timeout=TIMEOUT)
    pick(w, local)
    wait_model(qtbot, w, local)
    qtbot.waitUntil(lambda: w.sidebar.badge(chat) != "remote", timeout=TIMEOUT)
    send(qtbot, w, "And three seas?")
    wait_idle(qtbot, w)
    back = finished[-1][1]
    assert back.local is not None and back.model.key == local
    assert back.local.resume.source != ResumeSource.REBUILT or back.local.resume.reused_tokens > 0
    assert back.local.resume.reused_tokens > 0  # the local context of the first turn was used, not re-read
    assert [m.role for m in w.store.messages(chat)] == ["user", "assistant"] * 3
    # reopening the chat later on the remote model switches to it (per-chat model memory)
    pick(w, "lab/tiny")
    wait_model(qtbot, w, "lab/tiny")
    other = w.new_chat()
    pick(w, local)
    wait_model(qtbot, w, local)
    assert w.store.get(other).model_key == local
    w.sidebar.setCurrentItem(w.sidebar.item_for(chat))
    wait_model(qtbot, w, "lab/tiny")


class FlakyServer:
    """A real OpenAI-compatible HTTP server on 127.0.0.1 that misbehaves on purpose: ``mode`` "drop" streams
    two pieces of a reply then closes the connection; "429" and "503" refuse the request as busy."""

    def __init__(self, mode: str):
        import http.server
        import json
        import threading

        outer = self
        self.mode = mode
        self.closed_at: int | None = None  # "slow": the piece at which the client closed the stream

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # quiet
                pass

            def _json(self, status: int, body: dict) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):  # noqa: N802 - http.server's name
                self._json(200, {"object": "list", "data": [{"id": "flaky", "object": "model"}]})

            def do_POST(self):  # noqa: N802 - http.server's name
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if outer.mode in ("429", "503"):
                    self._json(int(outer.mode), {"error": {"message": "the server is busy", "type": "busy"}})
                    return
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()
                if outer.mode == "slow":  # a piece every 50 ms, for 10 s: until the client closes the stream
                    import time

                    try:
                        for n in range(200):
                            chunk = {"choices": [{"index": 0, "delta": {"content": f"word{n} "}, "finish_reason": None}]}
                            self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                            self.wfile.flush()
                            time.sleep(0.05)
                    except OSError:
                        outer.closed_at = n  # the client hung up: Stop closed the stream
                    self.close_connection = True
                    return
                for piece in ("The Nile", ", the Amazon"):
                    chunk = {"choices": [{"index": 0, "delta": {"content": piece}, "finish_reason": None}]}
                    self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                    self.wfile.flush()
                self.close_connection = True  # and no [DONE]: the server stopped mid-reply

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def flaky():
    made: list[FlakyServer] = []
    yield lambda mode: made.append(FlakyServer(mode)) or made[-1]
    for s in made:
        s.close()


def chat_on_flaky(qtbot, w, base: str) -> str:
    _dialog, panel = servers_tab(qtbot, w)
    add_server(qtbot, panel, "flaky", base)
    wait_row(qtbot, panel, "flaky", "model")
    w.models.dialog.close()
    chat = w.new_chat()
    use_settings(w, {"temperature": 0.0, "max_new_tokens": 16})
    pick(w, "flaky/flaky")
    wait_model(qtbot, w, "flaky/flaky")
    return chat


def test_a_server_that_stops_mid_reply_keeps_what_arrived_and_says_so(qtbot, windows, flaky):
    w = windows()
    chat = chat_on_flaky(qtbot, w, flaky("drop").base)
    send(qtbot, w, "Name three rivers.")
    wait_idle(qtbot, w)
    stored = w.store.messages(chat)
    assert stored[0].role == "user" and stored[0].content == "Name three rivers."  # stored before the request
    assert stored[-1].role == "assistant" and stored[-1].content.startswith("The Nile")  # what arrived is kept
    qtbot.waitUntil(lambda: [e[1] for e in w.transcript.entries()] == ["user", "assistant"], timeout=TIMEOUT)
    line, note = w.status.resume.text(), w.transcript.messages[-1].note.text()
    assert "server" in line + note and "Traceback" not in line + note, (line, note)  # it says the server stopped
    assert note == "the server stopped mid-reply; what arrived is kept"
    qtbot.wait(200)
    w.grab().save(str(SHOTS / "hearth-remote-dropped.png"))


@pytest.mark.parametrize("mode", ["429", "503"])
def test_a_busy_server_is_said_plainly_and_the_message_is_kept(qtbot, windows, flaky, mode):
    w = windows()
    chat = chat_on_flaky(qtbot, w, flaky(mode).base)
    send(qtbot, w, "Name three rivers.")
    wait_idle(qtbot, w)
    assert [m.role for m in w.store.messages(chat)] == ["user"]  # the message is kept, no empty reply
    line = w.status.resume.text()
    assert mode in line or "busy" in line, line
    assert "Traceback" not in line and w.send_button.isEnabled()


def test_a_chat_on_a_server_reopens_on_it_after_a_restart(qtbot, windows, server):
    w = windows()
    _dialog, panel = servers_tab(qtbot, w)
    add_server(qtbot, panel, "lab", server.base, KEY)
    wait_row(qtbot, panel, "lab", "model")
    w.models.dialog.close()
    chat = w.new_chat()
    use_settings(w, {"temperature": 0.0, "max_new_tokens": 6})
    pick(w, "lab/tiny")
    wait_model(qtbot, w, "lab/tiny")
    send(qtbot, w, "Name three rivers.")
    wait_idle(qtbot, w)
    windows.close(w)
    again = windows(wait_ready=False)
    qtbot.waitUntil(lambda: again.current == chat, timeout=TIMEOUT)
    wait_model(qtbot, again, "lab/tiny")  # the chat's remembered model, on its server
    qtbot.waitUntil(lambda: again.sidebar.badge(chat) == "remote", timeout=TIMEOUT)
    send(qtbot, again, "And three lakes?")
    wait_idle(qtbot, again)
    assert [m.role for m in again.store.messages(chat)] == ["user", "assistant"] * 2


def test_versions_continue_and_export_work_for_a_remote_chat(qtbot, windows, server, tmp_path):
    from engine.api import export_markdown

    w = windows()
    _dialog, panel = servers_tab(qtbot, w)
    add_server(qtbot, panel, "lab", server.base, KEY)
    wait_row(qtbot, panel, "lab", "model")
    w.models.dialog.close()
    chat = w.new_chat()
    use_settings(w, {"temperature": 1.2, "max_new_tokens": 4, "seed": 5})
    pick(w, "lab/tiny")
    wait_model(qtbot, w, "lab/tiny")
    send(qtbot, w, "hello there")
    wait_idle(qtbot, w)
    last = w.transcript.last_reply()
    assert "length limit" in last.note.text() and not last.continue_button.isHidden()
    before = w.store.messages(chat)[-1].content
    qtbot.mouseClick(last.continue_button, Qt.MouseButton.LeftButton)  # Continue, through the server
    wait_idle(qtbot, w)
    stored = w.store.messages(chat)
    assert [m.role for m in stored] == ["user", "assistant"] and stored[-1].content.startswith(before)
    assert len(stored[-1].content) >= len(before)
    w.regenerate()  # a second version, through the server
    wait_idle(qtbot, w)
    qtbot.waitUntil(lambda: w.transcript.last_reply() is not None
                    and w.transcript.last_reply().versions.label.text() == "2/2", timeout=TIMEOUT)
    out = tmp_path / "remote.md"
    assert export_markdown(w.store, [chat], out) == 1
    assert "hello there" in out.read_text() and KEY not in out.read_text()


def test_stop_closes_the_servers_stream(qtbot, windows, flaky):
    w = windows()
    slow = flaky("slow")
    chat = chat_on_flaky(qtbot, w, slow.base)
    use_settings(w, {"temperature": 0.0, "max_new_tokens": 1000})
    send(qtbot, w, "Count.")
    qtbot.waitUntil(lambda: w.turns.turn(chat) is not None and "word3" in w.turns.turn(chat).reply, timeout=TIMEOUT)
    w.stop()
    wait_idle(qtbot, w)
    qtbot.waitUntil(lambda: slow.closed_at is not None, timeout=TIMEOUT)  # the server saw the stream closed
    assert slow.closed_at < 150
    stored = w.store.messages(chat)
    assert [m.role for m in stored] == ["user", "assistant"] and stored[-1].content.startswith("word0 word1")
    assert w.transcript.last_reply().note.text().startswith("stopped")


def test_a_chat_on_a_model_the_server_does_not_have_says_so(qtbot, windows, server):
    w = windows()
    _dialog, panel = servers_tab(qtbot, w)
    add_server(qtbot, panel, "lab", server.base, KEY)
    wait_row(qtbot, panel, "lab", "model")
    w.models.dialog.close()
    local = w.model_info.key
    chat = w.new_chat()
    w.models.choose("lab/no-such-model")
    banner = w.models.server_banner
    qtbot.waitUntil(lambda: banner.isVisible(), timeout=TIMEOUT)
    assert "lab/no-such-model cannot be used now" in banner.message.text()
    assert "no-such-model" in banner.message.toolTip() and "Traceback" not in banner.message.text()
    qtbot.waitUntil(lambda: w.models.loaded == local, timeout=TIMEOUT)  # the local model still answers
    send(qtbot, w, "hello")
    wait_idle(qtbot, w)
    assert [m.role for m in w.store.messages(chat)] == ["user", "assistant"]
    # Try again after the server has it is the banner's button; here it still does not: the banner stays
    qtbot.mouseClick(banner.retry, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: w.models.loaded == local, timeout=TIMEOUT)
    assert banner.isVisible()


def test_the_browser_lists_and_opens_a_remote_chat_while_a_server_runs_it(qtbot, windows, server, tmp_path):
    import json

    w = windows()
    _dialog, panel = servers_tab(qtbot, w)
    add_server(qtbot, panel, "lab", server.base, KEY)
    wait_row(qtbot, panel, "lab", "model")
    w.models.dialog.close()
    chat = w.new_chat()
    use_settings(w, {"temperature": 0.0, "max_new_tokens": 6})
    pick(w, "lab/tiny")
    wait_model(qtbot, w, "lab/tiny")
    send(qtbot, w, "Name three rivers.")
    wait_idle(qtbot, w)
    other = w.new_chat()
    w.show_browser()
    b = w.browser
    qtbot.waitUntil(lambda: b.usage_label.text() != "Saved context: …", timeout=TIMEOUT)  # the local services answer
    assert chat in b.ids_shown()
    b.table.selectRow(b.ids_shown().index(chat))
    out = tmp_path / "chats.json"
    assert b.transfers.export_selected(str(out), "json") == 1
    text = out.read_text()
    assert "Name three rivers." in text and KEY not in text and json.loads(text)
    b.open_selected()
    qtbot.waitUntil(lambda: w.current == chat, timeout=TIMEOUT)
    assert w.current != other and w.model_info.key == "lab/tiny"
