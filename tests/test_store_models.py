"""Saved context per (conversation, model): two models' files side by side, shared prefixes per model,
files named by an older Hearth adopted, the store's model registry, and eviction of gone models first."""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path

import pytest

from engine.checkpoint.format import Reason
from engine.checkpoint.store import (
    CheckpointStore,
    conversation_file,
    legacy_conversation_file,
    model_tag,
)
from engine.generation import Engine
from engine.model.convert import ensure_converted
from engine.model.synthetic import SyntheticSpec, write_synthetic_gguf
from engine.session import COLD, DISK, LIVE, REBUILT, ChatSessions
from tests.checkpoint_names import conv_paths
from tests.dialogues import GREEDY, TURN1, TURN2

# An index as the store made it before labels were kept (the schema is the old one, verbatim).
OLD_INDEX = """
CREATE TABLE entries (name TEXT PRIMARY KEY, conversation TEXT, kind TEXT NOT NULL, tokens INTEGER NOT NULL,
    text_len INTEGER NOT NULL, text_sha BLOB NOT NULL, bytes INTEGER NOT NULL, model_fp BLOB NOT NULL,
    created_ms INTEGER NOT NULL, last_used_ms INTEGER NOT NULL, hits INTEGER NOT NULL DEFAULT 0,
    pinned INTEGER NOT NULL DEFAULT 0);
CREATE INDEX entries_by_conversation ON entries(conversation);
"""


@pytest.fixture(scope="module")
def other_gguf(tiny_dir) -> Path:
    """A second tiny model: the same tokenizer and template, other weights (so another fingerprint)."""
    return write_synthetic_gguf(tiny_dir / "models-other.gguf", SyntheticSpec(seed=11))


@pytest.fixture(scope="module")
def engines(tiny_converted, other_gguf, tiny_dir) -> tuple[Engine, Engine]:
    return (Engine.load(tiny_converted("int4"), "cpu"),
            Engine.load(ensure_converted(other_gguf, "int4", tiny_dir / "converted"), "cpu"))


def sessions(engine: Engine, root: Path) -> ChatSessions:
    engine.reset()
    return ChatSessions(engine, CheckpointStore(root), adaptive=False)


def turn(engine: Engine, root: Path, msgs: list[dict], conv: str = "c"):
    s = sessions(engine, root)
    result = s.generate(conv, msgs, GREEDY, 4)
    s.store.close()
    return result


def test_two_models_keep_their_own_context_of_one_chat(engines, tmp_path):
    a, b = engines
    first = turn(a, tmp_path, TURN1)
    assert turn(b, tmp_path, TURN1).resume.source == COLD  # a's file is not b's to read, nor to delete
    assert len(conv_paths(tmp_path, "c")) == 2
    back = turn(a, tmp_path, TURN2)
    assert back.resume.source == DISK and back.resume.reason is None
    assert back.resume.restored_tokens >= first.prompt_tokens
    assert back.resume.prefilled_tokens == back.prompt_tokens - back.resume.reused_tokens
    assert len(conv_paths(tmp_path, "c")) == 2
    store = CheckpointStore(tmp_path)
    assert {e.label for e in store.conversation_entries("c")} == {
        sessions(a, tmp_path).identity.label, sessions(b, tmp_path).identity.label}
    assert store.delete_conversation("c") == 2 and conv_paths(tmp_path, "c") == []  # forgetting takes every model's


def test_shared_prefixes_are_per_model(engines, tmp_path):
    a, b = engines
    turn(a, tmp_path, TURN1, "one")
    turn(b, tmp_path, TURN1, "one")
    prefixes = CheckpointStore(tmp_path).entries(kind="prefix")
    assert len(prefixes) == 2 and prefixes[0].text_sha == prefixes[1].text_sha  # one system prompt, two models
    assert {p.name.rsplit("-", 1)[1] for p in prefixes} == {f"{model_tag(p.model_fp)}.hkv" for p in prefixes}
    for engine in (a, b):  # a new chat with that system prompt starts from its own model's prefix
        s = sessions(engine, tmp_path)
        _, report = s.prepare("two", TURN1)
        mine = next(p for p in prefixes if p.model_fp == s.identity.model_fp)
        assert report.source == DISK and report.reason is None and report.restored_tokens == mine.tokens


def test_a_file_named_for_this_model_but_made_by_another_is_rebuilt(engines, tmp_path):
    a, b = engines
    turn(b, tmp_path, TURN1)
    theirs = sessions(b, tmp_path).store.path(conversation_file("c", sessions(b, tmp_path).identity.model_fp))
    mine = tmp_path / conversation_file("c", sessions(a, tmp_path).identity.model_fp)
    shutil.copyfile(theirs, mine)
    result = turn(a, tmp_path, TURN2)
    assert result.resume.source == REBUILT and result.resume.reason == Reason.MODEL_MISMATCH
    assert result.save.ok and theirs.exists()
    assert turn(a, tmp_path, TURN2).resume.source == DISK  # rebuilt for this model, and b's file untouched


def test_legacy_files_are_adopted_under_their_models_name_keeping_their_owner(engines, tmp_path):
    a, b = engines
    old = tmp_path / "old"
    new = tmp_path / "new"
    first = turn(a, new, TURN1)
    turn(b, new, TURN1, "b-chat")
    old.mkdir()
    fp_a, fp_b = sessions(a, new).identity.model_fp, sessions(b, new).identity.model_fp
    # What an older Hearth left: one file per conversation, no model in the name, an index without labels.
    shutil.copyfile(new / conversation_file("c", fp_a), old / legacy_conversation_file("c"))
    shutil.copyfile(new / conversation_file("b-chat", fp_b), old / legacy_conversation_file("b-chat"))
    (prefix,) = [e for e in CheckpointStore(new).entries(kind="prefix") if e.model_fp == fp_a]
    shutil.copyfile(new / prefix.name, old / f"prefix-{prefix.text_sha.hex()[:32]}.hkv")
    db = sqlite3.connect(old / "index.sqlite3")
    db.executescript(OLD_INDEX)
    db.execute("INSERT INTO entries VALUES (?, 'c', 'conversation', 1, 1, x'00', 1, x'00', 1, 1, 3, 1)",
               (legacy_conversation_file("c"),))
    db.commit()
    db.close()

    store = CheckpointStore(old)
    names = {p.name for p in old.glob("*.hkv")}
    assert names == {conversation_file("c", fp_a), conversation_file("b-chat", fp_b), prefix.name}
    adopted = store.entry(conversation_file("c", fp_a))
    assert adopted.conversation == "c" and adopted.hits == 3 and adopted.pinned  # the old row, renamed
    assert adopted.model_fp == fp_a and adopted.label == sessions(a, new).identity.label
    assert store.entry(conversation_file("b-chat", fp_b)).label == sessions(b, new).identity.label
    store.close()
    resumed = turn(a, old, TURN2)
    assert resumed.resume.source == DISK and resumed.resume.restored_tokens >= first.prompt_tokens


def test_an_unreadable_legacy_file_is_reported_and_rebuilt(engines, tmp_path):
    a, _ = engines
    (tmp_path / legacy_conversation_file("c")).write_bytes(b"HEARTHKV" + bytes(100))  # torn: no full header
    (tmp_path / f"prefix-{'ab' * 16}.hkv").write_bytes(b"junk")  # an unreadable shared prefix: no one to tell
    store = CheckpointStore(tmp_path)
    assert (tmp_path / legacy_conversation_file("c")).exists()  # kept for the session to judge and report
    assert not list(tmp_path.glob("prefix-*.hkv"))
    fp = sessions(a, tmp_path).identity.model_fp
    assert store.conversation_entry("c", fp).name == legacy_conversation_file("c")
    store.close()
    result = turn(a, tmp_path, TURN1)
    assert result.resume.source == REBUILT and result.resume.reason in {Reason.TRUNCATED, Reason.BAD_MAGIC}
    assert result.save.ok
    assert [p.name for p in conv_paths(tmp_path, "c")] == [conversation_file("c", fp)]
    assert not (tmp_path / legacy_conversation_file("c")).exists()


def test_a_legacy_file_beside_its_adopted_name_gives_way(engines, tmp_path):
    a, _ = engines
    turn(a, tmp_path, TURN2)
    fp = sessions(a, tmp_path).identity.model_fp
    current = (tmp_path / conversation_file("c", fp)).read_bytes()
    turn(a, tmp_path / "older", TURN1)
    shutil.copyfile(tmp_path / "older" / conversation_file("c", fp), tmp_path / legacy_conversation_file("c"))
    CheckpointStore(tmp_path).close()
    assert not (tmp_path / legacy_conversation_file("c")).exists()
    assert (tmp_path / conversation_file("c", fp)).read_bytes() == current  # the newer file is the one kept


def test_the_registry_names_models_and_tells_the_gone_ones(engines, tmp_path, tiny_gguf):
    a, _ = engines
    s = sessions(a, tmp_path)
    known = s.store.known_models()
    assert known[s.identity.model_fp.hex()].label == s.identity.label
    assert known[s.identity.model_fp.hex()].gguf == str(tiny_gguf.resolve())
    assert s.store.models.gone() == set()
    registry = json.loads((tmp_path / "models.json").read_text())
    registry["ff" * 32] = {"label": "Removed model int4", "gguf": str(tmp_path / "deleted.gguf"), "last_used_ms": 1}
    (tmp_path / "models.json").write_text(json.dumps(registry))
    assert s.store.models.gone() == {bytes.fromhex("ff" * 32)}


@pytest.mark.parametrize("content", [
    "{not json", "[1, 2]", json.dumps({"zz": {"label": "x", "gguf": None, "last_used_ms": 1}}),
    json.dumps({"ab" * 32: {"label": 5, "gguf": None, "last_used_ms": 1}}),
    json.dumps({"ab" * 32: {"label": "x", "gguf": ["/a"], "last_used_ms": 1}}),
    json.dumps({"ab" * 32: {"label": "x", "gguf": "/a\u0000b", "last_used_ms": 1}}),
    json.dumps({"ab" * 32: {"label": "x", "gguf": None, "last_used_ms": -4}}),
    " " * (2 << 20),
], ids=["not-json", "a-list", "bad-key", "bad-label", "bad-path", "nul-in-path", "bad-time", "too-large"])
def test_a_malformed_registry_reads_as_empty_and_is_rewritten(engines, tmp_path, content):
    a, _ = engines
    tmp_path.joinpath("models.json").write_text(content)
    store = CheckpointStore(tmp_path)
    assert store.known_models() == {} and store.models.gone() == set()
    s = ChatSessions(a, store, adaptive=False)  # noting the model replaces the bad file
    assert list(store.known_models()) == [s.identity.model_fp.hex()]
    assert s.generate("c", TURN1, GREEDY, 4).save.ok


def test_eviction_takes_the_files_of_gone_models_first(engines, tmp_path, other_gguf, tiny_dir):
    a, _ = engines
    doomed_gguf = tiny_dir / "models-doomed.gguf"  # a model whose GGUF will be deleted
    shutil.copyfile(other_gguf, doomed_gguf)
    doomed = Engine.load(ensure_converted(doomed_gguf, "int4", tiny_dir / "converted"), "cpu")
    for engine in (a, doomed):
        for conv in ("x", "y"):
            turn(engine, tmp_path, TURN1, conv)
    fp_a, fp_doomed = sessions(a, tmp_path).identity.model_fp, sessions(doomed, tmp_path).identity.model_fp
    store = CheckpointStore(tmp_path)
    with store._sql() as db:  # the doomed model's files are the most used; a's x the most recent
        db.execute("UPDATE entries SET hits = 50 WHERE model_fp = ?", (fp_doomed,))
        db.execute("UPDATE entries SET last_used_ms = last_used_ms + 60000 WHERE name = ?",
                   (conversation_file("x", fp_a),))
    entries = store.entries()
    now = max(e.last_used_ms for e in entries)
    assert min(entries, key=lambda e: e.score(now)).model_fp == fp_a  # by score alone, a's would go first
    doomed_names = {e.name for e in entries if e.model_fp == fp_doomed}
    assert len(doomed_names) == 3 and store.models.gone() == set()  # two chats and a shared prefix
    doomed_gguf.unlink()
    assert store.models.gone() == {fp_doomed}
    store.budget_bytes = store.total_bytes() - 1
    evicted = store.enforce_budget()
    assert len(evicted) == 1 and evicted[0] in doomed_names
    store.budget_bytes = sum(e.bytes for e in entries if e.model_fp == fp_a)
    evicted += store.enforce_budget()
    assert set(evicted) == doomed_names and {e.model_fp for e in store.entries()} == {fp_a}
    assert {f.name for f in tmp_path.glob("*.hkv")} == {e.name for e in entries if e.model_fp == fp_a}


def test_switching_conversations_on_one_model_still_resumes_live(engines, tmp_path):
    """The per-model names change nothing for a single model: live, then disk after a switch."""
    a, _ = engines
    s = sessions(a, tmp_path)
    s.generate("c", TURN1, GREEDY, 4)
    assert s.sync("c", TURN2)[2].source == LIVE
    s.sync("other", TURN1)
    assert s.sync("c", TURN2)[2].source == DISK


def test_prefill_rates_are_kept_per_model_and_the_disk_rate_per_provider(tmp_path):
    from engine.checkpoint.adaptive import DEFAULTS, Throughput

    path = tmp_path / "throughput.json"
    tiny = Throughput(path, "cpu", "aaaa")
    tiny.record_prefill(10_000, 10.0)  # a tiny model reads a million tokens a second
    tiny.record_restore(64 << 20, 100.0)
    tiny.flush()
    big = Throughput(path, "cpu", "bbbb")
    assert big.prefill_tps == DEFAULTS["cpu"][1]  # not the tiny model's: it would never restore from disk
    assert big.read_bps == tiny.read_bps != DEFAULTS["cpu"][0]  # one disk for every model
    big.record_prefill(1000, 5000.0)
    big.flush()
    assert Throughput(path, "cpu", "aaaa").prefill_tps == pytest.approx(tiny.prefill_tps)
    assert Throughput(path, "cpu", "bbbb").prefill_tps == pytest.approx(big.prefill_tps)
    path.write_text(json.dumps({"cpu": "not a dict", "cpu:aaaa": [1]}))  # a damaged file: the defaults
    assert Throughput(path, "cpu", "aaaa").prefill_tps == DEFAULTS["cpu"][1]


def test_a_registry_that_cannot_be_written_costs_nothing_but_the_names(engines, tmp_path, caplog):
    a, _ = engines
    (tmp_path / "models.json").mkdir()  # something that is neither readable as JSON nor replaceable
    store = CheckpointStore(tmp_path)
    s = ChatSessions(a, store, adaptive=False)
    assert "could not note the model" in caplog.text and store.known_models() == {}
    assert s.generate("c", TURN1, GREEDY, 4).save.ok  # saving context does not depend on it
    assert store.model_label(store.conversation_entry("c", s.identity.model_fp)) == s.identity.label  # from the header


def test_a_legacy_file_that_cannot_be_renamed_is_still_used(engines, tmp_path, caplog):
    import os
    import subprocess

    if os.geteuid() != 0 or shutil.which("chattr") is None:
        pytest.skip("needs root and chattr to make a file that cannot be renamed in a writable directory")
    a, _ = engines
    first = turn(a, tmp_path / "new", TURN1)
    fp = sessions(a, tmp_path / "new").identity.model_fp
    legacy = tmp_path / legacy_conversation_file("c")
    shutil.copyfile(tmp_path / "new" / conversation_file("c", fp), legacy)
    if subprocess.run(["chattr", "+i", str(legacy)]).returncode != 0:
        pytest.skip("this filesystem has no immutable attribute")
    try:
        CheckpointStore(tmp_path).close()
        assert "cannot adopt checkpoint" in caplog.text and legacy.exists()
        resumed = turn(a, tmp_path, TURN2)  # found under its old name, and used
        assert resumed.resume.source == DISK and resumed.resume.restored_tokens >= first.prompt_tokens
        assert (tmp_path / conversation_file("c", fp)).exists()  # saved under the new name
        caplog.clear()
        CheckpointStore(tmp_path).close()  # the old one cannot go yet either: said, not raised
        assert "cannot adopt checkpoint" in caplog.text
    finally:
        subprocess.run(["chattr", "-i", str(legacy)], check=False)
    CheckpointStore(tmp_path).close()
    assert not legacy.exists()
