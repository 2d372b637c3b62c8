"""``hearth-cli bundle export`` and ``bundle import``: ``.hearth`` bundles without the window.

Export writes conversations with their saved context, signed with this installation's key. Import
adds the conversations (all or nothing) and reports, per conversation, whether its saved context was
used or will be rebuilt, and why. Contexts from another installation are rebuilt unless
``--trust-contexts``. Output contracts for ``--json`` are in the README.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from engine.api import Hearth, bundles, check_id, to_document
from engine.cli.common import data_paths, emit
from engine.errors import PromptError, TransferError
from engine.types import BundleImported


def cmd_bundle_export(args: argparse.Namespace) -> int:
    ids = list(dict.fromkeys(args.ids))  # a repeated id is exported once
    for cid in ids:
        check_id(cid)
    if not args.out:
        raise PromptError("--out FILE.hearth is required")
    hearth = Hearth(data_paths(args))
    try:
        for cid in ids:
            hearth.conversations.require(cid)
        out = Path(args.out)
        try:
            result = bundles(hearth).export_bundle(out, to_document(hearth.conversations, ids), ids)
        except OSError as exc:
            raise TransferError(f"cannot write {out}: {exc.strerror or exc}") from None
    finally:
        hearth.close()
    emit(args, {"path": str(out), "conversations": result.conversations, "contexts": result.contexts},
         f"exported {result.conversations} conversation(s) with {result.contexts} saved context(s) to {out}")
    return 0


def conversation_rows(hearth: Hearth, result: BundleImported) -> list[dict]:
    """One row per imported conversation: its ids, title and what became of its saved context."""
    rows = []
    for new, original in result.conversations.items():
        conv = hearth.conversations.get(new)
        if new in result.used:
            context = "used"
        elif new in result.rebuilt:
            context = "rebuilt"
        else:
            context = "none"
        rows.append({"id": new, "original_id": original or None, "title": conv.title if conv else "",
                     "context": context, "reason": result.rebuilt.get(new), "message": result.notes.get(new, "")})
    return rows


def cmd_bundle_import(args: argparse.Namespace) -> int:
    hearth = Hearth(data_paths(args), model=args.model, weights=args.weights)
    try:
        result = bundles(hearth).import_bundle(Path(args.path), trust=args.trust_contexts, duplicates=args.duplicates)
        rows = conversation_rows(hearth, result)
    finally:
        hearth.close()
    payload = {"path": args.path, "imported": len(rows), "trusted": result.trusted, "contexts_used": len(result.used),
               "contexts_rebuilt": len(result.rebuilt), "skipped": result.skipped, "copied": result.copied,
               "conversations": rows}
    lines = [f"{r['id']:<34} context {r['context']:<8} {r['title'] or '(untitled)'}"
             + (f"\n{'':<34} {r['message']}" if r["context"] == "rebuilt" else "") for r in rows]
    lines.append(f"imported {len(rows)} conversation(s); saved context used for {len(result.used)}, "
                 f"{len(result.rebuilt)} will be rebuilt when opened" + duplicates_note(result))
    emit(args, payload, "\n".join(lines))
    return 0


def duplicates_note(result: BundleImported) -> str:
    """What the import did with chats already here, worded as ``conversations import`` words it."""
    if result.skipped:
        return f"; skipped {result.skipped} already here (--duplicates copy imports them as copies)"
    if result.copied:
        return f"; {result.copied} of them as copies of conversations already here"
    return ""


def add_parser(sub, common: argparse.ArgumentParser, model_options) -> None:
    """``bundle export`` and ``bundle import`` under ``sub`` (cli.build_parser's subcommands)."""
    bundle = sub.add_parser("bundle", parents=[common], help="export or import conversations with their saved context")
    bsub = bundle.add_subparsers(dest="bundle_command", required=True, metavar="ACTION")
    export = bsub.add_parser("export", parents=[common], help="write conversations and their saved context to a file")
    export.add_argument("ids", nargs="+", metavar="ID")
    export.add_argument("--out", required=True, metavar="FILE.hearth")
    export.set_defaults(func=cmd_bundle_export)
    imp = bsub.add_parser("import", parents=[common], help="add a bundle's conversations; use its contexts if trusted")
    imp.add_argument("path", metavar="FILE.hearth")
    imp.add_argument("--trust-contexts", action="store_true",
                     help="use saved contexts another installation made (they decide what the model remembers)")
    imp.add_argument("--duplicates", choices=["skip", "copy"], default="skip",
                     help='conversations already here (same id or same content): skip them (default), or import '
                          'them as copies titled "<title> (imported)"')
    model_options(imp)
    imp.set_defaults(func=cmd_bundle_import)
