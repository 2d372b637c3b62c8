"""The checkpoint store: its index, start-up housekeeping, budget and eviction, garbage collection,
and the inter-process lock; plus saving when the disk refuses writes."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from engine.checkpoint.lock import StoreBusyError
from engine.checkpoint.store import CheckpointStore, conversation_file
from engine.generation import Engine
from engine.sampling import SamplingParams
from engine.session import DISK, LIVE, ChatSessions
from tests.tier_helpers import TIER_KINDS, Tiers

GREEDY = SamplingParams.greedy_params()


def fp_of(sessions: ChatSessions) -> bytes:
    return sessions.identity.model_fp


def file_of(sessions: ChatSessions, conversation: str) -> str:
    """The conversation's checkpoint name under the sessions' model."""
    return conversation_file(conversation, fp_of(sessions))


def chat(text: str) -> list[dict]:
    return [{"role": "system", "content": "Be brief."}, {"role": "user", "content": text}]


@pytest.fixture
def sessions(tiny_converted, tmp_path) -> ChatSessions:
    return ChatSessions(Engine.load(tiny_converted("int4"), "cpu"), CheckpointStore(tmp_path / "ck"), adaptive=False)


def test_index_survives_restarts_and_heals(sessions, tmp_path):
    sessions.generate("a", chat("one"), GREEDY, 4)
    sessions.generate("b", chat("two"), GREEDY, 4)
    root = tmp_path / "ck"
    names = {e.name for e in CheckpointStore(root).entries(kind="conversation")}
    assert names == {file_of(sessions, "a"), file_of(sessions, "b")}
    (root / file_of(sessions, "a")).unlink()  # a file vanished behind the index's back
    (root / "index.sqlite3").unlink()  # and the index itself is lost
    for extra in ("index.sqlite3-wal", "index.sqlite3-shm"):
        (root / extra).unlink(missing_ok=True)
    store = CheckpointStore(root)
    assert [e.name for e in store.entries(kind="conversation")] == [file_of(sessions, "b")]
    assert store.conversation_entry("b", fp_of(sessions)).conversation == "b"  # the owner is found again by name


def test_stale_temp_files_are_removed_at_start(tmp_path):
    root = tmp_path / "ck"
    root.mkdir()
    (root / ".conv-x.hkv.abc123.tmp").write_bytes(b"half a write")
    (root / ".throughput.json.zz.tmp").write_bytes(b"{")
    CheckpointStore(root)
    assert not list(root.glob(".*.tmp"))


@pytest.fixture(params=TIER_KINDS)
def tiers(request) -> Tiers:
    """The kind of storage tier an eviction test runs on (the file store, the in-memory one)."""
    return Tiers(request.param)


def test_budget_evicts_the_lowest_scores_and_protects_newest_and_pinned(tiny_converted, tmp_path, tiers):
    sessions = ChatSessions(Engine.load(tiny_converted("int4"), "cpu"), tiers.open(tmp_path / "ck"), adaptive=False)
    for i, name in enumerate(["old", "pinned", "busy", "new"]):
        sessions.generate(name, chat(f"conversation {name} " * (i + 1)), GREEDY, 4)
    store = sessions.store
    store.set_pinned(file_of(sessions, "pinned"), True)
    for _ in range(5):
        store.touch(file_of(sessions, "busy"))
    # Age "old" and "pinned" so they score low; "new" is the most recent by a clear margin (touches
    # share a millisecond).
    for name, shift in (("old", -30 * 86400000), ("pinned", -30 * 86400000), ("new", 60000)):
        e = store.entry(file_of(sessions, name))
        e.last_used_ms += shift
        store.put(e)
    keep = {e.name: e.bytes for e in store.entries()}
    store.budget_bytes = sum(keep.values()) - keep[file_of(sessions, "old")] // 2
    evicted = store.enforce_budget()
    assert evicted == [file_of(sessions, "old")]
    assert not tiers.has(tmp_path / "ck", file_of(sessions, "old"))  # the bytes went with the entry
    store.budget_bytes = 1  # nothing but protected entries can go
    store.enforce_budget(protect={"busy"})
    left = {e.name for e in store.entries()}
    assert {file_of(sessions, "pinned"), file_of(sessions, "new"), file_of(sessions, "busy")} <= left
    assert store.usage().bytes == sum(e.bytes for e in store.entries()) > store.budget_bytes


def test_a_save_over_the_budget_evicts_others_never_the_conversation_saved(tiny_converted, tmp_path, tiers):
    sessions = ChatSessions(Engine.load(tiny_converted("int4"), "cpu"), tiers.open(tmp_path / "ck"), adaptive=False)
    sessions.generate("first", chat("the first conversation"), GREEDY, 4)
    sessions.store.budget_bytes = sessions.store.usage().bytes + 1  # room for what is there, not for more
    turn = sessions.generate("second", chat("the second conversation, a longer one"), GREEDY, 4)
    assert turn.save.ok
    names = {e.name for e in sessions.store.entries()}
    assert file_of(sessions, "second") in names and file_of(sessions, "first") not in names
    _, report = sessions.prepare("second", chat("the second conversation, a longer one"))
    assert report.source == LIVE


def test_budget_is_remembered(tmp_path):
    CheckpointStore(tmp_path).set_budget(123 << 20)
    assert CheckpointStore(tmp_path).budget_bytes == 123 << 20
    with pytest.raises(ValueError):
        CheckpointStore(tmp_path).set_budget(0)


def test_gc_removes_orphans_and_checkpoints_of_deleted_conversations(sessions, tmp_path):
    sessions.generate("kept", chat("stay"), GREEDY, 4)
    sessions.generate("deleted", chat("go"), GREEDY, 4)
    root = tmp_path / "ck"
    (root / "stray.hkv").write_bytes(b"not ours")
    store = CheckpointStore(root)
    report = store.gc(live_conversations={"kept"})
    assert "stray.hkv" in report["orphans"] and file_of(sessions, "deleted") in report["orphans"]
    assert (root / file_of(sessions, "kept")).exists() and not (root / file_of(sessions, "deleted")).exists()


HOLD_LOCK = """
import fcntl, sys, time
fd = open(sys.argv[1], "a")
fcntl.flock(fd, fcntl.LOCK_EX)
print("locked", flush=True)
time.sleep(30)
"""


def test_a_second_process_cannot_write_while_the_store_is_locked(sessions, tmp_path):
    root = tmp_path / "ck"
    holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(root / "store.lock")], stdout=subprocess.PIPE,
                              text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        sessions.store.lock.timeout_s = 0.3
        with pytest.raises(StoreBusyError, match="in use by another Hearth process"):
            with sessions.store.lock.held():
                pass
        turn = sessions.generate("c", chat("hello"), GREEDY, 4)  # the turn still happens
        assert turn.generation.tokens and not turn.save.ok and "another Hearth process" in turn.save.error
    finally:
        holder.kill()
        holder.wait()
    assert sessions.save("turn").ok  # and saves once the other process lets go


def _make_read_only(paths: list[Path]) -> None:
    """chmod is enough for a normal user; root needs the immutable attribute."""
    for p in paths:
        if os.geteuid() == 0:
            if shutil.which("chattr") is None or subprocess.run(["chattr", "+i", str(p)]).returncode != 0:
                pytest.skip("running as root without chattr: a read-only directory cannot be made here")
        else:
            p.chmod(0o555 if p.is_dir() else 0o444)


def _make_writable(paths: list[Path]) -> None:
    for p in paths:
        if os.geteuid() == 0:
            subprocess.run(["chattr", "-i", str(p)], check=False)
        else:
            p.chmod(0o755 if p.is_dir() else 0o644)


def test_a_read_only_store_reports_and_generation_continues(sessions, tmp_path):
    root = tmp_path / "ck"
    msgs = chat("first")
    first = sessions.generate("c", msgs, GREEDY, 6)
    files = [root / file_of(sessions, "c"), *root.glob("prefix-*.hkv"), root]
    _make_read_only(files)
    try:
        follow = msgs + [{"role": "assistant", "content": "ok"}, {"role": "user", "content": "second"}]
        turn = sessions.generate("c", follow, GREEDY, 6)
        assert turn.generation.tokens  # the reply still came
        assert not turn.save.ok and "could not save" in turn.save.error
        other = ChatSessions(sessions.engine, sessions.store, adaptive=False)
        _, report = other.prepare("c", follow)  # what was saved before still loads
        assert report.source == DISK and report.restored_tokens == first.prompt_tokens  # up to the edited reply
    finally:
        _make_writable(files)
    assert sessions.save("turn").ok


def test_lock_waits_for_a_short_holder(tmp_path):
    store = CheckpointStore(tmp_path)
    script = HOLD_LOCK.replace("time.sleep(30)", "time.sleep(0.3)")
    holder = subprocess.Popen([sys.executable, "-c", script, str(tmp_path / "store.lock")], stdout=subprocess.PIPE,
                              text=True)
    assert holder.stdout.readline().strip() == "locked"
    started = time.monotonic()
    with store.lock.held():
        waited = time.monotonic() - started
    holder.wait()
    assert waited > 0.05  # it queued behind the other process instead of failing or barging in
