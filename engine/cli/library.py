"""``hearth-cli model ls | add | rm | use | context | folder``: the model library (engine/library.py).

``--json`` output is a stable contract (README, "The model library"). Errors are one line and exit 1
(engine/cli.py's main); a malformed argument is a usage error (exit 2).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from engine.api import DEFAULT_PRECISION, MAX_CONTEXT_LENGTH, PRECISIONS, ModelLibrary, remote_models, size_words
from engine.cli.common import Progress, data_paths, emit
from engine.types import LibraryModel, ModelOrigin, ModelStatus

MIN_CONTEXT_ARG = 16
REMOTE_LIST_TIMEOUT_S = 5.0  # a dead server costs this once (servers are asked in parallel), never a hang


def add_commands(msub, common: argparse.ArgumentParser) -> None:
    """The library's actions, under ``hearth-cli model``."""
    def weights_option(p: argparse.ArgumentParser) -> None:
        p.add_argument("--weights", choices=list(PRECISIONS), default=DEFAULT_PRECISION,
                       help="the precision memory figures are for (default: %(default)s)")

    ls = msub.add_parser("ls", parents=[common], help="every model: the catalog's, added files, the models folder's")
    weights_option(ls)
    ls.set_defaults(func=cmd_ls)
    add = msub.add_parser("add", parents=[common], help="add a GGUF file (linked where it is unless --copy)")
    add.add_argument("path", metavar="PATH")
    add.add_argument("--copy", action="store_true", help="copy it into Hearth's models dir instead of linking it")
    weights_option(add)
    add.set_defaults(func=cmd_add)
    rm = msub.add_parser("rm", parents=[common], help="remove a model (an added file is only forgotten, never deleted)")
    rm.add_argument("name", metavar="NAME")
    rm.set_defaults(func=cmd_rm)
    use = msub.add_parser("use", parents=[common], help="load this model when none is named (window, generate, chat)")
    use.add_argument("name", metavar="NAME")
    weights_option(use)
    use.set_defaults(func=cmd_use)
    context = msub.add_parser("context", parents=[common], help="the context length a model loads with")
    context.add_argument("name", metavar="NAME")
    context.add_argument("tokens", type=context_tokens, metavar="TOKENS|auto",
                         help="a number of tokens, or auto: the model's own, shortened to fit free memory")
    weights_option(context)
    context.set_defaults(func=cmd_context)
    folder = msub.add_parser("folder", parents=[common], help="show, set or clear the models folder (its .gguf files are listed)")
    which = folder.add_mutually_exclusive_group()
    which.add_argument("path", nargs="?", metavar="PATH")
    which.add_argument("--clear", action="store_true", help="stop listing a models folder")
    folder.set_defaults(func=cmd_folder)


def context_tokens(text: str) -> int | None:
    """argparse type of ``model context``'s TOKENS: a whole number of at least 16, or ``auto`` (None)."""
    if text.strip().lower() == "auto":
        return None
    try:
        tokens = int(text.replace(",", "").replace("_", ""))
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number of tokens or 'auto', got {text!r}") from None
    if tokens < MIN_CONTEXT_ARG:
        raise argparse.ArgumentTypeError(f"must be at least {MIN_CONTEXT_ARG} tokens, got {tokens}")
    return tokens


def context_limit(text: str) -> int:
    """argparse type of ``generate`` and ``chat``'s ``--context``: a whole number of tokens from 16 to the
    longest context any file may declare (engine/arch/hparams.py), else exit 2 before a model loads."""
    tokens = context_tokens(text)
    if tokens is None:
        raise argparse.ArgumentTypeError("must be a number of tokens (leave the option out for the automatic context)")
    if tokens > MAX_CONTEXT_LENGTH:
        raise argparse.ArgumentTypeError(f"must be at most {MAX_CONTEXT_LENGTH:,} tokens, got {tokens:,}")
    return tokens


def _library(args: argparse.Namespace) -> ModelLibrary:
    return ModelLibrary(data_paths(args), weights=getattr(args, "weights", DEFAULT_PRECISION))


# commands ---------------------------------------------------------------------------------------------------
def cmd_ls(args: argparse.Namespace) -> int:
    library = _library(args)
    models = library.models()
    remote, unreachable = [], []
    for server, listed in remote_models(library.paths, REMOTE_LIST_TIMEOUT_S):
        if isinstance(listed, str):
            unreachable.append({"server": server.name, "url": server.base_url, "problem": listed})
        else:
            remote += listed
    folder, problem = library.folder, library.folder_problem()
    payload = {"models": [m.as_dict() for m in models + remote], "default": library.default_name(),
               "folder": None if folder is None else str(folder), "folder_problem": problem, "weights": library.weights,
               "remote_problems": unreachable}
    lines = model_table(models + remote)
    lines.append(f"* loads by default; memory for {library.weights} weights at the context shown")
    if folder is not None:
        lines.append(f"models folder: {folder}" + (f" — {problem}" if problem else ""))
    lines += [f"remote server {u['server']} ({u['url']}): {u['problem']}" for u in unreachable]
    emit(args, payload, "\n".join(lines))
    return 0


def cmd_add(args: argparse.Namespace) -> int:
    library = _library(args)
    meter = Progress(f"copying {Path(args.path).name}", "bytes") if args.copy else None
    model = library.add(args.path, copy=args.copy, progress=meter)
    where = "copied to" if args.copy else "linked at"
    emit(args, model.as_dict(), f"added {model.name} ({where} {model.path}): {model.status}"
         + (f" — {model.problem}" if model.problem else ""))
    return 0


def cmd_rm(args: argparse.Namespace) -> int:
    library = _library(args)
    model = library.get(args.name)
    library.remove(args.name)
    done = {"catalog": "deleted its download and conversions", "added": "forgotten",
            "hub": "deleted its download"}[str(model.source)]
    emit(args, {"removed": args.name, "source": str(model.source)}, f"removed {args.name} ({done})")
    return 0


def cmd_use(args: argparse.Namespace) -> int:
    model = _library(args).use(args.name)
    note = "" if model.status == ModelStatus.READY else f" (not downloaded yet: run 'hearth-cli model fetch {model.name}')"
    emit(args, model.as_dict(), f"{model.name} loads by default{note}")
    return 0


def cmd_context(args: argparse.Namespace) -> int:
    model = _library(args).set_context(args.name, args.tokens)
    how = "automatic" if model.context_setting is None else "set"
    emit(args, model.as_dict(), f"{model.name}: {model.chosen_context:,} tokens of context ({how}); about "
                                f"{size_words(model.ram_bytes)} of memory in all")
    return 0


def cmd_folder(args: argparse.Namespace) -> int:
    library = _library(args)
    if args.clear:
        library.set_folder(None)
    elif args.path is not None:
        library.set_folder(args.path)
    folder = library.folder
    emit(args, {"folder": None if folder is None else str(folder), "folder_problem": library.folder_problem()},
         f"models folder: {folder}" if folder is not None else "no models folder")
    return 0


# the table --------------------------------------------------------------------------------------------------
COLUMNS = ("", "NAME", "STATUS", "ARCH", "PARAMS", "QUANT", "SIZE", "CONTEXT", "CONVERTED", "RAM")


def model_table(models: list[LibraryModel]) -> list[str]:
    """``model ls``'s table: one row per model, its problem in words on the line below."""
    rows = [COLUMNS] + [row(m) for m in models]
    widths = [max(len(r[i]) for r in rows) for i in range(len(COLUMNS))]
    lines = []
    for r, model in zip(rows, [None, *models], strict=True):
        lines.append("  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip())
        if model is not None and model.problem:
            lines.append(f"    {model.problem}")
    return lines


def row(m: LibraryModel) -> tuple[str, ...]:
    if m.source == ModelOrigin.REMOTE:  # what a server tells: its id, at most a context length
        return ("", m.name, "remote", "-", "-", "-", "-", f"{m.context_length:,}" if m.context_length else "?", "-", "-")
    known = m.status in (ModelStatus.READY, ModelStatus.NOT_DOWNLOADED)
    return ("*" if m.is_default else "", m.name, str(m.status), m.architecture or "?", m.parameters or "?",
            m.quant or "?", size_words(m.file_bytes) if m.file_bytes else "?",
            f"{m.chosen_context:,}" if known and m.chosen_context else "?",
            "yes" if m.converted else "no", size_words(m.ram_bytes) if known and m.ram_bytes else "?")
