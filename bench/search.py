"""Search benchmark (not a test): latency per keystroke of the browser's full-text search.

    python bench/search.py [--conversations 10000] [--messages 200000]

Builds a conversation store of generated text (a Zipf-like vocabulary of 6,000 words, 20 messages per
conversation by default), then types a set of queries one character at a time, running the search the
browser runs on each keystroke (prefix match on the word being typed, 200 results). Prints p50 / p95
/ max per keystroke and writes bench/results/search.json. Target: p95 under 50 ms.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

QUERIES = ["nile", "river delta", "lantern harbor", "recipe vanilla", '"copper kettle"', "python function",
           "quantum", "the", "zebra -horse", "crème brûlée", "東京", "a", "install error 42", "why is the sky blue"]


def vocabulary(rng: random.Random, n: int = 6000) -> list[str]:
    letters = "abcdefghijklmnopqrstuvwxyz"
    words = {"".join(rng.choice(letters) for _ in range(rng.randint(2, 10))) for _ in range(n * 2)}
    extra = ["nile", "river", "delta", "lantern", "harbor", "recipe", "vanilla", "copper", "kettle", "python",
             "function", "quantum", "zebra", "horse", "crème", "brûlée", "東京", "install", "error", "sky", "blue",
             "why", "the", "is", "a"]
    return extra + sorted(words)[:n]


def build(path: Path, conversations: int, messages: int, seed: int = 7) -> float:
    from engine.conversations import ConversationStore

    rng = random.Random(seed)
    vocab = vocabulary(rng)
    weights = [1 / (i + 1) for i in range(len(vocab))]  # Zipf-like: few common words, many rare ones
    store = ConversationStore(path)
    per_conv = max(1, messages // conversations)
    started = time.perf_counter()
    batch = []
    for c in range(conversations):
        msgs = []
        for j in range(per_conv):
            words = rng.choices(vocab, weights, k=rng.randint(8, 60))
            msgs.append({"role": "user" if j % 2 == 0 else "assistant", "content": " ".join(words), "created_ms": c})
        title = " ".join(rng.choices(vocab, weights, k=4))
        batch.append({"id": f"c{c:06d}", "title": title, "system_prompt": "", "settings": {}, "model": "bench",
                      "created_ms": c, "updated_ms": c, "messages": msgs})
        if len(batch) == 500:
            store.insert_full(batch)
            batch = []
    if batch:
        store.insert_full(batch)
    store.close()
    return time.perf_counter() - started


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--conversations", type=int, default=10_000)
    ap.add_argument("--messages", type=int, default=200_000)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "search.json"))
    args = ap.parse_args()

    from engine.conversations import ConversationStore
    from engine.search import search

    with tempfile.TemporaryDirectory(prefix="hearth-search-") as tmp:
        path = Path(tmp) / "conversations.sqlite3"
        build_s = build(path, args.conversations, args.messages)
        store = ConversationStore(path)
        n_msgs = store.read("SELECT COUNT(*) FROM messages")[0][0]
        size_mb = path.stat().st_size / 2**20
        search(store, "warm")  # the first query pays for opening the index
        times, per_query = [], {}
        for q in QUERIES:
            for i in range(1, len(q) + 1):
                t = time.perf_counter()
                hits = search(store, q[:i])
                times.append((time.perf_counter() - t) * 1000)
            per_query[q] = {"worst_ms": round(max(times[-len(q):]), 2), "hits": len(hits)}
    times.sort()
    p = lambda x: times[min(len(times) - 1, int(x * len(times)))]  # noqa: E731
    print(f"store: {args.conversations:,} conversations, {n_msgs:,} messages, {size_mb:.0f} MiB (built in {build_s:.0f} s)")
    print(f"{'query':<24} {'worst keystroke ms':>18} {'hits':>6}")
    for q, r in per_query.items():
        print(f"{q:<24} {r['worst_ms']:>18.2f} {r['hits']:>6}")
    print(f"keystrokes: {len(times)}; p50 {p(0.5):.2f} ms, p95 {p(0.95):.2f} ms, max {times[-1]:.2f} ms "
          f"(target p95 < 50 ms: {'met' if p(0.95) < 50 else 'NOT met'})")
    result = {"machine": {"platform": platform.platform(), "cpus": os.cpu_count()},
              "conversations": args.conversations, "messages": n_msgs, "db_mib": round(size_mb, 1),
              "p50_ms": round(p(0.5), 2), "p95_ms": round(p(0.95), 2), "max_ms": round(times[-1], 2),
              "mean_ms": round(statistics.mean(times), 2), "queries": per_query}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2, ensure_ascii=False))


if __name__ == "__main__":
    main()
