"""Hearth's CUDA kernels (engine/native/cuda/, prebuilt as ``libhearth_cuda.so``): ``ai.hearth.cuda.MatMulQ`` and
``GatherQ``, which run a model on CUDA straight from the GGUF's blocks (the ``int4-cuda-blocks`` precision).

The library is used only where the CUDA provider runs, for graphs converted for it (``HEARTH_CUDA_KERNELS=0`` turns
it off; ``ON_BY_DEFAULT``). ONNX Runtime's own kernels (``int4-half``, ``int4-cuda-dense``) stay the fallback: when
the library is turned off, is missing, was built from other sources than the ones beside it, or finds no GPU it was
built for (sm_80 and later).
"""

from __future__ import annotations

import ctypes
import functools
import os
from pathlib import Path

from engine.runtime import native_library

ENV_SWITCH = "HEARTH_CUDA_KERNELS"
# Whether the kernels run without being asked (HEARTH_CUDA_KERNELS=1 asks, =0 refuses). On since the H100 run of
# 2026-12-07 (~06:40 UTC): tests/test_cuda_kernels.py and tests/test_gpu.py passed on these kernels (135 passed), and
# bench/gpu.py decoded the default model at 972 tok/s against int4-cuda-dense's 761 in the same lease, a Q4_K_M 8B at
# 202 against int4-half's 196 (an earlier lease) and loaded it 5× faster (docs/benchmarks.md).
ON_BY_DEFAULT = True
DOMAIN = "ai.hearth.cuda"
MATMUL_OP, GATHER_OP = "MatMulQ", "GatherQ"
PRECISION = "int4-cuda-blocks"
SOURCE_DIR = native_library.NATIVE_DIR / "cuda"
# build.sh's order
SOURCES = ("hearth_cuda.cu", "hearth_cuda_kernels.cuh", "hearth_cuda_q8.cuh", "hearth_cuda_blocks.cuh", "hearth_cuda_attention.cuh",
           "../ort_abi.h")
# The GGUF block types the kernels read (hearth_cuda_blocks.cuh); a layer of any other type stays dense fp16.
TYPE_IDS = {"Q4_0": 2, "Q4_1": 3, "Q5_0": 6, "Q5_1": 7, "Q8_0": 8, "Q4_K": 12, "Q5_K": 13, "Q6_K": 14}
# MatMulQ's act attribute: the down projection reads act(gate)·up from gate|up side by side.
ACT_SILU, ACT_GELU_TANH = 1, 2
# MatMulQ's numerics attribute: 0 (absent) fp32 activations against each weight; 1 the activations quantized to int8
# per 32 columns and integer dot products (hearth_cuda_q8.cuh), which int4-cuda-blocks asks for.
NUMERICS_EXACT, NUMERICS_INT8 = 0, 1


def library_path() -> Path | None:
    """The prebuilt library for this platform (the CPU kernels' folder), or None."""
    cpu = native_library.platform_library()
    if cpu is None:
        return None
    path = cpu.parent / "libhearth_cuda.so"
    return path if path.is_file() else None


def enabled() -> bool:
    return os.environ.get(ENV_SWITCH, "1" if ON_BY_DEFAULT else "0") == "1"


def source_hash() -> str:
    """What build.sh bakes into the library (native_library.source_hash over SOURCES)."""
    return native_library.source_hash(SOURCE_DIR, SOURCES)


def library_source_hash(library: Path) -> str:
    return native_library.library_source_hash(library, "HearthCudaKernelsSourceHash")


@functools.lru_cache(maxsize=2)
def _usable(library: Path) -> str:
    """Why the library cannot run here, or "" when it can."""
    try:
        lib = ctypes.CDLL(str(library))
        built_from = library_source_hash(library)
    except (OSError, AttributeError) as exc:
        return f"it does not load ({exc})"
    if SOURCE_DIR.is_dir() and built_from != source_hash():
        return f"it was built from other sources ({built_from}, these are {source_hash()})"
    lib.HearthCudaKernelsUsable.restype = ctypes.c_int
    if lib.HearthCudaKernelsUsable() != 1:
        return "no GPU here has compute capability 8.0 or later"
    return ""


def unavailable() -> str:
    """Why a conversion for CUDA cannot use Hearth's kernels here, or "" when it can."""
    if not enabled():
        return f"{ENV_SWITCH}=0" if ON_BY_DEFAULT or os.environ.get(ENV_SWITCH) else f"{ENV_SWITCH} is not 1"
    library = library_path()
    if library is None:
        return "the package has no CUDA kernel library for this platform"
    return _usable(library)


def supports(type_name: str) -> bool:
    return type_name in TYPE_IDS


def register_library(options) -> None:
    """Register the library with ``options`` (ONNX Runtime SessionOptions), or ModelFileError."""
    from engine.errors import ModelFileError

    why = unavailable()
    if why:
        raise ModelFileError(f"this conversion runs on Hearth's CUDA kernels, which cannot run here: {why}")
    options.register_custom_ops_library(str(library_path()))
