"""The storage-tier interface: where saved context lives, whatever holds it (docs/architecture.md, "Storage tiers").

A tier keeps *records*: one conversation's context under one model, a shared prefix, a branch of the
server's prompt cache, each in the checkpoint format (docs/checkpoint-format.md) and known by a name
the tier gives it (``record_name`` / ``prefix_name``; nothing above a tier composes one). The index
row of a record is an ``Entry`` (below): owner, kind, frontier, size, use.

Verification never belongs to a tier: ``open`` hands back a ``CheckpointReader`` over the record's
bytes, and the reader checks the header, the fingerprints, every record header, the token ids and the
rows (a ``RowSource``, engine/runtime/kv_protocol.py) exactly as it does for a file. A tier that keeps
bytes elsewhere (RAM, a block store) only has to deliver them; a damaged byte is refused the same way.
The rows reach the KV cache as the reader's ``RecordRows``, a ``RowSource``.

The restorer (engine/session/restore.py) walks an ordered list: the live KV first, then each tier
(today the file store, ``CheckpointStore``; later a RAM tier, a block store). The first tier is the
one saves write to.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Protocol, runtime_checkable

from engine.checkpoint.format import FileHeader, Identity, RecordInfo
from engine.checkpoint.reader import CheckpointReader
from engine.checkpoint.writer import NewRecord

__all__ = ["Entry", "StorageTier", "TierLock", "TierUsage", "Written"]

Stamp = tuple[int, int]  # what changes whenever a record's bytes change (a file: size and mtime)
HALF_LIFE_HOURS = 24 * 7  # a record's hits count half after a week unused (``Entry.score``)


@dataclass
class Entry:
    """A record's index row: its name, owner (None for shared prefixes and records found unindexed),
    kind ("conversation", "api", "prefix", "orphan"), frontier, bytes, model and use."""

    name: str
    conversation: str | None
    kind: str
    tokens: int
    text_len: int
    text_sha: bytes
    bytes: int
    model_fp: bytes
    created_ms: int
    last_used_ms: int
    hits: int
    pinned: bool
    label: str = ""  # the model in words, e.g. "SmolLM2-135M-Instruct-Q4_1 int4"; "" for an unreadable file

    def score(self, now_ms: int) -> float:
        age_h = max(0.0, (now_ms - self.last_used_ms) / 3.6e6)
        return (1 + self.hits) * 0.5 ** (age_h / HALF_LIFE_HOURS) * self.tokens / max(1, self.bytes)


@dataclass(frozen=True)
class TierUsage:
    """What a tier holds against its budget, in bytes, and per kind of record."""

    tier: str
    bytes: int
    budget: int
    by_kind: dict[str, int]


@dataclass(frozen=True)
class Written:
    """A record as a write left it: its header, its records (frontiers) and the bytes the write took."""

    header: FileHeader
    records: list[RecordInfo]
    bytes: int


class TierLock(Protocol):
    """Excludes other writers of the same tier (other processes, for the file store)."""

    def held(self) -> AbstractContextManager[None]: ...


@runtime_checkable
class StorageTier(Protocol):
    """One place saved context can live. Every method takes and returns names the tier gave."""

    tier_name: str  # "file", "memory", …: for logs and ``usage``
    kv_encoding: str  # how new records store the KV ("exact" or "int8")
    budget_bytes: int
    lock: TierLock

    # naming -------------------------------------------------------------------------------------------
    def record_name(self, owner: str, model_fp: bytes) -> str:
        """The name of ``owner``'s record (a conversation or a prompt-cache branch) under a model."""
        ...

    def prefix_name(self, text_sha: bytes, model_fp: bytes) -> str:
        """The name of the shared prefix spelling the text with SHA-256 ``text_sha``, under a model."""
        ...

    # finding ------------------------------------------------------------------------------------------
    def conversation_entry(self, conversation: str, model_fp: bytes) -> Entry | None:
        """The record that could serve this conversation's prompt under this model, if any."""
        ...

    def prefix_entries(self, model_fp: bytes, text: bytes) -> list[Entry]:
        """Shared prefixes of this model whose text is a prefix of ``text``, longest first."""
        ...

    def entry(self, name: str) -> Entry | None: ...

    def entries(self, conversation: str | None = None, kind: str | None = None) -> list[Entry]:
        """Records (optionally one owner's, one kind's), most recently used first."""
        ...

    def put(self, entry: Entry) -> None:
        """Record what a record now holds (after a write or a repair)."""
        ...

    # reading ------------------------------------------------------------------------------------------
    def open(self, name: str) -> CheckpointReader:
        """A reader over the record's bytes (it verifies; raises CheckpointError when unreadable)."""
        ...

    def stamp(self, name: str) -> Stamp | None:
        """What changes whenever the record's bytes change; None when there is no record."""
        ...

    def note_use(self, name: str, header: FileHeader) -> None:
        """A restore used the record: count the hit (statistics only, never an error)."""
        ...

    # writing ------------------------------------------------------------------------------------------
    def create(self, name: str, identity: Identity, records: Sequence[NewRecord], encoding: str) -> Written:
        """Write a new record atomically (replacing any of that name)."""
        ...

    def append(self, name: str, header: FileHeader, keep: Sequence[RecordInfo], rec: NewRecord) -> tuple[RecordInfo, int]:
        """Cut the record after ``keep`` and append ``rec``; return its info and the bytes written."""
        ...

    def cut(self, name: str, keep: Sequence[RecordInfo]) -> None:
        """Drop every frontier after ``keep`` (which holds at least one)."""
        ...

    def copy(self, name: str, owner: str) -> Entry | None:
        """Give ``owner`` (a branch) a copy of record ``name``; its entry, None when there was none."""
        ...

    def remove(self, name: str, why: str = "") -> None: ...

    def discard(self, name: str, why: str) -> None:
        """Remove a record whose rows proved unusable although they verified (they gave NaN), and with it
        any rows it shares with other records (a tier that shares none: ``remove``)."""
        ...

    def delete_conversation(self, conversation: str) -> int:
        """Remove every record of ``conversation`` (every model's); return how many went."""
        ...

    # budget -------------------------------------------------------------------------------------------
    def enforce_budget(self, protect: Iterable[str] = ()) -> list[str]:
        """Evict until the tier fits its budget; return the names evicted."""
        ...

    def usage(self) -> TierUsage: ...

    def free_space(self) -> tuple[int, str] | None:
        """(bytes free, where) for a message about a full tier; None when it cannot tell."""
        ...

    def side_file(self, name: str) -> Path:
        """Where a small side file of this tier lives (the measured restore throughput)."""
        ...

    def note_model(self, model_fp: bytes, label: str, gguf: Path | None) -> None:
        """Remember which model a fingerprint is (a tier may ignore it)."""
        ...

    # moving records in and out (bundles) -------------------------------------------------------------
    def read_stream(self, name: str) -> BinaryIO:
        """The record's bytes as a stream (a bundle's export); OSError when it is gone."""
        ...

    def staging(self, owner: str, model_fp: bytes) -> AbstractContextManager[Path]:
        """A temporary file to fill with ``owner``'s record (a bundle's import), removed on exit
        unless ``install`` took it."""
        ...

    def install(self, staged: Path, owner: str, model_fp: bytes, isolated: bool = False) -> Entry | None:
        """Make a staged (fully verified) file ``owner``'s record under the model. ``isolated``: its rows
        came from another installation (trusted by the user): they may serve only this record."""
        ...
