"""The window's local-server key: when it exists, the server inside the window requires it.

127.0.0.1 is not private to one person: every account on the machine can reach a loopback port, and the
server's ``cached_tokens`` would confirm guesses about the owner's prompts. So the window can require
``Authorization: Bearer KEY``. The key is ``secrets.token_urlsafe`` text in ``<data dir>/server.key``,
mode 0600, written atomically (temp, fsync, link, fsync dir). The file's presence is the setting: no
file, no key required. The key is never logged nor put in an error message.
"""

from __future__ import annotations

import os
import secrets
import tempfile
from pathlib import Path

from engine.errors import HearthError
from engine.fsutil import fsync_dir
from engine.private_files import FILE_MODE, private_dir

KEY_FILE = "server.key"
KEY_BYTES = 32  # token_urlsafe(32): 43 characters
MAX_KEY_CHARS = 256


class ServerKeyError(HearthError):
    """The key file cannot be read, written or removed (the message names the file, never the key)."""


def key_path(data_dir: Path) -> Path:
    return Path(data_dir) / KEY_FILE


def read_server_key(data_dir: Path) -> str | None:
    """The key the window's server requires, or None when none is required (no key file)."""
    path = key_path(data_dir)
    try:
        with open(path, "rb") as fh:
            if os.fstat(fh.fileno()).st_mode & 0o077:
                os.fchmod(fh.fileno(), FILE_MODE)  # someone widened it: a key others can read is no key
            data = fh.read(MAX_KEY_CHARS + 1)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ServerKeyError(f"cannot read the local server's key file {path}: {exc.strerror or exc}") from None
    try:
        key = data.decode("ascii").strip()
    except UnicodeDecodeError:
        key = ""
    if len(data) > MAX_KEY_CHARS or len(key) < 8 or not key.isprintable() or any(c.isspace() for c in key):
        raise ServerKeyError(f"the local server's key file {path} is damaged; turn “Require a key” off and on "
                             "again to make a new key")
    return key


def create_server_key(data_dir: Path) -> str:
    """The key, made now (atomically, 0600) when there is none yet; an existing one is kept."""
    existing = read_server_key(data_dir)
    if existing is not None:
        return existing
    path = key_path(data_dir)
    try:
        private_dir(path.parent)
        fd, tmp = tempfile.mkstemp(prefix=f".{KEY_FILE}.", suffix=".tmp", dir=path.parent)  # 0600
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(secrets.token_urlsafe(KEY_BYTES).encode("ascii") + b"\n")
                fh.flush()
                os.fsync(fh.fileno())
            try:
                os.link(tmp, path)  # never replaces: a key another process made meanwhile wins
            except FileExistsError:
                pass
            fsync_dir(path.parent)
        finally:
            Path(tmp).unlink(missing_ok=True)
    except OSError as exc:
        raise ServerKeyError(f"cannot write the local server's key file {path}: {exc.strerror or exc}") from None
    key = read_server_key(data_dir)
    if key is None:  # removed between the link and the read: say so rather than serve without a key
        raise ServerKeyError(f"the local server's key file {path} vanished as it was made; try again")
    return key


def remove_server_key(data_dir: Path) -> None:
    """Require no key any more (the next "Require a key" makes a new one)."""
    path = key_path(data_dir)
    try:
        path.unlink(missing_ok=True)
        fsync_dir(path.parent)
    except FileNotFoundError:
        pass
    except OSError as exc:
        raise ServerKeyError(f"cannot remove the local server's key file {path}: {exc.strerror or exc}") from None
