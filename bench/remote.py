"""Chat turns on a ~4,000-token conversation through the remote backend, against each engine available here:
a second Hearth (``hearth-cli serve`` in a subprocess, its own data dir) and llama.cpp's server (llama-cpp-python
from the peer venv, when its server extras are installed; else it is skipped, and the output says so).

Per turn: time to first token, the server's cached tokens, and what Hearth adds on top of the engine's own
latency. The overhead is measured in the same run: before each turn the same request (the stored chat plus
the new message, greedy) is streamed twice with a raw httpx client — the first warms the server's prefix
cache, the second is timed — then the RemoteBackend turn sends it again; the difference of the whole
request's wall time is Hearth's work (store the message, build the request, parse the stream, store the
reply), and over the streamed tokens its per-token cost. On a busy machine the engine's own jitter swamps
that, so the last turn's recorded stream is then replayed by a local server that answers at once, 30 times
to each client: the medians' difference is Hearth's cost alone. Goal: under 5 ms a turn, under 1 ms a token.

    python bench/remote.py [--turns 6] [--system-tokens 4000] [--peer-python P] [--server-extras]
                                                                  # results: bench/results/remote.json

Cached tokens are what the server's usage says (``prompt_tokens_details.cached_tokens``); a server whose usage
lacks it (llama-cpp-python 0.3.36's) shows "not reported". The load average (``uptime``) before and after is
printed and stored: on a shared 2-core box the timings are noisy.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # the engine first: bench/engine.py (on the path as this script's folder) would hide it

import engine.api  # noqa: E402, F401  (imported now, while the package comes first on the path)
import engine.model.fetch  # noqa: E402, F401

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/'s modules

from peer import ensure_server_extras  # noqa: E402
from server import Server, free_port, hearth_server, llama_server, shared_home, tool_descriptions  # noqa: E402

PEER_PYTHON = ROOT / "bench" / ".peer-venv" / "bin" / "python"
QUESTIONS = ["Which tool reads a file?", "And which one writes it?", "Summarise the search tool.",
             "What does the clock tool return?", "Name two tools that take a path.", "Which is the slowest?",
             "Which tools change nothing?", "Thanks. One more: which tool lists folders?"]


def raw_stream(base: str, model: str, messages: list[dict], max_tokens: int, http: httpx.Client | None = None) -> dict:
    """One streamed request with nothing of Hearth's between: wall time, time to first text, chunks. ``http``: a
    client whose connection is kept between calls, as the remote backend keeps its own."""
    body = {"model": model, "messages": messages, "max_tokens": max_tokens, "temperature": 0.0, "stream": True,
            "stream_options": {"include_usage": True}}
    started = time.perf_counter()
    first, finish, usage, pieces, lines = None, None, None, 0, []
    client = http or httpx.Client(timeout=600, trust_env=False)
    with client.stream("POST", base + "/v1/chat/completions", json=body) as response:
        for line in response.iter_lines():
            lines.append(line)
            if line.startswith("data: ") and line != "data: [DONE]":
                chunk = json.loads(line[6:])
                usage = chunk.get("usage") or usage
                if finish is None and any(c.get("finish_reason") for c in chunk.get("choices", [])):
                    finish = time.perf_counter()
                if any(c.get("delta", {}).get("content") for c in chunk.get("choices", [])):
                    first = first or time.perf_counter()
                    pieces += 1
    ended = time.perf_counter()
    if http is None:
        client.close()
    return {"wall_ms": (ended - started) * 1000, "ttft_ms": ((first or ended) - started) * 1000, "pieces": pieces,
            "finish_to_end_ms": (ended - (finish or ended)) * 1000, "usage": usage,
            "body": "".join(line + "\n" for line in lines).encode()}


class Replay:
    """A local server that answers every request with one recorded stream at once: the engine's latency gone,
    what is left of a request's time is the client's (and HTTP's) own."""

    def __init__(self, body: bytes, model: str):
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *_args) -> None:
                pass

            def _send(self, kind: str, data: bytes) -> None:
                # one write, head and body: two would meet Nagle and the client's delayed ACK (40 ms a request)
                head = f"HTTP/1.1 200 OK\r\nContent-Type: {kind}\r\nContent-Length: {len(data)}\r\n\r\n"
                self.wfile.write(head.encode() + data)

            def do_GET(self) -> None:
                self._send("application/json", json.dumps({"data": [{"id": model}]}).encode())

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("content-length", 0)))
                self._send("text/event-stream", body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.base = f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def hearth_overhead(body: bytes, messages: list[dict], model: str, front: Path, rounds: int = 30) -> dict:
    """Hearth's own cost, alone: the same recorded stream replayed ``rounds`` times to a raw httpx stream and
    to RemoteBackend turns (each storing its message and reply); medians of both, their difference."""
    from engine.api import RemoteBackend, RemoteServer, resolve_paths
    from engine.types import SamplingParams, Token, TurnRequest

    replay = Replay(body, model)
    try:
        with httpx.Client(timeout=60, trust_env=False) as http:
            raw = [raw_stream(replay.base, model, messages, 64, http) for _ in range(rounds)]
        backend = RemoteBackend(resolve_paths(front / "replay").ensure(), RemoteServer("replay", replay.base), None,
                                model=model)
        backend.conversations.ensure("r", messages[0]["content"] if messages[0]["role"] == "system" else "")
        backend.load()
        turns, tokens = [], 0
        for i in range(rounds):
            got: list[Token] = []
            started = time.perf_counter()
            backend.run_turn(TurnRequest("r", f"question {i}", SamplingParams.greedy_params(), 64),
                             lambda e, got=got: got.append(e) if isinstance(e, Token) else None)
            turns.append((time.perf_counter() - started) * 1000)
            tokens = len(got)
        backend.close()
    finally:
        replay.close()
    raw_ms, turn_ms = statistics.median(r["wall_ms"] for r in raw), statistics.median(turns)
    return {"rounds": rounds, "streamed_tokens": tokens, "raw_ms": round(raw_ms, 3), "turn_ms": round(turn_ms, 3),
            "hearth_ms": round(turn_ms - raw_ms, 3), "hearth_ms_per_token": round((turn_ms - raw_ms) / max(1, tokens), 4)}


def run_engine(name: str, server: Server, model: str, system: str, turns: int, max_tokens: int, front: Path) -> dict:
    from engine.api import RemoteRegistry, open_conversations, open_remote, resolve_paths
    from engine.types import SamplingParams, Token, TurnRequest

    server.start(free_port())
    base = f"http://127.0.0.1:{server.port}"
    try:
        paths = resolve_paths(front / name).ensure()
        RemoteRegistry(paths.data).add(name, base)
        backend = open_remote(paths, f"{name}/{model}", timeout_s=600)
        backend.load()
        convs = open_conversations(paths)
        convs.ensure("bench", system)
        http = httpx.Client(timeout=600, trust_env=False)
        rows = []
        for i in range(turns):
            question = QUESTIONS[i % len(QUESTIONS)]
            messages = convs.chat_messages("bench") + [{"role": "user", "content": question}]
            raw_stream(base, model, messages, max_tokens, http)  # warms the prefix cache as the turn will find it
            raw = raw_stream(base, model, messages, max_tokens, http)
            pieces: list[Token] = []
            last = [0.0]  # when the last token came out of the backend

            def sink(e, got=pieces, last=last) -> None:
                if isinstance(e, Token):
                    got.append(e)
                    last[0] = time.perf_counter()

            started = time.perf_counter()
            done = backend.run_turn(TurnRequest("bench", question, SamplingParams.greedy_params(), max_tokens), sink)
            ended = time.perf_counter()
            wall = (ended - started) * 1000
            overhead = wall - raw["wall_ms"]
            last_body, last_messages = raw["body"], messages
            rows.append({"turn": i + 1, "prompt_tokens": done.prompt_tokens, "cached_tokens": done.server_cached_tokens,
                         "ttft_ms": round(done.timings.ttft_ms, 2), "raw_ttft_ms": round(raw["ttft_ms"], 2),
                         "wall_ms": round(wall, 2), "raw_wall_ms": round(raw["wall_ms"], 2),
                         "streamed": len(pieces), "hearth_ms": round(overhead, 2),
                         "ttft_delta_ms": round(done.timings.ttft_ms - raw["ttft_ms"], 2),
                         "raw_finish_to_end_ms": round(raw["finish_to_end_ms"], 1),
                         "turn_last_token_to_end_ms": round((ended - (last[0] or ended)) * 1000, 1), "raw_usage": raw["usage"],
                         "hearth_ms_per_token": round(overhead / max(1, len(pieces)), 3)})
            r = rows[-1]
            cached = "not reported" if r["cached_tokens"] is None else r["cached_tokens"]
            print(f"{name:>9} turn {r['turn']}: {r['prompt_tokens']:>5} prompt tokens, cached {cached}, "
                  f"TTFT {r['ttft_ms']:.0f} ms (raw {r['raw_ttft_ms']:.0f}), Hearth adds {r['hearth_ms']:+.1f} ms "
                  f"({r['hearth_ms_per_token']:+.2f} ms/token over {r['streamed']}); raw: finish chunk to stream end "
                  f"{r['raw_finish_to_end_ms']:.0f} ms (turn: last token to end {r['turn_last_token_to_end_ms']:.0f} ms), "
                  f"usage {'sent' if r['raw_usage'] else 'not sent'}", flush=True)
        backend.close()
        convs.close()
        http.close()
        isolated = hearth_overhead(last_body, last_messages, model, front / name)
        print(f"{name:>9} replayed: a raw stream takes {isolated['raw_ms']:.2f} ms, a RemoteBackend turn "
              f"{isolated['turn_ms']:.2f} ms: Hearth adds {isolated['hearth_ms']:.2f} ms a turn, "
              f"{isolated['hearth_ms_per_token']:.3f} ms a token ({isolated['streamed_tokens']} tokens)", flush=True)
        return {"turns": rows, "replayed": isolated}
    finally:
        server.stop()


def llama_available(peer: Path) -> str | None:
    """None when the peer venv can run llama.cpp's server; else why not, in words."""
    if not peer.exists():
        return f"no peer venv at {peer.parent.parent}"
    probe = subprocess.run([str(peer), "-c", "import llama_cpp.server.app"], capture_output=True, text=True)
    if probe.returncode != 0:
        return ("llama-cpp-python's server extras (uvicorn, fastapi …) are not installed in the peer venv "
                f"(bench/peer.py --server-extras, or this bench's --server-extras, installs them): "
                f"{(probe.stderr.strip().splitlines() or ['?'])[-1]}")
    return None


def main(argv: list[str] | None = None) -> int:
    from engine.model.fetch import default_model

    cache = Path(os.environ.get("HEARTH_TEST_CACHE", ROOT / ".test-cache"))
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data-dir", type=Path, default=cache / "home", help="holds models/ and converted/")
    ap.add_argument("--system-tokens", type=int, default=4000)
    ap.add_argument("--turns", type=int, default=6)
    ap.add_argument("--max-tokens", type=int, default=24)
    ap.add_argument("--peer-python", type=Path, default=PEER_PYTHON, help="the peer venv's python (llama-cpp-python)")
    ap.add_argument("--server-extras", action="store_true",
                    help="install llama-cpp-python's server dependencies into the peer venv first (no rebuild)")
    args = ap.parse_args(argv)
    entry = default_model()
    gguf = args.data_dir / "models" / entry.filename
    if not gguf.is_file():
        raise SystemExit(f"{gguf} is missing: run 'hearth-cli model fetch --data-dir {args.data_dir}' first")
    if args.server_extras and args.peer_python.exists():
        ensure_server_extras(args.peer_python)
    load_before = os.getloadavg()
    print(f"load average before: {' '.join(f'{x:.2f}' for x in load_before)} ({os.cpu_count()} CPUs; a shared "
          "machine: timings are noisy)", flush=True)
    started = time.perf_counter()
    system = tool_descriptions(args.system_tokens)
    results: dict[str, object] = {}
    skipped: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="hearth-remote-bench-") as tmp:
        home = shared_home(args.data_dir, Path(tmp) / "peer")
        engines = {"hearth": hearth_server(home, entry.key)}
        why = llama_available(args.peer_python)
        if why is None:
            engines["llamacpp"] = llama_server(args.peer_python, gguf, entry.key)
        else:
            skipped["llamacpp"] = why
            print(f"llama.cpp's server skipped: {why}")
        for name, server in engines.items():
            try:
                results[name] = run_engine(name, server, entry.key, system, args.turns, args.max_tokens, Path(tmp))
            except RuntimeError as exc:  # the server did not start: say why, measure the others
                skipped[name] = f"{server.name} did not run: {exc}"
                print(f"{name} skipped: {skipped[name]}", flush=True)
    summary = {}
    for name, result in results.items():
        rows = result["turns"]
        warm = rows[1:] or rows  # the first turn's cold prefill is the engine's, and noisy
        cached = [r["cached_tokens"] for r in warm]
        summary[name] = {"cached_tokens": "not reported" if all(c is None for c in cached) else cached,
                         "median_hearth_ms": statistics.median(r["hearth_ms"] for r in warm),
                         "median_hearth_ms_per_token": statistics.median(r["hearth_ms_per_token"] for r in warm),
                         "median_ttft_ms": statistics.median(r["ttft_ms"] for r in warm),
                         "replayed": result["replayed"]}
        print(f"{name}: median over turns 2+: TTFT {summary[name]['median_ttft_ms']:.0f} ms; against the live engine "
              f"the turn took {summary[name]['median_hearth_ms']:+.2f} ms more than the raw stream (engine noise "
              "included); replayed, Hearth adds " f"{result['replayed']['hearth_ms']:.2f} ms a turn; cached tokens "
              f"{summary[name]['cached_tokens']}")
    out = ROOT / "bench" / "results" / "remote.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"machine": platform.platform(), "cpus": os.cpu_count(), "model": entry.key,
                               "load_before": load_before, "load_after": os.getloadavg(),
                               "wall_s": round(time.perf_counter() - started, 1), "noisy_shared_machine": True,
                               "system_tokens": args.system_tokens, "turns": results, "summary": summary,
                               "skipped": skipped}, indent=1))
    print(f"wrote {out}; load average before {load_before[0]:.2f}, after {os.getloadavg()[0]:.2f}; "
          f"{time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
