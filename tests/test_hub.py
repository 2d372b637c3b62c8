"""GGUFs from the Hugging Face Hub (engine/hub.py): huggingface_hub pointed (HF_ENDPOINT) at a local server
answering the hub's endpoints (tests/hub_server.py) over real files — the default model's real GGUF, a tiny
synthetic one split as gguf-split splits. Real HTTP on 127.0.0.1; nothing mocked but the free disk space of
one check."""

from __future__ import annotations

import hashlib
import shutil
import socket
from pathlib import Path

import pytest

from engine.api import (
    DownloadCancelledError,
    Hearth,
    HubChecksumError,
    HubClient,
    HubError,
    HubGatedError,
    HubNotFoundError,
    HubOfflineError,
    ModelLibrary,
    parse_hub_ref,
    resolve_paths,
)
from engine.hub_files import memory_estimate, merged_name, quant_of
from engine.hub_split import merge_split_gguf
from engine.secret_store import SecretError
from engine.types import CancelToken, ModelOrigin, ModelStatus, SamplingParams
from tests.gguf_split import split_gguf
from tests.hub_server import COMMIT, HubServer

REAL = "SmolLM2-135M-Instruct-Q4_1.gguf"  # the default model's real GGUF, named as a hub repo would
REPO = "HuggingFaceTB/SmolLM2-135M-Instruct-GGUF"
TOKEN = "hf_testtoken0123456789abcdefABCDEF"


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def hub(monkeypatch):
    server = HubServer()
    monkeypatch.setenv("HF_ENDPOINT", server.url)
    yield server
    server.close()


@pytest.fixture
def real_gguf(real_home) -> Path:
    return real_home / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.fixture
def paths(tmp_path):
    return resolve_paths(tmp_path / "home").ensure()


@pytest.fixture
def split_parts(tiny_gguf, tmp_path) -> list[Path]:
    folder = tmp_path / "split"
    folder.mkdir()
    return split_gguf(tiny_gguf, folder, 3, stem="tiny-Q8_0")


def closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


# search and listing -----------------------------------------------------------------------------------------
def test_search_finds_gguf_repositories_only(hub, paths, real_gguf):
    hub.add_repo(REPO, {REAL: real_gguf}, downloads=900, likes=12)
    hub.add_repo("bartowski/SmolLM2-1.7B-GGUF", {REAL: real_gguf}, downloads=50, gated=True)
    hub.add_repo("HuggingFaceTB/SmolLM2-135M", {"model.safetensors": real_gguf}, tags=["safetensors"])
    hub.add_repo("other/Llama-GGUF", {REAL: real_gguf})
    found = HubClient(paths).search("smollm2")
    assert [r.id for r in found] == [REPO, "bartowski/SmolLM2-1.7B-GGUF"]  # most downloaded first
    assert (found[0].downloads, found[0].likes, found[0].gated) == (900, 12, False)
    assert found[1].gated and found[0].last_modified.startswith("2025-01-02")
    assert [r.id for r in HubClient(paths).search("smollm2", limit=1)] == [REPO]
    assert HubClient(paths).search("no-such-model") == []
    asked = [r for r in hub.requests if r["path"] == "/api/models"]
    assert asked and all("filter=gguf" in r["query"] for r in asked)


@pytest.mark.parametrize("query, limit, words", [("", 20, "say what to search"), ("x" * 201, 20, "at most 200"),
                                                 ("ok\x1b[31m", 20, "printable"), ("ok", 0, "at least 1"),
                                                 ("ok", True, "whole number")])
def test_a_bad_search_is_refused_before_the_network(hub, paths, query, limit, words):
    with pytest.raises(HubError, match=words):
        HubClient(paths).search(query, limit)
    assert hub.requests == []


def test_a_large_limit_is_bounded(hub, paths, real_gguf):
    for n in range(120):
        hub.add_repo(f"owner/model-{n}-GGUF", {REAL: real_gguf}, downloads=n)
    assert len(HubClient(paths).search("model", limit=10_000)) == 100


def test_files_lists_ggufs_with_quant_size_hash_memory_and_splits_as_one(hub, paths, real_gguf, split_parts,
                                                                            tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text("# a model\n")
    files = {REAL: real_gguf, "README.md": readme, **{p.name: p for p in split_parts},
             "broken-00001-of-00002.gguf": split_parts[0]}  # a split whose second part is missing
    hub.add_repo(REPO, files)
    listed = HubClient(paths).files(REPO)
    assert [f.filename for f in listed] == [REAL, split_parts[0].name]
    plain, split = listed
    assert (plain.size, plain.sha256, plain.quant, plain.parts) == (real_gguf.stat().st_size, sha256(real_gguf),
                                                                    "Q4_1", (REAL,))
    assert plain.memory_bytes == memory_estimate(plain.size) > plain.size
    assert split.parts == tuple(p.name for p in split_parts) and split.is_split
    assert split.size == sum(p.stat().st_size for p in split_parts) and split.quant == "Q8_0"


@pytest.mark.parametrize("name, quant", [
    ("Llama-3.2-1B-Instruct-Q4_K_M.gguf", "Q4_K_M"), ("model.q8_0.gguf", "Q8_0"), ("phi-IQ4_XS.gguf", "IQ4_XS"),
    ("gemma-3-270m-f16.gguf", "F16"), ("x-BF16-00001-of-00002.gguf", "BF16"), ("Q4_K_M/x-Q4_K_M.gguf", "Q4_K_M"),
    ("model-Q3_K_L.gguf", "Q3_K_L"), ("plain.gguf", ""), ("Qwen2-7B.gguf", "")])
def test_quant_comes_from_the_file_name(name, quant):
    assert quant_of(name) == quant


def test_merged_name_drops_the_part_numbers():
    assert merged_name("sub/model-Q8_0-00001-of-00003.gguf") == "model-Q8_0.gguf"
    assert merged_name("model.gguf") == "model.gguf"


def test_unknown_repo_and_file_and_bad_names(hub, paths, real_gguf):
    hub.add_repo(REPO, {REAL: real_gguf})
    client = HubClient(paths)
    with pytest.raises(HubNotFoundError, match="not on the Hugging Face Hub"):
        client.files("nobody/nothing")
    with pytest.raises(HubNotFoundError, match="has no GGUF called other.gguf"):
        client.file(REPO, "other.gguf")
    for bad in ("no-slash", "a/b/c", "../etc", "a/..", "a b/c"):
        with pytest.raises(HubError, match="not a Hugging Face repository name"):
            client.files(bad)
    with pytest.raises(HubError, match="not a file name"):
        client.file(REPO, "../../x.gguf")


@pytest.mark.parametrize("ref, words", [("HuggingFaceTB/x/y.gguf", "not a hub model"),
                                        ("hf:owner/repo", "names no GGUF"), ("hf:owner/repo/readme.md", "names no GGUF"),
                                        ("hf:bad owner/repo/x.gguf", "not a Hugging Face repository"),
                                        ("hf:o/r/../x.gguf", "not a file name")])
def test_bad_hub_references(ref, words):
    with pytest.raises(HubError, match=words):
        parse_hub_ref(ref)
    assert parse_hub_ref("hf:o/r/dir/x.gguf") == ("o/r", "dir/x.gguf")


# downloading -------------------------------------------------------------------------------------------------
def test_download_with_progress_and_speed_then_install(hub, paths, real_gguf):
    hub.add_repo(REPO, {REAL: real_gguf})
    client = HubClient(paths)
    seen = []
    file = client.file(REPO, REAL)
    model = client.install(file, seen.append)
    target = paths.models / REAL
    assert Path(model.path) == target and sha256(target) == sha256(real_gguf)
    assert model.source == ModelOrigin.HUB and model.status == ModelStatus.READY and model.quant == "Q4_1"
    assert seen[-1].done_bytes == seen[-1].total_bytes == real_gguf.stat().st_size
    assert all(p.parts == 1 and p.part == 1 and p.filename == REAL for p in seen)
    assert max(p.bytes_per_s for p in seen) > 0
    assert [p.done_bytes for p in seen] == sorted(p.done_bytes for p in seen)
    assert not (paths.models / ".downloads").exists()
    assert target.stat().st_mode & 0o077 == 0  # private
    library = ModelLibrary(paths)
    assert any(m.name == model.name and m.source == ModelOrigin.HUB for m in library.models())
    assert client.download(file) == target  # there already, verified: nothing downloaded again
    assert len(hub.downloads()) == 1
    library.remove(model.name)  # a hub model is Hearth's file: removing deletes it
    assert not target.exists()


def test_cancel_keeps_the_part_and_the_next_download_resumes_with_a_range(hub, paths, real_gguf):
    hub.add_repo(REPO, {REAL: real_gguf})
    client = HubClient(paths)
    file = client.file(REPO, REAL)
    token = CancelToken()

    def stop_soon(p):
        if p.done_bytes >= 3 << 20:
            token.cancel()

    with pytest.raises(DownloadCancelledError, match="kept to resume"):
        client.download(file, stop_soon, token)
    part = paths.models / ".downloads" / (REAL + ".part")
    kept = part.stat().st_size
    assert 0 < kept < file.size and not (paths.models / REAL).exists()
    path = client.download(file)
    assert hub.downloads()[-1]["range"] == f"bytes={kept}-"
    assert sha256(path) == file.sha256 and not part.exists()


def test_a_cut_connection_then_resume(hub, paths, real_gguf):
    hub.add_repo(REPO, {REAL: real_gguf})
    client = HubClient(paths)
    file = client.file(REPO, REAL)
    hub.cut_after = 5 << 20
    with pytest.raises(HubError, match="run it again to resume") as failed:
        client.download(file)
    assert not isinstance(failed.value, HubChecksumError)
    part = paths.models / ".downloads" / (REAL + ".part")
    kept = part.stat().st_size
    assert 0 < kept <= 5 << 20
    path = client.download(file)
    assert hub.downloads()[-1]["range"] == f"bytes={kept}-"
    assert sha256(path) == file.sha256


def test_a_wrong_sha256_is_refused_and_the_file_deleted(hub, paths, real_gguf):
    hub.add_repo(REPO, {REAL: real_gguf}, wrong_sha256=True)
    client = HubClient(paths)
    with pytest.raises(HubChecksumError, match="does not match the SHA-256.*deleted"):
        client.download(client.file(REPO, REAL))
    assert not (paths.models / REAL).exists()
    assert not list((paths.models / ".downloads").glob("*.part"))


def test_a_file_without_lfs_is_checked_by_its_git_hash(hub, paths, tiny_gguf):
    hub.add_repo("owner/tiny-GGUF", {"tiny.gguf": tiny_gguf}, lfs=False)
    client = HubClient(paths)
    file = client.file("owner/tiny-GGUF", "tiny.gguf")
    assert file.sha256 is None
    assert client.download(file).read_bytes() == tiny_gguf.read_bytes()


def test_a_full_disk_is_refused_before_downloading(hub, paths, real_gguf, monkeypatch):
    hub.add_repo(REPO, {REAL: real_gguf})
    client = HubClient(paths)
    file = client.file(REPO, REAL)
    real_usage = shutil.disk_usage
    monkeypatch.setattr(shutil, "disk_usage", lambda p: real_usage(p)._replace(free=1 << 20))
    with pytest.raises(HubError, match="not enough disk space"):
        client.download(file)
    assert hub.downloads() == []


def test_a_stale_part_from_another_file_is_caught_by_the_hash_then_starts_over(hub, paths, real_gguf):
    hub.add_repo(REPO, {REAL: real_gguf})
    client = HubClient(paths)
    file = client.file(REPO, REAL)
    part = paths.models / ".downloads" / (REAL + ".part")
    part.parent.mkdir(parents=True)
    part.write_bytes(b"\xff" * 1000)  # not the start of this file
    with pytest.raises(HubChecksumError, match="deleted"):
        client.download(file)
    assert hub.downloads()[-1]["range"] == "bytes=1000-" and not part.exists()
    assert sha256(client.download(file)) == file.sha256


def test_a_part_longer_than_the_file_is_dropped(hub, paths, tiny_gguf):
    hub.add_repo("owner/tiny-GGUF", {"tiny.gguf": tiny_gguf})
    client = HubClient(paths)
    part = paths.models / ".downloads" / "tiny.gguf.part"
    part.parent.mkdir(parents=True)
    part.write_bytes(b"x" * (tiny_gguf.stat().st_size + 10))
    assert client.download(client.file("owner/tiny-GGUF", "tiny.gguf")).read_bytes() == tiny_gguf.read_bytes()
    assert hub.downloads()[-1]["range"] is None


@pytest.mark.parametrize("delta, error, words", [(-100, HubChecksumError, "sent more than"),
                                                 (100, HubError, "run it again to resume")])
def test_a_file_not_the_size_listed(hub, paths, tiny_gguf, delta, error, words):
    hub.add_repo("owner/tiny-GGUF", {"tiny.gguf": tiny_gguf}, size_delta=delta)
    client = HubClient(paths)
    with pytest.raises(error, match=words):
        client.download(client.file("owner/tiny-GGUF", "tiny.gguf"))
    assert not (paths.models / "tiny.gguf").exists()


def test_a_file_listed_without_a_hash_is_not_kept(hub, paths, tiny_gguf):
    hub.add_repo("owner/tiny-GGUF", {"tiny.gguf": tiny_gguf}, no_hash=True)
    client = HubClient(paths)
    with pytest.raises(HubChecksumError, match="lists no hash"):
        client.download(client.file("owner/tiny-GGUF", "tiny.gguf"))
    assert not list(paths.models.rglob("tiny.gguf*")) and hub.downloads() == []


@pytest.mark.parametrize("status, error, words", [(404, HubNotFoundError, "is not in owner/tiny-GGUF"),
                                                  (500, HubError, "answered 500")])
def test_the_hub_refusing_the_file(hub, paths, tiny_gguf, status, error, words):
    hub.add_repo("owner/tiny-GGUF", {"tiny.gguf": tiny_gguf})
    client = HubClient(paths)
    file = client.file("owner/tiny-GGUF", "tiny.gguf")
    hub.resolve_status = status
    with pytest.raises(error, match=words):
        client.download(file)


def test_the_hub_failing_its_api(hub, paths):
    hub.api_status = 503
    with pytest.raises(HubError, match="answered 503 while searching"):
        HubClient(paths).search("smollm2")


def test_a_file_gone_since_it_was_listed(hub, paths, tiny_gguf):
    hub.add_repo("owner/tiny-GGUF", {"tiny.gguf": tiny_gguf})
    client = HubClient(paths)
    file = client.file("owner/tiny-GGUF", "tiny.gguf")
    del hub.repos["owner/tiny-GGUF"].files["tiny.gguf"]
    with pytest.raises(HubNotFoundError, match="no longer in owner/tiny-GGUF"):
        client.download(file)


def test_another_file_of_that_name_is_not_overwritten(hub, paths, tiny_gguf):
    hub.add_repo("owner/tiny-GGUF", {"tiny.gguf": tiny_gguf})
    mine = paths.models / "tiny.gguf"
    mine.write_bytes(b"my own file")
    client = HubClient(paths)
    with pytest.raises(HubError, match="already there"):
        client.download(client.file("owner/tiny-GGUF", "tiny.gguf"))
    assert mine.read_bytes() == b"my own file"


def test_one_download_of_a_file_at_a_time(hub, paths, tiny_gguf):
    from engine.hub_download import HubDownloadLock

    hub.add_repo("owner/tiny-GGUF", {"tiny.gguf": tiny_gguf})
    client = HubClient(paths)
    file = client.file("owner/tiny-GGUF", "tiny.gguf")
    (paths.models / ".downloads").mkdir()
    with HubDownloadLock(paths.models / ".downloads" / "tiny.gguf").held():
        with pytest.raises(HubError, match="another Hearth process is downloading tiny.gguf"):
            client.download(file)


# gated repositories and the token ----------------------------------------------------------------------------
def test_gated_repo_without_then_with_a_token(hub, paths, real_gguf, caplog):
    caplog.set_level("DEBUG")
    hub.add_repo("meta/Gated-GGUF", {REAL: real_gguf}, gated=True, token=TOKEN)
    client = HubClient(paths)
    file = client.file("meta/Gated-GGUF", REAL)  # the listing is public, as on the hub
    with pytest.raises(HubGatedError, match=r"meta/Gated-GGUF is gated: accept its terms on huggingface.co, then "
                                            r"add a token with 'hearth-cli hub login --token-file F'") as gated:
        client.download(file)
    assert gated.value.repo == "meta/Gated-GGUF"
    client.set_token("hf_wrong_token_123")
    with pytest.raises(HubGatedError, match="stored token may not open it"):
        client.download(file)
    client.set_token(TOKEN)
    assert client.has_token()
    model = client.install(file)
    assert sha256(Path(model.path)) == file.sha256
    assert hub.downloads()[-1]["authorized"]
    assert hub.downloads()[-1]["path"] == f"/meta/Gated-GGUF/resolve/{COMMIT}/{REAL}"  # the listed commit
    assert TOKEN not in caplog.text
    for f in paths.data.rglob("*"):
        if f.is_file() and f.name != "secrets.json" and f.stat().st_size < 50 << 20:
            assert TOKEN.encode() not in f.read_bytes(), f
    client.clear_token()
    assert not client.has_token()


def test_no_token_is_sent_to_a_public_repo_without_one(hub, paths, real_gguf, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_from_the_environment_not_hearths")
    hub.add_repo(REPO, {REAL: real_gguf})
    HubClient(paths).files(REPO)
    assert not any(r["authorized"] for r in hub.requests)


@pytest.mark.parametrize("token, words", [("", "empty"), ("two words", "spaces"), ("x" * 5000, "longer")])
def test_a_bad_token_is_refused(paths, token, words):
    with pytest.raises(SecretError, match=words):
        HubClient(paths).set_token(token)


# no network ---------------------------------------------------------------------------------------------------
def test_offline_is_a_plain_message_and_local_models_keep_working(paths, monkeypatch, tiny_gguf):
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{closed_port()}")
    ModelLibrary(paths).add(tiny_gguf)
    client = HubClient(paths)
    for call in (lambda: client.search("smollm2"), lambda: client.files(REPO)):
        with pytest.raises(HubOfflineError, match=r"cannot reach the Hugging Face Hub .*models already here keep working"):
            call()
    assert any(m.path == str(tiny_gguf) for m in ModelLibrary(paths).models())


def test_a_hub_that_never_answers_times_out(paths, monkeypatch):
    from huggingface_hub.utils import close_session

    import engine.hub

    silent = socket.socket()  # listens, never accepts: the connection opens, no answer ever comes
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{silent.getsockname()[1]}")
    monkeypatch.setattr(engine.hub, "API_TIMEOUT_S", 1.0)
    close_session()  # the next call makes a client with the short timeout
    try:
        with pytest.raises(HubOfflineError, match="cannot reach the Hugging Face Hub"):
            HubClient(paths).search("smollm2")
    finally:
        silent.close()
        monkeypatch.undo()
        close_session()


def test_a_server_that_is_not_the_hub(paths, monkeypatch, tmp_path):
    import http.server
    import threading

    class Junk(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Length", "5")
            self.end_headers()
            self.wfile.write(b"hello")

        def log_message(self, *a):
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Junk)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{httpd.server_address[1]}")
        with pytest.raises(HubError, match="cannot read"):
            HubClient(paths).files(REPO)
    finally:
        httpd.shutdown()
        httpd.server_close()


# split GGUFs ----------------------------------------------------------------------------------------------------
def test_a_split_gguf_is_fetched_joined_and_loads_as_one_model(hub, tiny_home, tiny_gguf, split_parts):
    paths = resolve_paths(tiny_home).ensure()
    hub.add_repo("owner/tiny-split-GGUF", {p.name: p for p in split_parts})
    client = HubClient(paths)
    file = client.file("owner/tiny-split-GGUF", split_parts[1].name)  # any part names the whole model
    seen = []
    model = client.install(file, seen.append)
    assert Path(model.path).name == "tiny-Q8_0.gguf"
    assert Path(model.path).read_bytes() == tiny_gguf.read_bytes()  # the join restores gguf-split's input exactly
    assert {p.part for p in seen} == {1, 2, 3} and seen[-1].done_bytes == seen[-1].total_bytes == file.size
    assert not (paths.models / ".downloads").exists()
    hearth = Hearth(paths, model=model.name, provider="cpu")
    try:
        hearth.load()
        reply = hearth.complete([{"role": "user", "content": "hi"}], SamplingParams.greedy_params(), max_new_tokens=4)
        assert reply.tokens
    finally:
        hearth.close()


def test_an_interrupted_split_download_keeps_finished_parts(hub, paths, split_parts):
    hub.add_repo("owner/tiny-split-GGUF", {p.name: p for p in split_parts})
    client = HubClient(paths)
    file = client.file("owner/tiny-split-GGUF", split_parts[0].name)
    token = CancelToken()
    with pytest.raises(DownloadCancelledError):
        client.download(file, lambda p: p.part == 2 and token.cancel(), token)
    assert (paths.models / ".downloads" / split_parts[0].name).is_file()
    before = len(hub.downloads())
    seen = []
    client.download(file, seen.append)
    assert seen[0].part == 1 and seen[0].done_bytes == split_parts[0].stat().st_size  # the kept part counts
    fetched = [r["path"].rsplit("/", 1)[-1] for r in hub.downloads()[before:]]
    assert split_parts[0].name not in fetched  # verified last time: not downloaded again


def test_parts_that_do_not_make_one_model_are_refused_and_deleted(hub, paths, split_parts, tiny_gguf):
    mixed = {split_parts[0].name: split_parts[0], split_parts[1].name: split_parts[2],
             split_parts[2].name: split_parts[1]}  # parts 2 and 3 swapped on the hub
    hub.add_repo("owner/tiny-split-GGUF", mixed)
    client = HubClient(paths)
    with pytest.raises(HubError, match="says it is part 3 of 3, not part 2 of 3; the downloaded parts were deleted"):
        client.download(client.file("owner/tiny-split-GGUF", split_parts[0].name))
    assert not list(paths.models.rglob("*.gguf*"))


def test_parts_out_of_order_or_not_split_are_refused(split_parts, tiny_gguf, tmp_path):
    with pytest.raises(HubError, match="says it is part 2 of 3, not part 1 of 3"):
        merge_split_gguf([split_parts[1], split_parts[0], split_parts[2]], tmp_path / "m.gguf")
    with pytest.raises(HubError, match="not a part of a split GGUF"):
        merge_split_gguf([tiny_gguf, split_parts[1], split_parts[2]], tmp_path / "m.gguf")
    with pytest.raises(HubError, match="not part 3 of 2|part 1 of 3, not part 1 of 2"):
        merge_split_gguf(split_parts[:2], tmp_path / "m.gguf")
    junk = tmp_path / "junk-00001-of-00001.gguf"
    junk.write_bytes(b"not a gguf at all")
    with pytest.raises(HubError, match="not a readable GGUF"):
        merge_split_gguf([junk], tmp_path / "m.gguf")
    assert not (tmp_path / "m.gguf").exists()


# hub models in the library ---------------------------------------------------------------------------------------
def test_the_library_keeps_hub_models_and_refuses_a_foreign_origin(paths, tiny_gguf):
    import json

    library = ModelLibrary(paths)
    with pytest.raises(ValueError):
        library.add(tiny_gguf, origin=ModelOrigin.CATALOG)
    copy = paths.models / "tiny-hub.gguf"
    shutil.copy(tiny_gguf, copy)
    model = library.add(copy, origin=ModelOrigin.HUB)
    assert model.source == ModelOrigin.HUB
    state = json.loads(library.state_file.read_text())
    assert state["added"] == [{"name": model.name, "path": str(copy), "copied": True, "origin": "hub"}]
    state["added"][0]["origin"] = "somewhere"  # a damaged or foreign state file
    library.state_file.write_text(json.dumps(state))
    assert all(m.name != model.name for m in library.models())
    assert library.state_file.with_name("library.json.bad").exists()
