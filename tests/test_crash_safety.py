"""Crash safety: a chat process SIGKILLed at random moments, saving all the while. Afterwards every
checkpoint loads as the previous or the new state (a torn tail at worst, never damage), no temp file
survives the next start, and every message the process had stored is still there."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time

from engine.checkpoint.format import Reason
from engine.checkpoint.reader import CheckpointReader
from engine.checkpoint.store import CheckpointStore
from engine.conversations import ConversationStore
from engine.generation import Engine
from engine.model.convert import ensure_converted
from engine.model.synthetic import SyntheticSpec, write_synthetic_gguf
from engine.session import ChatSessions

from .conftest import REPO

KILLS = 20


def run_and_kill(args: list[str], delay: float, during_save: bool) -> list[str]:
    """Start the worker; kill it ``delay`` s after it is ready, or (``during_save``) that long after
    the first save it announces once ready, so the kill lands inside the write."""
    proc = subprocess.Popen([sys.executable, "-m", "tests.crash_worker", *args], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    ready, saving = threading.Event(), threading.Event()

    def read() -> None:
        for line in proc.stdout:
            lines.append(line.strip())
            if line.startswith("ready"):
                ready.set()
            elif line.startswith("saving") and ready.is_set() and len(lines) > 4:
                saving.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    assert ready.wait(120), proc.stderr.read() if proc.poll() is not None else "worker never became ready"
    if during_save:
        assert saving.wait(60), "the worker never saved"
    time.sleep(delay)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    reader.join(5)
    assert proc.returncode == -signal.SIGKILL, proc.stderr.read()
    return lines


def test_sigkill_while_saving_never_leaves_a_damaged_checkpoint(tmp_path):
    # Wide enough that a save writes megabytes (32 KB of KV per token), so kills land mid-write.
    gguf = write_synthetic_gguf(tmp_path / "wide.gguf", SyntheticSpec(n_layers=8, n_embd=512, n_head=8,
                                                                      n_head_kv=8, n_ff=1024))
    engine = Engine.load(ensure_converted(gguf, "int4", tmp_path / "converted"), "cpu")  # once, before workers
    rng = random.Random(20261129)
    stored: list[tuple[str, int]] = []
    interrupted = 0  # kills that provably landed inside a write: a torn tail or a temp file left
    args = [str(gguf), str(tmp_path / "converted"), str(tmp_path)]
    for i in range(KILLS):
        during_save = i % 2 == 1
        lines = run_and_kill(args, rng.uniform(0, 0.003) if during_save else rng.uniform(0.02, 0.6), during_save)
        stored += [(ln.split()[1], int(ln.split()[2])) for ln in lines if ln.startswith("stored")]

        interrupted += len(list((tmp_path / "checkpoints").glob(".*.tmp")))
        store = CheckpointStore(tmp_path / "checkpoints")  # opening it clears temp files of a killed write
        assert not list((tmp_path / "checkpoints").glob(".*.tmp"))
        for entry in store.entries():
            with CheckpointReader(store.path(entry.name)) as reader:
                reader.read_header()
                _, problem = reader.verify_all(engine.tokenizer.vocab_size)
            assert problem is None or problem.reason == Reason.TRUNCATED, f"{entry.name}: {problem}"
            interrupted += problem is not None

        convs = ConversationStore(tmp_path / "conversations.sqlite3")
        for conv, seq in stored:  # every message the worker saw stored survived the kill
            assert seq < len(convs.messages(conv)), f"{conv} lost message {seq}"
        for c in convs.list():
            msgs = convs.chat_messages(c.id)
            if msgs[-1]["role"] != "user":
                continue
            sessions = ChatSessions(engine, store, adaptive=False)
            _, report = sessions.prepare(c.id, msgs)
            assert report.reason in (None, Reason.TRUNCATED), report
        convs.close()
        store.close()
    assert len(stored) > KILLS  # the worker got real work done between kills
    assert interrupted >= 1  # and some kills really did cut a write short
