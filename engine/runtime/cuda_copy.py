"""Strided copies between host memory and a CUDA buffer, through the CUDA runtime's C API (ctypes).

ONNX Runtime's Python API copies only whole OrtValues, so restoring 1,000 rows into a GPU cache
sized for 32,768 would move the whole cache out and back. ``cudaMemcpy2D`` moves rows [start, end)
of every layer, key and value, and head in one call: the cache is one device buffer shaped
[layers, 2, heads, capacity, head_dim], and the host side is the checkpoint's own order
[layers, 2, heads, n, head_dim], so both are "height" runs of n·head_dim elements at fixed pitches.
Host buffers are pinned (page-locked), which the copy engine reads at full PCIe speed.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import sys
import weakref

import numpy as np

log = logging.getLogger(__name__)

_HOST_TO_DEVICE, _DEVICE_TO_HOST = 1, 2
_CANDIDATES = {
    "win32": ["cudart64_13.dll", "cudart64_12.dll"],
}.get(sys.platform, ["libcudart.so.13", "libcudart.so.12", "libcudart.so"])


class CudaError(RuntimeError):
    pass


class CudaRuntime:
    def __init__(self, lib: ctypes.CDLL):
        self.lib = lib
        p, size = ctypes.c_void_p, ctypes.c_size_t
        lib.cudaMemcpy2D.argtypes = [p, size, p, size, size, size, ctypes.c_int]
        lib.cudaHostAlloc.argtypes = [ctypes.POINTER(p), size, ctypes.c_uint]
        lib.cudaFreeHost.argtypes = [p]
        lib.cudaMemset.argtypes = [p, ctypes.c_int, size]
        lib.cudaGetErrorString.restype = ctypes.c_char_p
        for name in ("cudaMemcpy2D", "cudaMemset", "cudaHostAlloc", "cudaFreeHost", "cudaDeviceSynchronize"):
            getattr(lib, name).restype = ctypes.c_int

    def _check(self, code: int, what: str) -> None:
        if code != 0:
            raise CudaError(f"{what} failed: {self.lib.cudaGetErrorString(code).decode(errors='replace')}")

    def copy_rows(self, dst: int, dst_pitch: int, src: int, src_pitch: int, width: int, height: int,
                  to_device: bool) -> None:
        """``height`` runs of ``width`` bytes, each ``*_pitch`` bytes after the last. Synchronous."""
        if width == 0 or height == 0:
            return
        if not to_device:  # ONNX Runtime's stream may still be writing the cache
            self._check(self.lib.cudaDeviceSynchronize(), "cudaDeviceSynchronize")
        kind = _HOST_TO_DEVICE if to_device else _DEVICE_TO_HOST
        self._check(self.lib.cudaMemcpy2D(dst, dst_pitch, src, src_pitch, width, height, kind), "cudaMemcpy2D")

    def zero(self, ptr: int, nbytes: int) -> None:
        """Fill ``nbytes`` of device memory with zeros. Synchronous."""
        self._check(self.lib.cudaMemset(ptr, 0, nbytes), "cudaMemset")
        self._check(self.lib.cudaDeviceSynchronize(), "cudaDeviceSynchronize")

    def pinned(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        """A page-locked host array, freed when the array is collected."""
        nbytes = max(1, int(np.prod(shape)) * np.dtype(dtype).itemsize)
        ptr = ctypes.c_void_p()
        self._check(self.lib.cudaHostAlloc(ctypes.byref(ptr), nbytes, 0), "cudaHostAlloc")
        raw = (ctypes.c_uint8 * nbytes).from_address(ptr.value)
        array = np.frombuffer(raw, np.uint8)[: int(np.prod(shape)) * np.dtype(dtype).itemsize]
        array = array.view(dtype).reshape(shape)
        weakref.finalize(raw, self.lib.cudaFreeHost, ptr)
        return array


_runtime: CudaRuntime | None = None
_searched = False


def cuda_runtime() -> CudaRuntime | None:
    """The process's CUDA runtime (already loaded by ONNX Runtime's CUDA provider), or None."""
    global _runtime, _searched
    if not _searched:
        _searched = True
        names = list(_CANDIDATES)
        found = ctypes.util.find_library("cudart")
        if found:
            names.append(found)
        for name in names:
            try:
                _runtime = CudaRuntime(ctypes.CDLL(name))
                break
            except (OSError, AttributeError):
                continue
        if _runtime is None:
            log.warning("the CUDA runtime library is not loadable from Python; KV rows move as whole buffers")
    return _runtime
