"""Conversations on one engine: find the saved KV that serves a conversation, verify it, resume; save back.

The engine holds one live KV cache. ``ChatSessions`` decides, for each request, how much of it can
be kept (``live``), whether a checkpoint should fill it (``disk``), or whether it must be built by
the model: ``rebuilt`` after a checkpoint failed verification (the reason is reported), ``cold``
when there was nothing to resume from.

Text is the ground truth. A conversation's rendered prompt is bytes; the KV holds tokens whose bytes
spell a prefix of it. Matching is by bytes, as in ds4: once a saved or live prefix spells the start
of the prompt, its exact tokens are kept and only the rest of the text is tokenized. A prefix is
cut back to a token boundary that is also a UTF-8 character boundary, so the rest decodes cleanly.

Recovery order when a checkpoint fails: its records before the damage (a shorter frontier of the
same conversation), then a saved shared prefix (the template preamble and system prompt), then a full
prefill; the rebuilt state is saved again. A file whose header, identity or first record fails is
deleted; a file damaged further in is cut back to its last good record.
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field

import numpy as np

from engine.checkpoint.adaptive import Throughput
from engine.checkpoint.format import (
    LAYOUT_INT8_ROWS,
    CheckpointError,
    FileHeader,
    Identity,
    Reason,
    RecordInfo,
    encoding_layout,
)
from engine.checkpoint.identity import engine_identity
from engine.checkpoint.lock import StoreBusyError
from engine.checkpoint.reader import CheckpointReader
from engine.checkpoint.store import CheckpointStore, Entry, conversation_file, prefix_file
from engine.checkpoint.writer import NewRecord, append, cut, now_ms, update_usage, write_new
from engine.generation import CancelToken, Engine, GenerationResult, ProgressFn, TextFn
from engine.sampling import SamplingParams

log = logging.getLogger(__name__)

LIVE, DISK, REBUILT, COLD = "live", "disk", "rebuilt", "cold"
SAVE_ALIGN = 2048  # during a long prefill, save at every multiple of this many tokens
MIN_PREFIX_TOKENS = 16  # shorter shared prefixes are not worth a file


@dataclass
class ResumeReport:
    source: str
    reason: str | None = None  # a Reason when a checkpoint failed
    reused_tokens: int = 0  # tokens whose KV was not computed for this request
    prefilled_tokens: int = 0
    elapsed_ms: float = 0.0  # restore + verification + prefill
    restored_tokens: int = 0  # of reused_tokens, how many came from disk
    restore_ms: float = 0.0
    restore_estimate_ms: float | None = None
    prefill_estimate_ms: float | None = None
    message: str = ""  # the specific failure, for logs and details
    plain: str = ""  # the failure in plain words, for the UI

    def as_dict(self) -> dict:
        d = asdict(self)
        for k in ("elapsed_ms", "restore_ms", "restore_estimate_ms", "prefill_estimate_ms"):
            if d[k] is not None:
                d[k] = round(d[k], 3)
        return d


@dataclass
class SaveReport:
    ok: bool
    reason: str
    tokens: int = 0  # the frontier saved
    new_tokens: int = 0  # rows written by this save
    bytes_written: int = 0
    elapsed_ms: float = 0.0
    error: str = ""

    def as_dict(self) -> dict:
        return {**asdict(self), "elapsed_ms": round(self.elapsed_ms, 3)}


@dataclass
class TurnResult:
    generation: GenerationResult
    resume: ResumeReport
    save: SaveReport | None
    prompt_tokens: int = 0


@dataclass
class _FileState:
    """What this process knows a conversation's file holds (valid while its size and mtime hold)."""

    header: FileHeader
    records: list[RecordInfo]
    tokens: list[int]
    stamp: tuple[int, int] = field(default=(0, 0))


def common_prefix_len(a: bytes, b: bytes) -> int:
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n - 1  # a[:lo] == b[:lo] and a[:hi+1] != b[:hi+1]
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _stamp(path: os.PathLike) -> tuple[int, int]:
    st = os.stat(path)
    return st.st_size, st.st_mtime_ns


class ChatSessions:
    def __init__(self, engine: Engine, store: CheckpointStore, identity: Identity | None = None,
                 save_align: int = SAVE_ALIGN, adaptive: bool = True, kv_encoding: str | None = None):
        """``adaptive`` False: always restore a usable checkpoint, even when re-reading looks faster.
        ``kv_encoding``: how new checkpoint files store the KV, "exact" (lossless) or "int8" (a
        quarter of float32's bytes; see docs/checkpoint-format.md §4b); None takes the store's setting
        (``store.json``, default "exact"). An existing file keeps its own encoding when appended to."""
        self.engine, self.store = engine, store
        self.adaptive = adaptive
        self.kv_encoding = store.kv_encoding if kv_encoding is None else kv_encoding
        encoding_layout(self.kv_encoding)  # ValueError naming the choices
        self.identity = identity or engine_identity(engine)
        self.save_align = save_align
        self.active: str | None = None
        self.throughput = Throughput(store.root / "throughput.json", engine.provider)
        self._lead_len = 0
        self._dirty = False
        self._states: dict[str, _FileState] = {}

    # text and tokens ----------------------------------------------------------------------------------
    def _lead(self, text: bytes) -> list[int]:
        """[BOS] when the model wants one that the rendered text does not spell, else []."""
        tk = self.engine.tokenizer
        bos = tk.specials.bos
        if tk.add_bos and bos is not None and not text.startswith(tk.token_bytes(bos)):
            return [bos]
        return []

    def _token_text(self, tokens: Sequence[int], lead_len: int) -> bytes:
        tb = self.engine.tokenizer.token_bytes
        return b"".join(tb(t) for t in tokens[lead_len:])

    def _spelled(self, tokens: Sequence[int], lead_len: int) -> int:
        """How many bytes of text ``tokens`` spell."""
        ids = np.asarray(tokens[lead_len:], dtype=np.int64)
        return int(self.engine.tokenizer.byte_lengths[ids].sum()) if ids.size else 0

    def _reusable(self, tokens: Sequence[int], lead: list[int], text: bytes) -> tuple[int, int]:
        """(tokens kept, bytes they spell): the longest token prefix spelling a prefix of ``text``
        that ends on a UTF-8 character boundary."""
        if not tokens or list(tokens[: len(lead)]) != lead:
            return 0, 0
        ends = np.cumsum(self.engine.tokenizer.byte_lengths[np.asarray(tokens[len(lead):], dtype=np.int64)])
        matched = common_prefix_len(self._token_text(tokens, len(lead)), text)
        k = int(np.searchsorted(ends, matched, side="right"))  # whole tokens inside the match
        spelled = int(ends[k - 1]) if k else 0
        while k and spelled < len(text) and (text[spelled] & 0xC0) == 0x80:
            k -= 1
            spelled = int(ends[k - 1]) if k else 0
        if k == 0 and not lead:
            return 0, 0
        return len(lead) + k, spelled

    def _frontier(self, tokens: Sequence[int], end: int) -> tuple[int, bytes]:
        text = self._token_text(tokens[:end], self._lead_len)
        return len(text), hashlib.sha256(text).digest()

    def shared_prefix_text(self, messages: list[dict]) -> bytes:
        """The rendered text every conversation with these leading messages starts with: the
        template's preamble and the system prompt, up to where the first user message begins."""
        first_user = next((i for i, m in enumerate(messages) if m["role"] == "user"), None)
        if first_user is None:
            return b""
        head = [dict(m) for m in messages[: first_user + 1]]
        renders = []
        for probe in ("a", "b"):
            head[-1] = {"role": "user", "content": probe}
            renders.append(self.engine.template.render(head, add_generation_prompt=False).encode("utf-8"))
        return renders[0][: common_prefix_len(*renders)]

    # requests -----------------------------------------------------------------------------------------
    def prepare(self, conversation: str, messages: list[dict]) -> tuple[list[int], ResumeReport]:
        """Fill the KV with the best verified prefix of these messages; return the full prompt's tokens."""
        started = time.perf_counter()
        text = self.engine.render(messages).encode("utf-8")
        lead = self._lead(text)
        if self.active is not None and self.active != conversation:
            self.switch_away()
        self._lead_len = len(lead)
        report = self._restore(conversation, text, lead)
        self.active = conversation
        kept = list(self.engine.tokens)
        spelled = self._spelled(kept, len(lead))
        rest = self.engine.tokenizer.encode(text[spelled:].decode("utf-8"))
        prompt = (kept if kept else lead) + rest
        report.restore_ms = (time.perf_counter() - started) * 1000
        return prompt, report

    def sync(self, conversation: str, messages: list[dict], progress: ProgressFn | None = None,
             cancel: CancelToken | None = None) -> tuple[np.ndarray | None, list[int], ResumeReport]:
        """Make the KV hold this conversation's prompt; return (last logits or None if cancelled, prompt, report)."""
        prompt, report = self.prepare(conversation, messages)
        self.engine.check_fits(prompt)
        started = time.perf_counter()
        self._dirty = True
        logits, reused = self.engine.sync(prompt, self._saving_progress(len(prompt), progress), cancel)
        self._dirty = True  # aligned saves during the prefill do not cover its end
        prefill_ms = (time.perf_counter() - started) * 1000
        report.reused_tokens = reused
        report.prefilled_tokens = len(self.engine.tokens) - reused
        report.elapsed_ms = report.restore_ms + prefill_ms
        self.throughput.record_prefill(report.prefilled_tokens, prefill_ms)
        if logits is not None and report.source in (COLD, REBUILT):
            self._save_shared_prefix(messages)
        if report.source == REBUILT:
            self.save("rebuild")
        return logits, prompt, report

    def generate(self, conversation: str, messages: list[dict], params: SamplingParams | None = None,
                 max_new_tokens: int = 256, on_text: TextFn | None = None, progress: ProgressFn | None = None,
                 cancel: CancelToken | None = None,
                 on_ready: Callable[[ResumeReport], None] | None = None) -> TurnResult:
        """One turn: resume, prefill the rest, decode, save the turn (prompt and reply as two records).
        ``on_ready`` gets the resume report once the prompt is in the KV, before decoding starts."""
        started = time.perf_counter()
        logits, prompt, report = self.sync(conversation, messages, progress, cancel)
        if on_ready is not None:
            on_ready(report)
        if logits is None:
            result = GenerationResult(prompt, [], "", "cancelled", report.reused_tokens)
        else:
            result = self.engine.generate(prompt, params, max_new_tokens, on_text, cancel=cancel, ready_logits=logits)
        t = result.timings
        t.prefill_ms, t.prefill_tokens = report.elapsed_ms, report.prefilled_tokens
        t.prefill_tokens_per_s = t.prefill_tokens / (t.prefill_ms / 1000) if t.prefill_ms > 0 else 0.0
        t.ttft_ms = t.ttft_ms + report.elapsed_ms if logits is not None else (time.perf_counter() - started) * 1000
        result.reused_tokens = report.reused_tokens
        save = self.save("turn", boundaries=[len(prompt)])
        return TurnResult(result, report, save, len(prompt))

    def switch_away(self) -> SaveReport | None:
        """Save the active conversation (if it changed) and drop its live KV."""
        report = self.save("switch") if self._dirty else None
        self.engine.reset(keep_buffers=True)  # the next conversation's restore may reuse them
        self.active = None
        return report

    def close(self) -> SaveReport | None:
        """Shutdown: save what is live."""
        report = self.save("shutdown") if self._dirty else None
        self.active = None
        self.throughput.flush()
        return report

    def forget(self, conversation: str) -> int:
        """Clear or delete a conversation: drop its live state and delete its checkpoints."""
        if self.active == conversation:
            self.engine.reset()
            self.active, self._dirty = None, False
        self._states.pop(conversation, None)
        return self.store.delete_conversation(conversation)

    def _saving_progress(self, prompt_len: int, progress: ProgressFn | None) -> ProgressFn:
        """Pass progress on, and save at every aligned frontier of a long prefill."""
        last_saved = [len(self.engine.tokens)]

        def hook(done: int, total: int) -> None:
            if progress:
                progress(done, total)
            n = len(self.engine.tokens)
            if n < prompt_len and n // self.save_align > last_saved[0] // self.save_align:
                self.save("prefill")
                last_saved[0] = n

        return hook

    # restoring ----------------------------------------------------------------------------------------
    def _restore(self, conversation: str, text: bytes, lead: list[int]) -> ResumeReport:
        engine = self.engine
        live = 0
        if self.active == conversation:
            live, _ = self._reusable(engine.tokens, lead, text)
            if live < len(engine.tokens):
                engine.truncate(live)
                self._dirty = True
        else:
            engine.reset(keep_buffers=True)
        report = ResumeReport(LIVE if live else COLD, reused_tokens=live)
        entry = self.store.conversation_entry(conversation)
        failure = None
        if entry is not None and (entry.tokens > live or entry.tokens == 0) and not self._file_is_ours(conversation):
            # tokens == 0: a file the index could not read; trying it reports why and replaces it
            if entry.tokens == 0 or self._worth_restoring(entry, live, report):
                loaded, failure = self._load(entry, text, lead, conversation)
                if loaded:
                    report.source, report.restored_tokens = DISK, loaded
        if len(engine.tokens) < MIN_PREFIX_TOKENS:
            loaded = self._restore_shared_prefix(text, lead, report)
            if loaded:
                report.source, report.restored_tokens = DISK, loaded
        if not engine.tokens:
            engine.cache.shrink_to_fit()  # nothing restored: don't decode in an oversized buffer
        if failure is not None:
            report.source, report.reason = REBUILT, failure.reason
            report.message, report.plain = str(failure), failure.plain
        report.reused_tokens = len(engine.tokens)
        return report

    def _file_is_ours(self, conversation: str) -> bool:
        """True when the live KV is this conversation and its file is exactly what we last wrote or
        read: then the file holds nothing the live KV lacks."""
        state = self._states.get(conversation)
        if self.active != conversation or state is None:
            return False
        try:
            return _stamp(self.store.path(conversation_file(conversation))) == state.stamp
        except OSError:
            return False

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
            loaded, failure = self._load(e, text, lead, None)
            if loaded:
                return loaded
            if failure is not None:
                log.warning("shared prefix %s unusable (%s); trying the next", e.name, failure)
        return 0

    def _load(self, entry: Entry, text: bytes, lead: list[int], conversation: str | None) -> tuple[int, CheckpointError | None]:
        """Load the longest verified frontier of ``entry`` that spells a prefix of ``text``.

        Returns (tokens now in the KV, the failure if the file was damaged or unusable). The KV is
        emptied first, so on any failure nothing unverified survives in it.
        """
        self.engine.reset(keep_buffers=True)  # invalidate the live state; its buffers may take the rows
        self._dirty = False
        started = time.perf_counter()
        try:
            with self.store.lock.held():
                return self._load_locked(entry, text, lead, conversation, started)
        except StoreBusyError as exc:  # another process is writing: prefill instead of waiting longer
            log.warning("%s", exc)
            self.engine.reset()
            return 0, None

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
            usable = self._matching_records(records, text)
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
                    self._cut_back(entry, header, records, i, conversation, exc)
                    if i == 0:
                        return 0, exc
                    reader.close()  # the file now ends before the damage: load what is left
                    loaded, _ = self._load_locked(entry, text, lead, conversation, started)
                    return loaded, exc
            if self._token_text(tokens, len(lead)) != text[: usable[-1].text_len] or tokens[: len(lead)] != lead:
                exc = CheckpointError(Reason.PREFIX_MISMATCH, "the saved token ids do not spell the saved text")
                return 0, self._discard(entry.name, conversation, exc)
            good, problem = self._read_rows(reader, usable)
            end = usable[good - 1].end if good else 0
            engine.tokens[:] = tokens[:end]
            if problem is None and len(usable) == len(records):
                problem = scan_problem  # the damage sits right after the frontier this text needed
            if problem is not None:
                self._cut_back(entry, header, records, good, conversation, problem)
            elif scan_problem is not None:  # damage beyond what this text needs: repair quietly
                self._cut_back(entry, header, records, len(records), conversation, scan_problem)
            if good:
                self._touch(entry, header, path)
                self.throughput.record_restore(usable[good - 1].end_offset, (time.perf_counter() - started) * 1000)
            if problem is None and scan_problem is None and conversation is not None:
                self._states[conversation] = _FileState(header, usable[:good], tokens[:end], _stamp(path))
        spelled = self._spelled(engine.tokens, len(lead))
        if spelled < len(text) and (text[spelled] & 0xC0) == 0x80:  # back to a character boundary
            keep, _ = self._reusable(engine.tokens, lead, text)
            engine.truncate(keep)
        return len(engine.tokens), problem

    def _matching_records(self, records: list[RecordInfo], text: bytes) -> list[RecordInfo]:
        """Records up to the last frontier whose saved text is a prefix of ``text``."""
        h = hashlib.sha256()
        hashed, best = 0, 0
        for i, r in enumerate(records):
            if r.text_len > len(text) or r.text_len < hashed:
                break
            h.update(text[hashed : r.text_len])
            hashed = r.text_len
            if h.copy().digest() == r.text_sha:
                best = i + 1
        return records[:best]

    def _read_rows(self, reader: CheckpointReader, records: list[RecordInfo]) -> tuple[int, CheckpointError | None]:
        cache = self.engine.cache
        end = records[-1].end
        cache.fit_for_overwrite(end)
        # Exact rows are read as they are stored; int8 rows are dequantized into any float dtype.
        int8 = reader.header.layout == LAYOUT_INT8_ROWS
        file_dtype = cache.dtype if int8 else np.dtype(reader.header.shape.dtype)
        if file_dtype == cache.dtype and cache.host_blocks(0, 0) is not None:  # read straight into the cache
            good, problem = reader.load_rows(records, cache.host_blocks)
            valid = records[good - 1].end if good else 0
            if valid < end:
                cache.clear(valid, end)  # no unverified bytes linger, even as scratch
            cache.commit(valid)
            return good, problem
        if file_dtype == cache.dtype and cache.on_device:
            # GPU memory: read every record into one host staging array in the cache's own order and
            # dtype, verify, then move the verified rows of all layers in one copy.
            stage = cache.staging(end)
            good, problem = reader.load_rows(records, lambda start, stop: [
                stage[layer, kv, h, start:stop] for layer in range(cache.n_layers) for kv in (0, 1)
                for h in range(cache.n_kv_heads)])
            valid = records[good - 1].end if good else 0
            if valid:
                cache.load_staged(stage[:, :, :, :valid], 0)
            return good, problem
        # Another element type: read every record into one host staging array in the file's dtype,
        # verify, then load it (converting) in one copy per buffer, not one per record.
        shape = (cache.n_layers, cache.n_kv_heads, end, cache.head_dim)
        keys, values = np.empty(shape, file_dtype), np.empty(shape, file_dtype)

        def blocks(start: int, stop: int) -> list[np.ndarray]:
            return [arr[layer, h, start:stop] for layer in range(cache.n_layers) for arr in (keys, values)
                    for h in range(cache.n_kv_heads)]

        good, problem = reader.load_rows(records, blocks)
        valid = records[good - 1].end if good else 0
        if valid:
            cache.load(keys[:, :, :valid], values[:, :, :valid], 0)
        return good, problem

    def _discard(self, name: str, conversation: str | None, exc: CheckpointError) -> CheckpointError:
        log.warning("checkpoint %s rejected (%s): %s; deleting it", name, exc.reason, exc)
        self.engine.reset()
        if conversation is not None:
            self._states.pop(conversation, None)
        try:
            self.store.remove(name, f"{exc.reason}: {exc}")
        except OSError as err:
            log.warning("cannot delete %s: %s", name, err)
        return exc

    def _cut_back(self, entry: Entry, header: FileHeader, records: list[RecordInfo], good: int,
                  conversation: str | None, exc: CheckpointError) -> CheckpointError:
        """Keep the first ``good`` records of a damaged file (delete it when none are good)."""
        if good == 0:
            return self._discard(entry.name, conversation, exc)
        log.warning("checkpoint %s damaged after token %d (%s): %s; keeping the %d record(s) before it",
                    entry.name, records[good - 1].end, exc.reason, exc, good)
        path = self.store.path(entry.name)
        try:
            with open(path, "r+b") as fh:
                fh.truncate(records[good - 1].end_offset)
                os.fsync(fh.fileno())
            last = records[good - 1]
            entry.tokens, entry.text_len, entry.text_sha, entry.bytes = last.end, last.text_len, last.text_sha, last.end_offset
            self.store.put(entry)
        except OSError as err:
            log.warning("cannot repair %s: %s", entry.name, err)
        if conversation is not None:
            self._states.pop(conversation, None)
        return exc

    def _touch(self, entry: Entry, header: FileHeader, path: os.PathLike) -> None:
        try:
            update_usage(path, header, now_ms(), header.hits + 1)
        except OSError:
            pass  # statistics only
        self.store.touch(entry.name)

    # saving ---------------------------------------------------------------------------------------------
    def save(self, reason: str = "turn", boundaries: Sequence[int] = ()) -> SaveReport | None:
        """Write the active conversation's KV: only the rows past what its file already holds.

        ``boundaries`` split the new rows into several records (a turn's prompt and reply), each a
        frontier a later edit can fall back to. A failure to write is reported, never raised.
        """
        conversation = self.active
        tokens = list(self.engine.tokens)
        if conversation is None or not tokens:
            return None
        started = time.perf_counter()
        try:
            with self.store.lock.held():
                report = self._save_locked(conversation, tokens, reason, boundaries)
            self.store.enforce_budget(protect={conversation})
        except (OSError, StoreBusyError) as exc:
            self._states.pop(conversation, None)
            error = f"could not save the conversation's context: {getattr(exc, 'strerror', None) or exc}"
            log.warning("%s", error)
            return SaveReport(False, reason, len(tokens), error=error,
                              elapsed_ms=(time.perf_counter() - started) * 1000)
        self._dirty = False
        report.elapsed_ms = (time.perf_counter() - started) * 1000
        return report

    def _save_locked(self, conversation: str, tokens: list[int], reason: str, boundaries: Sequence[int]) -> SaveReport:
        name = conversation_file(conversation)
        path = self.store.path(name)
        state = self._file_state(conversation, path)
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
            cut(path, keep)
            return self._saved(conversation, path, state.header, list(keep), tokens, reason, 0, 0)
        cuts = [b for b in sorted(set(boundaries)) if start < b < n] + [n]
        pieces, s = [], start
        for e in cuts:
            text_len, text_sha = self._frontier(tokens, e)
            pieces.append(NewRecord(s, tokens[s:e], self._row_blocks(s, e), text_len, text_sha, reason))
            s = e
        if state is None:
            header, records, written = write_new(path, self.identity, pieces, self.kv_encoding)
        else:
            header, records, written = state.header, list(keep), 0
            for piece in pieces:
                info, nbytes = append(path, header, records, piece)
                records.append(info)
                written += nbytes
        return self._saved(conversation, path, header, records, tokens, reason, n - start, written)

    def _saved(self, conversation: str, path: os.PathLike, header: FileHeader, records: list[RecordInfo],
               tokens: list[int], reason: str, new_tokens: int, written: int) -> SaveReport:
        """Remember what the file now holds, in memory and in the index."""
        self._states[conversation] = _FileState(header, records, tokens, _stamp(path))
        name = conversation_file(conversation)
        old = self.store.entry(name)
        last = records[-1]
        self.store.put(Entry(name, conversation, "conversation", last.end, last.text_len, last.text_sha,
                             last.end_offset, self.identity.model_fp, header.created_ms, now_ms(),
                             old.hits if old else 0, old.pinned if old else False))
        return SaveReport(True, reason, len(tokens), new_tokens, written)

    def _file_state(self, conversation: str, path: os.PathLike) -> _FileState | None:
        """What the conversation's file holds, from memory if the file is unchanged since, else read."""
        state = self._states.get(conversation)
        try:
            stamp = _stamp(path)
        except OSError:
            return None
        if state is not None and state.stamp == stamp:
            return state
        try:
            with CheckpointReader(path) as reader:
                header = reader.read_header()
                reader.check_identity(self.identity)
                records, _ = reader.scan()
                tokens: list[int] = []
                for r in records:
                    tokens += reader.read_tokens(r, self.engine.tokenizer.vocab_size)
        except CheckpointError as exc:
            log.info("rewriting %s from scratch: %s", path, exc)
            return None
        return _FileState(header, records, tokens, stamp)

    def _row_blocks(self, start: int, end: int) -> list[np.ndarray]:
        cache = self.engine.cache
        blocks = cache.host_blocks(start, end)
        if blocks is not None:
            return blocks
        keys, values = cache.export(start, end)
        return [arr[layer, h] for layer in range(cache.n_layers) for arr in (keys, values)
                for h in range(cache.n_kv_heads)]

    def _save_shared_prefix(self, messages: list[dict]) -> None:
        """Save the preamble + system prompt once, so other conversations starting with it skip it."""
        try:
            shared = self.shared_prefix_text(messages)
        except Exception as exc:  # a template that cannot render the probe: just no shared prefix
            log.debug("no shared prefix: %s", exc)
            return
        lead = [self.engine.tokens[0]] if self._lead_len else []
        k, spelled = self._reusable(self.engine.tokens, lead, shared)
        if k < MIN_PREFIX_TOKENS:
            return
        text_sha = hashlib.sha256(shared[:spelled]).digest()
        name = prefix_file(text_sha)
        if self.store.entry(name) is not None:
            return
        tokens = list(self.engine.tokens[:k])
        try:
            with self.store.lock.held():
                header, records, written = write_new(
                    self.store.path(name), self.identity,
                    [NewRecord(0, tokens, self._row_blocks(0, k), spelled, text_sha, "prefix")], self.kv_encoding)
                self.store.put(Entry(name, None, "prefix", k, spelled, text_sha, written, self.identity.model_fp,
                                     header.created_ms, now_ms(), 0, False))
        except (OSError, StoreBusyError) as exc:
            log.warning("could not save the shared prefix: %s", exc)
