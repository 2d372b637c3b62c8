"""Which processes have the conversation database open, so that restore and salvage never replace it
under one of them.

SQLite cannot tell: a process that has the file open (the window, ``serve``, a ``chat``) would write on
into the file that was moved aside, and those writes would be lost. So every ``ConversationStore`` holds a
shared ``flock`` on ``<db>.lock`` for as long as it is open, and restore and salvage take it exclusively,
refusing at once when another process holds it. The lock file stays when the database is replaced.
"""

from __future__ import annotations

import logging
import os
import stat
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from engine.errors import ConversationError
from engine.private_files import open_private

try:
    import fcntl
except ImportError:  # Windows, which refuses to replace a file another process has open anyway
    fcntl = None

log = logging.getLogger(__name__)
OPEN_WAIT_S = 30.0  # an opener waits this long for a restore or salvage in another process to finish
MAX_PROC_LOCKS_BYTES = 4 << 20  # /proc/locks: a line per lock in the whole system


def lock_path(db: Path) -> Path:
    return Path(db).with_name(Path(db).name + ".lock")


def _open(db: Path) -> int:
    """The lock file, created 0600; OSError when it cannot be, or is not a regular file (a FIFO never blocks
    the open: O_NONBLOCK)."""
    fd = open_private(lock_path(db), os.O_RDWR | os.O_CREAT | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(f"{lock_path(db)} is not a regular file; remove it (Hearth makes a new one)")
    return fd


def hold_shared(db: Path, wait_s: float = OPEN_WAIT_S) -> int | None:
    """Mark ``db`` as open by this process until :func:`release`; returns the lock's fd (None where no lock
    can be taken: no flock, or a lock file that cannot be made, which must not stop the database from
    being used). ConversationError when a restore or salvage in another process holds it past ``wait_s``."""
    if fcntl is None:
        return None
    try:
        fd = _open(db)
    except OSError as exc:
        log.info("cannot mark %s as open: %s", db, exc)
        return None
    deadline = time.monotonic() + wait_s
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            if time.monotonic() >= deadline:
                who = _pid_text(_ids(fd))
                os.close(fd)
                raise ConversationError(f"the conversation database {db} is being restored or salvaged by another "
                                        f"Hearth process{who}; try again when it has finished") from None
            time.sleep(0.05)
        except OSError as exc:  # a file system without flock (some network mounts): used unmarked, as before
            log.info("cannot mark %s as open: %s", db, exc)
            os.close(fd)
            return None


def release(fd: int | None) -> None:
    if fd is not None:
        os.close(fd)  # closing the last descriptor of the lock releases it


@contextmanager
def exclusive(db: Path) -> Iterator[None]:
    """Hold ``db`` alone while it is replaced; ConversationError naming the other process (by pid where
    the system tells it) when one has it open."""
    if fcntl is None:
        yield
        return
    try:
        fd = _open(db)
    except OSError as exc:
        raise ConversationError(f"cannot check whether another Hearth process has {db} open: {exc}") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ConversationError(f"Hearth is running{_pid_text(_ids(fd))} with {db.name} open (the window, "
                                    "'serve' or a 'chat') — quit it first, then try again") from None
        except OSError as exc:  # no flock here: openers take none either, so there is nothing to check
            log.info("cannot lock %s: %s", lock_path(db), exc)
        yield
    finally:
        os.close(fd)


def _ids(fd: int) -> tuple[int, int, int]:
    """The lock file's (device major, minor, inode), as /proc/locks names it."""
    st = os.fstat(fd)
    return os.major(st.st_dev), os.minor(st.st_dev), st.st_ino


def _pid_text(ids: tuple[int, int, int]) -> str:
    pids = holders(ids)
    if not pids:
        return ""
    return f" (pid {pids[0]})" if len(pids) == 1 else f" (pids {', '.join(map(str, pids))})"


def holders(ids: tuple[int, int, int]) -> list[int]:
    """The pids of other processes holding a flock on the file of (major, minor, inode), from Linux's
    /proc/locks; [] where that cannot be read (another system). A file on an overlay may be listed under
    another device: then the inode alone is matched."""
    try:
        with open("/proc/locks", "rb") as fh:
            text = fh.read(MAX_PROC_LOCKS_BYTES).decode("ascii", "replace")
    except OSError:
        return []
    exact, by_inode = [], []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) < 6 or "->" in parts or parts[1] != "FLOCK":  # '->': a process waiting, not holding
            continue
        try:
            pid = int(parts[4])
            major, minor, inode = parts[5].split(":")
            found = (int(major, 16), int(minor, 16), int(inode))
        except ValueError:
            continue
        if pid == os.getpid() or pid <= 0:
            continue
        if found == ids:
            exact.append(pid)
        elif found[2] == ids[2]:
            by_inode.append(pid)
    return sorted(set(exact or by_inode))
