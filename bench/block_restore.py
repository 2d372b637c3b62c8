"""Warm restore from the block store against one checkpoint file (not a test), the same rows in both.

    python bench/block_restore.py [--data-dir DIR] [--block-tokens 256] [--repeats 7] [--words 6500]

A ~7,000-token prompt of the default model is written with the same (random, finite) rows to a file
store and to a block store, then ``ChatSessions.prepare_text`` restores it from each, alternating,
``--repeats`` times; the medians (the first pair dropped: page cache and buffers warming) and their
ratio are printed. Only the restore is timed, so the ratio is what the block store's per-block reads
and checks cost; ``bench/resume.py --store both`` measures the whole resume around it.
"""

from __future__ import annotations

import argparse
import hashlib
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

WORDS = "river stone lantern harbor meadow copper willow signal orchard canyon ember glacier".split()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data-dir")
    ap.add_argument("--block-tokens", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--words", type=int, default=6500)
    args = ap.parse_args()

    import numpy as np

    from engine.checkpoint.block_store import BlockStore
    from engine.checkpoint.identity import engine_identity
    from engine.checkpoint.store import CheckpointStore
    from engine.checkpoint.writer import NewRecord
    from engine.loader import load_engine
    from engine.paths import resolve_paths
    from engine.session import ChatSessions
    from engine.session.prefix import lead_tokens

    engine, _, _ = load_engine(resolve_paths(args.data_dir).ensure(), weights="int4", provider="cpu")
    ident = engine_identity(engine)
    words = " ".join(WORDS[(i * 7) % len(WORDS)] for i in range(args.words))
    text = engine.render([{"role": "system", "content": "You are helpful."}, {"role": "user", "content": words}]).encode()
    tokens = lead_tokens(engine.tokenizer, text) + engine.tokenizer.encode(text.decode())
    s = ident.shape
    rng = np.random.default_rng(0)
    rows = [np.ascontiguousarray(rng.standard_normal((len(tokens), s.head_dim), dtype=np.float32))
            for _ in range(2 * s.n_layers * s.n_kv_heads)]
    record = NewRecord(0, tokens, rows, len(text), hashlib.sha256(text).digest(), "turn")
    follow = text + engine.render([{"role": "assistant", "content": "ok"},
                                   {"role": "user", "content": "more please"}]).encode()
    with tempfile.TemporaryDirectory(prefix="hearth-block-restore-") as tmp:
        stores = {"file": CheckpointStore(Path(tmp) / "file"),
                  "blocks": BlockStore(Path(tmp) / "blocks", block_tokens=args.block_tokens)}
        for store in stores.values():
            store.create(store.record_name("c", ident.model_fp), ident, [record], "exact")
            store.reconcile()  # index the record as a restart would find it
        times: dict[str, list[float]] = {k: [] for k in stores}
        for _ in range(args.repeats + 1):
            for kind, store in stores.items():
                engine.reset(keep_buffers=True)
                sessions = ChatSessions(engine, store, adaptive=False)
                started = time.perf_counter()
                _, report = sessions.prepare_text("c", follow)
                times[kind].append((time.perf_counter() - started) * 1000)
                assert report.restored_tokens >= len(tokens) - 2, report
    f, b = (statistics.median(times[k][1:]) for k in ("file", "blocks"))
    print(f"{len(tokens)} tokens, blocks of {args.block_tokens}: file {f:.1f} ms, blocks {b:.1f} ms, ratio {b / f:.2f}")


if __name__ == "__main__":  # the chat template's sandbox starts a process: this module must not run twice
    main()
