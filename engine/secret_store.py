"""Where Hearth keeps the secrets it is given: remote servers' API keys and the Hugging Face token.

The desktop's secret store (``keyring``: the Secret Service on Linux, Keychain on macOS, the Credential
Manager on Windows) when one is there; else a private file, ``<data dir>/secrets.json``, mode 0600,
written atomically. ``keyring`` is the library every Python desktop tool uses for this; with no store
(a headless box, CI) its backend is ``fail.Keyring`` (priority 0), and Hearth then uses the file, as
``gh`` and ``huggingface-cli`` do. ``HEARTH_KEYRING=0`` forces the file (the tests set it).

A secret never reaches the database, an export, a log line or an error message: errors name the entry
("the key of server lab"), never its value.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable, Mapping
from pathlib import Path

from engine.errors import HearthError
from engine.fsutil import atomic_write

log = logging.getLogger(__name__)

SERVICE = "hearth"
SECRETS_FILE = "secrets.json"
MAX_SECRET_CHARS = 4096  # an API key or a hub token is well under 200; a pasted file is not a key
MAX_FILE_BYTES = 1 << 20
KEYRING_ENV = "HEARTH_KEYRING"


class SecretError(HearthError):
    """A secret cannot be kept or read (the message names the entry, never its value)."""


def check_secret(value: str, what: str) -> str:
    """``value`` stripped, refused when it cannot be a key (empty, huge, spaces or control characters)."""
    value = value.strip()
    if not value:
        raise SecretError(f"{what} is empty")
    if len(value) > MAX_SECRET_CHARS:
        raise SecretError(f"{what} is longer than {MAX_SECRET_CHARS} characters: that is not a key")
    if not value.isprintable() or any(c.isspace() for c in value):
        raise SecretError(f"{what} has spaces or control characters: a key is one word")
    return value


def read_secret_file(path: Path, what: str) -> str:
    """A key given as a file (``--api-key-file``): its text, checked, without ever echoing it."""
    try:
        with open(path, "rb") as fh:
            data = fh.read(MAX_SECRET_CHARS + 2)
    except OSError as exc:
        raise SecretError(f"cannot read {what} from {path}: {exc.strerror or exc}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise SecretError(f"{path} is not text: {what} must be a line of text") from None
    return check_secret(text, f"{what} in {path}")


class SecretStore:
    """Secrets by ``kind`` ("server", "hub") and ``name``; the system store when usable, else the file."""

    def __init__(self, data_dir: Path, *, use_keyring: bool | None = None):
        self.path = Path(data_dir) / SECRETS_FILE
        self._keyring = _system_keyring() if use_keyring is None else (_system_keyring() if use_keyring else None)

    @property
    def where(self) -> str:
        """In words, where secrets go: "the system keyring" or the file's path."""
        return "the system keyring" if self._keyring is not None else str(self.path)

    def get(self, kind: str, name: str) -> str | None:
        entry = _entry(kind, name)
        if self._keyring is not None:
            try:
                value = self._keyring.get_password(SERVICE, entry)
            except Exception as exc:  # a locked or vanished store: the file may still have it
                log.warning("the system keyring could not be read (%s); trying %s", type(exc).__name__, self.path)
                value = None
            if value is not None:
                return value
        return self._read_file().get(entry)

    def set(self, kind: str, name: str, value: str) -> None:
        entry = _entry(kind, name)
        value = check_secret(value, _what(kind, name))
        if self._keyring is not None:
            try:
                self._keyring.set_password(SERVICE, entry, value)
                self._drop_from_file(entry)
                return
            except Exception as exc:
                log.warning("the system keyring refused a secret (%s); keeping it in %s", type(exc).__name__,
                            self.path)
        entries = self._read_file()
        entries[entry] = value
        self._write_file(entries)

    def delete(self, kind: str, name: str) -> None:
        entry = _entry(kind, name)
        if self._keyring is not None:
            try:
                self._keyring.delete_password(SERVICE, entry)
            except Exception:  # not there (PasswordDeleteError) or unreachable: the file is still cleaned
                pass
        self._drop_from_file(entry)

    def set_many(self, kind: str, values: Mapping[str, str]) -> None:
        """Keep several secrets of ``kind`` at once (one write of the file, so all of them or none). The
        values are kept exactly as given: the caller checked them by its own rules (an MCP server's
        environment value may hold spaces or be empty, which a key may not)."""
        entries = {_entry(kind, name): value for name, value in values.items()}
        if not entries:
            return
        left = dict(entries)
        if self._keyring is not None:
            for entry, value in entries.items():
                try:
                    self._keyring.set_password(SERVICE, entry, value)
                    del left[entry]
                except Exception as exc:
                    log.warning("the system keyring refused a secret (%s); keeping it in %s", type(exc).__name__,
                                self.path)
        stored = self._read_file()
        kept = {k: v for k, v in stored.items() if k not in entries or k in left}  # the keyring's own: not here too
        kept.update(left)
        if kept != stored:
            self._write_file(kept)

    def delete_many(self, kind: str, names: Iterable[str]) -> None:
        entries = {_entry(kind, name) for name in names}
        if self._keyring is not None:
            for entry in entries:
                try:
                    self._keyring.delete_password(SERVICE, entry)
                except Exception:  # not there or unreachable: the file is still cleaned
                    pass
        stored = self._read_file()
        if entries & stored.keys():
            self._write_file({k: v for k, v in stored.items() if k not in entries})

    # the file ----------------------------------------------------------------------------------------
    def _read_file(self) -> dict[str, str]:
        try:
            with open(self.path, "rb") as fh:
                if os.fstat(fh.fileno()).st_mode & 0o077:
                    os.fchmod(fh.fileno(), 0o600)  # someone widened it: secrets others can read are no secrets
                data = fh.read(MAX_FILE_BYTES + 1)
        except FileNotFoundError:
            return {}
        except OSError as exc:
            raise SecretError(f"cannot read Hearth's secrets file {self.path}: {exc.strerror or exc}") from None
        if len(data) > MAX_FILE_BYTES:
            raise SecretError(f"Hearth's secrets file {self.path} is larger than 1 MB: it is not Hearth's; move it away")
        try:
            entries = json.loads(data.decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            raise SecretError(f"Hearth's secrets file {self.path} is damaged; move it away and add the keys again") from None
        if not isinstance(entries, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in entries.items()):
            raise SecretError(f"Hearth's secrets file {self.path} is damaged; move it away and add the keys again")
        return entries

    def _write_file(self, entries: dict[str, str]) -> None:
        data = json.dumps(entries, indent=1, sort_keys=True).encode("utf-8")
        if len(data) > MAX_FILE_BYTES:  # a file _read_file would refuse would lose every secret in it
            raise SecretError(f"Hearth's secrets file {self.path} would grow past 1 MB; remove servers or keys "
                              "you no longer use first")
        try:
            with atomic_write(self.path) as fh:  # mkstemp: 0600 whatever the umask
                fh.write(data)
        except OSError as exc:
            raise SecretError(f"cannot write Hearth's secrets file {self.path}: {exc.strerror or exc}") from None

    def _drop_from_file(self, entry: str) -> None:
        entries = self._read_file()
        if entry in entries:
            del entries[entry]
            self._write_file(entries)


def _entry(kind: str, name: str) -> str:
    return f"{kind}:{name}"


def _what(kind: str, name: str) -> str:
    return "the Hugging Face token" if kind == "hub" else f"the key of {kind} {name}"


def _system_keyring():
    """The desktop's secret store through ``keyring``, or None where there is none (or it is turned off)."""
    if os.environ.get(KEYRING_ENV, "").strip().lower() in ("0", "off", "no", "false"):
        return None
    try:
        import keyring
        from keyring.backends import fail
    except ImportError:
        return None
    try:
        backend = keyring.get_keyring()
    except Exception:
        return None
    if isinstance(backend, fail.Keyring) or getattr(backend, "priority", 0) <= 0:
        return None
    return backend
