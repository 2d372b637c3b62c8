"""A small HTTP server on 127.0.0.1 (http.server in a thread) that answers /v1/models and replays scripted
answers to the completion endpoints: the wire transcripts of tests/fixtures/remote_wire, and bad servers."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

FIXTURES = Path(__file__).parent / "fixtures" / "remote_wire"
SSE = "text/event-stream"


def transcript(name: str) -> tuple[dict, bytes]:
    """(what the fixture's header expects, the body after its ``---`` line), bytes exactly as written."""
    raw = (FIXTURES / name).read_bytes()
    head, _, body = raw.partition(b"---\n")
    expect_line = next(line for line in head.decode().splitlines() if line.startswith("# expect:"))
    expect = dict(part.split("=", 1) for part in expect_line[len("# expect:"):].split() if "=" in part)
    expect["reply"] = json.loads(expect_line.split("reply=", 1)[1].split(" stop=")[0])
    return expect, body


class Answer:
    """One scripted answer: a status, headers and a body (bytes, or chunks sent with a pause between)."""

    def __init__(self, status: int = 200, body: bytes | Iterable[bytes] = b"", content_type: str = SSE,
                 headers: dict | None = None, pause_s: float = 0.0):
        self.status, self.body, self.content_type = status, body, content_type
        self.headers, self.pause_s = headers or {}, pause_s


class ReplayServer:
    def __init__(self, models: list[dict] | None = None):
        self.answers: list[Answer | Callable[[], Answer]] = []
        self.requests: list[dict] = []
        self.headers: list[dict] = []
        self.models = models if models is not None else [{"id": "m", "object": "model"}]
        replay = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *_args) -> None:
                pass

            def do_GET(self) -> None:
                replay.headers.append(dict(self.headers))
                self._send(Answer(200, json.dumps({"object": "list", "data": replay.models}).encode(),
                                  "application/json"))

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length", 0))
                replay.requests.append(json.loads(self.rfile.read(length) or b"{}"))
                replay.headers.append(dict(self.headers))
                answer = replay.answers.pop(0) if replay.answers else Answer(500, b"no answer scripted", "text/plain")
                self._send(answer() if callable(answer) else answer)

            def _send(self, answer: Answer) -> None:
                self.send_response(answer.status)
                self.send_header("Content-Type", answer.content_type)
                for k, v in answer.headers.items():
                    self.send_header(k, v)
                self.end_headers()  # HTTP/1.0: the body ends when the connection closes
                chunks = [answer.body] if isinstance(answer.body, bytes) else answer.body
                try:
                    for chunk in chunks:
                        self.wfile.write(chunk)
                        self.wfile.flush()
                        if answer.pause_s:
                            time.sleep(answer.pause_s)
                except (BrokenPipeError, ConnectionResetError):  # the client closed it: a Stop
                    pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.base = f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
