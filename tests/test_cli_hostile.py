"""Issue 27, the CLI's part: hostile stored text, special files and damaged side files, end to end in
subprocesses of the real ``hearth-cli``."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from engine.conversations import ConversationStore
from engine.text.terminal_safe import terminal_safe

from .checkpoint_names import chain_block_paths
from .test_cli import assert_clean_error, run_cli

PLANTED = "\x1b]0;pwned\x07\x1b[31m"  # retitles the terminal window, then turns its text red


@pytest.fixture
def home(tmp_path) -> Path:
    return tmp_path / "home"


def plant(home: Path, cid: str = "planted") -> None:
    """A conversation as a cross-site POST to the server leaves it: escapes in its title, system
    prompt, messages and model."""
    home.mkdir(parents=True, exist_ok=True)
    store = ConversationStore(home / "conversations.sqlite3")
    try:
        store.create(cid, title=f"hi{PLANTED}", system_prompt=f"sys{PLANTED}\u202e")
        store.append(cid, "user", f"hello{PLANTED}\x9b2J")
        store.append(cid, "assistant", f"reply{PLANTED}\x7f")
        store.set_model(cid, f"model{PLANTED}", f"key{PLANTED}")
    finally:
        store.close()


def test_terminal_safe_escapes_controls_but_newline_and_tab():
    assert terminal_safe(PLANTED) == "\\x1b]0;pwned\\x07\\x1b[31m"
    assert terminal_safe("a\tb\nc\r\x00\x7f\x9b\u202e\u2066\u2069é🙂") == "a\tb\nc\\x0d\\x00\\x7f\\x9b\\u202e\\u2066\\u2069é🙂"


@pytest.mark.parametrize("args", [("conversations", "ls"), ("conversations", "show", "planted")])
def test_issue27_stored_escapes_are_shown_escaped(home, args):
    plant(home)
    proc = run_cli(*args, home=home)
    assert proc.returncode == 0, proc.stderr
    assert "\x1b" not in proc.stdout and "\x07" not in proc.stdout and "\x9b" not in proc.stdout
    assert "\\x1b]0;pwned\\x07\\x1b[31m" in proc.stdout  # visible, not dropped
    if args[1] == "show":
        assert "\\x9b2J" in proc.stdout and "\\u202e" in proc.stdout and "\\x7f" in proc.stdout


def test_issue27_json_output_keeps_stored_text_exact(home):
    plant(home)
    shown = json.loads(run_cli("conversations", "show", "planted", "--json", home=home).stdout)
    assert shown["title"] == f"hi{PLANTED}" and shown["system_prompt"] == f"sys{PLANTED}\u202e"
    assert [m["content"] for m in shown["messages"]] == [f"hello{PLANTED}\x9b2J", f"reply{PLANTED}\x7f"]
    listed = json.loads(run_cli("conversations", "ls", "--json", home=home).stdout)["conversations"]
    assert listed[0]["title"] == f"hi{PLANTED}"


def test_issue27_talk_and_chat_escape_what_they_repeat_from_the_store(home, tiny_gguf):
    """The model a planted chat was 'last used with' is repeated in talk's and chat's notes."""
    plant(home)
    import subprocess
    import sys

    talk = subprocess.run([sys.executable, "-m", "engine.cli", "talk", "--conversation", "planted", "--model",
                           str(tiny_gguf), "--data-dir", str(home), "--max-new-tokens", "4"],
                          input="hello\n/quit\n", capture_output=True, text=True, timeout=300)
    assert talk.returncode == 0, talk.stderr
    assert "\\x1b]0;pwned" in talk.stderr
    assert "\x1b" not in talk.stdout + talk.stderr
    plant(home, "planted-too")  # talk's turn made the tiny model the remembered one
    chat = run_cli("chat", "--conversation", "planted-too", "--message", "hi", "--greedy", "--max-new-tokens", "4",
                   "--model", str(tiny_gguf), "--provider", "cpu", home=home)
    assert chat.returncode == 0, chat.stderr
    assert "\\x1b]0;pwned" in chat.stderr
    assert "\x1b" not in chat.stdout + chat.stderr


def test_issue27_an_error_quoting_hostile_text_is_escaped(home):
    proc = run_cli("kv", "inspect", f"no{PLANTED}such", home=home)
    assert_clean_error(proc, "\\x1b]0;pwned")
    assert "\x1b" not in proc.stderr


def hostile_model(tiny_gguf: Path, where: Path) -> Path:
    """The tiny model under a file name with escapes, its chat template refused: loading it logs a
    warning that names the file."""
    from tests.gguf_edit import rewrite_gguf

    where.mkdir(parents=True, exist_ok=True)
    return rewrite_gguf(tiny_gguf, where / f"evil{PLANTED}.gguf", values={"tokenizer.chat_template": "{{ 'a' * 300000000 }}"})


def test_issue27_log_lines_quoting_a_file_name_are_escaped(home, tiny_gguf, tmp_path):
    model = hostile_model(tiny_gguf, tmp_path / "models")
    proc = run_cli("model", "info", "--model", str(model), "--json", home=home)
    assert proc.returncode == 0, proc.stderr
    warning = next(line for line in proc.stderr.splitlines() if "its chat template was refused" in line)
    assert warning.startswith("WARNING ") and "evil\\x1b]0;pwned\\x07\\x1b[31m.gguf" in warning
    assert "\x1b" not in proc.stderr and "\x07" not in proc.stderr
    assert json.loads(proc.stdout)["path"] == str(model)  # --json keeps the name exact


def test_issue27_serve_log_lines_are_escaped(home, tiny_gguf, tmp_path):
    import signal
    import subprocess
    import sys

    import httpx

    model = hostile_model(tiny_gguf, tmp_path / "models")
    unknown = run_cli("serve", "--data-dir", str(home), "--model", str(model), "--port", "0")  # not in the library
    assert_clean_error(unknown, "evil\\x1b]0;pwned")  # the error line quoted --model raw
    assert "\x1b" not in unknown.stderr
    added = run_cli("model", "add", str(model), "--json", "--data-dir", str(home))
    assert added.returncode == 0, added.stderr
    name = json.loads(added.stdout)["name"]
    proc = subprocess.Popen([sys.executable, "-m", "engine.cli", "serve", "--data-dir", str(home), "--model", name,
                             "--port", "0", "--provider", "cpu"], stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stderr.readline()
        assert "serving http://" in line, line + (proc.stderr.read() if proc.poll() is not None else "")
        base = line.split("serving ", 1)[1].strip()
        reply = httpx.post(base + "/chat/completions", timeout=120, json={  # the first request loads the model
            "model": name, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
        assert reply.status_code == 200, reply.text
        proc.send_signal(signal.SIGTERM)
        err = line + proc.communicate(timeout=120)[1]
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert "evil\\x1b]0;pwned\\x07" in err and "its chat template was refused" in err
    assert "\x1b" not in err and "\x07" not in err


# item 17: the names kv ls prints -----------------------------------------------------------------------
def chat_json(home: Path, model: Path, cid: str, message: str) -> dict:
    proc = run_cli("chat", "--conversation", cid, "--message", message, "--greedy", "--max-new-tokens", "4", "--json",
                   "--provider", "cpu", "--model", str(model), home=home)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_issue27_kv_verify_and_inspect_take_the_names_kv_ls_prints(home, tiny_gguf):
    chat_json(home, tiny_gguf, "c", "hello there")
    listing = run_cli("kv", "ls", home=home)
    assert listing.returncode == 0, listing.stderr
    name = listing.stdout.splitlines()[0].split()[0]  # the first column, as a user copies it
    verify = run_cli("kv", "verify", name, "--model", str(tiny_gguf), home=home)
    assert verify.returncode == 0, verify.stdout + verify.stderr
    assert verify.stdout.startswith("valid") and "1 checked, 0 damaged" in verify.stdout
    inspect = json.loads(run_cli("kv", "inspect", name, "--json", home=home).stdout)
    assert inspect["problem"] is None and inspect["path"] == str(home / "checkpoints" / name)


@pytest.mark.parametrize("command", ["verify", "inspect"])
def test_issue27_kv_of_an_unknown_name_is_one_clear_error(home, command):
    assert_clean_error(run_cli("kv", command, "conv-nope.hkv", home=home), "no such file or stored checkpoint",
                       "conv-nope.hkv", "kv ls")


# item 18: what a turn's save wrote ---------------------------------------------------------------------
def chain_bytes(store: Path, chain: Path) -> int:
    """What a record of the block store reads: its blocks, each once."""
    return sum(p.stat().st_size for p in set(chain_block_paths(store, chain)))


def test_issue27_a_long_turn_reports_every_byte_its_saves_wrote(home, tiny_dir):
    """A prompt past SAVE_ALIGN is saved during the prefill too; the turn's bytes_written counted only
    its last append (9.4 MB of a 104 MB file in the issue)."""
    from engine.model.synthetic import SyntheticSpec, write_synthetic_gguf
    from engine.session.reports import SAVE_ALIGN

    model = write_synthetic_gguf(tiny_dir / "long-context.gguf", SyntheticSpec(context_length=4 * SAVE_ALIGN))
    out = chat_json(home, model, "long", "hello world " * (SAVE_ALIGN // 3))
    save = out["save"]
    path = home / "checkpoints" / json.loads(run_cli("kv", "ls", "--json", home=home).stdout)["entries"][0]["name"]
    assert out["context"]["tokens"] > SAVE_ALIGN and save["ok"]
    store = home / "checkpoints"
    usage = json.loads(run_cli("kv", "usage", "--json", home=home).stdout)
    # a new store: the turn wrote every block (its own and the shared prefix's), each once
    assert save["bytes_written"] + save["prefix_bytes_written"] == usage["unique_bytes"] == usage["written_bytes"]
    assert save["file_bytes"] == chain_bytes(store, path)  # what a restore of it reads
    assert save["new_tokens"] == save["tokens"] == out["context"]["tokens"]
    second = chat_json(home, model, "long", "and again")["save"]  # a short turn appends (past a cut frontier)
    assert second["file_bytes"] == chain_bytes(store, path) > save["file_bytes"]
    assert 0 < second["bytes_written"] < save["bytes_written"] // 10


def test_issue27_a_turn_reports_the_shared_prefix_file_it_wrote(home, tiny_gguf):
    """A first turn with a system prompt also writes the shared-prefix file; bytes_written left it out."""
    system = "You are a careful assistant who answers in one short sentence. " * 3

    def turn(cid: str) -> dict:
        proc = run_cli("chat", "--conversation", cid, "--system", system, "--message", "hi", "--greedy",
                       "--max-new-tokens", "4", "--json", "--provider", "cpu", "--model", str(tiny_gguf), home=home)
        assert proc.returncode == 0, proc.stderr
        return json.loads(proc.stdout)["save"]

    first = turn("one")
    entries = json.loads(run_cli("kv", "ls", "--json", home=home).stdout)["entries"]
    prefixes = [home / "checkpoints" / e["name"] for e in entries if e["kind"] == "prefix"]
    assert len(prefixes) == 1 and first["ok"]
    store = home / "checkpoints"
    assert first["prefix_bytes_written"] == chain_bytes(store, prefixes[0]) > 0
    usage = json.loads(run_cli("kv", "usage", "--json", home=home).stdout)
    assert first["bytes_written"] + first["prefix_bytes_written"] == usage["unique_bytes"]  # every block once
    assert turn("two")["prefix_bytes_written"] == 0  # the second chat starts from that file and writes none


# item 12: FIFOs and other special files --------------------------------------------------------------
@pytest.mark.parametrize("kind", ["fifo", "directory", "device"])
def test_issue27_conversations_import_refuses_what_is_not_a_regular_file(home, tmp_path, kind):
    path = {"fifo": tmp_path / "export.json", "directory": tmp_path, "device": Path("/dev/zero")}[kind]
    if kind == "fifo":
        os.mkfifo(path)
    proc = run_cli("conversations", "import", str(path), home=home, timeout=60)  # hung forever before
    assert_clean_error(proc, "not a regular file")


def test_issue27_generate_messages_from_a_fifo_is_refused(home, tmp_path, tiny_gguf):
    fifo = tmp_path / "messages.json"
    os.mkfifo(fifo)
    proc = run_cli("generate", "--messages", str(fifo), "--model", str(tiny_gguf), home=home, timeout=60)
    # One plain line naming the file and what it is, not Python's "[Errno 22] …: 'path'"
    assert_clean_error(proc, f"cannot read messages file {fifo}: it is a FIFO (named pipe), not a regular file")
    assert "Errno" not in proc.stderr and f"'{fifo}'" not in proc.stderr


def test_issue27_a_fifo_for_the_model_file_is_named_as_such(home, tmp_path):
    fifo = tmp_path / "models" / "fifo.gguf"
    fifo.parent.mkdir()
    os.mkfifo(fifo)
    proc = run_cli("generate", "--model", str(fifo), "--prompt", "hi", home=home, timeout=60)
    assert_clean_error(proc, f"model file {fifo} is not a regular file: it is a FIFO (named pipe)")
    assert "not found" not in proc.stderr  # it is there: "not found" sent the tester looking for a typo


def test_issue27_kv_inspect_of_a_fifo_exits_non_zero_as_verify_does(home, tmp_path):
    fifo = tmp_path / "fifo.hkv"
    os.mkfifo(fifo)
    proc = run_cli("kv", "inspect", str(fifo), home=home, timeout=60)
    assert proc.returncode == 1 and "problem: io_error" in proc.stdout and "Traceback" not in proc.stderr
    proc = run_cli("kv", "inspect", str(fifo), "--json", home=home, timeout=60)
    assert proc.returncode == 1 and json.loads(proc.stdout)["problem"]["reason"] == "io_error"
    assert run_cli("kv", "verify", str(fifo), home=home, timeout=60).returncode == 1


def test_issue27_a_dangling_models_link_is_named_as_such(home, tmp_path):
    home.mkdir()
    (home / "models").symlink_to(tmp_path / "gone")
    proc = run_cli("model", "ls", home=home)
    assert_clean_error(proc, f"{home / 'models'} is a link to {tmp_path / 'gone'}, which does not exist")
    assert "File exists" not in proc.stderr


def test_issue27_a_fifo_for_a_checkpoint_file_is_rebuilt_not_waited_on(home, tiny_gguf):
    chat_json(home, tiny_gguf, "c", "hello there")
    (entry,) = [e for e in json.loads(run_cli("kv", "ls", "--json", home=home).stdout)["entries"]
                if e["conversation"] == "c"]
    path = Path(entry["path"])
    path.unlink()
    os.mkfifo(path)
    proc = run_cli("chat", "--conversation", "c", "--message", "again", "--greedy", "--max-new-tokens", "4", "--json",
                   "--provider", "cpu", "--model", str(tiny_gguf), home=home, timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["resume"]["source"] == "rebuilt" and out["resume"]["reason"] == "io_error"
    assert "FIFO" in out["resume"]["message"] and out["save"]["ok"]
    assert path.is_file()  # the save put a real checkpoint in its place
    verify = run_cli("kv", "verify", str(path), "--model", str(tiny_gguf), home=home, timeout=60)
    assert verify.returncode == 0, verify.stdout


# item 13: damaged side files --------------------------------------------------------------------------
def test_issue27_a_garbage_checkpoint_index_is_rebuilt(home, tiny_gguf):
    first = chat_json(home, tiny_gguf, "c", "hello there")
    index = home / "checkpoints" / "index.sqlite3"
    index.write_bytes(b"\x00garbage, not SQLite\xff" * 500)  # blamed a full disk and failed the turn
    proc = run_cli("chat", "--conversation", "c", "--message", "again", "--greedy", "--max-new-tokens", "4", "--json",
                   "--provider", "cpu", "--model", str(tiny_gguf), home=home)
    assert proc.returncode == 0, proc.stderr
    assert "is damaged" in proc.stderr and "rebuilding it" in proc.stderr and "full" not in proc.stderr
    out = json.loads(proc.stdout)
    assert out["save"]["ok"] and out["resume"]["source"] == "disk"  # the file was found again by its name
    assert out["resume"]["reused_tokens"] >= first["context"]["tokens"] - 1
    assert (home / "checkpoints" / "index.sqlite3.damaged").read_bytes().startswith(b"\x00garbage")
    listed = json.loads(run_cli("kv", "ls", "--json", home=home).stdout)["entries"]
    assert [e["conversation"] for e in listed if e["kind"] == "conversation"] == ["c"]


def test_issue27_an_index_that_cannot_be_opened_is_one_clear_error_not_a_full_disk(home):
    (home / "checkpoints" / "index.sqlite3").mkdir(parents=True)
    proc = run_cli("kv", "ls", home=home)
    assert_clean_error(proc, "index.sqlite3", "cannot be used")
    assert "full" not in proc.stderr


def test_issue27_a_deeply_nested_models_json_reads_as_empty(home, tiny_gguf):
    (home / "checkpoints").mkdir(parents=True)
    registry = home / "checkpoints" / "models.json"
    registry.write_text("[" * 100_000)  # RecursionError before
    proc = run_cli("kv", "ls", home=home)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr and "too deeply" in proc.stderr
    chat_json(home, tiny_gguf, "c", "hello there")  # the next session writes it afresh
    assert [m["label"] for m in json.loads(registry.read_text()).values()]


@pytest.mark.parametrize("kind", ["directory", "fifo"])
def test_issue27_a_lock_file_of_the_wrong_type_is_one_clear_error(home, kind):
    lock = home / "checkpoints" / "store.lock"
    lock.parent.mkdir(parents=True)
    lock.mkdir() if kind == "directory" else os.mkfifo(lock)
    assert_clean_error(run_cli("kv", "ls", home=home, timeout=60), str(lock))


def test_issue27_a_file_where_the_turn_locks_folder_goes_is_one_clear_error(home, tiny_gguf):
    home.mkdir()
    (home / "locks").write_text("not a folder")
    proc = run_cli("chat", "--conversation", "c", "--message", "hi", "--model", str(tiny_gguf), home=home)
    assert_clean_error(proc, str(home / "locks"), "is not a folder")


def test_issue27_a_file_where_the_models_folder_goes_is_one_clear_error(home):
    home.mkdir()
    (home / "models").write_text("not a folder")
    assert_clean_error(run_cli("model", "ls", home=home), str(home / "models"), "is not a folder")


def test_issue27_a_models_folder_turned_into_a_file_is_named_as_such(home, tmp_path):
    folder = tmp_path / "my-models"
    folder.mkdir()
    assert run_cli("model", "folder", str(folder), home=home).returncode == 0
    folder.rmdir()
    folder.write_text("now a file")
    proc = run_cli("model", "ls", "--json", home=home)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["folder_problem"] == f"the models folder {folder} is a file, not a folder"


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads a folder whatever its mode: the type cases above cover it")
def test_issue27_an_unreadable_models_folder_is_named_as_such(home, tmp_path):
    folder = tmp_path / "my-models"
    folder.mkdir()
    assert run_cli("model", "folder", str(folder), home=home).returncode == 0
    folder.chmod(0)
    try:
        proc = run_cli("model", "ls", "--json", home=home)
    finally:
        folder.chmod(0o700)
    assert proc.returncode == 0, proc.stderr
    assert "cannot be read" in json.loads(proc.stdout)["folder_problem"]


def test_issue27_bundle_import_refuses_a_fifo(home, tmp_path):
    fifo = tmp_path / "chats.hearth"
    os.mkfifo(fifo)
    assert_clean_error(run_cli("bundle", "import", str(fifo), home=home, timeout=60), "FIFO", "not a regular file")
