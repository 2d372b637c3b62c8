"""The KV cache protocol: what checkpoint I/O asks of a cache, whatever its memory layout.

A cache holds the keys and values of rows [0, ``length``) for every layer and KV head. Rows leave and
enter it in the checkpoint's record order, as blocks: for each layer, K then V, for each KV head, one
``[n, head_dim]`` array (``docs/checkpoint-format.md`` §4). A save writes the blocks ``read_rows``
gives as they come; a restore hands ``write_rows`` a verifying ``RowSource`` that reads a file
straight into the blocks the cache asks it to fill. Where the rows really live (per-layer CPU
buffers, one GPU buffer behind a pinned staging array, another element type) is the cache's
business: ``engine/runtime/kv_cache.py`` implements the three.

The contract that makes a restore safe: rows become visible (``length`` advances over them) only
after their checksum verified, and whatever a failed or interrupted fill left behind is cleared, so
no unverified byte serves a forward pass or lingers in the cache even as scratch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol, runtime_checkable

import numpy as np

# (start, end) → writable, C-contiguous row blocks for tokens [start, end), in checkpoint order
BlocksFn = Callable[[int, int], Sequence[np.ndarray]]


@runtime_checkable
class RowSource(Protocol):
    """Rows delivered in pieces (a checkpoint's records), each verified before the next is read."""

    dtype: np.dtype | None
    """The element type it writes into the blocks; None when it converts into any float type
    (int8 rows, dequantized on the way in)."""

    def fill(self, blocks: BlocksFn) -> int:
        """Write each piece [s, e) into ``blocks(s, e)`` and verify it, in order, stopping at the first
        piece that fails; return where the verified rows end (the first piece's start if none did)."""
        ...


@runtime_checkable
class KVCacheProtocol(Protocol):
    """One conversation's KV rows, seen as rows: the interface checkpoint I/O and sessions use."""

    length: int  # rows [0, length) are valid; everything after is scratch

    def truncate(self, length: int) -> None:
        """Keep the first ``length`` rows (exact for causal attention)."""
        ...

    def read_rows(self, start: int, end: int) -> list[np.ndarray]:
        """Rows [start, end) (within ``length``) as blocks in checkpoint order, for a save. On the CPU
        they are views of the cache itself: valid until the cache next changes."""
        ...

    def write_rows(self, start: int, end: int, source: RowSource) -> int:
        """Replace rows [start, end) (``start`` ≤ ``length``; rows before it are kept) with what
        ``source`` fills and verifies. Only verified rows become visible; unverified ones are
        cleared, also when ``fill`` raises. Returns the new length: where the verified rows end."""
        ...
