"""Saving: write only the rows past what a conversation's file (under this model) already holds, save a
shared prefix (the template's preamble and system prompt; also per model) once for every conversation
that starts with it, and
remember what each file holds so the next save need not read it back.

Rows come from the cache as blocks in the checkpoint's order (``read_rows``: views of the buffers
on the CPU, one strided copy from a GPU), so the writer never knows the cache's layout.
"""

from __future__ import annotations

import errno
import hashlib
import logging
import sqlite3
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from engine.checkpoint.format import CheckpointError, FileHeader, Identity, RecordInfo
from engine.checkpoint.lock import StoreBusyError
from engine.checkpoint.store import Entry, owner_kind
from engine.checkpoint.tier import Stamp, StorageTier
from engine.checkpoint.writer import NewRecord, now_ms
from engine.generation import Engine
from engine.session.prefix import frontier, reusable
from engine.session.reports import MIN_PREFIX_TOKENS, SaveReport

log = logging.getLogger(__name__)


@dataclass
class FileState:
    """What this process knows a conversation's record holds (valid while its stamp holds)."""

    header: FileHeader
    records: list[RecordInfo]
    tokens: list[int]
    stamp: Stamp | None = field(default=(0, 0))


class FileStates:
    """What each conversation's record (in the tier saves write to) holds, as last written or read by
    this process; a record is known unchanged by its tier's ``stamp``."""

    def __init__(self) -> None:
        self._known: dict[str, FileState] = {}

    def remember(self, conversation: str, header: FileHeader, records: list[RecordInfo], tokens: list[int],
                 stamp: Stamp | None) -> None:
        if stamp is None:  # the record is gone already: nothing to remember
            self._known.pop(conversation, None)
            return
        self._known[conversation] = FileState(header, records, tokens, stamp)

    def forget(self, conversation: str | None) -> None:
        if conversation is not None:
            self._known.pop(conversation, None)

    def unchanged(self, conversation: str, stamp: Stamp | None) -> bool:
        """True when the record is exactly what this process last wrote or read."""
        state = self._known.get(conversation)
        return state is not None and stamp is not None and stamp == state.stamp

    def current(self, conversation: str, tier: StorageTier, name: str, identity: Identity,
                vocab_size: int) -> FileState | None:
        """What the record holds, from memory if it is unchanged since, else read; None when there is
        no usable record (it is then written from scratch)."""
        state = self._known.get(conversation)
        stamp = tier.stamp(name)
        if stamp is None:
            return None
        if state is not None and state.stamp == stamp:
            return state
        try:
            with tier.open(name) as reader:
                header = reader.read_header()
                reader.check_identity(identity)
                records, _ = reader.scan()
                tokens: list[int] = []
                for r in records:
                    tokens += reader.read_tokens(r, vocab_size)
        except CheckpointError as exc:
            log.info("rewriting %s from scratch: %s", name, exc)
            return None
        return FileState(header, records, tokens, stamp)


class Saver:
    """Writes the engine's KV for one save request (``encoding`` for new files; ``lead_len``: the
    leading tokens that spell no text)."""

    def __init__(self, engine: Engine, store: StorageTier, identity: Identity, files: FileStates,
                 encoding: str, lead_len: int):
        self.engine, self.store, self.identity, self.files = engine, store, identity, files
        self.encoding, self.lead_len = encoding, lead_len

    def save(self, conversation: str, reason: str, boundaries: Sequence[int]) -> SaveReport:
        """Append the rows past what the file holds; a failure to write is reported, never raised."""
        tokens = list(self.engine.tokens)
        started = time.perf_counter()
        try:
            with self.store.lock.held():
                report = self._save_locked(conversation, tokens, reason, boundaries)
            self.store.enforce_budget(protect={conversation})
        except (OSError, StoreBusyError, sqlite3.Error) as exc:  # sqlite3: the index, on a full disk
            self.files.forget(conversation)
            error = f"could not save the conversation's context: {self._why(exc)}"
            log.warning("%s", error)
            return SaveReport(False, reason, len(tokens), error=error,
                              elapsed_ms=(time.perf_counter() - started) * 1000)
        return replace(report, elapsed_ms=(time.perf_counter() - started) * 1000)

    def _why(self, exc: BaseException) -> str:
        """The failure in plain words; a full disk (or the file size limit) says how much room is left."""
        full = (isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC))
                or isinstance(exc, sqlite3.Error) and (getattr(exc, "sqlite_errorcode", 0) or 0) & 0xFF == sqlite3.SQLITE_FULL)
        if full or isinstance(exc, OSError) and exc.errno == errno.EFBIG:
            what = "no space left on device" if full else "the file size limit was reached"
            room = self.store.free_space()
            if room is None:
                return what
            return f"{what} ({room[0]:,} bytes free on {room[1]})"
        return getattr(exc, "strerror", None) or str(exc)

    def _save_locked(self, conversation: str, tokens: list[int], reason: str, boundaries: Sequence[int]) -> SaveReport:
        store = self.store
        name = store.record_name(conversation, self.identity.model_fp)
        state = self.files.current(conversation, store, name, self.identity, self.engine.tokenizer.vocab_size)
        n = len(tokens)
        keep: list[RecordInfo] = []
        if state is not None:
            shared = min(len(state.tokens), n)
            diff = np.flatnonzero(np.asarray(state.tokens[:shared]) != np.asarray(tokens[:shared]))
            same = int(diff[0]) if diff.size else shared
            keep = [r for r in state.records if r.end <= same]
            if keep and keep[-1].end == n and len(keep) == len(state.records):
                return SaveReport(True, reason, n)
        start = keep[-1].end if keep else 0
        if state is not None and start == n:  # the live state is one of the file's frontiers
            store.cut(name, keep)
            return self._saved(conversation, name, state.header, list(keep), tokens, reason, 0, 0)
        cuts = [b for b in sorted(set(boundaries)) if start < b < n] + [n]
        pieces, s = [], start
        for e in cuts:
            text_len, text_sha = frontier(self.engine.tokenizer, tokens, e, self.lead_len)
            pieces.append(NewRecord(s, tokens[s:e], self.engine.cache.read_rows(s, e), text_len, text_sha, reason))
            s = e
        if state is None:
            made = store.create(name, self.identity, pieces, self.encoding)
            header, records, written = made.header, made.records, made.bytes
        else:
            header, records, written = state.header, list(keep), 0
            for piece in pieces:
                info, nbytes = store.append(name, header, records, piece)
                records.append(info)
                written += nbytes
        return self._saved(conversation, name, header, records, tokens, reason, n - start, written)

    def _saved(self, conversation: str, name: str, header: FileHeader, records: list[RecordInfo],
               tokens: list[int], reason: str, new_tokens: int, written: int) -> SaveReport:
        """Remember what the record now holds, in memory and in the index."""
        self.files.remember(conversation, header, records, tokens, self.store.stamp(name))
        old = self.store.entry(name)
        last = records[-1]
        self.store.put(Entry(name, conversation, owner_kind(conversation), last.end, last.text_len, last.text_sha,
                             last.end_offset, self.identity.model_fp, header.created_ms, now_ms(),
                             old.hits if old else 0, old.pinned if old else False, header.label))
        return SaveReport(True, reason, len(tokens), new_tokens, written)

    def save_shared_prefix(self, shared: bytes) -> int:
        """Save the rows spelling ``shared`` (the preamble + system prompt) once, unless too short;
        return the bytes the new prefix file took (0: none written)."""
        engine = self.engine
        lead = [engine.tokens[0]] if self.lead_len else []
        k, spelled = reusable(engine.tokenizer, engine.tokens, lead, shared)
        if k < MIN_PREFIX_TOKENS:
            return 0
        text_sha = hashlib.sha256(shared[:spelled]).digest()
        name = self.store.prefix_name(text_sha, self.identity.model_fp)
        if self.store.entry(name) is not None:
            return 0
        tokens = list(engine.tokens[:k])
        try:
            with self.store.lock.held():
                made = self.store.create(
                    name, self.identity,
                    [NewRecord(0, tokens, engine.cache.read_rows(0, k), spelled, text_sha, "prefix")], self.encoding)
                written = made.bytes
                self.store.put(Entry(name, None, "prefix", k, spelled, text_sha, written, self.identity.model_fp,
                                     made.header.created_ms, now_ms(), 0, False, made.header.label))
        except (OSError, StoreBusyError, sqlite3.Error) as exc:
            log.warning("could not save the shared prefix: %s", exc)
            return 0
        return written
