"""The listening socket, bound before the server starts: a port in use (or an address that is not this
machine's) is then one plain error, before any model loads, instead of uvicorn's log line and exit."""

from __future__ import annotations

import errno
import socket

from engine.server.config import ServerConfigError


class ListenError(ServerConfigError):
    """The server cannot listen where it was asked to (``hearth-cli serve`` exits 2)."""


def bind(host: str, port: int) -> socket.socket:
    """A socket bound to ``host``:``port`` (0: any free port), ready for uvicorn to listen on."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        # as uvicorn does: a port left in TIME_WAIT by the last run is free; one listened on is not
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise ListenError(f"port {port} is in use (another program is listening there)") from None
        if exc.errno == errno.EACCES:
            raise ListenError(f"not allowed to listen on port {port} (ports below 1024 need privileges)") from None
        raise ListenError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    sock.set_inheritable(True)
    return sock
