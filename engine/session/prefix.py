"""Prefix matching by bytes: how much of a token list (live or saved) serves a rendered prompt.

Text is the ground truth. A conversation's rendered prompt is bytes; the KV holds tokens whose bytes
spell a prefix of it. Matching is by bytes, as in ds4: once a saved or live prefix spells the start
of the prompt, its exact tokens are kept and only the rest of the text is tokenized. A prefix is
cut back to a token boundary that is also a UTF-8 character boundary, so the rest decodes cleanly.
The model's BOS, when the rendered text does not spell it, leads the tokens (``lead``) and spells
nothing. Saved frontiers are matched by the SHA-256 of the text they spell.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np

from engine.checkpoint.format import RecordInfo
from engine.text.chat_template import ChatTemplate
from engine.text.tokenizer import Tokenizer


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


def lead_tokens(tokenizer: Tokenizer, text: bytes) -> list[int]:
    """[BOS] when the model wants one that the rendered text does not spell, else []."""
    bos = tokenizer.specials.bos
    if tokenizer.add_bos and bos is not None and not text.startswith(tokenizer.token_bytes(bos)):
        return [bos]
    return []


def token_text(tokenizer: Tokenizer, tokens: Sequence[int], lead_len: int) -> bytes:
    """The text ``tokens`` spell (after their ``lead_len`` leading tokens)."""
    tb = tokenizer.token_bytes
    return b"".join(tb(t) for t in tokens[lead_len:])


def spelled_len(tokenizer: Tokenizer, tokens: Sequence[int], lead_len: int) -> int:
    """How many bytes of text ``tokens`` spell."""
    ids = np.asarray(tokens[lead_len:], dtype=np.int64)
    return int(tokenizer.byte_lengths[ids].sum()) if ids.size else 0


def reusable(tokenizer: Tokenizer, tokens: Sequence[int], lead: list[int], text: bytes) -> tuple[int, int]:
    """(tokens kept, bytes they spell): the longest token prefix spelling a prefix of ``text``
    that ends on a UTF-8 character boundary."""
    if not tokens or list(tokens[: len(lead)]) != lead:
        return 0, 0
    ends = np.cumsum(tokenizer.byte_lengths[np.asarray(tokens[len(lead):], dtype=np.int64)])
    matched = common_prefix_len(token_text(tokenizer, tokens, len(lead)), text)
    k = int(np.searchsorted(ends, matched, side="right"))  # whole tokens inside the match
    spelled = int(ends[k - 1]) if k else 0
    while k and spelled < len(text) and (text[spelled] & 0xC0) == 0x80:
        k -= 1
        spelled = int(ends[k - 1]) if k else 0
    if k == 0 and not lead:
        return 0, 0
    return len(lead) + k, spelled


def frontier(tokenizer: Tokenizer, tokens: Sequence[int], end: int, lead_len: int) -> tuple[int, bytes]:
    """(length, SHA-256) of the text tokens [0, end) spell: what a record saved there names."""
    text = token_text(tokenizer, tokens[:end], lead_len)
    return len(text), hashlib.sha256(text).digest()


def matching_records(records: list[RecordInfo], text: bytes) -> list[RecordInfo]:
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


def shared_prefix_text(template: ChatTemplate, messages: list[dict]) -> bytes:
    """The rendered text every conversation with these leading messages starts with: the
    template's preamble and the system prompt, up to where the first user message begins."""
    first_user = next((i for i, m in enumerate(messages) if m["role"] == "user"), None)
    if first_user is None:
        return b""
    head = [dict(m) for m in messages[: first_user + 1]]
    renders = []
    for probe in ("a", "b"):
        head[-1] = {"role": "user", "content": probe}
        renders.append(template.render(head, add_generation_prompt=False).encode("utf-8"))
    return renders[0][: common_prefix_len(*renders)]
