"""Hearth's prebuilt CPU kernel library (engine/native/): where it is for this platform, whether it is turned
on, and the source hash it was built from. Both kernels (native_attention.py, native_head.py) read it here,
so neither imports the other for it."""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import sys
from pathlib import Path

ENV_SWITCH = "HEARTH_NATIVE_ATTENTION"  # 0: no kernel of the library runs (the head runs only beside attention)
NATIVE_DIR = Path(__file__).resolve().parent.parent / "native"
SOURCES = (  # build.sh's order
    "hearth_attention.c", "hearth_gather.c", "hearth_head.c", "hearth_matmul.c", "hearth_matmul.h",
    "hearth_matmul_impl.h", "hearth_matmul_avx2.c", "hearth_matmul_avx512.c", "hearth_matmul_avx512vnni.c",
    "hearth_matmul_portable.c", "hearth_ort.c", "hearth_ort.h", "hearth_unpack.h", "ort_abi.h",
)


def platform_library() -> Path | None:
    """The prebuilt library for this machine, or None when there is none."""
    if sys.platform != "linux" or platform.machine().lower() not in ("x86_64", "amd64"):
        return None
    path = NATIVE_DIR / "linux-x86_64" / "libhearth_kernels.so"
    return path if path.is_file() else None


def enabled() -> bool:
    return os.environ.get(ENV_SWITCH, "1") != "0"


def source_hash(directory: Path = NATIVE_DIR, names: tuple[str, ...] = SOURCES) -> str:
    """What a build script bakes into its library: the first 16 hex digits of SHA-256 over its sources, in order
    (build.sh's for this library; the CUDA library's build.sh hashes its own the same way)."""
    digest = hashlib.sha256()
    for name in names:
        digest.update((directory / name).read_bytes())
    return digest.hexdigest()[:16]


def library_source_hash(library: Path, symbol: str = "HearthKernelsSourceHash") -> str:
    """The source hash a built library reports (its ``symbol``)."""
    fn = getattr(ctypes.CDLL(str(library)), symbol)
    fn.restype = ctypes.c_char_p
    return fn().decode()
