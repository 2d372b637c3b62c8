"""Local-server benchmark (not a test): an agent-shaped workload against Hearth's server and llama.cpp's,
in one run, on the same GGUF.

    python bench/server.py [--data-dir .test-cache/home] [--system-tokens 6000] [--requests 10]
                           [--restart-after 5] [--max-tokens 16]

A long system prompt (tool descriptions, ~6,000 tokens) and then ``--requests`` chat requests, each
resending the whole growing conversation (the previous reply and a new user message appended), as a
coding agent does. After request ``--restart-after`` each server is stopped and started again. For
every request the time to first token is measured through the streaming API (from sending the request
to the first content chunk), for:

  hearth     ``hearth-cli serve`` on the default model (its prompt cache is saved to disk, verified);
  llama.cpp  ``python -m llama_cpp.server`` from llama-cpp-python (bench/.peer-venv, built by
             bench/peer.py) with its prompt cache on, same GGUF, same context and threads.

Both run greedy on the CPU with 2 threads. Prints a table with the ratios and writes
bench/results/server.json. The goal (issue 17): after the restart Hearth's TTFT ≥ 20× lower than
llama.cpp's, which must read everything again; before it, no worse.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from peer import ensure_peer, ensure_server_extras, this_cpu  # noqa: E402
from resume import paragraph  # noqa: E402

THREADS = 2
CONTEXT = 8192


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tool_descriptions(tokens: int) -> str:
    """A system prompt of about ``tokens`` tokens: an agent's instructions and tool descriptions."""
    parts = ["You are a coding agent. You can call these tools; answer with one tool call at a time."]
    i = 0
    while len(" ".join(parts)) < tokens * 4.2:  # ≈ 4 characters a token for this text
        parts.append(f"Tool {i}: tool_{i}(path, query, limit). {paragraph(i, 40)}")
        i += 1
    return "\n".join(parts)


class Server:
    """One server process: started, waited for, stopped with SIGTERM (then SIGKILL)."""

    def __init__(self, name: str, command, env: dict | None = None):
        """``command(port)``: the command line that serves on ``port``."""
        self.name, self.command, self.env = name, command, env
        self.proc: subprocess.Popen | None = None

    def start(self, port: int) -> None:
        self.port = port
        # Its log goes to a file: a pipe nobody reads fills up and stalls a chatty server (llama.cpp's).
        # Appending (O_APPEND): the child shares the file's offset, so reading back (log_since) must not move
        # where it writes.
        self.log = tempfile.TemporaryFile(mode="a+")
        self.proc = subprocess.Popen(self.command(port), env={**os.environ, **(self.env or {})}, cwd=ROOT,
                                     stdout=subprocess.DEVNULL, stderr=self.log, text=True)
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.log.seek(0)
                raise RuntimeError(f"{self.name} exited ({self.proc.returncode}): {self.log.read()[-1500:]}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(0.3)
        raise RuntimeError(f"{self.name} did not start in 300 s")

    def log_since(self, offset: int) -> tuple[str, int]:
        """What the server logged after ``offset`` (of this start's log), and the offset it ends at."""
        self.log.flush()
        self.log.seek(offset)
        text = self.log.read()
        return text, self.log.tell()

    def stop(self) -> None:
        if self.proc is None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc = None


def shared_home(data_dir: Path, home: Path) -> Path:
    """``home`` as a new data dir that links ``data_dir``'s models and conversions (nothing else shared)."""
    home.mkdir(parents=True, exist_ok=True)
    for sub in ("models", "converted"):
        (home / sub).symlink_to(data_dir.resolve() / sub)
    return home


def hearth_server(home: Path, model: str) -> Server:
    """``hearth-cli serve`` on ``model`` with its data (the prompt cache on disk) in ``home``."""
    return Server("hearth", lambda port: [sys.executable, "-m", "engine.cli", "serve", "--data-dir", str(home),
                                          "--model", model, "--port", str(port)])


def llama_server(peer: Path, gguf: Path, alias: str) -> Server:
    """llama-cpp-python's server on ``gguf`` with its prompt cache on (in RAM: a restart empties it)."""
    return Server("llama.cpp", lambda port: [
        str(peer), "-m", "llama_cpp.server", "--model", str(gguf), "--n_ctx", str(CONTEXT),
        "--n_threads", str(THREADS), "--n_threads_batch", str(THREADS), "--cache", "true",
        "--host", "127.0.0.1", "--port", str(port), "--model_alias", alias])


def ensure_peer_server() -> Path:
    """The peer venv's python with llama-cpp-python's ``[server]`` extras (FastAPI, uvicorn …), which
    bench/peer.py's in-process worker does not need."""
    return ensure_server_extras(ensure_peer(this_cpu()[1]))


def stream_ttft(port: int, model: str, messages: list[dict], max_tokens: int) -> tuple[float, str, dict]:
    """(seconds to the first content chunk, the whole reply, the last chunk's extras) of one request."""
    body = json.dumps({"model": model, "messages": messages, "max_tokens": max_tokens, "temperature": 0,
                       "stream": True, "stream_options": {"include_usage": True}}).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", data=body,
                                     headers={"Content-Type": "application/json"})
    started = time.perf_counter()
    first, text, extra = None, [], {}
    with urllib.request.urlopen(request, timeout=600) as resp:
        extra["x_hearth_cache"] = resp.headers.get("X-Hearth-Cache")
        for raw in resp:
            line = raw.decode().strip()
            if not line.startswith("data:") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[5:])
            for choice in chunk.get("choices", []):
                piece = (choice.get("delta") or {}).get("content")
                if piece:
                    first = first or time.perf_counter()
                    text.append(piece)
            if chunk.get("usage"):
                extra["usage"] = chunk["usage"]
            if chunk.get("hearth"):
                extra["hearth"] = chunk["hearth"]
    end = first or time.perf_counter()
    return end - started, "".join(text), extra


def run_workload(server: Server, model: str, system: str, requests: int, restart_after: int,
                 max_tokens: int) -> list[dict]:
    messages = [{"role": "system", "content": system}]
    rows = []
    server.start(free_port())
    try:
        for i in range(requests):
            if i == restart_after:
                server.stop()
                server.start(free_port())
            messages.append({"role": "user", "content": f"Step {i}: {paragraph(100 + i, 30)} Which tool next?"})
            ttft, reply, extra = stream_ttft(server.port, model, messages, max_tokens)
            messages.append({"role": "assistant", "content": reply})
            usage = extra.get("usage") or {}
            rows.append({"request": i + 1, "ttft_s": ttft, "prompt_tokens": usage.get("prompt_tokens"),
                         "cached_tokens": (usage.get("prompt_tokens_details") or {}).get("cached_tokens"),
                         "source": (extra.get("hearth") or {}).get("source") or extra.get("x_hearth_cache"),
                         "after_restart": i >= restart_after})
            print(f"{server.name:>9} request {i + 1}: TTFT {ttft * 1000:.0f} ms, {usage.get('prompt_tokens')} prompt "
                  f"tokens, cached {rows[-1]['cached_tokens']}, source {rows[-1]['source']}", file=sys.stderr)
    finally:
        server.stop()
    return rows


def main(argv: list[str] | None = None) -> int:
    from engine.model.fetch import default_model

    cache = Path(os.environ.get("HEARTH_TEST_CACHE", ROOT / ".test-cache"))
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data-dir", type=Path, default=cache / "home", help="holds models/ and converted/")
    ap.add_argument("--system-tokens", type=int, default=6000)
    ap.add_argument("--requests", type=int, default=10)
    ap.add_argument("--restart-after", type=int, default=5)
    ap.add_argument("--max-tokens", type=int, default=16)
    args = ap.parse_args(argv)
    entry = default_model()
    gguf = args.data_dir / "models" / entry.filename
    if not gguf.is_file():
        raise SystemExit(f"{gguf} is missing: run 'hearth-cli model fetch --data-dir {args.data_dir}' first")
    peer = ensure_peer_server()
    system = tool_descriptions(args.system_tokens)
    with tempfile.TemporaryDirectory(prefix="hearth-server-bench-") as tmp:
        home = shared_home(args.data_dir, Path(tmp))
        hearth, llama = hearth_server(home, entry.key), llama_server(peer, gguf, entry.key)
        results = {}
        for server in (hearth, llama):
            results[server.name] = run_workload(server, entry.key, system, args.requests, args.restart_after,
                                                args.max_tokens)
    print(f"\n{'request':>7} {'prompt tok':>10} {'hearth TTFT ms':>15} {'source':>8} {'llama.cpp TTFT ms':>18} "
          f"{'llama.cpp / hearth':>18}")
    table = []
    for h, p in zip(results["hearth"], results["llama.cpp"], strict=True):
        ratio = p["ttft_s"] / h["ttft_s"] if h["ttft_s"] else float("inf")
        table.append({"request": h["request"], "prompt_tokens": h["prompt_tokens"], "hearth_ms": h["ttft_s"] * 1000,
                      "hearth_source": h["source"], "hearth_cached": h["cached_tokens"],
                      "llama_ms": p["ttft_s"] * 1000, "llama_cached": p["cached_tokens"], "ratio": ratio,
                      "after_restart": h["after_restart"]})
        mark = " (after restart)" if h["request"] == args.restart_after + 1 else ""
        print(f"{h['request']:>7} {h['prompt_tokens'] or 0:>10} {h['ttft_s'] * 1000:>15.0f} {h['source'] or '':>8} "
              f"{p['ttft_s'] * 1000:>18.0f} {ratio:>17.1f}×{mark}")
    out = ROOT / "bench" / "results" / "server.json"
    out.parent.mkdir(parents=True, exist_ok=True)  # git-ignored: absent in a fresh checkout
    out.write_text(json.dumps({"machine": platform.platform(), "cpus": os.cpu_count(), "threads": THREADS,
                               "model": entry.key, "system_tokens": args.system_tokens, "requests": table,
                               "raw": results}, indent=1))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
