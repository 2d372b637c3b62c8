"""Open a GGUF file defensively and read a llama-family model's hyperparameters from it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from engine.errors import ModelFileError, UnsupportedModelError

GGUF_MAGIC = b"GGUF"
SUPPORTED_ARCHITECTURES = ("llama",)


@dataclass(frozen=True)
class LlamaConfig:
    """Everything the graph builder needs, all read from GGUF metadata."""

    architecture: str
    n_layers: int
    n_embd: int
    n_ff: int
    n_head: int
    n_head_kv: int
    head_dim: int
    rope_dim: int
    rope_base: float
    rope_scale: float  # linear position scaling; 1.0 when the model has none
    norm_eps: float
    vocab_size: int
    context_length: int
    tied_embeddings: bool


class GGUFModel:
    """A GGUF file opened read-only (memory-mapped) with typed accessors and clear errors."""

    def __init__(self, path: Path | str):
        self.path = Path(path)
        self._reader = _open_reader(self.path)
        self._tensors = {t.name: t for t in self._reader.tensors}

    # metadata -----------------------------------------------------------------------------------
    def value(self, key: str, default: Any = None) -> Any:
        field = self._reader.fields.get(key)
        if field is None:
            return default
        try:
            return field.contents()
        except Exception as exc:  # the gguf package raises assorted errors on bad fields
            raise ModelFileError(f"{self.path.name}: metadata field {key!r} is unreadable ({exc})") from exc

    def require(self, key: str) -> Any:
        if key not in self._reader.fields:
            raise ModelFileError(f"{self.path.name}: required metadata {key!r} is missing")
        return self.value(key)

    def string_array(self, key: str) -> list[str]:
        """A string-array field without materialising a Python object per byte."""
        field = self._reader.fields.get(key)
        if field is None:
            return []
        try:
            return [bytes(field.parts[i]).decode("utf-8", errors="replace") for i in field.data]
        except Exception as exc:
            raise ModelFileError(f"{self.path.name}: metadata field {key!r} is unreadable ({exc})") from exc

    def array_length(self, key: str) -> int:
        field = self._reader.fields.get(key)
        return len(field.data) if field is not None else 0

    def int_array(self, key: str) -> np.ndarray:
        field = self._reader.fields.get(key)
        if field is None:
            return np.zeros(0, dtype=np.int64)
        try:
            return np.array([int(field.parts[i][0]) for i in field.data], dtype=np.int64)
        except Exception as exc:
            raise ModelFileError(f"{self.path.name}: metadata field {key!r} is unreadable ({exc})") from exc

    # tensors ------------------------------------------------------------------------------------
    def has_tensor(self, name: str) -> bool:
        return name in self._tensors

    def tensor(self, name: str):  # -> gguf.ReaderTensor
        try:
            return self._tensors[name]
        except KeyError:
            raise ModelFileError(f"{self.path.name}: tensor {name!r} is missing") from None

    def config(self) -> LlamaConfig:
        return read_llama_config(self)


def _open_reader(path: Path):
    import gguf

    if not path.exists():
        raise ModelFileError(f"model file not found: {path}")
    if not path.is_file():
        raise ModelFileError(f"model path is not a file: {path}")
    with open(path, "rb") as fh:
        magic = fh.read(4)
    if magic != GGUF_MAGIC:
        raise ModelFileError(f"{path.name} is not a GGUF file (it does not start with the GGUF magic bytes)")
    try:
        return gguf.GGUFReader(path, "r")
    except Exception as exc:  # truncated or damaged: the reader fails in many ways
        raise ModelFileError(
            f"{path.name} is damaged or truncated and cannot be read as GGUF ({type(exc).__name__}: {exc}); "
            "download it again with 'hearth-cli model fetch'"
        ) from exc


def _positive_int(model: GGUFModel, key: str, default: int | None = None) -> int:
    raw = model.value(key, default) if default is not None else model.require(key)
    try:
        value = int(raw)
    except (TypeError, ValueError):
        raise ModelFileError(f"{model.path.name}: metadata {key!r} is not an integer ({raw!r})") from None
    if value <= 0:
        raise ModelFileError(f"{model.path.name}: metadata {key!r} must be positive, got {value}")
    return value


def read_llama_config(model: GGUFModel) -> LlamaConfig:
    arch = model.require("general.architecture")
    if arch not in SUPPORTED_ARCHITECTURES:
        raise UnsupportedModelError(
            f"{model.path.name}: architecture {arch!r} is not supported; "
            f"Hearth runs {', '.join(SUPPORTED_ARCHITECTURES)} models"
        )
    p = arch + "."
    n_embd = _positive_int(model, p + "embedding_length")
    n_head = _positive_int(model, p + "attention.head_count")
    n_head_kv = _positive_int(model, p + "attention.head_count_kv", n_head)
    head_dim = _positive_int(model, p + "attention.key_length", n_embd // n_head or 1)
    value_dim = _positive_int(model, p + "attention.value_length", head_dim)
    if value_dim != head_dim:
        raise UnsupportedModelError(f"{model.path.name}: different key and value head sizes are not supported")
    if n_head % n_head_kv:
        raise ModelFileError(f"{model.path.name}: {n_head} query heads cannot share {n_head_kv} KV heads evenly")
    rope_dim = _positive_int(model, p + "rope.dimension_count", head_dim)
    if rope_dim != head_dim:
        raise UnsupportedModelError(
            f"{model.path.name}: partial rotary embeddings ({rope_dim} of {head_dim} dims) are not supported"
        )
    scaling = model.value(p + "rope.scaling.type", "none")
    rope_scale = 1.0
    if scaling == "linear":
        rope_scale = float(model.value(p + "rope.scaling.factor", 1.0))
    elif scaling not in ("none", None):
        raise UnsupportedModelError(f"{model.path.name}: rope scaling {scaling!r} is not supported")
    if model.has_tensor("rope_freqs.weight"):
        raise UnsupportedModelError(f"{model.path.name}: per-frequency rope factors (llama 3.1 style) are not supported")

    vocab_size = int(model.value(p + "vocab_size", 0) or 0)
    if vocab_size <= 0:
        vocab_size = model.array_length("tokenizer.ggml.tokens")
    if vocab_size <= 0:
        raise ModelFileError(f"{model.path.name}: vocabulary size is missing")

    embd = model.tensor("token_embd.weight")
    if tuple(int(x) for x in embd.shape) != (n_embd, vocab_size):
        raise ModelFileError(
            f"{model.path.name}: token_embd.weight has shape {list(embd.shape)}, expected [{n_embd}, {vocab_size}]"
        )
    return LlamaConfig(
        architecture=arch,
        n_layers=_positive_int(model, p + "block_count"),
        n_embd=n_embd,
        n_ff=_positive_int(model, p + "feed_forward_length"),
        n_head=n_head,
        n_head_kv=n_head_kv,
        head_dim=head_dim,
        rope_dim=rope_dim,
        rope_base=float(model.value(p + "rope.freq_base", 10000.0)),
        rope_scale=rope_scale,
        norm_eps=float(model.require(p + "attention.layer_norm_rms_epsilon")),
        vocab_size=vocab_size,
        context_length=_positive_int(model, p + "context_length"),
        tied_embeddings=not model.has_tensor("output.weight"),
    )
