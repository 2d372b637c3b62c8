"""Hostile ``.hearth`` bundles (issue 15): forged contexts, zip bombs, lying sizes, broken zips, and
``hearth-cli bundle`` end to end. Real files, a real tiny model, real SQLite; nothing mocked."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import struct
import time
import zipfile
import zlib
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.api import Hearth, bundles
from engine.bundle import MAC, MANIFEST, read_bundle, write_bundle
from engine.bundle_install import FOREIGN, install_contexts
from engine.checkpoint.format import HEADER_SIZE, Identity
from engine.checkpoint.reader import CheckpointReader
from engine.checkpoint.status import VALID, checkpoint_status
from engine.checkpoint.store import CheckpointStore
from engine.checkpoint.writer import NewRecord, write_new
from engine.errors import HearthError, TransferError
from engine.install_key import KEY_FILE, install_key
from engine.paths import resolve_paths
from engine.transfer import to_document
from engine.types import ReplyFacts, SamplingParams, TurnRequest

from .checkpoint_names import as_checkpoint_file, conv_paths
from .test_cli import assert_clean_error, run_cli

A, B = "conv-a", "conv-b"


def make_home(root: Path, tiny_dir: Path) -> Path:
    """An empty data dir that shares the tiny model's conversions."""
    root.mkdir(parents=True)
    (root / "converted").symlink_to(tiny_dir / "converted")
    return root


def hearth_at(home: Path, tiny_gguf: Path) -> Hearth:
    return Hearth(resolve_paths(home).ensure(), model=str(tiny_gguf), weights="int4", provider="cpu")


@pytest.fixture(scope="module")
def source(tmp_path_factory, tiny_dir, tiny_gguf, tiny_converted):
    """An installation with two chats and their saved contexts; A's is longer than B's."""
    tiny_converted("int4")
    home = make_home(tmp_path_factory.mktemp("source") / "home", tiny_dir)
    hearth = hearth_at(home, tiny_gguf)
    hearth.load()
    greedy = SamplingParams.greedy_params()
    hearth.run_turn(TurnRequest(A, "Tell me all about owls, their feathers, their nests and the night.", greedy, 8),
                    create=True)
    hearth.run_turn(TurnRequest(B, "Hi.", greedy, 4), create=True)
    hearth.close()
    return home


@pytest.fixture
def target(tmp_path, tiny_dir):
    """Another installation (its own key) on the same model."""
    return make_home(tmp_path / "target", tiny_dir)


def store_path(home: Path, cid: str) -> Path:
    """The conversation's one saved context as a checkpoint file (every home here runs the tiny model; a
    chain of the block store is exported as a bundle carries it); with none, a path that does not exist."""
    found = conv_paths(home / "checkpoints", cid)
    assert len(found) <= 1, found
    return as_checkpoint_file(found[0]) if found else home / "checkpoints" / "absent.hkv"


def document(home: Path, ids: list[str]) -> dict:
    hearth = Hearth(resolve_paths(home))
    try:
        return to_document(hearth.conversations, ids)
    finally:
        hearth.close()


def read_rows(path: Path):
    """(header, records, every KV row as one array [layer, k/v head, position, dim], every token) of a sound checkpoint."""
    with CheckpointReader(path) as r:
        h = r.read_header()
        records, problem = r.scan()
        assert problem is None
        s = h.shape
        rows = np.zeros((s.n_layers, 2 * s.n_kv_heads, records[-1].end, s.head_dim), np.dtype(s.dtype))
        _, problem = r.load_rows(records, lambda start, end: [rows[layer, k, start:end] for layer in range(s.n_layers)
                                                              for k in range(2 * s.n_kv_heads)])
        assert problem is None
        tokens = [t for rec in records for t in r.read_tokens(rec, 1 << 31)]
    return h, records, rows, tokens


def forge(a_path: Path, b_path: Path, out: Path) -> None:
    """The attack: A's KV rows labelled with B's tokens and text hash, every checksum recomputed."""
    ha, _, rows, _ = read_rows(a_path)
    s = ha.shape
    with CheckpointReader(b_path) as rb:
        rb.read_header()
        records_b, _ = rb.scan()
        tokens_b = [t for r in records_b for t in rb.read_tokens(r, 1 << 31)]
    n, last = len(tokens_b), records_b[-1]
    assert n <= rows.shape[2]
    blocks = [np.ascontiguousarray(rows[layer, h, :n]) for layer in range(s.n_layers) for h in range(2 * s.n_kv_heads)]
    identity = Identity(ha.model_fp, ha.tokenizer_fp, ha.shape, ha.label)
    write_new(out, identity, [NewRecord(0, tokens_b, blocks, last.text_len, last.text_sha, "turn")])


@pytest.fixture
def forged_bundle(source, tmp_path) -> Path:
    forged = tmp_path / "forged.hkv"
    forge(store_path(source, A), store_path(source, B), forged)
    bundle = tmp_path / "forged.hearth"
    write_bundle(bundle, document(source, [B]), {B: forged}, os.urandom(32))  # another installation's key
    return bundle


def imported(home: Path, tiny_gguf: Path, bundle: Path, trust: bool = False):
    hearth = hearth_at(home, tiny_gguf)
    try:
        return bundles(hearth).import_bundle(bundle, trust=trust)
    finally:
        hearth.close()


def leftovers(home: Path) -> list[str]:
    return sorted(p.name for p in (home / "checkpoints").glob("*") if p.suffix in (".hkv", ".tmp"))


# the installation key ------------------------------------------------------------------------------------------
def test_the_key_is_made_once_private_and_kept(tmp_path):
    key = install_key(tmp_path)
    assert len(key) == 32 and (tmp_path / KEY_FILE).stat().st_mode & 0o777 == 0o600
    assert install_key(tmp_path) == key
    assert not [p for p in tmp_path.iterdir() if p.name != KEY_FILE]  # no temp file left


def test_a_damaged_key_is_a_clear_error(tmp_path):
    (tmp_path / KEY_FILE).write_bytes(b"short")
    with pytest.raises(TransferError, match="is damaged"):
        install_key(tmp_path)


# the forgery (item 1) -----------------------------------------------------------------------------------------
def test_a_forged_context_verifies_but_is_not_used_without_trust(source, target, tiny_gguf, forged_bundle, tmp_path):
    forged = tmp_path / "forged.hkv"
    identity = Identity(*_identity_of(store_path(source, B)))
    assert checkpoint_status(forged, identity, 1 << 31, full=True)[0] == VALID  # checksums cannot tell
    result = imported(target, tiny_gguf, forged_bundle)
    (new,) = result.conversations
    assert result.used == () and result.rebuilt == {new: "untrusted"} and result.notes[new] == FOREIGN
    assert leftovers(target) == []  # not installed; rebuilt from the transcript when opened


def test_a_forged_context_is_used_when_the_user_trusts_the_bundle(source, target, tiny_gguf, forged_bundle):
    result = imported(target, tiny_gguf, forged_bundle, trust=True)
    (new,) = result.conversations
    assert result.trusted and result.used == (new,) and "trusted by you" in result.notes[new]
    assert store_path(target, new).exists()
    hearth = hearth_at(target, tiny_gguf)
    hearth.load()
    resume = hearth.open_conversation(new)  # the model now holds A's rows under B's transcript
    hearth.close()
    assert resume.source == "disk" and resume.prefilled_tokens == 0


def _identity_of(path: Path):
    with CheckpointReader(path) as r:
        h = r.read_header()
    return h.model_fp, h.tokenizer_fp, h.shape, h.label


def test_a_bundle_exported_here_has_its_contexts_used(source, target, tiny_gguf, tiny_dir, tmp_path):
    bundle = tmp_path / "mine.hearth"
    hearth = hearth_at(source, tiny_gguf)
    assert bundles(hearth).export_bundle(bundle, document(source, [A, B]), [A, B]).contexts == 2
    hearth.close()
    shutil.copy(source / KEY_FILE, target / KEY_FILE)  # the same installation's key
    result = imported(target, tiny_gguf, bundle)
    assert set(result.used) == {A, B} and result.rebuilt == {}
    # the same tokens and rows arrived (a chain is exported afresh each time: its ids and times differ)
    got, sent = read_rows(store_path(target, A)), read_rows(store_path(source, A))
    assert got[3] == sent[3] and np.array_equal(got[2], sent[2])
    # Another installation gets the same bundle's contexts rebuilt.
    other = imported(make_home(tmp_path / "other", tiny_dir), tiny_gguf, bundle)
    assert other.used == () and set(other.rebuilt.values()) == {"untrusted"}


def reply_facts(home: Path, cid: str) -> dict:
    hearth = Hearth(resolve_paths(home))
    try:
        return hearth.conversations.reply_facts(cid)
    finally:
        hearth.close()


def test_a_bundle_carries_each_replys_model_and_finish_and_an_older_one_without_them_imports(source, target, tiny_gguf,
                                                                                            tiny_dir, tmp_path):
    """Issue 27 item 19: the captions under replies survive a bundle; bundles from before them import as before."""
    bundle = tmp_path / "facts.hearth"
    wrote = reply_facts(source, A)
    assert wrote[1].model and wrote[1].finish == "length"  # 8 tokens of the tiny model: the length limit
    hearth = hearth_at(source, tiny_gguf)
    bundles(hearth).export_bundle(bundle, document(source, [A]), [A])
    hearth.close()
    imported(target, tiny_gguf, bundle)
    assert reply_facts(target, A) == wrote
    old = document(source, [A])
    for m in old["conversations"][0]["messages"]:
        m.pop("model", None), m.pop("finish_reason", None)
    write_bundle(tmp_path / "old.hearth", old, {}, None)
    other = make_home(tmp_path / "other", tiny_dir)
    assert imported(other, tiny_gguf, tmp_path / "old.hearth").used == ()
    assert reply_facts(other, A) == {1: ReplyFacts(1, None, "")}


def rewrite(bundle: Path, out: Path, change) -> None:
    """Copy ``bundle`` entry by entry, passing each (name, bytes) through ``change``."""
    with zipfile.ZipFile(bundle) as src, zipfile.ZipFile(out, "w") as dst:
        for info in src.infolist():
            name, data = change(info.filename, src.read(info))
            dst.writestr(name, data)


def test_a_tampered_manifest_fails_the_mac(source, target, tiny_gguf, tmp_path):
    bundle, forged = tmp_path / "mine.hearth", tmp_path / "forged.hkv"
    hearth = hearth_at(source, tiny_gguf)
    bundles(hearth).export_bundle(bundle, document(source, [B]), [B])
    hearth.close()
    shutil.copy(source / KEY_FILE, target / KEY_FILE)
    forge(store_path(source, A), store_path(source, B), forged)
    payload = forged.read_bytes()

    def swap(name: str, data: bytes):  # the forged context, and the manifest edited to match it
        if name == MANIFEST:
            m = json.loads(data)
            m["contexts"][B].update(sha256=hashlib.sha256(payload).hexdigest(), bytes=len(payload))
            return name, json.dumps(m, sort_keys=True).encode()
        return name, payload if name.startswith("context/") else data

    rewrite(bundle, tmp_path / "tampered.hearth", swap)
    result = imported(target, tiny_gguf, tmp_path / "tampered.hearth")
    assert result.used == () and set(result.rebuilt.values()) == {"untrusted"}
    # A context swapped under an untouched signed manifest fails its listed SHA-256.
    rewrite(bundle, tmp_path / "swapped.hearth", lambda n, d: (n, payload if n.startswith("context/") else d))
    result = imported(target, tiny_gguf, tmp_path / "swapped.hearth")
    assert result.used == () and set(result.rebuilt.values()) == {"untrusted"}
    assert leftovers(target) == []


@pytest.mark.filterwarnings("ignore:Duplicate name")
def test_an_unsigned_bundle_and_an_edited_transcript_are_untrusted(source, target, tiny_gguf, tmp_path):
    bundle = tmp_path / "mine.hearth"
    hearth = hearth_at(source, tiny_gguf)
    bundles(hearth).export_bundle(bundle, document(source, [B]), [B])
    hearth.close()
    shutil.copy(source / KEY_FILE, target / KEY_FILE)
    rewrite(bundle, tmp_path / "unsigned.hearth", lambda n, d: (n, d) if n != MAC else ("manifest.json", d))
    with pytest.raises(TransferError, match="twice"):  # two manifests: refused outright
        read_bundle(tmp_path / "unsigned.hearth")
    with zipfile.ZipFile(bundle) as z, zipfile.ZipFile(tmp_path / "nomac.hearth", "w") as out:
        for info in z.infolist():
            if info.filename != MAC:
                out.writestr(info.filename, z.read(info))
    assert set(imported(target, tiny_gguf, tmp_path / "nomac.hearth").rebuilt.values()) == {"untrusted"}

    def edit(name: str, data: bytes):
        return name, data.replace(b"Hi.", b"Yo.") if name == "conversations.json" else data

    rewrite(bundle, tmp_path / "edited.hearth", edit)
    assert set(imported(target, tiny_gguf, tmp_path / "edited.hearth").rebuilt.values()) == {"untrusted"}


# extraction bounds (item 2) ------------------------------------------------------------------------------------
def raw_zip(path: Path, entries: list[tuple]) -> None:
    """A zip written field by field: (name, data as stored, method, declared size, crc, flags) per entry,
    so sizes, methods and flags can say whatever a hostile file says."""
    out, central = bytearray(), bytearray()
    for name, data, method, size, crc, flags in entries:
        n = name.encode()
        offset = len(out)
        out += struct.pack("<4s5H3L2H", b"PK\x03\x04", 20, flags, method, 0, 33, crc, len(data), size, len(n), 0) + n + data
        central += struct.pack("<4s6H3L5H2L", b"PK\x01\x02", 20, 20, flags, method, 0, 33, crc, len(data), size,
                               len(n), 0, 0, 0, 0, 0, offset) + n
    eocd = struct.pack("<4s4H2LH", b"PK\x05\x06", 0, 0, len(entries), len(entries), len(central), len(out), 0)
    path.write_bytes(bytes(out + central + eocd))


def stored(name: str, data: bytes) -> tuple:
    return name, data, 0, len(data), zlib.crc32(data), 0


def deflated_zeros(head: bytes, mib: int) -> bytes:
    """A raw deflate stream of ``head`` then ``mib`` MiB of zeros, built in milliseconds: after a full
    flush a segment does not depend on what came before, so one 1 MiB segment repeats."""
    c = zlib.compressobj(9, zlib.DEFLATED, -15)
    first = c.compress(head) + c.flush(zlib.Z_FULL_FLUSH)
    zero = c.compress(bytes(1 << 20)) + c.flush(zlib.Z_FULL_FLUSH)
    return first + zero * mib + c.flush()


def bomb_bundle(source: Path, path: Path, declared: int, mib: int = 1024) -> None:
    head = store_path(source, B).read_bytes()[:HEADER_SIZE]  # a genuine header: only the size can give it away
    doc = json.dumps(document(source, [B])).encode()
    raw_zip(path, [stored("conversations.json", doc), (f"context/{B}.hkv", deflated_zeros(head, mib), 8, declared, 0, 0)])


@pytest.mark.parametrize("declared,reason", [(1 << 30, "too_large"), (100_000, "bundle_damaged"), (300, "bundle_damaged")])
def test_a_zip_bomb_fails_fast_and_leaves_nothing(source, target, tiny_gguf, tmp_path, declared, reason):
    """1 GiB of zeros in a ~1 MB bundle: declared as is (over what this model's context can hold), as
    a small size the stream runs past (stopped at the budget; its CRC fails), or one below any checkpoint
    (zipfile reads it whole with the header, so its CRC fails first)."""
    bundle = tmp_path / "bomb.hearth"
    bomb_bundle(source, bundle, declared)
    assert bundle.stat().st_size < 2 << 20
    start = time.monotonic()
    result = imported(target, tiny_gguf, bundle, trust=True)
    assert time.monotonic() - start < 10
    (new,) = result.conversations
    assert result.used == () and result.rebuilt == {new: reason}, result.notes
    assert leftovers(target) == []


def test_a_declared_size_that_disagrees_with_the_header_is_refused(source, target, tiny_gguf, tmp_path):
    data = store_path(source, B).read_bytes()
    doc = json.dumps(document(source, [B])).encode()
    for declared, reason in ((len(data) + 7, "truncated"), (len(data) - 7, "bundle_damaged")):
        bundle = tmp_path / f"lie-{declared}.hearth"
        raw_zip(bundle, [stored("conversations.json", doc), (f"context/{B}.hkv", data, 0, declared, zlib.crc32(data), 0)])
        result = imported(target, tiny_gguf, bundle, trust=True)
        assert list(result.rebuilt.values()) == [reason], result.notes
    assert leftovers(target) == []


def test_a_context_that_is_not_a_checkpoint_is_refused_before_extraction(source, target, tiny_gguf, tmp_path):
    doc = json.dumps(document(source, [B])).encode()
    bundle = tmp_path / "junk.hearth"
    raw_zip(bundle, [stored("conversations.json", doc), stored(f"context/{B}.hkv", b"junk" * 1000)])
    result = imported(target, tiny_gguf, bundle, trust=True)
    assert list(result.rebuilt.values()) == ["bad_magic"] and leftovers(target) == []


# zip errors (item 4, bundle part) ------------------------------------------------------------------------------
def _doc(source: Path) -> bytes:
    return json.dumps(document(source, [B])).encode()


@pytest.mark.parametrize("case,needle", [
    ("not_zip", "not a zip archive"),
    ("truncated_zip", "not a zip archive"),
    ("encrypted", "is encrypted"),
    ("unknown_method", "compression method 99"),
    ("corrupt_deflate", "corrupt compressed data"),
    ("bad_crc", "damaged"),
])
def test_zip_errors_become_one_clear_error_and_import_nothing(source, target, tiny_gguf, tmp_path, case, needle):
    doc = _doc(source)
    path = tmp_path / "bad.hearth"
    if case == "not_zip":
        path.write_bytes(b"PK\x03\x04 not really")
    elif case == "truncated_zip":
        raw_zip(path, [stored("conversations.json", doc)])
        path.write_bytes(path.read_bytes()[:-30])
    elif case == "encrypted":
        raw_zip(path, [(*stored("conversations.json", doc)[:5], 1)])
    elif case == "unknown_method":
        raw_zip(path, [("conversations.json", doc, 99, len(doc), zlib.crc32(doc), 0)])
    elif case == "corrupt_deflate":
        raw_zip(path, [("conversations.json", b"\xff" * 64, 8, len(doc), zlib.crc32(doc), 0)])
    else:
        raw_zip(path, [("conversations.json", doc, 0, len(doc), zlib.crc32(doc) ^ 1, 0)])
    with pytest.raises(TransferError, match=needle):
        read_bundle(path)
    with pytest.raises(TransferError):
        imported(target, tiny_gguf, path)
    assert Hearth(resolve_paths(target)).conversations.ids() == set()  # nothing half-imported


def test_a_corrupt_context_entry_is_rebuilt_and_leaves_nothing(source, target, tiny_gguf, tmp_path):
    data = store_path(source, B).read_bytes()
    c = zlib.compressobj(9, zlib.DEFLATED, -15)
    packed = bytearray(c.compress(data) + c.flush())
    packed[len(packed) // 2 : len(packed) // 2 + 16] = b"\xff" * 16
    path = tmp_path / "bad-context.hearth"
    raw_zip(path, [stored("conversations.json", _doc(source)), (f"context/{B}.hkv", bytes(packed), 8, len(data),
                                                                  zlib.crc32(data), 0)])
    result = imported(target, tiny_gguf, path, trust=True)
    (new,) = result.conversations
    assert result.rebuilt == {new: "bundle_damaged"} and "damaged" in result.notes[new]
    assert leftovers(target) == []


# fuzzing: only the project's own errors come out --------------------------------------------------------------
FUZZ = settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@FUZZ
@given(data=st.binary(max_size=2048))
def test_random_bytes_are_refused_with_a_transfer_error(tmp_path, data):
    path = tmp_path / "random.hearth"
    path.write_bytes(data)
    with pytest.raises(TransferError):
        read_bundle(path)


@pytest.fixture(scope="module")
def fuzz_base(source, tmp_path_factory, tiny_gguf):
    """A genuine signed bundle, the key that signed it and this model's identity."""
    from engine.checkpoint.identity import gguf_identity

    bundle = tmp_path_factory.mktemp("fuzz") / "base.hearth"
    hearth = hearth_at(source, tiny_gguf)
    bundles(hearth).export_bundle(bundle, document(source, [B]), [B])
    hearth.close()
    return bundle.read_bytes(), install_key(source), gguf_identity(tiny_gguf, "int4")


@FUZZ
@given(edits=st.lists(st.tuples(st.floats(0, 1, exclude_max=True), st.integers(0, 255)), min_size=1, max_size=8),
       cut=st.one_of(st.none(), st.floats(0, 1)), trust=st.booleans())
def test_mutated_bundles_raise_only_hearth_errors(fuzz_base, tmp_path, edits, cut, trust):
    base, key, (identity, vocab) = fuzz_base
    data = bytearray(base)
    for where, value in edits:
        data[int(where * len(data))] = value
    if cut is not None:
        data = data[: int(cut * len(data))]
    path = tmp_path / "mutated.hearth"
    path.write_bytes(bytes(data))
    store = CheckpointStore(tmp_path / "store")
    try:
        convs, entries = read_bundle(path)
        report = install_contexts(path, entries, {c: "owner" for c in entries}, store, identity, vocab, key, trust)
        assert set(report.used) | set(report.rebuilt) == ({"owner"} if entries else set())
    except HearthError:
        pass
    finally:
        store.close()
    assert not list((tmp_path / "store").glob(".*.tmp"))


# hearth-cli bundle (item 8) -------------------------------------------------------------------------------------
def test_cli_export_then_import_reports_each_conversation(source, target, tiny_gguf, tmp_path):
    out = tmp_path / "cli.hearth"
    exported = run_cli("bundle", "export", A, B, "--out", str(out), "--json", home=source)
    assert exported.returncode == 0, exported.stderr
    assert json.loads(exported.stdout) == {"path": str(out), "conversations": 2, "contexts": 2}
    foreign = run_cli("bundle", "import", str(out), "--json", "--model", str(tiny_gguf), home=target)
    assert foreign.returncode == 0, foreign.stderr
    report = json.loads(foreign.stdout)
    assert report["imported"] == 2 and report["contexts_used"] == 0 and not report["trusted"]
    assert {r["original_id"] for r in report["conversations"]} == {A, B}
    assert all(r["context"] == "rebuilt" and r["reason"] == "untrusted" and r["message"] == FOREIGN
               for r in report["conversations"])
    mine = run_cli("bundle", "import", str(out), "--duplicates", "copy", "--json", "--model", str(tiny_gguf),
                   home=source)
    rows = json.loads(mine.stdout)["conversations"]
    assert [r["context"] for r in rows] == ["used", "used"] and all(r["id"] != r["original_id"] for r in rows)


def test_cli_import_of_a_forgery_with_and_without_trust(source, target, tiny_gguf, forged_bundle):
    plain = json.loads(run_cli("bundle", "import", str(forged_bundle), "--json", "--model", str(tiny_gguf),
                               home=target).stdout)
    assert [(r["context"], r["reason"]) for r in plain["conversations"]] == [("rebuilt", "untrusted")]
    # The same bundle again: its chat is here now, so the next imports ask for copies.
    human = run_cli("bundle", "import", str(forged_bundle), "--duplicates", "copy", "--model", str(tiny_gguf),
                    home=target)
    assert human.returncode == 0 and FOREIGN in human.stdout
    trusted = json.loads(run_cli("bundle", "import", str(forged_bundle), "--trust-contexts", "--duplicates", "copy",
                                 "--json", "--model", str(tiny_gguf), home=target).stdout)
    assert trusted["trusted"] and [r["context"] for r in trusted["conversations"]] == ["used"]


@pytest.mark.parametrize("args,needle", [
    (["bundle", "import", "/nonexistent.hearth"], "no such file"),
    (["bundle", "export", "nope", "--out", "x.hearth"], "no conversation 'nope'"),
    (["bundle", "export", "bad id!", "--out", "x.hearth"], "bad id!"),
])
def test_cli_bad_input_gets_one_clear_error(target, args, needle):
    assert_clean_error(run_cli(*args, home=target), needle)


def test_cli_import_of_a_broken_bundle_is_one_clear_error(target, tmp_path):
    path = tmp_path / "broken.hearth"
    raw_zip(path, [("conversations.json", b"\xff" * 64, 8, 100, 0, 0)])
    assert_clean_error(run_cli("bundle", "import", str(path), home=target), "corrupt compressed data")


def test_cli_import_without_a_model_keeps_the_chats_and_rebuilds(source, target, forged_bundle, tmp_path):
    proc = run_cli("bundle", "import", str(forged_bundle), "--trust-contexts", "--json", "--model",
                   str(tmp_path / "missing.gguf"), home=target)
    assert proc.returncode == 0, proc.stderr
    (row,) = json.loads(proc.stdout)["conversations"]
    assert (row["context"], row["reason"]) == ("rebuilt", "no_model") and "no model" in row["message"]
    assert leftovers(target) == []


def test_cli_export_to_an_unwritable_place_is_one_clear_error(source, tmp_path):
    (tmp_path / "file").write_text("x")
    assert_clean_error(run_cli("bundle", "export", A, "--out", str(tmp_path / "file" / "x.hearth"), home=source),
                       "cannot write")


def test_a_mac_that_is_not_ascii_hex_refuses_the_bundle_before_any_chat_is_stored(source, target, tiny_gguf, tmp_path):
    """Issue 27: ``manifest.mac`` of ``b"\\xff" * 64`` reached hmac.compare_digest (TypeError: "internal
    error") after the chats were committed. It is refused while reading, before the first write."""
    bundle, bad = tmp_path / "mine.hearth", tmp_path / "badmac.hearth"
    hearth = hearth_at(source, tiny_gguf)
    bundles(hearth).export_bundle(bundle, document(source, [B]), [B])
    hearth.close()
    rewrite(bundle, bad, lambda n, d: (n, b"\xff" * 64 if n == MAC else d))
    with pytest.raises(TransferError, match="manifest.mac in badmac.hearth is not a signature"):
        read_bundle(bad)
    for extra in ([], ["--trust-contexts"]):
        proc = run_cli("bundle", "import", str(bad), *extra, "--model", str(tiny_gguf), home=target, timeout=120)
        assert_clean_error(proc, "manifest.mac in badmac.hearth is not a signature")
    hearth = Hearth(resolve_paths(target))
    try:
        assert hearth.conversations.ids() == set()
    finally:
        hearth.close()
    assert leftovers(target) == []


def reseal_with_nan(src: Path, out: Path) -> None:
    """A real checkpoint's own rows with one value NaN and one infinite, every checksum recomputed."""
    def poison(rows: np.ndarray) -> None:
        rows[0, 0, 0, 0], rows[-1, -1, -1, -1] = np.nan, np.inf

    reseal(src, out, poison)


def reseal(src: Path, out: Path, poison) -> None:
    """A real checkpoint's own rows changed by ``poison`` (in place), every checksum recomputed."""
    h, records, rows, tokens = read_rows(src)
    s = h.shape
    poison(rows)
    blocks = [np.ascontiguousarray(rows[layer, k]) for layer in range(s.n_layers) for k in range(2 * s.n_kv_heads)]
    last = records[-1]
    write_new(out, Identity(h.model_fp, h.tokenizer_fp, h.shape, h.label),
              [NewRecord(0, tokens, blocks, last.text_len, last.text_sha, "turn")])


def test_a_resealed_context_holding_nan_is_damaged_and_its_chat_is_rebuilt(source, target, tiny_gguf, tmp_path):
    """Issue 27: a checkpoint resealed with NaN rows passed ``kv verify`` and ``--trust-contexts``; every
    later turn then failed with "NaN… run with --weights int4" though the model already ran int4."""
    bad = tmp_path / "nan.hkv"
    reseal_with_nan(store_path(source, B), bad)
    proc = run_cli("kv", "verify", str(bad), "--json", "--model", str(tiny_gguf), home=target, timeout=120)
    assert proc.returncode == 1, proc.stderr
    (row,) = json.loads(proc.stdout)["files"]
    assert (row["status"], row["reason"]) == ("damaged", "non_finite") and "NaN or infinity" in row["message"]
    bundle = tmp_path / "nan.hearth"
    write_bundle(bundle, document(source, [B]), {B: bad}, os.urandom(32))
    result = imported(target, tiny_gguf, bundle, trust=True)
    (new,) = result.conversations
    assert result.used == () and result.rebuilt == {new: "non_finite"}, result
    assert leftovers(target) == []
    hearth = hearth_at(target, tiny_gguf)  # the chat goes on: rebuilt from its transcript
    try:
        hearth.load()
        hearth.run_turn(TurnRequest(new, "And now?", SamplingParams.greedy_params(), 4))
    finally:
        hearth.close()


def test_a_context_of_finite_values_that_give_nan_is_deleted_and_rebuilt(source, target, tiny_gguf, tmp_path, caplog):
    """Rows that verify (finite, checksums resealed) but overflow the attention: the turn rebuilds the
    context from the transcript instead of failing, and the file is replaced rather than kept."""
    bad = tmp_path / "huge.hkv"

    def poison(rows: np.ndarray) -> None:
        rows[:, :, 0, :] = np.finfo(rows.dtype).max

    reseal(store_path(source, B), bad, poison)
    bundle = tmp_path / "huge.hearth"
    write_bundle(bundle, document(source, [B]), {B: bad}, os.urandom(32))
    (new,) = imported(target, tiny_gguf, bundle, trust=True).used
    hearth = hearth_at(target, tiny_gguf)
    try:
        hearth.load()
        with caplog.at_level("WARNING"):
            turn = hearth.run_turn(TurnRequest(new, "And now?", SamplingParams.greedy_params(), 4))
        assert turn.reply and "its saved context gave invalid numbers; deleting it" in caplog.text
    finally:
        hearth.close()
    with CheckpointReader(store_path(target, new)) as r:
        h = r.read_header()
        records, problem = r.scan()
        s = h.shape
        rows = np.zeros((s.n_layers, 2 * s.n_kv_heads, records[-1].end, s.head_dim), np.dtype(s.dtype))
        r.load_rows(records, lambda start, end: [rows[layer, k, start:end] for layer in range(s.n_layers)
                                                 for k in range(2 * s.n_kv_heads)])
    assert problem is None and np.abs(rows).max() < 1e6  # the saved context is the rebuilt one
