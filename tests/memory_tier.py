"""A second storage tier, kept in memory: the proof that ``StorageTier`` (engine/checkpoint/tier.py) is
enough for the restorer, saving, repair and eviction, and that a record is verified where it is opened
whatever holds it.

It is not a mock: each record is the checkpoint format's real bytes (written by the same writer into a
buffer instead of a file), opened by the same ``CheckpointReader`` with the same checks, its frontiers
cut and appended by the same offsets, evicted by the store's own ``eviction_order``. It lives in tests/
rather than engine/ because the RAM tier Hearth will get sits in front of the file tier (promotion on
restore, demotion on eviction, a budget of its own in RAM) and that policy is not designed yet; this
one is the interface exercised alone.
"""

from __future__ import annotations

import io
import itertools
import tempfile
import threading
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import BinaryIO

from engine.checkpoint.format import CheckpointError, FileHeader, Identity, Reason, RecordInfo
from engine.checkpoint.reader import CheckpointReader
from engine.checkpoint.store import (
    DEFAULT_BUDGET_BYTES,
    DEFAULT_KV_ENCODING,
    Entry,
    conversation_file,
    conversation_key,
    copy_name,
    eviction_order,
    prefix_file,
    prefixes_of,
    unknown_entry,
)
from engine.checkpoint.tier import Stamp, TierUsage, Written
from engine.checkpoint.writer import NewRecord, append_bytes, cut_offset, encode_new, now_ms, usage_patched


class _ThreadLock:
    """The tier's writers are this process's threads only."""

    def __init__(self) -> None:
        self._lock = threading.RLock()

    @contextmanager
    def held(self) -> Iterator[None]:
        with self._lock:
            yield


class MemoryTier:
    """Records as bytes in a dict, indexed by the same ``Entry`` rows as the file store."""

    tier_name = "memory"

    def __init__(self, side_dir: Path, budget_bytes: int = DEFAULT_BUDGET_BYTES,
                 kv_encoding: str = DEFAULT_KV_ENCODING):
        self.side_dir = Path(side_dir)
        self.side_dir.mkdir(parents=True, exist_ok=True)
        self.budget_bytes, self.kv_encoding = budget_bytes, kv_encoding
        self.lock = _ThreadLock()
        self._data: dict[str, bytes] = {}
        self._index: dict[str, Entry] = {}
        self._version: dict[str, int] = {}
        self._versions = itertools.count(1)

    # for tests: what a file test writes into or reads from a store's directory ---------------------------
    def plant(self, name: str, data: bytes) -> None:
        """Hold ``data`` as record ``name`` and index it without judging it, as the file store indexes a
        file it finds at start-up."""
        self._set(name, bytes(data))
        self._index[name] = unknown_entry(name, lambda: CheckpointReader(Path(name), self._data[name]), len(data))

    def read_bytes(self, name: str) -> bytes:
        return self._data[name]

    def has(self, name: str) -> bool:
        return name in self._data

    def _set(self, name: str, data: bytes) -> None:
        self._data[name] = data
        self._version[name] = next(self._versions)

    # naming -----------------------------------------------------------------------------------------------
    def record_name(self, owner: str, model_fp: bytes) -> str:
        return conversation_file(owner, model_fp)

    def prefix_name(self, text_sha: bytes, model_fp: bytes) -> str:
        return prefix_file(text_sha, model_fp)

    # finding ----------------------------------------------------------------------------------------------
    def conversation_entry(self, conversation: str, model_fp: bytes) -> Entry | None:
        e = self.entry(conversation_file(conversation, model_fp))
        if e is not None and e.conversation != conversation:  # planted: its owner is found by name
            e.conversation = conversation
            self.put(e)
        return e

    def prefix_entries(self, model_fp: bytes, text: bytes) -> list[Entry]:
        return prefixes_of(self.entries(kind="prefix"), model_fp, text)

    def entry(self, name: str) -> Entry | None:
        e = self._index.get(name)
        return replace(e) if e is not None else None

    def entries(self, conversation: str | None = None, kind: str | None = None) -> list[Entry]:
        found = [replace(e) for e in self._index.values()
                 if (conversation is None or e.conversation == conversation) and (kind is None or e.kind == kind)]
        return sorted(found, key=lambda e: -e.last_used_ms)

    def put(self, entry: Entry) -> None:
        self._index[entry.name] = replace(entry)

    def touch(self, name: str) -> None:
        if name in self._index:
            e = self._index[name]
            e.hits, e.last_used_ms = e.hits + 1, now_ms()

    def set_pinned(self, name: str, pinned: bool) -> None:
        if name in self._index:
            self._index[name].pinned = pinned

    # reading ----------------------------------------------------------------------------------------------
    def open(self, name: str) -> CheckpointReader:
        data = self._data.get(name)
        if data is None:
            raise CheckpointError(Reason.IO_ERROR, f"cannot read {name}: no such record")
        return CheckpointReader(Path(name), data)  # the same checks as a file's

    def stamp(self, name: str) -> Stamp | None:
        return (len(self._data[name]), self._version[name]) if name in self._data else None

    def note_use(self, name: str, header: FileHeader) -> None:
        if name in self._data:
            self._set(name, usage_patched(self._data[name], header, now_ms(), header.hits + 1))
        self.touch(name)

    # writing ----------------------------------------------------------------------------------------------
    def create(self, name: str, identity: Identity, records: Sequence[NewRecord], encoding: str) -> Written:
        header, infos, data = encode_new(identity, records, encoding)
        self._set(name, data)
        return Written(header, infos, len(data))

    def append(self, name: str, header: FileHeader, keep: Sequence[RecordInfo], rec: NewRecord) -> tuple[RecordInfo, int]:
        data, info, written = append_bytes(self._data[name], header, keep, rec)
        self._set(name, data)
        return info, written

    def cut(self, name: str, keep: Sequence[RecordInfo]) -> None:
        self._set(name, self._data[name][: cut_offset(keep)])

    def copy(self, name: str, owner: str) -> Entry | None:
        source = self._index.get(name)
        if source is None or name not in self._data:
            return None
        self.plant(copy_name(name, owner, source.model_fp), self._data[name])
        return self.conversation_entry(owner, source.model_fp)

    def remove(self, name: str, why: str = "") -> None:
        with self.lock.held():
            self._data.pop(name, None)
            self._index.pop(name, None)
            self._version.pop(name, None)

    def discard(self, name: str, why: str) -> None:
        self.remove(name, why)

    def delete_conversation(self, conversation: str) -> int:
        key = conversation_key(conversation)
        names = {n for n in self._data if n.startswith(key)} | {
            e.name for e in self._index.values() if e.conversation == conversation}
        gone = sum(n in self._data for n in names)
        for name in names:
            self.remove(name)
        return gone

    # budget -----------------------------------------------------------------------------------------------
    def enforce_budget(self, protect: Iterable[str] = ()) -> list[str]:
        evicted: list[str] = []
        with self.lock.held():
            entries = self.entries()
            total = sum(e.bytes for e in entries)
            if total <= self.budget_bytes:
                return evicted
            for e, _why in eviction_order(entries, protect, set()):  # no registry: no model is known gone
                if total <= self.budget_bytes:
                    break
                self.remove(e.name)
                total -= e.bytes
                evicted.append(e.name)
        return evicted

    def usage(self) -> TierUsage:
        by_kind: dict[str, int] = {}
        for e in self._index.values():
            by_kind[e.kind] = by_kind.get(e.kind, 0) + e.bytes
        return TierUsage(self.tier_name, sum(by_kind.values()), self.budget_bytes, by_kind)

    def total_bytes(self) -> int:
        return self.usage().bytes

    def free_space(self) -> tuple[int, str] | None:
        return None

    def side_file(self, name: str) -> Path:
        return self.side_dir / name

    def note_model(self, model_fp: bytes, label: str, gguf: Path | None) -> None:
        pass  # no registry: files of a removed model are evicted by score like any other

    # bundles ----------------------------------------------------------------------------------------------
    def read_stream(self, name: str) -> BinaryIO:
        if name not in self._data:
            raise FileNotFoundError(name)
        return io.BytesIO(self._data[name])

    @contextmanager
    def staging(self, owner: str, model_fp: bytes) -> Iterator[Path]:
        with tempfile.TemporaryDirectory(dir=self.side_dir) as tmp:
            yield Path(tmp) / conversation_file(owner, model_fp)

    def install(self, staged: Path, owner: str, model_fp: bytes, isolated: bool = False) -> Entry | None:
        self.plant(conversation_file(owner, model_fp), Path(staged).read_bytes())
        return self.conversation_entry(owner, model_fp)
