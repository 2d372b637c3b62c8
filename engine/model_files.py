"""A model file without loading the model: resolve a name to its GGUF, describe or inspect it, tokenize with
its vocabulary, fetch a catalog model, convert one (``hearth-cli model``, ``tokenize``).

Everything heavy is imported inside the function that needs it: ``tokenize`` and ``model info`` must not
start ONNX Runtime (tests/test_cli_fast.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engine.arch.hparams import MAX_CONTEXT_LENGTH
from engine.model.memory import size_words
from engine.paths import HearthPaths
from engine.types import ModelFootprint

if TYPE_CHECKING:
    from engine.model.convert import ConvertedModel
    from engine.model.fetch import ModelEntry
    from engine.text.profile import TextProfile

__all__ = ["MAX_CONTEXT_LENGTH", "ModelFileInfo", "catalog_entry", "convert_model_file", "fetch_catalog_model",
           "inspect_model_file", "resolve_model_file", "size_words", "tokenize_file", "tokenizer_file"]


@dataclass(frozen=True)
class ModelFileInfo:
    """What ``model info`` shows of a GGUF: its config (None with the reason it cannot run yet), its text
    side, its catalog entry when it is a catalog model's file, and its memory footprint."""

    path: Path
    config: dict[str, Any] | None
    unsupported: str | None
    text: TextProfile
    catalog: ModelEntry | None
    footprint: ModelFootprint
    converter_version: int


def resolve_model_file(paths: HearthPaths, model: str | Path | None = None) -> Path:
    """The GGUF a model name, path or (None) the default names; ModelNotInstalledError when there is none."""
    from engine.loader import resolve_gguf

    return resolve_gguf(paths, model)


def inspect_model_file(path: Path, weights: str) -> ModelFileInfo:
    """Read ``path``'s header: config, text profile, catalog entry, and the footprint at ``weights``."""
    from engine.arch import model_config
    from engine.errors import UnsupportedModelError
    from engine.model.convert import CONVERTER_VERSION
    from engine.model.fetch import load_manifest
    from engine.model.footprint import model_footprint
    from engine.model.gguf_file import GGUFModel
    from engine.text.profile import describe

    gguf = GGUFModel(path)
    try:
        config, unsupported = model_config(gguf).__dict__, None
    except UnsupportedModelError as exc:  # the text side can still be described
        config, unsupported = None, str(exc)
    text = describe(gguf)
    catalog = next((e for e in load_manifest()[1].values() if e.filename == path.name), None)
    return ModelFileInfo(path, config, unsupported, text, catalog, model_footprint(gguf, weights), CONVERTER_VERSION)


def catalog_entry(name: str | None) -> ModelEntry:
    """The catalog model called ``name`` (None: the default); a HearthError listing the names otherwise."""
    from engine.model.fetch import require_entry

    return require_entry(name)


def fetch_catalog_model(entry: ModelEntry, models_dir: Path, **options: Any) -> Path:
    """Install and verify ``entry``'s GGUF under ``models_dir`` (options as engine.model.fetch.fetch_model's)."""
    from engine.model.fetch import fetch_model

    return fetch_model(entry, models_dir, **options)


def convert_model_file(paths: HearthPaths, model: str | None, weights: str,
                       progress: Callable[[int, int], None] | None = None) -> ConvertedModel:
    """The ONNX conversion of ``model`` at ``weights``, converting now when there is none cached."""
    from engine.model.convert import ensure_converted

    return ensure_converted(resolve_model_file(paths, model), weights, paths.converted, progress=progress)


def tokenizer_file(paths: HearthPaths, model: str | None) -> Path:
    """The GGUF ``tokenize`` reads the vocabulary from (its header only; the model is never loaded): the
    model's own file, else, in a packaged build that ships the default model converted without its
    weights, the tokenizer file beside that conversion."""
    from engine.errors import ModelNotInstalledError
    from engine.model.fetch import default_model
    from engine.paths import bundled_model_dir

    try:
        return resolve_model_file(paths, model)
    except ModelNotInstalledError:
        bundled = bundled_model_dir() if model is None else None
        shipped = bundled / "tokenizer" / default_model().filename if bundled is not None else None
        if shipped is None or not shipped.is_file():
            raise
        return shipped


def tokenize_file(path: Path, text: str) -> list[int]:
    """``text``'s token ids under the vocabulary of the GGUF at ``path``."""
    from engine.model.gguf_file import GGUFModel
    from engine.text.tokenizer import Tokenizer

    return Tokenizer.from_gguf(GGUFModel(path)).encode(text)
