"""Qwen2 and Qwen2.5 (llama.cpp's "qwen2").

Llama's layer, with two differences: Q, K and V carry biases, and llama.cpp stores Q/K rows as the
Hugging Face model has them (its NEOX-style rotary already pairs (i, i + d/2)), so they are used as
stored: no un-permute.
"""

from __future__ import annotations

from engine.arch.blocks import Graph
from engine.arch.config import ModelConfig
from engine.arch.hparams import check_shape, decoder_config
from engine.arch.rope import rotary_streams
from engine.model.gguf_file import GGUFModel

NAME = "qwen2"
GRAPH_VERSION = 1
_QKV = ("attn_q", "attn_k", "attn_v")


def read_config(model: GGUFModel) -> ModelConfig:
    cfg = decoder_config(model, NAME)
    widths = {"attn_q": cfg.n_head * cfg.head_dim, "attn_k": cfg.n_head_kv * cfg.head_dim,
              "attn_v": cfg.n_head_kv * cfg.head_dim}
    for i in range(cfg.n_layers):  # every layer's, so a damaged file is refused before anything is built
        for part, width in widths.items():
            check_shape(model, f"blk.{i}.{part}.bias", (width,), f"{part}'s {width} outputs")
    return cfg


def build(g: Graph) -> None:
    ids = g.inputs()
    rotary = g.rotary(*rotary_streams(g.cfg))
    pending, residual = g.embed(ids), None  # pending: a block's output, not yet added to the residual
    for i in g.layers():
        p = f"blk.{i}."
        normed, residual = g.add_and_norm(pending, residual, p + "attn_norm.weight")
        qkv = g.fused_linear(normed, p + "attn_qkv", {p + t + ".weight": g.weight(p + t + ".weight") for t in _QKV},
                             {p + t + ".weight": g.vector(p + t + ".bias") for t in _QKV})
        attn = g.attention(i, qkv, rotary)
        out = g.linear(attn, p + "attn_output", g.weight(p + "attn_output.weight"))
        normed, residual = g.add_and_norm(out, residual, p + "ffn_norm.weight")
        pending = g.swiglu_mlp(normed, p)
    final, _ = g.add_and_norm(pending, residual, "output_norm.weight")
    g.logits(final)
