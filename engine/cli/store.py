"""``hearth-cli chat``, ``conversations`` and ``kv``: stored conversations and their checkpoints, headless.

``chat`` appends a message to a stored conversation (creating it), resumes it from its checkpoint,
replies, saves the reply and the new rows. It runs on ``--model`` when given, else on the model the
conversation was last used with (while that can still be found), else on the default model. ``kv``
lists, inspects, verifies and garbage-collects the checkpoint store. Output contracts for ``--json``
are in the README.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

from engine.api import (
    KV_ENCODINGS,
    MAX_ATTACHMENTS,
    Attachment,
    Backend,
    BlockStore,
    ConversationStore,
    DuplicatePolicy,
    Hearth,
    HearthPaths,
    ModelLibrary,
    RemoteRegistry,
    SoundDatabaseError,
    apply_duplicates,
    backup_database_file,
    check_database_file,
    check_id,
    checkpoint_store,
    database_file_problem,
    database_way_out,
    describe_checkpoint,
    find_duplicates,
    import_conversations,
    model_identity,
    model_key_for,
    open_conversations,
    read_attachment,
    read_document,
    reply_caption,
    resolve_model_file,
    resolve_paths,
    restore_database_file,
    salvage_database_file,
    terminal_safe,
    verify_checkpoint,
)
from engine.cli import tool_chat
from engine.cli.common import Progress, data_paths, emit, remote_backend, sampling_from_args, stream_text
from engine.errors import AttachmentError, ContextFullError, ConversationError, HearthError, PromptError
from engine.types import ContextPolicy, ConversationSummary, Finished, Token, TurnRequest, Waiting

log = logging.getLogger(__name__)


def open_stores(args: argparse.Namespace) -> tuple[ConversationStore, BlockStore]:
    """(The conversation store, the checkpoint store) of the data dir."""
    paths = data_paths(args)
    return open_conversations(paths, backup=True), checkpoint_store(paths)


def open_checkpoints(args: argparse.Namespace) -> BlockStore:
    """The checkpoint store alone: the kv commands keep working while the conversation database is damaged."""
    return checkpoint_store(data_paths(args))


def cmd_chat(args: argparse.Namespace) -> int:
    check_id(args.conversation)
    tool_chat.check_arguments(args)
    attachments = read_attachments(args.attach)  # every file read (or refused) before anything is stored
    if args.message is None and not args.tools:
        raise PromptError("--message is required (without it, only --tools resumes a chat's tool loop)")
    if args.message is None and attachments:
        raise PromptError("--attach goes with a --message")
    if args.message is not None and not args.message.strip() and not attachments:
        raise PromptError("--message is empty: write something to say")
    params = sampling_from_args(args)
    if args.max_new_tokens < 1:
        raise PromptError("--max-new-tokens must be at least 1")
    if not args.wait >= 0:  # also NaN
        raise PromptError(f"--wait must be 0 or more seconds, got {args.wait}")
    paths = data_paths(args)
    model, why = chat_model(paths, args.conversation, args.model)
    hearth = remote_backend(paths, model)  # NAME/MODEL of an added server (hearth-cli remote add)
    if hearth is None:
        hearth = Hearth(paths, model=model, weights=args.weights, provider=args.provider, turn_wait_s=args.wait,
                        context_length=args.context)
    try:
        return _chat(args, hearth, params, why, attachments)
    finally:
        hearth.close()


def read_attachments(files: list[str]) -> tuple[Attachment, ...]:
    """``--attach`` files read and bounded; the first that cannot be read raises its AttachmentError."""
    if len(files) > MAX_ATTACHMENTS:
        raise AttachmentError(f"a message can carry at most {MAX_ATTACHMENTS} files; --attach was given {len(files)}",
                              "too_many")
    return tuple(read_attachment(Path(f)) for f in files)


def chat_model(paths: HearthPaths, conversation: str, requested: str | None) -> tuple[str | None, str | None]:
    """(The model to answer with, and when it is not the one the conversation remembers, why): the
    requested one; else the remembered one while it still resolves (a catalog name, an existing path);
    else the default."""
    remembered = None
    if paths.conversations_db.exists():  # a new data dir remembers nothing; the turn creates the database
        probe = Hearth(paths)
        try:
            remembered = probe.conversation_model(conversation)
        except ConversationError as exc:  # the turn itself reports what is wrong with the database
            log.debug("cannot read the model %s was last used with: %s", conversation, exc)
        finally:
            probe.close()
    if remembered is None:
        return requested, None
    if requested is not None:
        return requested, None if model_key_for(requested) == remembered else f"last used with {remembered}"
    if RemoteRegistry(paths.data).find(remembered) is not None:  # an added server's model: reached when the turn loads it
        return remembered, None
    if remembered == ModelLibrary(paths).default_name():  # the default (the one 'hearth-cli model use' chose)
        return None, None  # the default model is found by its own rules (a packaged build ships it converted)
    try:
        resolve_model_file(paths, remembered)
    except HearthError as exc:
        return None, f"last used with {remembered}, which is not available ({exc})"
    return remembered, None


def _chat(args: argparse.Namespace, hearth: Backend, params, why: str | None = None,
          attachments: tuple[Attachment, ...] = ()) -> int:
    request = TurnRequest(args.conversation, args.message, params, args.max_new_tokens, args.system,
                          attachments=attachments)
    # No model, nothing stored: as the window gives a refused message back to the composer, the message
    # is still on the command line, and a stored one nothing answered would leave the chat ending in it.
    model = hearth.load(Progress("converting").setup)
    if why is not None:  # the answer comes from another model than last time: say which
        sys.stderr.write(terminal_safe(f"note: conversation {args.conversation} was {why}; {model.label} "
                                       f"({hearth.model_key}) answers this turn") + "\n")
    if args.tools:
        try:
            return tool_chat.run(args, hearth, request)
        except ContextFullError as exc:
            raise context_full(args.conversation, exc) from None
    stream = None if args.json else stream_text

    def on_event(event) -> None:
        if isinstance(event, Waiting):
            sys.stderr.write(f"waiting: conversation {event.conversation} is busy in another Hearth process…\n")
        elif isinstance(event, Token) and stream is not None and event.kind == "content":  # not the thinking
            stream(event.text)

    try:
        turn = hearth.run_turn(request, on_event, create=True)
    except ContextFullError as exc:
        raise context_full(args.conversation, exc) from None
    except ConversationError as exc:
        if args.json and exc.unstored_reply is not None:  # the reply is nowhere else now: a script still gets it
            emit(args, {"conversation": request.conversation, "reply": exc.unstored_reply, "stored": False,
                        "error": str(exc)}, "")
        raise  # the error line, and a non-zero exit
    local = turn.local  # None from a backend that keeps no context here: no resume, no save to report
    resume = local.resume.as_dict() if local is not None else None
    payload = {
        "conversation": turn.conversation,
        "reply": turn.reply,
        "reasoning": turn.reasoning,  # a model that thinks: its thinking ("" for one that does not)
        "stored": True,
        "tokens": list(turn.tokens),
        "stop_reason": str(turn.stop_reason),
        "resume": None if resume is None else {
            k: resume[k] for k in ("source", "reason", "reused_tokens", "prefilled_tokens", "elapsed_ms",
                                   "restored_tokens", "restore_estimate_ms", "prefill_estimate_ms", "message")},
        "save": local.save.as_dict() if local is not None and local.save else None,
        "context": {"tokens": turn.context_tokens, "limit": turn.context_limit},
        "provider": model.provider,
        "weights": model.weights,
        "timings": turn.timings.as_dict(),
        "model": model.label,
        "model_key": hearth.model_key,
        "server_cached_tokens": turn.server_cached_tokens,  # a remote server's prefix-cache hit; None: not told
        "attachments": [{"name": a.name, "kind": a.kind, "size": a.size, "sha256": a.sha256, "pages": a.pages,
                         "chars": len(a.text)} for a in attachments],
    }
    if args.json:
        emit(args, payload, "")
    else:
        print()
        sys.stderr.write(turn_line(turn) + "\n")
        save = local.save if local is not None else None
        if save and not save.ok:  # the reply is in the database whatever the saved context did
            stored = "the reply is stored; " if turn.reply_seq is not None else ""
            sys.stderr.write(f"warning: {stored}{terminal_safe(save.error)}\n")
    return 0


def turn_line(turn: Finished) -> str:
    """``chat``'s summary of a turn on stderr; where its context came from only when the backend knows."""
    done = f"{len(turn.tokens)} new tokens, {turn.stop_reason}"
    if turn.local is None and turn.model.provider == "remote":  # no token ids over the wire
        return f"[{turn.stop_reason}; {cached_words(turn)}]"
    if turn.local is None:
        return f"[{done}]"
    r = turn.local.resume
    how = r.source + (f" ({r.plain})" if r.reason else "")
    return f"[{r.reused_tokens} tokens reused ({how}), {r.prefilled_tokens} prefilled in {r.elapsed_ms:.0f} ms; {done}]"


def cached_words(turn: Finished) -> str:
    """What a remote server said of its prefix cache for the turn's prompt."""
    if turn.server_cached_tokens is None:
        return "cached tokens not reported"
    return f"the server had {turn.server_cached_tokens:,} of {turn.prompt_tokens:,} tokens cached"


def context_full(conversation: str, exc: ContextFullError) -> ContextFullError:
    """The refusal in the CLI's words: the window's advice (its new-chat and drop-oldest buttons) is
    nothing a command line can act on; these are the flags that help. Nothing was stored."""
    if exc.policy == ContextPolicy.DROP_OLDEST:  # even the newest message alone is too long
        what = f"your message and the system prompt are {exc.tokens:,} tokens"
        advice = "shorten the message or the system prompt (--system)"
    else:
        what = f"conversation {conversation} with this message is {exc.tokens:,} tokens"
        advice = "shorten the message or the system prompt (--system), or start another --conversation"
    return ContextFullError(exc.tokens, exc.limit, exc.policy, f"{what}, but the model reads at most "
                            f"{exc.limit:,}: {advice}; nothing was stored")


# conversations ---------------------------------------------------------------------------------------
def _summary_json(s: ConversationSummary) -> dict:
    return {"id": s.id, "title": s.title, "messages": s.messages, "tokens": s.tokens, "created_ms": s.created_ms,
            "last_activity_ms": s.updated_ms, "model": s.model, "model_key": s.model_key or None}


def _model_shown(s: ConversationSummary) -> str:
    """A chat's model in a listing: its library name (a GGUF path by its file name), else its label."""
    if s.model_key:
        return Path(s.model_key).name if s.model_key.endswith(".gguf") else s.model_key
    return s.model or "-"


def _when(ms: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(ms / 1000))


def cmd_conversations_ls(args: argparse.Namespace) -> int:
    hearth = Hearth(data_paths(args))
    rows = hearth.conversation_summaries()
    pinned = hearth.conversations.pinned_ids()
    lines = [f"{s.id:<34} {_when(s.updated_ms)}  {s.messages:>4} msg {s.tokens:>7} tok  {_model_shown(s):<28} "
             f"{'[pinned] ' if s.id in pinned else ''}{s.title or '(untitled)'}" for s in rows]
    lines.append(f"{len(rows)} conversation(s)")
    emit(args, {"conversations": [{**_summary_json(s), "pinned": s.id in pinned} for s in rows]}, "\n".join(lines))
    return 0


def cmd_conversations_show(args: argparse.Namespace) -> int:
    hearth = Hearth(data_paths(args))
    conv = hearth.conversations.get(args.id)
    if conv is None:
        raise ConversationError(f"no conversation {args.id!r} (list them with 'hearth-cli conversations ls')")
    summary = hearth.conversation_summaries([conv.id])[0]
    messages = hearth.conversations.messages(conv.id)
    facts = hearth.conversations.reply_facts(conv.id)  # as the JSON export gives them: model, finish_reason
    payload = {**_summary_json(summary), "message_count": len(messages), "system_prompt": conv.system_prompt,
               "messages": [{"seq": m.seq, "role": m.role, "content": m.content, "created_ms": m.created_ms,
                             **({"model": facts[m.seq].model, "finish_reason": facts[m.seq].finish}
                                if m.seq in facts else {}), **_attachments_json(m)} for m in messages]}
    lines = [f"{conv.title or '(untitled)'}  [{conv.id}]  {len(messages)} messages, {summary.tokens} tokens of saved "
             f"context, last activity {_when(conv.updated_ms)}" + (f", model {conv.model}" if conv.model else "")]
    if conv.system_prompt:
        lines.append(f"\n[system]\n{conv.system_prompt}")
    captions = {seq: reply_caption(f.finish, f.model) for seq, f in facts.items()}  # the window's caption
    lines += [f"\n[{' · '.join(filter(None, (m.role, captions.get(m.seq))))}]\n{m.content}" for m in messages]
    emit(args, payload, "\n".join(lines))
    return 0


def _attachments_json(m) -> dict:
    """A message's files as ``show --json`` lists them (their text is in ``content``, as the model read it)."""
    if not m.attachments:
        return {}
    return {"typed_text": m.typed_text, "attachments": [{"name": a.name, "kind": a.kind, "size": a.size,
                                                         "sha256": a.sha256, "pages": a.pages, "chars": len(a.text)}
                                                        for a in m.attachments]}


def cmd_conversations_import(args: argparse.Namespace) -> int:
    """Import a JSON export: the same batched, all-or-nothing engine path as the window's; progress on
    stderr like every long CLI step; a bad file exits non-zero with one line naming the problem."""
    conversations = read_document(Path(args.file))  # validated before the database is opened
    store = open_conversations(data_paths(args), backup=True)
    try:
        duplicates = find_duplicates(store, conversations)
        policy = DuplicatePolicy(getattr(args, "duplicates", DuplicatePolicy.SKIP))
        ids = import_conversations(store, apply_duplicates(conversations, duplicates, policy),
                                   progress=Progress("importing"))
    finally:
        store.close()
    skipped = len(duplicates) if policy is DuplicatePolicy.SKIP else 0
    copied = len(duplicates) if policy is DuplicatePolicy.COPY else 0
    text = f"imported {len(ids)} conversation(s)"
    if skipped:
        text += f"; skipped {skipped} already here (--duplicates copy imports them as copies)"
    elif copied:
        text += f", {copied} of them as copies of conversations already here"
    emit(args, {"imported": len(ids), "ids": ids, "skipped": skipped, "copied": copied}, text)
    return 0


# kv ------------------------------------------------------------------------------------------------
def cmd_kv_ls(args: argparse.Namespace) -> int:
    store = open_checkpoints(args)
    gone = store.models.gone()
    shares = store.shares()
    entries = []
    for e in store.entries():
        share = shares.get(e.name)
        entries.append({"name": e.name, "path": str(store.path(e.name)), "conversation": e.conversation, "kind": e.kind,
                        "tokens": e.tokens, "bytes": share.bytes if share else e.bytes,
                        "shared_bytes": share.shared if share else 0, "read_bytes": e.bytes, "hits": e.hits,
                        "created_ms": e.created_ms, "last_used_ms": e.last_used_ms, "pinned": e.pinned,
                        "model": store.model_label(e) or None, "model_fingerprint": e.model_fp.hex() or None,
                        "model_gone": e.model_fp in gone})
    payload = {"store": str(store.root), **usage_numbers(store), "entries": entries}
    lines = [f"{e['name']}  {e['kind']:<12} {e['tokens']:>7} tok {e['bytes'] / 2**20:>8.1f} MiB"
             f"{' (' + format(e['shared_bytes'] / 2**20, '.1f') + ' MiB shared)' if e['shared_bytes'] else '':<20}  "
             f"{(e['model'] or 'unknown model') + (' (gone)' if e['model_gone'] else ''):<36} {e['conversation'] or ''}"
             for e in entries]
    lines.append(f"{len(entries)} saved context(s), {payload['bytes'] / 2**20:.1f} MiB of {store.budget_bytes / 2**20:.0f} MiB"
                 f" ({payload['shared_bytes'] / 2**20:.1f} MiB of it shared between contexts)")
    emit(args, payload, "\n".join(lines))
    return 0


def usage_numbers(store: BlockStore) -> dict:
    """What the store holds: unique bytes (each block once), shared bytes (blocks more than one saved
    context uses), bytes written since the store was made, the budget, by kind and block counts."""
    stats = store.stats()
    return {"bytes": store.total_bytes(), "unique_bytes": store.total_bytes(), "shared_bytes": store.shared_bytes(),
            "written_bytes": stats.get("bytes_written", 0), "reused_tokens": stats.get("tokens_reused", 0),
            "budget": store.budget_bytes, "by_kind": store.bytes_by_kind(), "blocks": store.block_count()}


def cmd_kv_usage(args: argparse.Namespace) -> int:
    store = open_checkpoints(args)
    u = usage_numbers(store)
    mib = 2 ** 20
    lines = [f"saved context: {u['unique_bytes'] / mib:.1f} MiB of {u['budget'] / mib:.0f} MiB "
             f"({u['blocks']} blocks, each stored once)",
             f"  shared between contexts: {u['shared_bytes'] / mib:.1f} MiB",
             f"  written since the store was made: {u['written_bytes'] / mib:.1f} MiB "
             f"({u['reused_tokens']:,} tokens reused instead of written)"]
    lines += [f"  {kind}: {n / mib:.1f} MiB" for kind, n in sorted(u["by_kind"].items())]
    emit(args, u, "\n".join(lines))
    return 0


def checkpoint_arg(args: argparse.Namespace, arg: str) -> Path:
    """A ``kv inspect`` / ``kv verify`` argument as a file: a path as given, else a name as ``kv ls``
    prints it (a file in the store)."""
    path = Path(arg)
    if path.exists() or path.is_symlink():
        return path
    stored = resolve_paths(args.data_dir).checkpoints / arg
    if arg and path.name == arg and stored.exists():
        return stored
    raise HearthError(f"no such file or stored checkpoint: {arg} ('hearth-cli kv ls' lists the stored ones)")


def cmd_kv_inspect(args: argparse.Namespace) -> int:
    path = checkpoint_arg(args, args.path)
    info = describe_checkpoint(path)
    if args.json:
        emit(args, info, "")
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
        emit(args, info, "\n".join(lines))
    return 1 if info["problem"] else 0  # a script must not take a file it cannot read for a sound one


def cmd_kv_verify(args: argparse.Namespace) -> int:
    store = open_checkpoints(args)
    if args.all:
        files = [store.path(e.name) for e in store.entries()]
    elif args.paths:
        files = [checkpoint_arg(args, p) for p in args.paths]
    else:
        raise PromptError("name checkpoint files to verify, or use --all")
    identity, vocab = None, None
    try:
        identity, vocab = model_identity(data_paths(args), args.model, args.weights)
    except HearthError as exc:  # no model installed: check structure and checksums only
        sys.stderr.write(f"note: {exc}; checking structure and checksums only\n")
    results = [verify_checkpoint(p, identity, vocab) for p in files]
    damaged = [r for r in results if r["status"] == "damaged"]
    payload = {"checked": len(results), "damaged": len(damaged),
               "stale": sum(r["status"] == "stale" for r in results), "files": results}
    lines = [f"{r['status']:<8} {r['path']}" + (f"  ({r['reason']}: {r['message']})" if r["reason"] else "")
             for r in results]
    lines.append(f"{len(results)} checked, {len(damaged)} damaged, {payload['stale']} stale")
    emit(args, payload, "\n".join(lines))
    return 1 if damaged else 0


def cmd_kv_encoding(args: argparse.Namespace) -> int:
    """Show, or set and remember, the encoding new checkpoint files get (existing files keep theirs)."""
    store = open_checkpoints(args)
    if args.name is not None:
        if args.name not in KV_ENCODINGS:
            raise PromptError(f"unknown KV encoding {args.name!r}; choose one of: {', '.join(KV_ENCODINGS)}")
        store.set_kv_encoding(args.name)
    note = "new checkpoints are stored as " + store.kv_encoding + (
        " (lossless)" if store.kv_encoding == "exact" else " (about a quarter of float32's bytes; see "
        "docs/checkpoint-format.md §4b for its accuracy)")
    emit(args, {"store": str(store.root), "kv_encoding": store.kv_encoding, "choices": list(KV_ENCODINGS)}, note)
    return 0


def cmd_kv_gc(args: argparse.Namespace) -> int:
    convs, store = open_stores(args)
    if args.budget_mb is not None:
        if args.budget_mb <= 0:
            raise PromptError("--budget-mb must be positive")
        store.set_budget(args.budget_mb << 20)
    report = store.gc(live_conversations=convs.ids())
    emit(args, report, f"removed {report['temp_files']} temp file(s), {len(report['orphans'])} orphan(s), "
                        f"evicted {len(report['evicted'])}; {report['bytes'] / 2**20:.1f} MiB of "
                        f"{report['budget'] / 2**20:.0f} MiB used")
    return 0


def cmd_db(args: argparse.Namespace) -> int:
    """``db check|backup|restore|salvage``: the conversation database's health, backups and recovery."""
    db = data_paths(args).conversations_db
    if args.force and args.action != "restore":
        raise PromptError("--force is for 'db restore' (over a database that passes its check)")
    if args.action == "check":
        result = check_database_file(db)
        payload = {"path": str(db), "ok": result.ok, "problem": result.problem or None,
                   "backups": [str(p) for p in result.backups]}
        human = (f"{db}: {'ok' if result.ok else result.problem}\n{len(result.backups)} backup(s)"
                 + "".join(f"\n  {p}" for p in result.backups)
                 + ("" if result.ok else f"\n{database_way_out(db)}"))
        emit(args, payload, human)
        return 0 if result.ok else 1
    if args.action == "backup":
        made = backup_database_file(db, force=True)
        emit(args, {"path": str(db), "backup": str(made) if made else None},
             f"backed up to {made}" if made else f"nothing to back up at {db}")
        return 0
    if args.action == "salvage":
        if args.source:
            raise PromptError("--from names a backup for 'db restore'; 'db salvage' reads the database itself")
        if not db.exists():
            raise ConversationError(f"nothing to salvage: {db} does not exist")
        if not database_file_problem(db):
            raise ConversationError(f"{db} is sound (it passes its check): there is nothing to salvage")
        saved = salvage_database_file(db)
        emit(args, {"path": str(db), "conversations": saved.conversations, "messages": saved.messages,
                    "recreated_conversations": saved.recreated, "missing_messages": saved.missing_messages,
                    "lost_conversations": saved.lost_conversations, "unreadable_rows": saved.unreadable_rows,
                    "unreadable_ends": list(saved.unreadable_ends), "unreadable_pages": saved.unreadable_pages,
                    "damaged_kept_at": str(saved.damaged)},
             f"salvaged {db.name}: {saved.summary()}")
        return 0
    try:
        used, aside = restore_database_file(db, Path(args.source) if args.source else None, force=args.force)
    except SoundDatabaseError as exc:  # not a failure: a refusal to lose conversations unasked
        sys.stderr.write(f"hearth-cli: error: {exc}\n")
        return 2
    replaced = aside is not None and aside.name.startswith(f"{db.name}.replaced-")
    emit(args, {"path": str(db), "restored_from": str(used),
                "damaged_kept_at": str(aside) if aside and not replaced else None,
                "replaced_kept_at": str(aside) if replaced else None},
         f"restored {db.name} from {used}" + (f"; the previous file is kept at {aside}" if aside else ""))
    return 0
