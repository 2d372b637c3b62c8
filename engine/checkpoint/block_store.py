"""The block store: saved context as chains of content-addressed blocks, each block stored once.

The storage tier Hearth saves to (engine/checkpoint/tier.py). A record (a conversation's context
under a model, a shared prefix, a branch of the server's prompt cache) is a chain file
(engine/checkpoint/chain.py) naming its blocks (engine/checkpoint/blocks.py). Writing a record walks
the blocks already stored from the model's root, as a radix tree: where the new tokens continue a
stored block the block is reused, where they diverge inside one the chain takes its first rows (a
prefix node, no bytes written), and only the rest is written, cut into blocks of ``block_tokens``
at absolute positions. So a save writes only rows no record holds yet, and five chats on one
document hold it once.

``match`` answers "which stored blocks serve this prompt" for any prompt, whoever saved them: the
longest chain of blocks whose tokens are the prompt's, ending with the first rows of the block where
they part. The restorer loads it (verified block by block) when it beats what the conversation's own
record or the live KV has.

The index (the same SQLite file as the record index) knows every node (identity, parent, position,
tokens, block file) and which records use which nodes; it is rebuilt from the chain and block files
when lost. A block is kept while a record reaches it: eviction drops records by the file store's
policy, then every block no record reaches (``collect``). Usage counts each block once; a record's
share of a block is its size divided among the records that use it, so the shares add up to the total.

Checkpoint files (``.hkv``) written before the block store are read as they are (the file store's
reader) until the record is next saved: the save writes the chain and the old file goes.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import shutil
import tempfile
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np

from engine.bundle import ChainContext
from engine.checkpoint import writer
from engine.checkpoint.blocks import BLOCK_SUFFIX, Node, block_path, node_id, root_id, write_block
from engine.checkpoint.chain import (
    CHAIN_SUFFIX,
    Chain,
    ChainReader,
    Frontier,
    pack_chain,
    read_chain,
    records_of,
    unpack_chain,
)
from engine.checkpoint.format import (
    CheckpointError,
    FileHeader,
    Identity,
    RecordInfo,
    encoding_layout,
)
from engine.checkpoint.reader import CheckpointReader
from engine.checkpoint.store import (
    SUFFIX,
    CheckpointStore,
    Entry,
    Share,
    conversation_file,
    conversation_key,
    eviction_order,
    unknown_entry,
)
from engine.checkpoint.tier import Written
from engine.fsutil import atomic_write

log = logging.getLogger(__name__)

# 256 tokens: the common choice (vLLM uses 16 in GPU memory, LMCache 256 on disk). On SmolLM2-135M a
# block is 11.8 MB exact; restoring 8,000 tokens opens 32 block files (bench/blocks.py measures it).
BLOCK_TOKENS = 256
# A chain that parts from a stored block after fewer tokens than this writes its own block rather than
# reading a whole stored block for a few rows.
MIN_SHARED_TOKENS = 16
MAX_CHAIN_FILE_BYTES = 64 << 20
BLOCKS_DIR = "blocks"
IMPORT_DIR_PREFIX = ".import-"  # a bundle's import stages its chain and blocks in such a folder
STALE_IMPORT_S = 3600  # one older than this was left by a crash
BLOCK_ORIGIN = "#block-"  # a restore's origin that is a block (``block_origin``), not a record

_BLOCK_SCHEMA = """
CREATE TABLE IF NOT EXISTS nodes (
    id BLOB PRIMARY KEY,
    parent BLOB NOT NULL,
    start INTEGER NOT NULL,
    end INTEGER NOT NULL,
    physical BLOB NOT NULL,       -- the block file holding its rows (its own id, or a longer block's)
    tokens BLOB NOT NULL          -- u32 token ids [start, end)
);
CREATE INDEX IF NOT EXISTS nodes_by_parent ON nodes(parent, start);
CREATE TABLE IF NOT EXISTS chain_nodes (
    name TEXT NOT NULL,           -- a record (chain file)
    pos INTEGER NOT NULL,
    node BLOB NOT NULL,
    PRIMARY KEY (name, pos)
);
CREATE INDEX IF NOT EXISTS chain_nodes_by_node ON chain_nodes(node);
CREATE TABLE IF NOT EXISTS blocks (
    id BLOB PRIMARY KEY,
    bytes INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS block_stats (
    key TEXT PRIMARY KEY,
    value INTEGER NOT NULL
);
"""


def chain_name(file_name: str) -> str:
    """The chain file's name for a record the file store would name ``file_name``."""
    return file_name[: -len(SUFFIX)] + CHAIN_SUFFIX if file_name.endswith(SUFFIX) else file_name


def is_chain(name: str) -> bool:
    return name.endswith(CHAIN_SUFFIX)


@dataclass(frozen=True)
class Match:
    """Stored blocks serving the start of a prompt: ``nodes`` spell its first ``tokens`` tokens (the
    last node may be the first rows of a longer block)."""

    nodes: list[Node]
    header: FileHeader

    @property
    def tokens(self) -> int:
        return self.nodes[-1].end if self.nodes else 0


def _common(a: np.ndarray, b: np.ndarray) -> int:
    n = min(a.size, b.size)
    diff = np.flatnonzero(a[:n] != b[:n])
    return int(diff[0]) if diff.size else n


class BlockStore(CheckpointStore):
    """Chains of content-addressed blocks in one directory (a ``StorageTier``; see the module docstring)."""

    tier_name = "blocks"

    def __init__(self, root: Path, budget_bytes: int | None = None, lock_timeout_s: float = 15.0,
                 block_tokens: int = BLOCK_TOKENS):
        if block_tokens < 1:
            raise ValueError("a block holds at least one token")
        self.block_tokens = block_tokens
        self.min_shared = max(1, min(MIN_SHARED_TOKENS, block_tokens // 4))
        self.blocks_root = Path(root) / BLOCKS_DIR
        super().__init__(root, budget_bytes, lock_timeout_s)

    def _extra_schema(self) -> None:
        self._db.executescript(_BLOCK_SCHEMA)

    # naming ---------------------------------------------------------------------------------------------
    def record_name(self, owner: str, model_fp: bytes) -> str:
        return chain_name(conversation_file(owner, model_fp))

    def prefix_name(self, text_sha: bytes, model_fp: bytes) -> str:
        return chain_name(super().prefix_name(text_sha, model_fp))

    def conversation_entry(self, conversation: str, model_fp: bytes) -> Entry | None:
        """The conversation's chain under this model; else a checkpoint file from before the block store."""
        e = self.entry(self.record_name(conversation, model_fp))
        return self._owned(e, conversation) if e is not None else super().conversation_entry(conversation, model_fp)

    # reading --------------------------------------------------------------------------------------------
    def open(self, name: str) -> ChainReader | CheckpointReader:
        if is_chain(name):
            return ChainReader(self.blocks_root, self.path(name), max_bytes=MAX_CHAIN_FILE_BYTES,
                               on_damage=self._on_damage)
        return super().open(name)

    def note_use(self, name: str, header: FileHeader) -> None:
        if is_chain(name):
            self.touch(name)
        else:
            super().note_use(name, header)

    def _chain(self, name: str) -> Chain:
        return read_chain(self.path(name), MAX_CHAIN_FILE_BYTES)

    # the radix walk -------------------------------------------------------------------------------------
    def _children(self, parent: bytes, start: int) -> list[tuple[Node, np.ndarray]]:
        with self._sql() as db:
            rows = db.execute("SELECT id, end, physical, tokens FROM nodes WHERE parent = ? AND start = ?",
                              (parent, start)).fetchall()
        return [(Node(r[0], parent, start, r[1], r[2]), np.frombuffer(r[3], dtype="<u4")) for r in rows]

    def _step(self, parent: bytes, start: int, tokens: np.ndarray) -> tuple[Node | None, int]:
        """The stored child of ``parent`` at ``start`` sharing the most leading ``tokens``: (that child,
        tokens shared). A child shared whole beats one shared in part."""
        best, best_n, best_full = None, 0, False
        for node, kid in self._children(parent, start):
            n = _common(kid, tokens)
            full = n == kid.size
            if (full, n) > (best_full, best_n):
                best, best_n, best_full = node, n, full
        return best, best_n

    def match(self, identity: Identity, encoding: str, tokens: Sequence[int]) -> Match | None:
        """The longest chain of stored blocks spelling the start of ``tokens`` under this model and
        encoding (see ``Match``); None when not even ``MIN_SHARED_TOKENS`` are stored."""
        layout = encoding_layout(encoding)
        want = np.asarray(tokens, dtype=np.uint32)
        parent, pos, nodes = root_id(identity, layout), 0, []
        while pos < want.size:
            node, n = self._step(parent, pos, want[pos:])
            if node is None or n == 0:
                break
            if n < node.n_tokens:  # they part inside this block: its first rows
                if n >= self.min_shared or not nodes:
                    nodes.append(Node(node_id(parent, pos, want[pos : pos + n]), parent, pos, pos + n, node.physical))
                break
            nodes.append(node)
            parent, pos = node.id, node.end
        if not nodes or nodes[-1].end < self.min_shared:
            return None
        header = writer.new_header(identity, encoding)
        return Match(nodes, header)

    def match_bytes(self, match: Match) -> int:
        """What restoring a match reads: every block file it touches, whole."""
        return sum(self._block_sizes({n.physical for n in match.nodes}).values())

    def open_match(self, match: Match, frontier: Frontier) -> ChainReader:
        """A reader over a match, with one frontier at its end (the restorer computes its text)."""
        return ChainReader(self.blocks_root, self.path("match" + CHAIN_SUFFIX),
                           Chain(match.header, [frontier], list(match.nodes)), on_damage=self._on_damage)

    def _on_damage(self, node: Node, exc: CheckpointError) -> None:
        self.drop_block(node.physical, str(exc))

    # writing --------------------------------------------------------------------------------------------
    def _add_stat(self, db, key: str, value: int) -> None:
        db.execute("INSERT INTO block_stats (key, value) VALUES (?, ?) ON CONFLICT(key) DO UPDATE SET value = value + ?",
                   (key, value, value))

    def stats(self) -> dict[str, int]:
        with self._sql() as db:
            return {k: int(v) for k, v in db.execute("SELECT key, value FROM block_stats")}

    def _insert_node(self, node: Node, tokens: np.ndarray) -> None:
        with self._sql() as db:
            db.execute("INSERT OR IGNORE INTO nodes (id, parent, start, end, physical, tokens) VALUES (?,?,?,?,?,?)",
                       (node.id, node.parent, node.start, node.end, node.physical, tokens.astype("<u4").tobytes()))

    def _extend(self, chain: Chain, identity: Identity, records: Sequence[writer.NewRecord],
                root: bytes | None = None) -> int:
        """Append ``records`` to ``chain``, reusing stored blocks; return the bytes written. ``root``: the
        parent of a new chain's first block (by default the model's root, shared by every chain)."""
        layout = chain.header.layout
        parent = chain.nodes[-1].id if chain.nodes else (root or root_id(identity, layout))
        pos = chain.nodes[-1].end if chain.nodes else 0
        written = reused = 0
        for rec in records:
            if rec.start != pos:
                raise ValueError(f"a record starting at {rec.start} cannot follow a chain ending at {pos}")
            toks = np.asarray(rec.tokens, dtype=np.uint32)
            while pos < rec.end:
                rest = toks[pos - rec.start:]
                stored, n = self._step(parent, pos, rest)
                if stored is not None and n == stored.n_tokens:
                    node = stored  # the same tokens after the same blocks: the same rows
                    reused += stored.n_tokens
                elif stored is not None and n >= self.min_shared:
                    node = Node(node_id(parent, pos, rest[:n]), parent, pos, pos + n, stored.physical)
                    self._insert_node(node, rest[:n])
                    reused += n
                else:
                    end = min(rec.end, (pos // self.block_tokens + 1) * self.block_tokens)
                    seg = rest[: end - pos]
                    nid = node_id(parent, pos, seg)
                    a, b = pos - rec.start, end - rec.start
                    size = write_block(block_path(self.blocks_root, nid), identity, layout, nid, pos, seg,
                                       [blk[a:b] for blk in rec.blocks])
                    node = Node(nid, parent, pos, end, nid)
                    with self._sql() as db:
                        db.execute("INSERT OR REPLACE INTO blocks (id, bytes) VALUES (?, ?)", (nid, size))
                    self._insert_node(node, seg)
                    written += size
                chain.nodes.append(node)
                parent, pos = node.id, node.end
            chain.frontiers.append(Frontier(rec.end, rec.text_len, rec.text_sha, writer.now_ms(), rec.reason))
        with self._sql() as db:
            self._add_stat(db, "bytes_written", written)
            self._add_stat(db, "tokens_reused", reused)
        return written

    def _write_chain(self, name: str, chain: Chain) -> None:
        """Write the chain file atomically and record which nodes it uses."""
        with atomic_write(self.path(name)) as fh:
            fh.write(pack_chain(chain))
        with self._sql() as db:
            db.execute("DELETE FROM chain_nodes WHERE name = ?", (name,))
            db.executemany("INSERT INTO chain_nodes (name, pos, node) VALUES (?, ?, ?)",
                           [(name, i, n.id) for i, n in enumerate(chain.nodes)])

    def _infos(self, chain: Chain) -> list[RecordInfo]:
        """The frontiers as record infos, as ``ChainReader.scan`` gives them."""
        sizes = self._block_sizes({n.physical for n in chain.nodes})
        infos, offset, start, k = [], 0, 0, 0
        for seq, f in enumerate(chain.frontiers):
            nbytes = 0
            while k < len(chain.nodes) and chain.nodes[k].end <= f.end:
                nbytes += sizes.get(chain.nodes[k].physical, 0)
                k += 1
            infos.append(RecordInfo(seq, start, f.end, f.text_len, f.text_sha, f.saved_ms, f.reason, nbytes, 0, 0, 0,
                                    offset - 128))
            offset, start = offset + nbytes, f.end
        return infos

    def _block_sizes(self, ids: Iterable[bytes]) -> dict[bytes, int]:
        ids = list(ids)
        with self._sql() as db:
            return {row[0]: int(row[1]) for i in range(0, len(ids), 500) for row in db.execute(
                f"SELECT id, bytes FROM blocks WHERE id IN ({','.join('?' * len(ids[i:i + 500]))})", ids[i:i + 500])}

    def create(self, name: str, identity: Identity, records: Sequence[writer.NewRecord], encoding: str) -> Written:
        if not is_chain(name):
            return super().create(name, identity, records, encoding)
        chain = Chain(writer.new_header(identity, encoding), [], [])
        written = self._extend(chain, identity, records)
        self._write_chain(name, chain)
        self._retire_file(name)
        return Written(chain.header, self._infos(chain), written)

    def append(self, name: str, header: FileHeader, keep: Sequence[RecordInfo],
               rec: writer.NewRecord) -> tuple[RecordInfo, int]:
        if not is_chain(name):
            return super().append(name, header, keep, rec)
        chain = self._chain(name).cut(keep[-1].end if keep else 0)
        identity = Identity(header.model_fp, header.tokenizer_fp, header.shape, header.label)
        written = self._extend(chain, identity, [rec])
        self._write_chain(name, chain)
        self.collect()
        return self._infos(chain)[-1], written

    def cut(self, name: str, keep: Sequence[RecordInfo]) -> None:
        if not is_chain(name):
            return super().cut(name, keep)
        self._write_chain(name, self._chain(name).cut(keep[-1].end if keep else 0))
        self.collect()

    def _retire_file(self, name: str) -> None:
        """A record saved as a chain replaces the checkpoint file of the same record from before."""
        old = name[: -len(CHAIN_SUFFIX)] + SUFFIX
        if self.path(old).exists() or self.entry(old) is not None:
            super().remove(old, f"replaced by {name}")

    # copying, removing, collecting -----------------------------------------------------------------------
    def copy(self, name: str, owner: str) -> Entry | None:
        """A branch's copy of a chain is a chain file naming the same blocks: no rows are copied."""
        if not is_chain(name):
            return super().copy(name, owner)
        source = self.entry(name)
        if source is None:
            return None
        with self.lock.held():
            chain = self._chain(name)
            target = self.record_name(owner, source.model_fp)
            self._write_chain(target, chain)
            self.put(Entry(target, owner, source.kind if source.kind != "prefix" else "conversation", source.tokens,
                           source.text_len, source.text_sha, source.bytes, source.model_fp, source.created_ms,
                           writer.now_ms(), 0, False, source.label))
        return self.conversation_entry(owner, source.model_fp)

    def remove(self, name: str, why: str = "") -> None:
        if not is_chain(name):
            return super().remove(name, why)
        with self.lock.held():
            self.path(name).unlink(missing_ok=True)
            with self._sql() as db:
                db.execute("DELETE FROM entries WHERE name = ?", (name,))
                db.execute("DELETE FROM chain_nodes WHERE name = ?", (name,))
            self.collect()
        if why:
            log.info("removed saved context %s: %s", name, why)

    @staticmethod
    def block_origin(physical: bytes) -> str:
        """The name a restore's origin takes when its rows came from a block rather than a record."""
        return BLOCK_ORIGIN + physical.hex()

    def discard(self, name: str, why: str) -> None:
        """Rows that verified but gave NaN: every block they came from goes (whoever else used it: those
        chains are cut back when next read), then the record."""
        if name.startswith(BLOCK_ORIGIN):
            self.drop_block(bytes.fromhex(name[len(BLOCK_ORIGIN):]), why)
            return
        if is_chain(name):
            try:
                for physical in {n.physical for n in self._chain(name).nodes}:
                    self.drop_block(physical, why)
            except CheckpointError:
                pass  # an unreadable chain: removing it is all there is to do
        self.remove(name, why)

    def delete_conversation(self, conversation: str) -> int:
        gone = super().delete_conversation(conversation)
        for path in self.root.glob(f"{conversation_key(conversation)}*{CHAIN_SUFFIX}"):
            self.remove(path.name)
            gone += 1
        return gone

    def collect(self) -> int:
        """Drop every node no record uses and every block file no node reads; return the bytes freed."""
        with self.lock.held():
            with self._sql() as db:
                db.execute("DELETE FROM nodes WHERE id NOT IN (SELECT node FROM chain_nodes)")
                dead = db.execute("SELECT id, bytes FROM blocks WHERE id NOT IN (SELECT physical FROM nodes)").fetchall()
                db.executemany("DELETE FROM blocks WHERE id = ?", [(row[0],) for row in dead])
            for bid, _ in dead:
                block_path(self.blocks_root, bid).unlink(missing_ok=True)
        return sum(int(row[1]) for row in dead)

    def drop_block(self, physical: bytes, why: str) -> None:
        """A block that failed verification (or whose rows gave NaN): no chain may use it again. Every
        chain using it is cut back to before it (removed when nothing is left), so the store stays whole
        and a shared prefix that lost it is saved again by the next chat that starts with it."""
        with self.lock.held():
            with self._sql() as db:
                users = [row[0] for row in db.execute(
                    "SELECT DISTINCT c.name FROM chain_nodes c JOIN nodes n ON n.id = c.node WHERE n.physical = ?",
                    (physical,))]
                db.execute("DELETE FROM nodes WHERE physical = ?", (physical,))
                db.execute("DELETE FROM blocks WHERE id = ?", (physical,))
            block_path(self.blocks_root, physical).unlink(missing_ok=True)
            for name in users:
                self._cut_before(name, physical, why)
        log.warning("dropped block %s: %s", physical.hex()[:16], why)

    def _cut_before(self, name: str, physical: bytes, why: str) -> None:
        try:
            chain = self._chain(name)
        except CheckpointError:
            self.remove(name, why)
            return
        first = next((n.start for n in chain.nodes if n.physical == physical), None)
        if first is None:
            return
        kept = chain.cut(max((f.end for f in chain.frontiers if f.end <= first), default=0))
        old = self.entry(name)
        if not kept.frontiers or old is None:
            self.remove(name, why)
            return
        self._write_chain(name, kept)
        last = self._infos(kept)[-1]
        self.put(dataclasses.replace(old, tokens=last.end, text_len=last.text_len, text_sha=last.text_sha,
                                     bytes=last.end_offset))
        log.info("cut %s back to %d tokens: %s", name, last.end, why)

    # usage ----------------------------------------------------------------------------------------------
    def _legacy_bytes(self) -> dict[str, int]:
        with self._sql() as db:
            return {row[0]: int(row[1]) for row in db.execute(
                "SELECT name, bytes FROM entries WHERE name NOT LIKE ?", ("%" + CHAIN_SUFFIX,))}

    def shares(self) -> dict[str, Share]:
        """Each record's share of the store and its shared bytes (see ``Share``)."""
        with self._sql() as db:
            pairs = db.execute("SELECT DISTINCT c.name, b.id, b.bytes FROM chain_nodes c JOIN nodes n ON n.id = c.node "
                               "JOIN blocks b ON b.id = n.physical").fetchall()
        users: dict[bytes, int] = {}
        for _, bid, _ in pairs:
            users[bid] = users.get(bid, 0) + 1
        share: dict[str, float] = {}
        shared: dict[str, int] = {}
        for name, bid, size in pairs:
            share[name] = share.get(name, 0.0) + size / users[bid]
            shared[name] = shared.get(name, 0) + (size if users[bid] > 1 else 0)
        out = {name: Share(round(v), shared.get(name, 0)) for name, v in share.items()}
        for name, size in self._legacy_bytes().items():
            out[name] = Share(size, 0)
        return out

    def total_bytes(self) -> int:
        """Every block once, plus checkpoint files from before the block store."""
        with self._sql() as db:
            blocks = int(db.execute("SELECT COALESCE(SUM(bytes), 0) FROM blocks").fetchone()[0])
        return blocks + sum(self._legacy_bytes().values())

    def shared_bytes(self) -> int:
        """Bytes of blocks more than one record uses."""
        with self._sql() as db:
            return int(db.execute(
                "SELECT COALESCE(SUM(bytes), 0) FROM blocks WHERE id IN (SELECT n.physical FROM chain_nodes c "
                "JOIN nodes n ON n.id = c.node GROUP BY n.physical HAVING COUNT(DISTINCT c.name) > 1)").fetchone()[0])

    def block_count(self) -> int:
        with self._sql() as db:
            return int(db.execute("SELECT COUNT(*) FROM blocks").fetchone()[0])

    def bytes_by_kind(self) -> dict[str, int]:
        shares = self.shares()
        out: dict[str, int] = {}
        for e in self.entries():
            s = shares.get(e.name)
            if s is not None:
                out[e.kind] = out.get(e.kind, 0) + s.bytes
        return out

    def enforce_budget(self, protect: Iterable[str] = ()) -> list[str]:
        """Evict records by the file store's policy until the blocks they leave fit the budget."""
        evicted: list[str] = []
        with self.lock.held():
            total = self.total_bytes()
            if total <= self.budget_bytes:
                return evicted
            for e, why in eviction_order(self.entries(), protect, self.models.gone()):
                if total <= self.budget_bytes:
                    break
                self.remove(e.name, f"over the {self.budget_bytes >> 20} MiB budget ({why})")
                total = self.total_bytes()
                evicted.append(e.name)
        return evicted

    # start-up: the index against the files -----------------------------------------------------------------
    def reconcile(self) -> None:
        """The file store's reconcile for checkpoint files, then the chains: index the chain files the
        index lacks (their nodes' tokens from their block files), drop rows of chains that are gone and
        every block no chain uses (a crash between writing blocks and their chain leaves some)."""
        super().reconcile()
        with self.lock.held():
            on_disk = {p.name for p in self.root.glob(f"*{CHAIN_SUFFIX}") if not p.name.startswith(".")}
            with self._sql() as db:
                known = {row[0] for row in db.execute("SELECT name FROM entries WHERE name LIKE ?",
                                                      ("%" + CHAIN_SUFFIX,))}
                indexed = {row[0] for row in db.execute("SELECT DISTINCT name FROM chain_nodes")}
                for name in (known | indexed) - on_disk:
                    db.execute("DELETE FROM entries WHERE name = ?", (name,))
                    db.execute("DELETE FROM chain_nodes WHERE name = ?", (name,))
            for name in sorted(on_disk - (known & indexed)):
                self._index_chain(name, name not in known)
            self._index_block_files()
            self.collect()
            self._sweep_block_files()
            self._sweep_imports()

    def _index_chain(self, name: str, needs_entry: bool) -> None:
        try:
            chain = self._chain(name)
        except CheckpointError as exc:
            log.info("saved context %s does not verify (%s); a session will report and rebuild it", name, exc)
            if needs_entry:
                self.put(unknown_entry(name, lambda: self.open(name), self.path(name).stat().st_size))
            return
        with self._sql() as db:
            db.execute("DELETE FROM chain_nodes WHERE name = ?", (name,))
            db.executemany("INSERT INTO chain_nodes (name, pos, node) VALUES (?, ?, ?)",
                           [(name, i, n.id) for i, n in enumerate(chain.nodes)])
            have = {row[0] for row in db.execute("SELECT id FROM nodes")}
        reader = ChainReader(self.blocks_root, self.path(name), chain, on_damage=self._on_damage)
        with reader:
            for i, node in enumerate(chain.nodes):
                if node.id in have:
                    continue
                try:
                    tokens = reader.node_tokens(i, 1 << 32)
                except CheckpointError as exc:
                    log.info("saved context %s: block %d unusable (%s)", name, i, exc)
                    break
                self._insert_node(node, np.asarray(tokens, dtype=np.uint32))
        if needs_entry:
            self.put(unknown_entry(name, lambda: self.open(name), sum(self._block_sizes(
                {n.physical for n in chain.nodes}).values())))

    def _index_block_files(self) -> None:
        """Block files the index lacks, for the nodes that read them."""
        with self._sql() as db:
            wanted = {row[0] for row in db.execute("SELECT DISTINCT physical FROM nodes "
                                                   "WHERE physical NOT IN (SELECT id FROM blocks)")}
        for bid in wanted:
            try:
                size = block_path(self.blocks_root, bid).stat().st_size
            except OSError:
                continue  # a missing block: the chains using it are cut back when next read
            with self._sql() as db:
                db.execute("INSERT OR REPLACE INTO blocks (id, bytes) VALUES (?, ?)", (bid, size))

    def _sweep_imports(self) -> None:
        """Folders a bundle import left when it crashed (a running import's is younger)."""
        now = time.time()
        for p in self.root.glob(IMPORT_DIR_PREFIX + "*"):
            try:
                if p.is_dir() and now - p.stat().st_mtime > STALE_IMPORT_S:
                    shutil.rmtree(p, ignore_errors=True)
            except OSError:
                continue

    def chain_context(self, name: str) -> ChainContext:
        """A chain for a bundle: its file's bytes and the block files it reads."""
        data = self.path(name).read_bytes()
        chain = unpack_chain(data, name)
        return ChainContext(data, {n.physical.hex(): block_path(self.blocks_root, n.physical) for n in chain.nodes})

    def _sweep_block_files(self) -> None:
        """Block files no node reads (and stray temp files of interrupted block writes)."""
        if not self.blocks_root.is_dir():
            return
        with self._sql() as db:
            known = {row[0].hex() for row in db.execute("SELECT id FROM blocks")}
        for sub in self.blocks_root.iterdir():
            if not sub.is_dir():
                continue
            for p in sub.iterdir():
                if p.name.startswith("."):
                    p.unlink(missing_ok=True)
                elif p.name.endswith(BLOCK_SUFFIX) and p.name[: -len(BLOCK_SUFFIX)] not in known:
                    p.unlink(missing_ok=True)

    # bundles: a chain travels as a checkpoint file --------------------------------------------------------
    def read_stream(self, name: str) -> BinaryIO:
        """The record as one checkpoint file (a bundle carries it so; its import stores its blocks again,
        reusing every block already stored)."""
        if not is_chain(name):
            return super().read_stream(name)
        try:
            reader = self.open(name)
        except CheckpointError as exc:
            raise OSError(f"{name}: {exc}") from None
        out = tempfile.TemporaryFile(dir=self.root)
        try:
            with reader:
                records = records_of(reader)
                h = reader.header
                header = writer.new_header(Identity(h.model_fp, h.tokenizer_fp, h.shape, h.label), h.encoding)
                writer._write_all(out, header, records)
        except CheckpointError as exc:
            out.close()
            raise OSError(f"{name}: {exc}") from None
        out.seek(0)
        return out

    def has_block(self, physical: bytes) -> bool:
        """The block is indexed and its file is there (a bundle's import then need not carry it in)."""
        with self._sql() as db:
            known = db.execute("SELECT 1 FROM blocks WHERE id = ?", (physical,)).fetchone() is not None
        return known and block_path(self.blocks_root, physical).exists()

    def install(self, staged: Path, owner: str, model_fp: bytes, isolated: bool = False) -> Entry | None:
        """Store a staged, verified checkpoint file as ``owner``'s chain (see ``install_records``)."""
        with CheckpointReader(staged) as reader:
            h = reader.read_header()
            records = records_of(reader)
        entry = self.install_records(records, h, owner, model_fp, isolated)
        staged.unlink(missing_ok=True)
        return entry

    def install_records(self, records: Sequence[writer.NewRecord], h: FileHeader, owner: str, model_fp: bytes,
                        isolated: bool = False) -> Entry | None:
        """Store verified records (a bundle's) as ``owner``'s chain, their blocks deduplicated against every
        stored one. ``isolated`` (a bundle from another installation the user chose to trust): its blocks
        hang from a root of their own, so they serve this chat (and its branches) and never a prompt of
        another: checksums cannot tell rows forged under another chat's tokens."""
        identity = Identity(h.model_fp, h.tokenizer_fp, h.shape, h.label)
        name = self.record_name(owner, model_fp)
        root = hashlib.sha256(b"hearth-kv-import-v1" + root_id(identity, h.layout) + owner.encode()).digest() \
            if isolated else None
        with self.lock.held():
            chain = Chain(writer.new_header(identity, h.encoding), [], [])
            self._extend(chain, identity, records, root)
            self._write_chain(name, chain)
            self._retire_file(name)
            last = self._infos(chain)[-1]
            self.put(Entry(name, owner, "conversation", last.end, last.text_len, last.text_sha, last.end_offset,
                           model_fp, h.created_ms, writer.now_ms(), 0, False, h.label))
        return self.conversation_entry(owner, model_fp)
