"""The storage-tier interface (engine/checkpoint/tier.py) on both tiers: the file store and the in-memory
one (tests/memory_tier.py). Restore, damage and eviction run on both in test_sessions, test_fault_injection
and test_store; here: what those do not reach — the protocol itself, copying a record to a branch,
bundles in and out through a tier, and a restore walking more than one tier."""

from __future__ import annotations

import functools

import pytest

from engine.bundle import write_bundle
from engine.bundle_install import install_contexts
from engine.checkpoint.format import Reason
from engine.checkpoint.status import DAMAGED, VALID, record_status
from engine.checkpoint.store import CheckpointStore
from engine.checkpoint.tier import StorageTier
from engine.generation import Engine
from engine.session import DISK, REBUILT, ChatSessions, prefix
from engine.session.restore import Restorer
from tests.dialogues import GREEDY, TURN1, TURN2
from tests.memory_tier import MemoryTier
from tests.tier_helpers import TIER_KINDS, Tiers

FOLLOW = TURN2


@pytest.fixture(params=TIER_KINDS)
def tiers(request) -> Tiers:
    return Tiers(request.param)


@pytest.fixture
def engine(tiny_converted) -> Engine:
    return Engine.load(tiny_converted("int4"), "cpu")


def test_both_tiers_implement_the_protocol(tmp_path):
    assert isinstance(CheckpointStore(tmp_path / "file"), StorageTier)
    assert isinstance(MemoryTier(tmp_path / "memory"), StorageTier)


def test_a_copied_record_serves_the_branch(engine, tmp_path, tiers):
    s = ChatSessions(engine, tiers.open(tmp_path), adaptive=False)
    s.generate("source", TURN1, GREEDY, 4)
    s.close()
    name = s.store.record_name("source", s.identity.model_fp)
    copy = s.store.copy(name, "branch")
    assert copy is not None and copy.conversation == "branch" and copy.name == s.store.record_name("branch", s.identity.model_fp)
    assert tiers.read_bytes(tmp_path, copy.name) == tiers.read_bytes(tmp_path, name)
    assert s.store.copy("nothing-such", "x") is None
    again = ChatSessions(engine, tiers.open(tmp_path), adaptive=False)
    _, _, report = again.sync("branch", FOLLOW)
    assert report.source == DISK and report.restored_tokens > 0


def test_a_bundle_leaves_one_tier_and_enters_another(engine, tmp_path, tiers):
    """Export reads a record through its tier's ``read_stream``; import stages and installs it through
    the receiving tier, after the full verification."""
    source = ChatSessions(engine, tiers.open(tmp_path / "from"), adaptive=False)
    source.generate("c", TURN1, GREEDY, 4)
    source.close()
    name = source.store.record_name("c", source.identity.model_fp)
    bundle = tmp_path / "b.hearth"
    assert write_bundle(bundle, {"conversations": []}, {"c": functools.partial(source.store.read_stream, name)}, None) == 1
    receiving = Tiers("memory" if tiers.kind == "file" else "file").open(tmp_path / "to")
    report = install_contexts(bundle, {"c": "context/c.hkv"}, {"c": "new"}, receiving, source.identity,
                              engine.tokenizer.vocab_size, b"k" * 32, trust=True)
    assert report.used == ["new"], report.notes
    entry = receiving.conversation_entry("new", source.identity.model_fp)
    assert entry is not None and entry.tokens == source.store.entry(name).tokens
    _, _, resumed = ChatSessions(engine, receiving, adaptive=False).sync("new", FOLLOW)
    assert resumed.source == DISK and 0 < resumed.restored_tokens <= entry.tokens  # the prompt's frontier


def test_the_restorer_walks_the_tiers_in_order(engine, tmp_path):
    """A record the first tier lacks is served by the next; a damaged one in the first is reported,
    removed there, and the next tier still serves the conversation."""
    ram, files = MemoryTier(tmp_path / "ram"), CheckpointStore(tmp_path / "files")
    writer = ChatSessions(engine, files, adaptive=False)
    writer.generate("c", TURN1, GREEDY, 4)
    writer.close()
    name = files.record_name("c", writer.identity.model_fp)

    def restore(tiers: list[StorageTier]):
        s = ChatSessions(engine, tiers[0], adaptive=False)
        text = engine.render(FOLLOW).encode()
        restorer = Restorer(engine, tiers, s.identity, s.throughput, s._files, False)
        return restorer.restore("c", text, prefix.lead_tokens(engine.tokenizer, text), live_is_ours=False)

    tokens = restore([files]).restored_tokens  # the prompt's frontier (the reply is not in FOLLOW)
    assert tokens > 0
    report = restore([ram, files])
    assert report.source == DISK and report.restored_tokens == tokens  # the RAM tier had none: the files served
    damaged = bytearray(files.read_stream(name).read())
    damaged[20] ^= 0x10  # the header's checked bytes
    ram.plant(name, bytes(damaged))
    report = restore([ram, files])
    assert report.source == REBUILT and report.reason == Reason.CHECKSUM  # the damage is reported
    assert report.restored_tokens == tokens and not ram.has(name)  # the RAM copy went; the file served


def test_a_records_status_is_judged_by_the_same_reader_on_every_tier(engine, tmp_path, tiers):
    s = ChatSessions(engine, tiers.open(tmp_path), adaptive=False)
    s.generate("c", TURN1, GREEDY, 4)
    s.close()
    name = s.store.record_name("c", s.identity.model_fp)
    status, problem, tokens = record_status(s.store, name, s.identity, engine.tokenizer.vocab_size, full=True)
    assert status == VALID and problem is None and tokens == s.store.entry(name).tokens
    data = bytearray(tiers.read_bytes(tmp_path, name))
    data[-3] ^= 0x10  # a row of the last record
    tiers.forget(tmp_path)
    tiers.plant(tmp_path, name, bytes(data))
    status, problem, _ = record_status(tiers.open(tmp_path), name, s.identity, engine.tokenizer.vocab_size, full=True)
    assert status == DAMAGED and problem.reason == Reason.CHECKSUM
