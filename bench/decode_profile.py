"""Where a CPU decode step's time goes (not a test): ONNX Runtime's profiler, per operator type.

    python bench/decode_profile.py [--data-dir DIR] [--model GGUF] [--weights int4] [--contexts 512,8192]
                                   [--tokens 15]    # a chunk of new tokens instead of one (a resume)

For each context the cache is filled with random rows (a step's cost depends on the cache's size, not
its values), then ``--steps`` decode steps run with the profiler on. The table gives, per context,
the milliseconds a step spends in each operator type (summed over layers) and their share; the
difference between two contexts is what a longer past costs. Writes bench/results/decode_profile.json.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def run_steps(runner, ctx: int, steps: int, tokens: int = 1) -> None:
    """Warm-up steps, then ``steps`` steps of ``tokens`` new tokens each at ``ctx`` tokens of context
    (per_op keeps the last). With ``tokens`` > 1 every step starts from the same past, as a resumed
    conversation's new message does."""
    cfg = runner.config
    cache = runner.new_cache()
    rng = np.random.default_rng(0)
    fill = min(ctx, cfg.context_length) - (steps + 8) * tokens
    shape = (cfg.n_layers, cfg.n_head_kv, fill, cfg.head_dim)
    cache.load(rng.standard_normal(shape, np.float32), rng.standard_normal(shape, np.float32), 0)
    ids = [42] * tokens
    for _ in range(4):
        runner.forward(ids, cache)
        cache.length -= tokens
    for _ in range(steps):
        runner.forward(ids, cache)
        if tokens > 1:
            cache.length -= tokens


def per_op(trace: list[dict], runs: int) -> dict[str, float]:
    """Sum node times by operator type over the last ``runs`` model runs; ms per run."""
    run_ends = [e for e in trace if e.get("name") == "model_run"]
    if len(run_ends) < runs:
        raise SystemExit(f"profile has {len(run_ends)} runs, expected {runs}")
    window = run_ends[-runs:]
    start, end = window[0]["ts"], window[-1]["ts"] + window[-1]["dur"]
    totals: dict[str, float] = defaultdict(float)
    for e in trace:
        if e.get("cat") != "Node" or not e.get("name", "").endswith("_kernel_time"):
            continue
        if start <= e["ts"] <= end:
            totals[e["args"]["op_name"]] += e["dur"] / 1000 / runs
    totals["(whole run)"] = sum(w["dur"] for w in window) / 1000 / runs
    return dict(totals)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--data-dir")
    parser.add_argument("--model")
    parser.add_argument("--weights", default="int4")
    parser.add_argument("--contexts", default="512,8192")
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--threads", type=int)
    parser.add_argument("--tokens", type=int, default=1, help="new tokens a step (a resume's message: ~15)")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "decode_profile.json"))
    args = parser.parse_args()

    from engine.loader import load_engine
    from engine.paths import resolve_paths
    from engine.runtime.runner import ModelRunner

    paths = resolve_paths(args.data_dir).ensure()
    _, converted, _ = load_engine(paths, model=args.model, weights=args.weights, provider="cpu")
    results: dict[int, dict[str, float]] = {}
    contexts = [int(c) for c in args.contexts.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        for ctx in contexts:
            runner = ModelRunner(converted.onnx_path, "cpu", args.threads, profile_prefix=str(Path(tmp) / f"ctx{ctx}"))
            run_steps(runner, ctx, args.steps, args.tokens)
            trace = json.loads(Path(runner.session.end_profiling()).read_text())
            results[ctx] = per_op(trace, args.steps)
    ops = sorted({op for r in results.values() for op in r}, key=lambda o: -results[contexts[-1]].get(o, 0))
    print(f"{'operator (ms per step)':<34}" + "".join(f"{'@' + str(c):>12}{'share':>7}" for c in contexts))
    for op in ops:
        cells = ""
        for c in contexts:
            ms = results[c].get(op, 0.0)
            cells += f"{ms:>12.2f}{ms / results[c]['(whole run)']:>7.0%}"
        print(f"{op:<34}{cells}")
    out = {"weights": args.weights, "steps": args.steps, "tokens": args.tokens,
            "ms_per_step": {str(c): r for c, r in results.items()}}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
