"""The tool loop's benchmark (not a test; issue 33): a 10-step tool loop on a ~4,000-token conversation, with a
restart in the middle, beside llama.cpp reading the same token ids.

    python bench/tool_loop.py [--data-dir .test-cache/home] [--steps 10] [--restart-after 5]
                              [--context-tokens 4000] [--threads N] [--no-peer]

Hearth runs in this process on the default model (SmolLM2-135M), CPU, greedy, with the calculator MCP server
(tests/mcp_servers/calculator.py, over stdio, through the real ``ToolHost``). Each step is a window turn with
the server's tools offered and ``tool_choice`` required, so every reply is a call (a 135M model rarely calls on
its own); the call runs through ``run_call`` (stored as a message of its own), then the next step answers.
After step ``--restart-after`` the Hearth service and the tool host are closed and opened again (a restart):
the next step's context comes from the saved context on disk.

llama.cpp (llama-cpp-python in bench/.peer-venv, built by bench/peer.py; its worker's ``extend``) gets, for
every step, the token ids of the very prompt Hearth read (``render_prompt``, then Hearth's tokenizer), keeps
the longest common prefix of its KV cache as its server's prompt cache does, and evaluates the rest; then the
reply Hearth wrote is put into its KV (untimed), as its server's slot keeps the tokens it decoded, so both engines
start each step holding the same text. At the restart its process is started again, as a llama.cpp server loses
its cache when it restarts (its slot-save endpoint is off unless ``--slot-save-path`` is given, and then manual).

Per step: the prompt's tokens; the tokens each engine evaluated ("read": the goal is only the new call and
result); where Hearth's context came from (live / disk); and time to first token (Hearth: from the turn's
start to its first piece, its own ``ttft_ms``; llama.cpp: the evaluation and the first token's pick). Prints a
table and writes bench/results/tool_loop.json. The box's load before and after is recorded (``os.getloadavg``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # the engine first: bench/engine.py (on the path as this script's folder) would hide it

from engine.api import (  # noqa: E402
    Hearth,
    ToolHost,
    ToolRegistry,
    render_prompt,
    resolve_model_file,
    resolve_paths,
    run_call,
)
from engine.types import SamplingParams, ToolChoice, ToolChoiceMode, TurnRequest  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/'s modules

from peer import PeerSide, TextSide, ensure_peer, this_cpu  # noqa: E402
from resume import paragraph  # noqa: E402

CALCULATOR = ROOT / "tests" / "mcp_servers" / "calculator.py"
GREEDY = SamplingParams.greedy_params()
CID = "bench-tool-loop"
TASK = ("Work out the running total of these numbers with the calculator, one addition per call, and say the "
        "total at the end: 17, 4, 23, 8, 15, 42, 16, 7, 11, 30.")


def fresh_home(source: Path) -> Path:
    """A data dir of its own (new conversations and saved context) sharing the source's models and conversions."""
    home = Path(tempfile.mkdtemp(prefix="hearth-tool-loop-"))
    for part in ("models", "converted"):
        if (source / part).exists():
            (home / part).symlink_to((source / part).resolve())
    return home


def system_prompt(target_tokens: int) -> str:
    """Instructions of about ``target_tokens`` tokens (SmolLM2's tokenizer: ~1.3 tokens a word here)."""
    words = int(target_tokens / 1.35)
    parts, seed = [], 0
    while sum(len(p.split()) for p in parts) < words:
        parts.append(paragraph(seed, 60))
        seed += 1
    return "You are a careful assistant with a calculator.\n\n" + "\n\n".join(parts)


def open_hearth(paths, model: str | None, threads: int | None) -> Hearth:
    hearth = Hearth(paths, model=model, provider="cpu", threads=threads)
    hearth.load()
    return hearth


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data-dir", default=str(ROOT / ".test-cache" / "home"))
    ap.add_argument("--model", help="a GGUF path or catalog name (default: the default model)")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--restart-after", type=int, default=5)
    ap.add_argument("--context-tokens", type=int, default=4000)
    ap.add_argument("--threads", type=int)
    ap.add_argument("--no-peer", action="store_true")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "tool_loop.json"))
    args = ap.parse_args()
    load_before = os.getloadavg()
    home = fresh_home(Path(args.data_dir))
    paths = resolve_paths(home).ensure()
    gguf = resolve_model_file(paths, args.model)
    registry = ToolRegistry(paths.data)
    registry.add_stdio("calc", sys.executable, (str(CALCULATOR),))
    peer = None
    text_side = TextSide(gguf)
    threads = args.threads or max(1, (os.cpu_count() or 2))
    if not args.no_peer:
        _flags, features = this_cpu()
        python = ensure_peer(features)
        peer = start_peer(python, home, features, gguf, threads)
    rows: list[dict] = []
    hearth = open_hearth(paths, args.model, args.threads)
    host = ToolHost(registry)
    try:
        specs = host.tools()
        if not specs:
            raise SystemExit(f"the calculator server listed no tools: {host.status()}")
        tools = tuple(s.openai() for s in specs)
        first = TurnRequest(CID, TASK, GREEDY, max_new_tokens=64, system_prompt=system_prompt(args.context_tokens),
                            tools=tools, tool_choice=ToolChoice(ToolChoiceMode.REQUIRED))
        request = first
        for step in range(1, args.steps + 1):
            restarted = step == args.restart_after + 1
            if restarted:
                hearth.close()
                host.close()
                hearth = open_hearth(paths, args.model, args.threads)
                host = ToolHost(registry)
                host.tools()
                if peer is not None:
                    peer.close()
                    peer = start_peer(python, home, features, gguf, threads)
            row = {"step": step, "after_restart": restarted}
            if peer is not None:  # the same prompt ids Hearth is about to read
                convs = hearth.conversations
                messages = convs.chat_messages(CID) if convs.get(CID) is not None else []
                if request.system_prompt and not messages:
                    messages = [{"role": "system", "content": request.system_prompt}]
                if request.user_message is not None:
                    messages = [*messages, {"role": "user", "content": request.user_message}]
                text = render_prompt(paths, args.model, messages, list(tools)).prompt
                ids = text_side.encode_prompt(text)
            started = time.perf_counter()
            finished = hearth.run_turn(request, create=step == 1)
            wall_ms = (time.perf_counter() - started) * 1000
            resume = finished.local.resume
            row |= {"prompt_tokens": finished.prompt_tokens, "hearth_read": finished.prompt_tokens - resume.reused_tokens,
                    "hearth_source": str(resume.source), "hearth_ttft_ms": round(finished.timings.ttft_ms, 1),
                    "hearth_turn_ms": round(wall_ms, 1), "calls": [c.name for c in finished.tool_calls]}
            if peer is not None:
                reply = peer.call("extend", tokens=ids)
                row |= {"peer_prompt_tokens": len(ids), "peer_read": reply["evaluated"],
                        "peer_ttft_ms": round(reply["s"] * 1000, 1)}
                # the reply Hearth wrote goes into llama.cpp's KV too (untimed), as its server's slot keeps the
                # tokens it decoded: both engines then start the next step holding the same text
                if finished.tokens:
                    peer.call("append", tokens=list(finished.tokens))
            for call in finished.tool_calls:
                outcome = run_call(host, hearth.conversations, CID, call, None, 30.0)
                row.setdefault("tool_ms", []).append(outcome.elapsed_ms)
                row.setdefault("results", []).append(outcome.text[:60])
            rows.append(row)
            print_row(row)
            if not finished.tool_calls:
                print(f"step {step}: the reply made no call; the loop ends here", file=sys.stderr)
                break
            request = TurnRequest(CID, None, GREEDY, max_new_tokens=64, tools=tools,
                                  tool_choice=ToolChoice(ToolChoiceMode.REQUIRED))
    finally:
        hearth.close()
        host.close()
        if peer is not None:
            peer.close()
    load_after = os.getloadavg()
    result = {"rows": rows, "load_before": load_before, "load_after": load_after, "steps": args.steps,
              "restart_after": args.restart_after, "model": gguf.name, "threads": threads,
              "machine": {"cpu_count": os.cpu_count(), "platform": platform.platform()},
              "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))
    summary(rows)
    print(f"load average before {load_before[0]:.2f}, after {load_after[0]:.2f}; written {args.out}")
    shutil.rmtree(home, ignore_errors=True)
    return 0


def start_peer(python: Path, home: Path, features, gguf: Path, threads: int) -> PeerSide:
    side = PeerSide(python, home, features)
    side.call("load", model=str(gguf), n_ctx=8192, threads=threads, n_batch=2048, flash_attn=True)
    return side


def print_row(row: dict) -> None:
    peer = (f" | llama.cpp read {row['peer_read']:>5} of {row['peer_prompt_tokens']:>5}, TTFT {row['peer_ttft_ms']:>7.1f} ms"
            if "peer_read" in row else "")
    mark = " (after restart)" if row["after_restart"] else ""
    print(f"step {row['step']:>2}{mark}: prompt {row['prompt_tokens']:>5} | Hearth read {row['hearth_read']:>5} "
          f"({row['hearth_source']}), TTFT {row['hearth_ttft_ms']:>7.1f} ms{peer}", flush=True)


def summary(rows: list[dict]) -> None:
    later = [r for r in rows if r["step"] > 1]
    if not later:
        return
    hearth = sum(r["hearth_read"] for r in later)
    line = f"steps 2–{rows[-1]['step']}: Hearth read {hearth:,} tokens in all"
    if all("peer_read" in r for r in later):
        peer = sum(r["peer_read"] for r in later)
        line += f", llama.cpp {peer:,} ({peer / max(hearth, 1):.1f}×)"
    print(line)


if __name__ == "__main__":
    sys.exit(main())
