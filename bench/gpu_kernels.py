"""GPU benchmark (not a test): what bounds a CUDA decode step — every kernel the replayed CUDA graph
runs, timed on the GPU by Nsight Systems, grouped by what it does.

    python bench/gpu_kernels.py [--data-dir DIR] [--model GGUF] [--context 1024] [--steps 200]

The script runs itself under ``nsys profile --cuda-graph-trace=node`` (nsys on PATH, or in the CUDA
toolkit's or Nsight Systems' usual folders), capturing only the decode steps (cudaProfilerStart/Stop
around them), then reads two of nsys's reports: the kernel summary (GPU time per kernel name) and the
kernel trace (start and end of every kernel, so a step's span can be split into time a kernel ran
and time the GPU sat between kernels). ONNX Runtime's own profiler cannot give this: inside a replayed
graph it sees one launch, and outside one it times the host side. Prints a table and writes
bench/results/gpu_kernels.json.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

TOOL_PLACES = ("/usr/local/cuda/bin", "/opt/nvidia/nsight-systems/*/bin", "/usr/local/cuda/nsight-systems*/bin",
               "/opt/nvidia/nsight-systems-cli/*/bin", "/opt/nvidia/nsight-compute/*", "/opt/nvidia/nsight-compute/*/host/*")

# Kernel name → what it does, first match wins (cuBLAS, ONNX Runtime's contrib kernels, Eigen-style
# elementwise ones). Checked against the names the H200 run printed.
GROUPS = (
    ("matmul (cuBLAS GEMV)", ("nvjet", "gemv", "gemm", "xmma", "cutlass", "splitk", "matmulnbits", "dequant")),
    ("attention (cuDNN SDPA + its reduction, or Hearth's one kernel)",
     ("sdpa", "flash", "lean_reduction", "mha", "softmax", "attention_decode")),
    ("attention's bookkeeping (RoPE + KV append, lengths, fill)", ("rope", "rotary", "getsequencelengths", "_fill",
                                                                  "concatpast", "unpack")),
    ("norm (fused skip + RMS norm)", ("layernorm", "layer_norm", "rmsnorm")),
    ("SwiGLU as split, x·sigmoid(x), multiply", ("split", "quickgelu", "op_mul")),
    ("other (embedding gather, cast)", ("gather", "cast", "memcpy", "memset", "copy", "transpose", "concat", "slice")),
)


def group_of(name: str) -> str:
    low = name.lower()
    for group, needles in GROUPS:
        if any(n in low for n in needles):
            return group
    return "other (embedding gather, cast)"


def find_tool(name: str) -> str | None:
    """``nsys`` or ``ncu``: on PATH, or in the CUDA toolkit's or Nsight's usual folders."""
    import glob

    found = shutil.which(name)
    if found:
        return found
    for pattern in TOOL_PLACES:
        for folder in sorted(glob.glob(pattern), reverse=True):
            if Path(folder, name).is_file():
                return str(Path(folder, name))
    return None


def decode_steps(args) -> None:
    """The profiled part: a cache filled to ``--context``, warm-up steps, then ``--steps`` decode steps
    between cudaProfilerStart and cudaProfilerStop (nsys captures only those)."""
    from engine.loader import load_engine
    from engine.paths import resolve_paths
    from engine.runtime.cuda_copy import cuda_runtime

    engine, converted, _ = load_engine(resolve_paths(args.data_dir).ensure(), model=args.model, provider="cuda")
    rng = np.random.default_rng(0)
    cfg = engine.runner.config
    fill = min(args.context, cfg.context_length - args.steps - 200) - 116  # the steps below end near it
    shape = (cfg.n_layers, cfg.n_head_kv, fill, cfg.head_dim)
    engine.import_kv(rng.integers(100, 1000, fill).tolist(), rng.standard_normal(shape).astype(engine.cache.dtype),
                     rng.standard_normal(shape).astype(engine.cache.dtype))
    for _ in range(16):
        engine.runner.forward([5], engine.cache)
    t = time.perf_counter()  # unprofiled speed: the profilers slow the steps they record
    for _ in range(100):
        engine.runner.forward([5], engine.cache)
    free_tok_s = 100 / (time.perf_counter() - t)
    runtime = cuda_runtime()
    if runtime is None:
        raise SystemExit("no CUDA runtime library: cannot mark the profiled range")
    runtime.lib.cudaDeviceSynchronize()
    runtime.lib.cudaProfilerStart()
    t = time.perf_counter()
    for _ in range(args.steps):
        engine.runner.forward([5], engine.cache)
    runtime.lib.cudaDeviceSynchronize()
    elapsed = time.perf_counter() - t
    runtime.lib.cudaProfilerStop()
    Path(args.inner_out).write_text(json.dumps({
        "weights": converted.precision, "context": fill, "steps": args.steps,
        "tok_s": free_tok_s, "tok_s_profiled": args.steps / elapsed, "cuda_graph": engine.runner.graph is not None}))


def nsys_csv(nsys: str, report: str, rep_file: Path) -> list[dict]:
    out = subprocess.run([nsys, "stats", "--report", report, "--format", "csv", "--output", "-", str(rep_file)],
                         capture_output=True, text=True, check=True).stdout
    start = out.find('"')  # nsys prints a banner line before the CSV
    lines = [ln for ln in out[start:].splitlines() if ln.strip()]
    return list(csv.DictReader(io.StringIO("\n".join(lines))))


def column(row: dict, *names: str) -> str:
    for key in row:
        if any(key.startswith(n) for n in names):
            return row[key]
    raise KeyError(f"none of {names} in {list(row)}")


def with_nsys(nsys: str, me: list[str], steps: int, tmp: Path, inner: Path, env: dict):
    """Kernels per step from Nsight Systems, and the captured steps' span (ns)."""
    rep = tmp / "decode"
    subprocess.run([nsys, "profile", "--cuda-graph-trace=node", "--capture-range=cudaProfilerApi",
                    "--capture-range-end=stop", "--trace=cuda", "--sample=none", "--cpuctxsw=none", "-o", str(rep),
                    *me, "--steps", str(steps)], check=True, env=env)
    if not rep.with_suffix(".nsys-rep").exists():  # a partial nsys (as bundled with Nsight Compute) stops at .qdstrm
        raise RuntimeError("nsys recorded the steps but could not write its report")
    run = json.loads(inner.read_text())
    summary = nsys_csv(nsys, "cuda_gpu_kern_sum", rep.with_suffix(".nsys-rep"))
    trace = nsys_csv(nsys, "cuda_gpu_trace", rep.with_suffix(".nsys-rep"))
    kernels = [kernel_row(column(r, "Name"), float(column(r, "Instances")), float(column(r, "Total Time")), steps)
               for r in summary]
    spans = [(float(column(r, "Start")), float(column(r, "Duration"))) for r in trace
             if not column(r, "Name").startswith("[CUDA mem")]
    span_ns = max(s + d for s, d in spans) - min(s for s, _ in spans)
    return kernels, span_ns, steps, run


def with_ncu(ncu: str, me: list[str], steps: int, inner: Path, env: dict):
    """Kernels per step from Nsight Compute: every kernel of the graph replayed alone and timed
    (gpu__time_duration), caches and clocks left as they are."""
    out = subprocess.run([ncu, "--profile-from-start", "off", "--graph-profiling", "node", "--metrics",
                          "gpu__time_duration.sum", "--cache-control", "none", "--clock-control", "none", "--csv",
                          "--page", "raw", *me, "--steps", str(steps)], capture_output=True, text=True, env=env)
    if out.returncode != 0:
        raise SystemExit(f"ncu failed ({out.returncode}): {out.stderr[-2000:]}{out.stdout[-2000:]}")
    run = json.loads(inner.read_text())
    text = out.stdout[out.stdout.find('"ID"'):]
    totals: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    to_ns = 1.0
    for row in csv.DictReader(io.StringIO(text)):
        value = row["gpu__time_duration.sum"].replace(",", "")
        if not row.get("ID", "").isdigit():  # the units row
            to_ns = {"nsecond": 1.0, "ns": 1.0, "usecond": 1e3, "us": 1e3, "msecond": 1e6, "ms": 1e6}.get(value, 1.0)
            continue
        totals[row["Kernel Name"]][0] += 1
        totals[row["Kernel Name"]][1] += float(value) * to_ns
    kernels = [kernel_row(name, n, ns, steps) for name, (n, ns) in totals.items()]
    return kernels, 0.0, steps, run


def kernel_row(name: str, instances: float, total_ns: float, steps: int) -> dict:
    return {"name": name, "group": group_of(name), "per_step": instances / steps,
            "us_per_step": total_ns / 1000 / steps, "avg_us": total_ns / 1000 / instances}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data-dir")
    ap.add_argument("--model", help="a GGUF (default: the installed default model)")
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=200, help="decode steps nsys records")
    ap.add_argument("--ncu-steps", type=int, default=3, help="decode steps ncu records (it replays every kernel)")
    ap.add_argument("--tool", choices=("auto", "nsys", "ncu"), default="auto")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "gpu_kernels.json"))
    ap.add_argument("--inner-out", help=argparse.SUPPRESS)  # set when running under nsys
    args = ap.parse_args()
    if args.inner_out:
        decode_steps(args)
        return
    with tempfile.TemporaryDirectory(prefix="hearth-prof-") as tmp:
        inner = Path(tmp) / "inner.json"
        me = [sys.executable, __file__, "--context", str(args.context), "--inner-out", str(inner)]
        me += ["--data-dir", args.data_dir] if args.data_dir else []
        me += ["--model", args.model] if args.model else []
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        nsys, ncu = find_tool("nsys"), find_tool("ncu")
        found = None
        if args.tool in ("auto", "nsys") and nsys:
            try:
                found = (*with_nsys(nsys, me, args.steps, Path(tmp), inner, env), "nsys")
            except (RuntimeError, subprocess.CalledProcessError) as exc:
                if args.tool == "nsys":
                    raise SystemExit(f"nsys failed: {exc}") from exc
                print(f"nsys failed ({exc}); using ncu", file=sys.stderr)
        if found is None and args.tool in ("auto", "ncu") and ncu:
            subprocess.run([*me, "--steps", "100"], check=True, env=env)  # the speed without a profiler
            free = json.loads(inner.read_text())["tok_s"]
            found = (*with_ncu(ncu, me, args.ncu_steps, inner, env), "ncu")
            found[3]["tok_s"] = free
        if found is None:
            raise SystemExit("neither nsys (Nsight Systems) nor ncu (Nsight Compute) was found")
        kernels, span_ns, steps, run, run["tool"] = found
    busy = sum(k["us_per_step"] for k in kernels)
    launches = sum(k["per_step"] for k in kernels)
    # A step's span less the time some kernel ran is time the GPU waited between kernels (launch
    # latency inside the graph, host work between steps). nsys measures the span itself; ncu runs
    # kernels one at a time, so there the span is the unprofiled step time (1 / tok/s).
    span_us = span_ns / 1000 / steps if span_ns else 1e6 / run["tok_s"]
    groups: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for k in kernels:
        groups[k["group"]][0] += k["us_per_step"]
        groups[k["group"]][1] += k["per_step"]
    print(f"{run['weights']} at {run['context']} tokens, {steps} steps profiled by {run['tool']}, CUDA graph {run['cuda_graph']}: "
          f"{run['tok_s']:.0f} tok/s unprofiled")
    print(f"{'what':<58}{'µs/step':>9}{'kernels':>9}{'µs each':>9}{'share':>7}")
    for name, (us, n) in sorted(groups.items(), key=lambda kv: -kv[1][0]):
        print(f"{name:<58}{us:>9.1f}{n:>9.0f}{us / n:>9.2f}{us / span_us:>7.0%}")
    print(f"{'kernels running':<58}{busy:>9.1f}{launches:>9.0f}{busy / launches:>9.2f}{busy / span_us:>7.0%}")
    print(f"{'GPU between kernels':<58}{span_us - busy:>9.1f}{'':>9}{(span_us - busy) / launches:>9.2f}"
          f"{(span_us - busy) / span_us:>7.0%}")
    print(f"{'step (nsys: first kernel start to last end; ncu: 1 / tok/s)':<58}{span_us:>9.1f}")
    print("\nlongest kernels (µs per step):")
    for k in sorted(kernels, key=lambda k: -k["us_per_step"])[:12]:
        print(f"  {k['us_per_step']:>8.1f} {k['per_step']:>5.0f}× {k['avg_us']:>6.2f} µs  {k['name'][:110]}")
    result = {**run, "step_span_us": span_us, "kernel_us": busy, "kernels_per_step": launches,
              "groups": {g: {"us_per_step": v[0], "kernels_per_step": v[1]} for g, v in groups.items()},
              "kernels": kernels}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
