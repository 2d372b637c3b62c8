"""Conversion size, time and peak memory for synthetic Llama-shaped GGUFs (issue 14; not a test).

    HEARTH_HOME=/tmp/shapes python bench/convert_shapes.py [--shapes 1b,7b] [--weights int4] [--keep]

Writes a random-weight GGUF of each shape (``engine.model.synthetic``, random K-quant blocks: same sizes
and code path as a real file, meaningless text), converts it with Hearth's converter in a child process
that reports its own peak RSS (VmHWM, reset when it starts), and compares against issue 14's targets: peak RSS < 1.5 × the largest
tensor + 500 MB, converted bytes ≤ 1.4 × the GGUF. Writes bench/results/convert_shapes.json.
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from engine.model.convert import conversion_dir, gguf_digest  # noqa: E402
from engine.model.precision import get_precision  # noqa: E402
from engine.model.synthetic import SyntheticSpec, write_synthetic_gguf  # noqa: E402

# llama.cpp's Q4_K_M mix: Q4_K linears, Q6_K for attn_v and ffn_down of the layers that get more bits
# (synthetic.gets_more_bits) and for the head; the 1B's tied table is Q6_K, as in the real file.
SHAPES: dict[str, SyntheticSpec] = {
    "1b": SyntheticSpec(  # Llama-3.2-1B: tied head, 128,256 vocabulary
        n_layers=16, n_embd=2048, n_head=32, n_head_kv=8, n_ff=8192, context_length=8192, rope_base=500000.0,
        weight_type="Q4_K", embedding_type="Q6_K", vocab_size=128256, tied=True, random_blocks=True,
        more_bits_type="Q6_K",
    ),
    "7b": SyntheticSpec(  # Llama-2-7B-like dimensions with GQA: untied head, 32,000 vocabulary
        n_layers=32, n_embd=4096, n_head=32, n_head_kv=8, n_ff=14336, context_length=4096, rope_base=10000.0,
        weight_type="Q4_K", embedding_type="Q4_K", vocab_size=32000, tied=False, random_blocks=True,
        more_bits_type="Q6_K",
    ),
}

MB = 1e6

# Runs in the child, so its ru_maxrss is the conversion's alone (not the GGUF writer's in the parent).
CHILD = """
import json, sys, time
from pathlib import Path
# A forked child starts with its parent's resident pages counted (the parent held a whole GGUF while
# writing it): reset the high-water mark, so VmHWM is the conversion's own peak.
Path("/proc/self/clear_refs").write_text("5")
sys.path.insert(0, sys.argv[4])
from engine.model.convert import ensure_converted
t = time.perf_counter()
m = ensure_converted(Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3]))
hwm = next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM"))
print(json.dumps({"seconds": time.perf_counter() - t, "onnx": str(m.onnx_path), "peak_rss_bytes": hwm * 1024}))
"""


def proc_status(pid: int) -> dict[str, int]:
    """RssAnon and RssFile in kB from /proc/<pid>/status (empty once the process is gone)."""
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError:
        return {}
    return {k: int(v.split()[0]) for k, v in (line.split(":", 1) for line in lines) if k in ("RssAnon", "RssFile")}


def largest_gguf_tensor(path: Path) -> tuple[str, int]:
    from engine.model.gguf_parse import read_gguf

    t = max(read_gguf(path).tensors.values(), key=lambda t: t.n_bytes)
    return t.name, int(t.n_bytes)


def largest_onnx_initializer(onnx_path: Path) -> tuple[str, int]:
    """The biggest initializer as stored (external data's length, or inline bytes)."""
    import onnx

    model = onnx.load(str(onnx_path), load_external_data=False)
    best = ("", 0)
    for init in model.graph.initializer:
        size = len(init.raw_data)
        for entry in init.external_data:
            if entry.key == "length":
                size = int(entry.value)
        if size > best[1]:
            best = (init.name, size)
    return best


def measure(name: str, spec: SyntheticSpec, weights: str, home: Path, keep: bool) -> dict:
    models = home / "models"
    models.mkdir(parents=True, exist_ok=True)
    gguf = models / f"synthetic-{name}-q4km.gguf"
    t = time.perf_counter()
    if not gguf.exists():
        write_synthetic_gguf(gguf, spec)
    write_s = time.perf_counter() - t
    print(f"[{name}] GGUF {gguf.stat().st_size / MB:.0f} MB written in {write_s:.0f} s; converting…", flush=True)
    # A cached conversion would be a hit, not a measurement: drop it first.
    done = conversion_dir(home / "converted", gguf_digest(gguf), get_precision(weights).name, "last")
    shutil.rmtree(done, ignore_errors=True)
    proc = subprocess.Popen([sys.executable, "-c", CHILD, str(gguf), weights, str(home / "converted"), str(ROOT)],
                            stdout=subprocess.PIPE, text=True)
    # The peak counts the memory-mapped GGUF's pages too (file-backed: the kernel may drop them under
    # pressure); polling /proc splits it into anonymous (the converter's own) and file-backed memory.
    peaks = {"RssAnon": 0, "RssFile": 0}
    while proc.poll() is None:
        for kind, kb in proc_status(proc.pid).items():
            peaks[kind] = max(peaks[kind], kb * 1024)
        time.sleep(0.05)
    stdout = proc.stdout.read() if proc.stdout else ""
    if proc.returncode:
        raise SystemExit(f"conversion failed ({proc.returncode})")
    child = json.loads(stdout.strip().splitlines()[-1])
    onnx_path = Path(child["onnx"])
    converted = sum(p.stat().st_size for p in onnx_path.parent.iterdir() if p.name.startswith("model.onnx"))
    g_name, g_bytes = largest_gguf_tensor(gguf)
    o_name, o_bytes = largest_onnx_initializer(onnx_path)
    gguf_bytes = gguf.stat().st_size
    # The target's "largest tensor": the bigger of the GGUF's and the converted one's (the kinder reading).
    largest = max(g_bytes, o_bytes)
    rss_limit = 1.5 * largest + 500 * MB
    row = {
        "shape": name, "spec": asdict(spec), "weights": weights, "gguf": str(gguf), "gguf_bytes": gguf_bytes,
        "gguf_write_s": write_s, "converted_bytes": converted, "ratio": converted / gguf_bytes,
        "convert_s": child["seconds"], "peak_rss_bytes": child["peak_rss_bytes"],
        "peak_anon_bytes_polled": peaks["RssAnon"], "peak_file_bytes_polled": peaks["RssFile"],
        "largest_gguf_tensor": {"name": g_name, "bytes": g_bytes},
        "largest_converted_tensor": {"name": o_name, "bytes": o_bytes},
        "rss_limit_bytes": rss_limit, "rss_target_met": child["peak_rss_bytes"] < rss_limit,
        "size_target_met": converted <= 1.4 * gguf_bytes,
    }
    if not keep and name != "1b":  # the 1B file stays for bench/peer.py; bigger ones go (disk)
        gguf.unlink()
    return row


def print_table(rows: list[dict]) -> None:
    head = ("shape", "GGUF MB", "converted MB", "ratio", "convert s", "peak RSS MB (anon / file)", "largest GGUF / conv. MB",
            "RSS limit MB", "RSS target", "size target")
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for r in rows:
        print(f"| {r['shape']} | {r['gguf_bytes'] / MB:.0f} | {r['converted_bytes'] / MB:.0f} | {r['ratio']:.2f} | "
              f"{r['convert_s']:.0f} | {r['peak_rss_bytes'] / MB:.0f} ({r['peak_anon_bytes_polled'] / MB:.0f} / "
              f"{r['peak_file_bytes_polled'] / MB:.0f}) | "
              f"{r['largest_gguf_tensor']['bytes'] / MB:.0f} / {r['largest_converted_tensor']['bytes'] / MB:.0f} | "
              f"{r['rss_limit_bytes'] / MB:.0f} | {'met' if r['rss_target_met'] else 'NOT met'} | "
              f"{'met' if r['size_target_met'] else 'NOT met'} |")


def main() -> int:
    import os

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data-dir", default=os.environ.get("HEARTH_HOME"),
                    help="GGUFs go to DIR/models, conversions to DIR/converted (as bench/peer.py --data-dir reads)")
    ap.add_argument("--shapes", default="1b", help="comma list of: " + ", ".join(SHAPES))
    ap.add_argument("--weights", default="int4")
    ap.add_argument("--keep", action="store_true", help="keep every GGUF (default: only the 1B one)")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "convert_shapes.json"))
    args = ap.parse_args()
    if not args.data_dir:
        raise SystemExit("give --data-dir (or HEARTH_HOME): the files are large")
    home = Path(args.data_dir).resolve()
    rows = [measure(s, SHAPES[s], args.weights, home, args.keep) for s in args.shapes.split(",")]
    print_table(rows)
    result = {"command": " ".join([Path(sys.executable).name, *sys.argv]), "platform": platform.platform(),
              "cpus": os.cpu_count(), "rows": rows}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
