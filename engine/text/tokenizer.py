"""The tokenizer a GGUF carries, rebuilt as a Hugging Face ``tokenizers`` byte-level BPE.

GGUF stores the vocabulary (``tokenizer.ggml.tokens``), merges, token types and the name of the
pre-tokenizer (``tokenizer.ggml.pre``); the regex each name stands for is llama.cpp's convention.
Control and user-defined tokens become special tokens, so ``<|im_start|>`` in rendered chat text
maps to its single id. Decoding goes through a byte table so streamed text is built from bytes.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

import numpy as np

from engine.errors import ModelFileError, UnsupportedModelError
from engine.model.gguf_file import GGUFModel
from engine.text.byte_level import token_text_to_bytes

# GPT-2's split pattern; most byte-level llama tokenizers use it or a close variant.
_GPT2_SPLIT = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# name in tokenizer.ggml.pre → (split digits one by one first, split regex)
PRE_TOKENIZERS: dict[str, tuple[bool, str]] = {
    "default": (False, _GPT2_SPLIT),
    "gpt2": (False, _GPT2_SPLIT),
    "smollm": (True, _GPT2_SPLIT),
    "starcoder": (True, _GPT2_SPLIT),
    "refact": (True, _GPT2_SPLIT),
    "llama3": (False, _LLAMA3_SPLIT),
    "llama-bpe": (False, _LLAMA3_SPLIT),
}
CONTROL, USER_DEFINED = 3, 4


@dataclass(frozen=True)
class SpecialIds:
    bos: int | None
    eos: int | None
    eot: int | None
    stop: frozenset[int]  # every id that ends an assistant turn


class Tokenizer:
    def __init__(self, tokens: list[str], merges: list[str], types: np.ndarray, pre: str, specials: SpecialIds,
                 add_bos: bool):
        from tokenizers import Regex, decoders, models, pre_tokenizers
        from tokenizers import Tokenizer as HFTokenizer

        if pre not in PRE_TOKENIZERS:
            raise UnsupportedModelError(
                f"pre-tokenizer {pre!r} is not supported; known: {', '.join(sorted(PRE_TOKENIZERS))}"
            )
        split_digits, pattern = PRE_TOKENIZERS[pre]
        vocab = {tok: i for i, tok in enumerate(tokens)}
        pairs = [tuple(m.split(" ", 1)) for m in merges if " " in m]
        bpe = models.BPE(vocab=vocab, merges=pairs, fuse_unk=False, byte_fallback=False)
        hf = HFTokenizer(bpe)
        steps = [pre_tokenizers.Digits(individual_digits=True)] if split_digits else []
        steps += [
            pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
        hf.pre_tokenizer = pre_tokenizers.Sequence(steps)
        hf.decoder = decoders.ByteLevel()
        special = [tokens[i] for i in range(len(tokens)) if int(types[i]) in (CONTROL, USER_DEFINED)]
        hf.add_special_tokens(special)
        self._hf = hf
        self.fingerprint = _fingerprint(tokens, merges, types, pre, specials, add_bos)
        self.vocab_size = len(tokens)
        self.specials = specials
        self.add_bos = add_bos
        self.tokens = tokens
        self._special_ids = {vocab[t] for t in special}
        # Byte form of every token; special tokens decode to their text only when asked for.
        self._bytes: list[bytes] = []
        for i, tok in enumerate(tokens):
            raw = token_text_to_bytes(tok)
            self._bytes.append(raw if raw is not None and i not in self._special_ids else tok.encode("utf-8"))
        self.byte_lengths = np.array([len(b) for b in self._bytes], dtype=np.int64)  # for fast text offsets

    @classmethod
    def from_gguf(cls, model: GGUFModel) -> Tokenizer:
        kind = model.value("tokenizer.ggml.model")
        if kind is None:
            raise ModelFileError(f"{model.path.name}: no tokenizer in the GGUF (tokenizer.ggml.model missing)")
        if kind != "gpt2":
            raise UnsupportedModelError(
                f"{model.path.name}: tokenizer type {kind!r} is not supported; Hearth reads byte-level BPE ('gpt2')"
            )
        tokens = model.string_array("tokenizer.ggml.tokens")
        merges = model.string_array("tokenizer.ggml.merges")
        types = model.int_array("tokenizer.ggml.token_type")
        if not tokens:
            raise ModelFileError(f"{model.path.name}: the tokenizer vocabulary is empty")
        if len(types) != len(tokens):
            types = np.ones(len(tokens), dtype=np.int64)

        def token_id(key: str) -> int | None:
            value = model.value(key)
            return int(value) if value is not None and 0 <= int(value) < len(tokens) else None

        bos, eos, eot = (token_id(f"tokenizer.ggml.{k}_token_id") for k in ("bos", "eos", "eot"))
        stop = {i for i in (eos, eot) if i is not None}
        for name in ("<|im_end|>", "<|eot_id|>", "<|end|>", "<end_of_turn>", "<|endoftext|>"):
            if name in tokens:
                stop.add(tokens.index(name))
        specials = SpecialIds(bos, eos, eot, frozenset(stop))
        pre = model.value("tokenizer.ggml.pre", "default") or "default"
        return cls(tokens, merges, types, pre, specials, bool(model.value("tokenizer.ggml.add_bos_token", False)))

    def encode(self, text: str) -> list[int]:
        """Token ids for ``text`` with special-token text recognised and nothing added."""
        # encode_batch releases the GIL while it works (encode does not): a long message tokenized on
        # the engine thread must not freeze the window's thread.
        return self._hf.encode_batch([text], add_special_tokens=False)[0].ids

    def token_bytes(self, token_id: int) -> bytes:
        return self._bytes[token_id]

    def is_special(self, token_id: int) -> bool:
        return token_id in self._special_ids

    def decode(self, ids: list[int], skip_special: bool = True) -> str:
        data = b"".join(self._bytes[i] for i in ids if not (skip_special and i in self._special_ids))
        return data.decode("utf-8", errors="replace")


def _fingerprint(tokens: list[str], merges: list[str], types: np.ndarray, pre: str, specials: SpecialIds,
                 add_bos: bool) -> bytes:
    """SHA-256 over everything that decides which ids a text becomes (checkpoints record it)."""
    h = hashlib.sha256()
    head = [pre, add_bos, specials.bos, specials.eos, specials.eot, sorted(specials.stop)]
    for part in (json.dumps(head), "\0".join(tokens), "\0".join(merges)):
        h.update(part.encode("utf-8"))
        h.update(b"\xff")
    h.update(np.asarray(types, dtype="<i8").tobytes())
    return h.digest()
