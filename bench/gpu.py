"""GPU benchmark (not a test): the default model on CUDA — prefill and decode speed at several
contexts, decode as a fraction of the memory-bandwidth limit, and resuming from disk against a GPU
prefill of the same conversation, with the adaptive choice checked on both sides.

    python bench/gpu.py [--data-dir DIR] [--contexts 1024,8000] [--bandwidth-tb-s 4.8]
    python bench/gpu.py --context-length 32768 --contexts 1024,8000,32000   # the default model re-headed to 32k
    python bench/gpu.py --synthetic llama3-8b --contexts 1024,8000,32000    # random Q4_0 blocks, Llama-3-8B's shape
    python bench/gpu.py --synthetic llama3-8b-q4km --contexts 1024,8000     # the same shape, Q4_K_M's tensor mix

Decode at a context fills the KV cache with random rows (speed depends on the cache's size, not its
values). Bytes per decoded token = the weights read per token (the converted model's data file less
an embedding table that is only gathered from) + the K and V rows read at that context. A synthetic
model is written with the converter's own GGUF path (engine/model/synthetic.py) on the machine that
runs the benchmark. Prints a table and writes bench/results/gpu.json.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
_spec = importlib.util.spec_from_file_location("bench_resume", ROOT / "bench" / "resume.py")
bench_resume = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench_resume)


def prefill_speed(engine, n: int, rng) -> float:
    """Tokens/s of a prefill of ``n`` tokens, the second of two: the first meets new shapes (kernel
    tuning, memory arena growth), which a long-running app pays once."""
    tokens = rng.integers(100, 1000, n).tolist()
    for _ in range(2):
        engine.reset()
        t = time.perf_counter()
        engine.prefill(tokens)
        elapsed = time.perf_counter() - t
    return n / elapsed


def decode_speed(engine, context: int, rng, steps: int = 64) -> float:
    cfg = engine.runner.config
    fill = min(context, cfg.context_length - 5 * steps - 2)
    shape = (cfg.n_layers, cfg.n_head_kv, fill, cfg.head_dim)
    engine.reset()
    engine.import_kv(rng.integers(100, 1000, fill).tolist(), rng.standard_normal(shape).astype(engine.cache.dtype),
                     rng.standard_normal(shape).astype(engine.cache.dtype))
    engine.runner.forward([5], engine.cache)  # warm-up at this size
    # the median of five runs: one run of 64 steps of Gemma 3 270M moved by ±10% between identical builds
    # (879 / 956 tok/s at 1k, H100, 2026-12-07)
    rates = []
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(steps):
            engine.runner.forward([5], engine.cache)
        rates.append(steps / (time.perf_counter() - t))
    return float(np.median(rates))


def generate_speed(engine, context: int, rng, steps: int = 128) -> float:
    """Tokens/s of the whole greedy loop (forward, sampling, detokenizing) after ``context`` tokens."""
    from engine.sampling import SamplingParams

    engine.reset()
    prompt = rng.integers(100, 1000, context).tolist()
    result = engine.generate(prompt, SamplingParams(greedy=True), max_new_tokens=steps)
    return result.timings.decode_tokens_per_s


def weights_read_per_token(onnx_path: Path, tied: bool) -> int:
    """Bytes of initializers a decode step reads: all of them, less an untied embedding table
    (a step gathers one row of it)."""
    import onnx

    model = onnx.load(str(onnx_path), load_external_data=False)
    total = 0
    for init in model.graph.initializer:
        length = next((int(e.value) for e in init.external_data if e.key == "length"), len(init.raw_data))
        if tied or not init.name.startswith("token_embd.weight"):  # the table, dense or in its GGUF blocks
            total += length
    return total


def model_file(args, paths) -> str | None:
    """The GGUF to run: the default, a synthetic one written here, or either re-headed to a longer context."""
    from engine.loader import resolve_gguf

    if args.synthetic:
        from dataclasses import replace

        from engine.model.synthetic import LLAMA3_8B_Q4_K_M, LLAMA3_8B_SHAPE, QWEN25_7B_Q4_K_M, write_synthetic_gguf

        shape = {"llama3-8b": LLAMA3_8B_SHAPE, "llama3-8b-q4km": LLAMA3_8B_Q4_K_M,
                 "qwen2.5-7b-q4km": QWEN25_7B_Q4_K_M}[args.synthetic]
        spec = replace(shape, context_length=args.context_length or shape.context_length)
        path = paths.models / f"synthetic-{args.synthetic}-{spec.context_length}.gguf"
        if not path.exists():
            t = time.perf_counter()
            write_synthetic_gguf(path.with_suffix(".partial"), spec).rename(path)
            print(f"wrote {path.name} ({path.stat().st_size / 2**30:.2f} GiB) in {time.perf_counter() - t:.0f} s",
                  file=sys.stderr)
        return str(path)
    source = resolve_gguf(paths, args.model)
    if not args.context_length:
        return str(source)
    from tests.gguf_edit import rewrite_gguf

    path = paths.models / f"{source.stem}-ctx{args.context_length}.gguf"
    if not path.exists():
        rewrite_gguf(source, path, values={"llama.context_length": args.context_length})
    return str(path)


def evict_from_page_cache(root: Path) -> None:
    """Drop a store's files from the page cache (no root needed), so the next read comes from disk."""
    for path in root.rglob("*"):
        if path.is_file():
            fd = os.open(path, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def resume_vs_prefill(engine, size: int, workdir: Path, encodings: list[str]) -> dict:
    """A conversation of ``size`` tokens and a follow-up: GPU prefill of it all from nothing vs
    resuming from its checkpoint (page cache warm, best of 3, and evicted: read from disk) in each
    payload encoding, and what the adaptive choice picks."""
    from engine.checkpoint.store import CheckpointStore
    from engine.session import ChatSessions

    msgs = bench_resume.conversation_of(engine, size)
    follow = msgs + [{"role": "assistant", "content": "Noted."}, {"role": "user", "content": "Thanks!"}]
    engine.reset()
    # Pure prefill: no saves at 2,048-token frontiers along the way (the app makes those).
    cold = ChatSessions(engine, CheckpointStore(workdir / f"none-{size}"), adaptive=False, save_align=1 << 40)
    t = time.perf_counter()
    _, prompt, _ = cold.sync("c", follow)
    prefill_ms = (time.perf_counter() - t) * 1000
    result = {"tokens": len(prompt), "gpu_prefill_ttft_ms": prefill_ms}
    for encoding in encodings:
        store_dir = workdir / f"{encoding}-{size}"
        engine.reset()
        s = ChatSessions(engine, CheckpointStore(store_dir), adaptive=False, kv_encoding=encoding)
        s.sync("c", msgs)
        s.save("turn")
        timings = []
        for evict in (False, False, False, True):
            if evict:
                evict_from_page_cache(store_dir)
            engine.reset()
            r = ChatSessions(engine, CheckpointStore(store_dir), adaptive=False)
            t = time.perf_counter()
            _, _, rep = r.sync("c", follow)
            timings.append(((time.perf_counter() - t) * 1000, rep))
        warm_ms, warm_rep = min(timings[:3], key=lambda x: x[0])
        disk_ms, disk_rep = timings[3]
        assert warm_rep.source == "disk" and disk_rep.source == "disk", (warm_rep.reason, disk_rep.reason)
        result[encoding] = {
            "file_bytes": sum(p.stat().st_size for p in store_dir.rglob("*.hkv")),
            "resume_ttft_ms": warm_ms, "restore_ms": warm_rep.restore_ms,
            "resume_from_disk_ttft_ms": disk_ms, "restore_from_disk_ms": disk_rep.restore_ms,
        }
    # The adaptive choice, fed the rates just measured (exact encoding): with the page cache warm, and
    # with the file evicted and the disk's rate.
    exact, store_dir = result[encodings[0]], workdir / f"{encodings[0]}-{size}"
    for case, restore_ms, resume_ms in (("warm", exact["restore_ms"], exact["resume_ttft_ms"]),
                                        ("disk", exact["restore_from_disk_ms"], exact["resume_from_disk_ttft_ms"])):
        if case == "disk":
            evict_from_page_cache(store_dir)
        engine.reset()
        adaptive = ChatSessions(engine, CheckpointStore(store_dir), adaptive=True)
        adaptive.throughput.prefill_tps = len(prompt) / (prefill_ms / 1000)
        adaptive.throughput.read_bps = exact["file_bytes"] / (restore_ms / 1000)
        _, _, chosen = adaptive.sync("c", follow)
        faster = "disk" if resume_ms < prefill_ms else "prefill"
        picked = "disk" if chosen.source == "disk" else "prefill"
        suffix = "" if case == "warm" else "_from_disk"
        result.update({f"faster{suffix}": faster, f"adaptive_picked{suffix}": picked,
                       f"adaptive_correct{suffix}": faster == picked,
                       f"adaptive_estimates_ms{suffix}": [chosen.restore_estimate_ms, chosen.prefill_estimate_ms]})
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data-dir")
    ap.add_argument("--model", help="a GGUF (default: the installed default model)")
    ap.add_argument("--synthetic", choices=["llama3-8b", "llama3-8b-q4km", "qwen2.5-7b-q4km"],
                    help="write and run a random model of this shape (Q4_0 blocks, or llama.cpp's Q4_K_M mix)")
    ap.add_argument("--context-length", type=int, help="run the model with this context length (re-headed copy)")
    ap.add_argument("--weights", default="int4", help="int4 runs as int4-cuda-dense or int4-cuda on CUDA (engine/loader.py)")
    ap.add_argument("--contexts", default="1024,8000")
    ap.add_argument("--resume-sizes", default="512,2048,8000", help="'' to skip")
    ap.add_argument("--bandwidth-tb-s", type=float, default=4.8)
    ap.add_argument("--encodings", default="exact,int8", help="checkpoint payload encodings to resume from")
    ap.add_argument("--workdir", help="where the checkpoints go (default: a temporary directory)")
    ap.add_argument("--loop", action="store_true", help="also time the whole greedy generation loop at 1k")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "gpu.json"))
    args = ap.parse_args()

    from engine.loader import load_engine
    from engine.paths import resolve_paths

    paths = resolve_paths(args.data_dir).ensure()
    engine, converted, load_ms = load_engine(paths, model=model_file(args, paths), weights=args.weights, provider="cuda")
    if engine.provider != "cuda":
        sys.exit(f"CUDA is not usable here: {engine.runner.provider_note}")
    engine.prefill_chunk = 2048
    graph = engine.runner.graph
    attention = graph.attention if graph is not None else "no CUDA graph"
    print(f"running {converted.precision} on CUDA (matmuls: {engine.runner.matmul}; decode attention: {attention})",
          file=sys.stderr, flush=True)
    rng = np.random.default_rng(0)
    prefill_speed(engine, 256, rng)  # warm-up
    cfg = engine.runner.config
    weight_bytes = weights_read_per_token(converted.onnx_path, cfg.tied_embeddings)
    rows = []
    for ctx in (int(x) for x in args.contexts.split(",") if x):
        pre = prefill_speed(engine, min(ctx, cfg.context_length - 1), rng)
        dec = decode_speed(engine, ctx, rng)
        kv_bytes = 2 * cfg.n_layers * cfg.n_head_kv * min(ctx, cfg.context_length) * cfg.head_dim * engine.cache.dtype.itemsize
        per_token = weight_bytes + kv_bytes
        rows.append({"context": ctx, "prefill_tok_s": pre, "decode_tok_s": dec, "bytes_per_token": per_token,
                     "bandwidth_fraction": dec * per_token / (args.bandwidth_tb_s * 1e12)})
        print(f"context {ctx}: prefill {pre:.0f} tok/s, decode {dec:.1f} tok/s", file=sys.stderr, flush=True)
    loop = generate_speed(engine, 1024, rng) if args.loop else None
    with tempfile.TemporaryDirectory(prefix="hearth-gpu-") as tmp:
        resumes = []
        for n in (int(x) for x in args.resume_sizes.split(",") if x):
            resumes.append(resume_vs_prefill(engine, n, Path(args.workdir or tmp), args.encodings.split(",")))
            print(json.dumps(resumes[-1]), file=sys.stderr, flush=True)

    print(f"{'context':>8} {'prefill tok/s':>14} {'decode tok/s':>13} {'MB/token':>9} {'of bandwidth':>13}")
    for r in rows:
        print(f"{r['context']:>8} {r['prefill_tok_s']:>14.0f} {r['decode_tok_s']:>13.1f} "
              f"{r['bytes_per_token'] / 1e6:>9.1f} {r['bandwidth_fraction'] * 100:>12.2f}%")
    if loop is not None:
        print(f"whole greedy loop at 1k (forward + sampling + detokenizing): {loop:.1f} tok/s")
    encodings = args.encodings.split(",")
    print(f"{'tokens':>8} {'GPU prefill ms':>15}" + "".join(
        f" {e + ' MB':>9} {e + ' warm ms':>13} {e + ' disk ms':>13}" for e in encodings)
        + f" {'faster':>8} {'adaptive':>9} {'disk: faster':>13} {'adaptive':>9}")
    for r in resumes:
        print(f"{r['tokens']:>8} {r['gpu_prefill_ttft_ms']:>15.1f}" + "".join(
            f" {r[e]['file_bytes'] / 1e6:>9.1f} {r[e]['resume_ttft_ms']:>13.1f} {r[e]['resume_from_disk_ttft_ms']:>13.1f}"
            for e in encodings) + f" {r['faster']:>8} {r['adaptive_picked']:>9} {r['faster_from_disk']:>13} "
            f"{r['adaptive_picked_from_disk']:>9}")
    result = {"machine": {"platform": platform.platform(), "cpus": os.cpu_count()}, "weights": converted.precision,
              "load_ms": load_ms, "weight_bytes_per_token": weight_bytes, "rows": rows, "resume": resumes,
              "generate_loop_tok_s": loop, "model": converted.gguf_path.name,
              "context_length": cfg.context_length}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))
    print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
