"""``hearth-cli tools import | add | rm | enable | disable | ls`` end to end, in subprocesses (and in-process for
the logs at DEBUG): every bad input's one-line error and exit 1; ``add NAME [options] -- COMMAND ARGS`` keeping
the command's own options and ``--``; and the secrets (environment values, headers) nowhere but secrets.json —
not in any --json output, message, log line or other file of the data dir. ``ls`` starting real MCP servers
(tests/cli_tool_server.py, on the official SDK) needs engine/tools/host.py's body."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

import pytest

from engine.api import ToolRegistry
from engine.cli.main import main
from engine.cli.tools import split_command

from .test_cli import assert_clean_error, run_cli

TOKEN = "ghp-CLITOOLS-secret-value-77e1"
HEADER = "Bearer CLITOOLS-header-token-5c2"
FILE_TOKEN = "sk-CLITOOLS-from-env-file-31d"
SERVER = str(Path(__file__).with_name("cli_tool_server.py"))
SECRETS = (TOKEN, HEADER, HEADER.split()[1], FILE_TOKEN)


def ok(proc) -> str:
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    return proc.stdout


def ok_json(proc) -> dict:
    return json.loads(ok(proc))


def leaks(home: Path, texts: list[str]) -> list[str]:
    """Where a secret shows: any of ``texts``, or a file of the data dir other than secrets.json."""
    found = [f"output {i}" for i, t in enumerate(texts) if any(s in t for s in SECRETS)]
    found += [str(p) for p in home.rglob("*") if p.is_file() and p.name != "secrets.json"
              and any(s.encode() in p.read_bytes() for s in SECRETS)]
    return found


@pytest.mark.parametrize("argv, head, command", [
    (["tools", "add", "fs", "--env", "A=1", "--", "python", "-m", "srv", "--flag"],
     ["tools", "add", "fs", "--env", "A=1"], ["python", "-m", "srv", "--flag"]),
    (["--data-dir", "/d", "--json", "tools", "--debug", "add", "fs", "--", "x", "--", "-y"],
     ["--data-dir", "/d", "--json", "tools", "--debug", "add", "fs"], ["x", "--", "-y"]),
    (["--data", "tools", "tools", "add", "fs", "--", "x"], ["--data", "tools", "tools", "add", "fs"], ["x"]),
    (["tools", "add", "fs", "--"], ["tools", "add", "fs"], []),
    (["generate", "--prompt", "--", "-x"], ["generate", "--prompt", "--", "-x"], None),  # not ours: left as it is
    (["tools", "ls", "--", "add"], ["tools", "ls", "--", "add"], None),
    (["tools", "add", "fs", "--url", "http://h/mcp"], ["tools", "add", "fs", "--url", "http://h/mcp"], None),
])
def test_split_command(argv, head, command):
    assert split_command(argv) == (head, command)


def test_add_ls_switch_rm_and_every_bad_input(tmp_path):
    home = tmp_path / "home"

    def cli(*args: str):
        return run_cli("tools", *args, home=home, timeout=120)

    added = ok_json(cli("add", "fs", "--env", f"TOKEN={TOKEN}", "--cwd", str(tmp_path), "--json", "--",
                        sys.executable, "-m", "srv", "--flag", "--", "-x"))
    assert added["command"] == sys.executable and added["args"] == ["-m", "srv", "--flag", "--", "-x"]
    assert added["env"] == ["TOKEN"] and added["cwd"] == str(tmp_path) and added["secrets_kept_in"].endswith("secrets.json")
    human = ok(cli("add", "web", "--url", "https://h.example/mcp", "--header", f"Authorization: {HEADER}"))
    assert "added tool server web (http: https://h.example/mcp); its headers kept in" in human
    ok(cli("add", "plain", str(Path(SERVER).name)))  # no options: the command needs no --
    listed = ok_json(cli("ls", "--no-start", "--json"))["servers"]
    assert [s["name"] for s in listed] == ["fs", "plain", "web"]
    assert listed[0] | {"cwd": None} == {
        "name": "fs", "transport": "stdio", "command": sys.executable, "args": ["-m", "srv", "--flag", "--", "-x"],
        "cwd": None, "url": None, "env": ["TOKEN"], "headers": [], "enabled": True, "disabled_tools": [],
        "state": None, "error": "", "stderr_tail": "", "tools": []}
    assert listed[2]["headers"] == ["Authorization"] and listed[2]["url"] == "https://h.example/mcp"

    assert ok_json(cli("disable", "fs/echo", "--json")) == {"server": "fs", "tool": "echo", "enabled": False}
    assert "disabled tool server web" in ok(cli("disable", "web"))
    assert "(the server itself is disabled" in ok(cli("enable", "web/x"))
    table = ok(cli("ls", "--no-start"))
    assert "\nfs     yes  -" in table and "tools switched off: echo" in table and "\nweb    no " in table
    assert "[env: TOKEN]" in table and "[headers: Authorization]" in table and "3 tool server(s)" in table
    ok(cli("enable", "web"))

    env_file = tmp_path / "srv.env"
    (tmp_path / "dir").mkdir()
    refusals = [
        (("add", "fs", "--", "npx"), "named fs exists already; replace it with --replace"),
        (("add", "FS", "--", "npx"), "differing only in case"),
        (("add", "Bad Name", "--", "npx"), "cannot name a tool server"),
        (("add", "x", "--env", f"NOEQUALS{TOKEN}", "--", "npx"), "the 1st --env is not KEY=VALUE"),
        (("add", "x", "--env", "A=1", "--env", f"A={TOKEN}", "--", "npx"), "--env gives 'A' twice"),
        (("add", "x", "--env", f"1BAD={TOKEN}", "--", "npx"), "cannot name an environment variable"),
        (("add", "x", "--env-file", str(tmp_path / "missing.env"), "--", "npx"), "cannot read the environment file"),
        (("add", "x", "--env-file", str(tmp_path / "dir"), "--", "npx"), "not a regular file"),
        (("add", "x", "--env-file", str(env_file), "--", "npx"), "line 2 of the environment file"),
        (("add", "x", "--cwd", str(tmp_path / "nowhere"), "--", "npx"), "is not a folder"),
        (("add", "x"), "give the command that starts the server after --"),
        (("add", "x", "--"), "give the command that starts the server after --"),
        (("add", "x", "--", ""), "command is empty"),
        (("add", "x", "--url", "ftp://h/mcp"), "is not a server address"),
        (("add", "x", "--url", f"https://u:{TOKEN}@h/mcp"), "user name or password"),
        (("add", "x", "--url", "https://h/mcp", "--", "npx"), "takes no command"),
        (("add", "x", "--url", "https://h/mcp", "--env", "A=1"), "takes no --env"),
        (("add", "x", "--header", "A: b", "--", "npx"), "--header is for an HTTP server"),
        (("add", "x", "--url", "https://h/mcp", "--header", f"NoColon{TOKEN}"), "the 1st --header is not 'Name: value'"),
        (("add", "x", "--url", "https://h/mcp", "--header", f"X-A: {TOKEN}\x01"), "control"),
        (("rm", "nope"), "no tool server named 'nope' (servers: fs, plain, web)"),
        (("enable", "nope"), "no tool server named 'nope'"),
        (("disable", "nope/echo"), "no tool server named 'nope'"),
        (("disable", "fs/"), "names no tool"),
        (("import", str(tmp_path / "missing.json")), "the file to import"),
    ]
    env_file.write_text(f"# the server's key\nTOKEN {TOKEN}\n")
    for args, needle in refusals:
        proc = cli(*args)
        assert_clean_error(proc, needle)
        assert proc.returncode == 1 and TOKEN not in proc.stderr + proc.stdout, (args, proc.stderr)

    assert ok_json(cli("rm", "web", "--json")) == {"removed": "web"}
    assert [s["name"] for s in ok_json(cli("ls", "--no-start", "--json"))["servers"]] == ["fs", "plain"]
    assert leaks(home, []) == []


def test_env_files_and_imports(tmp_path):
    home = tmp_path / "home"
    env_file = tmp_path / "srv.env"
    env_file.write_text(f"# comment\n\nexport TOKEN=\"{FILE_TOKEN}\"\nEMPTY=\nSPACED = 'two words'\nOVER=file\n")
    ok(run_cli("tools", "add", "fs", "--env-file", str(env_file), "--env", "OVER=flag", "--", "npx", "srv", home=home))
    registry = ToolRegistry(home)
    assert registry.env_of("fs") == {"TOKEN": FILE_TOKEN, "EMPTY": "", "SPACED": "two words", "OVER": "flag"}
    for content, needle in ((b"\xff\xfe\x00", "not UTF-8"), (b"A=1\nA=2\n", "gives 'A' twice (lines 1 and 2)"),
                            (b"x" * (65 << 10), "larger than 64 KiB")):
        env_file.write_bytes(content)
        assert_clean_error(run_cli("tools", "add", "y", "--env-file", str(env_file), "--", "npx", home=home), needle)

    claude = tmp_path / "claude_desktop_config.json"
    claude.write_text(json.dumps({"mcpServers": {
        "brave-search": {"command": "npx", "args": ["-y", "@modelcontextprotocol/server-brave-search"],
                         "env": {"BRAVE_API_KEY": TOKEN}},
        "hf": {"url": "https://huggingface.co/mcp", "headers": {"Authorization": HEADER}, "autoApprove": []}}}))
    imported = run_cli("tools", "import", str(claude), "--json", home=home)
    assert ok_json(imported) == {"imported": ["brave-search", "hf"], "secrets_kept_in": str(home / "secrets.json"),
                                 "notes": ["server hf: ignored 'autoApprove' (Hearth has no such setting)"]}
    assert "note: server hf: ignored 'autoApprove'" in imported.stderr
    assert_clean_error(run_cli("tools", "import", str(claude), home=home),
                       f"nothing was imported from {claude}: a tool server named brave-search, hf exists already")
    again = ok(run_cli("tools", "import", str(claude), "--replace", home=home))
    assert "imported 2 tool server(s): brave-search, hf" in again

    bad = tmp_path / "bad.json"
    for content, needle in ((b'{"mcpServers": {', "is not valid JSON"), (b"[]", 'no "mcpServers" object'),
                            (b'{"mcpServers": {"ok": {"command": "a"}, "sse": {"type": "sse", "url": "http://h/sse"}}}',
                             "server sse: it uses the older SSE transport"),
                            (b'{"mcpServers": {"a": {"command": "x"}, "a": {"command": "y"}}}', "'a' appears twice"),
                            (b" " * ((1 << 20) + 1), "larger than 1 MiB")):
        bad.write_bytes(content)
        assert_clean_error(run_cli("tools", "import", str(bad), home=home), needle)
    assert "ok" not in [c.name for c in ToolRegistry(home).servers()]  # all or nothing
    assert leaks(home, [imported.stdout, imported.stderr, again]) == []


def test_the_secrets_are_in_no_output_log_or_file(tmp_path, capsys, caplog):
    """In-process (the logs at DEBUG), every command that touches the secrets: none shows one."""
    home = tmp_path / "home"
    env_file = tmp_path / "srv.env"
    env_file.write_text(f"FILE_TOKEN={FILE_TOKEN}\n")
    caplog.set_level(logging.DEBUG)
    base = ["--data-dir", str(home), "--debug"]
    runs = [["tools", "add", "fs", "--env", f"TOKEN={TOKEN}", "--env-file", str(env_file), "--", "npx", "srv"],
            ["tools", "add", "web", "--url", "https://h/mcp", "--header", f"Authorization: {HEADER}", "--json"],
            ["tools", "ls", "--no-start", "--json"], ["tools", "ls", "--no-start"], ["tools", "disable", "fs/echo"],
            ["tools", "add", "fs", "--replace", "--env", f"TOKEN={TOKEN}", "--json", "--", "npx", "srv"]]
    texts = []
    for argv in runs:
        assert main([*base, *argv]) == 0  # before the command: words after -- are the server's
        out = capsys.readouterr()
        texts += [out.out, out.err]
    assert main(["--data-dir", str(home), "tools", "add", "x", "--env", f"NOEQ{TOKEN}", "--", "npx"]) == 1
    out = capsys.readouterr()
    texts += [out.out, out.err, caplog.text]
    assert "the 1st --env is not KEY=VALUE" in out.err
    assert leaks(home, texts) == []
    assert ToolRegistry(home).env_of("fs") == {"TOKEN": TOKEN}  # replaced: the file's variable went
    assert FILE_TOKEN not in (home / "secrets.json").read_text() and TOKEN in (home / "secrets.json").read_text()


def test_ls_starts_the_servers_and_lists_their_tools(tmp_path):
    """Real MCP servers: one ready with its tools (one switched off), one that dies at start printing its
    token (its error and stderr shown, the token hidden), one disabled (never started)."""
    home = tmp_path / "home"
    ok(run_cli("tools", "add", "good", "--env", f"TOKEN={TOKEN}", "--", sys.executable, SERVER, home=home))
    ok(run_cli("tools", "add", "dies", "--env", f"TOKEN={TOKEN}", "--env", "CLI_TOOL_SERVER_CRASH=1", "--",
               sys.executable, SERVER, home=home))
    ok(run_cli("tools", "add", "off", "--", sys.executable, SERVER, home=home))
    ok(run_cli("tools", "disable", "off", home=home))
    ok(run_cli("tools", "disable", "good/shout", home=home))
    proc = run_cli("tools", "ls", "--json", "--debug", home=home, timeout=300)
    servers = {s["name"]: s for s in ok_json(proc)["servers"]}
    good, dies, off = servers["good"], servers["dies"], servers["off"]
    assert good["state"] == "ready" and good["error"] == ""
    assert {t["name"]: t["enabled"] for t in good["tools"]} == {"echo": True, "shout": False}
    assert all(t["function"] and t["description"] for t in good["tools"])
    assert dies["state"] == "failed" and dies["error"] and dies["tools"] == []
    assert "fatal: cannot start" in dies["stderr_tail"] and "[hidden]" in dies["stderr_tail"]
    assert off["state"] == "stopped" and off["tools"] == []
    human = run_cli("tools", "ls", home=home, timeout=300)
    table = ok(human)
    assert "tools: echo, shout (off)" in table and "stderr: fatal: cannot start" in table and "1 tool(s) ready" in table
    assert leaks(home, [proc.stdout, proc.stderr, human.stdout, human.stderr]) == []
