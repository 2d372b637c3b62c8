"""``hearth-cli model search | files``, ``model fetch hf:OWNER/REPO/FILE.gguf`` and ``hearth-cli hub login |
logout | status``: GGUFs from the Hugging Face Hub (engine/hub.py). The hub is HF_ENDPOINT (default
huggingface.co). ``--json`` output is a stable contract; a token is never printed.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from engine.api import HubClient, HubFile, HubProgress, parse_hub_ref, read_secret_file, size_words, terminal_safe
from engine.cli.common import data_paths, emit
from engine.errors import HearthError

EXIT_INTERRUPTED = 130
MAX_LIMIT = 100


def add_model_commands(msub, common: argparse.ArgumentParser) -> None:
    """``model search`` and ``model files`` (``model fetch hf:...`` is main.py's fetch, handed here)."""
    search = msub.add_parser("search", parents=[common], help="search the Hugging Face Hub for GGUF repositories")
    search.add_argument("query", metavar="QUERY")
    search.add_argument("--limit", type=_limit, default=20, help="at most this many (1-100, default: %(default)s)")
    search.set_defaults(func=cmd_search)
    files = msub.add_parser("files", parents=[common], help="a hub repository's GGUF files: quant, size, memory")
    files.add_argument("repo", metavar="OWNER/REPO")
    files.set_defaults(func=cmd_files)


def add_hub_commands(sub, common: argparse.ArgumentParser) -> None:
    hub = sub.add_parser("hub", parents=[common], help="the Hugging Face token for gated repositories")
    hsub = hub.add_subparsers(dest="hub_command", required=True, metavar="ACTION")
    login = hsub.add_parser("login", parents=[common], help="keep a Hugging Face token (read from a file)")
    login.add_argument("--token-file", required=True, metavar="F", help="a file holding the token (never an argument: "
                       "arguments show in the process list)")
    login.set_defaults(func=cmd_login)
    logout = hsub.add_parser("logout", parents=[common], help="forget the Hugging Face token")
    logout.set_defaults(func=cmd_logout)
    status = hsub.add_parser("status", parents=[common], help="the hub's address and whether a token is kept")
    status.set_defaults(func=cmd_status)


def _limit(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number, got {text!r}") from None
    if not 1 <= n <= MAX_LIMIT:
        raise argparse.ArgumentTypeError(f"must be from 1 to {MAX_LIMIT}, got {n}")
    return n


def _client(args: argparse.Namespace) -> HubClient:
    return HubClient(data_paths(args))


# commands ---------------------------------------------------------------------------------------------------
def cmd_search(args: argparse.Namespace) -> int:
    repos = _client(args).search(args.query, args.limit)
    payload = {"query": args.query, "repos": [{"repo": r.id, "downloads": r.downloads, "likes": r.likes,
                                               "gated": r.gated, "last_modified": r.last_modified} for r in repos]}
    rows = [("REPO", "DOWNLOADS", "LIKES", "GATED")]
    rows += [(r.id, f"{r.downloads:,}", f"{r.likes:,}", "yes" if r.gated else "") for r in repos]
    lines = _table(rows) if repos else [f"no GGUF repositories match {args.query!r}"]
    emit(args, payload, "\n".join(lines))
    return 0


def cmd_files(args: argparse.Namespace) -> int:
    files = _client(args).files(args.repo)
    payload = {"repo": args.repo, "files": [file_dict(f) for f in files]}
    rows = [("FILE", "QUANT", "SIZE", "RAM", "PARTS")]
    rows += [(f.filename, f.quant or "?", size_words(f.size), size_words(f.memory_bytes), str(len(f.parts)))
             for f in files]
    lines = _table(rows) if files else [f"{args.repo} has no GGUF files"]
    if files:
        lines.append(f"fetch one with 'hearth-cli model fetch hf:{args.repo}/FILE'")
    emit(args, payload, "\n".join(lines))
    return 0


def file_dict(f: HubFile) -> dict:
    return {"repo": f.repo, "file": f.filename, "quant": f.quant, "size": f.size, "sha256": f.sha256,
            "memory_bytes": f.memory_bytes, "parts": list(f.parts)}


def cmd_fetch(args: argparse.Namespace) -> int:
    """``model fetch hf:OWNER/REPO/FILE.gguf``: download, verify, add to the library; Ctrl-C keeps the part."""
    if getattr(args, "wheel", None) or getattr(args, "wheel_dir", None):
        raise HearthError("--wheel and --wheel-dir are for catalog models, not hub files")
    repo, filename = parse_hub_ref(args.name)
    client = _client(args)
    file = client.file(repo, filename)
    meter = HubMeter()
    try:
        model = client.install(file, meter)
    except KeyboardInterrupt:
        meter.end()
        sys.stderr.write("hearth-cli: the download was stopped; what was downloaded is kept: run the same command "
                         "again to resume\n")
        return EXIT_INTERRUPTED
    meter.end()
    emit(args, {"model": model.name, "path": model.path, "repo": repo, **file_dict(file)},
         f"{model.name}: {model.path}\nuse it with --model {model.name} (or 'hearth-cli model use {model.name}')")
    return 0


def cmd_login(args: argparse.Namespace) -> int:
    client = _client(args)
    client.set_token(read_secret_file(Path(args.token_file), "the Hugging Face token"))
    emit(args, {"token": True, "where": client.secrets.where}, f"the Hugging Face token is kept in {client.secrets.where}")
    return 0


def cmd_logout(args: argparse.Namespace) -> int:
    client = _client(args)
    had = client.has_token()
    client.clear_token()
    emit(args, {"token": False, "removed": had}, "the Hugging Face token was removed" if had else "no Hugging Face token was kept")
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    client = _client(args)
    has = client.has_token()
    emit(args, {"endpoint": client.endpoint, "token": has, "where": client.secrets.where if has else None},
         f"hub: {client.endpoint}\ntoken: " + (f"kept in {client.secrets.where}" if has else "none (public repositories only)"))
    return 0


# output -----------------------------------------------------------------------------------------------------
def _table(rows: list[tuple[str, ...]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]


class HubMeter:
    """A download's progress on stderr: one line rewritten on a terminal, each part's end otherwise."""

    def __init__(self) -> None:
        self.tty = sys.stderr.isatty()
        self._shown = 0.0
        self._part = 0
        self._width = 0

    def __call__(self, p: HubProgress) -> None:
        name = terminal_safe(p.filename)
        part = f" (part {p.part} of {p.parts})" if p.parts > 1 else ""
        if not self.tty:
            if p.part != self._part:
                self._part = p.part
                sys.stderr.write(f"downloading {name}{part}\n")
            return
        now = time.monotonic()
        if now - self._shown < 0.2 and p.done_bytes < p.total_bytes:
            return
        self._shown = now
        pct = int(p.done_bytes * 100 / p.total_bytes) if p.total_bytes else 0
        line = (f"downloading {name}{part}: {pct}% ({size_words(p.done_bytes)} of {size_words(p.total_bytes)}, "
                f"{size_words(int(p.bytes_per_s))}/s)")
        sys.stderr.write("\r" + line.ljust(self._width))
        self._width = max(self._width, len(line))
        sys.stderr.flush()

    def end(self) -> None:
        if self.tty and self._width:
            sys.stderr.write("\n")
            self._width = 0
