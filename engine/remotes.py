"""The remote servers a user added: OpenAI-compatible engines elsewhere (vLLM, SGLang, llama.cpp's server,
Ollama, LM Studio, another Hearth) whose models Hearth chats with as ``NAME/MODEL``.

A server is a name and a base URL, kept in ``<data dir>/remotes.json`` (written atomically); its API key,
when it has one, is in the secret store (engine/secret_store.py), never in this file, the database, an
export or a log. ``NAME/MODEL`` splits at the first slash: a server's name has none, a model id may
(``lab/meta-llama/Llama-3.1-70B-Instruct``).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from engine.errors import HearthError
from engine.fsutil import atomic_write
from engine.secret_store import SecretStore

REMOTES_FILE = "remotes.json"
MAX_SERVERS = 64
MAX_URL_CHARS = 2048
MAX_FILE_BYTES = 1 << 20
NAME_RE = re.compile(r"[a-z0-9][a-z0-9._-]{0,31}")
SECRET_KIND = "server"


class RemoteError(HearthError):
    """A remote server cannot be added, found or reached (the message names it, never its key)."""


@dataclass(frozen=True)
class RemoteServer:
    name: str  # what the picker shows before the slash: "lab"
    base_url: str  # up to the API's root, without /v1: "http://gpu-box:8000"
    has_key: bool = False

    def model_key(self, model: str) -> str:
        """How a conversation remembers this server's ``model``: ``NAME/MODEL``."""
        return f"{self.name}/{model}"


def check_name(name: str) -> str:
    if not NAME_RE.fullmatch(name or ""):
        raise RemoteError(f"{name!r} cannot name a server: use 1 to 32 lower-case letters, digits, '.', '_' or '-', "
                          "starting with a letter or digit (it goes before the slash in NAME/MODEL)")
    return name


def check_base_url(url: str) -> str:
    """``url`` as the API's root: http(s), a host, no query; a trailing ``/v1`` is dropped (Hearth adds it)."""
    url = (url or "").strip()
    if len(url) > MAX_URL_CHARS:
        raise RemoteError(f"the server's address is longer than {MAX_URL_CHARS} characters")
    parts = urlsplit(url)
    # a refusal quotes the address only when it cannot hold a credential (user:password@, a ?key=…)
    shown = "the address" if any(c in url for c in "@?#") else repr(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise RemoteError(f"{shown} is not a server address: write it as http://HOST:PORT (or https://…)")
    if parts.query or parts.fragment:
        raise RemoteError(f"{shown} has a query or fragment: give only the server's address")
    if "@" in parts.netloc:
        raise RemoteError("put the API key in its own field (--api-key-file), not in the address")
    path = parts.path.rstrip("/")
    if path.endswith("/v1"):
        path = path[: -len("/v1")]
    return f"{parts.scheme}://{parts.netloc}{path}"


def split_model_key(key: str) -> tuple[str, str] | None:
    """``("lab", "llama-3.1-70b")`` for ``"lab/llama-3.1-70b"``; None when ``key`` is not NAME/MODEL."""
    name, sep, model = (key or "").partition("/")
    if not sep or not model or not NAME_RE.fullmatch(name):
        return None
    return name, model


class RemoteRegistry:
    """The servers of one data dir, and their keys."""

    def __init__(self, data_dir: Path, secrets: SecretStore | None = None):
        self.path = Path(data_dir) / REMOTES_FILE
        self.secrets = secrets or SecretStore(Path(data_dir))

    def servers(self) -> list[RemoteServer]:
        return [RemoteServer(name, url, self.secrets.get(SECRET_KIND, name) is not None)
                for name, url in sorted(self._read().items())]

    def get(self, name: str) -> RemoteServer:
        entries = self._read()
        if name not in entries:
            known = ", ".join(sorted(entries)) or "none yet"
            raise RemoteError(f"there is no remote server named {name!r} (servers: {known}); add it with "
                              "hearth-cli remote add NAME URL")
        return RemoteServer(name, entries[name], self.secrets.get(SECRET_KIND, name) is not None)

    def api_key(self, name: str) -> str | None:
        return self.secrets.get(SECRET_KIND, name)

    def find(self, key: str) -> tuple[RemoteServer, str] | None:
        """The server and model a conversation's model key names, or None when it names no added server
        (a library model, a GGUF path)."""
        split = split_model_key(key)
        if split is None or split[0] not in self._read():
            return None
        return self.get(split[0]), split[1]

    def add(self, name: str, base_url: str, api_key: str | None = None, *, replace: bool = False) -> RemoteServer:
        name, url = check_name(name), check_base_url(base_url)
        entries = self._read()
        if name in entries and not replace:
            raise RemoteError(f"a server named {name!r} exists already ({entries[name]}); replace it with "
                              "--replace, remove it first, or choose another name")
        if name not in entries and len(entries) >= MAX_SERVERS:
            raise RemoteError(f"Hearth keeps at most {MAX_SERVERS} servers; remove one first")
        if api_key is not None:
            self.secrets.set(SECRET_KIND, name, api_key)  # first: a refused key leaves nothing half-added
        elif replace:
            self.secrets.delete(SECRET_KIND, name)
        entries[name] = url
        self._write(entries)
        return RemoteServer(name, url, api_key is not None)

    def remove(self, name: str) -> None:
        entries = self._read()
        if name not in entries:
            self.get(name)  # the plain "no such server" error
        del entries[name]
        self._write(entries)
        self.secrets.delete(SECRET_KIND, name)

    def _read(self) -> dict[str, str]:
        try:
            with open(self.path, "rb") as fh:
                data = fh.read(MAX_FILE_BYTES + 1)
        except FileNotFoundError:
            return {}
        except OSError as exc:
            raise RemoteError(f"cannot read the list of remote servers {self.path}: {exc.strerror or exc}") from None
        damaged = RemoteError(f"the list of remote servers {self.path} is damaged; move it away and add the servers again")
        if len(data) > MAX_FILE_BYTES:
            raise damaged
        try:
            entries = json.loads(data.decode("utf-8")).get("servers", {})
        except (UnicodeDecodeError, ValueError, AttributeError):
            raise damaged from None
        if not isinstance(entries, dict) or len(entries) > MAX_SERVERS:
            raise damaged
        try:
            return {check_name(k): check_base_url(v) for k, v in entries.items() if isinstance(v, str)}
        except RemoteError:
            raise damaged from None

    def _write(self, entries: dict[str, str]) -> None:
        try:
            with atomic_write(self.path) as fh:
                fh.write(json.dumps({"servers": entries}, indent=1, sort_keys=True).encode("utf-8"))
        except OSError as exc:
            raise RemoteError(f"cannot save the list of remote servers {self.path}: {exc.strerror or exc}") from None
