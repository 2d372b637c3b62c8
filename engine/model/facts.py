"""What the model library shows of a GGUF file, read from its header and metadata alone (no tensor data is
read beyond one row per tensor for the memory estimate), and remembered per (path, size, mtime) so that
listing a folder of multi-GB files is instant the second time.

The cache is a JSON file of Hearth's own, but it is read as untrusted like every file on disk: an entry
that does not have the expected shape is a miss, and a file that cannot be read is started afresh.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from engine.errors import HearthError, ModelFileError, UnsupportedModelError
from engine.fsutil import atomic_write, read_json
from engine.model.memory import WeightsMemory, conversion_memory

log = logging.getLogger(__name__)

FACTS_VERSION = 2  # 2: weights_bytes counts the rotary tables (a long context's are large)
MAX_CACHE_BYTES = 16 << 20  # far above what thousands of entries take; a larger file is not read
MAX_CACHE_ENTRIES = 2000
MAX_SIDECAR_BYTES = 4096  # a digest sidecar is about 130 bytes
# A file this small is hashed to tell whether it is converted; a larger one only when loading it has
# hashed it already (engine/model/convert.py keeps that hash beside the file).
HASH_WHEN_LISTING_BELOW = 64 << 20


@dataclass(frozen=True)
class FileFacts:
    """A GGUF's facts for one precision. ``status``: "ready", "unsupported" or "unreadable"."""

    status: str
    problem: str = ""
    title: str = ""  # general.name, or ""
    architecture: str = ""
    parameter_count: int = 0
    parameters: str = ""
    quant: str = ""
    quant_mix: dict[str, int] = field(default_factory=dict)
    context_length: int = 0
    kv_bytes_per_token: int = 0
    weights_bytes: int = 0  # the converted weights, estimated (engine/model/footprint.py)
    transient_bytes: int = 0  # the largest dense MatMul matrix (engine/model/memory.py)


def read_facts(path: Path, weights: str) -> FileFacts:
    """Parse ``path``'s header and metadata; a file that cannot be used says why in ``problem``."""
    from engine.model.footprint import largest_dense_matmul_bytes, model_footprint
    from engine.model.gguf_file import GGUFModel

    try:
        model = GGUFModel(path)
    except UnsupportedModelError as exc:
        return FileFacts("unsupported", str(exc))
    except ModelFileError as exc:
        return FileFacts("unreadable", str(exc))
    try:
        return _facts_of(model, weights, model_footprint, largest_dense_matmul_bytes)
    except UnsupportedModelError as exc:
        return FileFacts("unsupported", str(exc))
    except (HearthError, ValueError, TypeError, OverflowError) as exc:  # damaged metadata or tensor data
        return FileFacts("unreadable", f"{Path(path).name} is damaged ({exc})")


def _facts_of(model, weights: str, model_footprint, largest_dense_matmul_bytes) -> FileFacts:
    from engine.arch import model_config  # above this reader: imported with a file to read

    architecture = _short_text(model.value("general.architecture", ""))
    count = sum(int(t.n_elements) for t in model.tensors)
    mix = dict(sorted(Counter(t.tensor_type.name for t in model.tensors).items()))
    base = FileFacts("ready", "", _short_text(model.value("general.name", "")), architecture, count,
                     _short_text(model.value("general.size_label", ""), 16) or parameters_label(count),
                     quant_label(model.value("general.file_type", None), mix), mix,
                     _own_context(model, architecture))
    parts = model.value("split.count", 1)
    if isinstance(parts, int) and parts > 1:
        return _with(base, "unsupported", f"{model.path.name} is one part of a model split into {parts} files; join them "
                     "with llama.cpp's 'llama-gguf-split --merge' and add the joined file")
    try:
        model_config(model)  # the architecture, and its settings, can run
    except UnsupportedModelError as exc:
        return _with(base, "unsupported", str(exc))
    from engine.model.footprint import rotary_table_bytes

    footprint = model_footprint(model, weights)
    tables = rotary_table_bytes(model_config(model), weights)  # loaded with the weights: counted with them
    cannot = [name for name, use in footprint.types.items() if use.form == "unsupported"]
    if cannot:
        return _with(base, "unsupported", f"{model.path.name} holds {', '.join(cannot)} tensors, which Hearth cannot "
                     "convert; choose another quantization of this model")
    per_token = footprint.kv_cache_bytes // footprint.context_length if footprint.context_length else 0
    return FileFacts("ready", "", base.title, base.architecture, base.parameter_count, base.parameters, base.quant,
                     base.quant_mix, footprint.context_length or base.context_length, per_token,
                     footprint.weights_bytes + tables, largest_dense_matmul_bytes(model, weights))


def _with(facts: FileFacts, status: str, problem: str) -> FileFacts:
    return FileFacts(status, problem, facts.title, facts.architecture, facts.parameter_count, facts.parameters,
                     facts.quant, facts.quant_mix, facts.context_length)


def _own_context(model, architecture: str) -> int:
    value = model.value(f"{architecture}.context_length", 0) if architecture else 0
    return value if isinstance(value, int) and 0 < value < 1 << 31 else 0


def _short_text(value, limit: int = 200) -> str:
    return value.strip()[:limit] if isinstance(value, str) else ""


def parameters_label(count: int) -> str:
    """135M, 1.2B, 8.0B: a parameter count as model names give it."""
    if count >= 10**9:
        return f"{count / 10**9:.1f}B"
    if count >= 10**6:
        return f"{count / 10**6:.0f}M"
    if count >= 10**3:
        return f"{count / 10**3:.0f}K"
    return str(count)


def quant_label(file_type, mix: dict[str, int]) -> str:
    """llama.cpp's name for the file's quantization (general.file_type: Q4_K_M, Q4_1), else its most
    common quantized tensor type, else its float type."""
    import gguf

    if isinstance(file_type, int) and not isinstance(file_type, bool):
        try:
            name = gguf.LlamaFileType(file_type).name
        except ValueError:
            name = ""
        if name and name != "GUESSED":
            return name.removeprefix("MOSTLY_").removeprefix("ALL_")
    quantized = {k: v for k, v in mix.items() if k not in ("F32", "F16", "BF16", "F64")}
    pool = quantized or mix
    return max(pool, key=lambda k: (pool[k], k)) if pool else ""


class FactsCache:
    """File facts, digests and conversion sizes, remembered by (path, size, mtime) in one JSON file."""

    def __init__(self, file: Path):
        self.file = Path(file)
        self._data: dict | None = None
        self._dirty = False

    # facts -------------------------------------------------------------------------------------------------
    def facts(self, path: Path, weights: str) -> FileFacts:
        entry, stamp = self._entry(path)
        if entry is None:
            return read_facts(path, weights)  # gone or unreadable: read_facts says which
        store = entry.get("facts")
        if not isinstance(store, dict):
            store = entry["facts"] = {}
        cached = _checked_facts(store.get(weights))
        if cached is not None:
            return cached
        facts = read_facts(path, weights)
        store[weights] = asdict(facts)
        self._dirty = True
        return facts

    def digest(self, path: Path, pinned: str | None = None) -> str | None:
        """The file's SHA-256 when it is known cheaply: ``pinned`` (a verified catalog file), the hash a
        load kept beside the file, the cache, or hashing a small file; else None."""
        entry, stamp = self._entry(path)
        if entry is None:
            return None
        known = pinned or entry.get("sha256") or sidecar_digest(path, stamp)
        if not known and stamp["size"] < HASH_WHEN_LISTING_BELOW:
            from engine.fsutil import sha256_file

            try:
                known = sha256_file(path)
            except OSError:
                return None
        if isinstance(known, str) and len(known) == 64:
            if entry.get("sha256") != known:
                entry["sha256"] = known
                self._dirty = True
            return known
        return None

    def conversion_memory(self, onnx_path: Path) -> WeightsMemory | None:
        """What loading a conversion on disk takes (engine/model/memory.py), or None when it cannot be read."""
        entry, _ = self._entry(onnx_path.with_name(onnx_path.name + ".data"))
        if entry is None:
            return None
        cached = entry.get("memory")
        if isinstance(cached, list) and len(cached) == 2 and all(isinstance(n, int) for n in cached):
            return WeightsMemory(*cached)
        try:
            memory = conversion_memory(onnx_path)
        except Exception as exc:  # a damaged graph file: the estimate falls back to the GGUF's
            log.warning("cannot read the conversion %s: %s", onnx_path, exc)
            return None
        entry["memory"] = [memory.resident_bytes, memory.transient_bytes]
        self._dirty = True
        return memory

    # the file ------------------------------------------------------------------------------------------------
    def _entry(self, path: Path) -> tuple[dict | None, dict]:
        """This file's cache entry (a fresh one when it changed since), or None when it cannot be stat'ed."""
        try:
            st = Path(path).stat()
        except OSError:
            return None, {}
        stamp = {"size": st.st_size, "mtime_ns": st.st_mtime_ns}
        files = self._load()["files"]
        key = str(path)
        entry = files.get(key)
        if not isinstance(entry, dict) or entry.get("stamp") != stamp:
            entry = files[key] = {"stamp": stamp}
            self._dirty = True
        return entry, stamp

    def _load(self) -> dict:
        if self._data is None:
            self._data = {"version": FACTS_VERSION, "files": {}}
            try:  # read_json: a FIFO, an oversized or deeply nested file reads as absent, never hangs or raises
                data = read_json(self.file, MAX_CACHE_BYTES)
            except (OSError, ValueError):
                data = None  # a cache: start afresh
            if isinstance(data, dict) and data.get("version") == FACTS_VERSION and isinstance(data.get("files"), dict):
                self._data = data
        return self._data

    def save(self) -> None:
        """Write what changed (atomically); a cache that cannot be written only costs time later."""
        if not self._dirty or self._data is None:
            return
        files = self._data["files"]
        for key in [k for k in files if not Path(k).exists()] + list(files)[:-MAX_CACHE_ENTRIES]:
            files.pop(key, None)
        try:
            with atomic_write(self.file) as fh:
                fh.write(json.dumps(self._data).encode())
            self._dirty = False
        except OSError as exc:
            log.info("cannot keep the model facts cache %s: %s", self.file, exc)


def _checked_facts(raw) -> FileFacts | None:
    """Cached facts, when every field has its type (else None: read the file again)."""
    if not isinstance(raw, dict):
        return None
    try:
        facts = FileFacts(**raw)
    except TypeError:
        return None
    for f in fields(FileFacts):
        value = getattr(facts, f.name)
        expected = {"str": str, "int": int}.get(str(f.type), dict)
        if not isinstance(value, expected) or isinstance(value, bool):
            return None
    if not all(isinstance(k, str) and isinstance(v, int) for k, v in facts.quant_mix.items()):
        return None
    return facts


def sidecar_digest(path: Path, stamp: dict) -> str | None:
    """The hash engine/model/convert.py's gguf_digest keeps beside a GGUF, when it is for this version
    (``stamp``: the GGUF's size and mtime); None when it is missing, stale or damaged."""
    try:
        cached = read_json(Path(path).with_name(Path(path).name + ".sha256.json"), MAX_SIDECAR_BYTES)
    except (OSError, ValueError):
        return None
    digest = cached.get("sha256") if isinstance(cached, dict) and cached.get("stamp") == stamp else None
    if isinstance(digest, str) and len(digest) == 64:
        return digest
    return None
