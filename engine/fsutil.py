"""Crash-safe file writes (temp file in the same directory, fsync, rename, fsync the directory), and
reads that refuse anything but a regular file."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import stat
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextmanager
def atomic_write(path: Path) -> Iterator[BinaryIO]:
    """Yield a file to write; it replaces ``path`` only if the block finishes without error."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # mkstemp makes the file 0600 whatever the umask: every atomically written file is private.
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
        fsync_dir(path.parent)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def sha256_file(path: Path, chunk: int = 1 << 20, check: Callable[[], None] | None = None) -> str:
    """The file's SHA-256; ``check`` runs between chunks and may raise to stop a long hash (a cancel)."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            h.update(block)
            if check is not None:
                check()
    return h.hexdigest()


class NotRegularFileError(OSError):
    """A path to read is a FIFO, device, socket or directory: reading one could block forever or never end."""


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "an unknown kind of file"


def irregular_kind(path: Path) -> str | None:
    """What ``path`` is when it exists and is not a regular file ("a FIFO (named pipe)", "a directory"…),
    else None (a regular file, or nothing there): so a message can say what is there instead of "not found"."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return None
    return None if stat.S_ISREG(mode) else _kind(mode)


def open_regular(path: Path, buffering: int = -1) -> BinaryIO:
    """``path`` opened for reading as ``open(path, "rb", buffering=...)`` does, but refused
    (``NotRegularFileError``) unless it is a regular file.

    The open itself does not block: O_NONBLOCK makes a FIFO without a writer open at once, and fstat on
    what was opened (not a stat before it) cannot be raced by a swap of the path."""
    nonblock = getattr(os, "O_NONBLOCK", 0)  # POSIX; Windows has no FIFOs to open by path
    fd = os.open(path, os.O_RDONLY | nonblock | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0))
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise NotRegularFileError(errno.EINVAL, f"it is {_kind(mode)}, not a regular file", str(path))
        if nonblock:
            os.set_blocking(fd, True)  # ordinary reads from here on
        return os.fdopen(fd, "rb", buffering=buffering)
    except BaseException:
        os.close(fd)
        raise


def read_json(path: Path, max_bytes: int) -> object:
    """The JSON document in ``path``, a regular file of at most ``max_bytes``. Raises OSError (missing,
    unreadable, a FIFO…) or ValueError (too large, not UTF-8 JSON, nested too deeply to parse)."""
    with open_regular(path) as fh:
        data = fh.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise ValueError(f"it is larger than {max_bytes} bytes")
    try:
        return json.loads(data.decode("utf-8"))
    except RecursionError:  # e.g. 100,000 '[': the parser's own guard, reported as malformed
        raise ValueError("it nests lists or objects too deeply") from None
