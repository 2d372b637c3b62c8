"""Rotary tables for GroupQueryAttention, and the per-frequency factors some GGUFs carry.

GQA rotates the pairs (i, i + d/2) of each head (half-split) by position · frequency i; the tables
hold cos and sin of those angles for every position of the context.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

from engine.arch.config import ModelConfig
from engine.errors import ModelFileError
from engine.model.gguf_file import GGUFModel

FREQ_FACTORS = "rope_freqs.weight"  # llama 3.1/3.2: each frequency is divided by its factor


# Positions computed at once: ~8 MiB of float64 angles. A whole table at a time held three float64 copies
# of it: a declared 1,000,000-token context with 256-dim heads peaked at 3.0 GB converting (1.0 GB of it
# the tables themselves); a block at a time, the converter streams each block to the weights file.
BLOCK_BYTES = 8 << 20


@dataclass(frozen=True)
class RotaryTable:
    """cos or sin [context_length, rope_dim/2] of every position's angles, made a block of positions at a
    time (``blocks``), so that no table of a long context is ever whole in memory while converting."""

    positions: int
    inv_freq: np.ndarray  # float64 [rope_dim/2], the frequency factors already applied
    rope_scale: float
    magnitude: float
    fn: Callable[[np.ndarray], np.ndarray]  # np.cos or np.sin

    @property
    def shape(self) -> tuple[int, int]:
        return self.positions, self.inv_freq.size

    def nbytes(self, dtype: np.dtype | type = np.float32) -> int:
        return self.positions * self.inv_freq.size * np.dtype(dtype).itemsize

    def blocks(self, dtype: np.dtype | type = np.float32) -> Iterator[np.ndarray]:
        """The table's rows in order, a block at a time, in ``dtype``: computed in float64, rounded to float32
        once, then cast (the values a whole table gave, bit for bit)."""
        step = max(1, BLOCK_BYTES // (8 * max(1, self.inv_freq.size)))
        for start in range(0, self.positions, step):
            positions = np.arange(start, min(start + step, self.positions), dtype=np.float64) / self.rope_scale
            block = (self.magnitude * self.fn(np.outer(positions, self.inv_freq))).astype(np.float32)
            yield block.astype(dtype, copy=False)

    def array(self, dtype: np.dtype | type = np.float32) -> np.ndarray:
        """The whole table (tests and short contexts)."""
        out = np.empty(self.shape, dtype)
        row = 0
        for block in self.blocks(dtype):
            out[row: row + len(block)] = block
            row += len(block)
        return out


def rotary_streams(cfg: ModelConfig, freq_factors: np.ndarray | None = None,
                   magnitude: float = 1.0) -> tuple[RotaryTable, RotaryTable]:
    """cos/sin caches [context_length, rope_dim/2] in the half-split layout, as tables made a block at a
    time (``Graph.rotary`` streams them to the weights file); ``freq_factors`` [rope_dim/2] divide the
    frequencies, ``magnitude`` scales both tables (Phi-3's long-rope attention factor); computed in
    float64, then rounded once."""
    half = cfg.rope_dim // 2
    inv_freq = 1.0 / (cfg.rope_base ** (np.arange(half, dtype=np.float64) * 2.0 / cfg.rope_dim))
    if freq_factors is not None:
        inv_freq = inv_freq / freq_factors.astype(np.float64)
    return (RotaryTable(cfg.context_length, inv_freq, cfg.rope_scale, magnitude, np.cos),
            RotaryTable(cfg.context_length, inv_freq, cfg.rope_scale, magnitude, np.sin))


def rotary_tables(cfg: ModelConfig, freq_factors: np.ndarray | None = None,
                  magnitude: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """``rotary_streams``' tables whole, in float32."""
    cos, sin = rotary_streams(cfg, freq_factors, magnitude)
    return cos.array(), sin.array()


def freq_factors(model: GGUFModel, cfg: ModelConfig, tensor: str = FREQ_FACTORS) -> np.ndarray | None:
    """The file's rotary frequency factors in ``tensor``, None when it has none; ModelFileError when they
    cannot be the factors of this model's rotary dims (wrong count, type or sign)."""
    if not model.has_tensor(tensor):
        return None
    t = model.tensor(tensor)
    name, want = model.path.name, cfg.rope_dim // 2
    if t.tensor_type.name not in ("F32", "F16"):
        raise ModelFileError(f"{name}: {tensor} is {t.tensor_type.name}, expected F32")
    values = np.asarray(t.data, dtype=np.float64).reshape(-1)
    if values.size != want:
        raise ModelFileError(f"{name}: {tensor} holds {values.size} values, expected {want} (half the rotary dims)")
    if not np.all(np.isfinite(values) & (values > 0)):
        raise ModelFileError(f"{name}: {tensor} holds values that are not positive numbers")
    return values
