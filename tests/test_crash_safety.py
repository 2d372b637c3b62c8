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
from engine.session import ChatSessions

from .conftest import REPO

KILLS = 14


def run_and_kill(args: list[str], delay: float) -> list[str]:
    proc = subprocess.Popen([sys.executable, "-m", "tests.crash_worker", *args], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    ready = threading.Event()

    def read() -> None:
        for line in proc.stdout:
            lines.append(line.strip())
            if line.startswith("ready"):
                ready.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    assert ready.wait(120), proc.stderr.read() if proc.poll() is not None else "worker never became ready"
    time.sleep(delay)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    reader.join(5)
    assert proc.returncode == -signal.SIGKILL, proc.stderr.read()
    return lines


def test_sigkill_while_saving_never_leaves_a_damaged_checkpoint(tiny_gguf, tiny_dir, tiny_converted, tmp_path):
    tiny_converted("int4")  # converted once here, so workers start fast
    rng = random.Random(20261129)
    stored: list[tuple[str, int]] = []
    args = [str(tiny_gguf), str(tiny_dir / "converted"), str(tmp_path)]
    engine = Engine.load(tiny_converted("int4"), "cpu")
    for _ in range(KILLS):
        lines = run_and_kill(args, rng.uniform(0.02, 0.6))
        stored += [(ln.split()[1], int(ln.split()[2])) for ln in lines if ln.startswith("stored")]

        store = CheckpointStore(tmp_path / "checkpoints")  # opening it clears temp files of a killed write
        assert not list((tmp_path / "checkpoints").glob(".*.tmp"))
        for entry in store.entries():
            with CheckpointReader(store.path(entry.name)) as reader:
                reader.read_header()
                _, problem = reader.verify_all(engine.tokenizer.vocab_size)
            assert problem is None or problem.reason == Reason.TRUNCATED, f"{entry.name}: {problem}"

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
