"""GPU benchmark (not a test): where a decode step's time goes, per ONNX op type, from ONNX Runtime's
own profiler (one session without CUDA graphs, so each node is timed).

    python bench/gpu_profile.py [--data-dir DIR] [--weights int4-dense-half] [--context 1024]

Prints a table (µs per decode step and nodes per step, by op type) and writes
bench/results/gpu_profile.json.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data-dir")
    ap.add_argument("--model", help="a GGUF (default: the installed default model)")
    ap.add_argument("--weights", default="int4-dense-half")
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "gpu_profile.json"))
    args = ap.parse_args()

    from engine.loader import load_engine
    from engine.paths import resolve_paths

    ort = importlib.import_module("onnxruntime")  # after the engine, which turns ONNX Runtime's telemetry off

    engine, converted, _ = load_engine(resolve_paths(args.data_dir).ensure(), model=args.model, weights=args.weights,
                                      provider="cuda")
    options = ort.SessionOptions()
    options.enable_profiling = True
    options.profile_file_prefix = str(Path(args.out).with_suffix(""))
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    runner = engine.runner
    runner.graph = None
    runner.session = ort.InferenceSession(str(converted.onnx_path), options, providers=["CUDAExecutionProvider"])
    runner._binding = runner.session.io_binding()
    engine.reset()
    engine.prefill(np.random.default_rng(0).integers(100, 1000, args.context).tolist())
    for _ in range(3):
        runner.forward([5], engine.cache)
    marker = len(json.loads(Path(runner.session.end_profiling()).read_text()))
    # A fresh profile for the decode steps alone: end_profiling closed the first file.
    runner.session = ort.InferenceSession(str(converted.onnx_path), options, providers=["CUDAExecutionProvider"])
    runner._binding = runner.session.io_binding()
    for _ in range(args.steps):
        runner.forward([5], engine.cache)
    events = json.loads(Path(runner.session.end_profiling()).read_text())
    per_op: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    for e in events:
        if e.get("cat") == "Node" and e.get("name", "").endswith("_kernel_time"):
            op = e.get("args", {}).get("op_name", "?")
            per_op[op][0] += e["dur"] / args.steps
            per_op[op][1] += 1 / args.steps
    rows = sorted(({"op": k, "us_per_step": v[0], "nodes_per_step": v[1]} for k, v in per_op.items()),
                  key=lambda r: -r["us_per_step"])
    total = sum(r["us_per_step"] for r in rows)
    print(f"{'op':>36} {'µs/step':>9} {'nodes':>6} {'share':>6}")
    for r in rows:
        print(f"{r['op']:>36} {r['us_per_step']:>9.1f} {r['nodes_per_step']:>6.0f} {r['us_per_step'] / total * 100:>5.1f}%")
    print(f"{'total':>36} {total:>9.1f} {sum(r['nodes_per_step'] for r in rows):>6.0f}  (first profile had {marker} events)")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"weights": args.weights, "context": args.context, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
