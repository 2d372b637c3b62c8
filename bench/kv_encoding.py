"""Compact KV encoding benchmark (not a test): exact vs int8 checkpoints of the same conversation,
side by side in one run, on the default model.

    python bench/kv_encoding.py [--data-dir DIR] [--sizes 2048,8000] [--weights int4] [--provider cpu|cuda]

For each size a conversation of about that many tokens is built from fixed text (as in
bench/resume.py), and for each encoding:
  save       the whole context written to a new file (quantizing included), and the quantizing alone
             (best of three);
  bytes      file bytes per token;
  restore    a new session restores and verifies every record (int8: and dequantizes), warm page
             cache (best of three), and cold: the file's pages dropped first with
             posix_fadvise(DONTNEED), which needs no root (median of three);
  resume     time to first token of the conversation plus a new message, warm;
  accuracy   against the exact restore: max |Δlogit| over the next token and ``--steps`` greedy steps
             fed the exact run's tokens, top-1 agreement at those steps, and how many greedy tokens
             the int8 restore repeats before the first disagreement.
Prints a table and writes bench/results/kv_encoding.json. Imports nothing from Qt.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from resume import conversation_of  # noqa: E402  (bench/resume.py: the same fixed conversations)

log = logging.getLogger("bench.kv_encoding")
ENCODINGS = ("exact", "int8")


def drop_file_cache(path: Path) -> None:
    """Evict one file's pages from the page cache (clean pages: the file was fsynced when saved)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fdatasync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def greedy_logits(engine, first: np.ndarray, steps: int, forced: list[int] | None = None):
    """Logits of the next token and of ``steps`` more, feeding the argmax (or ``forced`` tokens)."""
    out, tokens = [first], []
    for k in range(steps):
        tokens.append(int(out[-1].argmax()) if forced is None else forced[k])
        out.append(engine.prefill([tokens[-1]]))
    return np.stack(out), tokens


def measure(engine, size: int, workdir: Path, steps: int) -> list[dict]:
    from engine.checkpoint.store import CheckpointStore, conversation_file
    from engine.checkpoint.writer import encode_layers, new_header
    from engine.session import ChatSessions

    msgs = conversation_of(engine, size)
    again = msgs + [{"role": "assistant", "content": "Done."},
                    {"role": "user", "content": "Thanks! Now repeat the first word of my first message."}]
    rows, reference = [], None
    for enc in ENCODINGS:
        store_dir = workdir / f"{enc}-{size}"
        engine.reset()
        s = ChatSessions(engine, CheckpointStore(store_dir), adaptive=False, kv_encoding=enc)
        path = store_dir / conversation_file("c", s.identity.model_fp)
        _, prompt, _ = s.sync("c", msgs)
        out: dict = {"target_tokens": size, "encoding": enc, "tokens": len(prompt)}
        s.save("turn")  # the prefill saved at aligned frontiers: time one whole-context save instead
        s.store.remove(path.name)
        full = s.save("turn")
        out["full_save_ms"], out["file_bytes"] = full.elapsed_ms, path.stat().st_size
        out["bytes_per_token"] = out["file_bytes"] / len(prompt)
        header = new_header(s.identity, enc)
        encode = []
        for _ in range(3):
            blocks = engine.cache.read_rows(0, len(prompt))  # as a save takes them
            t = time.perf_counter()
            encode_layers(header, blocks)
            encode.append((time.perf_counter() - t) * 1000)
        out["encode_ms"] = min(encode)
        s.store.close()

        warm, cold = [], []
        engine.reset()
        for attempt in range(7):  # one to warm up, three warm, three cold
            if attempt >= 4:
                drop_file_cache(path)
            r = ChatSessions(engine, CheckpointStore(store_dir), adaptive=False)
            t = time.perf_counter()
            first, _, rep = r.sync("c", again)
            ttft = (time.perf_counter() - t) * 1000
            assert rep.source == "disk" and rep.reason is None, rep
            if 1 <= attempt <= 3:
                warm.append((rep.restore_ms, ttft))
            elif attempt >= 4:
                cold.append(rep.restore_ms)
            if attempt < 6:
                engine.truncate(rep.restored_tokens)  # keep the buffers, as when switching chats
            r.store.close()
        out["restore_verify_ms"], out["resume_ttft_ms"] = min(warm)
        out["restore_verify_cold_cache_ms"] = statistics.median(cold)
        out["restored_tokens"] = rep.restored_tokens
        out["restore_mb_s_cold"] = out["file_bytes"] / 1e6 / (out["restore_verify_cold_cache_ms"] / 1000)

        logits, tokens = greedy_logits(engine, first, steps, None if reference is None else reference[1])
        if reference is None:
            reference = (logits, tokens)
        else:
            exact = reference[0]
            delta = np.abs(logits - exact).max(axis=-1)
            same = logits.argmax(-1) == exact.argmax(-1)
            top2 = np.sort(exact, axis=-1)[:, -2:]
            out["max_abs_dlogit"] = float(delta.max())
            out["mean_max_abs_dlogit"] = float(delta.mean())
            out["logit_range"] = float(exact[0].max() - exact[0].min())
            out["next_token_same"] = bool(same[0])
            out["top1_agree"], out["top1_steps"] = int(same.sum()), int(same.size)
            out["greedy_identical_tokens"] = int(np.argmin(same)) if not same.all() else int(same.size)
            out["min_exact_margin_at_a_flip"] = float(min((top2[k, 1] - top2[k, 0]) for k in np.flatnonzero(~same))) \
                if not same.all() else None
        rows.append(out)
        log.info("measured %s at %d tokens", enc, size)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data-dir")
    ap.add_argument("--sizes", default="2048,8000")
    ap.add_argument("--weights", default="int4")
    ap.add_argument("--provider", default="cpu")
    ap.add_argument("--steps", type=int, default=32, help="greedy steps compared for accuracy")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "kv_encoding.json"))
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")

    from engine.loader import load_engine
    from engine.paths import resolve_paths

    engine, converted, _ = load_engine(resolve_paths(args.data_dir).ensure(), weights=args.weights,
                                       provider=args.provider)
    engine.prefill(engine.tokenizer.encode("warm up " * 16))
    engine.reset()
    rows: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="hearth-kvenc-", dir=os.environ.get("HEARTH_BENCH_TMP")) as tmp:
        for size in (int(x) for x in args.sizes.split(",")):
            rows += measure(engine, size, Path(tmp), args.steps)

    header = ("tokens", "encoding", "B/token", "file MB", "full save ms", "encode ms", "restore warm ms",
              "restore cold-cache ms", "cold MB/s", "resume TTFT ms", "max |Δlogit|", "top-1 agree", "greedy same")
    lines = [" | ".join(header)]
    for r in rows:
        acc = ("—", "—", "—") if "max_abs_dlogit" not in r else (
            f"{r['max_abs_dlogit']:.3f}", f"{r['top1_agree']}/{r['top1_steps']}",
            f"{r['greedy_identical_tokens']}/{r['top1_steps']}")
        lines.append(" | ".join([
            f"{r['tokens']}", r["encoding"], f"{r['bytes_per_token']:.0f}", f"{r['file_bytes'] / 1e6:.1f}",
            f"{r['full_save_ms']:.1f}", f"{r['encode_ms']:.1f}", f"{r['restore_verify_ms']:.1f}",
            f"{r['restore_verify_cold_cache_ms']:.1f}", f"{r['restore_mb_s_cold']:.0f}", f"{r['resume_ttft_ms']:.1f}",
            *acc]))
    sys.stdout.write("\n".join(lines) + "\n")
    result = {"machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "python": platform.python_version()},
              "weights": converted.precision, "provider": engine.provider, "kv_dtype": engine.cache.dtype.name,
              "command": " ".join(sys.argv), "rows": rows}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))
    log.info("wrote %s", args.out)


if __name__ == "__main__":
    main()
