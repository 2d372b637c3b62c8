"""Tiny GGUFs with random weights (llama, qwen2, qwen3, gemma3, phi3): for tests (exact reference checks) and speed
benchmarks.

They go through the very same converter as a downloaded model; only the weights are made up.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from engine.text.byte_level import byte_to_char

CHATML_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
_MERGE_WORDS = ["the", "and", "hello", "world", "ing", "ion", "er", "re", "in", "on"]


@dataclass(frozen=True)
class SyntheticSpec:
    n_layers: int = 2
    n_embd: int = 64
    n_head: int = 4
    n_head_kv: int = 2
    n_ff: int = 128
    context_length: int = 256
    rope_base: float = 10000.0
    # The linear layers' type: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, F16, F32, or a K-quant (Q2_K … Q6_K: random
    # blocks, as gguf cannot quantize them; their layers need n_embd and n_ff multiples of 256).
    weight_type: str = "Q4_1"
    embedding_type: str = "Q8_0"
    seed: int = 0
    architecture: str = "llama"
    vocab_size: int = 0  # 0: just the small vocabulary; larger pads it with unused tokens
    tied: bool = True  # False: a separate output.weight, as Llama-3 has
    random_blocks: bool = False  # quantized weights as random blocks (fast at any size; for speed only)
    head_dim: int = 0  # 0: n_embd // n_head; else written as key_length (qwen3's heads are wider)
    rope_freqs: bool = False  # llama 3.1 style rope_freqs.weight, the per-frequency rope divisors
    sliding_window: int = 0  # gemma3: written as attention.sliding_window when positive
    # A llama.cpp Q4_K_M-style mix: this type for the untied output.weight and for attn_v and ffn_down
    # of the layers Q4_K_M gives more bits ("" = every linear layer weight_type).
    more_bits_type: str = ""
    chat_template: str = ""  # "": ChatML's; else this template (a real model's, as test data)
    # Added tokens of the kind Qwen writes its markers with ("<think>", "<tool_call>"): user-defined, so they
    # spell their text and the tokenizer keeps them whole
    user_tokens: tuple[str, ...] = ()


# Llama-3-8B's dimensions, for speed measurements: 32 layers, 4096 wide, 32 query and 8 KV heads,
# 14,336 FFN, 128,256 vocabulary, untied head; every matrix random Q4_0 blocks.
LLAMA3_8B_SHAPE = SyntheticSpec(
    n_layers=32, n_embd=4096, n_head=32, n_head_kv=8, n_ff=14336, context_length=32768, rope_base=500000.0,
    weight_type="Q4_0", embedding_type="Q4_0", vocab_size=128256, tied=False, random_blocks=True,
)


# The same shape as llama.cpp's Q4_K_M mix: Q4_K layers and embedding, Q6_K output head and the
# attn_v/ffn_down of the layers that get more bits.
LLAMA3_8B_Q4_K_M = replace(LLAMA3_8B_SHAPE, weight_type="Q4_K", embedding_type="Q4_K", more_bits_type="Q6_K")


# Qwen2.5-7B's dimensions in the same mix: 28 layers, 3,584 wide, 28 query / 4 KV heads, 18,944 FFN,
# 152,064 vocabulary, Q/K/V biases, untied head.
QWEN25_7B_Q4_K_M = replace(LLAMA3_8B_Q4_K_M, architecture="qwen2", n_layers=28, n_embd=3584, n_head=28, n_head_kv=4,
                           n_ff=18944, vocab_size=152064, rope_base=1000000.0)


def gets_more_bits(layer: int, n_layers: int) -> bool:
    """The layers whose attn_v and ffn_down Q4_K_M stores with more bits: the first and last eighth,
    and every third layer between them."""
    eighth = n_layers // 8
    return layer < eighth or layer >= 7 * n_layers // 8 or (layer - eighth) % 3 == 2


def _vocabulary(size: int = 0, user_tokens: tuple[str, ...] = ()) -> tuple[list[str], list[str], list[int]]:
    """Byte tokens, a few merges, unused padding up to ``size``, then ChatML specials and the user-defined
    tokens; token types 1 = normal, 3 = control, 4 = user-defined."""
    alphabet = byte_to_char()
    tokens = [alphabet[b] for b in range(256)]
    merges: list[str] = []
    known = set(tokens)
    for word in _MERGE_WORDS:
        for text in (word, " " + word):
            chars = "".join(alphabet[b] for b in text.encode())
            current = chars[0]
            for ch in chars[1:]:
                merged = current + ch
                if merged not in known:
                    merges.append(f"{current} {ch}")
                    tokens.append(merged)
                    known.add(merged)
                current = merged
    tokens += [f"<|unused{i}|>" for i in range(max(0, size - len(tokens) - len(SPECIAL_TOKENS) - len(user_tokens)))]
    types = [1] * len(tokens) + [3] * len(SPECIAL_TOKENS) + [4] * len(user_tokens)
    return tokens + SPECIAL_TOKENS + list(user_tokens), merges, types


def write_synthetic_gguf(path: Path, spec: SyntheticSpec = SyntheticSpec()) -> Path:
    import gguf
    from gguf import quants

    rng = np.random.default_rng(spec.seed)
    tokens, merges, types = _vocabulary(spec.vocab_size, spec.user_tokens)
    vocab = len(tokens)
    head_dim = spec.head_dim or spec.n_embd // spec.n_head
    writer = gguf.GGUFWriter(str(path), spec.architecture)
    writer.add_block_count(spec.n_layers)
    writer.add_context_length(spec.context_length)
    writer.add_embedding_length(spec.n_embd)
    writer.add_feed_forward_length(spec.n_ff)
    writer.add_head_count(spec.n_head)
    writer.add_head_count_kv(spec.n_head_kv)
    writer.add_rope_freq_base(spec.rope_base)
    writer.add_rope_dimension_count(head_dim)
    if spec.head_dim:
        writer.add_key_length(head_dim)
        writer.add_value_length(head_dim)
    if spec.sliding_window:
        writer.add_sliding_window(spec.sliding_window)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(vocab)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("smollm")
    writer.add_token_list(tokens)
    writer.add_token_merges(merges)
    writer.add_token_types(types)
    writer.add_bos_token_id(tokens.index("<|im_start|>"))
    writer.add_eos_token_id(tokens.index("<|im_end|>"))
    writer.add_add_bos_token(False)
    writer.add_chat_template(spec.chat_template or CHATML_TEMPLATE)

    def add(name: str, rows: np.ndarray, type_name: str) -> None:
        rows = rows.astype(np.float32)
        if type_name == "F32":
            writer.add_tensor(name, rows)
        elif type_name == "F16":
            writer.add_tensor(name, rows.astype(np.float16))
        else:
            qtype = gguf.GGMLQuantizationType[type_name]
            writer.add_tensor(name, quants.quantize(rows, qtype), raw_dtype=qtype)

    def add_matrix(name: str, n: int, k: int, scale: float, type_name: str) -> None:
        if spec.random_blocks and type_name in _RANDOM_BLOCK_TYPES:
            qtype = gguf.GGMLQuantizationType[type_name]
            writer.add_tensor(name, random_blocks(rng, type_name, n, k, scale), raw_dtype=qtype)
        elif type_name in _K_QUANT_SCALES:
            qtype = gguf.GGMLQuantizationType[type_name]
            # The Gaussian path's spread (std = scale) unless random blocks were asked for.
            spread = scale if spec.random_blocks else scale * np.sqrt(k)
            writer.add_tensor(name, random_k_blocks(rng, type_name, n, k, spread), raw_dtype=qtype)
        else:
            add(name, rng.standard_normal((n, k)).astype(np.float32) * scale, type_name)

    # Extra tensors draw from the generator only for the specs that have them: the others' files stay
    # byte for byte what they were.
    q, kv = spec.n_head * head_dim, spec.n_head_kv * head_dim
    add_matrix("token_embd.weight", vocab, spec.n_embd, 1.0, spec.embedding_type)
    for i in range(spec.n_layers):
        p = f"blk.{i}."
        wide = spec.more_bits_type if spec.more_bits_type and gets_more_bits(i, spec.n_layers) else spec.weight_type
        add(p + "attn_norm.weight", 1.0 + 0.1 * rng.standard_normal(spec.n_embd), "F32")
        if spec.architecture == "phi3":  # Q, K and V rows in one tensor, in that order
            add_matrix(p + "attn_qkv.weight", q + 2 * kv, spec.n_embd, 0.3, spec.weight_type)
        else:
            add_matrix(p + "attn_q.weight", q, spec.n_embd, 0.3, spec.weight_type)
            add_matrix(p + "attn_k.weight", kv, spec.n_embd, 0.3, spec.weight_type)
            add_matrix(p + "attn_v.weight", kv, spec.n_embd, 0.3, wide)
        if spec.architecture == "qwen2":
            for part, width in (("attn_q", q), ("attn_k", kv), ("attn_v", kv)):
                add(p + part + ".bias", 0.5 * rng.standard_normal(width), "F32")
        if spec.architecture in ("qwen3", "gemma3"):
            for part in ("attn_q_norm", "attn_k_norm"):
                add(p + part + ".weight", 1.0 + 0.3 * rng.standard_normal(head_dim), "F32")
        add_matrix(p + "attn_output.weight", spec.n_embd, q, 0.1, spec.weight_type)
        if spec.architecture == "gemma3":  # Gemma's sandwich norms (gains with its +1 folded in, as in GGUF)
            add(p + "post_attention_norm.weight", 1.0 + 0.3 * rng.standard_normal(spec.n_embd), "F32")
        add(p + "ffn_norm.weight", 1.0 + 0.1 * rng.standard_normal(spec.n_embd), "F32")
        if spec.architecture == "phi3":  # gate rows, then up rows, in ffn_up
            add_matrix(p + "ffn_up.weight", 2 * spec.n_ff, spec.n_embd, 0.2, spec.weight_type)
        else:
            add_matrix(p + "ffn_gate.weight", spec.n_ff, spec.n_embd, 0.2, spec.weight_type)
            add_matrix(p + "ffn_up.weight", spec.n_ff, spec.n_embd, 0.2, spec.weight_type)
        add_matrix(p + "ffn_down.weight", spec.n_embd, spec.n_ff, 0.1, wide)
        if spec.architecture == "gemma3":
            add(p + "post_ffw_norm.weight", 1.0 + 0.3 * rng.standard_normal(spec.n_embd), "F32")
    add("output_norm.weight", 1.0 + 0.1 * rng.standard_normal(spec.n_embd), "F32")
    if not spec.tied:
        add_matrix("output.weight", vocab, spec.n_embd, 0.3, spec.more_bits_type or spec.weight_type)
    if spec.rope_freqs and spec.architecture == "phi3":  # Phi-3 128k style: long and short factors
        writer.add_uint32("phi3.rope.scaling.original_context_length", spec.context_length // 4)
        writer.add_float32("phi3.rope.scaling.attn_factor", 1.19)
        add("rope_factors_long.weight", 1.0 + 3.0 * rng.random(head_dim // 2), "F32")
        add("rope_factors_short.weight", 1.0 + 0.2 * rng.random(head_dim // 2), "F32")
    elif spec.rope_freqs:
        add("rope_freqs.weight", llama3_freq_factors(head_dim, spec.rope_base, spec.context_length // 4), "F32")

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def llama3_freq_factors(head_dim: int, base: float, original_context: int, factor: float = 8.0,
                        low: float = 1.0, high: float = 4.0) -> np.ndarray:
    """Llama 3.1's rope divisors [head_dim/2] for a model trained on ``original_context`` tokens: 1 for
    wavelengths shorter than original_context/high, ``factor`` for ones longer than original_context/low,
    a smooth blend between (as llama.cpp's converter bakes them into rope_freqs.weight)."""
    inv_freq = base ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    wavelength = 2 * np.pi / inv_freq
    smooth = np.clip((original_context / wavelength - low) / (high - low), 0.0, 1.0)
    return 1.0 / ((1 - smooth) / factor + smooth)


_RANDOM_BLOCK_TYPES = {"Q4_0": (18, 8.0), "Q8_0": (34, 128.0)}  # bytes per block, |q| range


def random_blocks(rng: np.random.Generator, type_name: str, n: int, k: int, scale: float) -> np.ndarray:
    """``n`` rows of random ``type_name`` blocks, scaled so a row's output has about ``scale``'s
    spread for unit inputs: random bytes for the quants, a fixed positive fp16 scale per block."""
    block_bytes, q_range = _RANDOM_BLOCK_TYPES[type_name]
    nb = k // 32
    raw = np.frombuffer(rng.bytes(n * nb * block_bytes), np.uint8).reshape(n, nb, block_bytes).copy()
    d = np.float16(scale / (q_range * 0.58 * np.sqrt(k)))  # uniform quants: std ≈ 0.58 · range
    raw[:, :, 0:2] = np.frombuffer(d.tobytes(), np.uint8)
    return raw.reshape(n, nb * block_bytes)


# K-quants: (byte offset of the fp16 super-scale d, of dmin or None, the mean code dmin is scaled by).
_K_QUANT_SCALES = {
    "Q2_K": (84, 80, 82, 1.5), "Q3_K": (110, 108, None, 0.0), "Q4_K": (144, 0, 2, 7.5),
    "Q5_K": (176, 0, 2, 15.5), "Q6_K": (210, 208, None, 0.0),
}  # bytes per 256-element block first


def random_k_blocks(rng: np.random.Generator, type_name: str, n: int, k: int, scale: float) -> np.ndarray:
    """``n`` rows of random K-quant blocks (every byte pattern is a valid block), with one super-scale
    so a row's output has about ``scale``'s spread for unit inputs. dmin = d · the mean code keeps the
    weights centred: the sub-block scales and mins are alike random 4- or 6-bit numbers."""
    from gguf import GGMLQuantizationType, quants

    block_bytes, d_at, dmin_at, mean_code = _K_QUANT_SCALES[type_name]
    nb = k // 256
    raw = np.frombuffer(rng.bytes(n * nb * block_bytes), np.uint8).reshape(n, nb, block_bytes).copy()

    def set_scale(d: float) -> None:
        raw[:, :, d_at:d_at + 2] = np.frombuffer(np.float16(d).tobytes(), np.uint8)
        if dmin_at is not None:
            raw[:, :, dmin_at:dmin_at + 2] = np.frombuffer(np.float16(d * mean_code).tobytes(), np.uint8)

    set_scale(1.0)
    unit = quants.dequantize(raw.reshape(n, -1), GGMLQuantizationType[type_name])
    set_scale(scale / (float(unit.std()) * np.sqrt(k)))
    return raw.reshape(n, nb * block_bytes)
