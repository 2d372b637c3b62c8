"""Logits → next token: greedy, or temperature with top-k, top-p and min-p, after a repetition penalty.

``token_logprob`` reports what a token's probability was under the raw model distribution.

A sampler owns a seeded ``numpy.random.Generator``, so the same seed and the same logits give the
same reply every time.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from engine.errors import NumericalError
from engine.types import MAX_TOP_LOGPROBS, SamplingParams, TokenLogprob


class Sampler:
    def __init__(self, params: SamplingParams):
        params.validate()
        self.params = params
        self.rng = np.random.default_rng(params.seed)

    def sample(self, logits: np.ndarray, history: Sequence[int]) -> int:
        p = self.params
        logits = np.asarray(logits, dtype=np.float32)
        if not np.isfinite(logits).all():  # argmax of NaNs is token 0: garbage that looks like output
            raise NumericalError("the model computed invalid numbers (NaN or infinity): its activations overflowed "
                                 "the precision it runs in; run it with --weights int4 or fp32")
        if p.repetition_penalty != 1.0 and history:
            logits = apply_repetition_penalty(logits, history[-p.penalty_window :], p.repetition_penalty)
        if p.greedy or p.temperature == 0:
            return int(np.argmax(logits))
        ids, probs = _candidates(logits, p)
        return int(self.rng.choice(ids, p=probs))


def apply_repetition_penalty(logits: np.ndarray, recent: Sequence[int], penalty: float) -> np.ndarray:
    """llama.cpp/CTRL style: shrink positive and grow negative logits of recently seen tokens."""
    out = logits.copy()
    seen = np.unique(np.asarray(recent, dtype=np.int64))
    vals = out[seen]
    out[seen] = np.where(vals > 0, vals / penalty, vals * penalty)
    return out


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
