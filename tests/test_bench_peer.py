"""bench/peer.py's llama.cpp build: the instruction sets named from /proc/cpuinfo (never GGML_NATIVE's AMX
path), the venv stamp that decides a rebuild, and the plain report of a worker that dies by a signal.
Nothing here compiles or reaches the network."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def _load_peer():
    spec = importlib.util.spec_from_file_location("bench_peer_under_test", REPO / "bench" / "peer.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


peer = _load_peer()

BASE = "fpu sse sse2 ssse3 sse4_1 sse4_2 popcnt"
# A Sapphire Rapids Xeon: AVX-512 with VNNI and BF16, AVX-VNNI, and AMX (what GGML_NATIVE turned on).
SAPPHIRE = (f"{BASE} avx avx2 bmi2 fma f16c avx_vnni avx512f avx512dq avx512cd avx512bw avx512vl avx512vbmi "
            "avx512_vnni avx512_bf16 avx512_fp16 amx_bf16 amx_tile amx_int8")
ZEN2 = f"{BASE} avx avx2 bmi2 fma f16c"  # no AVX-512
SANDY = f"{BASE} avx"  # no AVX2, no FMA, no F16C


def cpuinfo(flags: str) -> str:
    core = "processor\t: {n}\nvendor_id\t: GenuineIntel\nmodel name\t: Some CPU\nflags\t\t: {flags}\n\n"
    return "".join(core.format(n=n, flags=flags) for n in range(2))


def args_of(features) -> dict[str, str]:
    return dict(a[2:].split("=", 1) for a in peer.cmake_args(features).split())


def test_a_cpu_with_amx_builds_its_avx512_parts_and_never_amx():
    flags = peer.cpu_flags(cpuinfo(SAPPHIRE))
    assert {"amx_tile", "amx_int8", "amx_bf16", "avx512_vnni"} <= flags
    features = peer.build_features(flags, "x86_64")
    assert features == ("sse42", "avx", "avx2", "bmi2", "fma", "f16c", "avx_vnni", "avx512", "avx512_vbmi",
                        "avx512_vnni", "avx512_bf16")
    args = args_of(features)
    assert args["GGML_NATIVE"] == "OFF"
    assert all(args[o] == "ON" for o in ("GGML_AVX2", "GGML_FMA", "GGML_F16C", "GGML_AVX512", "GGML_AVX512_VNNI",
                                         "GGML_AVX512_BF16", "GGML_AVX_VNNI"))
    assert all(args[o] == "OFF" for o in ("GGML_AMX_TILE", "GGML_AMX_INT8", "GGML_AMX_BF16"))
    assert args["GGML_CUDA"] == "OFF" and args["LLAMA_BUILD_TESTS"] == "OFF"  # the common part stays
    line = peer.build_line(features, flags)
    assert line == ("peer: llama.cpp built for sse42 avx avx2 bmi2 fma f16c avx_vnni avx512 avx512_vbmi "
                    "avx512_vnni avx512_bf16, AMX off (GGML_NATIVE's AMX path faults on some Xeons here)")


def test_a_cpu_without_avx512_names_every_avx512_option_off():
    flags = peer.cpu_flags(cpuinfo(ZEN2))
    features = peer.build_features(flags, "x86_64")
    assert features == ("sse42", "avx", "avx2", "bmi2", "fma", "f16c")
    args = args_of(features)
    assert args["GGML_AVX2"] == args["GGML_FMA"] == args["GGML_F16C"] == "ON"
    assert all(args[o] == "OFF" for o in ("GGML_AVX512", "GGML_AVX512_VBMI", "GGML_AVX512_VNNI", "GGML_AVX512_BF16",
                                         "GGML_AVX_VNNI", "GGML_AMX_TILE", "GGML_NATIVE"))
    assert "this CPU has none anyway" in peer.build_line(features, flags)


def test_avx512_parts_need_avx512_itself():
    # VNNI and BF16 flags without the whole of GGML_AVX512 (it compiles for f, cd, vl, dq and bw): all off.
    flags = peer.cpu_flags(cpuinfo(f"{ZEN2} avx512f avx512_vnni avx512_bf16"))
    assert peer.build_features(flags, "x86_64") == ("sse42", "avx", "avx2", "bmi2", "fma", "f16c")


def test_a_cpu_without_avx2_gets_a_portable_build_that_says_so():
    flags = peer.cpu_flags(cpuinfo(SANDY))
    features = peer.build_features(flags, "x86_64")
    assert features == ("sse42", "avx")
    args = args_of(features)
    assert args["GGML_AVX"] == "ON" and args["GGML_NATIVE"] == "OFF"
    assert all(args[o] == "OFF" for o in ("GGML_AVX2", "GGML_FMA", "GGML_F16C", "GGML_BMI2", "GGML_AVX512"))
    assert "no AVX2 here, so a portable build" in peer.build_line(features, flags)
    assert peer.build_features(frozenset(), "x86_64") == ()  # nothing readable: the plainest build
    assert args_of(())["GGML_SSE42"] == "OFF"


def test_another_architecture_keeps_ggml_native():
    flags = peer.cpu_flags("processor\t: 0\nFeatures\t: fp asimd evtstrm aes crc32 asimddp\n")
    assert "asimddp" in flags
    assert peer.build_features(flags, "aarch64") == (peer.NATIVE,)
    assert args_of((peer.NATIVE,))["GGML_NATIVE"] == "ON"
    with pytest.raises(ValueError, match="unknown llama.cpp build features: amx"):
        peer.cmake_args(("avx2", "amx"))


def test_the_wheel_folder_is_keyed_by_the_build_flags():
    a, b = peer.build_key(("sse42", "avx", "avx2")), peer.build_key(("sse42", "avx", "avx2", "avx512"))
    assert a != b and a.startswith(peer.cpu_key()) and b.startswith(peer.cpu_key())
    assert peer.build_key(("sse42", "avx", "avx2")) == a


def test_the_stamp_decides_a_rebuild():
    features = peer.build_features(peer.cpu_flags(cpuinfo(SAPPHIRE)), "x86_64")
    wanted = peer.build_stamp(features)
    assert wanted["llama_cpp_python"] == peer.PEER_VERSION and "-DGGML_AMX_TILE=OFF" in wanted["cmake_args"]
    ours = json.dumps({**wanted, "features": list(features), "wheel": "/somewhere.whl"})
    old_native = json.dumps({"llama_cpp_python": peer.PEER_VERSION,
                             "cmake_args": "-DGGML_NATIVE=ON " + peer.COMMON_CMAKE_ARGS})
    other_version = json.dumps({**wanted, "llama_cpp_python": "0.3.2"})
    assert peer.setup_plan(True, ours, wanted, wheel_cached=True) == "use"
    assert peer.setup_plan(True, ours, wanted, wheel_cached=False) == "use"
    # A venv from before stamps (built with GGML_NATIVE), or stamped with another build: rebuilt.
    for stamp in (None, "", "not json", "[]", old_native, other_version):
        assert not peer.stamp_matches(stamp, wanted)
        assert peer.setup_plan(True, stamp, wanted, wheel_cached=False) == "build"
        assert peer.setup_plan(True, stamp, wanted, wheel_cached=True) == "install"
    # The stamp alone is not enough: llama_cpp must import at the pinned version.
    assert peer.setup_plan(False, ours, wanted, wheel_cached=True) == "install"


def test_a_worker_killed_by_a_signal_is_reported_plainly(tmp_path, monkeypatch):
    worker = tmp_path / "faulting_worker.py"
    worker.write_text("import os, signal, sys\nsys.stdin.readline()\nos.kill(os.getpid(), signal.SIGSEGV)\n")
    monkeypatch.setattr(peer, "WORKER", worker)
    features = ("sse42", "avx", "avx2", "fma", "f16c", "avx512", "avx512_vnni")
    with pytest.raises(SystemExit) as info:
        peer.smoke_probe(Path(sys.executable), tmp_path / "model.gguf", 2, features)
    message = str(info.value.code)
    assert "died with signal SIGSEGV (-11) during the smoke probe (load model.gguf, prefill 32 tokens)" in message
    assert "built for sse42 avx avx2 fma f16c avx512 avx512_vnni (AMX off)" in message
    assert "-DGGML_AMX_TILE=OFF" in message and "-DGGML_NATIVE=OFF" in message


def test_a_worker_error_is_reported_without_a_traceback(tmp_path, monkeypatch):
    worker = tmp_path / "refusing_worker.py"
    worker.write_text("import json, sys\nfor line in sys.stdin:\n"
                      "    print(json.dumps({'error': 'ValueError: no such model'}), flush=True)\n")
    monkeypatch.setattr(peer, "WORKER", worker)
    with pytest.raises(SystemExit, match="smoke probe .* failed: ValueError: no such model"):
        peer.smoke_probe(Path(sys.executable), tmp_path / "model.gguf", 2, ("avx2",))
