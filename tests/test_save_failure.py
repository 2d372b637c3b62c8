"""A save that fails part-way (a full disk, the file size limit) leaves the conversation's checkpoint as
it was: the partial record is cut back off at once, so the file stays valid and the space is free again."""

from __future__ import annotations

import json
import resource
import shutil
import signal
import sqlite3
from pathlib import Path

import pytest

from engine.checkpoint.identity import engine_identity
from engine.checkpoint.status import VALID, checkpoint_status
from engine.checkpoint.store import CheckpointStore
from engine.generation import Engine
from engine.session import ChatSessions
from tests.checkpoint_names import conv_path
from tests.dialogues import TURN1, TURN2
from tests.test_cli import assert_clean_error, run_cli


def test_a_failed_append_is_cut_back_and_the_file_stays_valid(tiny_converted, tmp_path):
    """Issue 27: the failed append left its torn tail (the file grew, 'kv verify' said damaged, and the tail
    held the last free space of the disk)."""
    engine = Engine.load(tiny_converted("int4"), "cpu")
    sessions = ChatSessions(engine, CheckpointStore(tmp_path), adaptive=False)
    sessions.sync("c", TURN1)
    assert sessions.save("turn").ok
    path = conv_path(tmp_path, engine, "c")
    size = path.stat().st_size
    sessions.sync("c", TURN2)
    limit = resource.getrlimit(resource.RLIMIT_FSIZE)
    handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG
    try:
        resource.setrlimit(resource.RLIMIT_FSIZE, (size + 512, limit[1]))  # the new record's header, no more
        report = sessions.save("turn")
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, limit)
        signal.signal(signal.SIGXFSZ, handler)
    assert not report.ok and "could not save" in report.error and "the file size limit was reached" in report.error
    assert path.stat().st_size == size  # before the fix: size + 512, a torn tail
    status, problem, tokens = checkpoint_status(path, engine_identity(engine), engine.tokenizer.vocab_size, full=True)
    assert status == VALID and problem is None and tokens > 0
    assert sessions.save("turn").ok  # with room again the next save appends as usual


def test_a_reply_that_cannot_be_stored_says_so(hearth):
    """When the disk fills between the message and its reply, the error names the reply, not only
    'the conversation could not be saved'."""
    from engine.errors import DiskFullError
    from engine.types import Token, TurnRequest
    from tests.dialogues import GREEDY

    hearth.conversations.create("c")
    hearth.run_turn(TurnRequest("c", "hello", GREEDY, 4))
    limit = resource.getrlimit(resource.RLIMIT_FSIZE)
    handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    db = hearth.paths.conversations_db

    def on_event(event) -> None:  # the message is stored: from now on no file of this process may grow
        if isinstance(event, Token) and resource.getrlimit(resource.RLIMIT_FSIZE) == limit:
            wal = db.with_name(db.name + "-wal")
            resource.setrlimit(resource.RLIMIT_FSIZE, (wal.stat().st_size, limit[1]))

    try:
        with pytest.raises(DiskFullError, match="the reply was written but could not be stored: the disk .* full"):
            hearth.run_turn(TurnRequest("c", "and again with a longer message", GREEDY, 4), on_event)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, limit)
        signal.signal(signal.SIGXFSZ, handler)
    assert [m.role for m in hearth.conversations.messages("c")] == ["user", "assistant", "user"]  # the message stays


def test_chat_json_carries_a_reply_that_cannot_be_stored(tmp_path, tiny_gguf):
    """Issue 27: when the reply's database write failed, ``chat --json`` printed nothing on stdout and the
    reply the model wrote was gone; now stdout carries it with "stored": false, and the exit is non-zero."""
    home = tmp_path / "home"

    def chat(message: str, where: Path = home):
        return run_cli("chat", "--conversation", "c", "--message", message, "--greedy", "--max-new-tokens", "6",
                       "--json", "--provider", "cpu", "--model", str(tiny_gguf), home=where)

    first = chat("hello")
    assert first.returncode == 0, first.stderr
    assert json.loads(first.stdout)["stored"] is True
    shutil.copytree(home, tmp_path / "twin")
    expected = json.loads(chat("and again", tmp_path / "twin").stdout)["reply"]  # greedy: what the turn will write
    db = sqlite3.connect(home / "conversations.sqlite3")  # a database that takes messages but refuses replies
    db.execute("CREATE TRIGGER refuse_replies BEFORE INSERT ON messages WHEN NEW.role = 'assistant' "
               "BEGIN SELECT RAISE(ABORT, 'replies refused'); END")
    db.commit()
    db.close()
    proc = chat("and again")
    assert_clean_error(proc, "the reply was written but could not be stored", "replies refused")
    out = json.loads(proc.stdout)
    assert out == {"conversation": "c", "reply": out["reply"], "stored": False, "error": out["error"]}
    assert out["reply"] == expected != ""
    assert "the reply was written but could not be stored" in out["error"]
    shown = json.loads(run_cli("conversations", "show", "c", "--json", home=home).stdout)
    assert [m["role"] for m in shown["messages"]] == ["user", "assistant", "user"]  # the message stays
