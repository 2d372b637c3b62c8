"""Llama (and the models llama.cpp files as "llama": SmolLM2, Llama 2/3, Mistral, ...).

Per layer: RMSNorm (fused with the residual add) → one fused QKV projection → GroupQueryAttention
(rotary inside, half-split) → output projection → RMSNorm → SwiGLU MLP with gate/up fused.
What is llama's own: llama.cpp stores Q and K rows permuted for its interleaved rotary (undone here,
so rotary pairs are (i, i + d/2) as GQA's half-split kernel wants). Llama 3.1/3.2 files carry
``rope_freqs.weight``, the per-frequency divisors of their rope scaling, baked into the rotary tables.
"""

from __future__ import annotations

import numpy as np

from engine.arch.blocks import Graph
from engine.arch.config import ModelConfig
from engine.arch.hparams import decoder_config
from engine.arch.rope import freq_factors, rotary_streams
from engine.model.gguf_file import GGUFModel
from engine.model.weights import RowOrder

NAME = "llama"
GRAPH_VERSION = 1


def read_config(model: GGUFModel) -> ModelConfig:
    cfg = decoder_config(model, NAME)
    freq_factors(model, cfg)  # llama 3.1/3.2's factors: refuse a damaged tensor before building
    return cfg


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


def build(g: Graph) -> None:
    cfg = g.cfg
    ids = g.inputs()
    rotary = g.rotary(*rotary_streams(cfg, freq_factors(g.model, cfg)))
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
