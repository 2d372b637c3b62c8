"""The block store (engine/checkpoint/block_store.py): saved context as chains of content-addressed blocks.

Real engine (the tiny synthetic model), real files and SQLite. Blocks are 16 tokens here so a short
dialogue spans several of them; the tiny model's context is 256 tokens.
"""

from __future__ import annotations

import numpy as np
import pytest

from engine.checkpoint.block_store import BlockStore
from engine.checkpoint.blocks import block_path, node_id, write_block
from engine.checkpoint.chain import ChainReader, read_chain
from engine.checkpoint.format import Reason
from engine.checkpoint.store import CheckpointStore
from engine.generation import Engine
from engine.session import DISK, REBUILT, ChatSessions
from tests.checkpoint_names import block_files, chain_block_paths
from tests.dialogues import GREEDY, SYSTEM

BLOCK = 16
DOC = "The lighthouse keeper counted ships each night in a ledger nobody read."


def ask(question: str, doc: str = DOC) -> list[dict]:
    return [SYSTEM, {"role": "user", "content": f"{doc}\n\n{question}"}]


@pytest.fixture
def engine(tiny_converted) -> Engine:
    return Engine.load(tiny_converted("int4"), "cpu")


def store_at(root, **kw) -> BlockStore:
    return BlockStore(root, block_tokens=kw.pop("block_tokens", BLOCK), **kw)


def sessions(engine, root, **kw) -> ChatSessions:
    return ChatSessions(engine, store_at(root, **kw), adaptive=False)


def reply(s: ChatSessions, conv: str, messages: list[dict]):
    return s.generate(conv, messages, GREEDY, 6)


def saved_blocks(engine, root, conv: str = "c") -> list:
    """One chat answered and closed: the block files its chain reads, in order."""
    s = sessions(engine, root)
    reply(s, conv, ask("Who kept the ledger?"))
    s.close()
    return chain_block_paths(root, root / s.store.record_name(conv, s.identity.model_fp))


# sharing ------------------------------------------------------------------------------------------------
def test_a_second_chat_on_the_same_document_reads_only_its_question(engine, tmp_path):
    s = sessions(engine, tmp_path)
    first = reply(s, "one", ask("Who kept the ledger?"))
    after_one = s.store.total_bytes()
    second = reply(s, "two", ask("What froze?"))
    assert first.resume.source != DISK
    assert second.resume.source == DISK and second.resume.shared_prefix
    question_tokens = len(engine.tokenizer.encode("What froze?")) + 12  # + the template's end of turn
    assert second.resume.prefilled_tokens <= question_tokens, second.resume
    added = s.store.total_bytes() - after_one
    assert added < after_one * 0.5, (added, after_one)  # the document's blocks are stored once
    shares = s.store.shares()
    assert sum(sh.bytes for sh in shares.values()) == pytest.approx(s.store.total_bytes(), abs=len(shares))
    assert all(sh.shared > 0 for sh in shares.values())


def test_the_reply_with_reused_blocks_is_the_reply_without_them(engine, tmp_path):
    warm = sessions(engine, tmp_path / "warm")
    reply(warm, "one", ask("Who kept the ledger?"))
    shared = reply(warm, "two", ask("What froze?"))
    assert shared.resume.source == DISK
    cold = reply(sessions(engine, tmp_path / "cold"), "two", ask("What froze?"))
    assert cold.resume.source != DISK
    assert shared.generation.tokens == cold.generation.tokens


def test_a_chat_that_begins_like_another_shares_the_rows_where_they_part(engine, tmp_path):
    """Parting inside a block: the new chain takes that block's first rows (a prefix node), no copy."""
    s = sessions(engine, tmp_path)
    reply(s, "one", ask("Who kept the ledger?"))
    before = s.store.stats()["bytes_written"]
    files_before = set(block_files(tmp_path))
    two = reply(s, "two", ask("Who kept the ledger? And why?"))
    assert two.resume.source == DISK
    chain = read_chain(tmp_path / s.store.record_name("two", s.identity.model_fp), 1 << 20)
    prefix_nodes = [n for n in chain.nodes if n.physical != n.id]
    assert prefix_nodes, "the chains part inside a block: the second uses that block's first rows"
    assert all(block_path(tmp_path / "blocks", n.physical) in files_before for n in prefix_nodes)
    new_files = set(block_files(tmp_path)) - files_before
    written = s.store.stats()["bytes_written"] - before
    assert written == sum(p.stat().st_size for p in new_files)
    assert written < 0.5 * sum(p.stat().st_size for p in files_before)


def test_a_branch_copy_names_the_same_blocks(engine, tmp_path):
    s = sessions(engine, tmp_path)
    reply(s, "source", ask("Who kept the ledger?"))
    s.close()
    total, files = s.store.total_bytes(), block_files(tmp_path)
    copy = s.store.copy(s.store.record_name("source", s.identity.model_fp), "branch")
    assert copy is not None and copy.conversation == "branch"
    assert s.store.total_bytes() == total and block_files(tmp_path) == files
    again = sessions(engine, tmp_path)
    _, _, report = again.sync("branch", ask("Who kept the ledger?"))
    assert report.source == DISK and report.restored_tokens > 0


def test_a_turn_writes_only_its_new_rows(engine, tmp_path):
    s = sessions(engine, tmp_path)
    first = reply(s, "c", ask("Who kept the ledger?"))
    messages = ask("Who kept the ledger?") + [{"role": "assistant", "content": first.generation.text},
                                              {"role": "user", "content": "Say more."}]
    before = s.store.stats()["bytes_written"]
    second = reply(s, "c", messages)
    written = s.store.stats()["bytes_written"] - before
    per_token = s.identity.shape.bytes_per_token
    new_tokens = second.save.new_tokens
    assert new_tokens > 0
    # the rows of the new tokens, plus a header per block file written (384 bytes) and 4 bytes per token id
    blocks = written // (per_token * BLOCK) + 2
    assert written <= new_tokens * (per_token + 4) + blocks * 384, (written, new_tokens, per_token)


# verification ----------------------------------------------------------------------------------------------
def _flip(path, offset_from_end: int) -> None:
    data = bytearray(path.read_bytes())
    data[-offset_from_end] ^= 0x20
    path.write_bytes(bytes(data))


def test_a_damaged_block_is_never_used_and_the_turn_rebuilds_with_the_reason(engine, tmp_path):
    s = sessions(engine, tmp_path)
    first = reply(s, "c", ask("Who kept the ledger?"))
    s.close()
    name = s.store.record_name("c", s.identity.model_fp)
    blocks = chain_block_paths(tmp_path, tmp_path / name)
    _flip(blocks[2], 10)  # a row of the third block
    again = sessions(engine, tmp_path)
    result = reply(again, "c", ask("Who kept the ledger?"))
    assert result.resume.source == REBUILT and result.resume.reason == Reason.CHECKSUM
    assert "damaged" in result.resume.plain
    assert result.generation.tokens == first.generation.tokens  # the same reply, from verified rows only
    cold = reply(sessions(engine, tmp_path / "cold"), "c", ask("Who kept the ledger?"))
    assert result.generation.tokens == cold.generation.tokens
    # the damaged block was dropped and written again by the rebuild's save
    reader = ChainReader(tmp_path / "blocks", tmp_path / name)
    with reader:
        records, problem = reader.verify_all(engine.tokenizer.vocab_size)
    assert problem is None and records


def test_a_forged_block_is_never_used(engine, tmp_path):
    """A block file rewritten with other tokens and every checksum recomputed still fails: its identity
    is the hash of its parent and its tokens."""
    s = sessions(engine, tmp_path)
    reply(s, "c", ask("Who kept the ledger?"))
    s.close()
    name = s.store.record_name("c", s.identity.model_fp)
    chain = read_chain(tmp_path / name, 1 << 20)
    node = chain.nodes[1]
    path = block_path(tmp_path / "blocks", node.physical)
    with ChainReader(tmp_path / "blocks", tmp_path / name) as reader:
        reader.scan()
        tokens = reader.node_tokens(1, engine.tokenizer.vocab_size)
    shape = s.identity.shape
    forged = [np.full((node.n_tokens, shape.head_dim), 0.5, np.float32) for _ in range(2 * shape.n_layers * shape.n_kv_heads)]
    write_block(path, s.identity, chain.header.layout, node.physical, node.start, [t ^ 1 for t in tokens], forged)
    again = sessions(engine, tmp_path)
    _, _, report = again.sync("c", ask("Who kept the ledger?"))
    assert report.source == REBUILT and report.reason == Reason.PREFIX_MISMATCH
    assert report.reused_tokens <= node.start  # nothing from the forged block or after it


def test_a_truncated_or_missing_block_cuts_the_chain_back(engine, tmp_path):
    blocks = saved_blocks(engine, tmp_path)
    blocks[-1].write_bytes(blocks[-1].read_bytes()[:500])
    _, _, report = sessions(engine, tmp_path).sync("c", ask("Who kept the ledger?"))
    assert report.source == REBUILT and report.reason == Reason.TRUNCATED
    blocks[1].unlink()
    _, _, report = sessions(engine, tmp_path).sync("c", ask("Who kept the ledger?"))
    assert report.reused_tokens < BLOCK * 2


def test_a_damaged_chain_file_is_reported_and_its_sound_blocks_still_serve(engine, tmp_path):
    s = sessions(engine, tmp_path)
    reply(s, "c", ask("Who kept the ledger?"))
    s.close()
    path = tmp_path / s.store.record_name("c", s.identity.model_fp)
    _flip(path, 20)
    _, _, report = sessions(engine, tmp_path).sync("c", ask("Who kept the ledger?"))
    assert report.source == REBUILT and report.reason == Reason.CHECKSUM
    assert report.restored_tokens > 0  # the blocks themselves verify: another chain's walk uses them


# eviction and garbage --------------------------------------------------------------------------------------
def test_eviction_never_drops_a_block_a_kept_context_needs(engine, tmp_path):
    s = sessions(engine, tmp_path)
    reply(s, "one", ask("Who kept the ledger?"))
    reply(s, "two", ask("What froze?"))
    s.close()
    store = store_at(tmp_path)
    one = store.record_name("one", s.identity.model_fp)
    two = store.record_name("two", s.identity.model_fp)
    store.touch(two)  # "two" is the most recent: eviction keeps it
    needed = set(chain_block_paths(tmp_path, tmp_path / two))
    store.set_budget(store.total_bytes() - 1)
    evicted = store.enforce_budget()
    assert evicted == [one]
    assert needed <= set(block_files(tmp_path))  # the shared document blocks stayed
    assert set(block_files(tmp_path)) == needed  # only what "one" alone used went
    with ChainReader(tmp_path / "blocks", tmp_path / two) as reader:
        assert reader.verify_all(engine.tokenizer.vocab_size)[1] is None


def test_removing_every_record_frees_every_block(engine, tmp_path):
    s = sessions(engine, tmp_path)
    reply(s, "one", ask("Who kept the ledger?"))
    reply(s, "two", ask("What froze?"))
    s.close()
    store = store_at(tmp_path)
    for cid in ("one", "two"):
        store.delete_conversation(cid)
    for e in store.entries():
        store.remove(e.name)
    assert store.total_bytes() == 0 and block_files(tmp_path) == []


def test_blocks_left_by_a_crash_before_their_chain_are_swept(engine, tmp_path):
    s = sessions(engine, tmp_path)
    reply(s, "c", ask("Who kept the ledger?"))
    s.close()
    stray = block_path(tmp_path / "blocks", b"\x07" * 32)
    stray.parent.mkdir(parents=True, exist_ok=True)
    stray.write_bytes(b"left by a crash")
    (stray.parent / ".tmp-block.tmp").write_bytes(b"x")
    store_at(tmp_path)
    assert not stray.exists() and not (stray.parent / ".tmp-block.tmp").exists()


def test_a_lost_index_is_rebuilt_from_the_chain_and_block_files(engine, tmp_path):
    s = sessions(engine, tmp_path)
    reply(s, "one", ask("Who kept the ledger?"))
    s.close()
    total = s.store.total_bytes()
    s.store.close()
    for p in tmp_path.glob("index.sqlite3*"):
        p.unlink()
    again = sessions(engine, tmp_path)
    assert again.store.total_bytes() == total
    result = reply(again, "two", ask("What froze?"))
    assert result.resume.source == DISK and result.resume.shared_prefix


# old checkpoint files ---------------------------------------------------------------------------------------
def test_a_checkpoint_file_from_before_the_block_store_serves_until_the_next_save_replaces_it(engine, tmp_path):
    old = ChatSessions(engine, CheckpointStore(tmp_path), adaptive=False)
    first = reply(old, "c", ask("Who kept the ledger?"))
    old.close()
    old.store.close()
    legacy = tmp_path / old.store.record_name("c", old.identity.model_fp)
    assert legacy.exists()
    s = sessions(engine, tmp_path)
    messages = ask("Who kept the ledger?") + [{"role": "assistant", "content": first.generation.text},
                                              {"role": "user", "content": "Say more."}]
    result = reply(s, "c", messages)
    assert result.resume.source == DISK and result.resume.restored_tokens > 0
    assert not legacy.exists()  # replaced by the chain the save wrote
    chain = tmp_path / s.store.record_name("c", s.identity.model_fp)
    assert chain.exists()
    _, _, report = sessions(engine, tmp_path).sync("c", messages)
    assert report.source == DISK


# usage --------------------------------------------------------------------------------------------------------
def test_usage_counts_each_block_once_and_the_rows_add_up(engine, tmp_path):
    s = sessions(engine, tmp_path)
    for i, q in enumerate(("Who kept the ledger?", "What froze?", "Who read it?")):
        reply(s, f"c{i}", ask(q))
    s.close()
    store = store_at(tmp_path)
    on_disk = sum(p.stat().st_size for p in block_files(tmp_path))
    assert store.total_bytes() == on_disk
    assert sum(store.bytes_by_kind().values()) == pytest.approx(on_disk, abs=10)
    assert 0 < store.shared_bytes() < on_disk
    assert store.stats()["bytes_written"] == on_disk


# the block format --------------------------------------------------------------------------------------------
def test_a_block_renamed_to_another_blocks_name_does_not_verify(engine, tmp_path):
    paths = saved_blocks(engine, tmp_path)
    paths[3].write_bytes(paths[2].read_bytes())
    _, _, report = sessions(engine, tmp_path).sync("c", ask("Who kept the ledger?"))
    assert report.source == REBUILT and report.reason == Reason.CHECKSUM


def test_identities_chain_to_everything_before(engine, tmp_path):
    a = node_id(b"\0" * 32, 0, [1, 2, 3])
    assert a == node_id(b"\0" * 32, 0, [1, 2, 3])
    assert a != node_id(b"\1" + b"\0" * 31, 0, [1, 2, 3])
    assert a != node_id(b"\0" * 32, 16, [1, 2, 3])
    assert a != node_id(b"\0" * 32, 0, [1, 2, 4])


def test_the_browsers_disk_line_says_what_is_stored_once():
    from app.browser_widgets import usage_text
    from engine.types import StoreUsage

    line = usage_text(StoreUsage(300 << 20, 2 << 30, {"conversation": 300 << 20}, shared=120 << 20, written=300 << 20))
    assert line.startswith("Saved context: 300.0 MiB of 2,048 MiB") and "120.0 MiB of it shared by several chats" in line
    assert "shared" not in usage_text(StoreUsage(300 << 20, 2 << 30, {"conversation": 300 << 20}))


# documents: a new chat with the same files ----------------------------------------------------------------
def test_a_new_chat_with_the_same_documents_reads_only_its_question(hearth):
    """Item 5: the files come first in the composed message, so a chat with the same files (and system
    prompt) restores the other chat's blocks for all of them and prefills only its own question."""
    from engine.api import attachment_from_text
    from engine.types import TurnRequest

    doc = attachment_from_text("ledger.txt", DOC + " The ledger listed forty ships and one whale.")
    first = hearth.run_turn(TurnRequest("one", "Who kept it?", GREEDY, 4, attachments=(doc,)), create=True)
    assert first.local.resume.source.value == "cold"
    usage_before = hearth.checkpoints.total_bytes()
    second = hearth.run_turn(TurnRequest("two", "How many ships?", GREEDY, 4, attachments=(doc,)), create=True)
    resume = second.local.resume
    assert resume.source.value == "disk" and resume.restored_tokens > 0
    question = len(hearth._engine.tokenizer.encode("How many ships?"))
    assert resume.prefilled_tokens <= question + 12, resume  # + the template's end of turn
    assert hearth.checkpoints.total_bytes() - usage_before < usage_before  # the files' blocks stored once
    assert second.reply


def test_int8_blocks_are_shared_and_verified_too(engine, tmp_path):
    """The int8 encoding (a quarter of float32's bytes) through the block store: shared across chats,
    its own root (blocks of another encoding never mix), a damaged one refused with its reason."""
    s = ChatSessions(engine, store_at(tmp_path), adaptive=False, kv_encoding="int8")
    reply(s, "one", ask("Who kept the ledger?"))
    two = reply(s, "two", ask("What froze?"))
    assert two.resume.source == DISK and two.resume.shared_prefix
    s.close()
    chain = read_chain(tmp_path / s.store.record_name("two", s.identity.model_fp), 1 << 20)
    assert chain.header.encoding == "int8"
    exact = sessions(engine, tmp_path)  # exact rows are another root: the int8 blocks' walk does not serve them
    _, _, other = exact.sync("three", ask("What froze?"))
    assert other.restored_tokens < two.resume.restored_tokens  # at most the system prompt's own record
    paths = chain_block_paths(tmp_path, tmp_path / s.store.record_name("two", s.identity.model_fp))
    _flip(paths[1], 30)
    again = ChatSessions(engine, store_at(tmp_path), adaptive=False, kv_encoding="int8")
    _, _, report = again.sync("two", ask("What froze?"))
    assert report.source == REBUILT and report.reason in (Reason.CHECKSUM, Reason.LAYOUT)


def test_api_requests_sharing_a_system_prompt_store_it_once(hearth, monkeypatch):
    """The server's prompt cache goes through the same restore and saves: a request with the same system
    prompt and another question restores the first request's blocks and stores only its own tail."""
    from engine.session.prompt_cache import PromptCache
    from engine.types import ServeRequest

    monkeypatch.setattr(PromptCache, "save_block", 32)  # the save policy scaled to the tiny model's context
    monkeypatch.setattr(PromptCache, "save_tail", 4)
    system = {"role": "system", "content": DOC + " Answer in one word."}

    def ask_server(question: str):
        return hearth.serve(ServeRequest(messages=(system, {"role": "user", "content": question}), params=GREEDY,
                                         max_tokens=4))

    ask_server("Who kept the ledger?")
    after_one = hearth.checkpoints.total_bytes()
    assert after_one > 0
    second = ask_server("What did it list?")
    assert second.cache.source.value == "disk" and second.cache.cached_tokens > 0
    hearth._sessions.save("switch")  # what the server does when another conversation takes the engine
    assert hearth.checkpoints.total_bytes() < 1.5 * after_one  # the system prompt's blocks once
    assert hearth.checkpoints.shared_bytes() > 0
