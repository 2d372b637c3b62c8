"""``hearth-cli chat`` and ``hearth-cli kv`` end to end in subprocesses: the JSON contracts, resuming
across processes, a disk that refuses checkpoint writes, and every bad-input path."""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from engine.conversations import ConversationStore

from .checkpoint_names import only_conv_path
from .test_cli import assert_clean_error, run_cli

CHAT_KEYS = {"conversation", "reply", "tokens", "stop_reason", "resume", "save", "context", "provider", "weights",
             "timings"}
RESUME_KEYS = {"source", "reason", "reused_tokens", "prefilled_tokens", "elapsed_ms"}


def chat(home: Path, *extra: str, model: Path | None = None, env: dict | None = None):
    args = ["chat", "--greedy", "--max-new-tokens", "12", "--json", "--provider", "cpu", *extra]
    if model is not None:
        args += ["--model", str(model)]
    return run_cli(*args, home=home, env=env)


@pytest.fixture
def home(tmp_path) -> Path:
    return tmp_path / "home"


def test_chat_resumes_across_processes_and_stores_the_text(home, tiny_gguf):
    first = chat(home, "--conversation", "c1", "--message", "hello there", "--system", "Be brief.", model=tiny_gguf)
    assert first.returncode == 0, first.stderr
    out = json.loads(first.stdout)
    assert CHAT_KEYS <= out.keys() and RESUME_KEYS <= out["resume"].keys()
    assert out["resume"]["source"] == "cold" and out["save"]["ok"]
    second = json.loads(chat(home, "--conversation", "c1", "--message", "and again", model=tiny_gguf).stdout)
    assert second["resume"]["source"] == "disk" and second["resume"]["reason"] is None
    assert second["resume"]["reused_tokens"] > 0
    assert second["resume"]["reused_tokens"] >= out["resume"]["prefilled_tokens"]  # at least the first prompt
    convs = ConversationStore(home / "conversations.sqlite3")
    assert [m["role"] for m in convs.chat_messages("c1")] == ["system", "user", "assistant", "user", "assistant"]
    assert convs.chat_messages("c1")[-1]["content"] == second["reply"]


def test_chat_reports_a_damaged_checkpoint_and_rebuilds(home, tiny_gguf):
    assert chat(home, "--conversation", "c", "--message", "one", model=tiny_gguf).returncode == 0
    path = only_conv_path(home / "checkpoints", "c")
    data = bytearray(path.read_bytes())
    data[len(data) // 3] ^= 0xFF
    path.write_bytes(bytes(data))
    out = json.loads(chat(home, "--conversation", "c", "--message", "two", model=tiny_gguf).stdout)
    assert out["resume"]["source"] == "rebuilt" and out["resume"]["reason"] == "checksum"
    assert out["save"]["ok"]
    verify = run_cli("kv", "verify", "--all", "--json", "--model", str(tiny_gguf), home=home)
    assert verify.returncode == 0 and json.loads(verify.stdout)["damaged"] == 0


def test_kv_ls_inspect_verify_gc(home, tiny_gguf):
    for conv in ("a", "b"):
        assert chat(home, "--conversation", conv, "--message", f"chat {conv}", "--system",
                    "A shared system prompt, long enough to be worth saving.", model=tiny_gguf).returncode == 0
    listing = json.loads(run_cli("kv", "ls", "--json", home=home).stdout)
    kinds = sorted(e["kind"] for e in listing["entries"])
    assert kinds == ["conversation", "conversation", "prefix"] and listing["budget"] == 2 << 30
    path = only_conv_path(home / "checkpoints", "a")
    info = json.loads(run_cli("kv", "inspect", str(path), "--json", home=home).stdout)
    assert info["problem"] is None and info["header"]["layers"] == 2 and len(info["records"]) == 2
    assert info["tokens"] == info["records"][-1]["end"]
    ok = run_cli("kv", "verify", "--all", "--json", "--model", str(tiny_gguf), home=home)
    assert ok.returncode == 0 and json.loads(ok.stdout)["checked"] == 3
    data = bytearray(path.read_bytes())
    data[-10] ^= 1
    path.write_bytes(bytes(data))
    bad = run_cli("kv", "verify", str(path), "--json", "--model", str(tiny_gguf), home=home)
    assert bad.returncode == 1
    (result,) = json.loads(bad.stdout)["files"]
    assert result["status"] == "damaged" and result["reason"] == "checksum"
    b_file = only_conv_path(home / "checkpoints", "b").name
    ConversationStore(home / "conversations.sqlite3").delete("b")
    gc = json.loads(run_cli("kv", "gc", "--budget-mb", "64", "--json", home=home).stdout)
    assert b_file in gc["orphans"] and gc["budget"] == 64 << 20
    assert json.loads(run_cli("kv", "ls", "--json", home=home).stdout)["budget"] == 64 << 20


def test_kv_encoding_is_remembered_and_inspect_shows_it(home, tiny_gguf):
    shown = json.loads(run_cli("kv", "encoding", "--json", home=home).stdout)
    assert shown["kv_encoding"] == "exact" and shown["choices"] == ["exact", "int8"]
    assert run_cli("kv", "encoding", "int8", home=home).returncode == 0
    assert "int8" in run_cli("kv", "encoding", home=home).stdout
    assert chat(home, "--conversation", "a", "--message", "hi", model=tiny_gguf).returncode == 0
    path = only_conv_path(home / "checkpoints", "a")
    info = json.loads(run_cli("kv", "inspect", str(path), "--json", home=home).stdout)
    h = info["header"]
    assert h["encoding"] == "int8" and h["layout"] == 2 and info["problem"] is None
    assert h["bytes_per_token"] == h["layers"] * 2 * h["kv_heads"] * (h["head_dim"] + 2) < h["exact_bytes_per_token"]
    assert "encoding int8" in run_cli("kv", "inspect", str(path), home=home).stdout
    ok = run_cli("kv", "verify", "--all", "--json", "--model", str(tiny_gguf), home=home)
    assert ok.returncode == 0 and json.loads(ok.stdout)["damaged"] == 0
    again = json.loads(chat(home, "--conversation", "a", "--message", "more", model=tiny_gguf).stdout)
    assert again["resume"]["source"] == "disk" and again["resume"]["reason"] is None


def test_kv_verify_marks_another_models_checkpoint_stale(home, tiny_gguf, tiny_dir):
    from engine.model.synthetic import SyntheticSpec, write_synthetic_gguf

    assert chat(home, "--conversation", "a", "--message", "hi", model=tiny_gguf).returncode == 0
    other = write_synthetic_gguf(tiny_dir / "stale-check.gguf", SyntheticSpec(seed=3))
    out = run_cli("kv", "verify", "--all", "--json", "--model", str(other), home=home)
    assert out.returncode == 0
    statuses = {f["status"] for f in json.loads(out.stdout)["files"]}
    assert statuses == {"stale"}


def test_kv_inspect_of_a_foreign_file_names_the_problem(home, tmp_path):
    junk = tmp_path / "junk.hkv"
    junk.write_bytes(b"PK\x03\x04 not a checkpoint")
    proc = run_cli("kv", "inspect", str(junk), "--json", home=home)
    assert proc.returncode == 1 and json.loads(proc.stdout)["problem"]["reason"] == "bad_magic"


@pytest.mark.parametrize("args,needle", [
    (["chat", "--conversation", "bad id", "--message", "x"], "invalid conversation id"),
    (["chat", "--conversation", "ok", "--message", "   "], "--message is empty"),
    (["chat", "--conversation", "ok", "--message", "x", "--max-new-tokens", "0"], "at least 1"),
    (["chat", "--conversation", "ok", "--message", "x", "--temperature", "-1"], "temperature"),
    (["kv", "inspect", "/nonexistent/file.hkv"], "no such file"),
    (["kv", "verify"], "--all"),
    (["kv", "gc", "--budget-mb", "0"], "--budget-mb must be positive"),
    (["kv", "encoding", "fp4"], "unknown KV encoding 'fp4'; choose one of: exact, int8"),
    (["conversations", "show", "nope"], "no conversation 'nope'"),
    (["chat", "--conversation", "ok", "--message", "x", "--wait", "-1"], "--wait"),
])
def test_bad_input_gets_one_clear_error(home, args, needle):
    assert_clean_error(run_cli(*args, home=home), needle)


def test_conversations_ls_and_show(home, tiny_gguf):
    """Both stored conversations listed, newest first, with their counts; one printed whole, in order."""
    assert chat(home, "--conversation", "older", "--message", "first question", model=tiny_gguf).returncode == 0
    assert chat(home, "--conversation", "newer", "--message", "second question", "--system", "Be brief.",
                model=tiny_gguf).returncode == 0
    listed = json.loads(run_cli("conversations", "ls", "--json", home=home).stdout)["conversations"]
    assert [c["id"] for c in listed] == ["newer", "older"]
    assert all(c["messages"] == 2 and c["tokens"] > 0 and c["model"].endswith("int4") for c in listed)
    assert listed[0]["title"] == "second question" and listed[0]["last_activity_ms"] >= listed[1]["last_activity_ms"]
    human = run_cli("conversations", "ls", home=home).stdout
    assert "newer" in human and "2 conversation(s)" in human
    shown = json.loads(run_cli("conversations", "show", "newer", "--json", home=home).stdout)
    assert shown["system_prompt"] == "Be brief." and shown["message_count"] == 2
    assert [(m["seq"], m["role"]) for m in shown["messages"]] == [(0, "user"), (1, "assistant")]
    reply = shown["messages"][1]  # which model wrote it and why it ended, as the JSON export says (issue 27 item 19)
    assert reply["model"] == listed[0]["model"] and reply["finish_reason"] in ("eos", "length")
    assert "model" not in shown["messages"][0]
    text = run_cli("conversations", "show", "newer", home=home).stdout
    assert text.index("[system]") < text.index("[user]\nsecond question") < text.index("[assistant · ")
    assert f"{reply['model']}]" in text  # the caption the window shows, on the reply's line


def stored_ids(home: Path) -> set[str]:
    db = home / "conversations.sqlite3"
    return ConversationStore(db).ids() if db.exists() else set()


def test_chat_without_a_model_says_how_to_get_one(home):
    proc = run_cli("chat", "--conversation", "c", "--message", "hi", home=home)
    assert_clean_error(proc, "model fetch")
    # Refused before anything was stored: the message is still on the command line, and a stored one no
    # reply follows would leave the chat ending in it (issue 27: the tester's "1 message, no reply").
    assert stored_ids(home) == set()


def test_chat_with_a_model_it_cannot_find_stores_nothing(home, tiny_gguf):
    assert chat(home, "--conversation", "kept", "--message", "one", model=tiny_gguf).returncode == 0
    proc = run_cli("chat", "--conversation", "t2", "--message", "hi", "--model", "nonexist", home=home)
    assert_clean_error(proc, "no model called 'nonexist'")
    proc = run_cli("chat", "--conversation", "kept", "--message", "two", "--model", "nonexist", home=home)
    assert_clean_error(proc, "no model called 'nonexist'")
    convs = ConversationStore(home / "conversations.sqlite3")
    assert convs.ids() == {"kept"} and [m.content for m in convs.messages("kept")][0] == "one"
    assert len(convs.messages("kept")) == 2


LONG_SYSTEM = "hello world " * 4500  # the tester's input: far past any context


def test_a_turn_too_long_stores_no_conversation_and_no_system_prompt(home, tiny_gguf):
    proc = chat(home, "--conversation", "ok1", "--message", "hi", "--system", LONG_SYSTEM, model=tiny_gguf)
    assert_clean_error(proc, "conversation ok1 with this message is ", "but the model reads at most 256: shorten "
                       "the message or the system prompt (--system), or start another --conversation; nothing was stored")
    assert "Start a new chat" not in proc.stderr  # the window's buttons, not the CLI's flags
    assert stored_ids(home) == set()  # no empty "(untitled)" conversation
    # Nothing of the refused turn stays to make the next one too long.
    assert chat(home, "--conversation", "ok1", "--message", "hi", model=tiny_gguf).returncode == 0
    before = ConversationStore(home / "conversations.sqlite3").chat_messages("ok1")
    proc = chat(home, "--conversation", "ok1", "--message", "again", "--system", LONG_SYSTEM, model=tiny_gguf)
    assert_clean_error(proc, "shorten the message or the system prompt (--system)")
    assert ConversationStore(home / "conversations.sqlite3").chat_messages("ok1") == before
    assert chat(home, "--conversation", "ok1", "--message", "again", model=tiny_gguf).returncode == 0


def test_a_first_turn_the_template_refuses_stores_nothing(home, tiny_gguf, tmp_path):
    from .gguf_edit import rewrite_gguf

    template = ("{% for m in messages %}{% if m['role'] == 'system' %}{{ raise_exception('no system role') }}"
                "{% endif %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    model = rewrite_gguf(tiny_gguf, tmp_path / "nosystem.gguf", values={"tokenizer.chat_template": template})
    proc = chat(home, "--conversation", "tpl", "--message", "hi", "--system", "Be brief.", model=model)
    assert_clean_error(proc, "no system role")
    assert stored_ids(home) == set()
    assert chat(home, "--conversation", "tpl", "--message", "hi", model=model).returncode == 0
    assert ConversationStore(home / "conversations.sqlite3").require("tpl").system_prompt == ""


@pytest.mark.real_model
def test_real_model_chat_remembers_and_resumes(real_model_home):
    home = real_model_home
    first = json.loads(chat(home, "--conversation", "geo", "--message", "What is the capital of France?").stdout)
    assert "Paris" in first["reply"] and first["resume"]["source"] == "cold"
    second = json.loads(chat(home, "--conversation", "geo", "--message", "And of Germany?").stdout)
    assert "Berlin" in second["reply"]
    assert second["resume"]["source"] == "disk"
    assert second["resume"]["reused_tokens"] >= first["context"]["tokens"] - 1
    assert second["save"]["new_tokens"] < second["save"]["tokens"]


def _limit_file_size(limit: int):
    def apply() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # fail the write with EFBIG instead of killing us
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return apply


@pytest.mark.real_model
def test_a_full_disk_fails_the_save_not_the_turn(real_model_home):
    home = real_model_home
    # Files may grow to 1 MiB: enough for SQLite, far too little for 30+ tokens × 46 KB of KV.
    proc = subprocess.run([sys.executable, "-m", "engine.cli", "chat", "--conversation", "full", "--message",
                           "What is the capital of France?", "--greedy", "--max-new-tokens", "12", "--json",
                           "--provider", "cpu"], capture_output=True, text=True, env={**os.environ, "HEARTH_HOME": str(home)},
                          preexec_fn=_limit_file_size(1 << 20), timeout=600)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert "Paris" in out["reply"]
    assert out["save"]["ok"] is False and "could not save" in out["save"]["error"]
    convs = ConversationStore(home / "conversations.sqlite3")
    assert [m["role"] for m in convs.chat_messages("full")] == ["user", "assistant"]
    assert not list((home / "checkpoints").glob(".*.tmp"))  # the failed write cleaned up after itself
    again = json.loads(chat(home, "--conversation", "full", "--message", "Thanks!").stdout)
    assert again["save"]["ok"] and again["resume"]["source"] in ("cold", "disk")


@pytest.fixture
def small_disk(tmp_path):
    """A 64 MiB filesystem of its own (tmpfs), so a full disk is really full for every process."""
    mount = tmp_path / "small"
    mount.mkdir()
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m,mode=0700", "tmpfs", str(mount)],
                          capture_output=True, text=True)
    if made.returncode != 0:
        pytest.skip(f"cannot mount a small filesystem here: {made.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def _fill(disk: Path, leave: int) -> None:
    """Take all of ``disk``'s free space but ``leave`` bytes."""
    free = os.statvfs(disk).f_bavail * os.statvfs(disk).f_frsize
    with open(disk / "filler", "wb") as fh:
        fh.truncate(0)
        chunk = b"\0" * (1 << 20)
        left = free - leave
        while left > 0:
            left -= fh.write(chunk[:left])
        fh.flush()
        os.fsync(fh.fileno())


@pytest.mark.real_model
def test_a_failed_save_on_a_full_disk_is_cut_back_and_the_next_turn_keeps_its_reply(real_home, small_disk):
    """Issue 27: with a nearly full disk a failed append left its torn tail (+348 KB, 'kv verify': damaged),
    which took the last free space, so the next chat on another conversation generated a reply but stored
    and printed none (exit 1, blaming a 'disk I/O error' and pointing at 'db restore', with the database sound
    and no backup). Now the failed append is cut back, and the turn's reply is stored and printed, with a
    warning saying what could not be written."""
    home = small_disk / "home"
    home.mkdir()
    for sub in ("models", "converted"):
        (real_home / sub).mkdir(parents=True, exist_ok=True)
        (home / sub).symlink_to(real_home / sub)
    assert chat(home, "--conversation", "a", "--message", "What is the capital of France?").returncode == 0
    assert chat(home, "--conversation", "b", "--message", "Name a colour.").returncode == 0
    first = only_conv_path(home / "checkpoints", "a")
    size = first.stat().st_size
    _fill(small_disk, 640 << 10)  # room for the text, far too little for a turn's KV (~46 KB a token)
    failed = chat(home, "--conversation", "a", "--message", "And of Germany?")
    assert failed.returncode == 0, failed.stderr
    out = json.loads(failed.stdout)
    assert out["save"]["ok"] is False and "no space left on device" in out["save"]["error"]
    assert "bytes free" in out["save"]["error"]
    assert first.stat().st_size == size  # the torn tail is gone, and with it the space it took
    verify = run_cli("kv", "verify", "--json", str(first), home=home)
    assert verify.returncode == 0 and json.loads(verify.stdout)["files"][0]["status"] == "valid", verify.stdout
    proc = run_cli("chat", "--conversation", "b", "--message", "And another one?", "--greedy", "--max-new-tokens",
                   "12", "--provider", "cpu", home=home)
    assert proc.returncode == 0, proc.stderr
    assert "warning: the reply is stored; could not save the conversation's context: no space left" in proc.stderr
    assert "db restore" not in proc.stderr and "Traceback" not in proc.stderr
    stored = ConversationStore(home / "conversations.sqlite3").chat_messages("b")
    assert [m["role"] for m in stored] == ["user", "assistant", "user", "assistant"]
    assert stored[-1]["content"].strip() and stored[-1]["content"].strip() in proc.stdout
    assert [m["role"] for m in ConversationStore(home / "conversations.sqlite3").chat_messages("a")] == [
        "user", "assistant", "user", "assistant"]


def test_a_full_disk_is_not_blamed_on_the_database(small_disk):
    """Issue 27: at 0–8 KB free the error said 'disk I/O error' and pointed at 'db restore', though the
    database was sound and there was no backup. Now it says the disk is full, and nothing else."""
    home = small_disk / "home"
    store = ConversationStore(home / "conversations.sqlite3")
    store.create("c", title="kept")
    store.append("c", "user", "an earlier message")
    store.close()
    for leave in (0, 4096, 8192):
        _fill(small_disk, leave)
        listed = run_cli("conversations", "ls", home=home)
        if listed.returncode == 0:  # reading needs no space here: the write below must fail plainly
            assert "kept" in listed.stdout
        else:
            assert_clean_error(listed, "full")
            assert "db restore" not in listed.stderr
        proc = run_cli("chat", "--conversation", "c", "--message", "hello", "--max-new-tokens", "2", home=home)
        assert_clean_error(proc, "full")
        assert "db restore" not in proc.stderr and "I/O error" not in proc.stderr, proc.stderr
        (small_disk / "filler").unlink()
    assert [m.content for m in ConversationStore(home / "conversations.sqlite3").messages("c")][0] == "an earlier message"


# chat --attach: files read before anything is stored -------------------------------------------------------------
def test_chat_attach_sends_the_files_and_stores_them(home, tiny_gguf, tmp_path):
    from engine.documents import compose_message, read_attachment

    from .document_files import write_docx, write_text_pdf

    notes = tmp_path / "notes.md"
    notes.write_text("# Owls\nThey fly at night.\n")
    pdf = write_text_pdf(tmp_path / "paper.pdf", [["Barn owls nest in barns."]])
    docx = write_docx(tmp_path / "memo.docx", ["A memo about owls."])
    proc = chat(home, "--conversation", "att", "--message", "what do they say?", "--attach", str(notes),
                "--attach", str(pdf), "--attach", str(docx), model=tiny_gguf)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert [(a["name"], a["kind"]) for a in out["attachments"]] == [("notes.md", "markdown"), ("paper.pdf", "pdf"),
                                                                    ("memo.docx", "docx")]
    user = ConversationStore(home / "conversations.sqlite3").messages("att")[0]
    files = [read_attachment(p) for p in (notes, pdf, docx)]
    assert user.attachments == tuple(files) and user.typed_text == "what do they say?"
    assert user.content == compose_message("what do they say?", files)
    shown = json.loads(run_cli("conversations", "show", "att", "--json", home=home).stdout)["messages"][0]
    assert [a["name"] for a in shown["attachments"]] == ["notes.md", "paper.pdf", "memo.docx"]
    alone = chat(home, "--conversation", "att2", "--message", "", "--attach", str(notes), model=tiny_gguf)
    assert alone.returncode == 0, alone.stderr  # a message of files alone


@pytest.mark.parametrize("name,data,needle", [
    ("missing.txt", None, "could not be read"),
    ("blob.txt", b"\x00\x01\x02" * 100, "binary data"),
    ("l1.txt", "déjà".encode("latin-1"), "not valid UTF-8"),
    ("e.txt", b"", "the file is empty"),
    ("p.png", b"\x89PNG", "does not read .png files"),
])
def test_chat_attach_of_a_bad_file_says_why_and_stores_nothing(home, tiny_gguf, tmp_path, name, data, needle):
    path = tmp_path / name
    if data is not None:
        path.write_bytes(data)
    proc = chat(home, "--conversation", "bad", "--message", "read this", "--attach", str(path), model=tiny_gguf)
    assert_clean_error(proc, name, needle)
    assert "bad" not in stored_ids(home)


def test_chat_attach_of_an_encrypted_or_scanned_pdf_is_refused(home, tiny_gguf, tmp_path):
    from .document_files import write_blank_pdf, write_encrypted_pdf

    for path, needle in ((write_encrypted_pdf(tmp_path / "locked.pdf", ["x"]), "password"),
                         (write_blank_pdf(tmp_path / "scan.pdf"), "no text to extract")):
        proc = chat(home, "--conversation", "pdf", "--message", "read", "--attach", str(path), model=tiny_gguf)
        assert_clean_error(proc, path.name, needle)
    assert "pdf" not in stored_ids(home)


def test_chat_attach_of_too_many_files_is_refused(home, tiny_gguf, tmp_path):
    from engine.documents import MAX_ATTACHMENTS

    files = []
    for i in range(MAX_ATTACHMENTS + 1):
        (tmp_path / f"f{i}.txt").write_text(f"file {i}")
        files += ["--attach", str(tmp_path / f"f{i}.txt")]
    proc = chat(home, "--conversation", "many", "--message", "all of them", *files, model=tiny_gguf)
    assert_clean_error(proc, f"at most {MAX_ATTACHMENTS} files")
    assert "many" not in stored_ids(home)
