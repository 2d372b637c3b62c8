"""Tiny llama GGUFs with random weights: for tests (exact reference checks) and speed benchmarks.

They go through the very same converter as a downloaded model; only the weights are made up.
"""

from __future__ import annotations

from dataclasses import dataclass
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
    weight_type: str = "Q4_1"  # Q4_0, Q4_1, Q8_0, F16 or F32 for the linear layers
    embedding_type: str = "Q8_0"
    seed: int = 0
    architecture: str = "llama"


def _vocabulary() -> tuple[list[str], list[str], list[int]]:
    """Byte tokens, a few merges, then ChatML specials; token types 1 = normal, 3 = control."""
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
    types = [1] * len(tokens) + [3] * len(SPECIAL_TOKENS)
    return tokens + SPECIAL_TOKENS, merges, types


def write_synthetic_gguf(path: Path, spec: SyntheticSpec = SyntheticSpec()) -> Path:
    import gguf
    from gguf import quants

    rng = np.random.default_rng(spec.seed)
    tokens, merges, types = _vocabulary()
    vocab = len(tokens)
    head_dim = spec.n_embd // spec.n_head
    writer = gguf.GGUFWriter(str(path), spec.architecture)
    writer.add_block_count(spec.n_layers)
    writer.add_context_length(spec.context_length)
    writer.add_embedding_length(spec.n_embd)
    writer.add_feed_forward_length(spec.n_ff)
    writer.add_head_count(spec.n_head)
    writer.add_head_count_kv(spec.n_head_kv)
    writer.add_rope_freq_base(spec.rope_base)
    writer.add_rope_dimension_count(head_dim)
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
    writer.add_chat_template(CHATML_TEMPLATE)

    def add(name: str, rows: np.ndarray, type_name: str) -> None:
        rows = rows.astype(np.float32)
        if type_name == "F32":
            writer.add_tensor(name, rows)
        elif type_name == "F16":
            writer.add_tensor(name, rows.astype(np.float16))
        else:
            qtype = gguf.GGMLQuantizationType[type_name]
            writer.add_tensor(name, quants.quantize(rows, qtype), raw_dtype=qtype)

    def matrix(n: int, k: int, scale: float) -> np.ndarray:
        return rng.standard_normal((n, k)).astype(np.float32) * scale

    kv = spec.n_head_kv * head_dim
    add("token_embd.weight", matrix(vocab, spec.n_embd, 1.0), spec.embedding_type)
    for i in range(spec.n_layers):
        p = f"blk.{i}."
        add(p + "attn_norm.weight", 1.0 + 0.1 * rng.standard_normal(spec.n_embd), "F32")
        add(p + "attn_q.weight", matrix(spec.n_embd, spec.n_embd, 0.3), spec.weight_type)
        add(p + "attn_k.weight", matrix(kv, spec.n_embd, 0.3), spec.weight_type)
        add(p + "attn_v.weight", matrix(kv, spec.n_embd, 0.3), spec.weight_type)
        add(p + "attn_output.weight", matrix(spec.n_embd, spec.n_embd, 0.1), spec.weight_type)
        add(p + "ffn_norm.weight", 1.0 + 0.1 * rng.standard_normal(spec.n_embd), "F32")
        add(p + "ffn_gate.weight", matrix(spec.n_ff, spec.n_embd, 0.2), spec.weight_type)
        add(p + "ffn_up.weight", matrix(spec.n_ff, spec.n_embd, 0.2), spec.weight_type)
        add(p + "ffn_down.weight", matrix(spec.n_embd, spec.n_ff, 0.1), spec.weight_type)
    add("output_norm.weight", 1.0 + 0.1 * rng.standard_normal(spec.n_embd), "F32")

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
