"""Open a GGUF file defensively: typed, checked access to its metadata and tensors."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from engine.errors import ModelFileError

if TYPE_CHECKING:
    from engine.arch.config import ModelConfig

GGUF_MAGIC = b"GGUF"


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

    def positive_int(self, key: str, default: int | None = None) -> int:
        """An integer field that must be positive; required unless a default is given."""
        raw = self.value(key, default) if default is not None else self.require(key)
        try:
            value = int(raw)
        except (TypeError, ValueError):
            raise ModelFileError(f"{self.path.name}: metadata {key!r} is not an integer ({raw!r})") from None
        if value <= 0:
            raise ModelFileError(f"{self.path.name}: metadata {key!r} must be positive, got {value}")
        return value

    def vocab_size(self, key: str, n_embd: int) -> int:
        """The vocabulary size (metadata ``key``, else the token list's length), checked against the
        token embedding table's shape."""
        vocab_size = int(self.value(key, 0) or 0)
        if vocab_size <= 0:
            vocab_size = self.array_length("tokenizer.ggml.tokens")
        if vocab_size <= 0:
            raise ModelFileError(f"{self.path.name}: vocabulary size is missing")
        embd = self.tensor("token_embd.weight")
        if tuple(int(x) for x in embd.shape) != (n_embd, vocab_size):
            raise ModelFileError(
                f"{self.path.name}: token_embd.weight has shape {list(embd.shape)}, expected [{n_embd}, {vocab_size}]"
            )
        return vocab_size

    def config(self) -> ModelConfig:
        """The model's config, read by its architecture's module (UnsupportedModelError if none)."""
        from engine.arch import architecture_for

        return architecture_for(self).read_config(self)


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
