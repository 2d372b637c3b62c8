"""From a data dir and a few choices to a running Engine: find the GGUF, convert once, load."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path

from engine.errors import ModelFileError
from engine.generation import Engine
from engine.model.convert import ConvertedModel, conversion_dir, ensure_converted, gguf_digest
from engine.model.fetch import default_model, installed_path
from engine.model.precision import get_precision
from engine.paths import HearthPaths, bundled_model_dir

log = logging.getLogger(__name__)
ProgressFn = Callable[[int, int], None]
# A model below this size runs int4 as dense fp16 on CUDA: its decode step is launch-bound (hundreds
# of tiny kernels), and one cuBLAS GEMV per matrix beats a 4-bit kernel plus offsets. A larger model is
# bandwidth-bound, and the 4-bit blocks read a quarter of the bytes (bench/gpu_variants.py, docs/cuda.md).
DENSE_ON_CUDA_BELOW_BYTES = 1 << 30


def cuda_variant(weights: str, gguf: Path) -> str | None:
    """What ``weights`` runs as on CUDA (same fingerprint, fp16 compute), or None to run it as is."""
    if weights != "int4":
        return None
    return "int4-cuda-dense" if gguf.stat().st_size < DENSE_ON_CUDA_BELOW_BYTES else "int4-cuda"


def find_default_gguf(paths: HearthPaths) -> Path | None:
    """The default model's GGUF: the copy installed in the data dir, else the one a packaged build
    ships (``engine.paths.bundled_model_dir``), else None."""
    entry = default_model()
    path = installed_path(entry, paths.models)
    if path.exists():
        return path
    bundled = bundled_model_dir()
    if bundled is not None and installed_path(entry, bundled / "models").is_file():
        return installed_path(entry, bundled / "models")
    return None


def resolve_gguf(paths: HearthPaths, model: str | Path | None = None) -> Path:
    """An explicit GGUF path, or the default model (with a hint when it is missing)."""
    if model is not None:
        path = Path(model).expanduser()
        if not path.exists():
            raise ModelFileError(f"model file not found: {path}")
        return path
    path = find_default_gguf(paths)
    if path is None:
        raise ModelFileError(f"the default model is not installed in {paths.models}; run 'hearth-cli model fetch' first")
    return path


def converted_root(paths: HearthPaths, gguf: Path, weights: str) -> Path:
    """Where to find (or make) the conversion of ``gguf`` at ``weights``: the bundled model directory
    when it holds exactly that conversion, complete (it is read-only: nothing is converted there);
    else the data dir's conversion cache."""
    bundled = bundled_model_dir()
    if bundled is not None:
        root = bundled / "converted"
        if (conversion_dir(root, gguf_digest(gguf), get_precision(weights).name) / "complete.json").is_file():
            return root
    return paths.converted


def load_engine(
    paths: HearthPaths,
    *,
    model: str | Path | None = None,
    weights: str = "int4",
    provider: str = "auto",
    threads: int | None = None,
    convert_progress: ProgressFn | None = None,
) -> tuple[Engine, ConvertedModel, float]:
    """(engine, the conversion it runs, load time in ms including any conversion)."""
    start = time.perf_counter()
    gguf = resolve_gguf(paths, model)
    converted = ensure_converted(gguf, weights, converted_root(paths, gguf, weights), progress=convert_progress)
    engine = Engine.load(converted, provider, threads)
    variant = cuda_variant(weights, gguf) if engine.provider == "cuda" else None
    if variant:
        # ONNX Runtime's CUDA attention is fp16 only: an fp32 graph would run attention on the CPU and
        # copy the whole KV cache across PCIe every step. The fp16 variant has the same weights and
        # fingerprint, so saved context carries over.
        log.info("running %s as %s on CUDA", weights, variant)
        converted = ensure_converted(gguf, variant, converted_root(paths, gguf, variant), progress=convert_progress)
        engine = Engine.load(converted, "cuda", threads)
    return engine, converted, (time.perf_counter() - start) * 1000
