"""SentencePiece vocabularies as GGUF stores them (``tokenizer.ggml.model = "llama"``): Gemma,
Mistral, Llama 2.

Each piece has a score. Tokenizing a stretch of text starts from its characters and repeatedly joins
the adjacent pair whose joined piece is in the vocabulary with the highest score (llama.cpp's rule
for this vocabulary type). A Hugging Face BPE does exactly that when its merges are every
(left, right) split of every piece, ranked by the joined piece's score. A character outside the
vocabulary becomes its UTF-8 bytes as ``<0xNN>`` tokens. Spaces are spelled ``▁`` (U+2581).
"""

from __future__ import annotations

import re

import numpy as np

SPACE = "\u2581"
# tokenizer.ggml.token_type values (llama.cpp's)
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6
_BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")


def merges_by_score(tokens: list[str], types: np.ndarray, scores: np.ndarray) -> list[tuple[str, str]]:
    """BPE merges equivalent to joining by score: best-scoring joined piece first (ties: lower id, then
    the shorter left part). Gemma's 262k pieces give half a million merges: this loop is most of the
    time ``hearth-cli tokenize`` takes, so it sorts plain tuples (no key function) and tests the right
    part only when the left one is a piece."""
    kinds = types.tolist()
    normal = {t for t, k in zip(tokens, kinds, strict=True) if k == NORMAL}
    negated = (-np.asarray(scores, dtype=np.float64)).tolist()  # float32 values, compared exactly as before
    ranked: list[tuple[float, int, int, str, str]] = []
    for i, piece in enumerate(tokens):
        if kinds[i] != NORMAL or len(piece) < 2:
            continue
        for cut in range(1, len(piece)):
            left = piece[:cut]
            if left in normal:
                right = piece[cut:]
                if right in normal:
                    ranked.append((negated[i], i, cut, left, right))
    ranked.sort()  # (score, id, cut) is unique: the strings are never compared
    return [(left, right) for _, _, _, left, right in ranked]


def piece_bytes(piece: str, kind: int) -> bytes:
    """The text bytes a piece stands for: ``<0xNN>`` byte tokens are one byte, ``▁`` is a space."""
    if kind == BYTE and (m := _BYTE_TOKEN.fullmatch(piece)):
        return bytes([int(m.group(1), 16)])
    return piece.replace(SPACE, " ").encode("utf-8")


def build(tokens: list[str], types: np.ndarray, scores: np.ndarray, unk: int | None, add_space_prefix: bool):
    """A ``tokenizers.Tokenizer`` for the vocabulary (added tokens are the caller's business)."""
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import models, normalizers

    vocab = {tok: i for i, tok in enumerate(tokens)}
    bpe = models.BPE(vocab=vocab, merges=merges_by_score(tokens, types, scores), byte_fallback=True,
                     fuse_unk=False, unk_token=tokens[unk] if unk is not None else None)
    hf = HFTokenizer(bpe)
    # Normalizers run on each stretch between special tokens: llama.cpp also prefixes the space to the
    # text after every special token, not only at the start.
    steps = [normalizers.Prepend(SPACE)] if add_space_prefix else []
    hf.normalizer = normalizers.Sequence([*steps, normalizers.Replace(" ", SPACE)])
    return hf
