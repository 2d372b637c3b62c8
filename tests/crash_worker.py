"""A chat loop for the crash-safety test: it is SIGKILLed at random moments while it chats and saves.

Usage: python -m tests.crash_worker GGUF CONVERTED_DIR DATA_DIR. Prints "stored CONV SEQ" after
each message lands in SQLite, so the parent knows what must survive.
"""

from __future__ import annotations

import sys
from pathlib import Path

from engine.checkpoint.store import CheckpointStore
from engine.conversations import ConversationStore
from engine.generation import Engine
from engine.model.convert import ensure_converted
from engine.sampling import SamplingParams
from engine.session import ChatSessions


class AnnouncingSessions(ChatSessions):
    """Says when a save starts, so the parent can aim its kill at the write itself."""

    def save(self, *args, **kwargs):
        print("saving", flush=True)
        return super().save(*args, **kwargs)


def main() -> None:
    gguf, converted_dir, data = (Path(a) for a in sys.argv[1:4])
    engine = Engine.load(ensure_converted(gguf, "int4", converted_dir), "cpu")
    convs = ConversationStore(data / "conversations.sqlite3")
    sessions = AnnouncingSessions(engine, CheckpointStore(data / "checkpoints"), save_align=64, adaptive=False)
    engine.prefill_chunk = 32  # several aligned saves per prefill
    existing = sorted(c.id for c in convs.list())
    conv = existing[-1] if existing else "crash-000"
    if not existing:
        convs.create(conv, system_prompt="You are terse.")
    print("ready", flush=True)
    turn = 0
    while True:
        turn += 1
        msg = convs.append(conv, "user", f"message {turn} " + "words " * (turn % 7))
        print(f"stored {conv} {msg.seq}", flush=True)
        prompt_len = len(engine.prompt_tokens(convs.chat_messages(conv)))
        if prompt_len > 200:  # the tiny context is nearly full: start the next conversation
            conv = f"crash-{int(conv.split('-')[1]) + 1:03d}"
            convs.create(conv, system_prompt="You are terse.")
            continue
        result = sessions.generate(conv, convs.chat_messages(conv), SamplingParams(seed=turn), 12)
        msg = convs.append(conv, "assistant", result.generation.text)
        print(f"stored {conv} {msg.seq}", flush=True)


if __name__ == "__main__":
    main()
