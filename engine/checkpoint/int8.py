"""The int8 row encoding of a checkpoint payload (layout 2, ``docs/checkpoint-format.md`` §4b).

Each row (one token of one K or V head: ``head_dim`` values) is stored as ``head_dim`` int8 codes and
one float16 scale: ``value ≈ code × scale``, ``scale = max|row| / 127``, codes rounded to nearest and
clipped to [-127, 127]. One scale per row keeps a record self-contained (an append or a cut never
touches another record's scales) and bounds every element's error by half a step of its own row,
``max|row| / 254`` (plus float16's rounding of the scale, 2⁻¹¹ relative).

A layer is stored as all its codes (K heads then V heads, each ``[n, head_dim]``) followed by all its
scales (same order, ``[n]`` each), so one read brings a layer into a scratch buffer and two views
dequantize it with a handful of vectorized numpy calls.
"""

from __future__ import annotations

import queue
from collections.abc import Sequence

import numpy as np

from engine.checkpoint.format import SCALE_DTYPE

MAX_CODE = 127
_F16_MAX = float(np.finfo(np.float16).max)
_SCALE_LIMIT = 0x7C00  # float16 bit patterns below this are finite and non-negative
_scratch: queue.SimpleQueue[np.ndarray] = queue.SimpleQueue()


def quantize_layer(blocks: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """One layer's row blocks (each ``[n, head_dim]``, float32 or float16) → (codes int8
    ``[blocks, n, head_dim]``, scales float16 ``[blocks, n]``). Non-finite values (a cache that is
    already broken) are clamped first so that every scale written is finite."""
    x = np.stack(blocks).astype(np.float32, copy=False)  # a new array either way: scaled in place below
    absmax = _absmax(x)
    if not np.isfinite(absmax).all():
        x = np.nan_to_num(x, nan=0.0, posinf=_F16_MAX, neginf=-_F16_MAX)
        absmax = _absmax(x)
    scales = np.minimum(absmax * (1.0 / MAX_CODE), _F16_MAX).astype(SCALE_DTYPE)
    exact = scales.astype(np.float32)  # quantize against the scale the reader will see
    inverse = np.divide(1.0, exact, out=np.zeros_like(exact), where=exact > 0)
    np.multiply(x, inverse[..., None], out=x)
    np.rint(x, out=x)
    np.clip(x, -MAX_CODE, MAX_CODE, out=x)
    return x.astype(np.int8), scales


def _absmax(x: np.ndarray) -> np.ndarray:
    """max |x| over the last axis (one reduction over a temporary: about twice as fast as max and min)."""
    if not x.size:
        return np.zeros(x.shape[:-1], np.float32)
    return np.abs(x).max(axis=-1)


def scales_valid(scales: np.ndarray) -> bool:
    """Every scale finite and non-negative (the writer never stores anything else)."""
    return bool((scales.view("<u2") < _SCALE_LIMIT).all())


def dequantize_into(codes: np.ndarray, scales: np.ndarray, dest: Sequence[np.ndarray]) -> None:
    """Write ``codes × scales`` into each destination block (float32 or float16, ``[n, head_dim]``)."""
    scales32 = scales.astype(np.float32)
    for i, block in enumerate(dest):
        np.multiply(codes[i], scales32[i, :, None], out=block, casting="same_kind")


def take_scratch(nbytes: int) -> np.ndarray:
    """A reusable byte buffer of at least ``nbytes`` (kept across restores so that its pages are
    already faulted in); give it back with ``give_scratch``."""
    try:
        buf = _scratch.get_nowait()
    except queue.Empty:
        buf = None
    if buf is None or buf.nbytes < nbytes:
        buf = np.empty(nbytes, np.uint8)
    return buf


def give_scratch(buf: np.ndarray, keep: int) -> None:
    """Return a scratch buffer; at most ``keep`` buffers are kept between reads."""
    if _scratch.qsize() < keep:
        _scratch.put(buf)
