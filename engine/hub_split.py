"""Join the parts of a split GGUF (llama.cpp's gguf-split: ``MODEL-00001-of-00003.gguf``...) into one GGUF.

The rest of the engine reads one file (conversion, facts, hashes, the library), so a split model is merged
once, after its parts are downloaded and verified, rather than taught to every reader. gguf-split's format:
every part is a GGUF with the KVs ``split.no`` (u16, 0-based), ``split.count`` (u16) and
``split.tensors.count`` (i32, the whole model's); the first part holds the model's metadata. The merged file
keeps the first part's KVs byte for byte minus ``split.*``, lists every part's tensor infos in order with
new offsets, and copies the tensor data, each tensor aligned to ``general.alignment``, streamed in chunks.
The parts are parsed with the ``gguf`` library's reader; the result is checked with the engine's own.
"""

from __future__ import annotations

import logging
import shutil
import struct
from pathlib import Path

from engine.errors import DownloadCancelledError, HubError, ModelFileError
from engine.fsutil import atomic_write
from engine.model.fetch import cancelled

log = logging.getLogger(__name__)

SPLIT_KEYS = ("split.no", "split.count", "split.tensors.count")
DEFAULT_ALIGNMENT = 32
MAX_TENSORS = 1 << 20
_CHUNK = 1 << 20


def merge_split_gguf(parts: list[Path], target: Path, *, cancel=None) -> Path:
    """Write the model ``parts`` (in order) make as one GGUF at ``target`` (atomically); HubError when they
    are not the parts of one split model, with nothing written."""
    import gguf

    readers = []
    for n, path in enumerate(parts):
        try:
            reader = gguf.GGUFReader(path)
        except (ValueError, OSError, struct.error, IndexError) as exc:
            raise HubError(f"{path.name} is not a readable GGUF ({str(exc)[:120]})") from None
        _check_part(reader, path, n, len(parts))
        readers.append(reader)
    first = readers[0]
    expected = _int(first, "split.tensors.count")
    tensors = [(reader, t) for reader in readers for t in reader.tensors]
    names = [t.name for _, t in tensors]
    if len(tensors) != expected or len(tensors) > MAX_TENSORS:
        raise HubError(f"the parts of {target.name} hold {len(tensors)} tensors, but its first part says {expected}")
    if len(set(names)) != len(names):
        raise HubError(f"the parts of {target.name} repeat a tensor")
    align = _int(first, "general.alignment") if "general.alignment" in first.fields else DEFAULT_ALIGNMENT
    if align <= 0 or align & (align - 1):
        raise HubError(f"{parts[0].name} declares an alignment of {align}, not a power of two")
    kvs = [b"".join(bytes(p) for p in field.parts) for key, field in first.fields.items()
           if not key.startswith("GGUF.") and not key.startswith("split.")]
    infos, offset = [], 0
    for _, t in tensors:
        raw = b"".join(bytes(p) for p in t.field.parts[:-1])  # name, dims, type as written; the offset is new
        infos.append(raw + struct.pack("<Q", offset))
        offset += _padded(int(t.n_bytes), align)
    need = offset + (1 << 20)
    free = shutil.disk_usage(target.parent).free
    if need > free:
        raise HubError(f"not enough disk space in {target.parent} to join {target.name}: it needs "
                       f"{need >> 20} MiB, {free >> 20} MiB are free")
    with atomic_write(target) as out:
        header = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kvs)) + b"".join(kvs) + b"".join(infos)
        out.write(header + b"\0" * (_padded(len(header), align) - len(header)))
        handles = {id(r): open(p, "rb") for r, p in zip(readers, parts, strict=True)}
        try:
            for reader, t in tensors:
                src = handles[id(reader)]
                src.seek(int(t.data_offset))
                left = int(t.n_bytes)
                while left:
                    if cancelled(cancel):
                        raise DownloadCancelledError(f"joining {target.name} was cancelled; its parts are kept")
                    block = src.read(min(_CHUNK, left))
                    if not block:
                        raise HubError(f"{target.name}: a part ends inside tensor {t.name}")
                    out.write(block)
                    left -= len(block)
                out.write(b"\0" * (_padded(int(t.n_bytes), align) - int(t.n_bytes)))
        finally:
            for fh in handles.values():
                fh.close()
    _check_merged(target, len(tensors))
    return target


def _check_part(reader, path: Path, n: int, count: int) -> None:
    for key in SPLIT_KEYS:
        if key not in reader.fields:
            raise HubError(f"{path.name} is not a part of a split GGUF (it has no {key})")
    if _int(reader, "split.count") != count or _int(reader, "split.no") != n:
        raise HubError(f"{path.name} says it is part {_int(reader, 'split.no') + 1} of {_int(reader, 'split.count')}, "
                       f"not part {n + 1} of {count}")


def _int(reader, key: str) -> int:
    value = reader.fields[key].contents()
    if isinstance(value, bool) or not isinstance(value, int):
        raise HubError(f"the GGUF's {key} is not a number")
    return value


def _check_merged(target: Path, tensors: int) -> None:
    """The joined file must open with the engine's own GGUF reader, every tensor listed; else it goes."""
    from engine.model.gguf_file import GGUFModel

    try:
        found = len(GGUFModel(target).tensors)
    except ModelFileError as exc:
        target.unlink(missing_ok=True)
        raise HubError(f"joining the parts of {target.name} did not make a readable GGUF ({exc})") from None
    if found != tensors:
        target.unlink(missing_ok=True)
        raise HubError(f"joining the parts of {target.name} lost tensors")


def _padded(n: int, align: int) -> int:
    return (n + align - 1) // align * align
