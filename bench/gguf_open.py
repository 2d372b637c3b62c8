"""GGUF open benchmark (not a test): opening a GGUF's metadata and tensor index, and reading the
tokenizer's arrays, with the gguf package's GGUFReader (what GGUFModel wrapped before issue 14) and
with GGUFModel's own reader.

    python bench/gguf_open.py [--models-dir DIR] [--repeat 5] [--no-reference]

For each GGUF in the models folder (by default the test cache's: SmolLM2-135M and Gemma 3 270M):
  reader open     gguf.GGUFReader(path), once (it takes seconds);
  + arrays        then tokens, token types and scores out of its fields, as the old accessors did;
  open            GGUFModel(path), best of --repeat;
  open + arrays   a fresh GGUFModel(path), then string_array(tokens), int_array(token types) and
                  value(scores) (the tokenizer's arrays), best of --repeat;
  tokenizer       Tokenizer.from_gguf on the opened model (the tokenizer's own build, for scale).
Prints a table and writes bench/results/gguf_open.json. Every run opens the file once before timing,
so the page cache is warm for both readers.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

TOKENS, TYPES, SCORES = "tokenizer.ggml.tokens", "tokenizer.ggml.token_type", "tokenizer.ggml.scores"


def best_ms(fn: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return min(times)


def reader_arrays(reader) -> None:
    """The tokenizer's arrays as GGUFModel's accessors took them from GGUFReader's fields."""
    tokens = reader.fields[TOKENS]
    [bytes(tokens.parts[i]).decode("utf-8", errors="replace") for i in tokens.data]
    types = reader.fields.get(TYPES)
    if types is not None:
        [int(types.parts[i][0]) for i in types.data]
    scores = reader.fields.get(SCORES)
    if scores is not None:
        scores.contents()


def arrays(model) -> None:
    model.string_array(TOKENS), model.int_array(TYPES), model.value(SCORES, [])


def measure(path: Path, repeat: int, reference: bool) -> dict:
    import gguf

    from engine.model.gguf_file import GGUFModel
    from engine.text.tokenizer import Tokenizer

    path.read_bytes()  # warm the page cache
    row: dict = {"file": path.name, "mb": path.stat().st_size / 1e6}
    model = GGUFModel(path)
    row["vocab"] = model.array_length(TOKENS)
    row["open_ms"] = best_ms(lambda: GGUFModel(path), repeat)
    row["open_arrays_ms"] = best_ms(lambda: arrays(GGUFModel(path)), repeat)
    row["tokenizer_ms"] = best_ms(lambda: Tokenizer.from_gguf(GGUFModel(path)), 1)
    if reference:
        start = time.perf_counter()
        reader = gguf.GGUFReader(path)
        row["reader_open_ms"] = (time.perf_counter() - start) * 1e3
        row["reader_open_arrays_ms"] = row["reader_open_ms"] + best_ms(lambda: reader_arrays(reader), 1)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cache = Path(os.environ.get("HEARTH_TEST_CACHE", ROOT / ".test-cache"))
    ap.add_argument("--models-dir", default=str(cache / "home" / "models"))
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--no-reference", action="store_true", help="skip gguf.GGUFReader (seconds per file)")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "gguf_open.json"))
    args = ap.parse_args()

    rows = [measure(p, args.repeat, not args.no_reference) for p in sorted(Path(args.models_dir).glob("*.gguf"))]
    header = ("file", "MB", "vocab", "GGUFReader open ms", "open+arrays ms", "GGUFModel open ms", "open+arrays ms", "speed-up",
              "tokenizer build ms")
    lines = [" | ".join(header)]
    for r in rows:
        before = r.get("reader_open_arrays_ms", 0)
        lines.append(" | ".join([
            r["file"], f"{r['mb']:.0f}", f"{r['vocab']}", f"{r.get('reader_open_ms', float('nan')):.0f}",
            f"{r.get('reader_open_arrays_ms', float('nan')):.0f}", f"{r['open_ms']:.1f}", f"{r['open_arrays_ms']:.1f}",
            f"{before / r['open_arrays_ms']:.0f}x" if before else "—", f"{r['tokenizer_ms']:.0f}"]))
    sys.stdout.write("\n".join(lines) + "\n")
    result = {"machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "python": platform.python_version()},
              "command": " ".join(sys.argv), "rows": rows}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))
    sys.stdout.write(f"wrote {args.out}\n")


if __name__ == "__main__":
    main()
