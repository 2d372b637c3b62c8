"""The window's Local server switch: the OpenAI-compatible server sharing the window's one engine
(real uvicorn on 127.0.0.1, real HTTP, the tiny model)."""

from __future__ import annotations

import dataclasses
import json
import socket
import threading

import httpx
import pytest
from PySide6.QtCore import Qt

from app.server_switch import curl_example

from .qt_helpers import TIMEOUT, send, use_settings, wait_idle


@pytest.fixture
def windows(qtbot, config, tiny_gguf):
    """Windows whose model is the tiny GGUF as a library model ("tiny"), which is what the server offers."""
    from engine.api import ModelLibrary
    from tests.conftest import Windows

    library = ModelLibrary(config.paths)
    library.add(tiny_gguf)
    library.use("tiny")
    made = Windows(qtbot, dataclasses.replace(config, model=None))
    yield made
    for w in list(made.open):
        w.close()


def start(qtbot, w, port: int = 0) -> None:
    w.server.port = port
    w.status.say("")  # a failure to start says so here
    w.server.start()
    qtbot.waitUntil(lambda: w.server.running or "did not start" in w.status.resume.text(), timeout=TIMEOUT)


def test_the_switch_starts_the_server_on_the_windows_model_and_stops_it(qtbot, windows):
    w = windows()
    start(qtbot, w)
    assert w.server.running and w.server.url.startswith("http://127.0.0.1:")
    assert w.server.button.text() == "Server: on" and w.server.url in w.server.button.toolTip()
    assert w.server.url_action.text() == w.server.url
    models = httpx.get(w.server.url + "/models", timeout=30).json()["data"]
    assert w.model_info.key == "tiny" and "tiny" in {m["id"] for m in models}
    r = httpx.post(w.server.url + "/chat/completions", timeout=60,
                   json={"model": w.model_info.key, "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 200, r.text
    assert r.json()["hearth"]["source"] in ("cold", "disk", "live")
    assert curl_example(w.server.url, "m").startswith(f"curl {w.server.url}/chat/completions")
    url = w.server.url
    w.server.toggle()
    assert not w.server.running and w.server.button.text() == "Server: off"
    try:
        httpx.get(url + "/models", timeout=5)
        raise AssertionError("the server still answers after it was switched off")
    except httpx.HTTPError:
        pass
    assert w.model_info is not None  # the window's model stays loaded


def test_a_page_refused_by_the_windows_server_is_not_told_of_an_option_the_window_lacks(qtbot, windows):
    """Issue 27: the window's refusal said "start it with --cors-origin", which the window does not offer."""
    w = windows()
    start(qtbot, w)
    try:
        r = httpx.get(w.server.url + "/models", headers={"Origin": "http://evil.example"}, timeout=30)
        assert r.status_code == 403 and r.json()["error"]["code"] == "origin_not_allowed"
        message = r.json()["error"]["message"]
        assert "the window's local server accepts no web pages" in message and "start it with" not in message
    finally:
        w.server.stop()


def test_a_port_in_use_is_reported_and_the_window_carries_on(qtbot, windows):
    w = windows()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        start(qtbot, w, taken.getsockname()[1])
        assert not w.server.running
        assert "could not listen" in w.status.resume.text() and w.server.button.text() == "Server: off"


def test_a_gui_turn_during_a_streaming_api_request_both_complete_and_are_stored(qtbot, windows):
    w = windows()
    start(qtbot, w)
    body = {"model": w.model_info.key, "max_tokens": 24, "stream": True, "temperature": 0,
            "messages": [{"role": "user", "content": "tell me about rivers"}]}
    got: dict = {}

    def stream() -> None:
        pieces = []
        with httpx.stream("POST", w.server.url + "/chat/completions", json=body, timeout=120,
                          headers={"X-Hearth-Conversation": "from-an-agent"}) as r:
            got["status"] = r.status_code
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    chunk = json.loads(line[6:])
                    pieces += [c["delta"].get("content") or "" for c in chunk["choices"]]
        got["text"] = "".join(pieces)

    agent = threading.Thread(target=stream)
    agent.start()
    chat = w.new_chat()
    use_settings(w, {"temperature": 0.0, "max_new_tokens": 8})
    send(qtbot, w, "hello from the window")
    wait_idle(qtbot, w)
    agent.join(120)
    assert got["status"] == 200 and got["text"]
    mine = [(m.role, m.content) for m in w.store.messages(chat)]
    assert mine[0] == ("user", "hello from the window") and mine[1][0] == "assistant" and len(mine) == 2
    theirs = [(m.role, m.content) for m in w.store.messages("from-an-agent")]
    assert theirs == [("user", "tell me about rivers"), ("assistant", got["text"])]
    qtbot.waitUntil(lambda: w.sidebar.item_for("from-an-agent") is not None, timeout=TIMEOUT)  # shown in the list
    w.server.stop()


def test_the_switch_waits_for_the_model(qtbot, windows):
    w = windows(wait_ready=False)
    if w.model_info is None:
        w.server.start()
        assert not w.server.running and "not loaded" in w.status.resume.text()
    qtbot.waitUntil(lambda: w.model_info is not None, timeout=TIMEOUT)
    start(qtbot, w)
    assert w.server.running
    w.server.stop()


def test_require_a_key_makes_a_private_key_and_the_server_refuses_requests_without_it(qtbot, windows, caplog):
    """Issue 27 item 4: other accounts on this computer can reach 127.0.0.1; with "Require a key" the
    window's server answers 401 without the key and 200 with it."""
    import logging
    import os
    import stat

    from PySide6.QtGui import QGuiApplication

    caplog.set_level(logging.DEBUG)
    w = windows()
    assert not w.server.require_key_action.isChecked() and not w.server.show_key_action.isEnabled()
    w.server.require_key_action.trigger()  # the menu's checkable "Require a key"
    key_file = w.config.paths.data / "server.key"
    key = key_file.read_text().strip()
    assert len(key) >= 40 and stat.S_IMODE(os.stat(key_file).st_mode) == 0o600
    dialog = w.server.key_dialog  # shown at once, with a Copy button
    assert dialog is not None and dialog.field.text() == key
    qtbot.mouseClick(dialog.copy_button, Qt.MouseButton.LeftButton)
    assert QGuiApplication.clipboard().text() == key
    dialog.close()
    start(qtbot, w)
    assert w.server.running and w.server.button.text().endswith("· key")
    body = {"model": w.model_info.key, "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}
    refused = httpx.post(w.server.url + "/chat/completions", json=body, timeout=60)
    assert refused.status_code == 401 and refused.json()["error"]["code"] == "invalid_api_key"
    assert httpx.get(w.server.url + "/models", timeout=30).status_code == 401
    wrong = httpx.post(w.server.url + "/chat/completions", json=body, timeout=60,
                       headers={"Authorization": "Bearer not-the-key-at-all"})
    assert wrong.status_code == 401
    ok = httpx.post(w.server.url + "/chat/completions", json=body, timeout=60,
                    headers={"Authorization": f"Bearer {key}"})
    assert ok.status_code == 200, ok.text
    w.server.copy_example_action.trigger()
    assert f"Authorization: Bearer {key}" in QGuiApplication.clipboard().text()
    assert key not in caplog.text  # never logged
    # Turned off: the running server restarts without a key and the file goes.
    w.server.require_key_action.trigger()
    qtbot.waitUntil(lambda: w.server.running, timeout=TIMEOUT)
    assert not key_file.exists() and not w.server.button.text().endswith("· key")
    assert httpx.get(w.server.url + "/models", timeout=30).status_code == 200
    w.server.stop()


def test_the_key_is_kept_across_launches(qtbot, windows):
    w = windows()
    w.server.require_key_action.trigger()
    key = w.server.key
    w.server.key_dialog.close()
    w.close()
    again = windows()
    assert again.server.require_key_action.isChecked() and again.server.key == key
    assert again.server.show_key().field.text() == key


def test_the_browser_shows_the_servers_prompt_cache_apart_so_rows_and_total_agree(qtbot, windows):
    """Issue 27 item 21: "Saved context: 410.9 MiB" counted the server's prompt-cache files, which no row
    shows; now the line gives them apart and the chats' figure is what the rows add up to."""
    w = windows()
    start(qtbot, w)
    r = httpx.post(w.server.url + "/chat/completions", timeout=120,
                   json={"model": w.model_info.key, "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 200, r.text
    w.server.stop()
    w.new_chat()
    send(qtbot, w, "hello")  # the window's own chat has a saved context too; the server's is saved as it leaves
    wait_idle(qtbot, w)
    assert list(w.config.paths.checkpoints.glob("api-*.hkc"))
    w.show_browser()
    b = w.browser
    qtbot.waitUntil(lambda: "local server" in b.usage_label.text(), timeout=TIMEOUT)
    qtbot.waitUntil(lambda: all(b.contexts.status(i) is not None for i in b.ids_shown()), timeout=TIMEOUT)
    rows = sum(b.contexts.status(i).disk_bytes for i in b.ids_shown())
    server = b.usage.by_kind["api"]
    assert rows > 0 and server > 0
    assert b.usage.by_kind["conversation"] == rows and sum(b.usage.by_kind.values()) == b.usage.bytes
    assert f"local server's prompt cache {server / 2**20:,.1f} MiB" in b.usage_label.text()
    assert f"chats {(b.usage.bytes - server - b.usage.by_kind.get('prefix', 0)) / 2**20:,.1f} MiB" \
        in b.usage_label.text() and b.usage_label.text().endswith("(not listed)")
