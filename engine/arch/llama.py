"""Llama (and the models llama.cpp files as "llama": SmolLM2, Llama 2/3, Mistral, ...).

Per layer: RMSNorm (fused with the residual add) → one fused QKV projection → GroupQueryAttention
(rotary inside, half-split) → output projection → RMSNorm → SwiGLU MLP with gate/up fused.
What is llama's own: llama.cpp stores Q and K rows permuted for its interleaved rotary (undone here,
so rotary pairs are (i, i + d/2) as GQA's half-split kernel wants), and its rotary tables.
"""

from __future__ import annotations

import numpy as np

from engine.arch.blocks import Graph
from engine.arch.config import ModelConfig
from engine.errors import ModelFileError, UnsupportedModelError
from engine.model.gguf_file import GGUFModel
from engine.model.weights import RowOrder

NAME = "llama"
GRAPH_VERSION = 1


def read_config(model: GGUFModel) -> ModelConfig:
    name, p = model.path.name, NAME + "."
    n_embd = model.positive_int(p + "embedding_length")
    n_head = model.positive_int(p + "attention.head_count")
    n_head_kv = model.positive_int(p + "attention.head_count_kv", n_head)
    head_dim = model.positive_int(p + "attention.key_length", n_embd // n_head or 1)
    if model.positive_int(p + "attention.value_length", head_dim) != head_dim:
        raise UnsupportedModelError(f"{name}: different key and value head sizes are not supported")
    if n_head % n_head_kv:
        raise ModelFileError(f"{name}: {n_head} query heads cannot share {n_head_kv} KV heads evenly")
    rope_dim = model.positive_int(p + "rope.dimension_count", head_dim)
    if rope_dim != head_dim:
        raise UnsupportedModelError(f"{name}: partial rotary embeddings ({rope_dim} of {head_dim} dims) are not supported")
    scaling = model.value(p + "rope.scaling.type", "none")
    rope_scale = 1.0
    if scaling == "linear":
        rope_scale = float(model.value(p + "rope.scaling.factor", 1.0))
    elif scaling not in ("none", None):
        raise UnsupportedModelError(f"{name}: rope scaling {scaling!r} is not supported")
    if model.has_tensor("rope_freqs.weight"):
        raise UnsupportedModelError(f"{name}: per-frequency rope factors (llama 3.1 style) are not supported")
    return ModelConfig(
        architecture=NAME,
        n_layers=model.positive_int(p + "block_count"),
        n_embd=n_embd,
        n_ff=model.positive_int(p + "feed_forward_length"),
        n_head=n_head,
        n_head_kv=n_head_kv,
        head_dim=head_dim,
        context_length=model.positive_int(p + "context_length"),
        vocab_size=model.vocab_size(p + "vocab_size", n_embd),
        norm_eps=float(model.require(p + "attention.layer_norm_rms_epsilon")),
        rope_dim=rope_dim,
        rope_base=float(model.value(p + "rope.freq_base", 10000.0)),
        rope_scale=rope_scale,
        tied_embeddings=not model.has_tensor("output.weight"),
    )


def unpermute_heads(rows: np.ndarray, n_heads: int) -> np.ndarray:
    """Undo llama.cpp's Q/K row permutation so rotary pairs are (i, i + d/2), not (2i, 2i + 1).

    The permutation only reorders output rows, so it applies to quantized rows just the same.
    """
    n = rows.shape[0]
    head_dim = n // n_heads
    tail = rows.shape[1:]
    return rows.reshape(n_heads, head_dim // 2, 2, *tail).swapaxes(1, 2).reshape(n, *tail)


def _unpermute(n_heads: int) -> RowOrder:
    return lambda rows: unpermute_heads(rows, n_heads)


def rotary_tables(cfg: ModelConfig) -> tuple[np.ndarray, np.ndarray]:
    """cos/sin caches [context_length, rope_dim/2] in the non-interleaved (half-split) layout."""
    half = cfg.rope_dim // 2
    inv_freq = 1.0 / (cfg.rope_base ** (np.arange(half, dtype=np.float64) * 2.0 / cfg.rope_dim))
    positions = np.arange(cfg.context_length, dtype=np.float64) / cfg.rope_scale
    angles = np.outer(positions, inv_freq)
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


def build(g: Graph) -> None:
    cfg = g.cfg
    ids = g.inputs()
    rotary = g.rotary(*rotary_tables(cfg))
    pending, residual = g.embed(ids), None  # pending: a block's output, not yet added to the residual
    for i in g.layers():
        p = f"blk.{i}."
        normed, residual = g.add_and_norm(pending, residual, p + "attn_norm.weight")
        qkv = g.fused_linear(normed, p + "attn_qkv", {
            p + "attn_q.weight": g.weight(p + "attn_q.weight", _unpermute(cfg.n_head)),
            p + "attn_k.weight": g.weight(p + "attn_k.weight", _unpermute(cfg.n_head_kv)),
            p + "attn_v.weight": g.weight(p + "attn_v.weight"),
        })
        attn = g.attention(i, qkv, rotary)
        out = g.linear(attn, p + "attn_output", g.weight(p + "attn_output.weight"))
        normed, residual = g.add_and_norm(out, residual, p + "ffn_norm.weight")
        pending = g.swiglu_mlp(normed, p)
    final, _ = g.add_and_norm(pending, residual, "output_norm.weight")
    g.logits(final)
