"""This installation's secret key: what lets a bundle prove its saved contexts were made here.

A checksum proves a file is intact, not who computed it; anyone can relabel KV rows and recompute
every checksum. So a bundle exported here carries an HMAC-SHA256, under a key only this installation
knows, over its manifest (which lists a SHA-256 of each context file). The key is 32 random bytes in
``<data dir>/install.key``, mode 0600, created on first use.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import secrets
import tempfile
from pathlib import Path

from engine.errors import TransferError
from engine.fsutil import fsync_dir

log = logging.getLogger(__name__)
KEY_FILE = "install.key"
KEY_BYTES = 32


def install_key(data_dir: Path) -> bytes:
    """The key in ``data_dir``, created (atomically, mode 0600) if there is none yet."""
    path = Path(data_dir) / KEY_FILE
    try:
        return _read(path)
    except FileNotFoundError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{KEY_FILE}.", suffix=".tmp", dir=path.parent)  # mkstemp makes it 0600
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(secrets.token_bytes(KEY_BYTES))
            fh.flush()
            os.fsync(fh.fileno())
        try:
            os.link(tmp, path)  # never replaces: if another process made one meanwhile, theirs wins
            fsync_dir(path.parent)
        except FileExistsError:
            pass
    except OSError as exc:
        raise TransferError(f"cannot create this installation's key {path}: {exc.strerror or exc}") from None
    finally:
        Path(tmp).unlink(missing_ok=True)
    return _read(path)


def _read(path: Path) -> bytes:
    try:
        with open(path, "rb") as fh:
            if os.fstat(fh.fileno()).st_mode & 0o077:
                log.warning("%s is readable by other users; its mode should be 0600", path)
            data = fh.read(KEY_BYTES + 1)
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise TransferError(f"cannot read this installation's key {path}: {exc.strerror or exc}") from None
    if len(data) != KEY_BYTES:
        raise TransferError(f"this installation's key {path} is damaged ({len(data)} bytes, expected {KEY_BYTES}); "
                            "delete it to make a new one (bundles exported before then will need --trust-contexts)")
    return data


def sign(key: bytes, message: bytes) -> str:
    """HMAC-SHA256 of ``message`` under ``key``, as hex."""
    return hmac.new(key, message, hashlib.sha256).hexdigest()


def verify(key: bytes, message: bytes, mac: str) -> bool:
    return hmac.compare_digest(sign(key, message), mac)
