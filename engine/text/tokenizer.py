"""The tokenizer a GGUF carries, rebuilt as a Hugging Face ``tokenizers`` BPE.

Two vocabulary types: byte-level BPE (``tokenizer.ggml.model = "gpt2"``: SmolLM2, Llama 3, Qwen2;
engine/text/byte_level.py) and SentencePiece (``"llama"``: Gemma, Mistral, Llama 2;
engine/text/sentencepiece.py). Control and user-defined tokens are matched in text first, so
``<|im_start|>`` in rendered chat text maps to its single id. Decoding goes through a per-token byte
table so streamed text is built from bytes; control tokens are not shown unless asked for.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from engine.errors import HearthError, ModelFileError, UnsupportedModelError
from engine.model.gguf_file import GGUFModel
from engine.text import byte_level, sentencepiece
from engine.text.sentencepiece import BYTE, CONTROL, NORMAL, UNKNOWN, UNUSED, USER_DEFINED

# Turn-end markers of the chat formats Hearth knows: generation stops on them when the vocabulary has them.
TURN_END_TOKENS = ("<|im_end|>", "<|eot_id|>", "<|end|>", "<end_of_turn>", "<|endoftext|>")
_HIDDEN = (CONTROL, UNKNOWN, UNUSED)  # never part of shown text


@dataclass(frozen=True)
class SpecialIds:
    bos: int | None
    eos: int | None
    eot: int | None
    stop: frozenset[int]  # every id that ends an assistant turn


class Tokenizer:
    def __init__(self, hf, tokens: list[str], types: np.ndarray, specials: SpecialIds, add_bos: bool,
                 raw: list[bytes], fingerprint: bytes, kind: str = "gpt2", add_space_prefix: bool = False):
        from tokenizers import AddedToken

        kinds = types.tolist()
        pairs = list(zip(tokens, kinds, strict=True))
        hf.add_special_tokens([t for t, k in pairs if k == CONTROL])
        hf.add_tokens([AddedToken(t, normalized=False, special=False) for t, k in pairs if k == USER_DEFINED])
        self._hf = hf
        self.kind = kind  # "gpt2" (byte-level BPE) or "llama" (SentencePiece)
        self.fingerprint = fingerprint
        self.vocab_size = len(tokens)
        self.tokens = tokens
        self.types = types
        self.specials = specials
        self.add_bos = add_bos
        self.add_space_prefix = add_space_prefix
        self._special_ids = {i for i, k in enumerate(kinds) if k in _HIDDEN}
        self._bytes = raw
        self.byte_lengths = np.array([len(b) for b in raw], dtype=np.int64)  # for fast text offsets

    # building -----------------------------------------------------------------------------------
    @classmethod
    def byte_level(cls, tokens: list[str], merges: list[str], types: np.ndarray, pre: str, specials: SpecialIds,
                   add_bos: bool) -> Tokenizer:
        hf = byte_level.build(tokens, merges, pre)
        raw = []
        for tok, kind in zip(tokens, types.tolist(), strict=True):
            data = byte_level.token_text_to_bytes(tok) if kind not in (CONTROL, USER_DEFINED) else None
            raw.append(data if data is not None else tok.encode("utf-8"))
        head = [pre, add_bos, specials.bos, specials.eos, specials.eot, sorted(specials.stop)]
        return cls(hf, tokens, types, specials, add_bos, raw, _fingerprint(head, tokens, merges, types))

    @classmethod
    def sentencepiece(cls, tokens: list[str], types: np.ndarray, scores: np.ndarray, specials: SpecialIds,
                      add_bos: bool, add_space_prefix: bool, unk: int | None = None) -> Tokenizer:
        hf = sentencepiece.build(tokens, types, scores, unk, add_space_prefix)
        raw = [sentencepiece.piece_bytes(t, k) if k in (NORMAL, BYTE) else t.encode("utf-8")
               for t, k in zip(tokens, types.tolist(), strict=True)]
        head = ["llama", add_space_prefix, add_bos, specials.bos, specials.eos, specials.eot, sorted(specials.stop)]
        fp = _fingerprint(head, tokens, [], types, np.asarray(scores, dtype="<f4").tobytes())
        return cls(hf, tokens, types, specials, add_bos, raw, fp, "llama", add_space_prefix)

    @classmethod
    def from_gguf(cls, model: GGUFModel) -> Tokenizer:
        kind = model.value("tokenizer.ggml.model")
        if kind is None:
            raise ModelFileError(f"{model.path.name}: no tokenizer in the GGUF (tokenizer.ggml.model missing)")
        if kind not in ("gpt2", "llama"):
            raise UnsupportedModelError(
                f"{model.path.name}: tokenizer type {kind!r} is not supported; Hearth reads byte-level BPE ('gpt2') "
                "and SentencePiece ('llama')"
            )
        tokens = model.string_array("tokenizer.ggml.tokens")
        types = model.int_array("tokenizer.ggml.token_type")
        if not tokens:
            raise ModelFileError(f"{model.path.name}: the tokenizer vocabulary is empty")
        if len(types) != len(tokens):
            types = np.ones(len(tokens), dtype=np.int64)
        if model.has_tensor("token_embd.weight"):  # every id the model can emit needs a token
            rows = int(model.tensor("token_embd.weight").shape[-1])
            if rows != len(tokens):
                raise ModelFileError(f"{model.path.name}: the tokenizer vocabulary holds {len(tokens):,} tokens but "
                                     f"the model's embedding table has {rows:,} rows (the file is damaged)")

        def token_id(key: str) -> int | None:
            value = model.value(key)
            return int(value) if value is not None and 0 <= int(value) < len(tokens) else None

        specials = special_ids(tokens, *(token_id(f"tokenizer.ggml.{k}_token_id") for k in ("bos", "eos", "eot")))
        add_bos = bool(model.value("tokenizer.ggml.add_bos_token", kind == "llama"))
        if kind == "gpt2":
            merges = model.string_array("tokenizer.ggml.merges")
            pre = model.value("tokenizer.ggml.pre", "default") or "default"
            _check_merges(model.path.name, tokens, merges)
            return _built(model.path.name, lambda: cls.byte_level(tokens, merges, types, pre, specials, add_bos))
        scores = np.asarray(model.value("tokenizer.ggml.scores", []), dtype=np.float32)
        if len(scores) != len(tokens):
            raise ModelFileError(f"{model.path.name}: a SentencePiece vocabulary needs a score per token "
                                 f"({len(scores)} scores for {len(tokens)} tokens)")
        return _built(model.path.name, lambda: cls.sentencepiece(
            tokens, types, scores, specials, add_bos, bool(model.value("tokenizer.ggml.add_space_prefix", True)),
            token_id("tokenizer.ggml.unknown_token_id")))

    # use ----------------------------------------------------------------------------------------
    def encode(self, text: str) -> list[int]:
        """Token ids for ``text`` with special-token text recognised and nothing added."""
        # encode_batch releases the GIL while it works (encode does not): a long message tokenized on
        # the engine thread must not freeze the window's thread.
        return self._hf.encode_batch([text], add_special_tokens=False)[0].ids

    def token_id(self, text: str) -> int | None:
        """The id of the token spelled exactly ``text``, or None."""
        return self._hf.token_to_id(text)

    def token_bytes(self, token_id: int) -> bytes:
        return self._bytes[token_id]

    def is_special(self, token_id: int) -> bool:
        return token_id in self._special_ids

    def decode(self, ids: list[int], skip_special: bool = True) -> str:
        shown = [i for i in ids if not (skip_special and i in self._special_ids)]
        data = b"".join(self._bytes[i] for i in shown)
        if self.add_space_prefix and shown and self.types[shown[0]] == NORMAL and data.startswith(b" "):
            data = data[1:]  # the space the tokenizer put in front of the text
        return data.decode("utf-8", errors="replace")


def special_ids(tokens: list[str], bos: int | None, eos: int | None, eot: int | None) -> SpecialIds:
    """BOS/EOS/EOT as the GGUF names them; generation stops at EOS, EOT and any known turn end."""
    stop = {i for i in (eos, eot) if i is not None}
    for name in TURN_END_TOKENS:
        if name in tokens:
            stop.add(tokens.index(name))
    return SpecialIds(bos, eos, eot, frozenset(stop))


def _fingerprint(head: list, tokens: list[str], merges: list[str], types: np.ndarray, extra: bytes = b"") -> bytes:
    """SHA-256 over everything that decides which ids a text becomes (checkpoints record it)."""
    h = hashlib.sha256()
    for part in (json.dumps(head), "\0".join(tokens), "\0".join(merges)):
        h.update(part.encode("utf-8"))
        h.update(b"\xff")
    h.update(np.asarray(types, dtype="<i8").tobytes())
    h.update(extra)
    return h.digest()


def _check_merges(name: str, tokens: list[str], merges: list[str]) -> None:
    """Each merge must join two tokens of the vocabulary into a third: a vocabulary cut to 100 tokens
    left merges naming the rest, which the tokenizers library refused as ``Exception: Error while
    initializing BPE``."""
    vocab = set(tokens)
    for i, merge in enumerate(merges):
        left, _, right = merge.partition(" ")
        if right and not (left in vocab and right in vocab and left + right in vocab):
            raise ModelFileError(f"{name}: tokenizer merge {i} ({merge!r}) names a token that is not in its "
                                 f"vocabulary of {len(tokens):,} (the file is damaged)")


def _built(name: str, build: Callable[[], Tokenizer]) -> Tokenizer:
    """The tokenizer, or a ModelFileError naming the file for whatever else the tokenizers library refuses."""
    try:
        return build()
    except HearthError:
        raise
    except Exception as exc:  # noqa: BLE001 (the library raises bare Exception)
        raise ModelFileError(f"{name}: its tokenizer vocabulary cannot be used: {' '.join(str(exc).split())[:200]}") from None
