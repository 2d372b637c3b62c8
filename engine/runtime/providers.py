"""Choosing an execution provider: CUDA when asked for (or on auto) and it really loads, else CPU."""

from __future__ import annotations

import ctypes
import functools
import logging
import os
import sys

from engine.errors import ProviderError

log = logging.getLogger(__name__)

PROVIDER_CHOICES = ("auto", "cpu", "cuda")
_NAMES = {"cpu": "CPUExecutionProvider", "cuda": "CUDAExecutionProvider"}
_CUDA_DRIVER = "nvcuda.dll" if sys.platform == "win32" else "libcuda.so.1"
# InferenceSessions made so far in this process (tests check how many a model load makes).
sessions_opened = 0


def quiet_onnxruntime(severity: int = 3) -> None:
    """ORT's native logger writes straight to stderr; keep it to ``severity`` (3 errors, 4 fatal)."""
    import onnxruntime as ort

    ort.set_default_logger_severity(0 if os.environ.get("HEARTH_ORT_VERBOSE") else severity)


def cuda_listed() -> bool:
    import onnxruntime as ort

    return _NAMES["cuda"] in ort.get_available_providers()


@functools.cache
def cuda_unavailable() -> str:
    """Why CUDA certainly cannot run here, or "" when it may (only a session can tell for sure).

    Asked before a session is made, so a machine without an NVIDIA GPU (where the onnxruntime-gpu
    wheel is installed all the same) neither converts the model's CUDA variant nor loads it to find out.
    """
    if not cuda_listed():
        return "this onnxruntime build has no CUDA provider"
    try:
        driver = ctypes.CDLL(_CUDA_DRIVER)  # the NVIDIA driver: every CUDA program needs it
    except OSError:
        return "no NVIDIA driver is installed"
    count = ctypes.c_int(0)
    if driver.cuInit(0) != 0 or driver.cuDeviceGetCount(ctypes.byref(count)) != 0 or count.value < 1:
        return "the NVIDIA driver finds no usable GPU"
    return ""


def candidate_providers(requested: str) -> list[str]:
    """Providers to try, in order, for a request."""
    if requested not in PROVIDER_CHOICES:
        raise ProviderError(f"unknown provider {requested!r}; choose one of: {', '.join(PROVIDER_CHOICES)}")
    if requested == "cpu":
        return ["cpu"]
    return ["cuda", "cpu"]


def fallback_note(requested: str, reason: str) -> str:
    """What to tell the user when ``requested`` ends up on the CPU because of ``reason``; logged too."""
    if requested == "cuda":
        note = f"CUDA was requested but cannot be used: {reason}; running on the CPU instead"
        log.warning("%s", note)
    else:
        note = f"CUDA is not available: {reason}; running on the CPU"
        log.info("%s", note)
    return note


def open_session(model, options, provider_list: list):
    """An InferenceSession over ``model``, a path or a serialized graph (every session Hearth makes goes
    through here, and is counted)."""
    import onnxruntime as ort

    global sessions_opened
    source = model if isinstance(model, bytes) else str(model)
    session = ort.InferenceSession(source, options, providers=provider_list)
    sessions_opened += 1
    return session


def ort_provider_list(name: str, device_id: int = 0) -> list:
    if name == "cuda":
        return [(_NAMES["cuda"], {"device_id": device_id}), _NAMES["cpu"]]
    return [_NAMES["cpu"]]


def ort_name(name: str) -> str:
    return _NAMES[name]
