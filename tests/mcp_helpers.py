"""Helpers for the MCP tool tests (issue 33): a stand-in for the tool registry (the host reads only
``servers``, ``get``, ``env_of`` and ``headers_of``), configurations of the test servers in tests/mcp_servers/,
and checks on processes."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

from engine.tools.config import HTTP, STDIO, ToolServerConfig

SERVERS = Path(__file__).resolve().parent / "mcp_servers"


class StandInRegistry:
    """The registry's read side over a dict, editable by a test (``put``/``remove``)."""

    def __init__(self, configs: list[ToolServerConfig] = (), env: dict[str, dict[str, str]] | None = None,
                 headers: dict[str, dict[str, str]] | None = None):
        self._configs = {c.name: c for c in configs}
        self._env = dict(env or {})
        self._headers = dict(headers or {})

    def servers(self) -> list[ToolServerConfig]:
        return list(self._configs.values())

    def get(self, name: str) -> ToolServerConfig:
        return self._configs[name]

    def env_of(self, name: str) -> dict[str, str]:
        return dict(self._env.get(name, {}))

    def headers_of(self, name: str) -> dict[str, str]:
        return dict(self._headers.get(name, {}))

    def put(self, config: ToolServerConfig) -> None:
        self._configs[config.name] = config

    def change(self, name: str, **fields) -> ToolServerConfig:
        self._configs[name] = replace(self._configs[name], **fields)
        return self._configs[name]


def stdio(name: str, script: str, *args: str, **fields) -> ToolServerConfig:
    """A test server run by this Python (its ``mcp``), with ``env_names`` etc. from ``fields``."""
    return ToolServerConfig(name=name, transport=STDIO, command=sys.executable,
                            args=(str(SERVERS / script), *args), **fields)


def http(name: str, url: str, **fields) -> ToolServerConfig:
    return ToolServerConfig(name=name, transport=HTTP, url=url, **fields)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_http_calculator(token: str, timeout_s: float = 60.0, port: int = 0) -> tuple[subprocess.Popen, str]:
    """The calculator over streamable HTTP on 127.0.0.1 (a free port unless given), wanting ``Bearer <token>``;
    returns the process and the endpoint once the port answers."""
    port = port or free_port()
    env = {**os.environ, "CALC_TOKEN": token}
    proc = subprocess.Popen([sys.executable, str(SERVERS / "calculator.py"), "--http", str(port),
                             "--token-env", "CALC_TOKEN"], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the HTTP calculator exited: {proc.stderr.read().decode(errors='replace')}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return proc, f"http://127.0.0.1:{port}/mcp"
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError("the HTTP calculator did not open its port")


def process_gone(pid: int) -> bool:
    """Whether ``pid`` has ended and been reaped (a zombie is not gone)."""
    return not Path(f"/proc/{pid}").exists()


def process_dead(pid: int) -> bool:
    """Whether ``pid`` has ended (a zombie left to a parent that is gone counts as ended)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return True
    return fields[0] in ("Z", "X")


def wait_for(condition, timeout_s: float = 30.0, interval_s: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(interval_s)
    return condition()
