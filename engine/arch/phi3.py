"""Phi-3 and Phi-3.5 (llama.cpp's "phi3").

Llama's layer with its tensors fused in the file: ``attn_qkv`` holds the Q, K and V rows in that order,
and ``ffn_up`` the gate rows then the up rows. Q/K rows are used as stored (NEOX-style rotary, as
qwen2). The 128k-context files carry two sets of rotary frequency divisors: ``rope_factors_long``
where the context in use is longer than ``rope.scaling.original_context_length``, else
``rope_factors_short`` (llama.cpp's rule; Hearth's context is the file's full one), and an attention
factor that scales the rotary tables' magnitude. Phi-4-mini's partial rotary is refused by hparams.
"""

from __future__ import annotations

import numpy as np

from engine.arch.blocks import Graph
from engine.arch.config import ModelConfig
from engine.arch.hparams import check_shape, decoder_config
from engine.arch.rope import freq_factors, rotary_streams
from engine.errors import ModelFileError
from engine.model.gguf_file import GGUFModel

NAME = "phi3"
GRAPH_VERSION = 1
LONG, SHORT = "rope_factors_long.weight", "rope_factors_short.weight"


def read_config(model: GGUFModel) -> ModelConfig:
    cfg = decoder_config(model, NAME, fused_qkv=True)
    for i in range(cfg.n_layers):  # every layer's, so a damaged file is refused before anything is built
        check_shape(model, f"blk.{i}.ffn_up.weight", (cfg.n_embd, 2 * cfg.n_ff), f"gate and up rows of {cfg.n_ff}")
    rope_scaling(model, cfg)
    return cfg


def rope_scaling(model: GGUFModel, cfg: ModelConfig) -> tuple[np.ndarray | None, float]:
    """(frequency divisors or None, the tables' magnitude) for the context Hearth runs the model at."""
    long, short = freq_factors(model, cfg, LONG), freq_factors(model, cfg, SHORT)
    if (long is None) != (short is None):
        raise ModelFileError(f"{model.path.name}: has {LONG if short is None else SHORT} without "
                             f"{SHORT if short is None else LONG}; Phi-3's long-context rotary needs both")
    if long is None:
        return None, 1.0
    original = model.positive_int(NAME + ".rope.scaling.original_context_length", cfg.context_length)
    magnitude = float(model.value(NAME + ".rope.scaling.attn_factor", 1.0))
    if not (np.isfinite(magnitude) and magnitude > 0):
        raise ModelFileError(f"{model.path.name}: rope.scaling.attn_factor is {magnitude}, not a positive number")
    return (long if cfg.context_length > original else short), magnitude


def build(g: Graph) -> None:
    cfg = g.cfg
    ids = g.inputs()
    rotary = g.rotary(*rotary_streams(cfg, *rope_scaling(g.model, cfg)))
    pending, residual = g.embed(ids), None  # pending: a block's output, not yet added to the residual
    for i in g.layers():
        p = f"blk.{i}."
        normed, residual = g.add_and_norm(pending, residual, p + "attn_norm.weight")
        qkv = g.linear(normed, p + "attn_qkv", g.weight(p + "attn_qkv.weight"))
        attn = g.attention(i, qkv, rotary)
        out = g.linear(attn, p + "attn_output", g.weight(p + "attn_output.weight"))
        normed, residual = g.add_and_norm(out, residual, p + "ffn_norm.weight")
        pending = g.swiglu_from(g.linear(normed, p + "ffn_gate_up", g.weight(p + "ffn_up.weight")), p)
    final, _ = g.add_and_norm(pending, residual, "output_norm.weight")
    g.logits(final)
