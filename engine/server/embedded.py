"""The server inside another program (the window): uvicorn on a thread of its own, the model work on the
host program's engine thread through a ``PostedRunner``, over the ``Hearth`` that program already runs.

The host keeps ownership of the ``Hearth``: stopping the server stops listening and cancels the requests
in flight at their next token, and leaves the model loaded and the saving to the host.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import replace

from engine.api import Hearth, HearthPaths
from engine.errors import HearthError
from engine.server.backend import ModelHost
from engine.server.config import ServerSettings
from engine.server.listen import ListenError, bind
from engine.server.main import build_server
from engine.server.runner import PostedRunner

log = logging.getLogger(__name__)
START_TIMEOUT_S = 20.0


class ServerStartError(HearthError):
    """The local server could not start listening (the port is taken, the address is not this machine's)."""


class EmbeddedServer:
    def __init__(self, paths: HearthPaths, hearth: Hearth, post: Callable[[Callable[[], None]], None],
                 settings: ServerSettings | None = None):
        """``post(job)`` runs ``job`` on the thread that owns ``hearth``, in order with its other work."""
        self.settings = (settings or ServerSettings()).check()
        self.runner = PostedRunner(post, self.settings.max_queue)
        self.host = ModelHost(paths, self.runner, model=hearth.model_key, weights=hearth.weights, hearth=hearth)
        self.host.state = "ready" if hearth.model is not None else "starting"
        self.server = build_server(self.host, replace(self.settings, embedded=True), announce=False)
        self.thread: threading.Thread | None = None
        self.port: int | None = None

    @property
    def base_url(self) -> str:
        host = f"[{self.settings.host}]" if ":" in self.settings.host else self.settings.host
        return f"http://{host}:{self.port}/v1"

    def start(self) -> str:
        """Listen; return the base URL. ServerStartError when it cannot (e.g. the port is in use)."""
        try:
            sock = bind(self.settings.host, self.settings.port)
        except ListenError as exc:
            raise ServerStartError(f"could not listen on {self.settings.host}:{self.settings.port}: {exc}") from None
        self.thread = threading.Thread(target=self._run, args=(sock,), name="hearth-server", daemon=True)
        self.thread.start()
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self.server.started:
            if not self.thread.is_alive():
                raise ServerStartError(f"the local server could not listen on {self.settings.host}:"
                                       f"{self.settings.port}; is another program using that port?")
            if time.monotonic() > deadline:
                self.stop()
                raise ServerStartError("the local server did not start in time")
            time.sleep(0.02)
        self.port = self.server.servers[0].sockets[0].getsockname()[1]
        log.info("local server listening at %s", self.base_url)
        return self.base_url

    def _run(self, sock) -> None:
        try:
            self.server.run(sockets=[sock])
        except SystemExit as exc:  # uvicorn exits this way when it cannot bind; start() reports it
            log.warning("the local server stopped: exit %s", exc.code)

    def stop(self, timeout_s: float = 30.0) -> None:
        """Stop listening; requests in flight stop at their next token. The model stays loaded."""
        self.host.cancel_all()
        self.runner.close()
        self.server.should_exit = True
        if self.thread is not None:
            self.thread.join(timeout_s)


def local_server(paths: HearthPaths, hearth: Hearth, post: Callable[[Callable[[], None]], None], *,
                 port: int = 8080, host: str = "127.0.0.1", api_key: str | None = None) -> EmbeddedServer:
    """The OpenAI-compatible server inside the window: an ``EmbeddedServer`` over ``hearth``, whose model work
    ``post`` runs on the window's engine thread. ``start()`` returns the base URL or raises a HearthError
    saying why not; ``stop()`` stops listening."""
    return EmbeddedServer(paths, hearth, post, ServerSettings(host=host, port=port, api_key=api_key))
