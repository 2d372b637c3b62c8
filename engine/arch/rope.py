"""Rotary tables for GroupQueryAttention, and the per-frequency factors some GGUFs carry.

GQA rotates the pairs (i, i + d/2) of each head (half-split) by position · frequency i; the tables
hold cos and sin of those angles for every position of the context.
"""

from __future__ import annotations

import numpy as np

from engine.arch.config import ModelConfig
from engine.errors import ModelFileError
from engine.model.gguf_file import GGUFModel

FREQ_FACTORS = "rope_freqs.weight"  # llama 3.1/3.2: each frequency is divided by its factor


def rotary_tables(cfg: ModelConfig, freq_factors: np.ndarray | None = None,
                  magnitude: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """cos/sin caches [context_length, rope_dim/2] in the half-split layout; ``freq_factors``
    [rope_dim/2] divide the frequencies, ``magnitude`` scales both tables (Phi-3's long-rope attention
    factor); computed in float64, then rounded once."""
    half = cfg.rope_dim // 2
    inv_freq = 1.0 / (cfg.rope_base ** (np.arange(half, dtype=np.float64) * 2.0 / cfg.rope_dim))
    if freq_factors is not None:
        inv_freq = inv_freq / freq_factors.astype(np.float64)
    positions = np.arange(cfg.context_length, dtype=np.float64) / cfg.rope_scale
    angles = np.outer(positions, inv_freq)
    return (magnitude * np.cos(angles)).astype(np.float32), (magnitude * np.sin(angles)).astype(np.float32)


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
