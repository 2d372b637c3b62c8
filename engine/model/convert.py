"""Convert a GGUF to ONNX once and keep the result, keyed by (GGUF sha256, converter version, precision).

A conversion is built in a temporary directory next to the cache and renamed into place when
complete, so an interrupted (or cancelled) conversion never leaves a half-written model that looks
finished. Its
``complete.json`` records the architecture and graph version it was built with; a conversion whose
architecture has a newer graph since is built again.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from engine.arch import architecture_for, fp16_activations_ok, get_architecture
from engine.arch.cuda_fusion import fuse_norms
from engine.errors import HearthError, ModelFileError, UnsupportedModelError
from engine.fsutil import atomic_write, fsync_dir, irregular_kind, read_json, sha256_file
from engine.model.conversion_steps import CHECKING, READING, Cancel, ConversionSteps, StepFn, step_reporter
from engine.model.facts import sidecar_digest
from engine.model.gguf_file import GGUFModel
from engine.model.precision import Precision, get_precision
from engine.runtime import native_matmul

log = logging.getLogger(__name__)

# Bump whenever the weight layout or what a conversion records changes, or a graph change touches
# every architecture: old conversions then stop matching. (One architecture's graph changes bump its
# GRAPH_VERSION instead.) 2: conversions record their architecture and graph version. 3: exact int4 runs an
# 8-bit head as two 4-bit planes, and every architecture gathers an 8-bit token table from its blocks. 4: int4 and
# int4-fast keep the GGUF's own rows for Hearth's kernels where they run (native_matmul.py), else MatMulNBits.
CONVERTER_VERSION = 4
ProgressFn = Callable[[int, int], None]
MAX_COMPLETE_BYTES = 64 << 10  # complete.json is a few hundred bytes


@dataclass(frozen=True)
class ConvertedModel:
    onnx_path: Path
    gguf_path: Path
    gguf_sha256: str
    precision: str
    converter_version: int
    architecture: str
    graph_version: int

    @property
    def fingerprint(self) -> str:
        """Changes whenever the converted weights or graph would change."""
        return model_fingerprint(self.gguf_sha256, get_precision(self.precision).weights_id, self.architecture,
                                 self.graph_version, self.converter_version)


def model_fingerprint(gguf_sha256: str, precision: str, architecture: str, graph_version: int,
                      converter_version: int = CONVERTER_VERSION) -> str:
    """The model's identity for saved context: the GGUF, the weights' form, and the graph that runs them."""
    return f"{gguf_sha256}:{converter_version}:{architecture}.{graph_version}:{precision}"


def gguf_digest(path: Path, check: Callable[[], None] | None = None) -> str:
    """SHA-256 of a GGUF, remembered in a sidecar keyed by size and mtime to skip rehashing. ``check`` runs
    between chunks of a hash and may raise to stop it."""
    path = Path(path)
    st = path.stat()
    sidecar = path.with_name(path.name + ".sha256.json")
    stamp = {"size": st.st_size, "mtime_ns": st.st_mtime_ns}
    if (cached := sidecar_digest(path, stamp)) is not None:  # a damaged sidecar (even a FIFO) reads as absent
        return cached
    digest = sha256_file(path, check=check)
    try:
        with atomic_write(sidecar) as fh:
            fh.write(json.dumps({"stamp": stamp, "sha256": digest}).encode())
    except OSError:
        log.debug("cannot cache the hash of %s", path)
    return digest


def conversion_dir(converted_root: Path, digest: str, precision: str, logits_mode: str = "last") -> Path:
    """The folder of one conversion. A precision run from the GGUF's blocks by Hearth's kernels (opt-in,
    native_matmul.py) is kept apart (``-blocks``) from ONNX Runtime's form: the two never share a folder."""
    suffix = "" if logits_mode == "last" else f"-{logits_mode}"
    return converted_root / f"{digest[:16]}-c{CONVERTER_VERSION}-{precision}{form_suffix(native_matmul.running(precision))}{suffix}"


def form_suffix(precision: Precision) -> str:
    return "-blocks" if precision.native and not precision.cuda_blocks else ""  # the CUDA form's name says it


def weight_form(precision: Precision) -> str:
    """What complete.json records: "gguf-blocks" (Hearth's kernels) or "onnxruntime"."""
    return "gguf-blocks" if precision.native else "onnxruntime"


def refuse_fp16_overflow(model: GGUFModel, precision: str) -> None:
    """UnsupportedModelError for an fp16-compute precision of a model whose activations exceed fp16."""
    arch = architecture_for(model)
    if not fp16_activations_ok(arch):
        raise UnsupportedModelError(
            f"{model.path.name}: {arch.NAME} models overflow fp16 activations, so {precision} cannot run them; "
            "use int4, int4-fast or fp32")


def ensure_converted(
    gguf_path: Path,
    precision: str,
    converted_root: Path,
    *,
    logits_mode: str = "last",
    progress: ProgressFn | None = None,
    report: StepFn | None = None,
    cancel: Cancel = None,
) -> ConvertedModel:
    """Return the cached conversion, converting first if there is none.

    ``progress(done, total)`` and ``report(done, total, step)`` hear how far a conversion is (``report``
    also what it is doing, and steps of unknown length with total 0). ``cancel`` (a CancelToken or a
    callable) is looked at between steps and layers: once set, ConversionCancelledError is raised and
    nothing of the conversion is kept, so a later call converts from scratch.
    """
    steps = ConversionSteps(Path(gguf_path).name, step_reporter(progress, report), cancel)
    prec = native_matmul.running(precision)
    if not Path(gguf_path).is_file():
        kind = irregular_kind(Path(gguf_path))
        raise ModelFileError(f"model file {gguf_path} is not a regular file: it is {kind}" if kind
                             else f"model file not found: {gguf_path}")
    if prec.compute == "float16":
        refuse_fp16_overflow(GGUFModel(gguf_path), prec.name)
    # A cache hit needs only the hash; the GGUF is parsed (and validated) only to build.
    steps.step(0, 0, CHECKING)
    digest = gguf_digest(Path(gguf_path), check=steps.check)
    final = conversion_dir(converted_root, digest, prec.name, logits_mode)
    cached = cached_conversion(final, Path(gguf_path), digest, prec.name)
    if cached is not None:
        return cached
    steps.step(0, 0, READING)
    model = GGUFModel(gguf_path)
    arch = architecture_for(model)
    arch.read_config(model)  # refuse an unsupported model before making anything
    from engine.text.tokenizer import Tokenizer

    Tokenizer.from_gguf(model)  # and one whose vocabulary cannot be used (~0.1 s for 49k tokens)
    steps.check()
    converted_root.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(converted_root)
    tmp = Path(tempfile.mkdtemp(prefix=".convert-", dir=converted_root))
    try:
        log.info("converting %s to ONNX (%s)", Path(gguf_path).name, prec.name)
        if prec.native:
            log.info("%s keeps its GGUF blocks for Hearth's kernels", Path(gguf_path).name)
        build_onnx(model, prec, tmp, logits_mode=logits_mode, steps=steps,
                   metadata={"hearth.gguf_sha256": digest, "hearth.converter_version": str(CONVERTER_VERSION)})
        steps.saving()
        with atomic_write(tmp / "complete.json") as fh:
            fh.write(json.dumps({"gguf_sha256": digest, "precision": prec.name, "converter_version": CONVERTER_VERSION,
                                 "architecture": arch.NAME, "graph_version": arch.GRAPH_VERSION,
                                 "weights": weight_form(prec)}).encode())
        steps.check()  # the last point a cancel takes effect: after it the conversion is put in place
        if final.exists() and cached_conversion(final, Path(gguf_path), digest, prec.name) is None:
            # Built by an older graph of this architecture: moved aside, removed later as a stale temporary.
            try:
                os.rename(final, Path(tempfile.mkdtemp(prefix=".convert-old-", dir=converted_root)) / "old")
            except FileNotFoundError:
                pass
        try:
            os.rename(tmp, final)
        except OSError:
            if not (final / "complete.json").exists():  # not a concurrent winner: a real failure
                raise
        fsync_dir(converted_root)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    steps.done()
    return ConvertedModel(final / "model.onnx", Path(gguf_path), digest, prec.name, CONVERTER_VERSION,
                          arch.NAME, arch.GRAPH_VERSION)


def cached_conversion(folder: Path, gguf_path: Path, digest: str, precision: str) -> ConvertedModel | None:
    """The complete conversion in ``folder`` if it was built by this code's graph for its architecture,
    else None (missing, unfinished, or built by an older graph)."""
    try:  # read_json: a FIFO or a 100,000-deep '[' is a conversion to build again, not a hang or a crash
        done = read_json(folder / "complete.json", MAX_COMPLETE_BYTES)
        arch = get_architecture(done["architecture"])
        if done["graph_version"] != arch.GRAPH_VERSION or done.get("weights") != weight_form(native_matmul.running(precision)):
            return None
    except (OSError, ValueError, KeyError, TypeError, HearthError):
        return None
    return ConvertedModel(folder / "model.onnx", gguf_path, digest, precision, CONVERTER_VERSION, arch.NAME,
                          arch.GRAPH_VERSION)


def build_onnx(
    model: GGUFModel,
    precision: Precision,
    out_dir: Path,
    *,
    logits_mode: str = "last",
    metadata: dict[str, str] | None = None,
    progress: ProgressFn | None = None,
    steps: ConversionSteps | None = None,
) -> Path:
    """Write ``model.onnx`` (+ ``model.onnx.data``) into ``out_dir`` and return the .onnx path.

    ``steps`` (ensure_converted's) hears of each layer and may stop the build there; else ``progress``."""
    from engine.arch.blocks import Graph

    if logits_mode not in ("last", "all"):
        raise ValueError("logits_mode must be 'last' or 'all'")
    arch = architecture_for(model)
    cfg = arch.read_config(model)
    out_dir.mkdir(parents=True, exist_ok=True)
    if steps is not None:
        steps.start_layers(cfg.n_layers)
        progress = steps.graph_progress
    from engine.model.onnx_writer import OnnxWriter  # here: reading a GGUF (tokenize, model info) needs no onnx

    writer = OnnxWriter(out_dir / "model.onnx.data")
    try:
        arch.build(Graph(model, cfg, precision, writer, logits_mode, progress))
        if precision.cuda_blocks:  # pre-norms into the CUDA MatMulQ that reads them (engine/arch/cuda_fusion.py)
            writer.nodes[:] = fuse_norms(writer.nodes, {o.name for o in writer.outputs})
        meta = {"hearth.config": cfg.to_json(), "hearth.architecture": arch.NAME,
                "hearth.graph_version": str(arch.GRAPH_VERSION), "hearth.precision": precision.name,
                "hearth.logits": logits_mode, "hearth.kv_dtype": precision.compute, **(metadata or {})}
        writer.save(out_dir / "model.onnx", meta)
    finally:
        writer.close()
    return out_dir / "model.onnx"


def remove_stale_temporaries(converted_root: Path, older_than_s: float = 3600.0) -> None:
    """Conversions interrupted by a crash leave ``.convert-*`` directories behind.

    Only old ones go: a young one may belong to a conversion running in another process.
    """
    import time

    if converted_root.is_dir():
        for p in converted_root.glob(".convert-*"):
            try:
                if time.time() - p.stat().st_mtime > older_than_s:
                    shutil.rmtree(p, ignore_errors=True)
            except OSError:
                pass
