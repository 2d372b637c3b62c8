"""A real Hearth server on 127.0.0.1 (any free port), run in-process on a thread, for the server tests."""

from __future__ import annotations

import threading
import time
from dataclasses import replace

from engine.server.backend import ModelHost
from engine.server.config import ServerSettings
from engine.server.main import build_server, shutdown
from engine.server.runner import ThreadRunner

START_TIMEOUT_S = 120


class LiveServer:
    def __init__(self, paths, model: str, settings: ServerSettings | None = None, *, start_model: bool = True,
                 available_memory: int | None = None, provider: str = "cpu"):
        self.settings = replace(settings or ServerSettings(), port=0).check()
        self.runner = ThreadRunner(self.settings.max_queue)
        self.host = ModelHost(paths, self.runner, model=model, provider=provider, idle_unload_s=self.settings.idle_unload_s)
        if available_memory is not None:
            self.host.hearth.available_memory = available_memory
        self.server = build_server(self.host, self.settings)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the test server did not start")
            time.sleep(0.02)
        self.port = self.server.servers[0].sockets[0].getsockname()[1]
        self.base = f"http://{self.settings.host}:{self.port}"
        if start_model:
            self.host.start().result(timeout=START_TIMEOUT_S)

    def client(self, **options):
        from openai import OpenAI

        options.setdefault("max_retries", 0)  # a 429 is the test's to see, not the client's to retry
        options.setdefault("api_key", self.settings.api_key or "none")
        return OpenAI(base_url=self.base + "/v1", **options)

    def close(self) -> None:
        self.server.should_exit = True
        self.thread.join(60)
        shutdown(self.host, self.runner)
