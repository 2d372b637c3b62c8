"""``ChatSessions``: one engine's conversations, each request served from the best verified KV.

This module ties the others together and keeps the per-engine state: which conversation the live KV
belongs to, whether it holds rows its file lacks, and what each file holds. For a request it renders
the prompt, asks restore.py for the best verified prefix, tokenizes only the rest and prefills it;
after a turn (or on a switch, at shutdown, at aligned frontiers of a long prefill) it asks saving.py
to write back the new rows.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Generator, Iterator, Sequence
from dataclasses import replace

import numpy as np

from engine.checkpoint.adaptive import Throughput
from engine.checkpoint.format import CheckpointError, Identity, Reason, encoding_layout
from engine.checkpoint.identity import engine_identity
from engine.checkpoint.store import model_tag
from engine.checkpoint.tier import StorageTier
from engine.generation import CancelToken, Engine, GenerationResult, ProgressFn, Step, TextFn
from engine.sampling import SamplingParams
from engine.session import prefix
from engine.session.reports import (
    COLD,
    REBUILT,
    SAVE_ALIGN,
    Decoded,
    Ready,
    ResumeReport,
    SaveReport,
    TurnResult,
    fold_prefill,
)
from engine.session.restore import Restorer
from engine.session.saving import FileStates, Saver

log = logging.getLogger(__name__)


class ChatSessions:
    def __init__(self, engine: Engine, store: StorageTier, identity: Identity | None = None,
                 save_align: int = SAVE_ALIGN, adaptive: bool = True, kv_encoding: str | None = None):
        """``adaptive`` False: always restore a usable checkpoint, even when re-reading looks faster.
        ``kv_encoding``: how new checkpoint files store the KV, "exact" (lossless) or "int8" (a
        quarter of float32's bytes; see docs/checkpoint-format.md §4b); None takes the store's setting
        (``store.json``, default "exact"). An existing file keeps its own encoding when appended to.
        ``store``: the storage tier saved context lives in (the file store, ``CheckpointStore``, or any
        other ``StorageTier``); restores try the live KV first, then it."""
        self.engine, self.store = engine, store
        self.adaptive = adaptive
        self.kv_encoding = store.kv_encoding if kv_encoding is None else kv_encoding
        encoding_layout(self.kv_encoding)  # ValueError naming the choices
        self.identity = identity or engine_identity(engine)
        # The store names this model in words (kv ls) and can later tell its files apart once its GGUF is gone.
        store.note_model(self.identity.model_fp, self.identity.label,
                         engine.model.gguf_path if engine.model is not None else None)
        self.save_align = save_align
        self.active: str | None = None
        self.throughput = Throughput(store.side_file("throughput.json"), engine.provider, model_tag(self.identity.model_fp))
        self._lead_len = 0
        self._dirty = False
        self._files = FileStates()
        # The files whose rows the live KV holds (its owner's own, a shared prefix, another branch of the
        # server's prompt cache): all deleted when those rows give NaN (drop_sources).
        self._origins: set[str] = set()
        self._saved_rows = self._saved_bytes = 0  # by every save so far: a turn reports its own part
        self._prefix_bytes = 0  # by every shared-prefix file written so far (another file: its own count)

    def shared_prefix_text(self, messages: list[dict]) -> bytes:
        """The rendered text every conversation with these leading messages starts with: the
        template's preamble and the system prompt, up to where the first user message begins."""
        return prefix.shared_prefix_text(self.engine.template, messages)

    # requests -----------------------------------------------------------------------------------------
    def check_fits(self, conversation: str, messages: list[dict]) -> None:
        """PromptError (with the token counts) when these messages cannot fit the context, without
        touching the KV. Cheap: a rendering shorter in bytes than the context fits (a token spells at
        least one byte); a longer one reuses the live KV's tokens for the prefix they spell and
        tokenizes only the rest (a whole 8k-token conversation would cost ~13 ms a turn)."""
        self.check_fits_text(conversation, self.engine.render(messages).encode("utf-8"))

    def check_fits_text(self, conversation: str, text: bytes) -> None:
        """``check_fits`` for a prompt already rendered (a bound request's, with its tools)."""
        tokenizer = self.engine.tokenizer
        lead = prefix.lead_tokens(tokenizer, text)
        if len(lead) + len(text) < self.engine.context_length:
            return
        kept, spelled = 0, 0
        if self.active == conversation and self.engine.tokens:
            kept, spelled = prefix.reusable(tokenizer, self.engine.tokens, lead, text)
        rest = tokenizer.encode(text[spelled:].decode("utf-8"))
        self.engine.check_length((kept or len(lead)) + len(rest))

    def prepare(self, conversation: str, messages: list[dict]) -> tuple[list[int], ResumeReport]:
        """Fill the KV with the best verified prefix of these messages; return the full prompt's tokens."""
        return self.prepare_text(conversation, self.engine.render(messages).encode("utf-8"))

    def prepare_text(self, conversation: str, text: bytes) -> tuple[list[int], ResumeReport]:
        """``prepare`` for a prompt already rendered (or a raw one: the server's completions)."""
        started = time.perf_counter()
        tokenizer = self.engine.tokenizer
        lead = prefix.lead_tokens(tokenizer, text)
        if self.active is not None and self.active != conversation:
            self.switch_away()
        self._lead_len = len(lead)
        restorer = Restorer(self.engine, self.store, self.identity, self.throughput, self._files, self.adaptive,
                            self.kv_encoding)
        report = restorer.restore(conversation, text, lead, live_is_ours=self.active == conversation)
        if restorer.dirty is not None:
            self._dirty = restorer.dirty
        if restorer.origins is not None:
            self._origins = set(restorer.origins)
        elif not self.engine.tokens:
            self._origins = set()
        self.active = conversation
        kept = list(self.engine.tokens)
        spelled = prefix.spelled_len(tokenizer, kept, len(lead))
        rest = tokenizer.encode(text[spelled:].decode("utf-8"))
        prompt = (kept if kept else lead) + rest
        report.restore_ms = (time.perf_counter() - started) * 1000
        return prompt, report

    def sync(self, conversation: str, messages: list[dict], progress: ProgressFn | None = None,
             cancel: CancelToken | None = None) -> tuple[np.ndarray | None, list[int], ResumeReport]:
        """Make the KV hold this conversation's prompt; return (last logits or None if cancelled, prompt, report)."""
        return self.sync_text(conversation, self.engine.render(messages).encode("utf-8"), progress, cancel, messages)

    def sync_text(self, conversation: str, text: bytes, progress: ProgressFn | None = None,
                  cancel: CancelToken | None = None, messages: list[dict] | None = None,
                  ) -> tuple[np.ndarray | None, list[int], ResumeReport]:
        """``sync`` for a rendered (or raw) prompt; ``messages``, when it has them, lets a cold start
        save the shared prefix (the system prompt) for other conversations."""
        prompt, report = self.prepare_text(conversation, text)
        logits = self.fill(prompt, report, progress, cancel, messages)
        if report.source == REBUILT:
            self.save("rebuild")
        return logits, prompt, report

    def fill(self, prompt: list[int], report: ResumeReport, progress: ProgressFn | None = None,
             cancel: CancelToken | None = None, messages: list[dict] | None = None) -> np.ndarray | None:
        """Prefill what ``prepare`` left of ``prompt`` (no second restore); its last logits, None if cancelled.
        ``report`` gets the prefill's counts and time."""
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
        if logits is not None and report.source in (COLD, REBUILT) and messages is not None:
            self._save_shared_prefix(messages)
        return logits

    def generate(self, conversation: str, messages: list[dict], params: SamplingParams | None = None,
                 max_new_tokens: int = 256, on_text: TextFn | None = None, progress: ProgressFn | None = None,
                 cancel: CancelToken | None = None, prompt_text: bytes | None = None) -> TurnResult:
        """``run`` to its end (a caller that stores nothing between decoding and the save)."""
        for step in self.run(conversation, messages, params, max_new_tokens, progress, cancel, prompt_text):
            if isinstance(step, Step) and on_text is not None:
                on_text(step.text)
            elif isinstance(step, TurnResult):
                return step
        raise RuntimeError("a turn ended without its result")

    def run(self, conversation: str, messages: list[dict], params: SamplingParams | None = None,
            max_new_tokens: int = 256, progress: ProgressFn | None = None, cancel: CancelToken | None = None,
            prompt_text: bytes | None = None, *, started: float | None = None, top_logprobs: int | None = None,
            **decoding) -> Iterator[Ready | Step | Decoded | TurnResult]:
        """One turn's model work as typed steps: resume and prefill the rest (``Ready``), decode (``Step``s),
        ``Decoded`` (the consumer stores the reply then: a failed save never costs it, and an exception it
        raises skips the save), save the turn (prompt and reply as two records) and end with the
        ``TurnResult``. ``prompt_text``: the prompt already rendered from ``messages`` (a Continue leaves the
        last reply open). ``started``: when the request began (``perf_counter``; its time to first token
        counts from there; None: now). ``top_logprobs`` and ``decoding``: as ``Engine.decode`` takes them."""
        started = time.perf_counter() if started is None else started
        rows_before, bytes_before, prefix_before = self._saved_rows, self._saved_bytes, self._prefix_bytes
        if prompt_text is None:
            prompt_text = self.engine.render(messages).encode("utf-8")
        logits, prompt, report = self.sync_text(conversation, prompt_text, progress, cancel, messages)
        yield Ready(report)
        if logits is None:
            result = GenerationResult(prompt, [], "", "cancelled", report.reused_tokens)
        else:
            result = yield from self._decode(prompt, logits, params, max_new_tokens, cancel, top_logprobs, decoding)
            if result.rebuilt:  # the saved context it resumed from gave NaN: the save below starts afresh
                self.drop_sources(conversation, messages, report, len(prompt))
        fold_prefill(result, report, started)
        yield Decoded(result, len(prompt))
        save = self.save("turn", boundaries=[len(prompt)])
        if save is not None:  # a long prefill saved most of the rows already: count what the whole turn wrote
            save = replace(save, new_tokens=self._saved_rows - rows_before,
                           bytes_written=self._saved_bytes - bytes_before,
                           prefix_bytes_written=self._prefix_bytes - prefix_before)
        yield TurnResult(result, report, save, len(prompt))

    def _decode(self, prompt: list[int], logits: np.ndarray, params: SamplingParams | None, max_new_tokens: int,
                cancel: CancelToken | None, top_logprobs: int | None, decoding: dict,
                ) -> Generator[Step, None, GenerationResult]:
        """The decode's steps passed on; its result returned (``yield from`` gives it)."""
        for step in self.engine.decode(prompt, params, max_new_tokens, cancel=cancel, ready_logits=logits,
                                       top_logprobs=top_logprobs, **decoding):
            if isinstance(step, GenerationResult):
                return step
            yield step
        raise RuntimeError("a decode ended without its result")

    def switch_away(self) -> SaveReport | None:
        """Save the active conversation (if it changed) and drop its live KV."""
        report = self.save("switch") if self._dirty else None
        self.engine.reset(keep_buffers=True)  # the next conversation's restore may reuse them
        self.active = None
        self._origins = set()
        return report

    def adopt(self, owner: str, origins: Sequence[str] | None = None) -> None:
        """The live KV now belongs to ``owner`` (whose file lacks it: the next save writes it), without
        saving or dropping it: the server's prompt cache starting a new branch from a live prefix.
        ``origins``: the files the KV was just loaded from; None: it is the previous owner's live KV, so
        its rows came from that owner's file (and whatever that one came from)."""
        if origins is not None:
            self._origins = set(origins)
        elif self.active is not None and self.engine.tokens:
            self._origins.add(self.store.record_name(self.active, self.identity.model_fp))
        self.active, self._dirty = owner, True
        self._files.forget(owner)

    def drop_sources(self, owner: str, messages: list[dict] | None = None, report: ResumeReport | None = None,
                     prompt_len: int = 0) -> None:
        """The context a turn resumed from gave NaN logits, and ``Engine.generate`` rebuilt it from the
        prompt (``GenerationResult.rebuilt``): delete every file those rows came from, the owner's own, a
        shared prefix (the saved system prompt) or another branch of the server's prompt cache, so no later
        turn starts from them again (a prefix resealed with rows at float32's maximum verified, then
        overflowed the attention of every new chat with that system prompt). The turn's save writes the
        owner's file afresh; ``messages``: save the shared prefix again, from the rebuilt rows; ``report``:
        the turn's, now saying that its ``prompt_len`` tokens were rebuilt, and why (the client of the server
        was told ``disk`` and a cached-token count that no longer held)."""
        gone = sorted(self._origins - {self.store.record_name(owner, self.identity.model_fp)})
        log.warning("%s: its saved context gave invalid numbers; deleting it%s", owner,
                    f" and {', '.join(gone)}" if gone else "")
        self._files.forget(owner)
        for name in sorted(self._origins):  # the owner's own record too, when its rows were used
            try:  # with the rows it shares with other records (the block store's blocks)
                self.store.discard(name, "its rows gave invalid numbers (NaN)")
            except OSError as exc:  # the next turn that loads it rebuilds again, and tries again
                log.warning("cannot delete %s: %s", name, exc)
        self.store.delete_conversation(owner)
        self._origins = set()
        self._dirty = True
        if report is not None:
            why = CheckpointError(Reason.NON_FINITE, "the saved context gave invalid numbers (NaN) when the model "
                                  "read it: it was deleted and rebuilt from the text")
            report.source, report.reason, report.message, report.plain = REBUILT, why.reason, str(why), why.plain
            report.reused_tokens = report.restored_tokens = 0
            report.shared_prefix = False
            report.prefilled_tokens = prompt_len
        if messages is not None:
            self._save_shared_prefix(messages)

    @property
    def dirty(self) -> bool:
        """The live KV holds rows its owner's file lacks."""
        return self._dirty

    def close(self) -> SaveReport | None:
        """Shutdown: save what is live."""
        report = self.save("shutdown") if self._dirty else None
        self.active = None
        self.throughput.flush()
        return report

    def forget(self, conversation: str) -> int:
        """Clear or delete a conversation: drop its live state and delete its checkpoints (every model's)."""
        if self.active == conversation:
            self.engine.reset()
            self.active, self._dirty = None, False
            self._origins = set()
        self._files.forget(conversation)
        return self.store.delete_conversation(conversation)

    # saving ---------------------------------------------------------------------------------------------
    def _saver(self) -> Saver:
        return Saver(self.engine, self.store, self.identity, self._files, self.kv_encoding, self._lead_len)

    def save(self, reason: str = "turn", boundaries: Sequence[int] = ()) -> SaveReport | None:
        """Write the active conversation's KV: only the rows past what its file already holds.

        ``boundaries`` split the new rows into several records (a turn's prompt and reply), each a
        frontier a later edit can fall back to. A failure to write is reported, never raised.
        """
        conversation = self.active
        if conversation is None or not self.engine.tokens:
            return None
        report = self._saver().save(conversation, reason, boundaries)
        self._saved_rows += report.new_tokens
        self._saved_bytes += report.bytes_written
        if not report.ok:
            return report
        self._dirty = False
        entry = self.store.entry(self.store.record_name(conversation, self.identity.model_fp))  # as the save left it
        return replace(report, file_bytes=entry.bytes if entry is not None else 0)

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

    def _save_shared_prefix(self, messages: list[dict]) -> None:
        """Save the preamble + system prompt once, so other conversations starting with it skip it."""
        try:
            shared = self.shared_prefix_text(messages)
        except Exception as exc:  # a template that cannot render the probe: just no shared prefix
            log.debug("no shared prefix: %s", exc)
            return
        self._prefix_bytes += self._saver().save_shared_prefix(shared)
