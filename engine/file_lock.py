"""An inter-process lock on a file, held only around each operation: the checkpoint store's (so two Hearth
processes never write it at once), and those of a download, the model library and a turn, which lock the
same way. Below all of them, so none climbs into the checkpoint package for it.

A process that cannot get a lock within the timeout gets a clear error instead of a hang.
"""

from __future__ import annotations

import os
import stat
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from engine.errors import HearthError
from engine.private_files import open_private

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None
    import msvcrt


class StoreBusyError(HearthError):
    """Another process has held the checkpoint store for longer than we are willing to wait."""


class LockFileError(StoreBusyError):
    """The lock file cannot be opened or is not a regular file (a directory, a FIFO): no lock can be taken.
    A StoreBusyError, so a save that cannot lock is reported as failed, as when the store is busy."""


class StoreLock:
    def __init__(self, path: Path, timeout_s: float = 15.0):
        self.path = Path(path)
        self.timeout_s = timeout_s
        self._local = threading.RLock()  # threads of this process queue here, not on the file
        self._depth = 0
        self._fd: int | None = None

    def _try_lock(self, fd: int) -> bool:
        try:
            if fcntl is not None:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            else:
                msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
            return True
        except OSError:
            return False

    def _unlock(self, fd: int) -> None:
        if fcntl is not None:
            fcntl.flock(fd, fcntl.LOCK_UN)
        else:
            msvcrt.locking(fd, msvcrt.LK_UNLCK, 1)

    def _open(self) -> int:
        """The lock file, opened (created) without blocking on whatever is there instead of a file."""
        try:
            fd = open_private(self.path, os.O_RDWR | os.O_CREAT | getattr(os, "O_NONBLOCK", 0))
        except OSError as exc:
            raise LockFileError(f"cannot use the lock file {self.path}: {exc.strerror or exc}; if it is not a file, "
                                "remove it") from None
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise LockFileError(f"the lock file {self.path} is not a regular file; remove it (Hearth makes a new one)")
        return fd

    def busy_error(self) -> HearthError:
        return StoreBusyError(f"the checkpoint store {self.path.parent} is in use by another Hearth process "
                              f"(waited {self.timeout_s:g} s)")

    @contextmanager
    def held(self, on_wait: Callable[[], None] | None = None,
             give_up: Callable[[], HearthError | None] | None = None) -> Iterator[None]:
        """Hold the lock; ``on_wait`` is called once if another process holds it now; while waiting,
        ``give_up`` returning an error stops the wait with it (a user's Stop)."""
        with self._local:
            if self._depth == 0:
                fd = self._open()
                deadline = time.monotonic() + self.timeout_s
                waited = False
                while not self._try_lock(fd):
                    if not waited and on_wait is not None:
                        on_wait()
                    waited = True
                    reason = give_up() if give_up is not None else None
                    if reason is not None or time.monotonic() >= deadline:
                        os.close(fd)
                        raise reason or self.busy_error()
                    time.sleep(0.02)
                self._fd = fd
            self._depth += 1
            try:
                yield
            finally:
                self._depth -= 1
                if self._depth == 0 and self._fd is not None:
                    self._unlock(self._fd)
                    os.close(self._fd)
                    self._fd = None
