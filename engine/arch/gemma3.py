"""Gemma 3 (llama.cpp's "gemma3"; the text decoder).

Per layer: RMSNorm → Q, K, V (fused) → RMSNorm over each head of Q and of K → GroupQueryAttention
(NEOX-style rotary inside, rows used as stored) → output projection → RMSNorm of the attention's
output ("post_attention_norm") → residual add, fused with the pre-FFN RMSNorm → GELU-tanh(gate) · up
→ down → RMSNorm of the FFN's output ("post_ffw_norm") → residual add. The token embedding is scaled
by √n_embd; the head is tied.

What is Gemma's own:
* GGUF norm gains already hold Gemma's ``1 + w`` (llama.cpp's converter adds the 1), so they are
  used as stored, like every other architecture's.
* Sliding-window attention: layer i is local when ``i % 6 < 5``, attending to the last
  ``attention.sliding_window`` keys (the current one included; GQA's ``local_window_size``). Local
  layers rotate with base 10000 and no scaling, global ones with ``rope.freq_base`` and its scaling.
  A file without ``sliding_window`` has no local layers. Every layer keeps a full-length KV cache, so
  truncation and checkpoints work as for any model (docs/checkpoint-format.md).
* The attention scale is 1/√head_dim, head_dim being ``key_length`` (256 in the 270M model, where
  n_embd / n_head is 160); the 27B model (62 layers) uses 1/√(n_embd / n_head), as llama.cpp does.
"""

from __future__ import annotations

import math
from dataclasses import replace

from engine.arch.blocks import Graph
from engine.arch.config import ModelConfig
from engine.arch.hparams import check_shape, decoder_config
from engine.arch.rope import rotary_streams
from engine.model.gguf_file import GGUFModel

NAME = "gemma3"
GRAPH_VERSION = 1
# The 270M model's residual stream passes fp16's 65,504 — up to ~104,000 from layer 7 on, while every other
# activation stays under ~20,000 (bench/gemma_ranges.py, the float64 reference over the real GGUF) — so an fp16
# graph keeps the residual stream at 1/RESIDUAL_SCALE of its size. Every read of it is an RMSNorm, exact for a
# scaled input with epsilon / S², and every write a post-norm whose gain is divided by S: the same model, with
# no extra kernel. 8 leaves ~5× of headroom below fp16's limit.
RESIDUAL_SCALE = 8.0
SWA_PATTERN = 6  # every sixth layer is global, the other five local
LOCAL_ROPE_BASE = 10000.0
_27B_LAYERS = 62  # llama.cpp tells the 27B model apart by its layer count


def read_config(model: GGUFModel) -> ModelConfig:
    cfg = decoder_config(model, NAME)
    window = _sliding_window(model)
    head_size = cfg.n_embd // cfg.n_head if cfg.n_layers == _27B_LAYERS else cfg.head_dim
    for i in range(cfg.n_layers):  # every layer's, so a damaged file is refused before anything is built
        for part in ("attn_q_norm", "attn_k_norm"):
            check_shape(model, f"blk.{i}.{part}.weight", (cfg.head_dim,), f"heads of {cfg.head_dim}")
        for part in ("post_attention_norm", "post_ffw_norm"):
            check_shape(model, f"blk.{i}.{part}.weight", (cfg.n_embd,), f"an embedding of {cfg.n_embd}")
    return replace(cfg, extras={
        "sliding_window": window,  # 0: none
        "local_layers": [i for i in range(cfg.n_layers) if window and is_local(i)],
        "local_rope_base": LOCAL_ROPE_BASE,
        "attention_scale": 1.0 / math.sqrt(head_size),
    })


def _sliding_window(model: GGUFModel) -> int:
    """The local layers' window in keys, 0 when the file has none (then no layer is local)."""
    key = NAME + ".attention.sliding_window"
    return 0 if model.value(key) is None else model.positive_int(key)


def is_local(layer: int) -> bool:
    """Whether a layer attends through the sliding window (when the model has one)."""
    return layer % SWA_PATTERN < SWA_PATTERN - 1


def build(g: Graph) -> None:
    cfg = g.cfg
    window, local_layers = cfg.extras["sliding_window"], set(cfg.extras["local_layers"])
    ids = g.inputs()
    rotary = g.rotary(*rotary_streams(cfg))
    if local_layers:
        local_cfg = replace(cfg, rope_base=cfg.extras["local_rope_base"], rope_scale=1.0)
        local_rotary = g.rotary(*rotary_streams(local_cfg), name="rotary.local")
    s = RESIDUAL_SCALE if g.half else 1.0  # the residual stream's size is 1/s of the model's (fp16's range)
    read, write = {"eps_scale": 1.0 / (s * s)}, {"gain_scale": 1.0 / s}
    # sqrt(n_embd) in fp32, as llama.cpp scales it (not rounded to bf16 as the reference model does).
    pending, residual = g.scale(g.embed(ids), math.sqrt(cfg.n_embd) / s, "embedding.scale"), None
    for i in g.layers():
        p = f"blk.{i}."
        normed, residual = g.add_and_norm(pending, residual, p + "attn_norm.weight", **read)
        q, k, v = g.qk_normed_qkv(normed, p)
        local = i in local_layers
        attn = g.attention(i, q, local_rotary if local else rotary, key=k, value=v,
                           scale=cfg.extras["attention_scale"], **({"local_window_size": window} if local else {}))
        out = g.linear(attn, p + "attn_output", g.weight(p + "attn_output.weight"))
        out, _ = g.add_and_norm(out, None, p + "post_attention_norm.weight", **write)
        normed, residual = g.add_and_norm(out, residual, p + "ffn_norm.weight", **read)
        pending, _ = g.add_and_norm(g.geglu_mlp(normed, p), None, p + "post_ffw_norm.weight", **write)
    final, _ = g.add_and_norm(pending, residual, "output_norm.weight", **read)
    g.logits(final)
