"""Agent-loop benchmark (not a test): tool calls through the OpenAI and the Anthropic APIs on Hearth's server,
and llama.cpp's server on the same GGUF reading the same prompt text, with a restart (issue 30).

    python bench/agent.py [--data-dir .test-cache/home] [--requests 20] [--restart-after 10]
                          [--system-tokens 6000] [--result-tokens 300] [--api openai|anthropic|both]
                          [--model NAME] [--no-peer] [--quick]

The loop an agent runs: a system prompt (instructions, ~``--system-tokens`` tokens with the 10 tool schemas
the template renders), a task, then ``--requests`` requests, each resending the whole conversation with
``tool_choice`` required (so the reply is a call), then appending the model's call and a tool result (a
few hundred tokens of text, fewer when the model's context cannot hold them all). After request
``--restart-after`` the server is stopped (SIGTERM) and started again. Streamed, greedy, through the
official clients: ``openai`` (``/v1/chat/completions``) and ``anthropic`` (``/v1/messages``, with
``cache_control`` breakpoints on the system prompt and the newest message, as agent CLIs send them).

llama.cpp's server (llama-cpp-python's, bench/.peer-venv, as bench/server.py runs it) gets, for every
request of the first API's run, the prompt text Hearth's template renders for it (``engine.api.
render_prompt``, what ``hearth-cli render`` prints) on ``/v1/completions``, streamed, its prompt cache on,
writing as many tokens as Hearth's call took: both read identical text. Its reused tokens come from its log.

Per request: TTFT (to the first streamed piece of the reply; Hearth sends a tool call once it is whole,
so for Hearth this is the time to the whole call), the time to the end of the call, prompt tokens,
cached tokens (``usage.prompt_tokens_details.cached_tokens`` / ``cache_read_input_tokens``), and the
check "cached ≥ the previous prompt minus the template's tail" (the tail: the previous prompt's tokens
past its common prefix with this one). Prints a table and writes bench/results/agent.json.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import re
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # the engine first: bench/engine.py (on the path as this script's folder) would hide it

from engine.api import HearthPaths, inspect_model_file, render_prompt, resolve_model_file  # noqa: E402
from engine.model.fetch import default_model  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/'s modules (they reorder the path again)

from resume import paragraph  # noqa: E402
from server import (  # noqa: E402
    CONTEXT,
    THREADS,
    Server,
    ensure_peer_server,
    free_port,
    hearth_server,
    llama_server,
    shared_home,
    tool_descriptions,
)

log = logging.getLogger("bench.agent")
MAX_TOKENS = 160  # a call to one of these tools is 30–80 tokens
CALL_ROOM = 64  # tokens a round adds besides its tool result: the call and the turns' markup (≈60 measured)
HIT = re.compile(r"Llama\.generate: (\d+) prefix-match hit, remaining (\d+) prompt tokens")


def _fn(name: str, description: str, properties: dict, required: list[str]) -> dict:
    return {"type": "function", "function": {"name": name, "description": description, "parameters": {
        "type": "object", "properties": properties, "required": required, "additionalProperties": False}}}


# Ten tools of a coding agent, their schemas of every shape: enums, bounded numbers, arrays, nested objects.
TOOLS = [
    _fn("read_file", "Read a file of the repository.",
        {"path": {"type": "string"}, "start_line": {"type": "integer", "minimum": 1},
         "end_line": {"type": "integer", "minimum": 1}}, ["path"]),
    _fn("write_file", "Write a file of the repository.", {"path": {"type": "string"}, "text": {"type": "string"}},
        ["path", "text"]),
    _fn("search_code", "Search the repository's text.",
        {"query": {"type": "string"}, "limit": {"type": "integer", "minimum": 1, "maximum": 50},
         "regex": {"type": "boolean"}}, ["query"]),
    _fn("list_dir", "List a folder.", {"path": {"type": "string"}, "depth": {"type": "integer", "minimum": 0,
                                                                            "maximum": 3}}, ["path"]),
    _fn("run_tests", "Run tests.", {"paths": {"type": "array", "items": {"type": "string"}, "maxItems": 8},
                                    "verbose": {"type": "boolean"}}, ["paths"]),
    _fn("run_command", "Run a shell command.",
        {"command": {"type": "string"}, "timeout_s": {"type": "number", "minimum": 1, "maximum": 600}},
        ["command"]),
    _fn("git", "Run a git subcommand.",
        {"action": {"type": "string", "enum": ["status", "diff", "log", "commit"]},
         "message": {"type": "string"}}, ["action"]),
    _fn("edit_file", "Replace text in a file.",
        {"path": {"type": "string"}, "edit": {"type": "object", "properties": {
            "old": {"type": "string"}, "new": {"type": "string"}}, "required": ["old", "new"],
            "additionalProperties": False}}, ["path", "edit"]),
    _fn("http_get", "Fetch a documentation page.", {"url": {"type": "string"}}, ["url"]),
    _fn("ask_user", "Ask the user a question.",
        {"question": {"type": "string"}, "choices": {"type": "array", "items": {"type": "string"}, "maxItems": 4}},
        ["question"]),
]
TASK = "The tests in tests/test_parser.py fail since the last change. Find out why and fix it, one tool call at a time."


def anthropic_tools(tools: list[dict]) -> list[dict]:
    return [{"name": t["function"]["name"], "description": t["function"]["description"],
             "input_schema": t["function"]["parameters"]} for t in tools]


@dataclass
class Row:
    """One request's measurements."""

    request: int
    ttft_ms: float
    call_ms: float
    prompt_tokens: int | None
    cached_tokens: int | None
    floor_tokens: int | None = None  # the previous prompt minus the template's tail (None: request 1)
    rendered_tokens: int | None = None  # what engine.api.render_prompt counts for the same messages
    source: str | None = None  # Hearth's: where the context came from (live, disk, …)
    restore_ms: float | None = None  # Hearth's: reading saved context from disk
    written_tokens: int | None = None  # Anthropic's cache_creation_input_tokens
    completion_tokens: int | None = None
    after_restart: bool = False
    call: dict = field(default_factory=dict)

    @property
    def ok(self) -> bool | None:
        if self.floor_tokens is None or self.cached_tokens is None:
            return None
        return self.cached_tokens >= self.floor_tokens


class Prompts:
    """The prompt text and token ids Hearth's template renders for OpenAI-shaped messages: what both servers
    read, and the common prefixes the check compares with."""

    def __init__(self, paths: Any, model: str, gguf: Path):
        from engine.model.gguf_file import GGUFModel
        from engine.text.tokenizer import Tokenizer

        self.paths, self.model = paths, model
        self.tokenizer = Tokenizer.from_gguf(GGUFModel(gguf))

    def text(self, messages: list[dict], tools: list[dict] = TOOLS) -> str:
        return render_prompt(self.paths, self.model, messages, tools).prompt

    def ids(self, messages: list[dict]) -> list[int]:
        return self.tokenizer.encode(self.text(messages))

    def tokens(self, text: str) -> int:
        return len(self.tokenizer.encode(text))


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def system_prompt(prompts: Prompts, tokens: int) -> str:
    """Instructions making the first prompt (with the tools and the task) about ``tokens`` tokens long."""
    def first(system: str) -> int:
        return len(prompts.ids([{"role": "system", "content": system}, {"role": "user", "content": TASK}]))

    base = first("")
    target = max(tokens - base, 16)
    text = tool_descriptions(target)
    for _ in range(4):  # tool_descriptions aims by characters: correct it by what the tokenizer says
        got = prompts.tokens(text)
        if abs(got - target) <= target // 50:
            break
        text = tool_descriptions(max(int(target * target / max(got, 1)), 16))
    return text


def tool_result(prompts: Prompts, name: str, i: int, tokens: int) -> str:
    """What a tool printed: about ``tokens`` tokens of text."""
    head = f"{name} finished (exit 0). Output {i}:\n"
    words = max(tokens * 3 // 4, 4)
    text = head + paragraph(300 + i, words)
    got = prompts.tokens(text)
    if got > tokens:
        text = head + paragraph(300 + i, max(words * tokens // got, 4))
    return text


# the two APIs on Hearth's server --------------------------------------------------------------------------
class OpenAIAgent:
    """The loop through ``openai``: messages kept in OpenAI's shape (also the mirror llama.cpp replays)."""

    name = "openai"

    def __init__(self, model: str, system: str):
        self.model = model
        self.messages: list[dict] = [{"role": "system", "content": system}, {"role": "user", "content": TASK}]

    def mirror(self) -> list[dict]:
        """The messages as the engine renders them (a call-only turn's content is "")."""
        return [dict(m, content=m["content"] or "") for m in self.messages]

    def ask(self, port: int) -> tuple[Row, dict]:
        import openai

        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="hearth-bench", max_retries=0,
                               timeout=900)
        started = time.perf_counter()
        first = done = None
        calls: dict[int, dict] = {}
        usage, extra = None, {}
        stream = client.chat.completions.create(
            model=self.model, messages=self.messages, tools=TOOLS, tool_choice="required", parallel_tool_calls=False,
            stream=True, stream_options={"include_usage": True}, max_tokens=MAX_TOKENS, temperature=0)
        for chunk in stream:
            now = time.perf_counter()
            if chunk.usage is not None:
                usage = chunk.usage
            extra.update((chunk.model_extra or {}).get("hearth") or {})
            for choice in chunk.choices:
                delta = choice.delta
                if delta.content or delta.tool_calls or (delta.model_extra or {}).get("reasoning_content"):
                    first = first or now
                for tc in delta.tool_calls or []:
                    call = calls.setdefault(tc.index, {"id": None, "name": "", "arguments": ""})
                    call["id"] = tc.id or call["id"]
                    if tc.function is not None:
                        call["name"] += tc.function.name or ""
                        call["arguments"] += tc.function.arguments or ""
                if choice.finish_reason:
                    done = now
        if not calls:
            raise RuntimeError(f"request {len(self.messages)}: no tool call came back (tool_choice required)")
        call = calls[min(calls)]
        self.messages.append({"role": "assistant", "content": None, "tool_calls": [{
            "id": call["id"], "type": "function", "function": {"name": call["name"], "arguments": call["arguments"]}}]})
        details = getattr(usage, "prompt_tokens_details", None)
        row = Row(0, ((first or done or now) - started) * 1000, ((done or now) - started) * 1000,
                  usage.prompt_tokens if usage else None, getattr(details, "cached_tokens", None),
                  source=extra.get("source"), restore_ms=extra.get("restore_ms"),
                  completion_tokens=usage.completion_tokens if usage else None, call=call)
        return row, call

    def add_result(self, call: dict, text: str) -> None:
        self.messages.append({"role": "tool", "tool_call_id": call["id"], "content": text})


class AnthropicAgent:
    """The loop through ``anthropic``: Anthropic's shape on the wire, an OpenAI-shaped mirror for the check."""

    name = "anthropic"

    def __init__(self, model: str, system: str):
        self.model, self.system = model, system
        self.messages: list[dict] = [{"role": "user", "content": [{"type": "text", "text": TASK}]}]
        self.openai_shaped: list[dict] = [{"role": "system", "content": system}, {"role": "user", "content": TASK}]

    def mirror(self) -> list[dict]:
        return [dict(m) for m in self.openai_shaped]

    def _wire_messages(self) -> list[dict]:
        """The messages with one breakpoint on the newest block (an agent CLI's rolling cache point)."""
        out = [dict(m, content=[dict(b) for b in m["content"]]) for m in self.messages]
        out[-1]["content"][-1]["cache_control"] = {"type": "ephemeral"}
        return out

    def ask(self, port: int) -> tuple[Row, dict]:
        import anthropic

        client = anthropic.Anthropic(base_url=f"http://127.0.0.1:{port}", api_key="hearth-bench", max_retries=0,
                                     timeout=900)
        started = time.perf_counter()
        first = None
        with client.messages.stream(
                # anthropic 2.x has no sampling parameters: greedy goes in the raw body, as older clients sent it
                model=self.model, max_tokens=MAX_TOKENS, extra_body={"temperature": 0},
                system=[{"type": "text", "text": self.system, "cache_control": {"type": "ephemeral"}}],
                messages=self._wire_messages(), tools=anthropic_tools(TOOLS),
                tool_choice={"type": "any", "disable_parallel_tool_use": True}) as stream:
            for event in stream:
                if event.type in ("content_block_start", "content_block_delta") and first is None:
                    first = time.perf_counter()
            message = stream.get_final_message()
        done = time.perf_counter()
        uses = [b for b in message.content if b.type == "tool_use"]
        if not uses:
            raise RuntimeError(f"request {len(self.messages)}: no tool_use block came back (tool_choice any)")
        use = uses[0]
        call = {"id": use.id, "name": use.name, "arguments": json.dumps(use.input, ensure_ascii=False)}
        self.messages.append({"role": "assistant", "content": [
            {"type": "tool_use", "id": use.id, "name": use.name, "input": use.input}]})
        self.openai_shaped.append({"role": "assistant", "content": "", "tool_calls": [{
            "id": use.id, "type": "function", "function": {"name": use.name, "arguments": call["arguments"]}}]})
        u = message.usage
        read, written = u.cache_read_input_tokens or 0, u.cache_creation_input_tokens or 0
        row = Row(0, ((first or done) - started) * 1000, (done - started) * 1000, u.input_tokens + read + written,
                  read, written_tokens=written, completion_tokens=u.output_tokens, call=call)
        return row, call

    def add_result(self, call: dict, text: str) -> None:
        self.messages.append({"role": "user", "content": [{"type": "tool_result", "tool_use_id": call["id"],
                                                           "content": text}]})
        self.openai_shaped.append({"role": "tool", "tool_call_id": call["id"], "content": text})


def run_hearth(agent: OpenAIAgent | AnthropicAgent, server: Server, prompts: Prompts, requests: int,
               restart_after: int, result_tokens: int) -> tuple[list[Row], list[list[dict]]]:
    """The loop on one Hearth server; the OpenAI-shaped messages of every request (for llama.cpp)."""
    rows: list[Row] = []
    sent: list[list[dict]] = []
    previous: list[int] | None = None
    server.start(free_port())
    try:
        for i in range(requests):
            if i == restart_after:
                server.stop()
                server.start(free_port())
            messages = agent.mirror()
            ids = prompts.ids(messages)
            row, call = agent.ask(server.port)
            row.request, row.after_restart, row.rendered_tokens = i + 1, i >= restart_after, len(ids)
            row.floor_tokens = None if previous is None else common_prefix(previous, ids)
            rows.append(row)
            sent.append(messages)
            previous = ids
            log.info("%s request %d: TTFT %.0f ms, call %.0f ms, prompt %s, cached %s (floor %s), %s(%s)",
                     agent.name, i + 1, row.ttft_ms, row.call_ms, row.prompt_tokens, row.cached_tokens,
                     row.floor_tokens, call["name"], call["arguments"][:60])
            agent.add_result(call, tool_result(prompts, call["name"], i, result_tokens))
    finally:
        server.stop()
    return rows, sent


# llama.cpp's server on the same text ------------------------------------------------------------------------
def llama_request(port: int, prompt: str, max_tokens: int, banned: list[int]) -> tuple[float, float, int]:
    """(ms to the first text, ms to the end, chunks of text) of one streamed /v1/completions request.
    ``banned``: the end-of-turn ids, so it writes all ``max_tokens`` (as many as Hearth's call took)."""
    body = json.dumps({"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True,
                       "cache_prompt": True, "logit_bias": {str(t): -100 for t in banned}}).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=body,
                                     headers={"Content-Type": "application/json"})
    started = time.perf_counter()
    first = finished = None
    pieces = 0
    with urllib.request.urlopen(request, timeout=900) as resp:
        for raw in resp:
            line = raw.decode().strip()
            if not line.startswith("data:") or line == "data: [DONE]":
                continue
            for choice in json.loads(line[5:]).get("choices", []):
                if choice.get("text"):
                    first = first or time.perf_counter()
                    pieces += 1
                if choice.get("finish_reason"):  # the reply's end: its prompt-cache save comes after, untimed
                    finished = finished or time.perf_counter()
    end = finished or time.perf_counter()
    return ((first or end) - started) * 1000, (end - started) * 1000, pieces


def run_llama(server: Server, prompts: Prompts, sent: list[list[dict]], hearth_rows: list[Row],
              restart_after: int) -> list[Row]:
    rows: list[Row] = []
    previous: list[int] | None = None
    server.start(free_port())
    offset = 0
    try:
        for i, (messages, h) in enumerate(zip(sent, hearth_rows, strict=True)):
            if i == restart_after:
                server.stop()
                server.start(free_port())
                offset = 0
            text = prompts.text(messages)
            ids = prompts.tokenizer.encode(text)
            ttft, end, pieces = llama_request(server.port, text, max(h.completion_tokens or 1, 1),
                                              sorted(prompts.tokenizer.specials.stop))
            logged, offset = server.log_since(offset)
            hits = HIT.findall(logged)
            cached = int(hits[-1][0]) if hits else 0  # no line: it read the whole prompt
            total = int(hits[-1][0]) + int(hits[-1][1]) if hits else len(ids)
            rows.append(Row(i + 1, ttft, end, total, cached, None if previous is None else common_prefix(previous, ids),
                            len(ids), completion_tokens=pieces, after_restart=i >= restart_after))
            previous = ids
            log.info("llama.cpp request %d: TTFT %.0f ms, end %.0f ms, prompt %d, cached %d", i + 1, ttft, end,
                     total, cached)
    finally:
        server.stop()
    return rows


# the report ---------------------------------------------------------------------------------------------------
def ratio(a: float | None, b: float | None) -> float | None:
    return None if not a or not b else a / b


def table(results: dict[str, list[Row]], restart_after: int) -> list[str]:
    head = ["req", "prompt"]
    names = [n for n in results if n != "llama.cpp"]
    for n in names:
        head += [f"{n} cached", "≥ floor", f"{n} TTFT ms", f"{n} call ms"]
    peer = results.get("llama.cpp")
    if peer:
        head += ["llama.cpp cached", "llama.cpp TTFT ms", "llama.cpp call ms"]
        head += [f"TTFT ×({n})" for n in names] + [f"call ×({n})" for n in names]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]  # Markdown, as docs/benchmarks.md quotes it
    count = len(next(iter(results.values())))
    for i in range(count):
        first = next(iter(results.values()))[i]
        cells = [f"{i + 1}{' (restart)' if i == restart_after else ''}", f"{first.rendered_tokens or first.prompt_tokens}"]
        for n in names:
            r = results[n][i]
            cells += [f"{r.cached_tokens}", {True: "yes", False: "NO", None: "–"}[r.ok], f"{r.ttft_ms:.0f}",
                      f"{r.call_ms:.0f}"]
        if peer:
            p = peer[i]
            cells += [f"{p.cached_tokens}", f"{p.ttft_ms:.0f}", f"{p.call_ms:.0f}"]
            cells += [_times(ratio(p.ttft_ms, results[n][i].ttft_ms)) for n in names]
            cells += [_times(ratio(p.call_ms, results[n][i].call_ms)) for n in names]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _times(x: float | None) -> str:
    return "–" if x is None else f"{x:.1f}×"


def summary(results: dict[str, list[Row]], restart_after: int) -> dict:
    out: dict[str, Any] = {}
    peer = results.get("llama.cpp")
    for name, rows in results.items():
        if name == "llama.cpp":
            continue
        checked = [r for r in rows if r.ok is not None]
        info: dict[str, Any] = {"reuse_ok": all(r.ok for r in checked) and bool(checked),
                                "reuse_failed": [r.request for r in checked if not r.ok],
                                "reread_tokens": [None if r.prompt_tokens is None or r.cached_tokens is None
                                                  else r.prompt_tokens - r.cached_tokens for r in rows]}
        if peer and restart_after < len(rows):
            h, p = rows[restart_after], peer[restart_after]
            info["after_restart_ttft_ratio"] = ratio(p.ttft_ms, h.ttft_ms)
            info["after_restart_call_ratio"] = ratio(p.call_ms, h.call_ms)
            info["restart_goal_met"] = (info["after_restart_ttft_ratio"] or 0) >= 20
        out[name] = info
    return out


def main(argv: list[str] | None = None) -> int:
    cache = Path(os.environ.get("HEARTH_TEST_CACHE", ROOT / ".test-cache"))
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data-dir", type=Path, default=cache / "home", help="holds models/ and converted/")
    ap.add_argument("--model", default=None, help="a catalog model name (default: the default model)")
    ap.add_argument("--requests", type=int, default=20)
    ap.add_argument("--restart-after", type=int, default=10)
    ap.add_argument("--system-tokens", type=int, default=6000)
    ap.add_argument("--result-tokens", type=int, default=300, help="a tool result's length (shrunk to fit the context)")
    ap.add_argument("--api", choices=["openai", "anthropic", "both"], default="both")
    ap.add_argument("--no-peer", action="store_true", help="Hearth only (no llama.cpp)")
    ap.add_argument("--quick", action="store_true", help="a smoke run: 4 requests, a restart after 2, small prompts")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "agent.json")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    if args.quick:
        args.requests, args.restart_after, args.system_tokens, args.result_tokens = 4, 2, 800, 60
    model = args.model or default_model().key
    paths = HearthPaths(args.data_dir / "models", args.data_dir / "converted", args.data_dir,
                        args.data_dir / "checkpoints")
    gguf = resolve_model_file(paths, model)
    prompts = Prompts(paths, model, gguf)
    system = system_prompt(prompts, args.system_tokens)
    first = len(prompts.ids([{"role": "system", "content": system}, {"role": "user", "content": TASK}]))
    context = min(CONTEXT, int((inspect_model_file(gguf, "int4").config or {}).get("context_length", CONTEXT)))
    room = (context - first - MAX_TOKENS - 64) // max(args.requests, 1) - CALL_ROOM
    result_tokens = max(min(args.result_tokens, room), 16)
    if result_tokens < args.result_tokens:
        log.warning("tool results shrunk to %d tokens: %d rounds on a %d-token first prompt fit a %d-token context",
                    result_tokens, args.requests, first, context)
    apis = ["openai", "anthropic"] if args.api == "both" else [args.api]
    results: dict[str, list[Row]] = {}
    sent: list[list[dict]] = []
    with tempfile.TemporaryDirectory(prefix="hearth-agent-bench-") as tmp:
        for api in apis:  # each API on its own data dir: both start cold
            home = shared_home(args.data_dir, Path(tmp) / api)
            agent_type: Callable[..., OpenAIAgent | AnthropicAgent] = OpenAIAgent if api == "openai" else AnthropicAgent
            rows, messages = run_hearth(agent_type(model, system), hearth_server(home, model), prompts,
                                        args.requests, args.restart_after, result_tokens)
            results[f"hearth-{api}"] = rows
            sent = sent or messages
        if not args.no_peer:
            peer = ensure_peer_server()
            results["llama.cpp"] = run_llama(llama_server(peer, gguf, model), prompts, sent,
                                             results[f"hearth-{apis[0]}"], args.restart_after)
    lines = table(results, args.restart_after)
    print("\n".join(lines))
    report = summary(results, args.restart_after)
    print(json.dumps(report, indent=1))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({
        "machine": platform.platform(), "cpus": os.cpu_count(), "threads": THREADS, "load": os.getloadavg(),
        "model": model, "first_prompt_tokens": first, "result_tokens": result_tokens, "context": context,
        "requests": args.requests, "restart_after": args.restart_after, "summary": report,
        "rows": {name: [asdict(r) | {"ok": r.ok} for r in rows] for name, rows in results.items()},
        "table": lines}, indent=1))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
