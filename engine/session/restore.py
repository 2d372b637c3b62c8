"""Restore planning: fill the engine's KV for one request with the best verified prefix of its prompt.

The sources, in order: the live KV if it is this conversation (``live``); else the conversation's
checkpoint under this model (``disk``; other models' files of it are left alone), when the adaptive
estimate says reading it beats re-reading its text; else this model's saved shared prefix (the
template's preamble and system prompt); else nothing (``cold``). A
checkpoint that fails verification is reported (``rebuilt``, with its reason) and the next source is
tried: first the same file's records before the damage (a shorter frontier), then a shared prefix,
then a full prefill. A file whose header, identity or first record fails is deleted; a file damaged
further in is cut back to its last good record (repair.py).

Rows go into the cache through its row protocol (``write_rows``: only verified rows become visible),
so nothing here knows whether the cache is on a CPU or a GPU, or in which element type.
"""

from __future__ import annotations

import hashlib
import logging
import os
import time

from engine.checkpoint.adaptive import Throughput
from engine.checkpoint.format import CheckpointError, FileHeader, Identity, Reason, RecordInfo
from engine.checkpoint.lock import StoreBusyError
from engine.checkpoint.reader import CheckpointReader
from engine.checkpoint.store import CheckpointStore, Entry, conversation_file
from engine.checkpoint.writer import now_ms, update_usage
from engine.generation import Engine
from engine.session import repair
from engine.session.prefix import matching_records, reusable, spelled_len, token_text
from engine.session.reports import COLD, DISK, LIVE, MIN_PREFIX_TOKENS, REBUILT, ResumeReport
from engine.session.saving import FileStates

log = logging.getLogger(__name__)


class Restorer:
    """One request's restore. ``dirty`` afterwards: True when it cut the live KV (it then holds rows
    its file lacks), False when it loaded from a file (the KV then holds nothing unsaved), None when
    it did neither."""

    def __init__(self, engine: Engine, store: CheckpointStore, identity: Identity, throughput: Throughput,
                 files: FileStates, adaptive: bool):
        self.engine, self.store, self.identity = engine, store, identity
        self.throughput, self.files, self.adaptive = throughput, files, adaptive
        self.dirty: bool | None = None
        # The files whose rows the KV now holds, once this restore emptied it (None: it kept the live KV);
        # a turn whose logits then come out NaN deletes them (ChatSessions.drop_sources).
        self.origins: list[str] | None = None

    def restore(self, conversation: str, text: bytes, lead: list[int], live_is_ours: bool) -> ResumeReport:
        """``live_is_ours``: the live KV belongs to this conversation (else it is dropped)."""
        engine = self.engine
        live = 0
        if live_is_ours:
            live, _ = reusable(engine.tokenizer, engine.tokens, lead, text)
            if live < len(engine.tokens):
                engine.truncate(live)
                self.dirty = True
        else:
            engine.reset(keep_buffers=True)
            self.origins = []
        report = ResumeReport(LIVE if live else COLD, reused_tokens=live)
        entry = self.store.conversation_entry(conversation, self.identity.model_fp)
        failure = None
        if entry is not None and (entry.tokens > live or entry.tokens == 0) and not (
                live_is_ours and self._file_is_ours(conversation)):
            # tokens == 0: a file the index could not read; trying it reports why and replaces it
            if entry.tokens == 0 or self._worth_restoring(entry, live, report):
                loaded, failure = self.load(entry, text, lead, conversation)
                if loaded:
                    report.source, report.restored_tokens = DISK, loaded
        if len(engine.tokens) < MIN_PREFIX_TOKENS:
            loaded = self._restore_shared_prefix(text, lead, report)
            if loaded:
                report.source, report.restored_tokens, report.shared_prefix = DISK, loaded, True
        if not engine.tokens:
            engine.cache.shrink_to_fit()  # nothing restored: don't decode in an oversized buffer
        if failure is not None:
            report.source, report.reason = REBUILT, failure.reason
            report.message, report.plain = str(failure), failure.plain
        report.reused_tokens = len(engine.tokens)
        return report

    def _file_is_ours(self, conversation: str) -> bool:
        """True when the conversation's file is exactly what we last wrote or read: then, with the live
        KV being this conversation, the file holds nothing the live KV lacks."""
        path = self.store.path(conversation_file(conversation, self.identity.model_fp))
        return self.files.unchanged(conversation, path)

    def _worth_restoring(self, entry: Entry, have: int, report: ResumeReport) -> bool:
        """Adaptive resume: compare the estimated restore time with re-reading the same tokens."""
        est = self.throughput.estimate(entry.bytes, entry.tokens - have)
        report.restore_estimate_ms, report.prefill_estimate_ms = est.restore_ms, est.prefill_ms
        if not self.adaptive:
            return True
        if not est.restore_wins:
            log.info("re-reading %d tokens (≈%.0f ms) beats restoring them (≈%.0f ms)",
                     entry.tokens - have, est.prefill_ms, est.restore_ms)
        return est.restore_wins

    def _restore_shared_prefix(self, text: bytes, lead: list[int], report: ResumeReport) -> int:
        have = len(self.engine.tokens)
        candidates = [e for e in self.store.entries(kind="prefix")
                      if e.model_fp == self.identity.model_fp and e.text_len <= len(text) and e.tokens > have]
        for e in sorted(candidates, key=lambda e: -e.text_len):
            if hashlib.sha256(text[: e.text_len]).digest() != e.text_sha:
                continue
            if not self._worth_restoring(e, have, report):
                return 0
            loaded, failure = self.load(e, text, lead, None)
            if loaded:
                return loaded
            if failure is not None:
                log.warning("shared prefix %s unusable (%s); trying the next", e.name, failure)
        return 0

    # loading one file ------------------------------------------------------------------------------------
    def load(self, entry: Entry, text: bytes, lead: list[int], conversation: str | None) -> tuple[int, CheckpointError | None]:
        """Load the longest verified frontier of ``entry`` that spells a prefix of ``text``.

        Returns (tokens now in the KV, the failure if the file was damaged or unusable). The KV is
        emptied first, so on any failure nothing unverified survives in it.
        """
        self.engine.reset(keep_buffers=True)  # invalidate the live state; its buffers may take the rows
        self.dirty = False
        self.origins = []
        started = time.perf_counter()
        try:
            with self.store.lock.held():
                loaded, failure = self._load_locked(entry, text, lead, conversation, started)
        except StoreBusyError as exc:  # another process is writing: prefill instead of waiting longer
            log.warning("%s", exc)
            self.engine.reset()
            return 0, None
        if loaded:
            self.origins = [entry.name]
        return loaded, failure

    def _load_locked(self, entry: Entry, text: bytes, lead: list[int], conversation: str | None,
                     started: float) -> tuple[int, CheckpointError | None]:
        engine, path = self.engine, self.store.path(entry.name)
        try:
            reader = CheckpointReader(path)
        except CheckpointError as exc:
            return 0, self._discard(entry.name, conversation, exc)
        with reader:
            try:
                header = reader.read_header()
                reader.check_identity(self.identity)
            except CheckpointError as exc:
                return 0, self._discard(entry.name, conversation, exc)
            records, scan_problem = reader.scan()
            usable = matching_records(records, text)
            if not usable:
                exc = scan_problem if scan_problem is not None and not records else CheckpointError(
                    Reason.PREFIX_MISMATCH, "the saved context's text is not a prefix of the conversation "
                    "(it was edited before the first saved frontier)")
                return 0, self._discard(entry.name, conversation, exc)
            tokens: list[int] = []
            for i, r in enumerate(usable):
                try:
                    tokens += reader.read_tokens(r, engine.tokenizer.vocab_size)
                except CheckpointError as exc:
                    self._cut_back(entry, records, i, conversation, exc)
                    if i == 0:
                        return 0, exc
                    reader.close()  # the file now ends before the damage: load what is left
                    loaded, _ = self._load_locked(entry, text, lead, conversation, started)
                    return loaded, exc
            if token_text(engine.tokenizer, tokens, len(lead)) != text[: usable[-1].text_len] \
                    or tokens[: len(lead)] != lead:
                exc = CheckpointError(Reason.PREFIX_MISMATCH, "the saved token ids do not spell the saved text")
                return 0, self._discard(entry.name, conversation, exc)
            rows = reader.rows(usable)
            end = engine.cache.write_rows(0, usable[-1].end, rows)  # only verified rows become visible
            good, problem = rows.good, rows.problem
            engine.tokens[:] = tokens[:end]
            if problem is None and len(usable) == len(records):
                problem = scan_problem  # the damage sits right after the frontier this text needed
            if problem is not None:
                self._cut_back(entry, records, good, conversation, problem)
            elif scan_problem is not None:  # damage beyond what this text needs: repair quietly
                self._cut_back(entry, records, len(records), conversation, scan_problem)
            if good:
                self._touch(entry, header, path)
                self.throughput.record_restore(usable[good - 1].end_offset, (time.perf_counter() - started) * 1000)
            if problem is None and scan_problem is None and conversation is not None:
                self.files.remember(conversation, header, usable[:good], tokens[:end], path)
        spelled = spelled_len(engine.tokenizer, engine.tokens, len(lead))
        if spelled < len(text) and (text[spelled] & 0xC0) == 0x80:  # back to a character boundary
            keep, _ = reusable(engine.tokenizer, engine.tokens, lead, text)
            engine.truncate(keep)
        return len(engine.tokens), problem

    # what a damaged file costs --------------------------------------------------------------------------
    def _discard(self, name: str, conversation: str | None, exc: CheckpointError) -> CheckpointError:
        self.engine.reset()
        self.files.forget(conversation)
        repair.discard(self.store, name, exc)
        return exc

    def _cut_back(self, entry: Entry, records: list[RecordInfo], good: int, conversation: str | None,
                  exc: CheckpointError) -> CheckpointError:
        """Keep the first ``good`` records of a damaged file (delete it when none are good)."""
        if good == 0:
            return self._discard(entry.name, conversation, exc)
        repair.cut_back(self.store, entry, records, good, exc)
        self.files.forget(conversation)
        return exc

    def _touch(self, entry: Entry, header: FileHeader, path: os.PathLike) -> None:
        try:
            update_usage(path, header, now_ms(), header.hits + 1)
        except OSError:
            pass  # statistics only
        self.store.touch(entry.name)
