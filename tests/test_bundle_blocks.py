"""Bundles of block-store chains (engine/bundle.py, engine/bundle_install.py): each block carried once,
verified on import like any saved context, deduplicated against the blocks already stored, and a block
from another installation never serving another chat. Real tiny model, real files and zips."""

from __future__ import annotations

import json
import shutil
import zipfile
from pathlib import Path

import numpy as np
import pytest

from engine.api import bundles
from engine.bundle import read_bundle
from engine.checkpoint.block_store import BlockStore
from engine.checkpoint.blocks import BlockFileReader, write_block
from engine.checkpoint.chain import read_chain
from engine.checkpoint.format import Identity
from engine.errors import TransferError
from engine.install_key import KEY_FILE
from engine.transfer import to_document
from engine.types import SamplingParams, TurnRequest

from .checkpoint_names import conv_paths
from .test_bundle_security import hearth_at, imported, make_home

DOC = "Owls hunt at night on silent feathers and nest in old hollow trees near the field."
A, B = "chat-a", "chat-b"


@pytest.fixture
def source(tmp_path, tiny_dir, tiny_gguf, tiny_converted) -> Path:
    """Two chats on one document: B's chain shares A's first block."""
    tiny_converted("int4")
    home = make_home(tmp_path / "source", tiny_dir)
    hearth = hearth_at(home, tiny_gguf)
    hearth.load()
    greedy = SamplingParams.greedy_params()
    hearth.run_turn(TurnRequest(A, f"{DOC}\n\nWhere do they nest?", greedy, 6), create=True)
    hearth.run_turn(TurnRequest(B, f"{DOC}\n\nWhen do they hunt?", greedy, 6), create=True)
    hearth.close()
    return home


def export(home: Path, tiny_gguf: Path, bundle: Path) -> None:
    hearth = hearth_at(home, tiny_gguf)
    try:
        assert bundles(hearth).export_bundle(bundle, to_document(hearth.conversations, [A, B]), [A, B]).contexts == 2
    finally:
        hearth.close()


def chain_of(home: Path, cid: str):
    [path] = conv_paths(home / "checkpoints", cid)
    return read_chain(path, 1 << 20)


def rewrite_entry(bundle: Path, out: Path, entry: str, change) -> None:
    """A copy of ``bundle`` with one entry's bytes passed through ``change`` (None: left out)."""
    with zipfile.ZipFile(bundle) as src, zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as dst:
        for info in src.infolist():
            data = src.read(info)
            if info.filename == entry:
                data = change(data)
                if data is None:
                    continue
            dst.writestr(info.filename, data)


def block_entries(bundle: Path) -> list[str]:
    with zipfile.ZipFile(bundle) as z:
        return [n for n in z.namelist() if n.startswith("blocks/")]


def shared_block(home: Path) -> str:
    a, b = chain_of(home, A), chain_of(home, B)
    shared = {n.physical for n in a.nodes} & {n.physical for n in b.nodes}
    assert shared, "the two chats share the document's block"
    return next(iter(shared)).hex()


def test_a_bundle_carries_each_block_once_and_its_import_shares_them_again(source, tmp_path, tiny_dir, tiny_gguf):
    bundle = tmp_path / "two.hearth"
    export(source, tiny_gguf, bundle)
    entries = block_entries(bundle)
    a, b = chain_of(source, A), chain_of(source, B)
    wanted = {n.physical.hex() for n in a.nodes} | {n.physical.hex() for n in b.nodes}
    assert sorted(entries) == sorted(f"blocks/{h}.hkb" for h in wanted)  # the shared block once
    with zipfile.ZipFile(bundle) as z:
        manifest = json.loads(z.read("manifest.json"))
    assert set(manifest["blocks"]) == wanted
    _, contexts = read_bundle(bundle)
    assert sorted(contexts.values()) == sorted([f"context/{A}.hkc", f"context/{B}.hkc"])

    target = make_home(tmp_path / "target", tiny_dir)
    shutil.copy(source / KEY_FILE, target / KEY_FILE)  # the same installation
    result = imported(target, tiny_gguf, bundle)
    assert len(result.used) == 2 and result.rebuilt == {}
    there = BlockStore(target / "checkpoints")
    assert there.total_bytes() == BlockStore(source / "checkpoints").total_bytes()  # each block stored once
    assert there.shared_bytes() > 0
    hearth = hearth_at(target, tiny_gguf)
    try:
        hearth.load()
        new_a = next(new for new, old in result.conversations.items() if old == A)
        assert hearth.open_conversation(new_a).source.value == "disk"
    finally:
        hearth.close()


def test_a_block_changed_in_a_signed_bundle_is_not_used(source, tmp_path, tiny_dir, tiny_gguf):
    bundle, bad = tmp_path / "good.hearth", tmp_path / "bad.hearth"
    export(source, tiny_gguf, bundle)
    hex_id = shared_block(source)
    rewrite_entry(bundle, bad, f"blocks/{hex_id}.hkb", lambda d: d[:-10] + bytes(x ^ 1 for x in d[-10:]))
    target = make_home(tmp_path / "target", tiny_dir)
    shutil.copy(source / KEY_FILE, target / KEY_FILE)
    result = imported(target, tiny_gguf, bad)
    assert result.used == () and set(result.rebuilt.values()) == {"untrusted"}
    assert "signed manifest" in " ".join(result.notes.values())
    assert BlockStore(target / "checkpoints").total_bytes() == 0  # nothing of it stayed


def test_a_damaged_block_in_a_trusted_bundle_is_refused_with_its_reason(source, tmp_path, tiny_dir, tiny_gguf):
    bundle, bad = tmp_path / "good.hearth", tmp_path / "bad.hearth"
    export(source, tiny_gguf, bundle)
    hex_id = shared_block(source)
    rewrite_entry(bundle, bad, f"blocks/{hex_id}.hkb", lambda d: d[:-10] + bytes(x ^ 1 for x in d[-10:]))
    result = imported(make_home(tmp_path / "target", tiny_dir), tiny_gguf, bad, trust=True)
    assert result.used == () and set(result.rebuilt.values()) == {"checksum"}


def test_a_forged_block_is_refused_even_with_every_checksum_recomputed(source, tmp_path, tiny_dir, tiny_gguf):
    """Other tokens in a block, resealed: its identity (parent and tokens) no longer matches its chain."""
    bundle, bad = tmp_path / "good.hearth", tmp_path / "bad.hearth"
    export(source, tiny_gguf, bundle)
    chain = chain_of(source, A)
    node = chain.nodes[0]
    store = BlockStore(source / "checkpoints")
    path = store.blocks_root / node.physical.hex()[:2] / f"{node.physical.hex()}.hkb"
    with BlockFileReader(path, node.physical, node.start) as reader:
        reader.read_header()
        [rec], _ = reader.scan()
        tokens = reader.read_tokens(rec, 1 << 31)
    s = chain.header.shape
    forged_file = tmp_path / "forged.hkb"
    rows = [np.full((rec.n_tokens, s.head_dim), 0.25, np.dtype(s.dtype)) for _ in range(2 * s.n_layers * s.n_kv_heads)]
    h = chain.header
    write_block(forged_file, Identity(h.model_fp, h.tokenizer_fp, s, h.label), h.layout, node.physical, node.start,
                tokens[::-1], rows)
    rewrite_entry(bundle, bad, f"blocks/{node.physical.hex()}.hkb", lambda d: forged_file.read_bytes())
    result = imported(make_home(tmp_path / "target", tiny_dir), tiny_gguf, bad, trust=True)
    assert result.used == () and set(result.rebuilt.values()) == {"prefix_mismatch"}


def test_a_missing_block_entry_is_refused(source, tmp_path, tiny_dir, tiny_gguf):
    bundle, bad = tmp_path / "good.hearth", tmp_path / "bad.hearth"
    export(source, tiny_gguf, bundle)
    rewrite_entry(bundle, bad, f"blocks/{shared_block(source)}.hkb", lambda d: None)
    result = imported(make_home(tmp_path / "target", tiny_dir), tiny_gguf, bad, trust=True)
    assert result.used == () and set(result.rebuilt.values()) == {"bundle_damaged"}


def test_blocks_already_stored_here_are_not_taken_from_the_bundle(source, tmp_path, tiny_gguf):
    """Importing into the installation that holds the blocks: a damaged copy in the bundle is never read;
    the store's own (verified on every read) serves."""
    bundle, bad = tmp_path / "good.hearth", tmp_path / "bad.hearth"
    export(source, tiny_gguf, bundle)
    rewrite_entry(bundle, bad, f"blocks/{shared_block(source)}.hkb", lambda d: b"\0" * len(d))
    before = BlockStore(source / "checkpoints").total_bytes()
    result = imported(source, tiny_gguf, bad, trust=True)
    assert len(result.used) == 2
    assert BlockStore(source / "checkpoints").total_bytes() >= before


def test_a_trusted_chain_from_another_installation_never_serves_another_chat(source, tmp_path, tiny_dir, tiny_gguf):
    bundle = tmp_path / "two.hearth"
    export(source, tiny_gguf, bundle)
    target = make_home(tmp_path / "target", tiny_dir)
    result = imported(target, tiny_gguf, bundle, trust=True)
    assert len(result.used) == 2
    hearth = hearth_at(target, tiny_gguf)
    try:
        hearth.load()
        greedy = SamplingParams.greedy_params()
        fresh = hearth.run_turn(TurnRequest("mine", f"{DOC}\n\nWhere do they nest?", greedy, 6), create=True)
        assert fresh.local.resume.source.value == "cold"  # the imported rows serve only their own chats
        new_a = next(new for new, old in result.conversations.items() if old == A)
        assert hearth.open_conversation(new_a).source.value == "disk"
    finally:
        hearth.close()


def test_an_entry_under_blocks_that_is_not_a_block_name_is_refused(source, tmp_path, tiny_gguf):
    bundle, bad = tmp_path / "good.hearth", tmp_path / "bad.hearth"
    export(source, tiny_gguf, bundle)
    with zipfile.ZipFile(bundle) as src, zipfile.ZipFile(bad, "w") as dst:
        for info in src.infolist():
            dst.writestr(info.filename, src.read(info))
        dst.writestr("blocks/../../evil.hkb", b"x")
    with pytest.raises(TransferError, match="unexpected entry"):
        read_bundle(bad)


def test_a_chain_entry_that_is_not_a_chain_is_refused(source, tmp_path, tiny_dir, tiny_gguf):
    bundle, bad = tmp_path / "good.hearth", tmp_path / "bad.hearth"
    export(source, tiny_gguf, bundle)
    rewrite_entry(bundle, bad, f"context/{A}.hkc", lambda d: b"HEARTHKC" + b"\xff" * 40)
    result = imported(make_home(tmp_path / "target", tiny_dir), tiny_gguf, bad, trust=True)
    new_a = next(new for new, old in result.conversations.items() if old == A)
    assert result.rebuilt[new_a] in {"too_large", "truncated", "version"}
