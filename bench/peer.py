"""Hearth against llama.cpp in the same run (not a test): same GGUF, same token ids, same threads.

    python bench/peer.py [--data-dir DIR] [--model GGUF] [--sizes 512,2048] [--prefill 512,2048]
                         [--contexts 512,8192] [--repeats 2] [--threads N] [--weights int4]

llama.cpp runs through llama-cpp-python, which is no dependency of Hearth: the first run makes its own
venv (bench/.peer-venv) and compiles llama.cpp from source for this CPU (about 15 minutes on 2 cores),
keeping the wheel under bench/.peer-wheels/<cpu>-<build> so later runs only install it. The build names
its instruction sets explicitly from /proc/cpuinfo's flags (AVX2, FMA, F16C, AVX-512 and its VNNI/BF16
parts...) instead of GGML_NATIVE, with AMX off: GGML_NATIVE's AMX path faults (``ldtilecfg``, signal 11)
on the first prefill on some Xeons here. The venv keeps a stamp of its build, so a venv built otherwise
(say the old GGML_NATIVE way) is rebuilt, and a short prefill in a separate worker checks the build
before anything is measured. Its side runs in a worker process (bench/peer_worker.py) speaking JSON
lines; Hearth's runs in this process. Hearth tokenizes every prompt once and both engines get those ids.

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
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
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
PEER_STAMP = PEER_VENV / "hearth-peer-build.json"  # what the llama.cpp in the venv was built with
# A CPU build and nothing else that llama-cpp-python could build.
COMMON_CMAKE_ARGS = ("-DGGML_CUDA=OFF -DGGML_METAL=OFF -DGGML_BLAS=OFF -DGGML_VULKAN=OFF "
                     "-DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF "
                     "-DLLAMA_BUILD_MTMD=OFF -DLLAVA_BUILD=OFF")
# llama.cpp's x86 instruction-set options (ggml/CMakeLists.txt of the ggml 0.25.3 that llama-cpp-python
# 0.3.36 vendors; the same names are in its installed lib/cmake/ggml/ggml-config.cmake), in order: our
# name, the option, and the /proc/cpuinfo flags it compiles for (GGML_AVX512 is -mavx512f/cd/vl/dq/bw).
X86_OPTIONS = (
    ("sse42", "GGML_SSE42", ("sse4_2",)),
    ("avx", "GGML_AVX", ("avx",)),
    ("avx2", "GGML_AVX2", ("avx2",)),
    ("bmi2", "GGML_BMI2", ("bmi2",)),
    ("fma", "GGML_FMA", ("fma",)),
    ("f16c", "GGML_F16C", ("f16c",)),
    ("avx_vnni", "GGML_AVX_VNNI", ("avx_vnni",)),
    ("avx512", "GGML_AVX512", ("avx512f", "avx512cd", "avx512vl", "avx512dq", "avx512bw")),
    ("avx512_vbmi", "GGML_AVX512_VBMI", ("avx512vbmi",)),
    ("avx512_vnni", "GGML_AVX512_VNNI", ("avx512_vnni",)),
    ("avx512_bf16", "GGML_AVX512_BF16", ("avx512_bf16",)),
)
AVX512_PARTS = ("avx512_vbmi", "avx512_vnni", "avx512_bf16")  # only with GGML_AVX512 itself
# Always off, whatever the CPU has: GGML_NATIVE turned these on where the CPU has AMX, and that build dies
# in its AMX path (``ldtilecfg``, a general protection fault, signal 11) on the first prefill on some
# Xeons here.
AMX_OPTIONS = ("GGML_AMX_TILE", "GGML_AMX_INT8", "GGML_AMX_BF16")
AMX_FLAGS = ("amx_tile", "amx_int8", "amx_bf16")
AMX_WHY = "GGML_NATIVE's AMX path faults on some Xeons here"
NATIVE = "native"  # the one feature of a build that is not x86: GGML_NATIVE (it has no AMX path)
SMOKE_TOKENS = 32  # the smoke probe's prefill
DECODE_STEPS, DECODE_WARMUP = 32, 4
N_BATCH = 2048  # llama-bench's default (with n_ubatch 512)
PAUSE_S = 0.2  # between engines: let the other one's spinning threads go to sleep
# llama-cpp-python 0.3.36's ``[server]`` extra (its dist-info METADATA), what ``python -m llama_cpp.server``
# imports beyond the library: installed on their own, so the compiled llama-cpp-python is left as it is.
SERVER_EXTRAS = ("uvicorn>=0.22.0", "fastapi>=0.100.0", "pydantic-settings>=2.0.1", "sse-starlette>=1.6.1",
                 "starlette-context>=0.3.6,<0.4", "PyYAML>=5.1")


# the peer venv --------------------------------------------------------------------------------------
def cpu_key() -> str:
    """A short name for this CPU's model and flags (the wheels are kept per CPU and build)."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
        text = "\n".join(sorted({ln for ln in lines if ln.startswith(("model name", "flags"))}))
    except OSError:
        text = platform.processor() or platform.machine()
    return f"{platform.machine()}-{hashlib.sha256(text.encode()).hexdigest()[:12]}"


def cpu_flags(cpuinfo: str) -> frozenset[str]:
    """The instruction-set flags of /proc/cpuinfo's first ``flags`` line (x86; ``Features`` elsewhere)."""
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return frozenset(value.split())
    return frozenset()


def build_features(flags: Iterable[str], machine: str = "x86_64") -> tuple[str, ...]:
    """The instruction sets to build llama.cpp for on a CPU with these /proc/cpuinfo ``flags``, in
    X86_OPTIONS' order; AMX never. Not x86: (NATIVE,), GGML_NATIVE (the fault is x86's AMX path). A CPU
    without AVX2 gets a portable build of what it has (slow, but runs: build_line says so)."""
    if machine.lower() not in ("x86_64", "amd64", "i386", "i686", "x86"):
        return (NATIVE,)
    have = set(flags)
    on = [name for name, _, needs in X86_OPTIONS if have.issuperset(needs)]
    if "avx512" not in on:
        on = [name for name in on if name not in AVX512_PARTS]
    return tuple(on)


def cmake_args(features: Iterable[str]) -> str:
    """CMAKE_ARGS for llama-cpp-python's build: every x86 option named ON or OFF (GGML_NATIVE off, AMX
    off), so nothing is left to the compiler's view of the host."""
    features = tuple(features)
    if features == (NATIVE,):
        return f"-DGGML_NATIVE=ON {COMMON_CMAKE_ARGS}"
    unknown = set(features) - {name for name, _, _ in X86_OPTIONS}
    if unknown:
        raise ValueError(f"unknown llama.cpp build features: {', '.join(sorted(unknown))}")
    isa = [f"-D{option}={'ON' if name in features else 'OFF'}" for name, option, _ in X86_OPTIONS]
    amx = [f"-D{option}=OFF" for option in AMX_OPTIONS]
    return " ".join(["-DGGML_NATIVE=OFF", *isa, *amx, COMMON_CMAKE_ARGS])


def build_stamp(features: Iterable[str]) -> dict:
    """What the peer venv records of its llama.cpp: a venv whose stamp differs is rebuilt."""
    return {"llama_cpp_python": PEER_VERSION, "cmake_args": cmake_args(features)}


def stamp_matches(stamp_text: str | None, wanted: dict) -> bool:
    """Whether a stamp file's text (None: no file, as in a venv from before stamps, built with
    GGML_NATIVE) records the build ``wanted``."""
    if not stamp_text:
        return False
    try:
        stamp = json.loads(stamp_text)
    except ValueError:
        return False
    return isinstance(stamp, dict) and all(stamp.get(k) == v for k, v in wanted.items())


def setup_plan(installed: bool, stamp_text: str | None, wanted: dict, wheel_cached: bool) -> str:
    """What ensure_peer does: "use" the venv as it is, "install" the kept wheel of this build into it
    (replacing any other build), or "build" that wheel first."""
    if installed and stamp_matches(stamp_text, wanted):
        return "use"
    return "install" if wheel_cached else "build"


def build_key(features: Iterable[str]) -> str:
    """This CPU and these build flags: the folder under bench/.peer-wheels that keeps their wheel."""
    return f"{cpu_key()}-{hashlib.sha256(cmake_args(features).encode()).hexdigest()[:8]}"


def build_line(features: tuple[str, ...], flags: Iterable[str]) -> str:
    """One plain line saying what llama.cpp is built for, and that AMX is off and why."""
    if features == (NATIVE,):
        return f"peer: llama.cpp built with GGML_NATIVE for this {platform.machine()} CPU (no AMX there)"
    has_amx = any(flag in set(flags) for flag in AMX_FLAGS)
    line = (f"peer: llama.cpp built for {' '.join(features) or 'no SIMD extension'}, AMX off "
            f"({AMX_WHY}{'' if has_amx else '; this CPU has none anyway'})")
    if "avx2" not in features:
        line += "; no AVX2 here, so a portable build: its figures are far below llama.cpp's usual"
    return line


def this_cpu() -> tuple[frozenset[str], tuple[str, ...]]:
    """This CPU's flags and the features to build for."""
    try:
        flags = cpu_flags(Path("/proc/cpuinfo").read_text())
    except OSError:
        flags = frozenset()
    return flags, build_features(flags, platform.machine())


def peer_python() -> Path:
    return PEER_VENV / "bin" / "python"


def peer_ready() -> bool:
    check = "import llama_cpp, sys; sys.exit(llama_cpp.__version__ != sys.argv[1])"
    return peer_python().exists() and subprocess.run([str(peer_python()), "-c", check, PEER_VERSION],
                                                     capture_output=True).returncode == 0


def read_stamp() -> str | None:
    try:
        return PEER_STAMP.read_text()
    except OSError:
        return None


def ensure_peer(features: tuple[str, ...]) -> Path:
    """The peer venv's python with llama-cpp-python built for ``features`` installed, compiling it once
    per CPU and build (a venv of another build, or of none recorded, gets this one)."""
    wanted = build_stamp(features)
    wheels = PEER_WHEELS / build_key(features)
    wheel = sorted(wheels.glob(f"llama_cpp_python-{PEER_VERSION}-*.whl"))
    plan = setup_plan(peer_ready(), read_stamp(), wanted, bool(wheel))
    if plan == "use":
        return peer_python()
    if not peer_python().exists():
        subprocess.run([sys.executable, "-m", "venv", str(PEER_VENV)], check=True)
    pip = [str(peer_python()), "-m", "pip", "--disable-pip-version-check"]
    if plan == "build":
        print(f"compiling llama.cpp (llama-cpp-python {PEER_VERSION}) for this CPU; about 15 minutes on 2 cores\n"
              f"  CMAKE_ARGS={wanted['cmake_args']}", file=sys.stderr)
        env = {**os.environ, "CMAKE_ARGS": wanted["cmake_args"],
               "CMAKE_BUILD_PARALLEL_LEVEL": str(os.cpu_count() or 2)}
        started = time.perf_counter()
        # --no-cache-dir: pip keeps the wheels it builds keyed by the source archive alone, so its cache
        # would hand back a wheel built with other CMAKE_ARGS (the old GGML_NATIVE one, say).
        subprocess.run(pip + ["wheel", "--no-deps", "--no-cache-dir", "-w", str(wheels),
                              f"llama-cpp-python=={PEER_VERSION}"], check=True, env=env)
        print(f"built in {time.perf_counter() - started:.0f} s", file=sys.stderr)
        wheel = sorted(wheels.glob(f"llama_cpp_python-{PEER_VERSION}-*.whl"))
        if not wheel:
            raise SystemExit(f"pip built no llama-cpp-python {PEER_VERSION} wheel into {wheels}")
    PEER_STAMP.unlink(missing_ok=True)  # no stamp until this build is in
    subprocess.run(pip + ["uninstall", "--quiet", "--yes", "llama-cpp-python"], capture_output=True)
    subprocess.run(pip + ["install", "--quiet", str(wheel[-1])], check=True)
    if not peer_ready():
        raise SystemExit(f"llama-cpp-python {PEER_VERSION} did not install into {PEER_VENV}")
    PEER_STAMP.write_text(json.dumps({**wanted, "features": list(features), "wheel": str(wheel[-1])}, indent=2))
    return peer_python()


def server_extras_ready(python: Path) -> bool:
    """Whether ``python`` (the peer venv's) can import llama-cpp-python's server app."""
    return python.exists() and subprocess.run([str(python), "-c", "import llama_cpp.server.app"],
                                              capture_output=True).returncode == 0


def ensure_server_extras(python: Path) -> Path:
    """``python`` with llama-cpp-python's server dependencies (SERVER_EXTRAS) installed from the package
    index, without touching llama-cpp-python itself (no rebuild, no reinstall; its build stamp stays)."""
    if server_extras_ready(python):
        return python
    print(f"peer: installing llama.cpp's server dependencies into {python.parent.parent}: {' '.join(SERVER_EXTRAS)}",
          file=sys.stderr)
    subprocess.run([str(python), "-m", "pip", "--disable-pip-version-check", "install", "--quiet", *SERVER_EXTRAS],
                   check=True)
    if not server_extras_ready(python):
        raise SystemExit(f"peer: llama_cpp.server.app still does not import in {python.parent.parent}")
    return python


def died_message(code: int, during: str, features: tuple[str, ...]) -> str:
    """A plain report of the llama.cpp worker dying (``code`` < 0: by that signal) with its build."""
    how = f"exited with code {code}"
    if code < 0:
        try:
            how = f"died with signal {signal.Signals(-code).name} ({code})"
        except ValueError:
            how = f"died with signal {-code} ({code})"
    return (f"peer: the llama.cpp worker {how} during {during}.\n"
            f"  It was built for {' '.join(features) or 'no SIMD extension'} (AMX off), CMAKE_ARGS={cmake_args(features)}\n"
            f"  The build is kept under {PEER_WHEELS / build_key(features)}; its stamp is {PEER_STAMP}.")


def smoke_probe(python: Path, gguf: Path, threads: int, features: tuple[str, ...], flash_attn: bool = True) -> None:
    """A short prefill (SMOKE_TOKENS) of ``gguf`` in a worker of its own, before anything is measured:
    a build that faults (signal 11 in the AMX path, say) stops the run with one plain message."""
    during = f"the smoke probe (load {gguf.name}, prefill {SMOKE_TOKENS} tokens)"
    requests = [{"op": "load", "model": str(gguf), "n_ctx": 256, "threads": threads, "n_batch": 256,
                 "flash_attn": flash_attn},
                {"op": "prefill", "tokens": [1 + i % 64 for i in range(SMOKE_TOKENS)]}, {"op": "quit"}]
    try:
        proc = subprocess.run([str(python), str(WORKER)], input="".join(json.dumps(r) + "\n" for r in requests),
                              capture_output=True, text=True, cwd=ROOT, timeout=600)
    except subprocess.TimeoutExpired:
        raise SystemExit(f"peer: {during} took over 600 s") from None
    if proc.returncode != 0:
        tail = proc.stderr.strip().splitlines()[-5:]
        raise SystemExit(died_message(proc.returncode, during, features)
                         + "".join(f"\n  | {line}" for line in tail))
    errors = [r["error"] for r in (json.loads(ln) for ln in proc.stdout.splitlines() if ln.strip()) if "error" in r]
    if errors:
        raise SystemExit(f"peer: {during} failed: {errors[0]}")


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

    def __init__(self, python: Path, workdir: Path, features: tuple[str, ...]):
        self.workdir, self.features = workdir, features
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
            code = self.proc.wait()
            if code < 0:  # a signal (a fault in llama.cpp): say so plainly, with the build, not a traceback
                raise SystemExit(died_message(code, repr(op), self.features))
            raise RuntimeError(f"the llama.cpp worker exited (code {code}) during {op!r}")
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


def machine_info(threads: int, peer_info: dict, hearth_provider: str | None, features: tuple[str, ...]) -> dict:
    import onnxruntime

    cpu = ""
    try:
        cpu = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                    if ln.startswith("model name")), "")
    except OSError:
        pass
    return {"platform": platform.platform(), "cpu": cpu, "cpus": os.cpu_count(), "python": platform.python_version(),
            "threads": threads, "onnxruntime": onnxruntime.__version__, "hearth_provider": hearth_provider,
            "llama_cpp_python": peer_info.get("llama_cpp_python"), "llama_cpp_system": peer_info.get("system_info"),
            "llama_cpp_build": {"features": list(features), "cmake_args": cmake_args(features),
                                "amx": f"off: {AMX_WHY}"}}


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
    ap.add_argument("--server-extras", action="store_true",
                    help="also install llama-cpp-python's server dependencies (uvicorn, fastapi …), no rebuild")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "peer.json"))
    args = ap.parse_args()
    prefill_sizes = int_list(args.sizes or args.prefill)
    contexts = int_list(args.sizes or args.contexts)

    flags, features = this_cpu()
    python = ensure_peer(features)
    if args.server_extras:
        ensure_server_extras(python)
    print(build_line(features, flags), file=sys.stderr)

    from engine.errors import HearthError
    from engine.loader import load_engine, resolve_gguf
    from engine.paths import resolve_paths
    from engine.runtime.runner import default_threads

    paths = resolve_paths(args.data_dir).ensure()
    threads = args.threads or default_threads()
    try:
        gguf = resolve_gguf(paths, args.model).resolve()
    except HearthError as exc:
        if not args.setup_only:
            raise
        print(f"llama-cpp-python {PEER_VERSION} ready in {PEER_VENV}; no smoke probe: {exc}")
        return 0
    smoke_probe(python, gguf, threads, features, flash_attn=not args.no_flash_attn)
    if args.setup_only:
        print(f"llama-cpp-python {PEER_VERSION} ready in {PEER_VENV} (a {SMOKE_TOKENS}-token prefill of {gguf.name} ran)")
        return 0
    engine, hearth_note = None, ""
    try:
        engine, _, _ = load_engine(paths, model=gguf, weights=args.weights, provider="cpu", threads=threads)
    except HearthError as exc:  # e.g. an architecture Hearth lacks: measure llama.cpp alone
        hearth_note = f"Hearth cannot run {gguf.name}: {exc}"
        print(f"note: {hearth_note}; measuring llama.cpp only", file=sys.stderr)
    text = engine if engine is not None else TextSide(gguf)

    with tempfile.TemporaryDirectory(prefix="hearth-peer-") as tmp:
        workdir = Path(tmp)
        peer = PeerSide(python, workdir, features)
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
              "machine": machine_info(threads, peer_info, engine.provider if engine is not None else None, features),
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
