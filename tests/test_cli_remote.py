"""``hearth-cli remote add | ls | rm`` and ``--model NAME/MODEL`` end to end, in subprocesses, against a real
second Hearth on 127.0.0.1: every bad input's one-line error; a chat moved local → remote → local resuming
its local context from disk; and the key nowhere but the secrets file — not in the database, the bundle, the
logs at DEBUG or any --json output."""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from engine.api import ConversationStore, ModelLibrary, resolve_paths
from engine.server.config import ServerSettings

from .server_helpers import LiveServer
from .test_cli import assert_clean_error, run_cli

KEY = "sk-cli-remote-SECRET-7f3a9"
TINY = "tiny"


def peer_paths(tmp_path, tiny_dir, tiny_gguf, tiny_converted):
    """The second Hearth's own data dir, sharing the tiny model's conversion."""
    tiny_converted("int4")
    home = tmp_path / "peer"
    home.mkdir()
    (home / "converted").symlink_to(tiny_dir / "converted")
    paths = resolve_paths(home).ensure()
    ModelLibrary(paths).add(tiny_gguf)
    return paths


@pytest.fixture
def peer(tmp_path, tiny_dir, tiny_gguf, tiny_converted):
    """A second Hearth with its own data dir, asking for KEY."""
    server = LiveServer(peer_paths(tmp_path, tiny_dir, tiny_gguf, tiny_converted), TINY, ServerSettings(api_key=KEY))
    yield server
    server.close()


@pytest.fixture
def key_file(tmp_path) -> Path:
    path = tmp_path / "key.txt"
    path.write_text(KEY + "\n")
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ok_json(proc) -> dict:
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    return json.loads(proc.stdout)


def test_remote_add_ls_rm_and_every_bad_input(tmp_path, key_file):
    home = tmp_path / "home"
    dead = f"http://127.0.0.1:{free_port()}"
    added = run_cli("remote", "add", "lab", dead, home=home)
    assert added.returncode == 0 and "cannot be reached" in added.stderr and "added all the same" in added.stderr
    assert "added server lab" in added.stdout
    assert_clean_error(run_cli("remote", "add", "lab", dead, home=home), "exists already", "--replace")
    assert_clean_error(run_cli("remote", "add", "Bad Name", dead, home=home), "cannot name a server")
    assert_clean_error(run_cli("remote", "add", "x", "ftp://host", home=home), "is not a server address")
    assert_clean_error(run_cli("remote", "add", "x", "http://u:pw@host:1", home=home), "--api-key-file")
    assert_clean_error(run_cli("remote", "add", "x", "http://host:1/?a=b", home=home), "query")
    assert_clean_error(run_cli("remote", "add", "x", dead, "--api-key-file", str(tmp_path / "nope"), home=home),
                       "cannot read the API key of server x")
    (tmp_path / "empty").write_text("\n")
    assert_clean_error(run_cli("remote", "add", "x", dead, "--api-key-file", str(tmp_path / "empty"), home=home),
                       "is empty")
    (tmp_path / "two").write_text("two words\n")
    two = run_cli("remote", "add", "x", dead, "--api-key-file", str(tmp_path / "two"), home=home)
    assert_clean_error(two, "spaces")
    assert "two words" not in two.stderr  # a refused key is not echoed either
    listed = ok_json(run_cli("remote", "ls", "--json", home=home))
    assert listed == {"servers": [{"name": "lab", "url": dead, "key": False}]}  # nothing half-added
    replaced = ok_json(run_cli("remote", "add", "lab", dead + "/v1", "--api-key-file", str(key_file), "--replace",
                               "--json", home=home))
    assert replaced["key"] is True and replaced["models"] is None and KEY not in json.dumps(replaced)
    assert "\nlab  yes  http" in run_cli("remote", "ls", home=home).stdout
    assert_clean_error(run_cli("remote", "rm", "nope", home=home), "no remote server named 'nope'")
    assert_clean_error(run_cli("chat", "--conversation", "c", "--message", "hi", "--model", "nope/x", home=home),
                       "no remote server named 'nope'", "servers: lab")
    assert_clean_error(run_cli("chat", "--conversation", "c", "--message", "hi", "--model", "lab/x", home=home),
                       "server lab cannot be reached")
    assert_clean_error(run_cli("generate", "--prompt", "hi", "--model", "lab/x", home=home),
                       "server lab cannot be reached")
    shown = ok_json(run_cli("model", "ls", "--json", home=home))  # a dead server: said, no hang
    assert shown["remote_problems"][0]["server"] == "lab" and "cannot be reached" in shown["remote_problems"][0]["problem"]
    assert ok_json(run_cli("remote", "rm", "lab", "--json", home=home)) == {"removed": "lab"}
    assert ok_json(run_cli("remote", "ls", "--json", home=home)) == {"servers": []}
    assert not (home / "secrets.json").exists() or KEY not in (home / "secrets.json").read_text()  # its key went too


def test_a_chat_moves_local_remote_local_and_the_key_is_nowhere(tiny_home, tiny_gguf, peer, key_file, tmp_path,
                                                                 caplog, capsys):
    home = tiny_home
    outputs = []

    def cli(*args: str) -> dict:
        proc = run_cli(*args, "--json", home=home)
        outputs.extend((proc.stdout, proc.stderr))
        return ok_json(proc)

    added = cli("remote", "add", "peer", peer.base, "--api-key-file", str(key_file))
    assert added["models"] == 1 and added["key"] is True
    assert cli("remote", "ls")["servers"] == [{"name": "peer", "url": peer.base, "key": True}]
    models = cli("model", "ls")["models"]
    assert {"name": "peer/tiny", "source": "remote"}.items() <= next(m for m in models if m["name"] == "peer/tiny").items()
    chat = ("chat", "--conversation", "c", "--greedy", "--max-new-tokens", "6", "--provider", "cpu")
    local = cli(*chat, "--message", "hello there", "--model", str(tiny_gguf))
    assert local["resume"]["source"] == "cold" and local["save"]["ok"]
    far = cli(*chat, "--message", "and over there", "--model", "peer/tiny")
    assert far["provider"] == "remote" and far["model_key"] == "peer/tiny" and far["resume"] is None
    assert far["server_cached_tokens"] is None or far["server_cached_tokens"] >= 0
    far2 = cli(*chat, "--message", "once more", "--debug")  # no --model: the chat remembers peer/tiny
    assert far2["model_key"] == "peer/tiny" and far2["server_cached_tokens"] > 0  # the prefix was cached
    back = cli(*chat, "--message", "and home again", "--model", str(tiny_gguf))
    assert back["resume"]["source"] in ("disk", "live") and back["resume"]["reused_tokens"] > 0  # not rebuilt cold
    human = run_cli(*chat, "--message", "in words", "--model", "peer/tiny", home=home)
    assert human.returncode == 0 and "[eos; the server had" in human.stderr or "[length; the server had" in human.stderr
    outputs.extend((human.stdout, human.stderr))
    gen = cli("generate", "--prompt", "hi", "--greedy", "--max-new-tokens", "4", "--model", "peer/tiny", "--debug")
    assert gen["text"] and gen["provider"] == "remote"
    shown = cli("conversations", "show", "c")
    assert [m["role"] for m in shown["messages"]].count("assistant") == 5
    cli("bundle", "export", "c", "--out", str(home / "c.hearth"))
    cli("conversations", "ls")

    from engine.cli.main import main  # in-process, for the logs at DEBUG

    caplog.set_level(logging.DEBUG)
    assert main(["chat", "--conversation", "c", "--message", "logged", "--max-new-tokens", "4", "--model",
                 "peer/tiny", "--data-dir", str(home), "--json", "--debug"]) == 0
    captured = capsys.readouterr()
    texts = outputs + [captured.out, captured.err, caplog.text]
    assert all(KEY not in t for t in texts)
    leaks = [p for p in home.rglob("*") if p.is_file() and p.name != "secrets.json" and KEY.encode() in p.read_bytes()]
    assert leaks == []
    secrets = home / "secrets.json"
    assert KEY in secrets.read_text() and secrets.stat().st_mode & 0o777 == 0o600  # where it is kept, privately


def test_talk_runs_on_a_remote_model(tmp_path, tiny_dir, tiny_gguf, tiny_converted):
    server = LiveServer(peer_paths(tmp_path, tiny_dir, tiny_gguf, tiny_converted), TINY)
    try:
        front = tmp_path / "front"
        assert run_cli("remote", "add", "peer", server.base, home=front).returncode == 0
        proc = subprocess.run([sys.executable, "-m", "engine.cli", "talk", "--model", "peer/tiny", "--conversation",
                               "t", "--max-new-tokens", "4"], input="hello\n/quit\n", capture_output=True, text=True,
                              env={**os.environ, "HEARTH_HOME": str(front)}, timeout=120)
        assert proc.returncode == 0, proc.stderr
        assert "tiny" in proc.stdout and "on remote" in proc.stdout and "Traceback" not in proc.stderr
        store = ConversationStore(front / "conversations.sqlite3")
        assert [m.role for m in store.messages("t")] == ["user", "assistant"] and store.model_key("t") == "peer/tiny"
        store.close()
    finally:
        server.close()
