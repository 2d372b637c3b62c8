"""From a data dir and a few choices to a running Engine: find the GGUF, convert once, load."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path

from engine.errors import ModelFileError
from engine.generation import Engine
from engine.model.convert import ConvertedModel, ensure_converted
from engine.model.fetch import default_model, installed_path
from engine.paths import HearthPaths

log = logging.getLogger(__name__)
ProgressFn = Callable[[int, int], None]


def resolve_gguf(paths: HearthPaths, model: str | Path | None = None) -> Path:
    """An explicit GGUF path, or the installed default model (with a hint when it is missing)."""
    if model is not None:
        path = Path(model).expanduser()
        if not path.exists():
            raise ModelFileError(f"model file not found: {path}")
        return path
    path = installed_path(default_model(), paths.models)
    if not path.exists():
        raise ModelFileError(f"the default model is not installed in {paths.models}; run 'hearth-cli model fetch' first")
    return path


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
    converted = ensure_converted(gguf, weights, paths.converted, progress=convert_progress)
    engine = Engine.load(converted, provider, threads)
    return engine, converted, (time.perf_counter() - start) * 1000
