"""Content-addressed KV blocks: a context cut into runs of tokens, each stored once whoever made it.

A block's identity is SHA-256 over the identity of the block before it (the *parent*; the first
block's parent is the *root*, which names the model, tokenizer, KV shape and encoding), its start
position and its token ids. KV rows are a function of the model and every token up to them, so equal
identities mean equal rows: a chat, an edited branch, an API request or an imported bundle that
begins with the same tokens under the same model uses the same blocks (as vLLM's and SGLang's
prefix caches do in RAM; here on disk, verified, across chats and restarts).

A block *file* is a checkpoint file (docs/checkpoint-format.md) whose file id is the block's
identity and whose one record holds the block's tokens and rows; its header and record checksums
are seeded with that identity, so a block file renamed to another block's name does not verify.
Blocks carry no text: the chain's text is what its tokens spell, checked against the prompt by the
restorer. A *node* is a block of a chain: either a whole block file, or the first rows of one (a
prefix node: two chats that diverge inside a block share its first rows without a copy).
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from engine.checkpoint.format import (
    HEADER_SIZE,
    CheckpointError,
    FileHeader,
    Identity,
    Reason,
    RecordInfo,
    unpack_record_header,
)
from engine.checkpoint.reader import CheckpointReader
from engine.checkpoint.writer import NewRecord, _write_all, now_ms
from engine.fsutil import atomic_write
from engine.private_files import private_dir

ID_BYTES = 32
BLOCK_SUFFIX = ".hkb"
_ROOT_TAG = b"hearth-kv-root-v1"
_NODE_TAG = b"hearth-kv-block-v1"


def root_id(identity: Identity, layout: int) -> bytes:
    """The parent of every chain's first block under this model, tokenizer, KV shape and encoding."""
    s = identity.shape
    return hashlib.sha256(_ROOT_TAG + identity.model_fp + identity.tokenizer_fp + struct.pack(
        "<IIIIB", s.n_layers, s.n_kv_heads, s.head_dim, layout, 1 if s.dtype == "float16" else 0)).digest()


def node_id(parent: bytes, start: int, tokens: Sequence[int]) -> bytes:
    """The identity of the block holding ``tokens`` at ``start`` after block ``parent``."""
    return hashlib.sha256(_NODE_TAG + parent + struct.pack("<I", start)
                          + np.asarray(tokens, dtype="<u4").tobytes()).digest()


@dataclass(frozen=True)
class Node:
    """One block of a chain: tokens [start, end) whose rows are the first ``end - start`` rows of the
    block file ``physical`` (itself, for a whole block)."""

    id: bytes
    parent: bytes
    start: int
    end: int
    physical: bytes

    @property
    def n_tokens(self) -> int:
        return self.end - self.start


def block_path(root: Path, physical: bytes) -> Path:
    """Where a block file lives: fanned out by its first byte so no directory grows huge."""
    name = physical.hex()
    return root / name[:2] / f"{name}{BLOCK_SUFFIX}"


def block_header(identity: Identity, layout: int, physical: bytes) -> FileHeader:
    return FileHeader(1, layout, identity.shape, physical[:16], identity.model_fp, identity.tokenizer_fp, now_ms(),
                      identity.label, 0, 0)


def write_block(path: Path, identity: Identity, layout: int, physical: bytes, start: int, tokens: Sequence[int],
                rows: Sequence[np.ndarray]) -> int:
    """Write one block file atomically; return its size in bytes."""
    header = block_header(identity, layout, physical)
    private_dir(path.parent)  # the store's folders are the user's alone, whatever the umask
    rec = NewRecord(start, list(tokens), rows, 0, b"\0" * 32, "turn")
    with atomic_write(path) as fh:
        _, size = _write_all(fh, header, [rec])
    return size


class BlockFileReader(CheckpointReader):
    """A block file as untrusted input: the checkpoint reader's checks, its one record starting at the
    block's position rather than 0, and its identity checked against the name it was asked for."""

    def __init__(self, path: Path, physical: bytes, start: int):
        super().__init__(path)
        self.physical, self.start = physical, start

    def scan(self) -> tuple[list[RecordInfo], CheckpointError | None]:
        h = self.header or self.read_header()
        if h.file_id != self.physical[:16]:
            return [], CheckpointError(Reason.CHECKSUM, f"block {self.physical.hex()[:16]} holds another block "
                                       "(its file id does not match its name)")
        if self.size < HEADER_SIZE + 128:
            return [], CheckpointError(Reason.TRUNCATED, f"block {self.physical.hex()[:16]} is cut short")
        try:
            r = unpack_record_header(self._read_at(HEADER_SIZE, 128), HEADER_SIZE, h.seed)
            if r.start != self.start:
                raise CheckpointError(Reason.LAYOUT, f"block {self.physical.hex()[:16]} starts at token {r.start}, "
                                      f"not {self.start}")
            self._check_bounds(r, 0, self.start)
        except CheckpointError as exc:
            return [], exc
        if r.end_offset != self.size:
            return [], CheckpointError(Reason.LAYOUT, f"block {self.physical.hex()[:16]} has "
                                       f"{self.size - r.end_offset} bytes after its record")
        return [r], None


def check_node_tokens(node: Node, tokens: Sequence[int]) -> None:
    """The node's tokens (its block's first ``n_tokens``) must hash to its identity after its parent:
    a block moved into another chain, or a forged one, fails here."""
    if len(tokens) < node.n_tokens:
        raise CheckpointError(Reason.TRUNCATED, f"block {node.physical.hex()[:16]} holds {len(tokens)} tokens; "
                              f"the chain needs {node.n_tokens}")
    if node_id(node.parent, node.start, tokens[: node.n_tokens]) != node.id:
        raise CheckpointError(Reason.PREFIX_MISMATCH, f"block {node.id.hex()[:16]} (tokens {node.start}–{node.end}) "
                              "does not hold the tokens its chain names")
