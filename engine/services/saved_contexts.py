"""Saved-context administration: what the sidebar's badges, the browser's checks, budget and reclaim, and
the self-test's restore check ask of the local backend's checkpoint store (engine/checkpoint/store.py).

``SavedContexts`` is cheap (made for each use by ``engine.api.saved_contexts``): it holds no state of its
own, only the backend it reads the store and the live context from.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Iterable, Sequence

import numpy as np

from engine.checkpoint.status import record_status
from engine.checkpoint.store import Entry, is_api_owner
from engine.errors import ModelNotLoadedError
from engine.model.precision import get_precision
from engine.services.local import LocalBackend
from engine.types import (
    CancelToken,
    ContextBadge,
    ContextHealth,
    ContextReport,
    ContextState,
    ContextStatus,
    GcReport,
    RestoreCheck,
    StoreUsage,
)

log = logging.getLogger(__name__)
# check_restore: restored vs cold next-token logits. float32 on the CPU differs only by chunked sums (~1e-5);
# fp16 activations or CUDA's TF32 products by a few fp16 steps of the largest logit (0.0625 of ~20 seen on an
# H200), so there the bound is relative, as in tests/test_gpu.py.
EXACT_RESTORE_TOLERANCE = 1e-2
ROUNDED_RESTORE_TOLERANCE = 0.02


class SavedContexts:
    """The saved contexts of one local backend's data dir, as the loaded model (if any) sees them."""

    def __init__(self, backend: LocalBackend):
        self.backend = backend
        self._shares: dict | None = None

    def _bytes(self, entry: Entry) -> int:
        """The entry's part of the store's total: its share of each block it uses (the block store divides a
        shared block among its users), so the browser's rows add up to the total it shows."""
        store = self.backend.checkpoints
        if self._shares is None:
            self._shares = store.shares()
        share = self._shares.get(entry.name)
        return share.bytes if share is not None else entry.bytes

    @property
    def _sessions(self):
        return self.backend.sessions

    # the sidebar's badges -------------------------------------------------------------------------------
    def context_states(self) -> dict[str, ContextState]:
        """The sidebar's badge for every conversation with saved or live context: LIVE or SAVED for the
        loaded model's context; STALE (naming the model) when only other models saved context for it."""
        store = self.backend.checkpoints
        states: dict[str, ContextState] = {}
        others: dict[str, Entry] = {}
        sessions = self._sessions
        fp = sessions.identity.model_fp if sessions is not None else None
        for e in store.entries(kind="conversation"):  # most recently used first
            if not e.conversation:
                continue
            if fp is not None and e.model_fp == fp:
                states[e.conversation] = ContextState(ContextBadge.SAVED, e.tokens, store.model_label(e))
            else:
                others.setdefault(e.conversation, e)
        for cid, e in others.items():
            if cid not in states:
                states[cid] = ContextState(ContextBadge.STALE, e.tokens, store.model_label(e))
        active = sessions.active if sessions is not None else None
        if active and is_api_owner(active):  # the live KV is the server's prompt cache, no conversation's
            active = None
        if active and sessions.engine.tokens:
            states[active] = ContextState(ContextBadge.LIVE, len(sessions.engine.tokens), sessions.identity.label)
        for cid, tokens in self.backend.chosen_tokens.items():  # the chat's size with the version chosen
            if cid in states:
                states[cid] = dataclasses.replace(states[cid], tokens=tokens)
        return states

    # checks ---------------------------------------------------------------------------------------------
    def context_entry(self, conversation: str) -> Entry | None:
        """The saved context that serves the conversation: the loaded model's, or with no model loaded
        the most recently used one."""
        store = self.backend.checkpoints
        if self._sessions is not None:
            return store.conversation_entry(conversation, self._sessions.identity.model_fp)
        entries = store.conversation_entries(conversation)
        return entries[0] if entries else None

    def context_status(self, conversation: str, full: bool = False) -> ContextStatus:
        """A quick (headers) or full (every checksum) check of one conversation's saved context for the
        loaded model; STALE, naming the other model, when only other models saved context for it."""
        store = self.backend.checkpoints
        entry = self.context_entry(conversation)
        every = store.conversation_entries(conversation)
        if entry is None:
            if not every:
                return ContextStatus(conversation, ContextHealth.NONE)
            entry = every[0]
            label = store.model_label(entry) or "another model"
            return ContextStatus(conversation, ContextHealth.STALE, "model_mismatch",
                                 f"saved by {label}, not the loaded model: kept for when {label} runs it again",
                                 entry.tokens, self._bytes(entry), label, self._kept_for_others(every, entry))
        sessions = self._sessions
        identity = sessions.identity if sessions is not None else None
        vocab = sessions.engine.tokenizer.vocab_size if sessions is not None else None
        status, problem, tokens = record_status(store, entry.name, identity, vocab, full)
        return ContextStatus(conversation, ContextHealth(status), problem.reason if problem else None,
                             str(problem) if problem else "", tokens, self._bytes(entry), store.model_label(entry),
                             self._kept_for_others(every, entry))

    def _kept_for_others(self, every: Sequence[Entry], checked: Entry) -> tuple[tuple[str, int], ...]:
        """(model in words, bytes) of the chat's saved contexts besides the one checked: kept for when those
        models run it again, and on disk all the same (the browser's row counts them, so rows and total agree)."""
        return tuple((self.backend.checkpoints.model_label(e) or "another model", self._bytes(e)) for e in every
                     if e.name != checked.name)

    def inspect_contexts(self, conversations: Sequence[str], full: bool = False, cancel: CancelToken | None = None,
                         progress: Callable[[int, int], None] | None = None) -> ContextReport:
        items: dict[str, ContextStatus] = {}
        for i, cid in enumerate(conversations):
            if cancel is not None and cancel.cancelled:
                break
            items[cid] = self.context_status(cid, full)
            if progress is not None:
                progress(i + 1, len(conversations))
        usage = self.usage()
        return ContextReport(full, items, usage.bytes, usage.budget, bool(cancel and cancel.cancelled),
                             usage.by_kind)

    def check_restore(self, conversation: str) -> RestoreCheck:
        """Restore the conversation's saved context and compare its next-token logits with re-reading
        the same prompt from scratch (the self-test's proof that a restore is exact)."""
        sessions, info = self._sessions, self.backend.model
        if sessions is None or info is None:
            raise ModelNotLoadedError("the model is not loaded yet")
        engine = sessions.engine
        messages = self.backend.conversations.chat_messages(conversation)
        # Always from disk: on a fast GPU re-reading a short context is estimated cheaper than restoring
        # it, and the adaptive choice would then check nothing.
        adaptive, sessions.adaptive = sessions.adaptive, False
        try:
            restored, prompt, report = sessions.sync(conversation, messages)
        finally:
            sessions.adaptive = adaptive
        engine.reset(keep_buffers=True)
        cold, _ = engine.sync(prompt)  # the same tokens again: the session's view of the KV still holds
        a, b = np.asarray(restored, np.float32), np.asarray(cold, np.float32)
        exact = get_precision(info.weights).compute == "float32" and info.provider == "cpu"
        tolerance = EXACT_RESTORE_TOLERANCE if exact else ROUNDED_RESTORE_TOLERANCE * float(np.max(np.abs(b)))
        return RestoreCheck(report.freeze(), float(np.max(np.abs(a - b))), int(np.argmax(a)) == int(np.argmax(b)),
                            tolerance)

    # the store's size, budget and leftovers -----------------------------------------------------------------
    def usage(self) -> StoreUsage:
        store = self.backend.checkpoints
        self._shares = None  # the usage is read after changes: shares too
        return StoreUsage(store.total_bytes(), store.budget_bytes, store.bytes_by_kind(), store.shared_bytes(),
                          store.stats().get("bytes_written", 0))

    def drop_contexts(self, conversations: Iterable[str]) -> StoreUsage:
        """Delete saved context but keep the chats (their context is rebuilt when next used)."""
        for cid in conversations:
            self.backend.forget(cid)
        return self.usage()

    def copy_context(self, source: str, target: str) -> bool:
        """Give a branch its source's saved context, so it opens without re-reading (the frontiers past
        the branch point simply stop matching its text). False when there was none to copy."""
        store = self.backend.checkpoints
        if self._sessions is not None and self._sessions.active == source:
            self._sessions.save("switch")
        entry = self.context_entry(source)  # the loaded model's: the one the branch will be opened with
        if entry is None:
            return False
        try:
            return store.copy(entry.name, target) is not None  # the tier names and copies the record
        except OSError as exc:
            log.warning("could not copy the saved context of %s: %s", source, exc)
            return False

    def set_budget(self, budget_bytes: int) -> StoreUsage:
        store = self.backend.checkpoints
        store.set_budget(budget_bytes)
        active = self._sessions.active if self._sessions is not None else None
        store.enforce_budget(protect={active} if active else ())
        return self.usage()

    def reclaim(self, live_conversations: Iterable[str] | None = None) -> GcReport:
        """Remove leftovers and the saved context of deleted chats, then evict down to the budget."""
        live = set(live_conversations) if live_conversations is not None else self.backend.conversations.ids()
        r = self.backend.checkpoints.gc(live)
        return GcReport(r["temp_files"], tuple(r["orphans"]), tuple(r["evicted"]), r["bytes"], r["budget"])
