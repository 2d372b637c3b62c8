"""The server's settings and the rules that keep it safe by default."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from engine.errors import HearthError

DEFAULT_HOST, DEFAULT_PORT = "127.0.0.1", 8080
DEFAULT_MAX_QUEUE = 16
DEFAULT_MAX_BODY_BYTES = 8 * 2**20  # a long agent conversation is well under this
MAX_KEY_FILE_BYTES = 4096


class ServerConfigError(HearthError):
    """Settings the server refuses to start with (``hearth-cli serve`` exits 2)."""


@dataclass(frozen=True)
class ServerSettings:
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    api_key: str | None = None
    cors_origins: tuple[str, ...] = ()
    allowed_hosts: tuple[str, ...] = ()
    max_queue: int = DEFAULT_MAX_QUEUE
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    idle_unload_s: float | None = None
    # A request naming a model the library does not know runs on the loaded one (``--any-model``), for clients
    # that insist on a hosted model's name; off, such a request is a 404. A request naming none always does.
    any_model: bool = False
    # Run inside the window (EmbeddedServer), which has no --cors-origin to offer: refusals advise what it can do.
    embedded: bool = False

    def check(self) -> ServerSettings:
        """Refuse what would be unsafe or meaningless; returns self."""
        if self.host != DEFAULT_HOST and not self.api_key:
            raise ServerConfigError(f"refusing to listen on {self.host} without an API key: other machines (or "
                                    "other users) could use the model; pass --api-key KEY or --api-key-file FILE")
        if not 0 <= self.port <= 65535:
            raise ServerConfigError(f"--port must be 0-65535, got {self.port}")
        if self.max_queue < 1:
            raise ServerConfigError(f"--max-queue must be at least 1, got {self.max_queue}")
        if self.max_body_bytes < 1024:
            raise ServerConfigError(f"--max-body-bytes must be at least 1024, got {self.max_body_bytes}")
        if self.idle_unload_s is not None and self.idle_unload_s <= 0:
            raise ServerConfigError(f"--idle-unload must be a positive number of seconds, got {self.idle_unload_s}")
        if self.api_key is not None and (len(self.api_key) < 8 or not self.api_key.isprintable()
                                         or any(c.isspace() for c in self.api_key)):
            raise ServerConfigError("the API key must be at least 8 printable characters without spaces")
        for origin in self.cors_origins:
            if origin == "*" or not origin.startswith(("http://", "https://")) or origin.count("/") != 2:
                raise ServerConfigError(f"--cors-origin takes an origin such as http://localhost:3000 (no '*', "
                                        f"no path), got {origin!r}")
        return self


def read_key_file(path: str) -> str:
    """The key in a file (its first line); the file is small, or it is not a key file."""
    p = Path(path).expanduser()
    try:
        with p.open("rb") as f:
            data = f.read(MAX_KEY_FILE_BYTES + 1)
    except OSError as exc:
        raise ServerConfigError(f"cannot read the API key file {p}: {exc.strerror or exc}") from None
    if len(data) > MAX_KEY_FILE_BYTES:
        raise ServerConfigError(f"the API key file {p} is larger than {MAX_KEY_FILE_BYTES} bytes: not a key file")
    try:
        key = data.decode("utf-8").strip().splitlines()[0].strip() if data.strip() else ""
    except UnicodeDecodeError:
        raise ServerConfigError(f"the API key file {p} is not text") from None
    if not key:
        raise ServerConfigError(f"the API key file {p} is empty")
    return key

