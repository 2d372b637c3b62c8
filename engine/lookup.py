"""Prompt-lookup decoding: draft tokens by n-gram match against the context, no draft model.

``propose`` finds the most recent earlier occurrence of the context's last n tokens (n from
``NGRAM_MAX`` down to 1) and drafts the tokens that followed it. The engine verifies a draft in one
forward pass (the graph's ``logits_start`` input returns the last 1 + drafted positions' logits) and keeps
the longest prefix the sampler agrees with, plus the sampler's own next token.

``speculative_accept`` is the acceptance rule for a deterministic draft under sampling: accept the
drafted token t with probability p(t); otherwise sample from p with t removed, renormalized. Each
token's distribution is then exactly p (P(t) = p(t); P(u≠t) = (1 - p(t))·p(u)/(1 - p(t))), so sampling
keeps its distribution and greedy decoding its tokens.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

NGRAM_MAX = 3
MAX_DRAFT_LIMIT = 64  # the most tokens one verification pass may draft (SamplingParams.prompt_lookup)
# Backing off where drafts keep missing (ordinary chat, where a verification pass costs more than the
# single-token pass it replaces): after MISSES_BEFORE_PAUSE drafts in a row with no token accepted, draft
# nothing for PAUSE_TOKENS tokens, twice as long after each further miss (at most PAUSE_MAX); a draft
# with any token accepted ends the back-off. PAUSE_TOKENS = 0 turns it off.
MISSES_BEFORE_PAUSE = 2
PAUSE_TOKENS = 16
PAUSE_MAX = 256


class Backoff:
    """When to draft: counts drafts in a row that had no token accepted and pauses drafting after them."""

    def __init__(self, misses_before_pause: int | None = None, pause_tokens: int | None = None) -> None:
        self.misses_before_pause = MISSES_BEFORE_PAUSE if misses_before_pause is None else misses_before_pause
        self.pause_tokens = PAUSE_TOKENS if pause_tokens is None else pause_tokens
        self.misses = 0
        self.wait = 0  # tokens left before drafting again

    def ready(self) -> bool:
        """Whether to draft at this step; a step that may not draft counts down the pause."""
        if self.wait > 0:
            self.wait -= 1
            return False
        return True

    def outcome(self, accepted: int) -> None:
        """A draft ended with ``accepted`` of its tokens kept."""
        if accepted > 0 or self.pause_tokens <= 0:
            self.misses = 0
            return
        self.misses += 1
        over = self.misses - self.misses_before_pause
        if over >= 0:
            self.wait = min(self.pause_tokens << over, PAUSE_MAX)


def propose(history: Sequence[int] | np.ndarray, max_draft: int, ngram_max: int = NGRAM_MAX) -> list[int]:
    """Up to ``max_draft`` tokens that followed the latest earlier occurrence of ``history``'s last n
    tokens, trying the longest n first; [] when nothing matches."""
    arr = np.asarray(history, dtype=np.int64)
    if max_draft < 1 or arr.size < 2:
        return []
    for n in range(min(ngram_max, arr.size - 1), 0, -1):
        tail = arr[-n:]
        windows = sliding_window_view(arr[:-1], n)  # start i: arr[i:i+n], followed by at least one token
        hits = np.flatnonzero((windows == tail).all(axis=1))
        if hits.size:
            start = int(hits[-1]) + n
            return [int(t) for t in arr[start : start + max_draft]]
    return []


def speculative_accept(ids: np.ndarray, probs: np.ndarray, draft: int, rng: np.random.Generator) -> int:
    """A token from the distribution (``ids``, ``probs``) given a deterministic ``draft``: the draft itself
    with probability p(draft), else a sample from the rest, renormalized (the same distribution overall)."""
    ids = np.asarray(ids)
    probs = np.asarray(probs, dtype=np.float64)
    where = np.flatnonzero(ids == draft)
    p_draft = float(probs[where[0]]) if where.size else 0.0
    if p_draft > 0.0 and rng.random() < p_draft:
        return int(draft)
    rest = probs.copy()
    if where.size:
        rest[where[0]] = 0.0
    total = rest.sum()
    if total <= 0.0:  # the draft held all the mass (p = 1 up to rounding): nothing else can follow
        return int(draft)
    return int(rng.choice(ids, p=rest / total))
