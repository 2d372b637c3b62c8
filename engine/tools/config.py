"""The MCP servers a person configured, kept in ``<data>/tools.json`` (atomic, private), their secrets (an
environment's values, an HTTP server's headers) in the secret store (engine/secret_store.py), never in the file.

STUB: the registry's body is filled in by its own change; the shapes below are the contract."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from engine.errors import HearthError

TOOLS_FILE = "tools.json"
MAX_SERVERS = 32
SECRET_KIND = "tool-env"  # SecretStore kind; entries are named "<server>/<VARIABLE>" (headers "<server>/header:<Name>")
STDIO = "stdio"
HTTP = "http"
TRANSPORTS = (STDIO, HTTP)


class ToolConfigError(HearthError):
    """A server's configuration cannot be kept or read: a bad name, command, URL or file, in plain words."""


@dataclass(frozen=True)
class ToolServerConfig:
    """One configured MCP server. Secrets are never fields here: ``env_names``/``header_names`` name them,
    ``ToolRegistry.secrets_of`` reads their values."""

    name: str
    transport: str  # STDIO or HTTP
    command: str = ""  # stdio: the program
    args: tuple[str, ...] = ()
    env_names: tuple[str, ...] = ()  # stdio: the environment's variables (values in the secret store)
    cwd: str | None = None
    url: str = ""  # http: the streamable HTTP endpoint
    header_names: tuple[str, ...] = ()  # http: headers sent (values in the secret store)
    enabled: bool = True
    disabled_tools: frozenset[str] = field(default_factory=frozenset)  # the server's tools switched off

    def tool_enabled(self, tool: str) -> bool:
        return self.enabled and tool not in self.disabled_tools


class ToolRegistry:
    """The configured servers (``<data>/tools.json``) and their secrets."""

    def __init__(self, data_dir: Path, secrets=None):
        raise NotImplementedError

    def servers(self) -> list[ToolServerConfig]:
        raise NotImplementedError

    def get(self, name: str) -> ToolServerConfig:
        raise NotImplementedError

    def env_of(self, name: str) -> dict[str, str]:
        """A stdio server's environment values (from the secret store)."""
        raise NotImplementedError

    def headers_of(self, name: str) -> dict[str, str]:
        raise NotImplementedError
