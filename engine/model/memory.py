"""How much memory loading and running a model takes, and how much is free: behind the library's RAM
figures, the automatic context length and Hearth's refusal to load a model that would not fit.

Measured with tests/test_library_ram.py (peak RSS of a fresh process: a load, then a prompt filling the
context), for SmolLM2 135M and Gemma 3 270M at 512–2,048 tokens, with conversions of two layouts:

* **loading** peaks at the converted weights (their files' size when converted; else ``model_footprint``'s
  estimate of what the converter will write) plus one more copy of the largest matrix kept dense for a
  MatMul (ONNX Runtime prepacks it into its own layout, and frees the original only afterwards: a dense
  fp32 head of Gemma 3 270M is 640 MiB, and its load peaks 630 MiB above where it settles), plus
  ``RUNTIME_BYTES``;
* **running** at N tokens of context takes the settled weights, the KV cache for N tokens (it grows with
  the conversation on the CPU, so this is the most it takes), and the runtime's working memory:
  ``ACTIVATION_BYTES`` plus ``ACTIVATION_PER_TOKEN`` per token of context up to 2,048 tokens (a
  512-token prefill chunk's attention scores grow with the context it attends to; measured flat from
  there to 8,192: SmolLM2 peaked 110 MiB above its weights and KV cache at 2k, 4k and 8k, Gemma 150).

The peak is the larger of the two. ``weights_peak`` is the part that does not depend on the context;
``context_bytes`` what N tokens add on top of it (0 while running stays below the load's peak).
"""

from __future__ import annotations

import ctypes
import logging
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from engine.runtime import native_head

log = logging.getLogger(__name__)

RUNTIME_BYTES = 16 << 20
ACTIVATION_BYTES = 56 << 20
ACTIVATION_PER_TOKEN = 32 << 10
ACTIVATION_TOKENS = 2048  # working memory stops growing with the context here
# Memory left alone when deciding what fits: other programs grow, and the page cache keeps the system fast.
MARGIN_FRACTION = 0.10
MARGIN_MIN_BYTES = 256 << 20
# The automatic context length never goes below this (or the model's own, when shorter) to fit memory.
MIN_AUTO_CONTEXT = 512
CONTEXT_STEP = 256  # the CPU KV cache grows in these steps (engine/runtime/kv_cache.py)
# Slack between the automatic context's plan and the load's check of the same memory (pick_headroom).
PICK_HEADROOM_FRACTION = 0.02


@dataclass(frozen=True)
class WeightsMemory:
    resident_bytes: int  # the weights once loaded
    transient_bytes: int  # the largest dense MatMul matrix, copied while ONNX Runtime prepacks it

    @property
    def peak_bytes(self) -> int:
        """The most memory the model takes whatever its context: loading it, or running it at none."""
        return weights_peak(self.resident_bytes, self.transient_bytes)


def weights_peak(resident: int, transient: int) -> int:
    return max(resident + transient + RUNTIME_BYTES, resident + ACTIVATION_BYTES)


def context_bytes(resident: int, peak: int, kv_per_token: int, context: int) -> int:
    """What running at ``context`` tokens adds to ``peak`` (weights_peak): the KV cache and working memory
    beyond what loading needed already."""
    running = resident + ACTIVATION_BYTES + kv_per_token * context + ACTIVATION_PER_TOKEN * min(context, ACTIVATION_TOKENS)
    return max(0, running - peak)


def conversion_memory(onnx_path: Path) -> WeightsMemory:
    """What loading a conversion on disk takes: its files' size, and its largest float MatMul initializer
    (read from the graph alone; the weights file is not opened)."""
    import onnx

    onnx_path = Path(onnx_path)
    data = onnx_path.with_name(onnx_path.name + ".data")
    resident = onnx_path.stat().st_size + (data.stat().st_size if data.exists() else 0)
    graph = onnx.load(str(onnx_path), load_external_data=False).graph
    sizes = {t.name: _initializer_bytes(t) for t in graph.initializer
             if t.data_type in (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16)}
    head = native_head.tied_dense_head(graph) if native_head.available() else None
    if head is not None:  # the head runs from the table's blocks: its dense matrix is never loaded
        resident -= sizes.pop(head.dense.name, 0)
    transient = max((sizes.get(node.input[1], 0) for node in graph.node
                     if node.op_type in ("MatMul", "Gemm") and len(node.input) > 1), default=0)
    return WeightsMemory(resident, transient)


def _initializer_bytes(tensor) -> int:
    for entry in tensor.external_data:
        if entry.key == "length":
            return int(entry.value)
    return len(tensor.raw_data)


def usable_bytes(available: int) -> int:
    """What may be planned for out of ``available``, leaving a margin."""
    return max(0, available - max(MARGIN_MIN_BYTES, int(available * MARGIN_FRACTION)))


def needed_bytes(resident: int, peak: int, kv_per_token: int, context: int) -> int:
    """All a load at ``context`` tokens takes: ``peak`` (weights_peak) and what the context adds. The one
    sum both the automatic context and the load's check (engine/library.py ``fit``) test against ``fits``."""
    return peak + context_bytes(resident, peak, kv_per_token, context)


def auto_context(own: int, resident: int, kv_per_token: int, available: int | None, peak: int | None = None) -> int:
    """The model's own context, shortened (in whole KV growth steps, not below MIN_AUTO_CONTEXT) so that
    ``needed_bytes`` at it ``fits`` the memory that is free, less ``pick_headroom``; the model's own when
    that is unknown. ``peak``: weights_peak (None: the settled weights with working memory)."""
    if available is None or kv_per_token <= 0:
        return own
    peak = resident + ACTIVATION_BYTES if peak is None else peak
    planned = max(0, available - pick_headroom(available))

    def fitting(context: int) -> bool:
        return fits(needed_bytes(resident, peak, kv_per_token, context), planned)

    if fitting(own):
        return own
    # The largest whole number of steps that fits, found with the very test the load applies (a bisection:
    # the sum grows with the context), so the pick cannot be one the load then refuses.
    low, high = 0, own // CONTEXT_STEP  # steps: fitting(low * STEP) is assumed, fitting(own) is not
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if fitting(middle * CONTEXT_STEP) else (low, middle)
    return min(own, max(MIN_AUTO_CONTEXT, low * CONTEXT_STEP))


def pick_headroom(available: int) -> int:
    """What the automatic context leaves free beyond the load's own margin: the load measures the free
    memory again moments later, after the file's header and tensors were read (in a container, their
    pages count against its limit), and a pick made to the last byte was refused then: a 1,000,000-token
    model was given 454,912 tokens, and its load said "21.0 GB … of 23.6 GB free, choose a shorter context"."""
    return int(available * PICK_HEADROOM_FRACTION)


def fits(needed: int, available: int | None) -> bool:
    return available is None or needed <= usable_bytes(available)


# free memory --------------------------------------------------------------------------------------------
def available_ram() -> int | None:
    """Bytes of RAM free for a new program (Linux: MemAvailable, within a cgroup's limit; Windows: the
    available physical memory; elsewhere what sysconf tells), or None when it cannot be told."""
    found = _linux_available() if sys.platform.startswith("linux") else None
    if found is None and sys.platform == "win32":
        found = _windows_available()
    if found is None:
        try:
            found = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (AttributeError, OSError, ValueError):
            return None
    return found


def _linux_available() -> int | None:
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            available = next((int(line.split()[1]) * 1024 for line in fh if line.startswith("MemAvailable:")), None)
    except (OSError, ValueError, IndexError):
        return None
    limit = _cgroup_room()
    return available if limit is None or available is None else min(available, limit)


def _cgroup_room() -> int | None:
    """Room left under this process's cgroup v2 memory limit (a container's), or None without a limit."""
    root = Path("/sys/fs/cgroup")
    try:
        limit = (root / "memory.max").read_text().strip()
        if limit == "max":
            return None
        return max(0, int(limit) - int((root / "memory.current").read_text().strip()))
    except (OSError, ValueError):
        return None


def _windows_available() -> int | None:
    class MemoryStatus(ctypes.Structure):
        _fields_ = [("length", ctypes.c_ulong), ("load", ctypes.c_ulong), ("total_phys", ctypes.c_ulonglong),
                    ("avail_phys", ctypes.c_ulonglong), ("total_page", ctypes.c_ulonglong),
                    ("avail_page", ctypes.c_ulonglong), ("total_virtual", ctypes.c_ulonglong),
                    ("avail_virtual", ctypes.c_ulonglong), ("avail_extended", ctypes.c_ulonglong)]

    status = MemoryStatus()
    status.length = ctypes.sizeof(MemoryStatus)
    try:
        ok = ctypes.windll.kernel32.GlobalMemoryStatusEx(ctypes.byref(status))  # type: ignore[attr-defined]
    except (AttributeError, OSError):
        return None
    return int(status.avail_phys) if ok else None


def free_gpu_memory(device: int = 0) -> int | None:
    """Free memory of an NVIDIA GPU through NVML (part of the driver: no CUDA context is made, so it is
    cheap), or None without one."""
    name = "nvml.dll" if sys.platform == "win32" else "libnvidia-ml.so.1"
    try:
        nvml = ctypes.CDLL(name)
    except OSError:
        return None

    class Memory(ctypes.Structure):
        _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]

    try:
        if nvml.nvmlInit_v2() != 0:
            return None
    except AttributeError:
        return None
    try:
        handle, memory = ctypes.c_void_p(), Memory()
        if nvml.nvmlDeviceGetHandleByIndex_v2(device, ctypes.byref(handle)) != 0:
            return None
        if nvml.nvmlDeviceGetMemoryInfo(handle, ctypes.byref(memory)) != 0:
            return None
        return int(memory.free)
    except AttributeError:
        return None
    finally:
        nvml.nvmlShutdown()


# words --------------------------------------------------------------------------------------------------
def size_words(n: int) -> str:
    """Bytes as people read them: "340 MB", "5.1 GB" (powers of ten, as file managers show them)."""
    if n >= 10**9:
        return f"{n / 10**9:.1f} GB"
    if n >= 10**6:
        return f"{n / 10**6:.0f} MB"
    if n >= 10**3:
        return f"{n / 10**3:.0f} kB"
    return f"{max(n, 0)} bytes"


def fit_message(title: str, weights: int, kv: int, context: int, available: int | None, where: str) -> str:
    """The numbers in plain words; when it does not fit, what to do about it."""
    needs = (f"{title} needs about {size_words(weights)} for its weights and {size_words(kv)} for {context:,} tokens of context"
             if kv else f"{title} needs about {size_words(weights)} for its weights, {context:,} tokens of context included")
    if available is None:
        return f"{needs}; how much {where} is free cannot be told here."
    free = f"{size_words(available)} of {where} is free"
    if fits(weights + kv, available):
        return f"{needs}; {free}."
    if not fits(weights, available):
        return f"{needs}; {free}: even its weights do not fit. Close other programs or choose a smaller model."
    return f"{needs}; {free}. Choose a shorter context or close other programs."
