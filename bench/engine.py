"""Engine benchmark (not a test): load time, prefill and decode speed, peak RSS, per weight precision.

    python bench/engine.py [--data-dir DIR] [--weights int4,int4-fast,fp32,int4@ort] [--provider cpu]
                           [--model GGUF] [--peer] [--peer-contexts 512,8192]

A precision written ``W@ort`` runs W with ONNX Runtime's attention kernel instead of Hearth's
(engine/native), for a same-run comparison of the two.

Each precision runs in its own subprocess (so peak RSS is its own), one after another in the same
run, so the ratios between them are fair. Decode at long context fills the KV cache with random rows
instead of prefilling 8k tokens: decode speed depends on the cache's size, not its values.
Prints a table and writes bench/results/engine.json.

``--peer`` then runs bench/peer.py once per precision, in the same invocation (each run measures
llama.cpp again, alternating with Hearth, on the same GGUF and token ids), and prints one table of
Hearth against llama.cpp with each ratio taken within the run that measured both sides. Its JSON goes
into engine.json under "peer". The README's performance table is this table.
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
    out = {"weights": weights, "provider": engine.provider, "attention": engine.runner.attention, "matmul": engine.runner.matmul,
           "load_s": time.perf_counter() - start}
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
    parser.add_argument("--peer", action="store_true", help="also run bench/peer.py per precision and print ratios")
    parser.add_argument("--peer-contexts", default="512,8192", help="decode contexts for --peer")
    parser.add_argument("--peer-prefill", default="512,2048", help="prefill sizes for --peer")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "engine.json"))
    args = parser.parse_args()
    if args.one:
        print(json.dumps(measure(args.one, args.provider, args.data_dir, args.model)))
        return 0
    rows = []
    for spec in args.weights.split(","):
        # "int4@ort": int4 with ONNX Runtime's own attention kernel instead of Hearth's (a same-run A/B)
        weights, _, kernel = spec.partition("@")
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **({"HEARTH_NATIVE_ATTENTION": "0"} if kernel == "ort" else {})}
        cmd = [sys.executable, __file__, "--one", weights, "--provider", args.provider]
        cmd += ["--data-dir", args.data_dir] if args.data_dir else []
        cmd += ["--model", args.model] if args.model else []
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if proc.returncode != 0:
            sys.stderr.write(proc.stderr)
            return 1
        rows.append({**json.loads(proc.stdout.strip().splitlines()[-1]), "weights": spec})
    cols = ["load_s"] + [f"prefill_{n}_tok_s" for n in PREFILL_SIZES] + [f"decode_at_{c}_tok_s" for c in DECODE_CONTEXTS]
    cols.append("peak_rss_mib")
    print(f"{'weights':<10} {'provider':<8} {'attention':<11} " + " ".join(f"{c:>20}" for c in cols))
    for r in rows:
        print(f"{r['weights']:<10} {r['provider']:<8} {r['attention']:<11} " + " ".join(f"{r[c]:>20.2f}" for c in cols))
    base = rows[0]
    for r in rows[1:]:
        ratios = ", ".join(f"{c.replace('_tok_s', '')} {r[c] / base[c]:.2f}x" for c in cols if "tok_s" in c)
        print(f"{r['weights']} vs {base['weights']}: {ratios}")
    result = {"machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "python": platform.python_version()},
              "decode_steps": DECODE_STEPS, "rows": rows}
    if args.peer:
        peer_runs = run_peer(args)
        if peer_runs is None:
            return 1
        print_peer_table(peer_runs)
        result["peer"] = peer_runs
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))
    print(f"wrote {args.out}")
    return 0


PEER_ROWS = ("prefill", "decode", "state load")  # the rows of peer.py's output that the table keeps


def run_peer(args: argparse.Namespace) -> dict[str, dict] | None:
    """bench/peer.py once per precision; {precision: its JSON}, or None (after printing why) on failure."""
    import tempfile

    runs: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="hearth-bench-") as tmp:
        for weights in (w for w in args.weights.split(",") if "@" not in w):
            out = Path(tmp) / f"peer-{weights}.json"
            cmd = [sys.executable, str(ROOT / "bench" / "peer.py"), "--weights", weights, "--out", str(out),
                   "--prefill", args.peer_prefill, "--contexts", args.peer_contexts]
            cmd += ["--data-dir", args.data_dir] if args.data_dir else []
            cmd += ["--model", args.model] if args.model else []
            proc = subprocess.run(cmd, capture_output=True, text=True)
            if proc.returncode != 0 or not out.exists():
                sys.stderr.write(proc.stdout + proc.stderr)
                print(f"bench/peer.py failed for {weights}", file=sys.stderr)
                return None
            runs[weights] = json.loads(out.read_text())
    return runs


def print_peer_table(runs: dict[str, dict]) -> None:
    """One row per measurement; per precision: Hearth's median, llama.cpp's median in that same run, and
    how many times faster Hearth is (llama.cpp is measured again in each run, so each ratio is same-run)."""
    from peer import fmt  # bench/ is on the path: this script runs from there

    names = list(runs)
    first = runs[names[0]]["rows"]
    kept = [r["row"] for r in first if r["row"].startswith(PEER_ROWS) and "copy" not in r["row"]]
    print(f"{'row':<34} {'unit':>6}" + "".join(f" {n:>10} {'llama.cpp':>10} {'ratio':>6}" for n in names))
    for label in kept:
        cells, unit = "", ""
        for n in names:
            row = next((r for r in runs[n]["rows"] if r["row"] == label), None)
            if row is None:
                cells += f" {'—':>10} {'—':>10} {'':>6}"
                continue
            unit = row["unit"]
            h, p = row["median"].get("hearth"), row["median"].get("llama.cpp")
            ratio = (h / p if row["higher_is_better"] else p / h) if h and p else None
            cells += f" {fmt(h, unit):>10} {fmt(p, unit):>10} {'' if ratio is None else f'{ratio:.2f}x':>6}"
        print(f"{label:<34} {unit:>6}{cells}")
    print("ratio: how many times faster Hearth is than llama.cpp in the same run (above 1: Hearth wins)")


if __name__ == "__main__":
    sys.exit(main())
