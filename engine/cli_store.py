"""``hearth-cli chat`` and ``hearth-cli kv``: stored conversations and their checkpoints, headless.

``chat`` appends a message to a stored conversation (creating it), resumes it from its checkpoint,
replies, saves the reply and the new rows. ``kv`` lists, inspects, verifies and garbage-collects the
checkpoint store. Output contracts for ``--json`` are in the README.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from engine.checkpoint.format import ENCODINGS, CheckpointError
from engine.checkpoint.reader import CheckpointReader
from engine.checkpoint.status import checkpoint_status
from engine.checkpoint.store import CheckpointStore
from engine.cli import Progress, _emit, _paths, sampling_from_args
from engine.conversations import ConversationStore, check_id
from engine.errors import HearthError, PromptError


def open_stores(args: argparse.Namespace) -> tuple[ConversationStore, CheckpointStore]:
    paths = _paths(args)
    return ConversationStore(paths.conversations_db), CheckpointStore(paths.checkpoints)


def cmd_chat(args: argparse.Namespace) -> int:
    from engine.loader import load_engine
    from engine.session import ChatSessions

    check_id(args.conversation)
    if not args.message.strip():
        raise PromptError("--message is empty: write something to say")
    params = sampling_from_args(args)
    if args.max_new_tokens < 1:
        raise PromptError("--max-new-tokens must be at least 1")
    convs, store = open_stores(args)
    conv = convs.get(args.conversation) or convs.create(args.conversation, system_prompt=args.system or "")
    if args.system is not None and args.system != conv.system_prompt:
        convs.set_system_prompt(conv.id, args.system)
    convs.append(conv.id, "user", args.message)  # the text is safe before any model work starts
    engine, converted, load_ms = load_engine(_paths(args), model=args.model, weights=args.weights,
                                             provider=args.provider, convert_progress=Progress("converting"))
    sessions = ChatSessions(engine, store)
    stream = None if args.json else (lambda s: (sys.stdout.write(s), sys.stdout.flush()))
    turn = sessions.generate(conv.id, convs.chat_messages(conv.id), params, args.max_new_tokens, on_text=stream)
    result = turn.generation
    if result.text or result.tokens:
        convs.append(conv.id, "assistant", result.text)
        convs.set_model(conv.id, f"{converted.gguf_path.stem} {converted.precision}")
    resume = turn.resume
    payload = {
        "conversation": conv.id,
        "reply": result.text,
        "tokens": result.tokens,
        "stop_reason": result.stop_reason,
        "resume": {k: resume.as_dict()[k] for k in ("source", "reason", "reused_tokens", "prefilled_tokens",
                                                    "elapsed_ms", "restored_tokens", "restore_estimate_ms",
                                                    "prefill_estimate_ms", "message")},
        "save": turn.save.as_dict() if turn.save else None,
        "context": {"tokens": len(engine.tokens), "limit": engine.context_length},
        "provider": engine.provider,
        "weights": converted.precision,
        "timings": {**result.timings.as_dict(), "load_ms": round(load_ms, 3)},
    }
    if args.json:
        _emit(args, payload, "")
    else:
        print()
        how = resume.source + (f" ({resume.plain})" if resume.reason else "")
        sys.stderr.write(f"[{resume.reused_tokens} tokens reused ({how}), {resume.prefilled_tokens} prefilled "
                         f"in {resume.elapsed_ms:.0f} ms; {len(result.tokens)} new tokens, {result.stop_reason}]\n")
        if turn.save and not turn.save.ok:
            sys.stderr.write(f"warning: {turn.save.error}\n")
    return 0


# kv ------------------------------------------------------------------------------------------------
def cmd_kv_ls(args: argparse.Namespace) -> int:
    _, store = open_stores(args)
    entries = [{"name": e.name, "path": str(store.path(e.name)), "conversation": e.conversation, "kind": e.kind,
                "tokens": e.tokens, "bytes": e.bytes, "hits": e.hits, "created_ms": e.created_ms,
                "last_used_ms": e.last_used_ms, "pinned": e.pinned} for e in store.entries()]
    payload = {"store": str(store.root), "bytes": store.total_bytes(), "budget": store.budget_bytes, "entries": entries}
    lines = [f"{e['name']}  {e['kind']:<12} {e['tokens']:>7} tok {e['bytes'] / 2**20:>8.1f} MiB  "
             f"{e['conversation'] or ''}" for e in entries]
    lines.append(f"{len(entries)} checkpoint(s), {payload['bytes'] / 2**20:.1f} MiB of {store.budget_bytes / 2**20:.0f} MiB")
    _emit(args, payload, "\n".join(lines))
    return 0


def describe(path: Path) -> dict:
    """Header and record headers of a checkpoint, as far as they can be read (no model needed)."""
    out: dict = {"path": str(path)}
    try:
        with CheckpointReader(path) as reader:
            h = reader.read_header()
            out["size"] = reader.size
            out["header"] = {"version": h.version, "layout": h.layout, "encoding": h.encoding, "dtype": h.shape.dtype,
                             "layers": h.shape.n_layers, "kv_heads": h.shape.n_kv_heads, "head_dim": h.shape.head_dim,
                             "context_length": h.shape.context_length, "model": h.label,
                             "model_fingerprint": h.model_fp.hex(), "tokenizer_fingerprint": h.tokenizer_fp.hex(),
                             "file_id": h.file_id.hex(), "created_ms": h.created_ms, "last_used_ms": h.last_used_ms,
                             "hits": h.hits, "bytes_per_token": h.bytes_per_token,
                             "exact_bytes_per_token": h.shape.bytes_per_token}
            records, problem = reader.scan()
            out["records"] = [{"seq": r.seq, "start": r.start, "end": r.end, "text_len": r.text_len,
                               "text_sha256": r.text_sha.hex(), "saved_ms": r.saved_ms, "reason": r.reason,
                               "payload_bytes": r.payload_bytes} for r in records]
            out["tokens"] = records[-1].end if records else 0
    except CheckpointError as exc:
        problem = exc
    out["problem"] = None if problem is None else {"reason": problem.reason, "message": str(problem)}
    return out


def cmd_kv_inspect(args: argparse.Namespace) -> int:
    path = Path(args.path)
    if not path.exists():
        raise HearthError(f"no such file: {path}")
    info = describe(path)
    if args.json:
        _emit(args, info, "")
    else:
        h = info.get("header", {})
        lines = [str(path)]
        if h:
            lines.append(f"  model {h['model']}  {h['layers']} layers × {h['kv_heads']} KV heads × {h['head_dim']} "
                         f"({h['dtype']}), {h['bytes_per_token']} bytes/token")
            how = ("int8 codes, a float16 scale per row" if h["encoding"] == "int8" else f"exact {h['dtype']} rows")
            lines.append(f"  encoding {h['encoding']} (layout {h['layout']}: {how})")
        lines += [f"  record {r['seq']}: tokens {r['start']}–{r['end']} ({r['reason']}), text {r['text_len']} bytes"
                  for r in info.get("records", [])]
        if info["problem"]:
            lines.append(f"  problem: {info['problem']['reason']}: {info['problem']['message']}")
        _emit(args, info, "\n".join(lines))
    return 0


def verify_file(path: Path, identity, vocab_size: int | None) -> dict:
    """Full verification: header, identity (when a model is known), every record's tokens and rows."""
    status, problem, tokens = checkpoint_status(path, identity, vocab_size, full=True)
    return {"path": str(path), "status": status, "reason": problem.reason if problem else None,
            "message": str(problem) if problem else "", "tokens": tokens}


def cmd_kv_verify(args: argparse.Namespace) -> int:
    from engine.checkpoint.identity import gguf_identity
    from engine.loader import resolve_gguf

    _, store = open_stores(args)
    if args.all:
        files = [store.path(e.name) for e in store.entries()]
    elif args.paths:
        files = [Path(p) for p in args.paths]
    else:
        raise PromptError("name checkpoint files to verify, or use --all")
    identity, vocab = None, None
    try:
        identity, vocab = gguf_identity(resolve_gguf(_paths(args), args.model), args.weights)
    except HearthError as exc:  # no model installed: check structure and checksums only
        sys.stderr.write(f"note: {exc}; checking structure and checksums only\n")
    results = [verify_file(p, identity, vocab) for p in files]
    damaged = [r for r in results if r["status"] == "damaged"]
    payload = {"checked": len(results), "damaged": len(damaged),
               "stale": sum(r["status"] == "stale" for r in results), "files": results}
    lines = [f"{r['status']:<8} {r['path']}" + (f"  ({r['reason']}: {r['message']})" if r["reason"] else "")
             for r in results]
    lines.append(f"{len(results)} checked, {len(damaged)} damaged, {payload['stale']} stale")
    _emit(args, payload, "\n".join(lines))
    return 1 if damaged else 0


def cmd_kv_encoding(args: argparse.Namespace) -> int:
    """Show, or set and remember, the encoding new checkpoint files get (existing files keep theirs)."""
    _, store = open_stores(args)
    if args.name is not None:
        if args.name not in ENCODINGS:
            raise PromptError(f"unknown KV encoding {args.name!r}; choose one of: {', '.join(ENCODINGS)}")
        store.set_kv_encoding(args.name)
    note = "new checkpoints are stored as " + store.kv_encoding + (
        " (lossless)" if store.kv_encoding == "exact" else " (about a quarter of float32's bytes; see "
        "docs/checkpoint-format.md §4b for its accuracy)")
    _emit(args, {"store": str(store.root), "kv_encoding": store.kv_encoding, "choices": list(ENCODINGS)}, note)
    return 0


def cmd_kv_gc(args: argparse.Namespace) -> int:
    convs, store = open_stores(args)
    if args.budget_mb is not None:
        if args.budget_mb <= 0:
            raise PromptError("--budget-mb must be positive")
        store.set_budget(args.budget_mb << 20)
    report = store.gc(live_conversations=convs.ids())
    _emit(args, report, f"removed {report['temp_files']} temp file(s), {len(report['orphans'])} orphan(s), "
                        f"evicted {len(report['evicted'])}; {report['bytes'] / 2**20:.1f} MiB of "
                        f"{report['budget'] / 2**20:.0f} MiB used")
    return 0
