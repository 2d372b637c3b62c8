"""Whether conversions here keep the GGUF's own blocks and run them with Hearth's matmul kernels
(``ai.hearth.MatMulQ`` / ``GatherQ``, engine/native/hearth_matmul*.c, hearth_gather.c).

The blocks are the model's weights as the GGUF stores them, so such a conversion is the size of the GGUF
and nothing is re-quantized. The form is opt-in (``HEARTH_NATIVE_MATMUL=1``): on the real Gemma 3 270M
Q4_K_M it halves peak memory (1204 against 2354 MiB for int4) but decodes at 22 tok/s against ONNX Runtime's
37 (int4) and 60 (int4-fast), 2 threads (bench/engine.py, docs/benchmarks.md), so ONNX Runtime's MatMulNBits
form stays the default until the kernels beat it. With the switch on, the library must exist for this
platform, load, and say this CPU can run it (``HearthKernelsUsable``), and ``HEARTH_NATIVE_ATTENTION=0`` (no
kernel of the library at all) must not be set. The two forms are kept in differently named folders
(convert.py). ``HEARTH_KERNEL_ISA`` forces one instruction set (portable, avx2, avx512, avx512vnni).
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os
from dataclasses import replace
from pathlib import Path

from engine.model.precision import Precision, get_precision
from engine.runtime import cuda_kernels, native_library

log = logging.getLogger(__name__)

ENV_SWITCH = "HEARTH_NATIVE_MATMUL"
ISA_SWITCH = "HEARTH_KERNEL_ISA"
DOMAIN = "ai.hearth"
MATMUL_OP, GATHER_OP = "MatMulQ", "GatherQ"
# The GGUF block types the kernels read (gguf.GGMLQuantizationType values): every type the supported GGUFs use.
TYPE_IDS = {"Q4_0": 2, "Q4_1": 3, "Q5_0": 6, "Q5_1": 7, "Q8_0": 8,
            "Q2_K": 10, "Q3_K": 11, "Q4_K": 12, "Q5_K": 13, "Q6_K": 14}


def enabled() -> bool:
    return os.environ.get(ENV_SWITCH, "0") == "1" and native_library.enabled()


@functools.lru_cache(maxsize=4)
def _usable(library: Path) -> bool:
    try:
        lib = ctypes.CDLL(str(library))
        usable = lib.HearthKernelsUsable
    except (OSError, AttributeError) as exc:  # no library for this CPU, or one from before these kernels
        log.info("native matmul: %s cannot be used (%s)", library.name, exc)
        return False
    usable.restype = ctypes.c_int
    return usable() == 1


def usable() -> bool:
    """Whether this machine can run the kernels (the library exists, loads and accepts this CPU)."""
    library = native_library.platform_library()
    return library is not None and _usable(library)


def available() -> bool:
    """Whether a conversion made now runs its weights from the GGUF's blocks with Hearth's kernels."""
    return enabled() and usable()


def running(precision: Precision | str) -> Precision:
    """``precision`` (or its name) as it runs here: from the GGUF's blocks where Hearth's kernels can."""
    if isinstance(precision, str):
        precision = get_precision(precision)
    if precision.native_capable and not precision.native and available():
        return replace(precision, native=True)
    return precision


def supports(type_name: str, precision: Precision | None = None) -> bool:
    """Whether a layer of ``type_name`` stays in its GGUF blocks: for the CPU kernels, or for the CUDA ones where
    ``precision`` runs on them (cuda_kernels.py)."""
    if precision is not None and precision.cuda_blocks:
        return cuda_kernels.supports(type_name)
    return type_name in TYPE_IDS


def chosen_isa() -> str:
    """The instruction set the kernels pick under the current environment (``error: ...`` when a forced one
    is missing), or "" without the library."""
    if not usable():
        return ""
    fn = ctypes.CDLL(str(native_library.platform_library())).HearthKernelsIsa
    fn.restype = ctypes.c_char_p
    return fn().decode()


def graph_domains(onnx_path: Path) -> set[str]:
    """The op domains the converted graph at ``onnx_path`` imports: DOMAIN where it runs the CPU kernels,
    cuda_kernels.DOMAIN where it runs the CUDA ones."""
    import onnx

    model = onnx.load(str(onnx_path), load_external_data=False)
    return {o.domain for o in model.opset_import}


def register_library(options) -> None:
    """Register the kernel library with ``options`` (ONNX Runtime SessionOptions), or ModelFileError."""
    from engine.errors import ModelFileError

    if not usable():
        raise ModelFileError("this conversion runs on Hearth's CPU kernels, which cannot run on this machine; "
                             "delete it (hearth-cli model remove or the converted folder) to convert again")
    options.register_custom_ops_library(str(native_library.platform_library()))
