"""GPU benchmark (not a test): the forms the default model's int4 weights can take on CUDA, side by
side in one run — decode speed, where a decode step's time goes, and agreement with the CPU's exact
int4 model (max |Δlogit| after a ~1k-token prompt, and how many of 32 greedy tokens match).

    python bench/gpu_variants.py [--data-dir DIR] [--variants int4-half,int4-cuda,int4-cuda-dense]

Prints a table and writes bench/results/gpu_variants.json.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import platform
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"bench_{name}", ROOT / "bench" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def step_breakdown(engine, steps: int = 200) -> dict:
    """Mean µs per decode step in each part of GraphDecoder.step (inputs in, replay, logits out)."""
    g = engine.runner.graph
    if g is None:
        return {}
    cache = engine.cache
    g.step(5, cache)
    parts = {"inputs_us": 0.0, "replay_us": 0.0, "logits_us": 0.0}
    for _ in range(steps):
        t0 = time.perf_counter()
        g.ids.update_inplace(np.array([[5]], np.int64))
        g.seqlens.update_inplace(np.array([cache.length], np.int32))
        g.total.update_inplace(np.array(cache.capacity, np.int32))
        t1 = time.perf_counter()
        g.session.run_with_iobinding(g.binding)
        t2 = time.perf_counter()
        g.logits.numpy()
        t3 = time.perf_counter()
        cache.length += 1
        parts["inputs_us"] += (t1 - t0) * 1e6 / steps
        parts["replay_us"] += (t2 - t1) * 1e6 / steps
        parts["logits_us"] += (t3 - t2) * 1e6 / steps
    return parts


def greedy(engine, prompt: list[int], n: int) -> tuple[np.ndarray, list[int]]:
    engine.reset()
    first = np.asarray(engine.prefill(prompt), np.float32).reshape(-1)
    logits, out = first, []
    for _ in range(n):
        token = int(np.argmax(logits))
        out.append(token)
        logits = engine.runner.forward([token], engine.cache)[-1]
        engine.tokens.append(token)
    return first, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data-dir")
    ap.add_argument("--variants", default="int4-half,int4-cuda,int4-cuda-dense")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "gpu_variants.json"))
    args = ap.parse_args()

    from engine.loader import load_engine
    from engine.paths import resolve_paths

    gpu = _load("gpu")
    resume = _load("resume")
    paths = resolve_paths(args.data_dir).ensure()
    reference, _, _ = load_engine(paths, weights="int4", provider="cpu")
    prompt_ids = reference.prompt_tokens(resume.conversation_of(reference, 1000))
    ref_logits, ref_tokens = greedy(reference, prompt_ids, 32)
    rng = np.random.default_rng(0)
    rows = []
    for variant in args.variants.split(","):
        engine, converted, load_ms = load_engine(paths, weights=variant, provider="cuda")
        if engine.provider != "cuda":
            sys.exit(f"CUDA is not usable here: {engine.runner.provider_note}")
        logits, tokens = greedy(engine, prompt_ids, 32)
        agree = next((i for i, (a, b) in enumerate(zip(tokens, ref_tokens, strict=True)) if a != b), len(tokens))
        decode = gpu.decode_speed(engine, 1024, rng, steps=256)
        row = {"variant": variant, "decode_tok_s": decode, "load_ms": load_ms,
               "max_abs_dlogit": float(np.abs(logits - ref_logits).max()),
               "greedy_tokens_agreeing": agree, "weights_mb": sum(
                   p.stat().st_size for p in converted.onnx_path.parent.iterdir() if p.is_file()) / 1e6,
               **step_breakdown(engine)}
        rows.append(row)
        print(json.dumps(row), file=sys.stderr, flush=True)
        del engine
    base = rows[0]["decode_tok_s"]
    print(f"{'variant':>16} {'decode tok/s':>13} {'× first':>8} {'replay µs':>10} {'in µs':>7} {'out µs':>7} "
          f"{'max|Δlogit|':>12} {'greedy =':>9} {'MB':>6}")
    for r in rows:
        print(f"{r['variant']:>16} {r['decode_tok_s']:>13.1f} {r['decode_tok_s'] / base:>8.2f} {r.get('replay_us', 0):>10.0f} "
              f"{r.get('inputs_us', 0):>7.0f} {r.get('logits_us', 0):>7.0f} {r['max_abs_dlogit']:>12.3f} "
              f"{r['greedy_tokens_agreeing']:>6}/32 {r['weights_mb']:>6.0f}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"machine": platform.platform(), "prompt_tokens": len(prompt_ids),
                                          "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
