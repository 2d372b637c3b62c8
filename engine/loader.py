"""From a data dir and a few choices to a running Engine: find the GGUF, convert once, load."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from engine.arch import architecture_for, fp16_activations_ok
from engine.errors import ModelFileError, ModelNotFoundError, ModelNotInstalledError, ProviderError
from engine.fsutil import irregular_kind
from engine.library import ModelLibrary, chosen_model
from engine.model.conversion_steps import Cancel, StepFn, step_reporter
from engine.model.convert import ConvertedModel, cached_conversion, conversion_dir, ensure_converted, gguf_digest
from engine.model.fetch import default_model, installed_path
from engine.model.gguf_file import GGUFModel
from engine.model.precision import cuda_variant, get_precision
from engine.paths import HearthPaths, bundled_model_dir
from engine.runtime import cuda_kernels, providers

if TYPE_CHECKING:  # the engine (numpy, onnx, the runtime) loads only with a model: tokenize and model info skip it
    from engine.generation import Engine

log = logging.getLogger(__name__)
ProgressFn = Callable[[int, int], None]
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
    """An explicit GGUF path, a model library name (a catalog key such as ``gemma-3-270m``, or any name
    ``hearth-cli model ls`` shows), or the default model: the one ``hearth-cli model use`` chose, else
    the catalog's default (with a hint when it is missing)."""
    if model is None:
        return _chosen_gguf(paths) or _default_gguf(paths)
    path = Path(model).expanduser()
    if path.exists():
        if (kind := irregular_kind(path)) is not None:  # a FIFO would hang the read; a folder is no model
            raise ModelFileError(f"model file {path} is not a regular file: it is {kind}")
        return path
    if not isinstance(model, str) or os.sep in model or path.suffix.lower() == ".gguf":  # meant as a file
        raise ModelFileError(f"model file not found: {path}")
    return ModelLibrary(paths).gguf_path(model)


def _default_gguf(paths: HearthPaths) -> Path:
    path = find_default_gguf(paths)
    if path is None:
        raise ModelNotInstalledError(f"the default model is not installed in {paths.models}; run 'hearth-cli model fetch' first")
    return path


def _chosen_gguf(paths: HearthPaths) -> Path | None:
    """The GGUF of the model ``hearth-cli model use`` chose (None when the catalog's default is the choice)."""
    name = chosen_model(paths)
    if name is None:
        return None
    try:
        return ModelLibrary(paths).gguf_path(name)
    except ModelNotFoundError:
        raise ModelFileError(f"the model chosen to load by default, {name}, is no longer in the library; "
                             "choose one with 'hearth-cli model use NAME'") from None


def converted_root(paths: HearthPaths, gguf: Path, weights: str) -> Path:
    """Where to find (or make) the conversion of ``gguf`` at ``weights``: the bundled model directory
    when it holds exactly that conversion, complete (it is read-only: nothing is converted there);
    else the data dir's conversion cache."""
    bundled = bundled_model_dir()
    if bundled is not None:
        root = bundled / "converted"
        digest, precision = gguf_digest(gguf), get_precision(weights).name
        if cached_conversion(conversion_dir(root, digest, precision), gguf, digest, precision) is not None:
            return root
    return paths.converted


def bundled_conversion(weights: str) -> ConvertedModel | None:
    """The default model converted at ``weights`` as a packaged build ships it, or None.

    Such a build need not ship the GGUF (its weights would be in the package twice): beside the
    conversion it ships ``tokenizer/<name>.gguf``, the GGUF's metadata without its tensors, which is all
    an engine reads from it (vocabulary, merges, chat template). The fingerprint is the full GGUF's
    pinned SHA-256, so saved context moves between a packaged install and a pip install.
    """
    bundled = bundled_model_dir()
    if bundled is None:
        return None
    entry = default_model()
    precision = get_precision(weights).name
    folder = conversion_dir(bundled / "converted", entry.gguf_sha256, precision)
    tokenizer = bundled / "tokenizer" / entry.filename
    if not tokenizer.is_file():
        return None
    return cached_conversion(folder, tokenizer, entry.gguf_sha256, precision)


def default_model_available(paths: HearthPaths, weights: str) -> bool:
    """Whether the default model can run at ``weights`` without a download."""
    return find_default_gguf(paths) is not None or bundled_conversion(weights) is not None


def locate_model(paths: HearthPaths, model: str | Path | None, weights: str) -> tuple[Path | None, ConvertedModel | None]:
    """(the GGUF to run, else None; the bundled conversion to run when there is no GGUF, else None).

    Raises ModelFileError saying what to do when there is neither.
    """
    chosen = _chosen_gguf(paths) if model is None else None
    gguf = resolve_gguf(paths, model) if model is not None else chosen or find_default_gguf(paths)
    if gguf is not None:
        return gguf, None
    if bundled_model_dir() is None:
        resolve_gguf(paths)  # says the default model is not installed and what to do
    shipped = bundled_conversion(weights)
    if shipped is None:
        raise ModelNotInstalledError(f"the default model is not installed in {paths.models} (this build ships it converted, but "
                             f"not for {weights}); run 'hearth-cli model fetch' first")
    return None, shipped


def load_engine(
    paths: HearthPaths,
    *,
    model: str | Path | None = None,
    weights: str = "int4",
    provider: str = "auto",
    threads: int | None = None,
    convert_progress: ProgressFn | None = None,
    convert_report: StepFn | None = None,
    cancel: Cancel = None,
) -> tuple[Engine, ConvertedModel, float]:
    """(engine, the conversion it runs, load time in ms including any conversion).

    ``convert_report(done, total, step)`` hears each step of a conversion and then "starting the model";
    ``cancel`` stops a conversion between its steps (ConversionCancelledError, nothing kept).

    The graph is chosen before any session is made, so a load makes one model session: ``weights``'
    CUDA variant when CUDA may run here (``cuda_variant``), on CUDA only; otherwise, or when that
    session cannot run on CUDA after all, ``weights`` itself.
    """
    from engine.generation import Engine

    start = time.perf_counter()
    report = step_reporter(convert_progress, convert_report)
    gguf, shipped = locate_model(paths, model, weights)
    may_use_cuda = "cuda" in providers.candidate_providers(provider) and not providers.cuda_unavailable()
    fallback = ""
    if may_use_cuda and gguf is not None and not fp16_activations_ok(architecture_for(GGUFModel(gguf))):
        fallback = "this model's activations overflow the fp16 that CUDA attention needs"
        may_use_cuda = False
    for variant in cuda_variants(weights, gguf) if may_use_cuda and gguf is not None else []:
        # ONNX Runtime's CUDA attention is fp16 only: an fp32 graph would run attention on the CPU and
        # copy the whole KV cache across PCIe every step. The fp16 variants have the same weights and
        # fingerprint, so saved context carries over. They are chosen for CUDA, so they run there or not at all.
        converted = ensure_converted(gguf, variant, converted_root(paths, gguf, variant), report=report, cancel=cancel)
        _starting(report)
        try:
            engine = Engine.load(converted, "cuda", threads, cpu_fallback=False)
            log.info("running %s as %s on CUDA", weights, variant)
            return engine, converted, (time.perf_counter() - start) * 1000
        except (ProviderError, ModelFileError) as exc:
            fallback = exc.reason if isinstance(exc, ProviderError) else str(exc)
            log.warning("%s cannot run on CUDA here (%s)", variant, fallback)
    converted = shipped or ensure_converted(gguf, weights, converted_root(paths, gguf, weights), report=report,
                                            cancel=cancel)
    _starting(report)
    engine = Engine.load(converted, "cpu" if fallback else provider, threads)
    if fallback:
        engine.runner.provider_note = providers.fallback_note(provider, fallback)
    if engine.provider == "cuda" and gguf is None and weights == "int4":
        # A CPU bundle without the GGUF: nothing to build the CUDA variant from (the GPU build ships the GGUF).
        log.warning("running %s as is on CUDA: fetch the model ('hearth-cli model fetch') for its CUDA variant", weights)
    return engine, converted, (time.perf_counter() - start) * 1000


def cuda_variants(weights: str, gguf: Path) -> list[str]:
    """What ``weights`` may run as on CUDA, in the order to try: on Hearth's CUDA kernels where they can run here
    (cuda_kernels.py), then on ONNX Runtime's own (precision.cuda_variant); [] to run it as is."""
    fallback = cuda_variant(weights, gguf)
    if fallback is None:
        return []
    if cuda_kernels.unavailable():
        return [fallback]
    return [cuda_kernels.PRECISION, fallback]


def _starting(report: StepFn | None) -> None:
    """Say that the model's session is being made (seconds for a large model; not cancellable)."""
    if report is not None:
        report(0, 0, "starting the model")
