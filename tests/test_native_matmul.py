"""ai.hearth.MatMulQ (engine/native/hearth_matmul*.c) in real ONNX Runtime sessions: every weight type, both
numerics, every instruction set this CPU has (HEARTH_KERNEL_ISA forces each), decode and prefill shapes,
against float64 references; and every bad input refused with a plain message.

- exact: the reference is X (float64) times gguf's own dequantized weights; the kernel may differ only by
  fp32 summation, so the bound is a few fp32 ulps of sum |x·w|.
- fast: the reference quantizes X in numpy as llama.cpp's CPU path does (Q8_0/Q8_1 per 32 for the 32-element
  types, Q8_K per 256 for the K-quants) and multiplies in float64; the integer dots are exact, so the same
  tight bound holds, and a quantizer that rounded differently fails it.
"""

from __future__ import annotations

import ctypes

import numpy as np
import onnxruntime as ort
import pytest
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize
from onnx import TensorProto

from engine.runtime import native_library
from engine.runtime.runner import session_options
from tests.test_native_unpack import TYPES, one_op_model

LIBRARY = native_library.platform_library()
needs_library = pytest.mark.skipif(LIBRARY is None, reason="no prebuilt kernel for this platform")
DOMAIN = "ai.hearth"
TYPE_IDS = list(TYPES)
K_QUANTS = {T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K}


def cpu_isas() -> list[str]:
    """The instruction sets this CPU can run (Linux /proc/cpuinfo flags)."""
    try:
        flags = set(open("/proc/cpuinfo").read().split())
    except OSError:
        return ["portable"]
    isas = ["portable"]
    if {"avx2", "fma"} <= flags:
        isas.append("avx2")
        if {"avx512f", "avx512bw", "avx512vl"} <= flags:
            isas.append("avx512")
            if "avx512_vnni" in flags:
                isas.append("avx512vnni")
    return isas


ISAS = ["portable", "avx2", "avx512", "avx512vnni"]


def weight_rows(rng: np.random.Generator, qtype: T, n: int, k: int) -> np.ndarray:
    """n random rows of k weights as uint8 [n, R], with every fp16 scale of modest size and either sign (a
    matmul of random halves up to 65504 would measure only overflow)."""
    elements, size, _, halves = TYPES[qtype]
    blocks = rng.integers(0, 256, (n, k // elements, size), dtype=np.uint8)
    for at in halves:
        scale = rng.uniform(1e-3, 5e-2, blocks.shape[:2]) * rng.choice([-1.0, 1.0], blocks.shape[:2])
        blocks[..., at:at + 2] = scale.astype("<f2").view(np.uint8).reshape(*blocks.shape[:2], 2)
    return blocks.reshape(n, -1)


def quantized_x(qtype: T, x: np.ndarray) -> np.ndarray:
    """X as llama.cpp's CPU path quantizes it for ``qtype``'s dot product, dequantized (float64)."""
    x = x.astype(np.float32)
    if qtype in K_QUANTS:  # Q8_K: the largest magnitude maps to -127; nearest, ties to even
        runs = x.reshape(-1, 256)
        top = runs[np.arange(len(runs)), np.abs(runs).argmax(axis=1)]
        with np.errstate(divide="ignore"):
            iscale = np.where(top != 0, np.float32(-127.0) / top, np.float32(0)).astype(np.float32)
        q = np.minimum(np.rint(runs * iscale[:, None]), 127)
        d = np.where(top != 0, np.float32(1.0) / iscale, np.float32(0)).astype(np.float32)
    else:  # Q8_0 / Q8_1: d = amax / 127, q = round(x / d), ties away from zero
        runs = x.reshape(-1, 32)
        d = (np.abs(runs).max(axis=1) / np.float32(127.0)).astype(np.float32)
        with np.errstate(divide="ignore"):
            inv = np.where(d != 0, np.float32(1.0) / d, np.float32(0)).astype(np.float32)
        v = runs * inv[:, None]
        q = np.sign(v) * np.floor(np.abs(v) + np.float32(0.5))
    return (q.astype(np.float64) * d.astype(np.float64)[:, None]).reshape(x.shape)


def matmul_model(qtype: int, fast: int) -> bytes:
    return one_op_model("MatMulQ", {"x": TensorProto.FLOAT, "w": TensorProto.UINT8}, type=int(qtype), fast=fast)


def matmul(qtype: int, fast: int, x: np.ndarray, w: np.ndarray) -> np.ndarray:
    options = session_options(2)
    options.register_custom_ops_library(str(LIBRARY))
    session = ort.InferenceSession(matmul_model(qtype, fast), options, providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x, "w": w})[0]


def assert_close(got: np.ndarray, x64: np.ndarray, w64: np.ndarray) -> None:
    """got == x64 @ w64.T up to fp32 summation: 64 ulps of sum |x|·|w| per output (sums of a few thousand
    terms in four-way partial vectors stay far inside it; a wrong scale or code is off by whole terms)."""
    expected = x64 @ w64.T
    bound = 64 * np.finfo(np.float32).eps * (np.abs(x64) @ np.abs(w64).T) + 1e-30
    assert got.shape == expected.shape
    assert np.all(np.abs(got - expected) <= bound), float(np.max(np.abs(got - expected) / bound))


def _k(qtype: T) -> int:
    return 512 if qtype in K_QUANTS else 160  # two super-blocks; five 32-element blocks (not a multiple of 64)


@needs_library
@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("fast", [0, 1], ids=["exact", "fast"])
@pytest.mark.parametrize("qtype", TYPE_IDS, ids=lambda t: t.name)
def test_every_type_numerics_and_instruction_set_match_the_float64_reference(qtype, fast, isa, monkeypatch):
    if isa not in cpu_isas():
        pytest.skip(f"this CPU has no {isa}")
    monkeypatch.setenv("HEARTH_KERNEL_ISA", isa)
    rng = np.random.default_rng(int(qtype) * 10 + fast)
    k, n = _k(qtype), 37  # 37 rows: two full tiles of 16 and a remainder of 5 (four-row and one-row dots)
    w = weight_rows(rng, qtype, n, k)
    w64 = dequantize(w, qtype).astype(np.float64)
    for m in (1, 3, 17):
        x = rng.standard_normal((m, k)).astype(np.float32)
        x64 = quantized_x(qtype, x) if fast else x.astype(np.float64)
        assert_close(matmul(qtype, fast, x, w), x64, w64)


@needs_library
@pytest.mark.parametrize("fast", [0, 1], ids=["exact", "fast"])
def test_a_prefill_above_the_serial_threshold_is_split_across_threads(fast):
    qtype, k, n, m = T.Q4_K, 1024, 300, 64
    rng = np.random.default_rng(3)
    w = weight_rows(rng, qtype, n, k)
    x = rng.standard_normal((1, m, k)).astype(np.float32)  # rank 3, as the graphs feed it
    got = matmul(qtype, fast, x, w)
    assert got.shape == (1, m, n)
    x64 = quantized_x(qtype, x[0]) if fast else x[0].astype(np.float64)
    assert_close(got[0], x64, dequantize(w, qtype).astype(np.float64))


@needs_library
def test_fast_differs_from_exact_by_the_activation_rounding_only():
    """The two numerics are different computations (a fast path silently running exact would pass the
    per-numerics tests above only if the references were the same: they are not, and this says so)."""
    qtype, k = T.Q6_K, 256
    rng = np.random.default_rng(11)
    w = weight_rows(rng, qtype, 8, k)
    x = rng.standard_normal((2, k)).astype(np.float32)
    exact, fast = matmul(qtype, 0, x, w), matmul(qtype, 1, x, w)
    assert not np.array_equal(exact, fast)
    scale = np.abs(exact).max()
    assert np.abs(exact - fast).max() < 0.05 * scale


@needs_library
def test_zero_rows_and_zero_activations():
    qtype = T.Q8_0
    w = weight_rows(np.random.default_rng(1), qtype, 5, 64)
    assert matmul(qtype, 0, np.zeros((1, 0, 64), np.float32), w).shape == (1, 0, 5)
    for fast in (0, 1):  # an all-zero run quantizes to d = 0 and gives zeros, not NaN
        np.testing.assert_array_equal(matmul(qtype, fast, np.zeros((2, 64), np.float32), w), np.zeros((2, 5)))
    x = np.zeros(64, np.float32)  # rank 1
    assert matmul(qtype, 1, x, w).shape == (5,)


@needs_library
@pytest.mark.parametrize("qtype, fast, x_shape, w_shape, message", [
    (1, 0, (1, 32), (2, 34), "unsupported weight type 1"),  # F16
    (99, 0, (1, 32), (2, 34), "unsupported weight type 99"),
    (int(T.Q8_0), 2, (1, 32), (2, 34), "fast must be 0 or 1, not 2"),
    (int(T.Q8_0), 0, (1, 32), (2, 35), r"W must be \[N, R\] with R a positive multiple of Q8_0's 34-byte block"),
    (int(T.Q4_K), 0, (1, 256), (144,), r"W must be \[N, R\]"),
    (int(T.Q4_K), 1, (1, 512), (3, 144), "X's last dimension must be K = 256"),
    (int(T.Q6_K), 0, (2, 3, 4, 5, 256), (3, 210), "more than 4 dimensions"),
])
def test_bad_inputs_are_refused_with_a_plain_message(qtype, fast, x_shape, w_shape, message):
    x = np.zeros(x_shape, np.float32)
    w = np.zeros(w_shape, np.uint8)
    with pytest.raises(Exception, match=message):
        matmul(qtype, fast, x, w)


def _isa_text(monkeypatch, value: str | None) -> str:
    if value is None:
        monkeypatch.delenv("HEARTH_KERNEL_ISA", raising=False)
    else:
        monkeypatch.setenv("HEARTH_KERNEL_ISA", value)
    fn = ctypes.CDLL(str(LIBRARY)).HearthKernelsIsa
    fn.restype = ctypes.c_char_p
    return fn().decode()


@needs_library
def test_the_default_instruction_set_is_the_best_this_cpu_has(monkeypatch):
    assert _isa_text(monkeypatch, None) == cpu_isas()[-1]
    assert _isa_text(monkeypatch, "portable") == "portable"


@needs_library
def test_an_unknown_or_missing_instruction_set_is_refused_when_a_kernel_is_made(monkeypatch):
    assert _isa_text(monkeypatch, "sse9").startswith("error: hearth: HEARTH_KERNEL_ISA=sse9 is not one of portable")
    w = weight_rows(np.random.default_rng(2), T.Q8_0, 2, 32)
    with pytest.raises(Exception, match="HEARTH_KERNEL_ISA=sse9 is not one of portable, avx2, avx512, avx512vnni"):
        matmul(T.Q8_0, 0, np.zeros((1, 32), np.float32), w)
    missing = [isa for isa in ISAS if isa not in cpu_isas()]
    if missing:  # a CPU without AVX-512 (many CI runners): forcing it is refused plainly
        assert "but this CPU has no" in _isa_text(monkeypatch, missing[0])
        monkeypatch.setenv("HEARTH_KERNEL_ISA", missing[0])
        with pytest.raises(Exception, match=f"HEARTH_KERNEL_ISA={missing[0]} but this CPU has no"):
            matmul(T.Q8_0, 0, np.zeros((1, 32), np.float32), w)
