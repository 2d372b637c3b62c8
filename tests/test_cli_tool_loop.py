"""``hearth-cli chat --tools`` end to end (issue 33): the default model (SmolLM2, whose template has no tools: the
built-in fallback format) offered a real MCP server's tools (tests/mcp_servers/, the SDK, over stdio), a call
forced through constrained decoding, run only with ``--allow``, its result stored and read by the next step —
which re-reads only what came after its reply; denial; a hang past the timeout; a process killed in the middle of
a call, then resumed without running the call again; and every bad input, each one line and exit 1."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from engine.api import resolve_paths
from engine.tools.loop import DENIED, INTERRUPTED
from tests.test_cli import assert_clean_error, run_cli

SERVERS = Path(__file__).parent / "mcp_servers"
pytestmark = pytest.mark.real_model


@pytest.fixture
def tool_home(real_model_home) -> Path:
    """The real model's data dir with the calculator and the hanging server added."""
    for name in ("calculator", "hang", "picker"):
        proc = run_cli("tools", "add", name, "--", sys.executable, str(SERVERS / f"{name}.py"), home=real_model_home)
        assert proc.returncode == 0, proc.stderr
    return real_model_home


def chat(home: Path, *args: str, timeout: int = 300):
    return run_cli("chat", "--conversation", "c1", "--greedy", "--provider", "cpu", "--max-new-tokens", "48", "--tools",
                   *args, home=home, timeout=timeout)


def payload(proc) -> dict:
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_an_allowed_call_runs_its_result_is_stored_and_the_next_step_reads_only_what_is_new(tool_home):
    out = payload(chat(tool_home, "--message", "Add 2 and 3 with the calculator.", "--tool-choice", "add",
                       "--allow", "add", "--max-steps", "2", "--json"))
    first = out["steps"][0]
    call = first["tool_calls"][0]
    assert call["name"] == "add" and call["allowed"] and not call["is_error"]
    args = call["arguments"]
    assert float(call["result"]) == args["a"] + args["b"]
    assert {t["function"] for t in out["tools"]} >= {"add", "multiply", "divide", "hang"}
    second = out["steps"][1]
    assert second["resume_source"] == "live"
    assert 0 < second["read_tokens"] < 80, second  # the call's result and the turn's header: not the chat again
    assert second["reused_tokens"] >= first["prompt_tokens"]
    assert out["ended"] in ("answered", "step_limit")
    shown = payload(run_cli("conversations", "show", "c1", "--json", home=tool_home))
    roles = [m["role"] for m in shown["messages"]]
    assert roles[:3] == ["user", "assistant", "tool"]
    assert shown["messages"][2]["tool_call_id"] == call["id"] and shown["messages"][2]["content"] == call["result"]


def test_a_call_not_allowed_is_denied_and_the_model_is_told(tool_home):
    out = payload(chat(tool_home, "--message", "Multiply 6 by 7.", "--tool-choice", "multiply", "--max-steps", "1",
                       "--json"))
    call = out["steps"][0]["tool_calls"][0]
    assert call["name"] == "multiply" and not call["allowed"]
    assert "limit of 1 tool steps" in call["result"]  # the step limit comes first: the reply that asked is the last
    out = payload(chat(tool_home, "--message", "Multiply 6 by 7.", "--tool-choice", "multiply", "--max-steps", "2",
                       "--json"))
    call = out["steps"][0]["tool_calls"][0]
    assert not call["allowed"] and call["result"] == DENIED


def test_a_call_past_its_timeout_is_a_readable_error_and_the_chat_goes_on(tool_home):
    started = time.monotonic()
    out = payload(chat(tool_home, "--message", "Wait for the slow tool.", "--tool-choice", "hang", "--allow", "hang",
                       "--tool-timeout", "2", "--max-steps", "2", "--json"))
    assert time.monotonic() - started < 120
    call = out["steps"][0]["tool_calls"][0]
    assert call["allowed"] and call["is_error"] and "2 s" in call["result"], call["result"]
    assert len(out["steps"]) == 2  # the model read the error and answered (or hit the limit)


def test_a_run_killed_mid_call_resumes_without_running_the_call_again(tool_home):
    env = {**os.environ, "HEARTH_HOME": str(tool_home)}
    proc = subprocess.Popen([sys.executable, "-m", "engine.cli", "chat", "--conversation", "c1", "--greedy",
                             "--provider", "cpu", "--max-new-tokens", "48", "--tools", "--message", "Run the slow tool.",
                             "--tool-choice", "hang", "--allow", "hang", "--tool-timeout", "600", "--json"],
                            env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    db = resolve_paths(tool_home).conversations_db
    deadline = time.monotonic() + 180
    running = []
    while time.monotonic() < deadline and not running:
        time.sleep(0.3)
        if db.exists():
            try:
                with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5) as con:
                    running = con.execute("SELECT call_id FROM tool_runs WHERE state = 'running'").fetchall()
            except sqlite3.OperationalError:
                running = []  # the table is not there yet
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
    assert running, "the call never started"
    os.killpg(proc.pid, signal.SIGKILL)  # the CLI and its MCP server: as if the machine went down
    proc.wait(30)

    out = payload(chat(tool_home, "--allow", "hang", "--max-steps", "1", "--tool-timeout", "1", "--json"))  # resume
    resumed = {r["id"]: r for r in out["resumed"]}
    was_running = resumed.pop(running[0][0])
    assert not was_running["allowed"] and was_running["result"] == INTERRUPTED  # told, never run again
    assert all(r["allowed"] for r in resumed.values())  # calls of the same reply never started: decided by --allow
    assert out["steps"][0]["resume_source"] in ("disk", "live")
    shown = payload(run_cli("conversations", "show", "c1", "--json", home=tool_home))
    assert [m["role"] for m in shown["messages"]][:3] == ["user", "assistant", "tool"]


def test_a_10_mb_result_reaches_the_model_cut_to_the_cap_with_a_note(tool_home):
    out = payload(chat(tool_home, "--message", "Flood me.", "--tool-choice", "flood", "--allow", "flood",
                       "--max-steps", "2", "--json"))
    call = out["steps"][0]["tool_calls"][0]
    assert call["allowed"] and not call["is_error"] and call["cut_from"] >= 10_000_000
    assert len(call["result"]) < 33_000 and "[cut: the result was" in call["result"]
    assert 0 < out["steps"][1]["read_tokens"] < 33_000  # the model read the cut result, once
    stored = payload(run_cli("conversations", "show", "c1", "--json", home=tool_home))["messages"][2]["content"]
    assert stored == call["result"]


@pytest.mark.parametrize("extra, words", [
    (("--message", "hi", "--max-steps", "0"), "--max-steps must be from 1 to 50"),
    (("--message", "hi", "--tool-timeout", "-1"), "--tool-timeout must be more than 0"),
    (("--message", "hi", "--tool-choice", "nosuch"), "'nosuch' is not a tool this chat offers"),
    (("--message", "hi", "--allow", "nosuch"), "--allow 'nosuch' names no tool"),
])
def test_bad_tool_options_exit_1_with_one_line(tool_home, extra, words):
    proc = chat(tool_home, *extra)
    assert_clean_error(proc, words)


def test_tool_flags_without_tools_and_a_missing_message_are_refused(real_model_home):
    proc = run_cli("chat", "--conversation", "c1", "--message", "hi", "--allow", "add", home=real_model_home)
    assert_clean_error(proc, "--allow only mean something with --tools")
    proc = run_cli("chat", "--conversation", "c1", home=real_model_home)
    assert_clean_error(proc, "--message is required")


def test_resuming_a_chat_with_no_loop_left_is_refused_and_stores_nothing(tool_home):
    payload(chat(tool_home, "--message", "Hello.", "--tool-choice", "auto", "--max-steps", "1", "--json"))
    before = payload(run_cli("conversations", "show", "c1", "--json", home=tool_home))["messages"]
    if before[-1]["role"] != "assistant":
        pytest.skip("the model called a tool on its own")
    proc = chat(tool_home)
    assert_clean_error(proc, "there is no tool loop to resume")
    assert payload(run_cli("conversations", "show", "c1", "--json", home=tool_home))["messages"] == before


def test_required_with_no_server_says_how_to_add_one(real_model_home):
    proc = run_cli("chat", "--conversation", "c1", "--message", "hi", "--tools", "--tool-choice", "required",
                   "--provider", "cpu", home=real_model_home)
    assert_clean_error(proc, "no tool is offered")
