"""The configured MCP servers (engine/tools/config.py): every refusal (names, commands, arguments, environments,
addresses, headers, too many servers, damaged files), the ``mcpServers`` import in the shapes Claude Desktop,
Cursor, LM Studio, Windsurf, Cline, Claude Code and Jan write, all or nothing; tools.json's 0600 mode and
format version; and the secrets in no file of the data dir but secrets.json."""

from __future__ import annotations

import json
import os

import pytest

from engine import secret_store
from engine.api import SecretError, SecretStore, ToolConfigError, ToolRegistry
from engine.tools import config as tool_config
from engine.tools.config import MAX_SERVERS, SECRET_KIND, check_url

from .test_remotes import FakeKeyring

TOKEN = "ghp-TOOLCONFIG-secret-4b1d"
BEARER = "Bearer hf-TOOLCONFIG-token-99ac"


@pytest.fixture
def registry(tmp_path) -> ToolRegistry:
    return ToolRegistry(tmp_path)


def files_holding(home, *secrets: str) -> list[str]:
    """The files of the data dir (secrets.json aside) holding any of ``secrets``."""
    return sorted(str(p.relative_to(home)) for p in home.rglob("*") if p.is_file() and p.name != "secrets.json"
                  and any(s.encode() in p.read_bytes() for s in secrets))


# names, commands, arguments, environments -----------------------------------------------------------
@pytest.mark.parametrize("name", ["", "-fs", ".fs", "a b", "fs/x", "x" * 65, "ü", "fs:1", None, 3])
def test_bad_names(registry, name):
    with pytest.raises(ToolConfigError, match="cannot name a tool server"):
        registry.add_stdio(name, "npx")
    assert registry.servers() == []


@pytest.mark.parametrize("command, why", [("", "command is empty"), ("   ", "command is empty"),
                                          ("np\0x", "command holds a NUL"), ("x" * 5000, "command is longer than 4096")])
def test_bad_commands(registry, command, why):
    with pytest.raises(ToolConfigError, match=f"server fs: the {why}"):
        registry.add_stdio("fs", command)


@pytest.mark.parametrize("args, why", [(["a"] * 257, "257 arguments: at most 256"), (["ok", 3], "argument 2 is not text"),
                                       (["a\0"], "argument 1 holds a NUL"), (["x" * 8193], "argument 1 is longer")])
def test_bad_arguments(registry, args, why):
    with pytest.raises(ToolConfigError, match=why):
        registry.add_stdio("fs", "npx", args)


@pytest.mark.parametrize("env, why", [
    ({f"V{i}": "x" for i in range(129)}, "129 variables: at most 128"), ({"1A": "x"}, "cannot name an environment"),
    ({"A-B": "x"}, "cannot name an environment"), ({"": "x"}, "cannot name an environment"),
    ({"PORT": 8080}, "value of PORT is not text"), ({"A": "x\0y"}, "value of A holds a NUL"),
    ({"A": "x" * 4097}, "value of A is longer"), ({"Token": "a", "TOKEN": "b"}, "differing only in case"),
    ({f"V{i}": "x" * 4000 for i in range(5)}, "come to over 16 KiB"),
])
def test_bad_environments(registry, tmp_path, env, why):
    with pytest.raises(ToolConfigError, match=why) as refused:
        registry.add_stdio("fs", "npx", env=env)
    assert "x" * 50 not in str(refused.value)  # a value is never quoted back
    assert registry.servers() == [] and not (tmp_path / "secrets.json").exists()


def test_bad_working_folders(registry):
    with pytest.raises(ToolConfigError, match="not an absolute path"):
        registry.add_stdio("fs", "npx", cwd="relative/dir")
    assert registry.add_stdio("fs", "npx", cwd="~/x").cwd == os.path.expanduser("~/x")


# addresses and headers --------------------------------------------------------------------------------
@pytest.mark.parametrize("url, why", [
    ("gpu-box:8000/mcp", "not a server address"), ("ftp://h/mcp", "not a server address"),
    ("http://", "not a server address"), ("http://:80/mcp", "not a server address"),
    ("http://u:pw@h/mcp", "user name or password"), ("https://token@h/mcp", "user name or password"),
    ("http://h/mcp?api_key=k", "query or fragment"), ("http://h/mcp#x", "query or fragment"),
    ("http://h:99999/mcp", "port"), ("http://[::1/mcp", "cannot be read"), ("http://h/m cp", "spaces"),
    ("http://h/" + "x" * 3000, "longer than 2048"), (None, "must be text"),
])
def test_bad_addresses(url, why):
    with pytest.raises(ToolConfigError, match=why) as refused:
        check_url(url)
    assert "pw" not in str(refused.value) or why != "user name or password"


@pytest.mark.parametrize("url", [
    f"https://u:{TOKEN}@h:port/mcp", f"ftp://u:{TOKEN}@h/mcp", f"http://h:99999/mcp?key={TOKEN}",
    f"gpu-box/mcp#{TOKEN}", f"http://[::1/mcp?key={TOKEN}",
])
def test_a_refused_address_never_quotes_its_credentials(url):
    """Checked in order, the host, port or scheme fails before the credentials' own refusal: it must not quote them."""
    with pytest.raises(ToolConfigError, match="not a server address") as refused:
        check_url(url)
    assert TOKEN not in str(refused.value)


def test_addresses_kept_as_given():
    assert check_url(" https://h:8443/api/mcp/ ") == "https://h:8443/api/mcp/"
    assert check_url("http://[::1]:9000/mcp") == "http://[::1]:9000/mcp"


@pytest.mark.parametrize("headers, why", [
    ({"Bad Name": "x"}, "cannot name an HTTP header"), ({"Content-Type": "x"}, "transport's own"),
    ({"mcp-session-id": "x"}, "transport's own"), ({"X-Key": "a", "x-key": "b"}, "named once"),
    ({"X-Key": "a\r\nInjected: 1"}, "line breaks"), ({"X-Key": "  "}, "is empty"), ({"X-Key": "clé"}, "non-ASCII"),
    ({"X-Key": "k" * 4097}, "longer than 4096"), ({"X-Key": 5}, "not text"),
    ({f"X-{i}": "v" for i in range(65)}, "65 headers: at most 64"),
])
def test_bad_headers(registry, headers, why):
    with pytest.raises(ToolConfigError, match=why):
        registry.add_http("web", "https://h/mcp", headers)
    assert registry.servers() == []


# adding, replacing, switching, removing ---------------------------------------------------------------
def test_add_get_replace_switch_remove(registry, tmp_path):
    fs = registry.add_stdio("fs", "npx", ["-y", "@modelcontextprotocol/server-filesystem", "/data"],
                            {"TOKEN": TOKEN, "EMPTY": "", "SPACED": "a value with spaces"}, "/srv")
    assert (fs.transport, fs.command, fs.args, fs.env_names, fs.cwd) == (
        "stdio", "npx", ("-y", "@modelcontextprotocol/server-filesystem", "/data"), ("EMPTY", "SPACED", "TOKEN"), "/srv")
    web = registry.add_http("web", "https://h/mcp", {"Authorization": BEARER})
    assert (web.transport, web.url, web.header_names) == ("http", "https://h/mcp", ("Authorization",))
    assert registry.servers() == [fs, web] and registry.get("fs") == fs
    assert registry.env_of("fs") == {"TOKEN": TOKEN, "EMPTY": "", "SPACED": "a value with spaces"}
    assert registry.headers_of("web") == {"Authorization": BEARER} and registry.env_of("web") == {}
    with pytest.raises(ToolConfigError, match="named fs exists already; replace it with --replace"):
        registry.add_stdio("fs", "uvx")
    with pytest.raises(ToolConfigError, match="differing only in case"):
        registry.add_stdio("FS", "uvx")  # some keyrings tell no case apart: their secrets would mix
    replaced = registry.add_stdio("fs", "uvx", ["mcp-server-git"], {"OTHER": "o"}, replace=True)
    assert registry.env_of("fs") == {"OTHER": "o"}
    assert registry.secrets.get(SECRET_KIND, "fs/TOKEN") is None  # the replaced server's secrets went with it
    assert replaced.args == ("mcp-server-git",)

    off = registry.set_tool_enabled("fs", "git_commit", False)
    assert off.disabled_tools == {"git_commit"} and not off.tool_enabled("git_commit") and off.tool_enabled("git_log")
    assert registry.set_enabled("fs", False).enabled is False
    kept = registry.get("fs")
    assert not kept.enabled and kept.disabled_tools == {"git_commit"} and not kept.tool_enabled("git_log")
    registry.set_enabled("fs", True)
    assert registry.set_tool_enabled("fs", "git_commit", True).disabled_tools == frozenset()
    with pytest.raises(ToolConfigError, match="tool's name is 1 to 128"):
        registry.set_tool_enabled("fs", "", False)
    with pytest.raises(ToolConfigError, match=r"no tool server named 'nope' \(servers: fs, web\)"):
        registry.set_enabled("nope", False)

    registry.remove("web")
    assert registry.secrets.get(SECRET_KIND, "web/header:Authorization") is None
    assert [c.name for c in registry.servers()] == ["fs"]
    with pytest.raises(ToolConfigError, match="no tool server named 'web'"):
        registry.remove("web")
    with pytest.raises(ToolConfigError, match="no tool server named 'web'"):
        registry.headers_of("web")


def test_at_most_so_many_servers(registry, monkeypatch):
    monkeypatch.setattr(tool_config, "MAX_SERVERS", 3)
    for i in range(3):
        registry.add_stdio(f"s{i}", "npx")
    with pytest.raises(ToolConfigError, match="at most 3 tool servers"):
        registry.add_http("s3", "http://h/mcp")
    registry.add_stdio("s0", "uvx", replace=True)  # replacing one is not one more
    with pytest.raises(ToolConfigError, match="at most 3 tool servers \\(5 with these\\)"):
        registry.import_servers({"mcpServers": {"s1": {"command": "a"}, "n1": {"command": "a"},
                                                "n2": {"command": "a"}}}, replace=True)
    assert [c.name for c in registry.servers()] == ["s0", "s1", "s2"]


def test_the_file_is_private_versioned_and_holds_no_secret(registry, tmp_path):
    registry.add_stdio("fs", "npx", env={"TOKEN": TOKEN})
    registry.add_http("web", "https://h/mcp", {"Authorization": BEARER})
    path = tmp_path / "tools.json"
    assert path.stat().st_mode & 0o777 == 0o600
    document = json.loads(path.read_text())
    assert document["version"] == tool_config.FORMAT_VERSION
    assert document["servers"]["fs"]["env"] == ["TOKEN"] and document["servers"]["web"]["headers"] == ["Authorization"]
    assert files_holding(tmp_path, TOKEN, BEARER, BEARER.split()[1]) == []
    secrets = json.loads((tmp_path / "secrets.json").read_text())
    assert secrets == {"tool-env:fs/TOKEN": TOKEN, "tool-env:web/header:Authorization": BEARER}
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []  # no temp file left behind


# damaged files ---------------------------------------------------------------------------------------------
def entry(**fields) -> dict:
    return {"transport": "stdio", "command": "npx", "args": [], "env": [], "cwd": None, "enabled": True,
            "disabled_tools": [], **fields}


def doc(servers, version=1) -> bytes:
    return json.dumps({"version": version, "servers": servers}).encode()


@pytest.mark.parametrize("content", [
    b"not json", b"[1]", b"\xff\xfe", b"[" * 100_000, b'{"servers": {}}', doc([]), doc({}, version="1"),
    doc({}, version=0), doc({"Bad Name": entry()}), doc({"fs": entry(transport="sse")}), doc({"fs": entry(args="x")}),
    doc({"fs": entry(command="")}), doc({"fs": entry(env=["A", "A"])}), doc({"fs": entry(env=["1A"])}),
    doc({"fs": entry(disabled_tools=[3])}), doc({"fs": entry(enabled="yes")}), doc({"fs": entry(cwd="rel")}),
    doc({"fs": "npx"}), doc({"web": {"transport": "http", "url": "http://u:p@h/mcp"}}),
    doc({"web": {"transport": "http", "url": "http://h/mcp", "headers": ["Content-Type"]}}),
    doc({"fs": entry(), "FS": entry()}), doc({f"s{i}": entry() for i in range(MAX_SERVERS + 1)}),
    b" " * (tool_config.MAX_FILE_BYTES + 1),
])
def test_a_damaged_file_is_said_plainly_and_left_alone(registry, content):
    registry.path.write_bytes(content)
    for action in (registry.servers, lambda: registry.get("fs"), lambda: registry.add_stdio("x", "npx"),
                   lambda: registry.import_servers({"mcpServers": {"x": {"command": "npx"}}})):
        with pytest.raises(ToolConfigError, match="list of tool servers .* is damaged .*; move it away"):
            action()
    assert registry.path.read_bytes() == content  # never overwritten by a change read over it


def test_a_newer_file_and_an_unreadable_one(registry):
    registry.path.write_bytes(doc({}, version=99))
    with pytest.raises(ToolConfigError, match="written by a newer Hearth"):
        registry.servers()
    registry.path.unlink()
    registry.path.mkdir()  # a directory where the file should be
    with pytest.raises(ToolConfigError, match="cannot read the list of tool servers"):
        registry.servers()


def test_a_secret_gone_from_the_store_is_said(registry, tmp_path):
    registry.add_stdio("fs", "npx", env={"TOKEN": TOKEN})
    (tmp_path / "secrets.json").write_text("{}")
    with pytest.raises(ToolConfigError, match="the value of TOKEN of tool server fs is missing from") as refused:
        registry.env_of("fs")
    assert "--replace" in str(refused.value)


# the mcpServers import ---------------------------------------------------------------------------------------
CLAUDE_DESKTOP = {  # claude_desktop_config.json, as the MCP quickstart shows it (other app settings beside it)
    "globalShortcut": "Alt+Space",
    "mcpServers": {
        "filesystem": {"command": "npx", "args": ["-y", "@modelcontextprotocol/server-filesystem",
                                                  "/Users/username/Desktop", "/Users/username/Downloads"]},
        "brave-search": {"command": "npx", "args": ["-y", "@modelcontextprotocol/server-brave-search"],
                         "env": {"BRAVE_API_KEY": TOKEN}},
    },
}
CURSOR = {  # .cursor/mcp.json: a program, and a remote server with headers
    "mcpServers": {
        "server-name": {"command": "npx", "args": ["-y", "mcp-server"], "env": {"API_KEY": "value"}},
        "remote-server": {"url": "http://localhost:3000/mcp", "headers": {"API_KEY": "hdr-value-1234"}},
        "python-server": {"command": "python", "args": ["mcp-server.py"], "env": {"API_KEY": "value"},
                          "envFile": "${workspaceFolder}/.env"},
    },
}
LM_STUDIO = {  # mcp.json, Cursor's notation
    "mcpServers": {"hf-mcp-server": {"url": "https://huggingface.co/mcp", "headers": {"Authorization": BEARER}}}}
OTHERS = {  # Windsurf's serverUrl, Claude Code's "type", Cline's disabled/autoApprove, Jan's active
    "mcpServers": {
        "windsurf": {"serverUrl": "https://mcp.example.com/mcp"},
        "claude-code": {"type": "http", "url": "https://api.example.com/mcp", "headers": {"X-API-Key": "k-123456789"}},
        "git": {"type": "stdio", "command": "uvx", "args": ["mcp-server-git", "--repository", "/repo"], "env": None},
        "cline": {"command": "node", "args": ["/srv/index.js"], "disabled": True, "autoApprove": [], "timeout": 60},
        "jan": {"command": "npx", "args": ["-y", "@browsermcp/mcp"], "env": {}, "active": False},
        "streamable": {"type": "streamable-http", "url": "http://127.0.0.1:8000/mcp"},
    },
}


def test_real_world_files_import(registry, tmp_path):
    notes: list[str] = []
    path = tmp_path / "claude_desktop_config.json"
    path.write_text(json.dumps(CLAUDE_DESKTOP, indent=2))
    assert registry.import_servers(path, notes=notes) == ["filesystem", "brave-search"]
    assert notes == []
    assert registry.get("filesystem").args[-1] == "/Users/username/Downloads"
    assert registry.env_of("brave-search") == {"BRAVE_API_KEY": TOKEN}
    assert registry.import_servers(CURSOR, notes=notes) == ["server-name", "remote-server", "python-server"]
    assert notes == ["server python-server: ignored 'envFile' (Hearth has no such setting)"]
    assert registry.headers_of("remote-server") == {"API_KEY": "hdr-value-1234"}
    assert registry.get("remote-server").transport == "http"
    assert registry.import_servers(LM_STUDIO) == ["hf-mcp-server"]
    assert registry.headers_of("hf-mcp-server") == {"Authorization": BEARER}
    notes.clear()
    registry.import_servers(OTHERS, notes=notes)
    assert notes == ["server cline: ignored 'autoApprove', 'timeout' (Hearth has no such setting)"]
    got = {c.name: c for c in registry.servers()}
    assert got["windsurf"].url == "https://mcp.example.com/mcp" and got["windsurf"].transport == "http"
    assert got["claude-code"].header_names == ("X-API-Key",) and got["git"].env_names == ()
    assert got["git"].args == ("mcp-server-git", "--repository", "/repo")
    assert not got["cline"].enabled and not got["jan"].enabled and got["git"].enabled
    assert got["streamable"].transport == "http"
    assert files_holding(tmp_path, TOKEN, BEARER, "hdr-value-1234", "k-123456789") == ["claude_desktop_config.json"]


@pytest.mark.parametrize("spec, why", [
    ("npx", "its entry is not an object"), ({}, "neither a \"command\""),
    ({"type": "sse", "url": "http://h/sse"}, "older SSE transport"), ({"type": "ws", "url": "ws://h"}, "none of stdio"),
    ({"type": 1, "command": "x"}, '"type" must be text'),
    ({"command": "npx", "url": "http://h/mcp"}, '"url" .* does not fit'),
    ({"type": "stdio", "url": "http://h/mcp"}, '"url" .* does not fit'),
    ({"type": "stdio", "args": []}, 'no "command"'), ({"type": "http"}, 'no "url"'),
    ({"command": "npx", "headers": {"A": "b"}}, '"headers" .* does not fit'),
    ({"url": "http://h/mcp", "env": {"A": "b"}}, '"env" .* does not fit'),
    ({"url": "http://a/mcp", "serverUrl": "http://b/mcp"}, "differ"),
    ({"command": "npx", "disabled": "yes"}, '"disabled" must be true or false'),
    ({"command": "npx", "env": {"PORT": 8080}}, "value of PORT is not text"),
    ({"command": "npx", "args": "-y server"}, "arguments must be a list"),
    ({"command": "npx", "env": ["A=b"]}, "environment must be an object"),
    ({"command": ""}, "command is empty"), ({"url": "http://h/mcp?key=SECRET"}, "query"),
    ({"command": "npx", "cwd": "rel"}, "not an absolute path"),
])
def test_a_bad_entry_refuses_the_whole_import(registry, tmp_path, spec, why):
    document = {"mcpServers": {"good": {"command": "npx", "env": {"TOKEN": TOKEN}}, "bad": spec}}
    with pytest.raises(ToolConfigError, match=f"nothing was imported from the document: server bad: .*{why}") as refused:
        registry.import_servers(document)
    assert "SECRET" not in str(refused.value) or "query" in why  # a value never quoted back…
    assert registry.servers() == [] and not (tmp_path / "secrets.json").exists()  # …and nothing half-added


@pytest.mark.parametrize("document, why", [
    ({}, 'no "mcpServers" object'), ({"mcpServers": []}, 'no "mcpServers" object'), ([], 'no "mcpServers"'),
    ({"mcpServers": {}}, "lists no servers"), ({"mcpServers": {"My Server": {"command": "x"}}}, "'My Server' cannot name"),
    ({"mcpServers": {"git": {"command": "x"}, "Git": {"command": "x"}}}, "differing only in case"),
    ({"mcpServers": {f"s{i}": {"command": "x"} for i in range(MAX_SERVERS + 1)}}, f"{MAX_SERVERS + 1} servers"),
])
def test_bad_documents(registry, document, why):
    with pytest.raises(ToolConfigError, match=why):
        registry.import_servers(document)
    assert registry.servers() == []


def test_bad_files_to_import(registry, tmp_path):
    cases = {"dup.json": (b'{"mcpServers": {"fs": {"command": "a"}, "fs": {"command": "b"}}}', "'fs' appears twice"),
             "bad.json": (b'{"mcpServers": ', "is not valid JSON"), "bin.json": (b"\xff\xfe{}", "not UTF-8"),
             "deep.json": (b"[" * 100_000, "too deeply"),
             "big.json": (b" " * (tool_config.MAX_FILE_BYTES + 1), "larger than 1 MiB")}
    for name, (content, why) in cases.items():
        (tmp_path / name).write_bytes(content)
        with pytest.raises(ToolConfigError, match=why):
            registry.import_servers(tmp_path / name)
    with pytest.raises(ToolConfigError, match="is not there"):
        registry.import_servers(tmp_path / "missing.json")
    with pytest.raises(ToolConfigError, match="cannot read the file to import .*not a regular file"):
        registry.import_servers(tmp_path)  # a directory
    if hasattr(os, "mkfifo"):
        os.mkfifo(tmp_path / "fifo.json")
        with pytest.raises(ToolConfigError, match="FIFO"):
            registry.import_servers(tmp_path / "fifo.json")  # refused at once, never a hang
    assert registry.servers() == []


def test_import_refuses_names_configured_unless_replace(registry, tmp_path):
    registry.add_stdio("fs", "npx", env={"TOKEN": TOKEN})
    document = {"mcpServers": {"new": {"command": "uvx"}, "fs": {"url": "https://h/mcp", "headers": {"X-K": "vvvv"}}}}
    with pytest.raises(ToolConfigError, match="nothing was imported .* named fs exists already"):
        registry.import_servers(document)
    assert [c.name for c in registry.servers()] == ["fs"] and registry.env_of("fs") == {"TOKEN": TOKEN}
    assert registry.import_servers(document, replace=True) == ["new", "fs"]
    assert registry.get("fs").transport == "http" and registry.headers_of("fs") == {"X-K": "vvvv"}
    assert TOKEN not in (tmp_path / "secrets.json").read_text()  # the replaced server's environment went


# the secret store under the registry ---------------------------------------------------------------------------
def test_the_keyring_path(tmp_path, monkeypatch):
    ring = FakeKeyring()
    monkeypatch.setattr(secret_store, "_system_keyring", lambda: ring)
    registry = ToolRegistry(tmp_path)
    registry.add_stdio("fs", "npx", env={"TOKEN": TOKEN, "EMPTY": ""})
    assert ring.items == {("hearth", "tool-env:fs/TOKEN"): TOKEN, ("hearth", "tool-env:fs/EMPTY"): ""}
    assert not (tmp_path / "secrets.json").exists() and registry.env_of("fs") == {"TOKEN": TOKEN, "EMPTY": ""}
    registry.remove("fs")
    assert ring.items == {}
    ring.fail = True  # a locked keyring: the file keeps them
    registry.add_stdio("fs", "npx", env={"TOKEN": TOKEN})
    assert registry.env_of("fs") == {"TOKEN": TOKEN} and TOKEN in (tmp_path / "secrets.json").read_text()


def test_the_secrets_file_never_grows_past_what_it_reads_back(tmp_path):
    store = SecretStore(tmp_path, use_keyring=False)
    store.set("server", "lab", "sk-kept")
    with pytest.raises(SecretError, match="would grow past 1 MB"):
        store.set_many("tool-env", {f"s/V{i}": "x" * 4000 for i in range(300)})
    assert store.get("server", "lab") == "sk-kept"  # what was kept is still readable


def test_redact_hides_values_in_text(registry):
    registry.add_stdio("fs", "npx", env={"TOKEN": TOKEN, "DEBUG": "1"})
    registry.add_http("web", "https://h/mcp", {"Authorization": BEARER})
    token = BEARER.split()[1]
    text = f"auth with {TOKEN}; header {BEARER}; bare {token}; DEBUG=1"
    assert registry.redact(text) == "auth with •••; header •••; bare •••; DEBUG=1"
    assert registry.redact(text, ["fs"]) == f"auth with •••; header {BEARER}; bare {token}; DEBUG=1"
    assert registry.redact("") == ""
