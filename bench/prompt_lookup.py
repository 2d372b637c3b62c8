"""Prompt-lookup decoding against plain decoding, greedy, one process (not a test).

    python -m bench.prompt_lookup [--home DIR] [--drafts 0,4,8,16] [--pause 16] [--lines 300] [--tokens 400]
                                  [--rounds 2]

Two workloads on the default model: "edit" asks it to repeat a source file (``--lines`` lines of
engine/generation.py) with one change; "chat" is an ordinary question. Each draft limit runs in turn
(0 = off), alternated over ``--rounds`` so drift on a shared machine cancels; prints decode tokens/s
(medians), drafted/accepted counts, and whether the tokens equal plain decoding's. ``--pause`` lists
back-off pauses to try with each draft limit (engine.lookup.PAUSE_TOKENS; 0 = never pause), e.g. 0,16.
Writes bench/results/prompt_lookup.json.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import tempfile
from dataclasses import replace
from pathlib import Path

from engine import lookup
from engine.generation import Engine
from engine.model.convert import ensure_converted
from engine.model.fetch import default_model, fetch_model
from engine.types import SamplingParams

log = logging.getLogger("bench.prompt_lookup")
ROOT = Path(__file__).resolve().parents[1]


def workloads(lines: int) -> dict[str, str]:
    source = "\n".join((ROOT / "engine" / "generation.py").read_text().splitlines()[:lines])
    return {"edit": "Repeat this Python file exactly, but rename the variable `timings` to `times`. Output only "
                    f"the code.\n\n```python\n{source}\n```",
            "chat": "What are three good habits for staying healthy? Answer in a short paragraph."}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--home", type=Path, default=None, help="a data dir with the default model in models/")
    parser.add_argument("--drafts", default="0,4,8,16")
    parser.add_argument("--pause", default=str(lookup.PAUSE_TOKENS))
    parser.add_argument("--lines", type=int, default=300)
    parser.add_argument("--tokens", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    home = args.home or Path(tempfile.mkdtemp(prefix="lookup-bench-"))
    gguf = fetch_model(default_model(), home / "models")
    engine = Engine.load(ensure_converted(gguf, "int4", home / "converted"), "cpu")
    drafts = [int(d) for d in args.drafts.split(",")]
    pauses = [int(p) for p in args.pause.split(",")]
    arms = [(d, p) for d in drafts for p in (pauses if d else pauses[:1])]
    label = {a: str(a[0]) if not a[0] or len(pauses) == 1 else f"{a[0]}/pause{a[1]}" for a in arms}
    results: dict = {}
    for name, text in workloads(args.lines).items():
        prompt = engine.prompt_tokens([{"role": "user", "content": text}])
        rates: dict[tuple, list[float]] = {a: [] for a in arms}
        runs: dict[tuple, object] = {}
        for r in range(args.rounds):
            for a in arms if r % 2 == 0 else reversed(arms):
                engine.reset()
                lookup.PAUSE_TOKENS = a[1]
                out = engine.generate(prompt, replace(SamplingParams.greedy_params(), prompt_lookup=a[0]), args.tokens)
                rates[a].append(out.timings.decode_tokens_per_s)
                runs[a] = out
        plain = runs[arms[0]].tokens
        results[name] = {}
        for a in arms:
            t = runs[a].timings
            row = {"tokens_per_s": statistics.median(rates[a]), "tokens": len(runs[a].tokens),
                   "drafted": t.drafted_tokens, "accepted": t.accepted_tokens, "same_tokens": runs[a].tokens == plain}
            results[name][label[a]] = row
            log.info("%-4s prompt %5d tok  drafts %-10s: %7.1f tok/s (%.2fx)  %4d tokens  drafted %5d accepted %5d"
                     "  same %s", name, len(prompt), label[a], row["tokens_per_s"],
                     row["tokens_per_s"] / results[name][label[arms[0]]]["tokens_per_s"],
                     row["tokens"], row["drafted"], row["accepted"], row["same_tokens"])
    out_dir = ROOT / "bench" / "results"
    out_dir.mkdir(exist_ok=True)
    (out_dir / "prompt_lookup.json").write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
