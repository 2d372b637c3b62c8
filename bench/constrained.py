"""The cost of a response_format constraint per decoded token, and of building llguidance's tokenizer
(not a test).

    python bench/constrained.py [--tokens 96] [--rounds 3] [--gemma]

Decodes the same JSON-asking chat greedily on SmolLM2-135M (int4, CPU) with no constraint, with
``json_object`` and with a JSON schema, alternating the three per round so drift cancels, and prints
median decode tok/s and the mask's cost per token. ``--gemma`` also times building the llguidance
tokenizer for Gemma 3's 262,144-token vocabulary (done once per tokenizer and kept).
Writes bench/results/constrained.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # before bench/, whose engine.py would shadow the package

SCHEMA = {
    "type": "object", "additionalProperties": False, "required": ["name", "age", "tags"],
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                   "tags": {"type": "array", "items": {"type": "string"}}},
}
MESSAGES = [{"role": "system", "content": "You answer with JSON only."},
            {"role": "user", "content": "Describe a person as JSON with a name, an age and a long list of tags."}]


def main() -> None:
    from engine.loader import load_engine
    from engine.model.fetch import default_model, fetch_model
    from engine.paths import HearthPaths, resolve_paths
    from engine.text.constrained import lltokenizer_for
    from engine.types import ResponseFormat, ResponseFormatKind, SamplingParams

    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--home", help="a HEARTH_HOME holding the default model (default: the usual one)")
    ap.add_argument("--gemma", help="a Gemma 3 GGUF: time the llguidance tokenizer for its vocabulary")
    args = ap.parse_args()

    if args.home:
        home = Path(args.home)
        paths = HearthPaths(home / "models", home / "converted", home, home / "checkpoints").ensure()
        fetch_model(default_model(), paths.models)
    else:
        paths = resolve_paths()
    engine, _, _ = load_engine(paths, weights="int4", provider="cpu")
    start = time.perf_counter()
    lltokenizer_for(engine.tokenizer, engine.stop_ids)
    build_ms = {"smollm2": (time.perf_counter() - start) * 1000}
    formats = {"none": None, "json_object": ResponseFormat(ResponseFormatKind.JSON_OBJECT),
               "json_schema": ResponseFormat(ResponseFormatKind.JSON_SCHEMA, SCHEMA)}
    prompt = engine.prompt_tokens(MESSAGES)
    params = SamplingParams.greedy_params()
    speeds: dict[str, list[float]] = {k: [] for k in formats}
    ms_per_token: dict[str, list[float]] = {k: [] for k in formats}
    for r in range(args.rounds):
        order = list(formats) if r % 2 == 0 else list(reversed(formats))
        for name in order:
            engine.generate(prompt, params, 1)  # the prompt is cached: the run below times decoding only
            result = engine.generate(prompt, params, args.tokens, response_format=formats[name])
            steps = max(1, len(result.tokens))
            speeds[name].append(result.timings.decode_tokens_per_s)
            ms_per_token[name].append(result.timings.decode_ms / steps)
    out = {"tokens": args.tokens, "rounds": args.rounds, "build_ms": build_ms, "results": {}}
    base = statistics.median(ms_per_token["none"])
    for name in formats:
        ms = statistics.median(ms_per_token[name])
        out["results"][name] = {"tok_s": statistics.median(speeds[name]), "ms_per_token": ms, "mask_ms": ms - base}
        print(f"{name:12s} {statistics.median(speeds[name]):7.1f} tok/s  {ms:6.2f} ms/token  (+{ms - base:5.2f} ms)")
    # the mask alone, replaying the schema's reply: allowed() + advance() per token, no model
    replay = engine.generate(prompt, params, args.tokens, response_format=formats["json_schema"]).tokens
    from engine.text.constrained import Constraint

    costs = []
    for _ in range(args.rounds):
        constraint = Constraint.for_format(formats["json_schema"], engine.tokenizer, engine.stop_ids)
        start = time.perf_counter()
        for token in replay:
            constraint.allowed()
            constraint.advance(token)
        costs.append((time.perf_counter() - start) * 1000 / max(1, len(replay)))
    out["mask_only_ms_per_token"] = statistics.median(costs)
    print(f"mask alone   {out['mask_only_ms_per_token']:.3f} ms/token over {len(replay)} tokens")
    if args.gemma:
        from engine.model.gguf_file import GGUFModel
        from engine.text.tokenizer import Tokenizer

        tokenizer = Tokenizer.from_gguf(GGUFModel(args.gemma))
        start = time.perf_counter()
        lltokenizer_for(tokenizer, tokenizer.specials.stop)
        build_ms["gemma3"] = (time.perf_counter() - start) * 1000
    out["build_ms"] = build_ms
    print("llguidance tokenizer build:", ", ".join(f"{k} {v:.0f} ms" for k, v in build_ms.items()))
    results = Path(__file__).parent / "results"
    results.mkdir(exist_ok=True)
    (results / "constrained.json").write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
