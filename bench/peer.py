"""Hearth against llama.cpp in the same run (not a test): same GGUF, same token ids, same threads.

    python bench/peer.py [--data-dir DIR] [--model GGUF] [--sizes 512,2048] [--prefill 512,2048]
                         [--contexts 512,8192] [--repeats 2] [--threads N] [--weights int4]

llama.cpp runs through llama-cpp-python, which is no dependency of Hearth: the first run makes its own
venv (bench/.peer-venv) and compiles llama.cpp from source for this CPU (about 15 minutes on 2 cores),
keeping the wheel under bench/.peer-wheels/<cpu> so later runs only install it. Its side runs in a
worker process (bench/peer_worker.py) speaking JSON lines; Hearth's runs in this process. Hearth
tokenizes every prompt once and both engines get those ids.

Rows, each measured ``--repeats`` times, alternating the engines A/B/B/A so drift cancels (medians):
  prefill N     N tokens of fixed text from an empty cache (tok/s; the model load is not timed);
  decode @C     a chat conversation of about C tokens is prefilled once per engine, then 32 greedy
                steps (after 4 warm-up steps) from it, the cache cut back to it after each repeat;
  state @C      the same conversation's whole context saved to a new file and loaded back: Hearth's
                checkpoint (full save, fsynced; restore with full verification into reused buffers,
                as bench/resume.py) and llama.cpp's llama_state_save_file (+ an fsync) and
                llama_state_load_file; also llama.cpp's in-memory state copy out and back.
``--sizes`` sets both the prefill sizes and the contexts. Defaults: prefill 512 and 2,048, decode and
state at 512 and 8,192 tokens (the 8k prefill takes ~20 s in Hearth and ~70 s in llama.cpp on 2
cores, once per engine). A model Hearth cannot run (say an architecture it lacks) still runs on
llama.cpp's side, with a note saying why Hearth's is empty.
Prints a table with Hearth/llama.cpp per row and writes bench/results/peer.json.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from resume import conversation_of, paragraph  # noqa: E402  (bench/ is on the path above)

PEER_VERSION = "0.3.36"  # pinned: the llama.cpp it vendors is part of what the figures mean
PEER_VENV = ROOT / "bench" / ".peer-venv"
PEER_WHEELS = ROOT / "bench" / ".peer-wheels"
WORKER = ROOT / "bench" / "peer_worker.py"
# A CPU build for this machine: GGML_NATIVE compiles for the host's instruction set (so the wheel is
# kept per CPU); nothing else that llama-cpp-python could build is needed here.
CMAKE_ARGS = ("-DGGML_NATIVE=ON -DGGML_CUDA=OFF -DGGML_METAL=OFF -DGGML_BLAS=OFF -DGGML_VULKAN=OFF "
              "-DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF "
              "-DLLAMA_BUILD_MTMD=OFF -DLLAVA_BUILD=OFF")
DECODE_STEPS, DECODE_WARMUP = 32, 4
N_BATCH = 2048  # llama-bench's default (with n_ubatch 512)
PAUSE_S = 0.2  # between engines: let the other one's spinning threads go to sleep


# the peer venv --------------------------------------------------------------------------------------
def cpu_key() -> str:
    """A short name for this CPU's model and flags: a native build only runs where it was built."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
        text = "\n".join(sorted({ln for ln in lines if ln.startswith(("model name", "flags"))}))
    except OSError:
        text = platform.processor() or platform.machine()
    return f"{platform.machine()}-{hashlib.sha256(text.encode()).hexdigest()[:12]}"


def peer_python() -> Path:
    return PEER_VENV / "bin" / "python"


def peer_ready() -> bool:
    check = "import llama_cpp, sys; sys.exit(llama_cpp.__version__ != sys.argv[1])"
    return peer_python().exists() and subprocess.run([str(peer_python()), "-c", check, PEER_VERSION],
                                                     capture_output=True).returncode == 0


def ensure_peer() -> Path:
    """The peer venv's python with llama-cpp-python installed, compiling it once per CPU."""
    if peer_ready():
        return peer_python()
    if not peer_python().exists():
        subprocess.run([sys.executable, "-m", "venv", str(PEER_VENV)], check=True)
    wheels = PEER_WHEELS / cpu_key()
    wheel = sorted(wheels.glob(f"llama_cpp_python-{PEER_VERSION}-*.whl"))
    pip = [str(peer_python()), "-m", "pip", "--disable-pip-version-check"]
    if not wheel:
        print(f"compiling llama.cpp (llama-cpp-python {PEER_VERSION}) for this CPU; about 15 minutes on 2 cores",
              file=sys.stderr)
        env = {**os.environ, "CMAKE_ARGS": CMAKE_ARGS, "CMAKE_BUILD_PARALLEL_LEVEL": str(os.cpu_count() or 2)}
        started = time.perf_counter()
        subprocess.run(pip + ["wheel", "--no-deps", "-w", str(wheels), f"llama-cpp-python=={PEER_VERSION}"],
                       check=True, env=env)
        print(f"built in {time.perf_counter() - started:.0f} s", file=sys.stderr)
    subprocess.run(pip + ["install", "--quiet", "--find-links", str(wheels), f"llama-cpp-python=={PEER_VERSION}"],
                   check=True)
    if not peer_ready():
        raise SystemExit(f"llama-cpp-python {PEER_VERSION} did not install into {PEER_VENV}")
    return peer_python()


# the two engines ------------------------------------------------------------------------------------
class TextSide:
    """Hearth's tokenizer and chat template without its engine, for a model Hearth cannot run: the
    prompts stay the ids Hearth's engine would make (its own prompt code runs on this object)."""

    def __init__(self, gguf: Path):
        from engine.generation import Engine
        from engine.model.gguf_file import GGUFModel
        from engine.text.tokenizer import Tokenizer

        model = GGUFModel(gguf)
        self.tokenizer = Tokenizer.from_gguf(model)
        self.template = Engine.template_for(model, self.tokenizer)

    def render(self, messages: list[dict]) -> str:
        from engine.generation import Engine

        return Engine.render(self, messages)  # type: ignore[arg-type]

    def prompt_tokens(self, messages: list[dict]) -> list[int]:
        return self.encode_prompt(self.render(messages))

    def encode_prompt(self, text: str) -> list[int]:
        from engine.generation import Engine

        return Engine.encode_prompt(self, text)  # type: ignore[arg-type]


class HearthSide:
    name = "hearth"

    def __init__(self, engine: Any, workdir: Path):
        self.engine, self.workdir = engine, workdir
        self.session: Any = None
        self.prompt: list[int] = []
        self.picked: list[int] = []  # the greedy ids of the last decode
        self.logits: Any = None  # the last position's logits after ``fill``
        self.again: list[dict] = []
        self.store_dir = workdir

    def prefill(self, tokens: list[int]) -> float:
        self.engine.reset()
        start = time.perf_counter()
        self.engine.prefill(tokens)
        return time.perf_counter() - start

    def fill(self, messages: list[dict], again: list[dict], tag: str) -> list[int]:
        """Prefill the conversation through Hearth's sessions (so its checkpoint knows the context)."""
        from engine.checkpoint.store import CheckpointStore
        from engine.session import ChatSessions

        if self.session is not None:
            self.session.store.close()
        self.engine.reset()
        self.store_dir = self.workdir / f"hearth-{tag}"
        self.session = ChatSessions(self.engine, CheckpointStore(self.store_dir), adaptive=False)
        logits, prompt, _ = self.session.sync("c", messages)
        self.prompt, self.again, self.logits = list(prompt), again, logits
        return self.prompt

    def decode(self, first: int) -> float:
        import numpy as np

        engine, keep, token = self.engine, len(self.prompt), first
        start, self.picked = time.perf_counter(), []
        for i in range(DECODE_WARMUP + DECODE_STEPS):
            if i == DECODE_WARMUP:
                start = time.perf_counter()
            token = int(np.argmax(engine.runner.forward([token], engine.cache)[-1]))  # as bench/engine.py
            self.picked.append(token)
        elapsed = time.perf_counter() - start
        engine.truncate(keep)
        return elapsed

    def state(self) -> dict:
        from engine.checkpoint.store import CheckpointStore, conversation_file
        from engine.session import ChatSessions

        s, engine = self.session, self.engine
        s.store.remove(conversation_file("c", s.identity.model_fp))  # a whole new file, as llama.cpp's save writes
        saved = s.save("turn")
        if not saved.ok:
            raise RuntimeError(f"Hearth's save failed: {saved.error}")
        out = {"tokens": len(self.prompt), "save_file_ms": saved.elapsed_ms, "file_bytes": saved.bytes_written}
        # A new session restores from the file (every record read and verified) into the buffers the
        # live context leaves, then prefills the follow-up message; only the restore is counted.
        r = ChatSessions(engine, CheckpointStore(self.store_dir), adaptive=False)
        _, _, rep = r.sync("c", self.again)
        r.store.close()
        if rep.source != "disk":
            raise RuntimeError(f"Hearth did not restore from its checkpoint: {rep}")
        out["load_file_ms"], out["restored_tokens"] = rep.restore_ms, rep.restored_tokens
        keep = min(rep.restored_tokens, len(self.prompt))
        engine.truncate(keep)  # back to exactly the conversation (buffers kept)
        if keep < len(self.prompt):
            engine.prefill(self.prompt[keep:])
        return out


class PeerSide:
    name = "llama.cpp"

    def __init__(self, python: Path, workdir: Path):
        self.workdir = workdir
        self.proc = subprocess.Popen([str(python), str(WORKER)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True, cwd=ROOT)
        self.prompt: list[int] = []
        self.picked: list[int] = []
        self.logits: Any = None

    def call(self, op: str, **req: Any) -> dict:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps({"op": op, **req}) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the llama.cpp worker exited (code {self.proc.wait()}) during {op!r}")
        reply = json.loads(line)
        if "error" in reply:
            raise RuntimeError(f"llama.cpp worker, {op}: {reply['error']}")
        return reply

    def close(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.write(json.dumps({"op": "quit"}) + "\n")
            self.proc.stdin.close()
            self.proc.wait(timeout=60)

    def prefill(self, tokens: list[int]) -> float:
        return self.call("prefill", tokens=tokens)["s"]

    def fill(self, prompt: list[int]) -> None:
        import numpy as np

        reply = self.call("fill", tokens=prompt)
        self.prompt, self.logits = prompt, np.frombuffer(base64.b64decode(reply["last_logits"]), np.float32)

    def decode(self, first: int) -> float:
        reply = self.call("decode", keep=len(self.prompt), first=first, steps=DECODE_STEPS, warmup=DECODE_WARMUP)
        self.picked = reply["tokens"]
        return reply["s"]

    def state(self) -> dict:
        return self.call("state", path=str(self.workdir / "llama-state.bin"))


# the run ------------------------------------------------------------------------------------------
def int_list(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def alternate(sides: list, repeats: int, measure: Callable[[Any], Any]) -> dict[str, list]:
    """``measure(side)`` for each side, ``repeats`` times, in the order A B B A A B …"""
    out: dict[str, list] = {side.name: [] for side in sides}
    for rep in range(repeats):
        for side in (sides if rep % 2 == 0 else sides[::-1]):
            time.sleep(PAUSE_S)
            out[side.name].append(measure(side))
    return out


def machine_info(threads: int, peer_info: dict, hearth_provider: str | None) -> dict:
    import onnxruntime

    cpu = ""
    try:
        cpu = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                    if ln.startswith("model name")), "")
    except OSError:
        pass
    return {"platform": platform.platform(), "cpu": cpu, "cpus": os.cpu_count(), "python": platform.python_version(),
            "threads": threads, "onnxruntime": onnxruntime.__version__, "hearth_provider": hearth_provider,
            "llama_cpp_python": peer_info.get("llama_cpp_python"), "llama_cpp_system": peer_info.get("system_info")}


def fmt(value: float | None, unit: str) -> str:
    if value is None:
        return "—"
    if unit == "bytes":
        return f"{value / 1e6:.1f} MB"
    return f"{value:.1f}" if value < 100 else f"{value:.0f}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data-dir")
    ap.add_argument("--model", help="a GGUF path or catalog name (default: the default model, SmolLM2)")
    ap.add_argument("--sizes", help="sets both --prefill and --contexts")
    ap.add_argument("--prefill", default="512,2048", help="prefill sizes in tokens")
    ap.add_argument("--contexts", default="512,8192", help="context sizes for decode and state save/load")
    ap.add_argument("--repeats", type=int, default=2, help="per row and engine, alternating A/B/B/A")
    ap.add_argument("--threads", type=int, help="for both engines (default: Hearth's, one per physical core)")
    ap.add_argument("--weights", default="int4", help="Hearth's precision")
    ap.add_argument("--no-flash-attn", action="store_true",
                    help="llama.cpp without flash attention (its own default, 'auto', uses it on the CPU)")
    ap.add_argument("--setup-only", action="store_true", help="make the peer venv and stop")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "peer.json"))
    args = ap.parse_args()
    prefill_sizes = int_list(args.sizes or args.prefill)
    contexts = int_list(args.sizes or args.contexts)

    python = ensure_peer()
    if args.setup_only:
        print(f"llama-cpp-python {PEER_VERSION} ready in {PEER_VENV}")
        return 0

    from engine.errors import HearthError
    from engine.loader import load_engine, resolve_gguf
    from engine.paths import resolve_paths
    from engine.runtime.runner import default_threads

    paths = resolve_paths(args.data_dir).ensure()
    gguf = resolve_gguf(paths, args.model).resolve()
    threads = args.threads or default_threads()
    engine, hearth_note = None, ""
    try:
        engine, _, _ = load_engine(paths, model=gguf, weights=args.weights, provider="cpu", threads=threads)
    except HearthError as exc:  # e.g. an architecture Hearth lacks: measure llama.cpp alone
        hearth_note = f"Hearth cannot run {gguf.name}: {exc}"
        print(f"note: {hearth_note}; measuring llama.cpp only", file=sys.stderr)
    text = engine if engine is not None else TextSide(gguf)

    with tempfile.TemporaryDirectory(prefix="hearth-peer-") as tmp:
        workdir = Path(tmp)
        peer = PeerSide(python, workdir)
        try:
            n_ctx = max(prefill_sizes + contexts) + 64
            peer_info = peer.call("load", model=str(gguf), n_ctx=n_ctx, threads=threads, n_batch=N_BATCH,
                                  flash_attn=not args.no_flash_attn)
            limit = min(engine.context_length if engine is not None else peer_info["n_ctx_train"], peer_info["n_ctx"])
            sides: list = [HearthSide(engine, workdir), peer] if engine is not None else [peer]
            rows = run_rows(sides, text, prefill_sizes, contexts, limit, args.repeats)
        finally:
            peer.close()

    print_table(rows, [s.name for s in sides], hearth_note)
    result = {"command": shlex.join([Path(sys.executable).name, *sys.argv]),
              "machine": machine_info(threads, peer_info, engine.provider if engine is not None else None),
              "model": str(gguf), "model_bytes": gguf.stat().st_size, "hearth_weights": args.weights,
              "hearth_note": hearth_note, "llama_cpp": {"n_ctx": peer_info["n_ctx"], "n_batch": N_BATCH,
                                                        "n_ubatch": min(N_BATCH, 512),
                                                        "flash_attn": not args.no_flash_attn,
                                                        "load_s": peer_info["load_s"]},
              "repeats": args.repeats, "decode_steps": DECODE_STEPS, "decode_warmup": DECODE_WARMUP, "rows": rows}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


def follow_up(messages: list[dict]) -> list[dict]:
    """The conversation one turn on: what Hearth's restore is asked for (as in bench/resume.py)."""
    return messages + [{"role": "assistant", "content": paragraph(99, 40)},
                       {"role": "user", "content": "Summarize all of that in one line."}]


def conversation_near(text: Any, room: int, limit: int) -> tuple[list[dict], list[dict]]:
    """A conversation of fixed text as close under ``room`` tokens as a word allows, and its follow-up
    (which must fit the context, ``limit``): the last user turn's length is searched for."""
    msgs = conversation_of(text, room)  # stops at the first user turn at or past ``room``

    def fits(m: list[dict]) -> bool:
        return len(text.prompt_tokens(m)) <= room and len(text.prompt_tokens(follow_up(m))) < limit

    def with_last(words: int) -> list[dict]:
        return msgs[:-1] + [{"role": "user", "content": paragraph(len(msgs), words)}]

    while len(msgs) > 3 and not fits(with_last(1)):
        msgs = msgs[:-2]  # drop the last user turn and the reply before it
    lo, hi = 1, room  # a word is at least one token
    while lo < hi:  # the most words in the last user turn that still fit
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if fits(with_last(mid)) else (lo, mid - 1)
    msgs = with_last(lo)
    return msgs, follow_up(msgs)


def same_prompt_check(sides: list) -> dict | None:
    """Both engines' last-position logits after the same context: a check that they read the same
    prompt. Greedy ids alone are no such check: on fixed filler text the top logits lie within a
    few tenths, and llama.cpp's 8-bit activations already pick another id at near-ties."""
    if len(sides) < 2:
        return None
    import numpy as np

    a, b = (np.asarray(s.logits, np.float64) for s in sides)
    corr = float(np.corrcoef(a, b)[0, 1])
    top = [int(np.argmax(a)), int(np.argmax(b))]
    x, y = sides[0].picked, sides[1].picked
    alike = next((i for i, (p, q) in enumerate(zip(x, y, strict=False)) if p != q), min(len(x), len(y)))
    if corr < 0.99:
        print(f"warning: the engines' logits after the same ids correlate at only {corr:.4f}: "
              "are they reading the same prompt?", file=sys.stderr)
    return {"logits_corr": corr, "top1": top, "greedy_ids_alike": alike}


def run_rows(sides: list, text: Any, prefill_sizes: list[int], contexts: list[int], limit: int,
             repeats: int) -> list[dict]:
    """Every row for every side; each row's repeats alternate the sides."""
    rows: list[dict] = []
    # One long fixed text, tokenized once by Hearth; each prefill size is a prefix of it.
    need = max(prefill_sizes, default=0) + 64
    doc = text.encode_prompt(" ".join(paragraph(i, 60) for i in range(need // 40 + 2)))
    if len(doc) < need:
        raise SystemExit(f"the fixed text gave {len(doc)} tokens, fewer than the {need} needed")
    for side in sides:  # warm-up: first-run allocations and thread start-up stay out of the figures
        side.prefill(doc[:64])
    for n in prefill_sizes:
        if n >= limit:
            print(f"skipping prefill {n}: the context holds {limit}", file=sys.stderr)
            continue
        tokens = doc[:n]
        runs = alternate(sides, repeats, lambda side, t=tokens: side.prefill(t))
        rows.append({"row": f"prefill {n}", "unit": "tok/s", "higher_is_better": True,
                     "samples": {k: [n / s for s in v] for k, v in runs.items()}})
        print(f"measured prefill {n}", file=sys.stderr)

    first = text.encode_prompt(" river")[-1]  # the same first decode token for both engines
    for ctx in contexts:
        # Decoding must fit after the conversation, and Hearth's restore prefills a follow-up turn.
        room = min(ctx, limit) - DECODE_STEPS - DECODE_WARMUP - 1
        msgs, again = conversation_near(text, room, limit)
        prompt: list[int] = []
        for side in sides:
            if isinstance(side, HearthSide):
                prompt = side.fill(msgs, again, str(ctx))
        prompt = prompt or text.prompt_tokens(msgs)
        for side in sides:
            if isinstance(side, PeerSide):
                side.fill(prompt)
        label = f"@{ctx} ({len(prompt)} tok)"
        runs = alternate(sides, repeats, lambda side: DECODE_STEPS / side.decode(first))
        rows.append({"row": f"decode {label}", "unit": "tok/s", "higher_is_better": True, "context": len(prompt),
                     "samples": runs, "check": same_prompt_check(sides)})
        states = alternate(sides, repeats, lambda side: side.state())
        first_state = len(rows)
        for key, name, unit in (("file_bytes", "state file size", "bytes"), ("save_file_ms", "state save", "ms"),
                                ("load_file_ms", "state load", "ms")):
            samples = {k: [d[key] for d in v] for k, v in states.items()}
            if key == "save_file_ms" and "llama.cpp" in states:  # Hearth's save is fsynced: add llama.cpp's
                samples["llama.cpp"] = [d["save_file_ms"] + d["fsync_ms"] for d in states["llama.cpp"]]
            rows.append({"row": f"{name} {label}", "unit": unit, "higher_is_better": False, "context": len(prompt),
                         "samples": samples})
        for key, name in (("get_data_ms", "state copy out (memory)"), ("set_data_ms", "state copy in (memory)")):
            rows.append({"row": f"{name} {label}", "unit": "ms", "higher_is_better": False, "context": len(prompt),
                         "samples": {"llama.cpp": [d[key] for d in states.get("llama.cpp", [])]}})
        rows[first_state]["details"] = states  # every figure of every state sample, both engines
        print(f"measured context {ctx}", file=sys.stderr)
    for row in rows:
        row["median"] = {k: statistics.median(v) for k, v in row["samples"].items() if v}
        h, p = row["median"].get("hearth"), row["median"].get("llama.cpp")
        row["hearth_over_llama_cpp"] = h / p if h is not None and p else None
    return rows


def print_table(rows: list[dict], names: list[str], hearth_note: str) -> None:
    print(f"{'row':<42} {'unit':>6} {'Hearth':>10} {'llama.cpp':>10} {'Hearth/llama.cpp':>17}")
    for r in rows:
        h, p, ratio = r["median"].get("hearth"), r["median"].get("llama.cpp"), r["hearth_over_llama_cpp"]
        print(f"{r['row']:<42} {r['unit']:>6} {fmt(h, r['unit']):>10} {fmt(p, r['unit']):>10} "
              f"{'' if ratio is None else f'{ratio:.2f}×':>17}")
    print("medians; tok/s: a ratio above 1 means Hearth is faster; ms and bytes: below 1 means Hearth is faster/smaller")
    checks = [f"{r['row'].split(' (')[0]}: {r['check']['logits_corr']:.4f}" for r in rows if r.get("check")]
    if checks:
        print("same prompt check, last-position logits correlation: " + ", ".join(checks))
    if hearth_note:
        print(f"note: {hearth_note}")


if __name__ == "__main__":
    sys.exit(main())
