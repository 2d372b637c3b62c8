"""One tiny model per architecture beyond the plain llama one (conftest.py's arch_gguf writes them)."""

from engine.model.synthetic import SyntheticSpec

# Llama 3.1 style rope factors (untied head, as 3.1 8B), qwen2 (Q/K/V biases, rope base 1e6), qwen3
# (QK norms, heads wider than n_embd / n_head), gemma3 (six layers: five local with an 8-key window,
# the sixth global with base 1e6; heads wider than n_embd / n_head, as the 270M model's).
ARCH_SPECS = {
    "llama-rope-freqs": SyntheticSpec(rope_freqs=True, tied=False, seed=11),
    "qwen2": SyntheticSpec(architecture="qwen2", rope_base=1e6, seed=12),
    "qwen3": SyntheticSpec(architecture="qwen3", head_dim=32, seed=13),
    "gemma3": SyntheticSpec(architecture="gemma3", n_layers=6, head_dim=32, rope_base=1e6, sliding_window=8,
                            seed=14),
}
