"""The decoder hyperparameters that llama-like architectures store under the same GGUF keys.

Each architecture module reads its config through ``decoder_config`` (its own ``<arch>.`` prefix) and
then checks what only it has. What the shared graph cannot compute is refused here, once for all.
"""

from __future__ import annotations

import re

from engine.arch.config import ModelConfig
from engine.errors import ModelFileError, UnsupportedModelError
from engine.model.gguf_file import GGUFModel

# The longest context a file may declare. The graph bakes rope tables of context × head_dim × 4 bytes
# (512 MiB at this length and 128-wide heads), and the longest real models here (Qwen2.5-1M) declare
# 1,010,000; a file declaring 2^31−1 made conversion ask numpy for 16 GiB before anything else ran.
MAX_CONTEXT_LENGTH = 1 << 20
_BLOCK_INDEX = re.compile(r"blk\.(\d{1,9})\.")
# The largest value each shape field may declare. A larger one is a damaged or hostile file, refused here
# with the field named, before any size is computed from it: a block_count of 100,000 was reported as
# "78.7 GB for 512 tokens" of KV cache. Each bound is several times the largest real model's: layers
# (Llama 3.1 405B has 126, DeepSeek-V3 61), heads (128), head size (256 for Gemma; 576 for DeepSeek's
# compressed keys), width (Llama 405B's 16,384), feed-forward (its 53,248), vocabulary (Gemma's 262,144),
# experts (DeepSeek-V3's 256).
HPARAM_LIMITS = {
    "block_count": 1 << 10,
    "attention.head_count": 1 << 10,
    "attention.head_count_kv": 1 << 10,
    "attention.key_length": 1 << 12,
    "attention.value_length": 1 << 12,
    "rope.dimension_count": 1 << 12,
    "embedding_length": 1 << 16,
    "feed_forward_length": 1 << 18,
    "vocab_size": 1 << 21,
    "expert_count": 1 << 12,
    "expert_used_count": 1 << 12,
}


def decoder_config(model: GGUFModel, arch: str, fused_qkv: bool = False) -> ModelConfig:
    """The config under ``arch.`` keys; refuses inconsistent head counts and unsupported rope forms.
    ``fused_qkv``: the file holds Q, K and V in one ``attn_qkv`` tensor (Phi-3)."""
    name, p = model.path.name, arch + "."

    def bounded(field: str, default: int | None = None) -> int:
        return _bounded(model, p, field, default)

    n_embd = bounded("embedding_length")
    n_head = bounded("attention.head_count")
    n_head_kv = bounded("attention.head_count_kv", n_head)
    head_dim = bounded("attention.key_length", n_embd // n_head or 1)
    if bounded("attention.value_length", head_dim) != head_dim:
        raise UnsupportedModelError(f"{name}: different key and value head sizes are not supported")
    if n_head % n_head_kv:
        raise ModelFileError(f"{name}: {n_head} query heads cannot share {n_head_kv} KV heads evenly")
    rope_dim = bounded("rope.dimension_count", head_dim)
    for field in ("expert_count", "expert_used_count"):  # no architecture here reads them; bounded all the same
        if model.value(p + field) is not None:
            bounded(field)
    if rope_dim != head_dim:
        raise UnsupportedModelError(f"{name}: partial rotary embeddings ({rope_dim} of {head_dim} dims) are not supported")
    scaling = model.value(p + "rope.scaling.type", "none")
    rope_scale = 1.0
    if scaling == "linear":
        rope_scale = float(model.value(p + "rope.scaling.factor", 1.0))
    elif scaling not in ("none", None):
        raise UnsupportedModelError(f"{name}: rope scaling {scaling!r} is not supported")
    cfg = ModelConfig(
        architecture=arch,
        n_layers=_block_count(model, p + "block_count", bounded("block_count")),
        n_embd=n_embd,
        n_ff=bounded("feed_forward_length"),
        n_head=n_head,
        n_head_kv=n_head_kv,
        head_dim=head_dim,
        context_length=_context_length(model, p + "context_length"),
        vocab_size=_vocab_size(model, p + "vocab_size", n_embd),
        norm_eps=float(model.require(p + "attention.layer_norm_rms_epsilon")),
        rope_dim=rope_dim,
        rope_base=float(model.value(p + "rope.freq_base", 10000.0)),
        rope_scale=rope_scale,
        tied_embeddings=not model.has_tensor("output.weight"),
    )
    _check_attention_shapes(model, cfg, fused_qkv)
    return cfg


def _bounded(model: GGUFModel, prefix: str, field: str, default: int | None = None) -> int:
    """A positive integer under ``prefix + field``, no larger than HPARAM_LIMITS allows."""
    key, limit = prefix + field, HPARAM_LIMITS[field]
    value = model.positive_int(key, default)
    if value > limit:
        raise ModelFileError(f"{model.path.name}: metadata {key!r} declares {value:,}; no real model has more than "
                             f"{limit:,} (the file is damaged or hostile)")
    return value


def _block_count(model: GGUFModel, key: str, declared: int) -> int:
    """``declared`` layers, when the file holds tensors for exactly that many (``blk.N.*``, N counting
    from 0): a count that disagrees would size the KV cache and graph for layers that are not there."""
    held = {int(m.group(1)) for m in map(_BLOCK_INDEX.match, (t.name for t in model.tensors)) if m is not None}
    count = max(held) + 1 if held else 0
    if declared != count or len(held) != count:
        holds = f"tensors for {count:,}" if len(held) == count else f"tensors for {len(held):,} of blocks 0 to {count - 1:,}"
        raise ModelFileError(f"{model.path.name}: metadata {key!r} declares {declared:,} layers but the file holds "
                             f"{holds} (the file is damaged)")
    return declared


def _vocab_size(model: GGUFModel, key: str, n_embd: int) -> int:
    limit = HPARAM_LIMITS["vocab_size"]
    declared = model.value(key, 0)
    listed = model.array_length("tokenizer.ggml.tokens") if model.value(key) is None else 0
    for what, value in ((f"metadata {key!r}", declared), ("the token list", listed)):
        if isinstance(value, int) and value > limit:
            raise ModelFileError(f"{model.path.name}: {what} declares a vocabulary of {value:,} tokens; no real "
                                 f"model has more than {limit:,} (the file is damaged or hostile)")
    return model.vocab_size(key, n_embd)


def _context_length(model: GGUFModel, key: str) -> int:
    value = model.positive_int(key)
    if value > MAX_CONTEXT_LENGTH:
        raise ModelFileError(f"{model.path.name}: metadata {key!r} declares a context of {value:,} tokens; "
                             f"Hearth runs models of up to {MAX_CONTEXT_LENGTH:,} (the file is damaged or hostile)")
    return value


def _check_attention_shapes(model: GGUFModel, cfg: ModelConfig, fused_qkv: bool) -> None:
    """The first layer's Q/K/V/output matrices must have the widths the head counts say; else the
    graph would fail deep inside ONNX Runtime (say, a key_length that is missing or wrong)."""
    q, kv = cfg.n_head * cfg.head_dim, cfg.n_head_kv * cfg.head_dim
    expected = {"attn_q": (cfg.n_embd, q), "attn_k": (cfg.n_embd, kv), "attn_v": (cfg.n_embd, kv),
                "attn_output": (q, cfg.n_embd)}  # GGUF shapes: [in, out]
    if fused_qkv:
        expected = {"attn_qkv": (cfg.n_embd, q + 2 * kv), "attn_output": (q, cfg.n_embd)}
    for part, shape in expected.items():
        check_shape(model, f"blk.0.{part}.weight", shape,
                    f"{cfg.n_head} query / {cfg.n_head_kv} KV heads of {cfg.head_dim}")


def check_shape(model: GGUFModel, tensor: str, shape: tuple[int, ...], why: str) -> None:
    """ModelFileError unless ``tensor`` exists with GGUF shape ``shape``; ``why`` says what implies it."""
    got = tuple(int(x) for x in model.tensor(tensor).shape)
    if got != shape:
        raise ModelFileError(f"{model.path.name}: {tensor} has shape {list(got)}, expected {list(shape)} for {why}")
