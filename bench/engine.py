"""Engine benchmark (not a test): load time, prefill and decode speed, peak RSS, per weight precision.

    python bench/engine.py [--data-dir DIR] [--weights int4,int4-fast,fp32] [--provider cpu] [--model GGUF]

Each precision runs in its own subprocess (so peak RSS is its own), one after another in the same
run, so the ratios between them are fair. Decode at long context fills the KV cache with random rows
instead of prefilling 8k tokens: decode speed depends on the cache's size, not its values.
Prints a table and writes bench/results/engine.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

PREFILL_SIZES = (128, 512, 2048)
DECODE_CONTEXTS = (512, 8192)
DECODE_STEPS = 48


def measure(weights: str, provider: str, data_dir: str | None, model: str | None) -> dict:
    from engine.loader import load_engine
    from engine.paths import resolve_paths

    paths = resolve_paths(data_dir).ensure()
    load_engine(paths, model=model, weights=weights, provider=provider)  # converts once if needed
    start = time.perf_counter()
    engine, _, _ = load_engine(paths, model=model, weights=weights, provider=provider)
    out = {"weights": weights, "provider": engine.provider, "load_s": time.perf_counter() - start}
    rng = np.random.default_rng(0)
    vocab = engine.runner.config.vocab_size
    engine.prefill(rng.integers(0, vocab, 64).tolist())  # warm-up
    for n in PREFILL_SIZES:
        best = 0.0
        for _ in range(2):
            engine.reset()
            tokens = rng.integers(0, vocab, n).tolist()
            t = time.perf_counter()
            engine.prefill(tokens)
            best = max(best, n / (time.perf_counter() - t))
        out[f"prefill_{n}_tok_s"] = best
    cfg = engine.runner.config
    for ctx in DECODE_CONTEXTS:
        fill = min(ctx, cfg.context_length) - DECODE_STEPS - 1
        shape = (cfg.n_layers, cfg.n_head_kv, fill, cfg.head_dim)
        engine.reset()
        engine.import_kv(rng.integers(0, vocab, fill).tolist(), rng.standard_normal(shape, np.float32),
                         rng.standard_normal(shape, np.float32))
        token = 42
        t = time.perf_counter()
        for _ in range(DECODE_STEPS):
            token = int(np.argmax(engine.runner.forward([token], engine.cache)[-1]))
        out[f"decode_at_{ctx}_tok_s"] = DECODE_STEPS / (time.perf_counter() - t)
    out["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return out


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--weights", default="int4,int4-fast,fp32")
    parser.add_argument("--provider", default="cpu")
    parser.add_argument("--data-dir")
    parser.add_argument("--model")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "engine.json"))
    args = parser.parse_args()
    if args.one:
        print(json.dumps(measure(args.one, args.provider, args.data_dir, args.model)))
        return 0
    rows = []
    for weights in args.weights.split(","):
        cmd = [sys.executable, __file__, "--one", weights, "--provider", args.provider]
        cmd += ["--data-dir", args.data_dir] if args.data_dir else []
        cmd += ["--model", args.model] if args.model else []
        proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        if proc.returncode != 0:
            sys.stderr.write(proc.stderr)
            return 1
        rows.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    cols = ["load_s"] + [f"prefill_{n}_tok_s" for n in PREFILL_SIZES] + [f"decode_at_{c}_tok_s" for c in DECODE_CONTEXTS]
    cols.append("peak_rss_mib")
    print(f"{'weights':<10} {'provider':<8} " + " ".join(f"{c:>20}" for c in cols))
    for r in rows:
        print(f"{r['weights']:<10} {r['provider']:<8} " + " ".join(f"{r[c]:>20.2f}" for c in cols))
    base = rows[0]
    for r in rows[1:]:
        ratios = ", ".join(f"{c.replace('_tok_s', '')} {r[c] / base[c]:.2f}x" for c in cols if "tok_s" in c)
        print(f"{r['weights']} vs {base['weights']}: {ratios}")
    result = {"machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "python": platform.python_version()},
              "decode_steps": DECODE_STEPS, "rows": rows}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
