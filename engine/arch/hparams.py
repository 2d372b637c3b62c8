"""The decoder hyperparameters that llama-like architectures store under the same GGUF keys.

Each architecture module reads its config through ``decoder_config`` (its own ``<arch>.`` prefix) and
then checks what only it has. What the shared graph cannot compute is refused here, once for all.
"""

from __future__ import annotations

from engine.arch.config import ModelConfig
from engine.errors import ModelFileError, UnsupportedModelError
from engine.model.gguf_file import GGUFModel

# The longest context a file may declare. The graph bakes rope tables of context × head_dim × 4 bytes
# (512 MiB at this length and 128-wide heads), and the longest real models here (Qwen2.5-1M) declare
# 1,010,000; a file declaring 2^31−1 made conversion ask numpy for 16 GiB before anything else ran.
MAX_CONTEXT_LENGTH = 1 << 20


def decoder_config(model: GGUFModel, arch: str, fused_qkv: bool = False) -> ModelConfig:
    """The config under ``arch.`` keys; refuses inconsistent head counts and unsupported rope forms.
    ``fused_qkv``: the file holds Q, K and V in one ``attn_qkv`` tensor (Phi-3)."""
    name, p = model.path.name, arch + "."
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
    cfg = ModelConfig(
        architecture=arch,
        n_layers=model.positive_int(p + "block_count"),
        n_embd=n_embd,
        n_ff=model.positive_int(p + "feed_forward_length"),
        n_head=n_head,
        n_head_kv=n_head_kv,
        head_dim=head_dim,
        context_length=_context_length(model, p + "context_length"),
        vocab_size=model.vocab_size(p + "vocab_size", n_embd),
        norm_eps=float(model.require(p + "attention.layer_norm_rms_epsilon")),
        rope_dim=rope_dim,
        rope_base=float(model.value(p + "rope.freq_base", 10000.0)),
        rope_scale=rope_scale,
        tied_embeddings=not model.has_tensor("output.weight"),
    )
    _check_attention_shapes(model, cfg, fused_qkv)
    return cfg


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
