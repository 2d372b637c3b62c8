"""Open a GGUF file defensively: typed, checked access to its metadata and tensors."""

from __future__ import annotations

import mmap
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

import numpy as np
from gguf import GGUFValueType

from engine.errors import ModelFileError
from engine.model.gguf_parse import MAGIC as GGUF_MAGIC
from engine.model.gguf_parse import GGUFField, GGUFTensor, read_gguf

__all__ = ["GGUF_MAGIC", "GGUFField", "GGUFModel", "GGUFTensor"]


class GGUFModel:
    """A GGUF file opened read-only (memory-mapped) with typed accessors and clear errors."""

    def __init__(self, path: Path | str):
        self.path = Path(path)
        if not self.path.exists():
            raise ModelFileError(f"model file not found: {self.path}")
        if not self.path.is_file():
            raise ModelFileError(f"model path is not a file: {self.path}")
        try:
            contents = read_gguf(self.path)
        except OSError as exc:
            raise ModelFileError(f"{self.path.name} cannot be read ({exc.strerror or exc})") from None
        self.version = contents.version
        self.alignment = contents.alignment
        self._fields = contents.fields
        self._tensors = contents.tensors
        self._strings: dict[tuple[str, str], list[str]] = {}  # decoded string arrays, by (key, errors)
        self._buffer = contents.buffer

    def release_pages(self) -> None:
        """Drop the file's pages from this process's resident memory; they stay in the page cache and
        come back on the next read. Conversion reads each tensor once and calls this as it goes, so a
        7B file does not sit whole in its resident set."""
        advice = getattr(mmap, "MADV_DONTNEED", None)
        if self._buffer is not None and advice is not None:
            try:
                self._buffer.madvise(advice)
            except (OSError, ValueError):  # closed, or a platform without the advice: only memory at stake
                pass

    # metadata -----------------------------------------------------------------------------------
    @property
    def fields(self) -> Mapping[str, GGUFField]:
        """Every metadata pair in file order, with gguf's pseudo-keys GGUF.version/tensor_count/kv_count."""
        return MappingProxyType(self._fields)

    def value(self, key: str, default: Any = None) -> Any:
        field = self._fields.get(key)
        if field is None:
            return default
        if field.item_type == GGUFValueType.STRING:
            return list(self._decoded(field, "strict"))
        try:
            return field.contents()
        except UnicodeDecodeError:
            raise ModelFileError(f"{self.path.name}: metadata field {key!r} is not UTF-8 text") from None

    def require(self, key: str) -> Any:
        if key not in self._fields:
            raise ModelFileError(f"{self.path.name}: required metadata {key!r} is missing")
        return self.value(key)

    def string_array(self, key: str) -> list[str]:
        """An array of strings (bytes that are not UTF-8 shown as U+FFFD); [] when absent."""
        field = self._fields.get(key)
        if field is None:
            return []
        if field.item_type != GGUFValueType.STRING:
            raise ModelFileError(f"{self.path.name}: metadata field {key!r} is not a list of strings")
        return list(self._decoded(field, "replace"))

    def array_length(self, key: str) -> int:
        field = self._fields.get(key)
        return field.count if field is not None else 0

    def int_array(self, key: str) -> np.ndarray:
        """An array of integers as int64; empty when absent."""
        return self._numbers(key, np.int64)

    def float_array(self, key: str) -> np.ndarray:
        """An array of numbers as float32 (e.g. a vocabulary's scores); empty when absent."""
        return self._numbers(key, np.float32)

    def _numbers(self, key: str, dtype: type) -> np.ndarray:
        field = self._fields.get(key)
        if field is None:
            return np.zeros(0, dtype=dtype)
        if field.item_type in (None, GGUFValueType.STRING):
            raise ModelFileError(f"{self.path.name}: metadata field {key!r} is not a list of numbers")
        return field.raw.astype(dtype)

    def _decoded(self, field: GGUFField, errors: str) -> list[str]:
        cached = self._strings.get((field.name, errors))
        if cached is None:
            try:
                cached = field.contents(errors)
            except UnicodeDecodeError:
                raise ModelFileError(f"{self.path.name}: metadata field {field.name!r} holds text that is not UTF-8") from None
            self._strings[(field.name, errors)] = cached
        return cached

    # tensors ------------------------------------------------------------------------------------
    def has_tensor(self, name: str) -> bool:
        return name in self._tensors

    @property
    def tensors(self) -> tuple[GGUFTensor, ...]:
        """Every tensor, in file order."""
        return tuple(self._tensors.values())

    def tensor(self, name: str) -> GGUFTensor:
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


