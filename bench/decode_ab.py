"""Decode speed of two source trees, A/B/B/A in fresh processes (not a test).

    python bench/decode_ab.py --before ../hearth-old --after . [--weights int4-fast] [--rounds 3]

For a refactor that must not cost speed: ``bench/engine.py`` run twice drifts by more than the effect
being looked for, so this runs only the decode loop (80 steps after 8 warm-up steps at 512 and 8192
tokens of random KV, as bench/engine.py does), alternating the trees A, B, B, A so drift cancels, and
prints medians. Each tree is imported from its own folder (PYTHONPATH), with the same model and data dir.
Writes bench/results/decode_ab.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

CONTEXTS = (512, 8192)
STEPS, WARMUP = 80, 8

ONE_RUN = f"""
import sys, time
import numpy as np
from engine.loader import load_engine
from engine.paths import resolve_paths
engine, _, _ = load_engine(resolve_paths(sys.argv[1]), weights=sys.argv[2], provider="cpu")
cfg, rng, out = engine.runner.config, np.random.default_rng(0), []
for ctx in map(int, sys.argv[3].split(",")):
    fill = ctx - {STEPS} - {WARMUP} - 1
    shape = (cfg.n_layers, cfg.n_head_kv, fill, cfg.head_dim)
    engine.reset()
    engine.import_kv(rng.integers(0, cfg.vocab_size, fill).tolist(), rng.standard_normal(shape, np.float32),
                     rng.standard_normal(shape, np.float32))
    token = 42
    for i in range({WARMUP} + {STEPS}):
        if i == {WARMUP}:
            t = time.perf_counter()
        token = int(np.argmax(engine.runner.forward([token], engine.cache)[-1]))
    out.append({STEPS} / (time.perf_counter() - t))
print(" ".join(map(str, out)))
"""


def run(tree: Path, data_dir: str | None, weights: str) -> list[float]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    args = [sys.executable, "-c", ONE_RUN, data_dir or "", weights, ",".join(map(str, CONTEXTS))]
    proc = subprocess.run(args, capture_output=True, text=True, env=env, cwd=tree, check=True)
    return [float(x) for x in proc.stdout.split()]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", required=True, type=Path, help="the old source tree")
    parser.add_argument("--after", default=Path(__file__).resolve().parent.parent, type=Path)
    parser.add_argument("--data-dir", help="where the model is installed (default: $HEARTH_HOME or the user dirs)")
    parser.add_argument("--weights", default="int4")
    parser.add_argument("--rounds", type=int, default=3, help="each round runs before, after, after, before")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "decode_ab.json"))
    args = parser.parse_args()
    data_dir = str(Path(args.data_dir).resolve()) if args.data_dir else None
    runs: dict[str, list[list[float]]] = {"before": [], "after": []}
    for _ in range(args.rounds):
        for name in ("before", "after", "after", "before"):
            runs[name].append(run(getattr(args, name).resolve(), data_dir, args.weights))
    print(f"decode tok/s, {args.weights}, {args.rounds * 2} runs each (median)")
    print(f"{'context':>8} {'before':>8} {'after':>8} {'ratio':>6}")
    table = []
    for i, ctx in enumerate(CONTEXTS):
        before = statistics.median(r[i] for r in runs["before"])
        after = statistics.median(r[i] for r in runs["after"])
        table.append({"context": ctx, "before": before, "after": after, "ratio": after / before})
        print(f"{ctx:>8} {before:>8.1f} {after:>8.1f} {after / before:>6.3f}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"weights": args.weights, "runs": runs, "medians": table}, indent=2))
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
