"""Hearth's files are private to the user who owns them, whatever the umask: directories 0700, files 0600.

Conversations, checkpoints (the same text as token ids) and the installation key are personal data; a
umask of 022 (or 000) must not make them readable by others. Modes are set explicitly after creation,
since ``mkdir``'s and ``open``'s modes are filtered through the umask. SQLite creates a database's
-wal, -shm and -journal files with the database file's own mode, so creating that file 0600 first
covers them.
"""

from __future__ import annotations

import os
from pathlib import Path

from engine.errors import HearthError

DIR_MODE = 0o700
FILE_MODE = 0o600


class FolderError(HearthError, OSError):
    """A folder Hearth keeps files in cannot be made: something else is at its path, or it is not allowed.
    An OSError too, so callers that turn a failed write into their own message still do."""


def private_dir(path: Path) -> Path:
    """Create ``path`` (and missing parents) and make ``path`` itself 0700; parents made here too, but
    not ones that existed (say ~/.cache, which is not Hearth's to change)."""
    path = Path(path)
    missing = []
    p = path
    while not p.exists():
        if p.is_symlink():  # dangling: mkdir would fail with a bare "File exists" that hides why
            raise FolderError(f"{p} is a link to {os.readlink(p)}, which does not exist: make that folder, or "
                              "remove the link")
        missing.append(p)
        p = p.parent
    if not p.is_dir():  # a file (or FIFO…) where the folder or one above it should be
        raise FolderError(f"{p} is not a folder, but Hearth keeps files in {path}: move it away or choose "
                          "another data folder")
    try:
        path.mkdir(parents=True, exist_ok=True, mode=DIR_MODE)
    except OSError as exc:
        raise FolderError(f"cannot make the folder {path}: {exc.strerror or exc}") from None
    for made in missing:
        os.chmod(made, DIR_MODE)
    if not path.is_symlink():  # a test or a user may point a subdirectory elsewhere on purpose
        os.chmod(path, DIR_MODE)
    return path


def private_file(path: Path) -> Path:
    """Make sure ``path`` exists and is 0600 (created empty if missing; contents untouched).

    An existing file is changed by name, never opened: closing any descriptor of a file drops every
    POSIX lock this process holds on it, and SQLite's locks on an open database are such locks.
    """
    path = Path(path)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE)
    except FileExistsError:
        os.chmod(path, FILE_MODE)
        return path
    try:
        os.fchmod(fd, FILE_MODE)
    finally:
        os.close(fd)
    return path


def open_private(path: Path, flags: int) -> int:
    """``os.open`` for a file of Hearth's own: created 0600, and made 0600 if it existed otherwise."""
    fd = os.open(path, flags, FILE_MODE)
    os.fchmod(fd, FILE_MODE)
    return fd
