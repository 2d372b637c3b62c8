"""Model switch benchmark (not a test): moving a chat from one model to another, each model keeping its
own saved context of the chat on disk.

    python bench/model_switch.py [--data-dir DIR] [--models smollm2-135m-instruct,gemma-3-270m]
                                 [--sizes 2000,7600] [--repeat 1] [--provider cpu] [--quick]

The models come from DIR's models/ and converted/ (default: $HEARTH_TEST_CACHE/home when that exists,
else the user's data dir); the conversation and its saved contexts go to a temporary data dir that
links to them. For each size a chat of about that many tokens (fixed text, counted with the first
model's tokenizer and template) is stored, and both models answer it once, so each has its context on
disk. Then, in each direction (A→B and B→A), with one new message:

  switch  Hearth.switch_model (the old model's context saved, the old model dropped, the new one
          loaded) and the turn up to its first token: the new model restores its own context from disk
          and reads only what it has not seen (the other model's reply and the new message);
  cold    the same with the new model's saved context deleted first: it reads the whole chat again.

Both are timed wall-clock in one process (best of --repeat), the page cache warm (the files were just
written). --quick: one small chat (256 tokens), to check the benchmark runs. Prints a table and writes
bench/results/model_switch.json (model_switch-quick.json with --quick).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from resume import paragraph  # noqa: E402  (bench/ is on the path: the same fixed text as resume.py)

GREEDY = None  # set in main (imports the engine only once the path is set)
SYSTEM = "You are a helpful assistant who answers in detail."


def source_dir(data_dir: str | None) -> Path:
    if data_dir:
        return Path(data_dir)
    cache = os.environ.get("HEARTH_TEST_CACHE")
    if cache and (Path(cache) / "home" / "models").is_dir():
        return Path(cache) / "home"
    from engine.paths import resolve_paths

    return resolve_paths(None).data


def linked_home(source: Path, tmp: Path) -> Path:
    """A fresh data dir sharing the source's models and conversions (symlinks, no copies)."""
    from engine.paths import resolve_paths

    src = resolve_paths(str(source))
    home = tmp / "home"
    (home / "converted").mkdir(parents=True)
    (home / "models").symlink_to(src.models.resolve())
    if src.converted.is_dir():
        for folder in src.converted.iterdir():
            (home / "converted" / folder.name).symlink_to(folder.resolve())
    return home


def chat_of(paths, model: str, target: int) -> list[dict]:
    """System prompt and alternating user/assistant paragraphs until the rendered chat, with the next
    user message to come, reaches ``target`` tokens of ``model``."""
    from engine.generation import Engine
    from engine.loader import resolve_gguf
    from engine.model.gguf_file import GGUFModel
    from engine.text.tokenizer import Tokenizer

    gguf = GGUFModel(resolve_gguf(paths, model))
    tokenizer = Tokenizer.from_gguf(gguf)
    template = Engine.template_for(gguf, tokenizer)
    msgs = [{"role": "system", "content": SYSTEM}]
    turn = 0
    while True:
        msgs.append({"role": "user" if turn % 2 == 0 else "assistant", "content": paragraph(turn, 60)})
        turn += 1
        if turn % 2 == 0 and len(tokenizer.encode(template.render(msgs, add_generation_prompt=False))) >= target:
            return msgs


def store_chat(hearth, cid: str, msgs: list[dict]) -> None:
    convs = hearth.conversations
    convs.ensure(cid, msgs[0]["content"])
    for m in msgs[1:]:
        convs.append(cid, m["role"], m["content"])


def timed_turn(hearth, cid: str, text: str) -> tuple[float, object]:
    """(ms from now to the first token, the finished turn)."""
    from engine.types import Token, TurnRequest

    started = time.perf_counter()
    first: list[float] = []

    def on_event(event) -> None:
        if isinstance(event, Token) and not first:
            first.append(time.perf_counter())

    finished = hearth.run_turn(TurnRequest(cid, text, GREEDY, 1), on_event)
    return ((first[0] if first else time.perf_counter()) - started) * 1000, finished


def drop_context_of(hearth, cid: str, label: str) -> int:
    """Delete one model's saved context of the chat and its shared prefixes (the other model's stay)."""
    store = hearth.checkpoints
    names = [e.name for e in store.conversation_entries(cid) + store.entries(kind="prefix") if e.label == label]
    for name in names:
        store.remove(name, "benchmark: measure a cold switch")
    return len(names)


def switch_and_answer(hearth, model: str, cid: str, text: str) -> dict:
    started = time.perf_counter()
    info = hearth.switch_model(model)
    switch_ms = (time.perf_counter() - started) * 1000
    ttft_ms, turn = timed_turn(hearth, cid, text)
    r = turn.local.resume
    assert r.reason is None, r
    return {"model": info.label, "switch_ms": switch_ms, "load_ms": info.load_ms, "turn_ttft_ms": ttft_ms,
            "ttft_after_switch_ms": switch_ms + ttft_ms, "source": str(r.source), "prompt_tokens": turn.prompt_tokens,
            "restored_tokens": r.restored_tokens, "prefilled_tokens": r.prefilled_tokens, "restore_ms": r.restore_ms}


def best(runs: list[dict]) -> dict:
    return min(runs, key=lambda x: x["ttft_after_switch_ms"])


def measure(hearth, models: tuple[str, str], size: int, repeat: int) -> list[dict]:
    a, b = models
    cid = f"chat-{size}"
    hearth.switch_model(a)
    store_chat(hearth, cid, chat_of(hearth.paths, a, size))
    timed_turn(hearth, cid, "Summarize all of that in one line.")  # both models read the chat once and save it
    hearth.switch_model(b)
    timed_turn(hearth, cid, "And in another line?")
    rows = []
    for src, dst in ((b, a), (a, b)):  # b is loaded now
        disk, cold = [], []
        for i in range(repeat):
            hearth.switch_model(src)
            disk.append(switch_and_answer(hearth, dst, cid, f"Question {i} for the other model, please."))
            hearth.switch_model(src)
            drop_context_of(hearth, cid, disk[-1]["model"])
            cold.append(switch_and_answer(hearth, dst, cid, f"Question {i}, asked again from scratch."))
        d, c = best(disk), best(cold)
        assert d["source"] == "disk" and c["source"] in ("cold", "disk"), (d, c)  # cold: at most a shared prefix
        rows.append({"target_tokens": size, "from": src, "to": dst, "switch": d, "cold": c,
                     "speedup": c["ttft_after_switch_ms"] / d["ttft_after_switch_ms"]})
        print(f"measured {size} tokens, {src} → {dst}", file=sys.stderr)
    return rows


def main() -> None:
    global GREEDY
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data-dir", help="where the models and their conversions are (see above)")
    ap.add_argument("--models", default="smollm2-135m-instruct,gemma-3-270m", help="two catalog names or GGUF paths")
    ap.add_argument("--sizes", default="2000,7600", help="chat sizes in tokens of the first model (≤ both contexts)")
    ap.add_argument("--repeat", type=int, default=1, help="measure each switch this many times, keep the best")
    ap.add_argument("--weights", default="int4")
    ap.add_argument("--provider", default="cpu")
    ap.add_argument("--quick", action="store_true", help="one 256-token chat, once: checks that the benchmark runs")
    ap.add_argument("--out", help="the JSON file (default: bench/results/model_switch[-quick].json)")
    args = ap.parse_args()

    from engine.api import Hearth, resolve_paths
    from engine.types import SamplingParams

    GREEDY = SamplingParams.greedy_params()
    models = tuple(args.models.split(","))
    if len(models) != 2 or models[0] == models[1]:
        ap.error("--models takes two different models")
    sizes = [256] if args.quick else [int(x) for x in args.sizes.split(",")]
    repeat = 1 if args.quick else args.repeat
    out = Path(args.out or ROOT / "bench" / "results" / f"model_switch{'-quick' if args.quick else ''}.json")
    rows = []
    with tempfile.TemporaryDirectory(prefix="hearth-switch-") as tmp:
        home = linked_home(source_dir(args.data_dir), Path(tmp))
        hearth = Hearth(resolve_paths(str(home)).ensure(), model=models[0], weights=args.weights, provider=args.provider)
        hearth.load()
        try:
            for size in sizes:
                rows += measure(hearth, models, size, repeat)
        finally:
            hearth.close()

    header = ("chat tokens", "switch", "load ms", "restored", "prefilled", "restore ms", "TTFT after switch ms",
              "cold prefilled", "cold TTFT ms", "ratio")
    print(" | ".join(header))
    for r in rows:
        d, c = r["switch"], r["cold"]
        print(" | ".join([
            f"{d['prompt_tokens']}", f"{r['from']} → {r['to']}", f"{d['load_ms']:.0f}", f"{d['restored_tokens']}",
            f"{d['prefilled_tokens']}", f"{d['restore_ms']:.1f}", f"{d['ttft_after_switch_ms']:.0f}",
            f"{c['prefilled_tokens']}", f"{c['ttft_after_switch_ms']:.0f}", f"{r['speedup']:.1f}×"]))
    result = {"machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "python": platform.python_version()},
              "weights": args.weights, "provider": args.provider, "models": list(models), "quick": args.quick, "rows": rows}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    print(f"wrote {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
