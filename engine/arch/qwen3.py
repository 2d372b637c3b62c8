"""Qwen3 (llama.cpp's "qwen3"; dense models).

Llama's layer, with: an RMSNorm over each head of Q and of K before rotary (``attn_q_norm`` /
``attn_k_norm``, [head_dim]), no biases, a head size from ``key_length`` that need not be
n_embd / n_head, and Q/K rows used as stored (NEOX-style rotary, as for qwen2).
GroupQueryAttention rotates inside, so Q and K are normalized before it and passed to it apart.
"""

from __future__ import annotations

from engine.arch.blocks import Graph
from engine.arch.config import ModelConfig
from engine.arch.hparams import check_shape, decoder_config
from engine.arch.rope import rotary_streams
from engine.model.gguf_file import GGUFModel

NAME = "qwen3"
GRAPH_VERSION = 1


def read_config(model: GGUFModel) -> ModelConfig:
    cfg = decoder_config(model, NAME)
    for i in range(cfg.n_layers):  # every layer's, so a damaged file is refused before anything is built
        for part in ("attn_q_norm", "attn_k_norm"):
            check_shape(model, f"blk.{i}.{part}.weight", (cfg.head_dim,), f"heads of {cfg.head_dim}")
    return cfg


def build(g: Graph) -> None:
    cfg = g.cfg
    ids = g.inputs()
    rotary = g.rotary(*rotary_streams(cfg))
    pending, residual = g.embed(ids), None  # pending: a block's output, not yet added to the residual
    for i in g.layers():
        p = f"blk.{i}."
        normed, residual = g.add_and_norm(pending, residual, p + "attn_norm.weight")
        q, k, v = g.qk_normed_qkv(normed, p)
        attn = g.attention(i, q, rotary, key=k, value=v)
        out = g.linear(attn, p + "attn_output", g.weight(p + "attn_output.weight"))
        normed, residual = g.add_and_norm(out, residual, p + "ffn_norm.weight")
        pending = g.swiglu_mlp(normed, p)
    final, _ = g.add_and_norm(pending, residual, "output_norm.weight")
    g.logits(final)
