"""Choosing an execution provider: CUDA when asked for (or on auto) and it really loads, else CPU."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

from engine.errors import ProviderError

log = logging.getLogger(__name__)

PROVIDER_CHOICES = ("auto", "cpu", "cuda")
_NAMES = {"cpu": "CPUExecutionProvider", "cuda": "CUDAExecutionProvider"}


@dataclass
class ProviderChoice:
    requested: str
    chosen: str  # "cpu" or "cuda", what the session actually runs on
    note: str = ""  # why it differs from the request, for the user


def quiet_onnxruntime(severity: int = 3) -> None:
    """ORT's native logger writes straight to stderr; keep it to ``severity`` (3 errors, 4 fatal)."""
    import onnxruntime as ort

    ort.set_default_logger_severity(0 if os.environ.get("HEARTH_ORT_VERBOSE") else severity)


def cuda_listed() -> bool:
    import onnxruntime as ort

    return _NAMES["cuda"] in ort.get_available_providers()


def candidate_providers(requested: str) -> list[str]:
    """Providers to try, in order, for a request."""
    if requested not in PROVIDER_CHOICES:
        raise ProviderError(f"unknown provider {requested!r}; choose one of: {', '.join(PROVIDER_CHOICES)}")
    if requested == "cpu":
        return ["cpu"]
    return ["cuda", "cpu"]


def explain_fallback(requested: str, reason: str) -> str:
    if requested == "cuda":
        return f"CUDA was requested but cannot be used: {reason}; running on the CPU instead"
    return f"CUDA is not available: {reason}; running on the CPU"


def ort_provider_list(name: str, device_id: int = 0) -> list:
    if name == "cuda":
        return [(_NAMES["cuda"], {"device_id": device_id}), _NAMES["cpu"]]
    return [_NAMES["cpu"]]


def ort_name(name: str) -> str:
    return _NAMES[name]
