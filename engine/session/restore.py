"""Restore planning: fill the engine's KV for one request with the best verified prefix of its prompt.

The restorer walks an ordered list of sources: first the live KV, kept if it is this conversation
(``live``); then each storage tier in turn (``engine/checkpoint/tier.py``: today the file store; later
a RAM tier, a block store), asking it for the conversation's record under this model (``disk``; other
models' records of it are left alone), tried when the adaptive estimate says reading it beats
re-reading its text; then, through the tiers again, this model's saved shared prefix (the template's
preamble and system prompt); else nothing (``cold``). A
checkpoint that fails verification is reported (``rebuilt``, with its reason) and the next source is
tried: first the same file's records before the damage (a shorter frontier), then a shared prefix,
then a full prefill. A file whose header, identity or first record fails is deleted; a file damaged
further in is cut back to its last good record (repair.py).

Every record is verified where it is opened (the reader a tier's ``open`` gives), whatever the tier.
Rows go into the cache through its row protocol (``write_rows``: only verified rows become visible),
so nothing here knows whether the cache is on a CPU or a GPU, or in which element type.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Sequence

from engine.checkpoint.adaptive import Throughput
from engine.checkpoint.block_store import BlockStore
from engine.checkpoint.chain import Frontier
from engine.checkpoint.format import CheckpointError, Identity, Reason, RecordInfo
from engine.checkpoint.lock import StoreBusyError
from engine.checkpoint.store import Entry
from engine.checkpoint.tier import StorageTier
from engine.generation import Engine
from engine.session import repair
from engine.session.prefix import matching_records, reusable, spelled_len, token_text
from engine.session.reports import COLD, DISK, LIVE, MIN_PREFIX_TOKENS, REBUILT, ResumeReport
from engine.session.saving import FileStates

log = logging.getLogger(__name__)
# Below this many bytes of prompt left to read, looking for stored blocks (tokenizing the rest, walking
# the index) costs about what it could save.
MIN_MATCH_BYTES = 64


def tier_list(tiers: StorageTier | Sequence[StorageTier]) -> list[StorageTier]:
    """The tiers in the order they are tried (one tier: a list of one); the first is written to."""
    return list(tiers) if isinstance(tiers, (list, tuple)) else [tiers]


class Restorer:
    """One request's restore. ``dirty`` afterwards: True when it cut the live KV (it then holds rows
    its file lacks), False when it loaded from a file (the KV then holds nothing unsaved), None when
    it did neither. ``tiers``: the storage tiers after the live KV, in the order they are tried."""

    def __init__(self, engine: Engine, tiers: StorageTier | Sequence[StorageTier], identity: Identity,
                 throughput: Throughput, files: FileStates, adaptive: bool, encoding: str | None = None):
        self.engine, self.identity = engine, identity
        self.tiers = tier_list(tiers)
        self.store = self.tiers[0]  # the tier saves write to: the one ``files`` describes
        self.throughput, self.files, self.adaptive = throughput, files, adaptive
        self.encoding = encoding  # the KV encoding saves use (stored blocks of it are looked for first)
        self.dirty: bool | None = None
        # The files whose rows the KV now holds, once this restore emptied it (None: it kept the live KV);
        # a turn whose logits then come out NaN deletes them (ChatSessions.drop_sources).
        self.origins: list[str] | None = None

    def restore(self, conversation: str, text: bytes, lead: list[int], live_is_ours: bool) -> ResumeReport:
        """``live_is_ours``: the live KV belongs to this conversation (else it is dropped)."""
        engine = self.engine
        live = self._keep_live(text, lead, live_is_ours)  # the first source: the live KV
        report = ResumeReport(LIVE if live else COLD, reused_tokens=live)
        failure = None
        for tier in self.tiers:  # then the conversation's own record, tier by tier
            have = len(engine.tokens)  # the live KV's, unless a damaged record in an earlier tier emptied it
            loaded, problem = self._restore_conversation(tier, conversation, text, lead, have, live_is_ours, report)
            failure = failure or problem
            if loaded:
                report.source, report.restored_tokens = DISK, loaded
                break
        own = report.source == DISK  # the conversation's own record served: another chain cannot spell more of it
        for tier in self.tiers:  # then the longest run of stored blocks, whoever saved them
            if isinstance(tier, BlockStore) and not own:
                loaded, problem = self._restore_blocks(tier, text, lead, report)
                failure = failure or problem
                if loaded:
                    report.source, report.restored_tokens, report.shared_prefix = DISK, loaded, True
                    break
        if len(engine.tokens) < MIN_PREFIX_TOKENS:  # then a shared prefix, tier by tier
            for tier in self.tiers:
                loaded = self._restore_shared_prefix(tier, text, lead, report)
                if loaded:
                    report.source, report.restored_tokens, report.shared_prefix = DISK, loaded, True
                    break
        if not engine.tokens:
            engine.cache.shrink_to_fit()  # nothing restored: don't decode in an oversized buffer
        if failure is not None:
            report.source, report.reason = REBUILT, failure.reason
            report.message, report.plain = str(failure), failure.plain
        report.reused_tokens = len(engine.tokens)
        return report

    def _keep_live(self, text: bytes, lead: list[int], live_is_ours: bool) -> int:
        """Keep the live KV's longest prefix spelling ``text`` if it is this conversation's, else drop it."""
        engine = self.engine
        if not live_is_ours:
            engine.reset(keep_buffers=True)
            self.origins = []
            return 0
        live, _ = reusable(engine.tokenizer, engine.tokens, lead, text)
        if live < len(engine.tokens):
            engine.truncate(live)
            self.dirty = True
        return live

    def _restore_conversation(self, tier: StorageTier, conversation: str, text: bytes, lead: list[int], live: int,
                              live_is_ours: bool, report: ResumeReport) -> tuple[int, CheckpointError | None]:
        """Load the conversation's record in ``tier`` when it may hold more than the live KV."""
        entry = tier.conversation_entry(conversation, self.identity.model_fp)
        if entry is None or not (entry.tokens > live or entry.tokens == 0) or (
                live_is_ours and self._file_is_ours(tier, conversation)):
            return 0, None
        # tokens == 0: a record the index could not read; trying it reports why and replaces it
        if entry.tokens == 0 or self._worth_restoring(entry, live, report):
            return self.load(entry, text, lead, conversation, tier)
        return 0, None

    def _file_is_ours(self, tier: StorageTier, conversation: str) -> bool:
        """True when the conversation's record is exactly what we last wrote or read: then, with the live
        KV being this conversation, the record holds nothing the live KV lacks."""
        if tier is not self.store:  # ``files`` knows only the tier saves write to
            return False
        return self.files.unchanged(conversation, tier.stamp(tier.record_name(conversation, self.identity.model_fp)))

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

    def _restore_shared_prefix(self, tier: StorageTier, text: bytes, lead: list[int], report: ResumeReport) -> int:
        have = len(self.engine.tokens)
        for e in tier.prefix_entries(self.identity.model_fp, text):
            if e.tokens <= have:
                continue
            if not self._worth_restoring(e, have, report):
                return 0
            loaded, failure = self.load(e, text, lead, None, tier)
            if loaded:
                return loaded
            if failure is not None:
                log.warning("shared prefix %s unusable (%s); trying the next", e.name, failure)
        return 0

    def _restore_blocks(self, tier: BlockStore, text: bytes, lead: list[int],
                        report: ResumeReport) -> tuple[int, CheckpointError | None]:
        """Load the stored blocks spelling the longest start of the prompt, when they hold more than the
        KV does (a new chat on a document another chat read, an API request, an edited branch)."""
        engine = self.engine
        tokenizer = engine.tokenizer
        have = len(engine.tokens)
        spelled = spelled_len(tokenizer, engine.tokens, len(lead))
        if len(text) - spelled < MIN_MATCH_BYTES:
            return 0, None
        try:
            rest = tokenizer.encode(text[spelled:].decode("utf-8"))
        except UnicodeDecodeError:
            return 0, None
        tokens = (list(engine.tokens) if have else list(lead)) + rest
        match = None
        for encoding in dict.fromkeys((self.encoding or tier.kv_encoding, tier.kv_encoding)):
            match = tier.match(self.identity, encoding, tokens)
            if match is not None:
                break
        if match is None or match.tokens < have + MIN_PREFIX_TOKENS:
            return 0, None
        if not self._worth_restoring_bytes(tier.match_bytes(match), match.tokens, have, report):
            return 0, None
        started = time.perf_counter()
        engine.reset(keep_buffers=True)
        self.dirty, self.origins = False, []
        try:
            with tier.lock.held():
                problem = self._load_match(tier, match, tokens, lead)
        except StoreBusyError as exc:
            log.warning("%s", exc)
            engine.reset()
            return 0, None
        loaded = len(engine.tokens)
        if loaded:  # where these rows came from, should the model find them unusable (NaN)
            self.origins = sorted({tier.block_origin(n.physical) for n in match.nodes})
            self.throughput.record_restore(tier.match_bytes(match), (time.perf_counter() - started) * 1000)
            log.info("restored %d tokens from %d stored blocks", loaded, len(match.nodes))
        return loaded, problem

    def _load_match(self, tier: BlockStore, match, tokens: list[int], lead: list[int]) -> CheckpointError | None:
        engine = self.engine
        m = match.tokens
        spelled = token_text(engine.tokenizer, tokens[:m], len(lead))
        frontier = Frontier(m, len(spelled), hashlib.sha256(spelled).digest(), 0, "prefix")
        with tier.open_match(match, frontier) as reader:
            records, problem = reader.scan()
            if not records:
                return problem
            try:
                stored = reader.read_tokens(records[0], engine.tokenizer.vocab_size)
            except CheckpointError as exc:
                return exc
            if stored != tokens[:m]:
                return CheckpointError(Reason.PREFIX_MISMATCH, "stored blocks do not hold the prompt's tokens")
            rows = reader.rows(records)
            end = engine.cache.write_rows(0, m, rows)
            engine.tokens[:] = stored[:end]
        keep, _ = reusable(engine.tokenizer, engine.tokens, lead, spelled)  # back to a character boundary
        if keep < len(engine.tokens):
            engine.truncate(keep)
        return rows.problem

    def _worth_restoring_bytes(self, nbytes: int, tokens: int, have: int, report: ResumeReport) -> bool:
        est = self.throughput.estimate(nbytes, tokens - have)
        report.restore_estimate_ms, report.prefill_estimate_ms = est.restore_ms, est.prefill_ms
        return est.restore_wins or not self.adaptive

    # loading one file ------------------------------------------------------------------------------------
    def load(self, entry: Entry, text: bytes, lead: list[int], conversation: str | None,
             tier: StorageTier | None = None) -> tuple[int, CheckpointError | None]:
        """Load the longest verified frontier of ``entry`` (a record of ``tier``, by default the first)
        that spells a prefix of ``text``.

        Returns (tokens now in the KV, the failure if the record was damaged or unusable). The KV is
        emptied first, so on any failure nothing unverified survives in it.
        """
        tier = tier or self.store
        self.engine.reset(keep_buffers=True)  # invalidate the live state; its buffers may take the rows
        self.dirty = False
        self.origins = []
        started = time.perf_counter()
        try:
            with tier.lock.held():
                loaded, failure = self._load_locked(tier, entry, text, lead, conversation, started)
        except StoreBusyError as exc:  # another process is writing: prefill instead of waiting longer
            log.warning("%s", exc)
            self.engine.reset()
            return 0, None
        if loaded:
            self.origins = [entry.name]
        return loaded, failure

    def _load_locked(self, tier: StorageTier, entry: Entry, text: bytes, lead: list[int], conversation: str | None,
                     started: float) -> tuple[int, CheckpointError | None]:
        engine = self.engine
        try:
            reader = tier.open(entry.name)  # verification is the reader's, whatever the tier
        except CheckpointError as exc:
            return 0, self._discard(tier, entry.name, conversation, exc)
        with reader:
            try:
                header = reader.read_header()
                reader.check_identity(self.identity)
            except CheckpointError as exc:
                return 0, self._discard(tier, entry.name, conversation, exc)
            records, scan_problem = reader.scan()
            usable = matching_records(records, text)
            if not usable:
                exc = scan_problem if scan_problem is not None and not records else CheckpointError(
                    Reason.PREFIX_MISMATCH, "the saved context's text is not a prefix of the conversation "
                    "(it was edited before the first saved frontier)")
                return 0, self._discard(tier, entry.name, conversation, exc)
            tokens: list[int] = []
            for i, r in enumerate(usable):
                try:
                    tokens += reader.read_tokens(r, engine.tokenizer.vocab_size)
                except CheckpointError as exc:
                    self._cut_back(tier, entry, records, i, conversation, exc)
                    if i == 0:
                        return 0, exc
                    reader.close()  # the file now ends before the damage: load what is left
                    loaded, _ = self._load_locked(tier, entry, text, lead, conversation, started)
                    return loaded, exc
            if token_text(engine.tokenizer, tokens, len(lead)) != text[: usable[-1].text_len] \
                    or tokens[: len(lead)] != lead:
                exc = CheckpointError(Reason.PREFIX_MISMATCH, "the saved token ids do not spell the saved text")
                return 0, self._discard(tier, entry.name, conversation, exc)
            rows = reader.rows(usable)
            end = engine.cache.write_rows(0, usable[-1].end, rows)  # only verified rows become visible
            good, problem = rows.good, rows.problem
            engine.tokens[:] = tokens[:end]
            if problem is None and len(usable) == len(records):
                problem = scan_problem  # the damage sits right after the frontier this text needed
            if problem is not None:
                self._cut_back(tier, entry, records, good, conversation, problem)
            elif scan_problem is not None:  # damage beyond what this text needs: repair quietly
                self._cut_back(tier, entry, records, len(records), conversation, scan_problem)
            if good:
                tier.note_use(entry.name, header)
                self.throughput.record_restore(usable[good - 1].end_offset, (time.perf_counter() - started) * 1000)
            if problem is None and scan_problem is None and conversation is not None and tier is self.store:
                self.files.remember(conversation, header, usable[:good], tokens[:end], tier.stamp(entry.name))
        spelled = spelled_len(engine.tokenizer, engine.tokens, len(lead))
        if spelled < len(text) and (text[spelled] & 0xC0) == 0x80:  # back to a character boundary
            keep, _ = reusable(engine.tokenizer, engine.tokens, lead, text)
            engine.truncate(keep)
        return len(engine.tokens), problem

    # what a damaged record costs ------------------------------------------------------------------------
    def _discard(self, tier: StorageTier, name: str, conversation: str | None, exc: CheckpointError) -> CheckpointError:
        self.engine.reset()
        self.files.forget(conversation)
        repair.discard(tier, name, exc)
        return exc

    def _cut_back(self, tier: StorageTier, entry: Entry, records: list[RecordInfo], good: int,
                  conversation: str | None, exc: CheckpointError) -> CheckpointError:
        """Keep the first ``good`` records of a damaged record (delete it when none are good)."""
        if good == 0:
            return self._discard(tier, entry.name, conversation, exc)
        repair.cut_back(tier, entry, records, good, exc)
        self.files.forget(conversation)
        return exc
