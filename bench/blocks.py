"""Shared-context benchmark (issue 29, not a test): what chats, API requests and restores that share text
cost in tokens re-read, bytes kept and written, and time, measured through the public API only.

    python bench/blocks.py documents [--doc-tokens 6000] [--chats 5] [--json PATH]
    python bench/blocks.py api       [--system-tokens 1500] [--requests 10] [--json PATH]
    python bench/blocks.py restore   [--context-tokens 8000] [--repeats 3] [--json PATH]
                                     [--prepare DIR | --compare-dirs A B]
    python bench/blocks.py all       [--json PATH]          (the three, each in a fresh data dir)
    common: [--data-dir DIR] [--model-home DIR] [--weights int4] [--provider cpu] [--quick]

The model is the default one from ``$HEARTH_TEST_CACHE/home`` (``--model-home``), shared by symlink; the
data dir is a fresh temporary one unless ``--data-dir`` names one (then it is kept). ``--quick`` makes
every size smaller for a trial run; the goals are stated for the full sizes.

documents  five chats, same system prompt, whose first message is the same ~6,000-token document (seeded
           prose) and then a different question. Per chat: tokens re-read (prefilled) and reused, where
           the reuse came from, the saved context's growth (the saved-contexts service's bytes, and the
           file system's), bytes the save wrote, time to first token. Goals: chats 2–5 re-read fewer than
           one 256-token block plus their question; each adds ≤ 15% of chat 1's bytes; chat 2's TTFT ≤
           1/20 of chat 1's. ``--fresh-service``: each chat in a newly loaded service, so what it reuses
           comes from disk, not from the previous chat's live KV.
api        ten requests to Hearth's own OpenAI-compatible server (the embedded one, on 127.0.0.1, over
           HTTP) sharing a ~1,500-token system prompt, different questions. Goal: saved-context bytes
           after all ten ≤ 1.3 × after the first.
restore    one chat of ~8,000 tokens saved; then a fresh service (closed and made again) opens it, timed by
           the resume report, alternating a warm page cache and a cold one (every file under the store's
           directory dropped with POSIX_FADV_DONTNEED: no root needed), ``--repeats`` times each; then one
           more turn: bytes its save wrote per new token against the KV's own bytes per token (goal:
           within 5%). Restore from the block store must be no slower than from today's files (same-run
           ratio ≤ 1.1): prepare one data dir with each (``--prepare DIR``, on each branch) and time both
           in one run with ``--compare-dirs FILES_DIR BLOCKS_DIR`` (ratio = second / first). Each dir is
           opened through ``blocks_support.open_hearth``: if the block store adopts old files on first
           open, the files dir is converted by its first restore — plug a choice of tier in there.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from blocks_support import (  # noqa: E402
    BLOCK_TOKENS,
    MODEL_HOME,
    EngineThread,
    data_dir,
    drop_page_cache,
    kv_bytes_per_token,
    machine,
    mib,
    open_hearth,
    process_io,
    prose,
    store_files,
    table,
    token_counter,
    usage,
    write_json,
)

from engine.api import Hearth  # noqa: E402
from engine.types import SamplingParams, TurnRequest  # noqa: E402

log = logging.getLogger("bench.blocks")
GREEDY = SamplingParams(greedy=True)
SYSTEM = "You are a careful reader. Answer questions about the documents the user gives you, briefly."
QUESTIONS = ("Who repaired the bridge, and when?", "What did the council record in the spring?",
             "Summarize the document in one sentence.", "Which places does the document name most often?",
             "What happened to the lighthouse keeper's letters?", "List three of the merchants' trades.")
# The rendered turn adds a few tokens after the question (end of the user turn, the assistant's header):
# the re-read goal allows them on top of one block and the question itself.
TEMPLATE_SLACK = 8
MANIFEST = "bench-blocks.json"


def turn(hearth: Hearth, conversation: str, message: str, max_new_tokens: int, system: str | None = SYSTEM) -> dict:
    """One turn, with the saved context's figures before and after it."""
    before, io = usage(hearth), process_io()
    started = time.perf_counter()
    done = hearth.run_turn(TurnRequest(conversation, message, GREEDY, max_new_tokens, system_prompt=system),
                           create=True)
    wall_ms = (time.perf_counter() - started) * 1000
    io_after, after = process_io(), usage(hearth)
    resume, save = done.local.resume, done.local.save
    return {"conversation": conversation, "prompt_tokens": done.prompt_tokens, "source": str(resume.source),
            "shared_prefix": resume.shared_prefix, "reused_tokens": resume.reused_tokens,
            "restored_tokens": resume.restored_tokens, "prefilled_tokens": resume.prefilled_tokens,
            "restore_ms": resume.restore_ms, "ttft_ms": done.timings.ttft_ms, "wall_ms": wall_ms,
            "reply": done.reply, "bytes_grown": after["bytes"] - before["bytes"],
            "disk_grown": after["disk"]["apparent_bytes"] - before["disk"]["apparent_bytes"],
            "save": save.as_dict() if save is not None else None,
            "process_write_bytes": io_after["write_bytes"] - io["write_bytes"],
            "usage_before": before, "usage_after": after}


# documents -------------------------------------------------------------------------------------------------
def documents(args: argparse.Namespace) -> dict:
    with data_dir(args.data_dir, args.model_home, "documents") as home:
        hearth = open_hearth(home, args.weights, args.provider)
        try:
            count = token_counter(hearth.paths)
            document = prose(29, args.doc_tokens, count)
            rows = []
            for k, question in enumerate(QUESTIONS[:args.chats], 1):
                if args.fresh_service and k > 1:  # nothing live: what chat k reuses must come from disk
                    hearth.close()
                    hearth = open_hearth(home, args.weights, args.provider)
                row = turn(hearth, f"bench-doc-{k}", f"notes.txt\n\n{document}\n\n{question}", args.max_new_tokens)
                row["question_tokens"] = count(question)
                rows.append(row)
                log.info("chat %d: %s, %d prefilled, %d reused, TTFT %.0f ms, +%.1f MiB", k, row["source"],
                         row["prefilled_tokens"], row["reused_tokens"], row["ttft_ms"], mib(row["bytes_grown"]))
            final = usage(hearth)
        finally:
            hearth.close()
    first = rows[0]
    for r in rows:
        r["bytes_vs_chat1"] = r["bytes_grown"] / first["bytes_grown"] if first["bytes_grown"] else None
        r["reread_limit"] = BLOCK_TOKENS + r["question_tokens"] + TEMPLATE_SLACK
    later = rows[1:]
    ttft_ratio = later[0]["ttft_ms"] / first["ttft_ms"] if later else None
    goals = {
        "reread_below_one_block_plus_question": all(r["prefilled_tokens"] < r["reread_limit"] for r in later),
        "bytes_at_most_15pct_of_chat1": all((r["bytes_vs_chat1"] or 0) <= 0.15 for r in later),
        "chat2_ttft_at_most_1_20th": ttft_ratio is not None and ttft_ratio <= 1 / 20,
    }
    print(f"\ndocuments: {args.chats} chats, one {first['prompt_tokens']}-token prompt each "
          f"({args.doc_tokens}-token document), {args.max_new_tokens} new tokens"
          + (", each chat in a fresh service" if args.fresh_service else ""))
    print(table(("chat", "source", "prompt tok", "reused", "from disk", "re-read", "goal <", "TTFT ms",
                 "saved +MiB", "× chat 1", "files +MiB", "save wrote MiB"),
                [(i, r["source"] + (" (prefix)" if r["shared_prefix"] else ""), r["prompt_tokens"],
                  r["reused_tokens"], r["restored_tokens"], r["prefilled_tokens"], r["reread_limit"] if i > 1 else "",
                  r["ttft_ms"], mib(r["bytes_grown"]), r["bytes_vs_chat1"], mib(r["disk_grown"]),
                  mib(_save_bytes(r))) for i, r in enumerate(rows, 1)]))
    print(f"chat 2's TTFT / chat 1's: {ttft_ratio:.3f} (goal ≤ 0.05); saved context at the end: "
          f"{_usage_line(final)}")
    _print_goals(goals)
    return {"scenario": "documents", "doc_tokens": args.doc_tokens, "fresh_service": args.fresh_service,
            "chats": rows, "ttft_ratio_2_1": ttft_ratio,
            "final_usage": final, "goals": goals}


def _usage_line(figures: dict) -> str:
    """Every byte count the saved-contexts service reports (the block store adds unique, shared and
    written bytes), by kind, and the files the directory holds."""
    counts = [f"{k} {mib(v):.1f} MiB" for k, v in figures.items()
              if isinstance(v, int) and k not in ("budget", "rows_bytes")]
    counts.append(f"the browser's rows add up to {mib(figures['rows_bytes']):.1f} MiB")
    kinds = [f"{k} {mib(v):.1f} MiB" for k, v in (figures.get("by_kind") or {}).items()]
    disk = figures["disk"]
    return (", ".join(counts) + (f" (by kind: {', '.join(kinds)})" if kinds else "")
            + f"; {disk['files']} files, {mib(disk['apparent_bytes']):.1f} MiB")


def _save_bytes(row: dict) -> int:
    save = row["save"] or {}
    return save.get("bytes_written", 0) + save.get("prefix_bytes_written", 0)


# api -------------------------------------------------------------------------------------------------------
def api(args: argparse.Namespace) -> dict:
    import httpx

    from engine.server.embedded import local_server

    with data_dir(args.data_dir, args.model_home, "api") as home:
        engine = EngineThread()
        hearth = engine.call(lambda: open_hearth(home, args.weights, args.provider))
        server = local_server(hearth.paths, hearth, engine.post, port=0)
        base = server.start()
        try:
            count = token_counter(hearth.paths)
            system = "You answer questions about the archive described below.\n\n" + prose(
                17, args.system_tokens, count)
            rows = []
            with httpx.Client(timeout=600) as client:
                for i in range(args.requests):
                    question = f"Question {i + 1}: {QUESTIONS[i % len(QUESTIONS)]} Answer as entry {i + 1}."
                    rows.append(_request(client, base, hearth, engine, system, question, args.max_tokens))
                    r = rows[-1]
                    log.info("request %d: %s, cached %s of %s, %.0f ms, saved %.1f MiB", i + 1, r["cache"],
                             r["cached_tokens"], r["prompt_tokens"], r["wall_ms"], mib(r["usage"]["bytes"]))
        finally:
            server.stop()
            engine.call(hearth.close)
            engine.stop()
    one, total = rows[0]["usage"]["bytes"], rows[-1]["usage"]["bytes"]
    ratio = total / one if one else None
    goals = {"total_at_most_1_3x_one_request": ratio is not None and ratio <= 1.3}
    print(f"\napi: {args.requests} requests, one {args.system_tokens}-token system prompt, "
          f"{args.max_tokens} new tokens each")
    print(table(("request", "prompt tok", "cached", "cache", "wall ms", "saved MiB", "files", "files MiB"),
                [(i, r["prompt_tokens"], r["cached_tokens"], r["cache"], r["wall_ms"], mib(r["usage"]["bytes"]),
                  r["usage"]["disk"]["files"], mib(r["usage"]["disk"]["apparent_bytes"]))
                 for i, r in enumerate(rows, 1)]))
    print(f"saved context after {args.requests} / after 1: {ratio:.2f}× (goal ≤ 1.3×); at the end: "
          f"{_usage_line(rows[-1]['usage'])}")
    _print_goals(goals)
    return {"scenario": "api", "system_tokens": args.system_tokens, "requests": rows, "ratio": ratio, "goals": goals}


def _request(client: Any, base: str, hearth: Hearth, engine: EngineThread, system: str, question: str,
             max_tokens: int) -> dict:
    body = {"model": hearth.model_key, "max_tokens": max_tokens, "temperature": 0,
            "messages": [{"role": "system", "content": system}, {"role": "user", "content": question}]}
    io = process_io()
    started = time.perf_counter()
    response = client.post(f"{base}/chat/completions", json=body)
    wall_ms = (time.perf_counter() - started) * 1000
    response.raise_for_status()
    reply = response.json()
    after = engine.call(lambda: usage(hearth))  # queued behind the request's job, its save included
    details = reply.get("usage") or {}
    return {"prompt_tokens": details.get("prompt_tokens"),
            "cached_tokens": (details.get("prompt_tokens_details") or {}).get("cached_tokens"),
            "cache": response.headers.get("X-Hearth-Cache"), "wall_ms": wall_ms,
            "reply": reply["choices"][0]["message"]["content"], "usage": after,
            "process_write_bytes": process_io()["write_bytes"] - io["write_bytes"]}


# restore ---------------------------------------------------------------------------------------------------
def restore(args: argparse.Namespace) -> dict:
    if args.compare_dirs:
        dirs = {Path(d).name or d: Path(d) for d in args.compare_dirs}
        if len(dirs) != 2:
            raise SystemExit("--compare-dirs takes two different data dirs")
        return _time_restores(args, dirs, prepared=None)
    target = args.prepare or args.data_dir
    with data_dir(target, args.model_home, "restore") as home:
        prepared = _prepare(args, home)
        if args.prepare:
            print(f"prepared {home}: {prepared['prompt_tokens']} tokens in {prepared['conversation']}")
            return {"scenario": "restore", "prepared": prepared}
        return _time_restores(args, {"store": home}, prepared)


def _prepare(args: argparse.Namespace, home: Path) -> dict:
    """The ~8,000-token chat, saved; its id in the data dir's manifest, for ``--compare-dirs``."""
    hearth = open_hearth(home, args.weights, args.provider)
    try:
        count = token_counter(hearth.paths)
        text = prose(41, args.context_tokens - 40, count)
        row = turn(hearth, "bench-restore", f"report.txt\n\n{text}\n\nWhat is this report about?", args.max_new_tokens)
    finally:
        hearth.close()
    row["conversation"] = "bench-restore"
    (home / MANIFEST).write_text(json.dumps({"conversation": row["conversation"], "prompt_tokens": row["prompt_tokens"]}))
    log.info("prepared %s: %d tokens, cold TTFT %.0f ms", home, row["prompt_tokens"], row["ttft_ms"])
    return row


def _warm(home: Path) -> None:
    from engine.api import resolve_paths

    for path in store_files(resolve_paths(home)):
        with path.open("rb") as f:
            while f.read(1 << 24):
                pass


def _open_once(args: argparse.Namespace, home: Path, conversation: str, cache: str) -> dict:
    from engine.api import resolve_paths

    if cache == "cold":
        drop_page_cache(resolve_paths(home))
    else:
        _warm(home)
    hearth = open_hearth(home, args.weights, args.provider)
    try:
        io = process_io()
        started = time.perf_counter()
        resume = hearth.open_conversation(conversation, max_new_tokens=args.max_new_tokens)
        wall_ms = (time.perf_counter() - started) * 1000
        read = process_io()["read_bytes"] - io["read_bytes"]
        files = usage(hearth)["disk"]["apparent_bytes"]
    finally:
        hearth.close()
    if resume is None:
        raise SystemExit(f"{home}: {conversation} has nothing to restore")
    return {"cache": cache, "source": str(resume.source), "reason": resume.reason,
            "restored_tokens": resume.restored_tokens, "restore_ms": resume.restore_ms,
            "elapsed_ms": resume.elapsed_ms, "wall_ms": wall_ms, "read_bytes": read, "store_bytes": files,
            "gb_s": files / (resume.restore_ms / 1000) / 1e9 if resume.restore_ms else None}


def _time_restores(args: argparse.Namespace, dirs: dict[str, Path], prepared: dict | None) -> dict:
    manifests = {}
    for label, home in dirs.items():
        try:
            manifests[label] = json.loads((home / MANIFEST).read_text())
        except (OSError, ValueError) as exc:
            raise SystemExit(f"{home} was not prepared by 'blocks.py restore --prepare {home}': {exc}") from None
    runs: dict[str, list[dict]] = {label: [] for label in dirs}
    for rep in range(args.repeats):
        # alternate which cache state (and which dir) goes first, so neither always follows the other
        caches = ("warm", "cold") if rep % 2 == 0 else ("cold", "warm")
        order = list(dirs) if rep % 2 == 0 else list(dirs)[::-1]
        for cache in caches:
            for label in order:
                run = _open_once(args, dirs[label], manifests[label]["conversation"], cache)
                runs[label].append(run)
                log.info("%s %s: %s, %d tokens in %.1f ms, read %.1f MiB", label, cache, run["source"],
                         run["restored_tokens"], run["restore_ms"], mib(run["read_bytes"]))
    summary = {label: {cache: statistics.median(r["restore_ms"] for r in rs if r["cache"] == cache)
                       for cache in ("warm", "cold")} for label, rs in runs.items()}
    follow = {label: _follow_turn(args, home, manifests[label]["conversation"]) for label, home in dirs.items()}
    print(f"\nrestore: {manifests[next(iter(dirs))]['prompt_tokens']}-token chat, {args.repeats} opens per cache "
          "state, each in a fresh service")
    print(table(("store", "cache", "source", "restored tok", "restore ms", "GB/s", "read MiB", "open wall ms"),
                [(label, r["cache"], r["source"], r["restored_tokens"], r["restore_ms"], r["gb_s"] or 0.0,
                  mib(r["read_bytes"]), r["wall_ms"]) for label, rs in runs.items() for r in rs]))
    print(table(("store", "warm median ms", "cold median ms", "next turn new tok", "wrote B/tok", "KV B/tok",
                 "ratio", "files +B/tok"),
                [(label, summary[label]["warm"], summary[label]["cold"], f["new_tokens"], f["bytes_per_new_token"],
                  f["kv_bytes_per_token"], f["written_vs_kv"], f["disk_grown_per_new_token"])
                 for label, f in follow.items()]))
    goals = {f"{label}_writes_within_5pct_of_kv": f["written_vs_kv"] is not None and abs(f["written_vs_kv"] - 1) <= 0.05
             for label, f in follow.items()}
    ratios = None
    if len(dirs) == 2:
        a, b = list(dirs)
        ratios = {cache: summary[b][cache] / summary[a][cache] for cache in ("warm", "cold")}
        goals["second_no_slower_than_first"] = all(r <= 1.1 for r in ratios.values())
        print(f"{b} / {a} restore time: warm {ratios['warm']:.2f}, cold {ratios['cold']:.2f} (goal ≤ 1.1)")
    _print_goals(goals)
    return {"scenario": "restore", "prepared": prepared, "manifests": manifests, "runs": runs, "medians": summary,
            "ratios": ratios, "follow_turn": follow, "goals": goals}


def _follow_turn(args: argparse.Namespace, home: Path, conversation: str) -> dict:
    """One more turn on the restored chat: what its save wrote per new token, against the KV's size."""
    hearth = open_hearth(home, args.weights, args.provider)
    try:
        kv = kv_bytes_per_token(hearth.paths, args.weights)
        row = turn(hearth, conversation, "Now summarize it in one line, please.", args.max_new_tokens, system=None)
    finally:
        hearth.close()
    save = row["save"] or {}
    new = save.get("new_tokens", 0)
    per = _save_bytes(row) / new if new else None
    return {**row, "kv_bytes_per_token": kv, "new_tokens": new, "bytes_per_new_token": per,
            "written_vs_kv": per / kv if per else None,
            "disk_grown_per_new_token": row["disk_grown"] / new if new else None}


# the command line ------------------------------------------------------------------------------------------
def _print_goals(goals: dict[str, bool]) -> None:
    print("goals: " + ", ".join(f"{k} {'met' if v else 'NOT met'}" for k, v in goals.items()))


SCENARIOS = {"documents": documents, "api": api, "restore": restore}
QUICK = {"doc_tokens": 1500, "chats": 3, "system_tokens": 600, "requests": 4, "context_tokens": 2000, "repeats": 1}


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("scenario", choices=[*SCENARIOS, "all"])
    ap.add_argument("--data-dir", help="a data dir to use and keep (default: a fresh temporary one)")
    ap.add_argument("--model-home", type=Path, default=MODEL_HOME,
                    help="where models/ and converted/ are (default: $HEARTH_TEST_CACHE/home)")
    ap.add_argument("--weights", default="int4")
    ap.add_argument("--provider", default="cpu")
    ap.add_argument("--json", help="write the figures here")
    ap.add_argument("--quick", action="store_true", help="smaller sizes, for a trial run")
    ap.add_argument("--max-new-tokens", type=int, default=8, help="each chat turn's reply")
    ap.add_argument("--doc-tokens", type=int, default=6000)
    ap.add_argument("--chats", type=int, default=5)
    ap.add_argument("--fresh-service", action="store_true",
                    help="documents: close and reload the service between chats (reuse only from disk)")
    ap.add_argument("--system-tokens", type=int, default=1500)
    ap.add_argument("--requests", type=int, default=10)
    ap.add_argument("--max-tokens", type=int, default=8, help="each API request's reply")
    ap.add_argument("--context-tokens", type=int, default=8000)
    ap.add_argument("--repeats", type=int, default=3, help="restores per cache state")
    ap.add_argument("--prepare", metavar="DIR", help="restore: only build and save the chat in DIR (kept)")
    ap.add_argument("--compare-dirs", nargs=2, metavar=("A", "B"),
                    help="restore: time two prepared data dirs in one run (ratio B / A)")
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = parser()
    args = ap.parse_args(argv)
    if args.quick:  # smaller sizes, except those given on the command line
        for k, v in QUICK.items():
            if getattr(args, k) == ap.get_default(k):
                setattr(args, k, v)
    if args.chats > len(QUESTIONS) or args.chats < 2:
        raise SystemExit(f"--chats must be 2 to {len(QUESTIONS)}")
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    for name in ("engine", "httpx", "uvicorn", "uvicorn.access", "uvicorn.error"):
        logging.getLogger(name).setLevel(logging.WARNING)
    names = list(SCENARIOS) if args.scenario == "all" else [args.scenario]
    if args.scenario == "all" and args.data_dir:
        raise SystemExit("'all' runs each scenario in a fresh data dir: leave out --data-dir")
    results = {"machine": machine(), "weights": args.weights, "provider": args.provider, "quick": args.quick}
    for name in names:
        started, load = time.perf_counter(), os.getloadavg()
        results[name] = SCENARIOS[name](args)
        # other work on the machine shows in the timings: say how busy it was
        results[name].update(seconds=time.perf_counter() - started, load_before=load, load_after=os.getloadavg())
        log.info("%s took %.0f s; load average %.1f before, %.1f after", name, results[name]["seconds"],
                 load[0], results[name]["load_after"][0])
    write_json(args.json, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
