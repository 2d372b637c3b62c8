"""Logits → next token: greedy, or temperature with top-k, top-p and min-p, after a repetition penalty.

Then OpenAI's presence and frequency penalties (counted over the reply only), then a constraint's mask
of allowed tokens (engine/text/constrained.py), in that order.

``token_logprob`` reports what a token's probability was under the raw model distribution.

A sampler owns a seeded ``numpy.random.Generator``, so the same seed and the same logits give the
same reply every time.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from engine.errors import NumericalError, PromptError
from engine.lookup import speculative_accept
from engine.types import MAX_TOP_LOGPROBS, SamplingParams, TokenLogprob

PENALTY_RANGE = (-2.0, 2.0)  # OpenAI's range for presence_penalty and frequency_penalty


class Sampler:
    def __init__(self, params: SamplingParams, presence_penalty: float = 0.0, frequency_penalty: float = 0.0):
        params.validate()
        check_penalty("presence penalty", presence_penalty)
        check_penalty("frequency penalty", frequency_penalty)
        self.params = params
        self.presence_penalty = float(presence_penalty)
        self.frequency_penalty = float(frequency_penalty)
        self.rng = np.random.default_rng(params.seed)

    @property
    def has_reply_penalties(self) -> bool:
        return self.presence_penalty != 0.0 or self.frequency_penalty != 0.0

    def sample(self, logits: np.ndarray, history: Sequence[int], reply_counts: np.ndarray | None = None,
               allowed: np.ndarray | None = None, draft: int | None = None) -> int:
        """``reply_counts``: how often each token id occurs in the reply so far (for the OpenAI penalties);
        ``allowed``: a boolean mask over the vocabulary, False for tokens a constraint forbids; ``draft``: a
        prompt-lookup token to accept or replace by the speculative rule (engine/lookup.py), same distribution."""
        p = self.params
        logits = np.asarray(logits, dtype=np.float32)
        if not np.isfinite(logits).all():  # argmax of NaNs is token 0: garbage that looks like output
            raise NumericalError("the model computed invalid numbers (NaN or infinity)")  # the engine adds why
        if p.repetition_penalty != 1.0 and history:
            logits = apply_repetition_penalty(logits, history[-p.penalty_window :], p.repetition_penalty)
        if reply_counts is not None and self.has_reply_penalties:
            logits = apply_openai_penalties(logits, reply_counts, self.presence_penalty, self.frequency_penalty)
        if allowed is not None:
            logits = apply_mask(logits, allowed)
        if p.greedy or p.temperature == 0:
            return int(np.argmax(logits))
        ids, probs = _candidates(logits, p)
        if draft is not None:
            return speculative_accept(ids, probs, draft, self.rng)
        return int(self.rng.choice(ids, p=probs))


def apply_repetition_penalty(logits: np.ndarray, recent: Sequence[int], penalty: float) -> np.ndarray:
    """llama.cpp/CTRL style: shrink positive and grow negative logits of recently seen tokens."""
    out = logits.copy()
    seen = np.unique(np.asarray(recent, dtype=np.int64))
    vals = out[seen]
    out[seen] = np.where(vals > 0, vals / penalty, vals * penalty)
    return out


def check_penalty(name: str, value: float) -> None:
    low, high = PENALTY_RANGE
    if not isinstance(value, int | float) or not low <= value <= high:  # also refuses NaN
        raise PromptError(f"{name} must be from {low:g} to {high:g}, got {value}")


def apply_openai_penalties(logits: np.ndarray, counts: np.ndarray, presence: float, frequency: float) -> np.ndarray:
    """OpenAI's penalties: every token already in the reply loses ``presence`` once and ``frequency``
    for each time it occurred (``counts[id]``). Negative values favour repetition instead."""
    counts = np.asarray(counts, dtype=np.float32)[: logits.size]
    return logits - np.float32(frequency) * counts - np.float32(presence) * (counts > 0)


def apply_mask(logits: np.ndarray, allowed: np.ndarray) -> np.ndarray:
    """``logits`` with every token ``allowed`` does not cover at minus infinity (ids past the mask's end,
    e.g. a model's padded vocabulary, are forbidden too)."""
    full = np.zeros(logits.size, dtype=bool)
    n = min(allowed.size, logits.size)
    full[:n] = allowed[:n]
    if not full.any():
        raise PromptError("the response format allows no token at this point")
    return np.where(full, logits, np.float32(-np.inf))


def _candidates(logits: np.ndarray, p: SamplingParams) -> tuple[np.ndarray, np.ndarray]:
    """(token ids, probabilities) left after temperature, top-k, top-p and min-p."""
    scaled = logits / p.temperature
    k = p.top_k if 0 < p.top_k < scaled.size else scaled.size
    ids = np.argpartition(-scaled, k - 1)[:k] if k < scaled.size else np.arange(scaled.size)
    ids = ids[np.argsort(-scaled[ids], kind="stable")]
    probs = np.exp(scaled[ids] - scaled[ids[0]])
    probs /= probs.sum()
    keep = probs.size
    if p.top_p < 1.0:
        keep = int(np.searchsorted(np.cumsum(probs), p.top_p) + 1)
    if p.min_p > 0:
        keep = min(keep, max(1, int(np.count_nonzero(probs >= p.min_p * probs[0]))))
    ids, probs = ids[:keep], probs[:keep]
    return ids, probs / probs.sum()


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """Natural-log probabilities of ``logits`` in float64, shifted by the maximum so nothing overflows."""
    x = np.asarray(logits, dtype=np.float64)
    shifted = x - np.max(x)
    return shifted - np.log(np.sum(np.exp(shifted)))


def check_top_logprobs(k: int) -> None:
    if not 0 <= k <= MAX_TOP_LOGPROBS:
        raise ValueError(f"top logprobs must be from 0 to {MAX_TOP_LOGPROBS}, got {k}")


def token_logprob(logits: np.ndarray, token: int, k: int) -> TokenLogprob:
    """``token``'s log-probability under the raw logits and the ``k`` most likely tokens.

    Raw, not after temperature or top-p: that is what OpenAI-style clients expect, and a greedy token
    then always heads its own ``top`` list. Ties are ordered by id, as ``argmax`` picks the lowest.
    """
    check_top_logprobs(k)
    lp = log_softmax(logits)
    top: tuple[tuple[int, float], ...] = ()
    if k:
        k = min(k, lp.size)
        kth = -np.partition(-lp, k - 1)[k - 1]
        ids = np.flatnonzero(lp >= kth)  # every token tied with the k-th too, so ties resolve by id
        ids = ids[np.lexsort((ids, -lp[ids]))][:k]
        top = tuple((int(i), float(lp[i])) for i in ids)
    return TokenLogprob(int(token), float(lp[token]), top)
