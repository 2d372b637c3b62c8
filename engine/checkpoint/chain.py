"""A saved context in the block store: a small *chain* file naming its blocks, read like a checkpoint.

A chain file (``.hkc``) holds the context's header (the model, tokenizer and KV shape, as a checkpoint
file's), its *frontiers* (where saves ended: the length and SHA-256 of the text tokens [0, end) spell,
exactly a checkpoint record's frontier) and its nodes in order (block identity, parent, positions,
the block file holding the rows). It is written whole and atomically on every change and ends with an
XXH3-64 of everything before it; every count is bounded before anything is allocated.

``ChainReader`` gives the checkpoint reader's interface over a chain, so the restorer, the saver and
the status check use a chain as they use a file: the header and identity, the frontiers (``scan``,
which opens every block file and checks its header against the chain's), each frontier's tokens
(every block's own checksum, then its identity re-derived from its parent and tokens) and the rows as
a verifying ``RowSource`` (each block's rows checksum before the next is read).
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from engine.checkpoint.blocks import ID_BYTES, BlockFileReader, Node, block_path, check_node_tokens
from engine.checkpoint.format import (
    HEADER_SIZE,
    LAYOUT_INT8_ROWS,
    RECORD_HEADER_SIZE,
    SAVE_REASONS,
    CheckpointError,
    FileHeader,
    Identity,
    Reason,
    RecordInfo,
    layer_digest,
    pack_header,
    rows_digest,
    unpack_header,
    xxh,
)
from engine.checkpoint.reader import READ_THREADS, CheckpointReader, check_identity, io_error, rows_finite
from engine.checkpoint.writer import NewRecord
from engine.fsutil import open_regular
from engine.runtime.kv_protocol import BlocksFn

CHAIN_MAGIC = b"HEARTHKC"
CHAIN_VERSION = 1
CHAIN_SUFFIX = ".hkc"
MAX_CHAIN_NODES = 1 << 20
MAX_FRONTIERS = 1 << 20
_TOP = struct.Struct("<8sHHII")
_FRONTIER = struct.Struct("<IIQ32sQB7x")
_NODE = struct.Struct(f"<{ID_BYTES}s{ID_BYTES}s{ID_BYTES}sII")


@dataclass(frozen=True)
class Frontier:
    """Where a save ended: tokens [0, end) spell text of ``text_len`` bytes with SHA-256 ``text_sha``."""

    end: int
    text_len: int
    text_sha: bytes
    saved_ms: int
    reason: str


@dataclass
class Chain:
    header: FileHeader
    frontiers: list[Frontier]
    nodes: list[Node]

    def cut(self, end: int) -> Chain:
        """The chain up to the frontier at ``end`` (a node boundary)."""
        return Chain(self.header, [f for f in self.frontiers if f.end <= end], [n for n in self.nodes if n.end <= end])


def pack_chain(chain: Chain) -> bytes:
    out = bytearray(_TOP.pack(CHAIN_MAGIC, CHAIN_VERSION, 0, len(chain.frontiers), len(chain.nodes)))
    out += pack_header(chain.header)
    for f in chain.frontiers:
        reason = SAVE_REASONS.index(f.reason) if f.reason in SAVE_REASONS else 255
        out += _FRONTIER.pack(f.end, 0, f.text_len, f.text_sha, f.saved_ms, reason)
    for n in chain.nodes:
        out += _NODE.pack(n.id, n.parent, n.physical, n.start, n.end)
    return bytes(out) + struct.pack("<Q", xxh(bytes(out), 0))


def unpack_chain(data: bytes, name: str) -> Chain:
    """Parse and check a chain file; CheckpointError naming the first thing wrong."""
    if len(data) < _TOP.size or data[:8] != CHAIN_MAGIC:
        raise CheckpointError(Reason.BAD_MAGIC if data[:8] != CHAIN_MAGIC[: len(data[:8])] or len(data) >= 8
                              else Reason.TRUNCATED, f"{name} is not a Hearth saved-context chain")
    _, version, _, n_front, n_nodes = _TOP.unpack_from(data)
    if version != CHAIN_VERSION:
        raise CheckpointError(Reason.VERSION, f"{name}: chain version {version}; this Hearth reads {CHAIN_VERSION}")
    if n_front > MAX_FRONTIERS or n_nodes > MAX_CHAIN_NODES:
        raise CheckpointError(Reason.TOO_LARGE, f"{name} claims {n_front} frontiers and {n_nodes} blocks")
    size = _TOP.size + HEADER_SIZE + n_front * _FRONTIER.size + n_nodes * _NODE.size + 8
    if len(data) != size:
        raise CheckpointError(Reason.TRUNCATED, f"{name} is {len(data)} bytes; its counts need {size}")
    (stored,) = struct.unpack_from("<Q", data, size - 8)
    if stored != xxh(data[: size - 8], 0):
        raise CheckpointError(Reason.CHECKSUM, f"{name}: the chain file is damaged (checksum)")
    header = unpack_header(data[_TOP.size : _TOP.size + HEADER_SIZE])
    offset = _TOP.size + HEADER_SIZE
    frontiers = []
    for _ in range(n_front):
        end, _r, text_len, text_sha, saved, reason = _FRONTIER.unpack_from(data, offset)
        frontiers.append(Frontier(end, text_len, text_sha, saved, SAVE_REASONS[reason] if reason < len(SAVE_REASONS)
                                  else "unknown"))
        offset += _FRONTIER.size
    nodes = []
    for _ in range(n_nodes):
        nid, parent, physical, start, end = _NODE.unpack_from(data, offset)
        nodes.append(Node(nid, parent, start, end, physical))
        offset += _NODE.size
    _check_shape(name, header, frontiers, nodes)
    return Chain(header, frontiers, nodes)


def _check_shape(name: str, header: FileHeader, frontiers: list[Frontier], nodes: list[Node]) -> None:
    """Nodes tile [0, last end) in order, each after its parent; every frontier ends on a node boundary."""
    pos, parent = 0, None
    for n in nodes:
        if n.start != pos or n.end <= n.start or (parent is not None and n.parent != parent):
            raise CheckpointError(Reason.LAYOUT, f"{name}: block {n.id.hex()[:16]} covers tokens "
                                  f"[{n.start}, {n.end}) where the chain needs {pos}")
        pos, parent = n.end, n.id
    if pos > header.shape.context_length:
        raise CheckpointError(Reason.TOO_LARGE, f"{name} reaches token {pos}, past the model's context")
    ends = {n.end for n in nodes}
    last = 0
    for f in frontiers:
        if f.end <= last or f.end not in ends:
            raise CheckpointError(Reason.LAYOUT, f"{name}: a frontier at token {f.end} is not a block boundary")
        last = f.end


def read_chain(path: Path, max_bytes: int) -> Chain:
    try:
        with open_regular(path) as fh:
            data = fh.read(max_bytes + 1)
    except OSError as exc:
        raise io_error(path, exc) from None
    if len(data) > max_bytes:
        raise CheckpointError(Reason.TOO_LARGE, f"{path.name} is larger than any chain file")
    return unpack_chain(data, path.name)


def open_saved(path: Path) -> ChainReader | CheckpointReader:
    """A reader over a saved-context file given by path: a chain file (its blocks beside it, in the
    store's ``blocks`` folder) or a checkpoint file."""
    path = Path(path)
    if path.name.endswith(CHAIN_SUFFIX):
        return ChainReader(path.parent / "blocks", path)
    return CheckpointReader(path)


class ChainReader:
    """The checkpoint reader's interface over a chain: verifies as it reads (see the module docstring).
    ``chain`` None: the chain file at ``path`` is read (and checked) first."""

    def __init__(self, blocks_root: Path | Sequence[Path], path: Path, chain: Chain | None = None,
                 max_bytes: int = 64 << 20, on_damage: Callable[[Node, CheckpointError], None] | None = None):
        """``blocks_root``: where the block files are (several: searched in order; a bundle's import reads
        its own blocks, then the store's). ``on_damage``: told of a block that fails verification (not
        of a missing one), so the store stops offering it to other chains."""
        roots = [blocks_root] if isinstance(blocks_root, (str, Path)) else list(blocks_root)
        self.blocks_roots = [Path(r) for r in roots]
        self.path = Path(path)
        self.on_damage = on_damage
        self.chain = chain if chain is not None else read_chain(self.path, max_bytes)
        self.header: FileHeader = self.chain.header
        self._readers: dict[int, BlockFileReader] = {}
        self._records: dict[int, RecordInfo] = {}  # node index → its block file's record
        self._tokens: dict[int, list[int]] = {}
        self._sizes: dict[int, int] = {}

    def close(self) -> None:
        for r in self._readers.values():
            r.close()
        self._readers.clear()

    def __enter__(self) -> ChainReader:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def read_header(self) -> FileHeader:
        return self.header

    def check_identity(self, identity: Identity) -> None:
        check_identity(self.header, identity)

    @property
    def size(self) -> int:
        return sum(self._sizes.values())

    # the blocks -------------------------------------------------------------------------------------------
    def block_file(self, physical: bytes) -> Path:
        """Where a block file is: the first of the roots holding it (the first root when none does)."""
        for root in self.blocks_roots:
            path = block_path(root, physical)
            if path.exists():
                return path
        return block_path(self.blocks_roots[0], physical)

    def _damaged(self, i: int, exc: CheckpointError) -> CheckpointError:
        missing = not self.block_file(self.chain.nodes[i].physical).exists()
        if self.on_damage is not None and not missing:
            self.on_damage(self.chain.nodes[i], exc)
        return exc

    def _open_node(self, i: int) -> None:
        try:
            self._open_node_checked(i)
        except CheckpointError as exc:
            self._readers.pop(i, None)
            raise self._damaged(i, exc) from None

    def _open_node_checked(self, i: int) -> None:
        node = self.chain.nodes[i]
        path = self.block_file(node.physical)
        try:
            reader = BlockFileReader(path, node.physical, node.start)
        except CheckpointError as exc:
            if exc.reason == Reason.IO_ERROR and not path.exists():
                raise CheckpointError(Reason.TRUNCATED, f"block {node.physical.hex()[:16]} (tokens {node.start}–"
                                      f"{node.end}) is missing") from None
            raise
        self._readers[i] = reader
        h = reader.read_header()
        mine = self.header
        if (h.model_fp, h.tokenizer_fp, h.shape, h.layout) != (mine.model_fp, mine.tokenizer_fp, mine.shape, mine.layout):
            raise CheckpointError(Reason.MODEL_MISMATCH, f"block {node.physical.hex()[:16]} was made by another "
                                  "model, tokenizer or encoding than its chain")
        records, problem = reader.scan()
        if problem is not None:
            raise problem
        rec = records[0]
        if rec.end < node.end:
            raise CheckpointError(Reason.TRUNCATED, f"block {node.physical.hex()[:16]} ends at token {rec.end}; "
                                  f"the chain needs {node.end}")
        self._records[i], self._sizes[i] = rec, reader.size

    def scan(self) -> tuple[list[RecordInfo], CheckpointError | None]:
        """Every frontier whose blocks are all present and whose headers verify; what stopped the rest."""
        problem, good_end = None, 0
        for i, node in enumerate(self.chain.nodes):
            try:
                self._open_node(i)
            except CheckpointError as exc:
                problem = exc
                break
            good_end = node.end
        records, offset, start = [], 0, 0
        nodes = self.chain.nodes
        k = 0
        for seq, f in enumerate(self.chain.frontiers):
            if f.end > good_end:
                break
            nbytes = 0
            while k < len(nodes) and nodes[k].end <= f.end:
                nbytes += self._sizes.get(k, 0)
                k += 1
            records.append(RecordInfo(seq, start, f.end, f.text_len, f.text_sha, f.saved_ms, f.reason, nbytes, 0, 0, 0,
                                      offset - RECORD_HEADER_SIZE))
            offset += nbytes
            start = f.end
        if not records and problem is None:
            problem = CheckpointError(Reason.TRUNCATED, f"{self.path.name} holds no saved frontier")
        return records, problem

    def _node_range(self, start: int, end: int) -> list[int]:
        return [i for i, n in enumerate(self.chain.nodes) if start <= n.start and n.end <= end]

    def node_tokens(self, i: int, vocab_size: int) -> list[int]:
        if i not in self._tokens:
            if i not in self._readers:
                self._open_node(i)
            node = self.chain.nodes[i]
            try:
                tokens = self._readers[i].read_tokens(self._records[i], vocab_size)[: node.n_tokens]
                check_node_tokens(node, tokens)
            except CheckpointError as exc:
                raise self._damaged(i, exc) from None
            self._tokens[i] = tokens
        return self._tokens[i]

    def read_tokens(self, r: RecordInfo, vocab_size: int) -> list[int]:
        out: list[int] = []
        for i in self._node_range(r.start, r.end):
            out += self.node_tokens(i, vocab_size)
        return out

    def rows(self, records: list[RecordInfo]) -> ChainRows:
        return ChainRows(self, records)

    def load_node_rows(self, i: int, blocks: BlocksFn) -> CheckpointError | None:
        """Read node ``i``'s rows into ``blocks(start, end)`` and verify them (its whole block file's rows:
        a prefix node reads its block into scratch and copies the rows it covers)."""
        node, rec = self.chain.nodes[i], self._records[i]
        reader = self._readers[i]
        dest = list(blocks(node.start, node.end))
        if rec.end == node.end:
            _, problem = reader.load_rows([rec], lambda s, e: dest)
        else:
            scratch = [np.empty((rec.n_tokens, d.shape[-1]), dtype=d.dtype) for d in dest]
            _, problem = reader.load_rows([rec], lambda s, e: scratch)
            if problem is None:
                for d, s in zip(dest, scratch, strict=True):
                    d[...] = s[: node.n_tokens]
        return None if problem is None else self._damaged(i, problem)

    def verify_all(self, vocab_size: int) -> tuple[list[RecordInfo], CheckpointError | None]:
        """Full check without a model: every block's tokens and rows."""
        records, problem = self.scan()
        shape = self.header.shape
        dtype = np.dtype(shape.dtype)
        good: list[RecordInfo] = []
        for r in records:
            try:
                self.read_tokens(r, vocab_size)
            except CheckpointError as exc:
                return good, exc
            for i in self._node_range(r.start, r.end):
                n = self.chain.nodes[i].n_tokens
                scratch = [np.empty((n, shape.head_dim), dtype=dtype) for _ in range(2 * shape.n_layers * shape.n_kv_heads)]
                failed = self.load_node_rows(i, lambda s, e, scratch=scratch: scratch)
                if failed is not None:
                    return good, failed
            good.append(r)
        return good, problem


class ChainRows:
    """A chain's frontiers as a ``RowSource``: ``good`` counts the frontiers whose every block verified,
    ``problem`` says what stopped the rest.

    The blocks are read as one file's records are: a job per layer (in a pool of ``READ_THREADS``), each
    reading that layer's rows of every block in turn straight into its destination and hashing them, so
    32 blocks cost what one file does rather than 32 times a pool's round trips (measured: 960 jobs of
    one block-layer each made 8,000 tokens restore in 234 ms against the file's 66 ms). A block counts
    as verified only once every layer's digest matches, and only the blocks before the first that does
    not are kept: the cache clears whatever rows past that the jobs wrote."""

    def __init__(self, reader: ChainReader, records: Sequence[RecordInfo]):
        self.reader, self.records = reader, list(records)
        h = reader.header
        self.dtype = None if h.layout == LAYOUT_INT8_ROWS else np.dtype(h.shape.dtype)
        self.good, self.problem = 0, None

    def fill(self, blocks: BlocksFn) -> int:
        reader = self.reader
        if not self.records:
            return 0
        nodes = reader._node_range(self.records[0].start, self.records[-1].end)
        base, top = reader.chain.nodes[nodes[0]].start, reader.chain.nodes[nodes[-1]].end
        # The whole range's destination at once: each block's rows are a slice of it, and exact rows are
        # checked for NaN / infinity per layer over the whole range (180 numpy calls, not 180 per block).
        full = list(blocks(base, top))
        targets, scratch = {}, {}
        for i in nodes:
            node, rec = reader.chain.nodes[i], reader._records[i]
            if rec.end != node.end:  # a block read in part: into scratch, copied once it verifies
                scratch[i] = [np.empty((rec.n_tokens, f.shape[-1]), dtype=f.dtype) for f in full]
                targets[i] = scratch[i]
            else:
                targets[i] = [f[node.start - base : node.end - base] for f in full]
        n_layers = reader.header.shape.n_layers
        exact = reader.header.layout != LAYOUT_INT8_ROWS
        with ThreadPoolExecutor(max_workers=READ_THREADS) as pool:
            try:
                if exact:  # a job per block (one read of all its layers), then a finiteness job per layer
                    by_block = list(pool.map(lambda i: self._read_block(i, targets[i]), nodes))
                    per_layer = [[None if d is None else d[layer] for d in by_block] for layer in range(n_layers)]
                    finite_layers = list(pool.map(lambda layer: self._finite(layer, full, scratch), range(n_layers)))
                else:  # int8: a job per layer (each dequantizes through its own scratch)
                    done = [pool.submit(self._layer, layer, nodes, targets) for layer in range(n_layers)]
                    per_layer, finite_layers = [job.result() for job in done], None
            except OSError as exc:
                self.good, self.problem = 0, io_error(reader.path, exc)
                return self.records[0].start
        bad_at = None  # where the first block that failed starts
        for k, i in enumerate(nodes):
            problem = self._judge(i, [results[k] for results in per_layer], targets[i], finite_layers)
            if problem is not None:
                bad_at = reader.chain.nodes[i].start
                self.problem = reader._damaged(i, problem)
                break
            if i in scratch:
                node = reader.chain.nodes[i]
                for f, src in zip(full, scratch[i], strict=True):
                    f[node.start - base : node.end - base] = src[: node.n_tokens]
        if bad_at is None:
            self.good = len(self.records)
            return self.records[-1].end
        if exact:  # never leave NaN in a cache, even past what is kept: attention multiplies masked rows by 0
            for f in full:
                f[bad_at - base :] = 0
        self.good = sum(1 for r in self.records if r.end <= bad_at)
        return self.records[self.good - 1].end if self.good else self.records[0].start

    def _read_block(self, i: int, target: list[np.ndarray]) -> list[int] | None:
        """Block ``i``'s exact rows, all layers in one read straight into ``target``: each layer's digest,
        or None when the file ends early. (960 reads of one block-layer each cost 8,000 tokens 234 ms
        against one file's 66; a read per block is within a few per cent of the file.)"""
        reader = self.reader
        rec, block = reader._records[i], reader._readers[i]
        views = [memoryview(b).cast("B") for b in target]
        if block._read_into(rec.payload_offset + 4 * rec.n_tokens, views) != sum(v.nbytes for v in views):
            return None
        per_layer = len(views) // reader.header.shape.n_layers
        seed = block.header.seed
        return [layer_digest(views[k : k + per_layer], seed) for k in range(0, len(views), per_layer)]

    def _finite(self, layer: int, full: list[np.ndarray], scratch: dict) -> bool:
        """No NaN or infinity in ``layer``'s rows: the whole range, and the blocks read in part."""
        per_layer = len(full) // self.reader.header.shape.n_layers
        views = full[layer * per_layer : (layer + 1) * per_layer]
        views += [b for i in scratch for b in scratch[i][layer * per_layer : (layer + 1) * per_layer]]
        return all(rows_finite(v) for v in views)

    def _layer(self, layer: int, nodes: list[int], targets: dict) -> list:
        """One int8 layer of every block: (digest, scales valid), None for a block cut short."""
        reader, out = self.reader, []
        n_layers = reader.header.shape.n_layers
        for i in nodes:
            rec, block = reader._records[i], reader._readers[i]
            target = targets[i]
            per_layer = len(target) // n_layers
            size = block.header.layer_bytes(rec.n_tokens)
            offset = rec.payload_offset + 4 * rec.n_tokens + layer * size
            out.append(block._read_layer_int8(offset, size, rec.n_tokens, target[layer * per_layer : (layer + 1) * per_layer]))
        return out

    def _judge(self, i: int, results: list, target: list[np.ndarray], finite_layers: list[bool] | None,
               ) -> CheckpointError | None:
        """Block ``i``'s layers as read: its rows checksum, then NaN / infinity (exact rows: only where the
        whole layer's check found some, this block's own rows are looked at) or bad int8 scales."""
        reader = self.reader
        rec, block = reader._records[i], reader._readers[i]
        name = reader.chain.nodes[i].physical.hex()[:16]
        if any(res is None for res in results):
            return CheckpointError(Reason.TRUNCATED, f"block {name}: rows cut short")
        digests = [res[0] for res in results] if finite_layers is None else results
        if rows_digest(digests, block.header.seed) != rec.rows_xxh:
            return CheckpointError(Reason.CHECKSUM, f"block {name} (tokens {rec.start}–{rec.end}): the KV rows are "
                                   "damaged (checksum)")
        if finite_layers is None:
            bad = [layer for layer, res in enumerate(results) if not res[1]]
            return block._bad_scales(rec, bad[0]) if bad else None
        per_layer = len(target) // len(finite_layers)
        for layer, fine in enumerate(finite_layers):
            if not fine and not all(rows_finite(t) for t in target[layer * per_layer : (layer + 1) * per_layer]):
                return block._non_finite(rec, layer)
        return None

def records_of(reader: CheckpointReader | ChainReader) -> list[NewRecord]:
    """Every verified record of a checkpoint or chain with its rows in memory (float for int8 files), as
    records to write again (a bundle's import, a checkpoint file stored as a chain); CheckpointError at
    the first damage."""
    records, problem = reader.scan()
    if problem is not None:
        raise problem
    shape = reader.header.shape
    dtype = np.dtype(shape.dtype)
    out = []
    for r in records:
        tokens = reader.read_tokens(r, 1 << 32)
        blocks = [np.empty((r.n_tokens, shape.head_dim), dtype=dtype) for _ in range(2 * shape.n_layers * shape.n_kv_heads)]
        rows = reader.rows([r])
        rows.fill(lambda s, e, blocks=blocks, base=r.start: [b[s - base : e - base] for b in blocks])
        if rows.problem is not None:
            raise rows.problem
        out.append(NewRecord(r.start, tokens, blocks, r.text_len, r.text_sha, r.reason))
    return out
