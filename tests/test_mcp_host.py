"""The MCP tool host (engine/tools/host.py) and results (engine/tools/results.py), issue 33, against real
servers: small MCP servers written with the SDK (tests/mcp_servers/), run as processes over stdio and one over
streamable HTTP, and a hand-written one that breaks the protocol. Every failure a server can give becomes a
readable ToolOutcome; Stop, timeouts, crashes and close leave no process behind."""

from __future__ import annotations

import base64
import gc
import json
import re
import subprocess
import sys
import textwrap
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import mcp_types as types
import pytest

from engine.tools.config import STDIO, ToolConfigError, ToolServerConfig
from engine.tools.host import ServerState, ToolHost, redact, sanitize_function
from engine.tools.results import EMPTY_ERROR, EMPTY_RESULT, result_text
from engine.types import CancelToken
from tests.mcp_helpers import (
    SERVERS,
    StandInRegistry,
    http,
    process_dead,
    process_gone,
    start_http_calculator,
    stdio,
    wait_for,
)

CRASH_TOKEN = "crash-token-7f3a9c"
BAD_TOKEN = "bad-token-51e0d2"
HTTP_TOKEN = "http-token-c4b8e1"
FUNCTION_RE = re.compile(r"[a-zA-Z0-9_-]{1,64}")


# --- one host for the module: the servers that tests may share ---------------------------------------------


@pytest.fixture(scope="module")
def files_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("files_root")
    (root / "notes.txt").write_text("the kettle is on\n", encoding="utf-8")
    (root / "sub").mkdir()
    (root.parent / "secret.txt").write_text("not for tools\n", encoding="utf-8")
    other = tmp_path_factory.mktemp("files_other")
    (other / "other.txt").write_text("from the other folder\n", encoding="utf-8")
    return root, other


@pytest.fixture(scope="module")
def http_calculator():
    proc, url = start_http_calculator(HTTP_TOKEN)
    yield url
    proc.terminate()
    proc.wait(timeout=30)


@pytest.fixture(scope="module")
def refuse_file(tmp_path_factory):
    return tmp_path_factory.mktemp("phoenix") / "refuse"


@pytest.fixture(scope="module")
def registry(files_root, http_calculator, refuse_file):
    root, _other = files_root
    return StandInRegistry(
        [stdio("calculator", "calculator.py"),
         stdio("files", "files.py", str(root)),
         stdio("crash", "crash.py", env_names=("CRASH_TOKEN",)),
         stdio("phoenix", "crash.py", env_names=("CRASH_REFUSE",)),
         stdio("hang", "hang.py"),
         stdio("frozen", "hang.py"),
         stdio("huge", "huge.py"),
         stdio("broken", "broken.py"),
         stdio("many", "broken.py", "--many", "200"),
         stdio("garbled", "broken.py", "--garbage"),
         stdio("bad_start", "bad_start.py", env_names=("BAD_TOKEN",)),
         http("web", http_calculator, header_names=("Authorization",)),
         http("web_refused", http_calculator, header_names=("Authorization",))],
        env={"crash": {"CRASH_TOKEN": CRASH_TOKEN}, "phoenix": {"CRASH_REFUSE": str(refuse_file)},
             "bad_start": {"BAD_TOKEN": BAD_TOKEN}},
        headers={"web": {"Authorization": f"Bearer {HTTP_TOKEN}"},
                 "web_refused": {"Authorization": "Bearer wrong-http-secret-99"}})


@pytest.fixture(scope="module")
def host(registry):
    host = ToolHost(registry, start_timeout_s=60, call_timeout_s=30)
    host.ensure()
    yield host
    pids = [pid for pid in _pids(host) if pid]
    host.close()
    assert wait_for(lambda: all(process_gone(pid) for pid in pids), 30), "a server outlived close()"


def _status(host, name):
    return next(st for st in host.status() if st.name == name)


def _fn(host, server, tool):
    """The function name the model is offered for ``server``'s ``tool``."""
    return next(spec.function for spec in _status(host, server).tools if spec.name == tool)


def _pid(host, server) -> int:
    outcome = host.call(_fn(host, server, "pid"), "{}")
    assert not outcome.is_error, outcome.text
    return int(float(outcome.text))


def _pids(host) -> list[int]:
    """The process ids of the ready stdio servers that tell theirs."""
    return [_pid(host, st.name) for st in host.status() if st.state is ServerState.READY and not st.name.startswith("web")
            and any(spec.name == "pid" for spec in st.tools)]


# --- listing and naming ---------------------------------------------------------------------------------------


def test_servers_start_and_list_their_tools(host):
    states = {st.name: st.state for st in host.status()}
    for name in ("calculator", "files", "crash", "hang", "huge", "broken", "many", "web"):
        assert states[name] is ServerState.READY, (name, _status(host, name).error)
    calc = _status(host, "calculator")
    assert {spec.name for spec in calc.tools} == {"add", "multiply", "divide", "image", "pid"}
    add = next(spec for spec in calc.tools if spec.name == "add")
    assert add.parameters["type"] == "object" and set(add.parameters["properties"]) == {"a", "b"}
    assert add.openai() == {"type": "function", "function": {"name": "calculator_add",
                                                             "description": "Add two numbers.",
                                                             "parameters": add.parameters}}


def test_function_names_are_unique_and_prefixed_when_servers_collide(host):
    specs = [spec for st in host.status() for spec in st.tools]
    functions = [spec.function for spec in specs]
    assert len(functions) == len(set(functions))
    assert all(FUNCTION_RE.fullmatch(f) for f in functions)
    # pid is listed by calculator, crash, phoenix and hang; ping by crash, phoenix and hang
    assert _fn(host, "calculator", "pid") == "calculator_pid"
    assert _fn(host, "crash", "ping") == "crash_ping"
    assert _fn(host, "hang", "ping") == "hang_ping"
    # the HTTP calculator lists the same tools as the stdio one: both prefixed; a tool listed once is not
    assert _fn(host, "web", "multiply") == "web_multiply"
    assert _fn(host, "calculator", "multiply") == "calculator_multiply"
    assert _fn(host, "files", "read_file") == "read_file"
    assert _fn(host, "hang", "hang") == "hang_hang"  # the frozen server is a hang.py too
    assert _fn(host, "frozen", "freeze") == "frozen_freeze"


def test_names_are_sanitised_and_odd_tools_left_out_or_cut(host):
    broken = {spec.name: spec for spec in _status(host, "broken").tools}
    assert broken["odd.name"].function == "odd_name"
    long_name = "n" * 100
    assert broken[long_name].function == "n" * 64
    assert "not_object" not in broken  # a string schema cannot be a function's parameters
    assert "fat_schema" not in broken  # a 70 KiB listing
    assert len(broken["long_description"].description) == 4096
    assert len(_status(host, "many").tools) == 128  # it lists 200


def test_sanitize_function():
    assert sanitize_function("read file.v2") == "read_file_v2"
    assert sanitize_function("") == "tool"
    assert sanitize_function("ü" * 80) == "_" * 64


def test_tools_gives_enabled_tools_of_ready_servers_and_status_shows_all(host, registry):
    registry.change("calculator", disabled_tools=frozenset({"divide"}))
    try:
        offered = {spec.function for spec in host.tools()}
        assert "calculator_add" in offered and "calculator_divide" not in offered
        assert not any(spec.server in ("bad_start", "garbled") for spec in host.tools())
        divide = next(spec for spec in _status(host, "calculator").tools if spec.name == "divide")
        assert divide.enabled is False
        outcome = host.call(_fn(host, "calculator", "divide"), '{"a": 1, "b": 2}')
        assert outcome.is_error and "switched off" in outcome.text
    finally:
        registry.change("calculator", disabled_tools=frozenset())
    assert not host.call(_fn(host, "calculator", "divide"), '{"a": 1, "b": 2}').is_error


def test_tools_of_named_servers_only(host):
    specs = host.tools(["files"])
    assert {spec.server for spec in specs} == {"files"}
    assert {st.name for st in host.ensure(["files", "calculator"])} == {"files", "calculator"}


# --- calls ----------------------------------------------------------------------------------------------------


def test_a_call_gives_the_tools_text(host):
    outcome = host.call(_fn(host, "calculator", "add"), '{"a": 2, "b": 3.5}')
    assert (outcome.text, outcome.is_error, outcome.cut_from) == ("5.5", False, None)
    assert outcome.elapsed_ms >= 0
    assert host.call(_fn(host, "calculator", "multiply"), '{"a": 4, "b": 2.5}').text == "10.0"


def test_calls_from_many_threads_at_once(host):
    with ThreadPoolExecutor(8) as pool:
        outcomes = list(pool.map(lambda i: host.call(_fn(host, "calculator", "add"), json.dumps({"a": i, "b": 1000})), range(16)))
    assert [o.text for o in outcomes] == [f"{i + 1000}.0" for i in range(16)]


def test_a_tool_that_raises_gives_its_text_as_an_error(host):
    outcome = host.call(_fn(host, "calculator", "divide"), '{"a": 1, "b": 0}')
    assert outcome.is_error
    assert "cannot divide by zero" in outcome.text


def test_unknown_function(host):
    outcome = host.call("launch_rockets", "{}")
    assert outcome.is_error and outcome.text == "there is no tool named 'launch_rockets'"


@pytest.mark.parametrize(("arguments", "says"), [
    ("{not json", "are not valid JSON"),
    ("[1, 2]", "must be a JSON object, not an array"),
    ('"two"', "must be a JSON object, not a string"),
    ("null", "must be a JSON object, not null"),
])
def test_arguments_that_are_not_a_json_object(host, arguments, says):
    outcome = host.call(_fn(host, "calculator", "add"), arguments)
    assert outcome.is_error and says in outcome.text


def test_empty_arguments_mean_none(host):
    outcome = host.call(_fn(host, "crash", "ping"), "")
    assert (outcome.text, outcome.is_error) == ("pong", False)


def test_arguments_the_tool_refuses(host):
    outcome = host.call(_fn(host, "calculator", "add"), '{"a": "seven"}')
    assert outcome.is_error and "a" in outcome.text and "b" in outcome.text


def test_image_blocks_are_described_not_shown(host):
    outcome = host.call(_fn(host, "calculator", "image"), '{"size": 4}')
    assert not outcome.is_error
    assert re.fullmatch(r"\[image: image/png, \d[\d,]* bytes, not shown\]", outcome.text), outcome.text


def test_files_server_reads_inside_its_folder_and_refuses_outside(host):
    assert host.call("read_file", '{"path": "notes.txt"}').text == "the kettle is on\n"
    assert host.call("list_files", "{}").text == "notes.txt\nsub/"
    outside = host.call("read_file", '{"path": "../secret.txt"}')
    assert outside.is_error and "outside the folder" in outside.text
    assert "not for tools" not in outside.text
    absolute = host.call("read_file", json.dumps({"path": "/etc/passwd"}))
    assert absolute.is_error and "outside the folder" in absolute.text


def test_a_huge_result_is_cut_with_a_note(host):
    outcome = host.call("huge", "{}")
    assert not outcome.is_error
    assert outcome.cut_from == 10 * 1024 * 1024
    note = "[cut: the result was 10,485,760 characters; the first 32,000 are shown]"
    assert outcome.text.endswith("\n\n" + note)
    assert outcome.text.startswith("0123456789")
    assert len(outcome.text) == 32_000 + 2 + len(note)


def test_invalid_json_rpc_from_the_server(host):
    garbage = host.call("garbage", "{}")
    assert garbage.is_error
    assert "not valid JSON-RPC" in garbage.text and "<html>" in garbage.text
    bad_result = host.call("bad_result", "{}")
    assert bad_result.is_error and "not a valid tool result" in bad_result.text
    rpc_error = host.call("rpc_error", "{}")
    assert rpc_error.is_error
    assert "refused the call: the database is on fire" in rpc_error.text
    # the server itself is still there for a call it answers properly
    assert host.call("ok", "{}").text == "ok: fine"
    assert _status(host, "broken").state is ServerState.READY


def test_a_server_that_writes_garbage_at_start_fails_in_plain_words(host):
    st = _status(host, "garbled")
    assert st.state is ServerState.FAILED
    assert st.error.startswith("the server wrote something that is not JSON-RPC")
    assert "this is not json" in st.error
    assert "errors.pydantic.dev" not in st.error and "Traceback" not in st.error


def test_a_server_that_exits_at_start(host):
    st = _status(host, "bad_start")
    assert st.state is ServerState.FAILED
    assert st.error == "the server exited before it was ready (its stderr may say why)"
    assert "bad_start: cannot read my settings file" in st.stderr_tail
    # its secret, which it printed, is blotted out
    assert BAD_TOKEN not in st.stderr_tail and BAD_TOKEN not in st.error
    assert "the token was •••" in st.stderr_tail
    # a failed start is not retried by every ensure (only restart() does)
    assert _status(host, "bad_start").stderr_tail == st.stderr_tail


def test_a_hang_past_the_timeout_is_cancelled_and_the_server_kept(host):
    before = _pid(host, "hang")
    outcome = host.call("hang_hang", "{}", timeout_s=2)
    assert outcome.is_error
    assert outcome.text == "the tool 'hang' of 'hang' did not answer within 2 s; the call was cancelled"
    assert host.call("hang_ping", "{}").text == "pong"
    assert _pid(host, "hang") == before


def test_a_server_that_stops_answering_after_a_timeout_is_restarted(host):
    before = _pid(host, "frozen")
    outcome = host.call(_fn(host, "frozen", "freeze"), "{}", timeout_s=2)
    assert outcome.is_error and "did not answer within 2 s" in outcome.text
    # it does not answer a tools/list either: the host stops it, and the next call starts it afresh
    assert wait_for(lambda: _status(host, "frozen").state is ServerState.STOPPED, 60)
    assert process_gone(before) or wait_for(lambda: process_gone(before), 30)
    assert host.call(_fn(host, "frozen", "ping"), "{}").text == "pong"
    assert _pid(host, "frozen") != before


def test_stop_ends_a_call_promptly(host):
    cancel = CancelToken()
    threading.Timer(0.3, cancel.cancel).start()
    began = time.monotonic()
    outcome = host.call("hang_hang", "{}", cancel=cancel, timeout_s=120)
    assert outcome.is_error and outcome.text.startswith("stopped")
    assert time.monotonic() - began < 60  # far inside the call's own 120 s
    assert host.call("hang_ping", "{}").text == "pong"


def test_a_crash_mid_call_fails_the_server_and_the_next_call_restarts_it(host):
    before = _pid(host, "crash")
    outcome = host.call(_fn(host, "crash", "crash"), "{}")
    assert outcome.is_error
    assert "stopped while it ran the tool 'crash'" in outcome.text
    assert "about to fall over" in outcome.text
    st = _status(host, "crash")
    assert st.state is ServerState.FAILED
    assert st.error == "the server stopped while it ran the tool 'crash'"
    assert "crash: about to fall over" in st.stderr_tail
    assert CRASH_TOKEN not in st.stderr_tail and "starting with token •••" in st.stderr_tail
    assert process_dead(before)
    # the next call starts it again
    assert host.call(_fn(host, "crash", "ping"), "{}").text == "pong"
    assert _status(host, "crash").state is ServerState.READY
    assert _pid(host, "crash") != before


def test_a_crashed_server_that_cannot_restart_fails_until_restarted(host, refuse_file):
    assert _status(host, "phoenix").state is ServerState.READY
    ping = _fn(host, "phoenix", "ping")
    assert host.call(_fn(host, "phoenix", "crash"), "{}").is_error
    refuse_file.write_text("no")
    try:
        first = host.call(ping, "{}")
        assert first.is_error
        assert first.text == ("the tool server 'phoenix' is not available: the server exited before it was ready "
                              "(its stderr may say why)")
        st = _status(host, "phoenix")
        assert st.state is ServerState.FAILED and "crash: refusing to start" in st.stderr_tail
        refuse_file.unlink()
        # restarted once already: a later call does not start it again by itself
        again = host.call(ping, "{}")
        assert again.is_error and "not available" in again.text
        assert _status(host, "phoenix").state is ServerState.FAILED
    finally:
        refuse_file.unlink(missing_ok=True)
    assert host.restart("phoenix").state is ServerState.READY
    assert host.call(ping, "{}").text == "pong"


def test_restart_of_an_unknown_server():
    host = ToolHost(StandInRegistry([]))
    try:
        with pytest.raises(ToolConfigError, match="no tool server named 'ghost'"):
            host.restart("ghost")
    finally:
        host.close()


def test_a_changed_configuration_restarts_the_server(host, registry, files_root):
    root, other = files_root
    before = _pid(host, "calculator")
    registry.change("files", args=(str(SERVERS / "files.py"), str(other)))
    try:
        assert _status(host, "files").state is ServerState.STOPPED
        assert host.call("read_file", '{"path": "other.txt"}').text == "from the other folder\n"
    finally:
        registry.change("files", args=(str(SERVERS / "files.py"), str(root)))
    assert host.call("read_file", '{"path": "notes.txt"}').text == "the kettle is on\n"
    assert _pid(host, "calculator") == before  # the others are left alone


def test_a_server_switched_off_stops_and_offers_nothing(host, registry):
    registry.change("huge", enabled=False)
    try:
        assert _status(host, "huge").state is ServerState.STOPPED
        assert not any(spec.server == "huge" for spec in host.tools())
        outcome = host.call("huge", "{}")
        assert outcome.is_error and "switched off" in outcome.text
    finally:
        registry.change("huge", enabled=True)
    assert host.call("huge", '{"size": 12}').text == "012345678901"


# --- streamable HTTP ------------------------------------------------------------------------------------------


def test_a_server_over_streamable_http_with_its_header(host):
    assert _status(host, "web").state is ServerState.READY
    outcome = host.call(_fn(host, "web", "multiply"), '{"a": 6, "b": 7}')
    assert (outcome.text, outcome.is_error) == ("42.0", False)


def test_an_http_server_that_refuses_the_header_fails_without_showing_it(host, http_calculator):
    st = _status(host, "web_refused")
    assert st.state is ServerState.FAILED
    assert st.error == f"the server at {http_calculator} answered HTTP 401 (Unauthorized) (are its headers right?)"
    assert "wrong-http-secret-99" not in st.error
    assert st.stderr_tail == ""


def test_an_unreachable_http_server():
    registry = StandInRegistry([http("nowhere", "http://127.0.0.1:9/mcp")])
    host = ToolHost(registry, start_timeout_s=30)
    try:
        (st,) = host.ensure()
        assert st.state is ServerState.FAILED
        assert "127.0.0.1:9" in st.error
    finally:
        host.close()


def test_an_http_server_that_restarts_is_reconnected():
    proc, url = start_http_calculator(HTTP_TOKEN)
    port = int(url.rsplit(":", 1)[1].split("/")[0])
    registry = StandInRegistry([http("web", url, header_names=("Authorization",))],
                               headers={"web": {"Authorization": f"Bearer {HTTP_TOKEN}"}})
    host = ToolHost(registry)
    try:
        assert host.call("add", '{"a": 1, "b": 2}').text == "3.0"
        proc.kill()
        proc.wait(timeout=30)
        gone = host.call("add", '{"a": 1, "b": 2}')
        assert gone.is_error and "Hearth connects again at the next call" in gone.text
        assert host.status()[0].state is ServerState.FAILED
        proc, _url = start_http_calculator(HTTP_TOKEN, port=port)
        assert host.call("add", '{"a": 2, "b": 2}').text == "4.0"
        assert host.status()[0].state is ServerState.READY
    finally:
        host.close()
        proc.kill()
        proc.wait(timeout=30)


# --- starts that fail, close, forgotten hosts -----------------------------------------------------------------


def test_start_timeout_missing_program_and_stop_during_start():
    registry = StandInRegistry([stdio("sleepy", "hang.py", "--at-start"),
                                ToolServerConfig(name="ghost", transport=STDIO, command="/no/such/program"),
                                stdio("homeless", "calculator.py", cwd="/no/such/folder")])
    host = ToolHost(registry, start_timeout_s=3)
    try:
        cancel = CancelToken()
        cancel.cancel()
        early = {st.name: st.state for st in host.ensure(cancel=cancel)}
        assert early["sleepy"] in (ServerState.STARTING, ServerState.STOPPED)
        statuses = {st.name: st for st in host.ensure()}
        sleepy = statuses["sleepy"]
        assert sleepy.state is ServerState.FAILED
        assert sleepy.error == "the server did not become ready within 3 s"
        assert "hang: sleeping instead of serving" in sleepy.stderr_tail
        ghost = statuses["ghost"]
        assert ghost.state is ServerState.FAILED
        assert ghost.error == "the program '/no/such/program' was not found"
        assert statuses["homeless"].error == "the server's working folder '/no/such/folder' does not exist"
        outcome = host.call("anything", "{}")
        assert outcome.is_error and "no tool named" in outcome.text
    finally:
        host.close()


def test_close_stops_every_server_even_mid_call_and_is_idempotent():
    registry = StandInRegistry([stdio("lingering", "hang.py", "--linger"), stdio("calculator", "calculator.py")])
    host = ToolHost(registry)
    host.ensure()
    pids = [_pid(host, "lingering"), _pid(host, "calculator")]
    results = []
    caller = threading.Thread(target=lambda: results.append(host.call("hang", "{}", timeout_s=120)))
    caller.start()
    time.sleep(0.5)
    host.close()
    caller.join(timeout=60)
    assert not caller.is_alive()
    assert results and results[0].is_error
    assert results[0].text == ("the tool server 'lingering' was stopped (Hearth is closing, or the server was restarted) "
                               "before the tool 'hang' finished")
    assert wait_for(lambda: all(process_gone(pid) for pid in pids), 30), "a server outlived close() (or a zombie)"
    host.close()  # again: nothing happens
    assert all(st.state is ServerState.STOPPED for st in host.status())
    after = host.call("add", '{"a": 1, "b": 2}')
    assert after.is_error and "closed" in after.text


def test_a_forgotten_host_stops_its_servers_when_python_exits(tmp_path):
    script = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(SERVERS.parent.parent)!r})
        from engine.tools.host import ToolHost
        from tests.mcp_helpers import StandInRegistry, stdio
        host = ToolHost(StandInRegistry([stdio("lingering", "hang.py", "--linger")]))
        host.ensure()
        print(host.call("pid", "{{}}").text, flush=True)
        # no close(): the host is forgotten
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    pid = int(float(done.stdout.strip().splitlines()[-1]))
    assert wait_for(lambda: process_dead(pid), 30), "the lingering server outlived its forgotten host"


def test_a_host_nobody_closed_stops_its_servers_when_collected():
    def forget() -> int:
        host = ToolHost(StandInRegistry([stdio("calculator", "calculator.py")]))
        outcome = host.call("pid", "{}")  # a call starts the server it needs
        assert not outcome.is_error, outcome.text
        return int(float(outcome.text))

    pid = forget()
    gc.collect()
    assert wait_for(lambda: process_gone(pid), 30), "the server outlived its collected host"


def test_redact():
    assert redact("key abcdef and abc", ["abc", "abcdef", ""]) == "key ••• and •••"
    assert redact("nothing here", []) == "nothing here"


# --- results.py -----------------------------------------------------------------------------------------------


def _result(*blocks, structured=None, is_error=False) -> types.CallToolResult:
    return types.CallToolResult(content=list(blocks), structured_content=structured, is_error=is_error)


def _b64(n: int) -> str:
    return base64.b64encode(bytes(n)).decode()


def test_result_text_blocks():
    result = _result(
        types.TextContent(text="first"),
        types.ImageContent(data=_b64(12_345), mime_type="image/png"),
        types.AudioContent(data=_b64(10), mime_type="audio/wav"),
        types.ResourceLink(uri="file:///tmp/a.txt", name="a.txt"),
        types.EmbeddedResource(resource=types.TextResourceContents(uri="file:///b.txt", text="inside b")),
        types.EmbeddedResource(resource=types.BlobResourceContents(uri="file:///c.bin", blob=_b64(3),
                                                                   mime_type="application/octet-stream")),
        structured={"ignored": "because there is text"})
    text, cut_from = result_text(result, 10_000)
    assert cut_from is None
    assert text.split("\n") == [
        "first",
        "[image: image/png, 12,345 bytes, not shown]",
        "[audio: audio/wav, 10 bytes, not shown]",
        "[resource: file:///tmp/a.txt a.txt]",
        "inside b",
        "[resource: file:///c.bin, application/octet-stream, 3 bytes, not shown]",
    ]


def test_result_text_structured_only_and_empty():
    assert result_text(_result(structured={"a": 1, "b": [1, "ü"]}), 100) == ('{"a":1,"b":[1,"ü"]}', None)
    assert result_text(_result(), 100) == (EMPTY_RESULT, None)
    assert result_text(_result(is_error=True), 100) == (EMPTY_ERROR, None)
    image_only = result_text(_result(types.ImageContent(data=_b64(1), mime_type="image/gif"), structured=[1]), 100)
    assert image_only == ("[image: image/gif, 1 bytes, not shown]\n[1]", None)


def test_result_text_cut_across_blocks():
    result = _result(types.TextContent(text="a" * 6), types.TextContent(text="b" * 6))
    text, cut_from = result_text(result, 8)
    assert cut_from == 13
    assert text == "aaaaaa\nb\n\n[cut: the result was 13 characters; the first 8 are shown]"
    assert result_text(result, 13) == ("aaaaaa\nbbbbbb", None)
