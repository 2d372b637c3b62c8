"""The tool loop in the window (issue 33), driven as a person drives it (pytest-qt, offscreen): a tiny Qwen3 with
Qwen3's real template (real ONNX Runtime), forced to call through constrained decoding (the chat's "tool_choice":
"required"), and a real MCP server written with the SDK (tests/mcp_servers/picker.py, over stdio). The permission
prompt — Allow once, Deny, Always allow in this chat —, Stop during a call, a new message while a call waits, a
restart while the prompt waits and while a call runs (Run again / Abandon), a server that cannot start, and the
status bar's count of what each step read."""

from __future__ import annotations

import dataclasses
import re
import sqlite3
import sys
from pathlib import Path

import pytest
from PySide6.QtTest import QTest

from app.agent_blocks import ToolResultBlock
from app.config import AppConfig
from engine.api import ToolRegistry, resolve_paths
from engine.tools.loop import ABANDONED, DENIED, INTERRUPTED, STOPPED, step_limit_text
from tests.conftest import WINDOW_TIMEOUT, Windows
from tests.qt_helpers import send, use_settings

SERVERS = Path(__file__).parent / "mcp_servers"
TIMEOUT = 120_000
FORCED = {"temperature": 0.0, "max_new_tokens": 96, "tool_choice": "required", "tools": ["picker/lookup"]}


@pytest.fixture
def home(tmp_path, qwen3_chat_home) -> Path:
    home = tmp_path / "home"
    home.mkdir()
    (home / "converted").symlink_to(qwen3_chat_home)
    paths = resolve_paths(home).ensure()
    ToolRegistry(paths.data).add_stdio("picker", sys.executable, (str(SERVERS / "picker.py"),))
    return home


@pytest.fixture
def loop_windows(qtbot, home, qwen3_chat_gguf):
    config = AppConfig(resolve_paths(home).ensure(), model=str(qwen3_chat_gguf), weights="int4", provider="cpu")
    made = Windows(qtbot, config)
    yield made
    for w in list(made.open):
        w.close()


def prompt_shown(w, mode: str = "asking") -> bool:
    block = w.transcript.tool_permission
    return block.isVisible() and block.mode == mode


def start(qtbot, w, text: str = "Which colour is the sky?", settings: dict | None = None) -> str:
    conv = w.new_chat()
    use_settings(w, settings or FORCED)
    send(qtbot, w, text)
    qtbot.waitUntil(lambda: prompt_shown(w), timeout=TIMEOUT)
    return conv


def settled(w) -> bool:
    return not w.turns.running() and not w.transcript.tool_permission.isVisible() and not w.transcript.loading


def roles(w, conv: str) -> list[str]:
    return [m.role for m in w.store.messages(conv)]


def results(w, conv: str) -> list[str]:
    return [m.content for m in w.store.messages(conv) if m.role == "tool"]


def open_in_sidebar(w, conv: str) -> None:
    """Click the chat in the sidebar, as a person reopens it."""
    from PySide6.QtCore import Qt

    item = w.sidebar.item_for(conv)
    w.sidebar.scrollToItem(item)
    QTest.mouseClick(w.sidebar.viewport(), Qt.MouseButton.LeftButton, pos=w.sidebar.visualItemRect(item).center())


def click(qtbot, button) -> None:
    from PySide6.QtCore import Qt

    qtbot.mouseClick(button, Qt.MouseButton.LeftButton)


def test_allow_once_runs_the_call_stores_its_result_and_the_model_reads_only_what_is_new(qtbot, loop_windows):
    w = loop_windows()
    conv = start(qtbot, w)
    block = w.transcript.tool_permission
    assert "wants to run" in block.title.text() and "<code>lookup</code>" in block.title.text() and "picker" in block.title.text()
    assert '"key"' in block.arguments.toPlainText()
    click(qtbot, block.allow_button)
    qtbot.waitUntil(lambda: settled(w) and roles(w, conv)[-1] == "assistant" and "tool" in roles(w, conv),
                    timeout=TIMEOUT)
    assert roles(w, conv)[:4] == ["user", "assistant", "tool", "assistant"]
    assert results(w, conv)[0].endswith("is a colour of the rainbow")
    assert w.store.tool_runs(conv) == {w.store.messages(conv)[2].tool_call_id: "done"}
    blocks = w.transcript.findChildren(ToolResultBlock)
    assert any(b.isVisibleTo(w.transcript) and "rainbow" in b.text and b.title == "Tool result: lookup" for b in blocks)
    said = re.search(r"Tool step 2: read ([\d,]+) new tokens; ([\d,]+) came from the saved context",
                     w.status.resume.text())
    assert said, w.status.resume.text()
    assert 0 < int(said.group(1).replace(",", "")) < 60  # the result and the turn's header, not the chat again
    assert int(said.group(2).replace(",", "")) > 100


def test_deny_tells_the_model_and_the_loop_goes_on(qtbot, loop_windows):
    w = loop_windows()
    conv = start(qtbot, w)
    click(qtbot, w.transcript.tool_permission.deny_button)
    qtbot.waitUntil(lambda: settled(w) and roles(w, conv)[-1] == "assistant" and "tool" in roles(w, conv),
                    timeout=TIMEOUT)
    assert results(w, conv) == [DENIED]
    assert set(w.store.tool_runs(conv).values()) == {"denied"}
    shown = [b for b in w.transcript.findChildren(ToolResultBlock) if b.isVisibleTo(w.transcript)]
    assert [b.title for b in shown] == ["Tool not run (denied): lookup"]  # said before it is opened


def test_always_allow_in_this_chat_runs_later_calls_without_asking(qtbot, loop_windows):
    w = loop_windows()
    conv = start(qtbot, w)
    click(qtbot, w.transcript.tool_permission.always_button)
    qtbot.waitUntil(lambda: settled(w) and len(results(w, conv)) == 1 and roles(w, conv)[-1] == "assistant",
                    timeout=TIMEOUT)
    assert w.store.require(conv).settings["tools_always"] == ["lookup"]
    asked = []
    w.transcript.tool_permission.decided.connect(lambda *a: asked.append(a))
    send(qtbot, w, "And the grass?")
    qtbot.waitUntil(lambda: settled(w) and len(results(w, conv)) == 2 and roles(w, conv)[-1] == "assistant",
                    timeout=TIMEOUT)
    assert asked == [] and results(w, conv)[1].endswith("rainbow")


def test_stop_during_a_call_stops_it_says_so_and_the_chat_stays_usable(qtbot, loop_windows):
    w = loop_windows()
    conv = start(qtbot, w, settings={**FORCED, "tools": ["picker/slow"]})
    assert "slow" in w.transcript.tool_permission.title.text()
    click(qtbot, w.transcript.tool_permission.allow_button)
    qtbot.waitUntil(lambda: prompt_shown(w, "running") and w.stop_button.isEnabled(), timeout=TIMEOUT)
    assert not w.send_button.isEnabled()  # one thing at a time: the call is the chat's work now
    click(qtbot, w.stop_button)
    qtbot.waitUntil(lambda: results(w, conv) == [STOPPED] and settled(w), timeout=TIMEOUT)
    assert roles(w, conv)[-1] == "tool"  # Stop ends the loop: the model does not go on by itself
    assert w.store.tool_runs(conv) == {w.store.messages(conv)[2].tool_call_id: "error"}
    use_settings(w, {"temperature": 0.0, "max_new_tokens": 8, "tools": []})
    send(qtbot, w, "Never mind.")
    qtbot.waitUntil(lambda: settled(w) and roles(w, conv)[-2:] == ["user", "assistant"], timeout=TIMEOUT)


def test_a_new_message_while_a_call_waits_abandons_it_first(qtbot, loop_windows):
    w = loop_windows()
    conv = start(qtbot, w)
    use_settings(w, {"temperature": 0.0, "max_new_tokens": 8, "tools": []})
    send(qtbot, w, "Forget it.")
    qtbot.waitUntil(lambda: settled(w) and roles(w, conv)[-1] == "assistant" and len(roles(w, conv)) == 5,
                    timeout=TIMEOUT)
    assert roles(w, conv) == ["user", "assistant", "tool", "user", "assistant"]
    assert results(w, conv) == [ABANDONED]


def test_a_restart_while_the_prompt_waits_asks_again(qtbot, loop_windows):
    w = loop_windows()
    conv = start(qtbot, w)
    loop_windows.close(w)
    w2 = loop_windows()
    open_in_sidebar(w2, conv)
    qtbot.waitUntil(lambda: prompt_shown(w2), timeout=WINDOW_TIMEOUT)
    click(qtbot, w2.transcript.tool_permission.allow_button)
    qtbot.waitUntil(lambda: settled(w2) and roles(w2, conv)[-1] == "assistant" and len(roles(w2, conv)) == 4,
                    timeout=TIMEOUT)
    assert results(w2, conv)[0].endswith("rainbow")


def test_a_call_running_when_hearth_closed_is_never_run_again_without_asking(qtbot, loop_windows, home):
    w = loop_windows()
    conv = start(qtbot, w, settings={**FORCED, "tools": ["picker/slow"]})
    click(qtbot, w.transcript.tool_permission.allow_button)
    qtbot.waitUntil(lambda: prompt_shown(w, "running"), timeout=TIMEOUT)
    qtbot.waitUntil(lambda: "running" in w.store.tool_runs(conv).values(), timeout=TIMEOUT)
    loop_windows.close(w)  # Hearth closes mid-call: nothing is stored for it
    with sqlite3.connect(resolve_paths(home).conversations_db) as db:
        assert db.execute("SELECT state FROM tool_runs").fetchall() == [("running",)]
        assert db.execute("SELECT count(*) FROM messages WHERE role = 'tool'").fetchone() == (0,)
    w2 = loop_windows()
    open_in_sidebar(w2, conv)
    qtbot.waitUntil(lambda: prompt_shown(w2, "interrupted"), timeout=WINDOW_TIMEOUT)
    block = w2.transcript.tool_permission
    assert "was running when Hearth closed" in block.title.text()
    assert (block.allow_button.text(), block.deny_button.text()) == ("Run again", "Abandon")
    assert not block.always_button.isVisible()
    click(qtbot, block.deny_button)
    qtbot.waitUntil(lambda: results(w2, conv) == [INTERRUPTED], timeout=TIMEOUT)
    assert set(w2.store.tool_runs(conv).values()) == {"denied"}


def test_a_server_that_cannot_start_leaves_the_others_working(qtbot, loop_windows, home):
    ToolRegistry(resolve_paths(home).data).add_stdio("broken", sys.executable, (str(SERVERS / "bad_start.py"),))
    w = loop_windows()
    conv = start(qtbot, w)
    assert any(s.name == "broken" and str(s.state) == "failed" for s in w.tools.statuses)
    click(qtbot, w.transcript.tool_permission.allow_button)
    qtbot.waitUntil(lambda: settled(w) and len(roles(w, conv)) >= 4, timeout=TIMEOUT)
    assert results(w, conv)[0].endswith("rainbow")


def test_a_server_that_crashes_mid_call_is_a_readable_error_and_the_loop_goes_on(qtbot, loop_windows, home):
    ToolRegistry(resolve_paths(home).data).add_stdio("crash", sys.executable, (str(SERVERS / "crash.py"),))
    w = loop_windows()
    conv = start(qtbot, w, settings={**FORCED, "tools": ["crash/crash"]})
    click(qtbot, w.transcript.tool_permission.allow_button)
    qtbot.waitUntil(lambda: settled(w) and len(roles(w, conv)) >= 4, timeout=TIMEOUT)
    (result,) = results(w, conv)
    assert "crash" in result and "about to fall over" in result, result  # what happened, with its stderr
    assert set(w.store.tool_runs(conv).values()) == {"error"}
    shown = [b for b in w.transcript.findChildren(ToolResultBlock) if b.isVisibleTo(w.transcript)]
    assert [b.title for b in shown] == ["Tool failed: crash"]
    assert roles(w, conv)[3] == "assistant"  # the model read the error and went on
    use_settings(w, {"temperature": 0.0, "max_new_tokens": 8, "tools": []})
    send(qtbot, w, "Still there?")
    qtbot.waitUntil(lambda: settled(w) and roles(w, conv)[-2:] == ["user", "assistant"], timeout=TIMEOUT)


def test_a_second_allow_while_the_call_runs_runs_nothing_more(qtbot, loop_windows):
    w = loop_windows()
    conv = start(qtbot, w, settings={**FORCED, "tools": ["picker/slow"]})
    block = w.transcript.tool_permission
    click(qtbot, block.allow_button)
    qtbot.waitUntil(lambda: prompt_shown(w, "running"), timeout=TIMEOUT)
    requested = []
    w.tools.request_call.connect(lambda *a: requested.append(a))
    for choice in ("allow", "always"):  # a late click (or a second window's answer) for the call that runs
        block.decided.emit(block.call_id, choice)
    assert requested == []  # the call runs once: no second run of it
    click(qtbot, w.stop_button)
    qtbot.waitUntil(lambda: results(w, conv) == [STOPPED] and settled(w), timeout=TIMEOUT)


def test_a_regenerate_while_the_prompt_waits_takes_the_prompt_away(qtbot, loop_windows):
    w = loop_windows()
    conv = start(qtbot, w)
    block = w.transcript.tool_permission
    call_id = block.call_id
    requested = []
    w.tools.request_call.connect(lambda *a: requested.append(a))
    w.chat.regenerate()  # the reply that asked is written again
    assert w.turns.running(conv) and not block.isVisible()
    block.decided.emit(call_id, "allow")  # an Allow that was on its way: the reply it answers is being replaced
    qtbot.waitUntil(lambda: not w.turns.running(conv) and not w.transcript.loading, timeout=TIMEOUT)
    assert requested == [] and "tool" not in roles(w, conv)


def test_the_step_limit_counts_replies_as_the_cli_does(qtbot, loop_windows):
    w = loop_windows()
    w.preferences = dataclasses.replace(w.preferences, tool_steps=1)
    conv = w.new_chat()
    use_settings(w, FORCED)
    send(qtbot, w, "Which colour is the sky?")
    # one reply is the whole loop: its calls are not run (hearth-cli chat --tools --max-steps 1 runs none either)
    qtbot.waitUntil(lambda: results(w, conv) == [step_limit_text(1)] and settled(w), timeout=TIMEOUT)
    assert roles(w, conv) == ["user", "assistant", "tool"]
    assert set(w.store.tool_runs(conv).values()) == {"denied"}
