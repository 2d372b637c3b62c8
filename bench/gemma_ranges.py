"""Where Gemma 3's activations leave fp16's range (not a test; issue 34): the float64 reference forward pass of
tests/reference.py over a real GGUF, with the largest magnitude at every point of every layer.

    python bench/gemma_ranges.py [--model .test-cache/home/models/gemma-3-270m-q4_k_m.gguf] [--tokens 64]

fp16's largest finite value is 65,504; a point past it is where an fp16 graph gives inf (then NaN). The
prompt is the tokenizer's ids of a fixed English paragraph (a real chat's magnitudes, not random ids).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.reference import Reference  # noqa: E402

FP16_MAX = 65504.0
TEXT = ("The lighthouse keeper climbed the stairs at dusk, as he had every evening for thirty years, and lit the lamp "
        "that warned the fishing boats away from the rocks below the cliff.")


def ranges(ref: Reference, ids: list[int]) -> list[dict]:
    w, s = ref.w, len(ids)
    rows = []
    x = w["token_embd.weight"][np.asarray(ids)] * np.sqrt(ref.dim)
    rows.append({"layer": -1, "embedding": np.abs(x).max()})
    causal = np.triu(np.full((s, s), -np.inf), 1)
    behind = np.arange(s)[:, None] - np.arange(s)[None, :]
    for layer in range(ref.layers):
        p, local = f"blk.{layer}.", ref._local(layer)
        mask = np.where(behind >= ref.window, -np.inf, causal) if local else causal
        h = ref._rms(x, w[p + "attn_norm.weight"])
        q = ref._rope(ref._project(h, p, "attn_q", ref.heads), local)
        k = ref._rope(ref._project(h, p, "attn_k", ref.kv_heads), local)
        v = ref._project(h, p, "attn_v", ref.kv_heads)
        qkv_raw = h @ np.concatenate([w[p + t + ".weight"] for t in ("attn_q", "attn_k", "attn_v")]).T
        out = np.zeros((s, ref.heads, ref.head_dim))
        for head in range(ref.heads):
            g = head // (ref.heads // ref.kv_heads)
            scores = q[:, head] @ k[:, g].T * ref.scale + mask
            probs = np.exp(scores - scores.max(-1, keepdims=True))
            out[:, head] = (probs / probs.sum(-1, keepdims=True)) @ v[:, g]
        attn_in = out.reshape(s, -1)
        attn = attn_in @ w[p + "attn_output.weight"].T
        post = ref._rms(attn, w[p + "post_attention_norm.weight"])
        x = x + post
        h2 = ref._rms(x, w[p + "ffn_norm.weight"])
        gate, up = h2 @ w[p + "ffn_gate.weight"].T, h2 @ w[p + "ffn_up.weight"].T
        act = 0.5 * gate * (1 + np.tanh(np.sqrt(2 / np.pi) * (gate + 0.044715 * gate ** 3)))
        down = (act * up) @ w[p + "ffn_down.weight"].T
        ffn = ref._rms(down, w[p + "post_ffw_norm.weight"])
        x_before = x
        x = x + ffn
        rows.append({"layer": layer, "attn_normed": np.abs(h).max(), "qkv": np.abs(qkv_raw).max(),
                     "attn_mix": np.abs(attn_in).max(), "o_proj": np.abs(attn).max(), "post_attn": np.abs(post).max(),
                     "residual_mid": np.abs(x_before).max(), "ffn_normed": np.abs(h2).max(),
                     "gate": np.abs(gate).max(), "up": np.abs(up).max(), "act_x_up": np.abs(act * up).max(),
                     "down": np.abs(down).max(), "post_ffw": np.abs(ffn).max(), "residual": np.abs(x).max()})
    final = ref._rms(x, w["output_norm.weight"])
    rows.append({"layer": ref.layers, "final_normed": np.abs(final).max()})
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=str(ROOT / ".test-cache" / "home" / "models" / "gemma-3-270m-q4_k_m.gguf"))
    ap.add_argument("--tokens", type=int, default=64)
    args = ap.parse_args()
    from engine.model.gguf_file import GGUFModel
    from engine.text.tokenizer import Tokenizer

    tokenizer = Tokenizer.from_gguf(GGUFModel(Path(args.model)))
    ids = ([tokenizer.specials.bos] if tokenizer.specials.bos is not None else []) + tokenizer.encode(TEXT)
    ids = ids[:args.tokens]
    ref = Reference(args.model)
    over = []
    for row in ranges(ref, ids):
        layer = row.pop("layer")
        cells = "  ".join(f"{k} {v:,.0f}" + (" (!)" if v > FP16_MAX else "") for k, v in row.items())
        print(f"layer {layer:>2}: {cells}")
        over += [(layer, k, v) for k, v in row.items() if v > FP16_MAX]
    print(f"{len(ids)} tokens; past fp16's {FP16_MAX:,.0f}: " + (", ".join(f"layer {n} {k} ({v:,.0f})" for n, k, v in over)
                                                                  or "nothing"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
