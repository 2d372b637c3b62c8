"""One turn at a time per conversation, across processes.

Two ``hearth-cli chat`` runs (or the window and the CLI, or the server) on one conversation would
otherwise store user, user, assistant, assistant, each reply answering a context it was never shown.
A turn holds its conversation's lock from storing the user's message to storing the reply and saving
the context; a second turn waits for it, and gives up with a clear message after a timeout.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from engine.errors import ConversationBusyError, HearthError
from engine.file_lock import StoreLock
from engine.private_files import private_dir

DEFAULT_TURN_WAIT_S = 600.0  # a long reply at a long context can take minutes on a CPU


class TurnLock(StoreLock):
    def __init__(self, locks_dir: Path, conversation: str, timeout_s: float = DEFAULT_TURN_WAIT_S):
        private_dir(locks_dir)
        # Conversation ids are safe file names already; hashing keeps the name short and uniform.
        name = hashlib.sha256(conversation.encode("utf-8")).hexdigest()[:32]
        super().__init__(locks_dir / f"turn-{name}.lock", timeout_s)
        self.conversation = conversation

    def busy_error(self) -> HearthError:
        return ConversationBusyError(f"conversation {self.conversation} is busy in another Hearth process (waited "
                                     f"{self.timeout_s:g} s for its turn to end); try again when it has finished")
