"""Constrained decoding: ``response_format`` (any JSON object, or JSON valid against a schema) as a mask
on the logits at every step, through llguidance (the library llama.cpp and vLLM use).

llguidance works on the vocabulary as byte strings, so it sees exactly the bytes Hearth's tokenizer
decodes; control tokens are marked with a leading 0xFF byte (llguidance's convention) so no grammar
ever produces them. Building its tokenizer walks the whole vocabulary, so it is built once per
tokenizer and kept (``lltokenizer_for``).
"""

from __future__ import annotations

import json
import logging
import threading
import time
import weakref
from collections.abc import Iterable, Mapping

import numpy as np

from engine.errors import PromptError
from engine.text.tokenizer import Tokenizer
from engine.types import ResponseFormat, ResponseFormatKind

log = logging.getLogger(__name__)

MAX_SCHEMA_BYTES = 256 * 1024  # a schema is request input: bound what the grammar compiler is given
_SPECIAL_MARK = b"\xff"

_cache: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # Tokenizer → {eos ids: LLTokenizer}
_cache_lock = threading.Lock()


class ConstraintError(PromptError):
    """A response format that cannot be used: an invalid JSON schema, or one the grammar compiler refuses."""


class _Vocabulary:
    """What llguidance's ``TokenizerWrapper`` reads from a tokenizer: byte strings per id, EOS, and an encoder."""

    def __init__(self, tokenizer: Tokenizer, eos: int):
        self._tokenizer = tokenizer
        self.eos_token_id = eos
        self.bos_token_id = tokenizer.specials.bos
        self.tokens = [_SPECIAL_MARK + tokenizer.token_bytes(i) if tokenizer.is_special(i) else tokenizer.token_bytes(i)
                       for i in range(tokenizer.vocab_size)]
        self.special_token_ids = [i for i in range(tokenizer.vocab_size) if tokenizer.is_special(i)]

    def __call__(self, text: str) -> list[int]:
        if not isinstance(text, str):  # the wrapper probes with bytes: say we take text only
            raise TypeError("text only")
        return self._tokenizer.encode(text)


def lltokenizer_for(tokenizer: Tokenizer, eos_ids: Iterable[int]):
    """llguidance's tokenizer for ``tokenizer`` with ``eos_ids`` ending the reply, built once and kept."""
    import llguidance

    eos = tuple(sorted(eos_ids))
    if not eos:
        raise ConstraintError("this model has no end-of-text token, so a constrained reply could not end")
    with _cache_lock:
        per_tokenizer = _cache.setdefault(tokenizer, {})
        built = per_tokenizer.get(eos)
        if built is None:
            start = time.perf_counter()
            wrapper = llguidance.TokenizerWrapper(_Vocabulary(tokenizer, eos[0]))
            built = llguidance.LLTokenizer(wrapper, n_vocab=tokenizer.vocab_size, eos_token=list(eos))
            log.info("llguidance tokenizer for %d tokens built in %.0f ms", tokenizer.vocab_size,
                     (time.perf_counter() - start) * 1000)
            per_tokenizer[eos] = built
    return built


def grammar_for(fmt: ResponseFormat) -> str | None:
    """The llguidance grammar for ``fmt``; None for plain text. Raises ConstraintError for a bad schema."""
    import llguidance

    kind = ResponseFormatKind(fmt.kind)
    if kind == ResponseFormatKind.TEXT:
        return None
    if kind == ResponseFormatKind.JSON_OBJECT:
        schema: Mapping = {"type": "object"}
    else:
        if fmt.schema is None:
            raise ConstraintError("response_format json_schema needs a schema")
        if not isinstance(fmt.schema, Mapping):
            raise ConstraintError(f"the JSON schema must be an object, got {type(fmt.schema).__name__}")
        schema = fmt.schema
    try:
        text = json.dumps(schema, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ConstraintError(f"the JSON schema is not valid JSON: {exc}") from None
    if len(text) > MAX_SCHEMA_BYTES:
        raise ConstraintError(f"the JSON schema is {len(text)} bytes; at most {MAX_SCHEMA_BYTES} are accepted")
    try:
        # Compact JSON: no free whitespace, so a small model cannot wander into endless blank lines.
        grammar = llguidance.LLMatcher.grammar_from_json_schema(text, defaults={"whitespace_flexible": False})
    except ValueError as exc:
        raise ConstraintError(f"the JSON schema cannot be used: {exc}") from None
    is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar)
    if is_error:
        name = f" {fmt.name!r}" if fmt.name else ""
        raise ConstraintError(f"the JSON schema{name} cannot be used: {_first_line(messages)}")
    return grammar


class Constraint:
    """One reply's constraint: which tokens may come next, fed each token as it is chosen."""

    def __init__(self, tokenizer: Tokenizer, grammar: str, eos_ids: Iterable[int]):
        import llguidance

        self.vocab_size = tokenizer.vocab_size
        self._matcher = llguidance.LLMatcher(lltokenizer_for(tokenizer, eos_ids), grammar, log_level=0)
        if self._matcher.is_error():
            raise ConstraintError(f"the response format cannot be used: {_first_line([self._matcher.get_error()])}")
        self._bitmask = np.zeros((1, (self.vocab_size + 31) // 32), dtype=np.int32)
        self._bits = np.arange(32, dtype=np.uint32)

    @classmethod
    def for_format(cls, fmt: ResponseFormat | None, tokenizer: Tokenizer, eos_ids: Iterable[int]) -> Constraint | None:
        """The constraint ``fmt`` asks for, or None when it asks for plain text."""
        if fmt is None:
            return None
        grammar = grammar_for(fmt)
        return None if grammar is None else cls(tokenizer, grammar, eos_ids)

    def allowed(self) -> np.ndarray:
        """A boolean mask over the vocabulary: True where the token may come next."""
        from llguidance.numpy import fill_next_token_bitmask

        fill_next_token_bitmask(self._matcher, self._bitmask)
        words = self._bitmask[0].view(np.uint32)
        bits = (words[:, None] >> self._bits) & 1
        return bits.reshape(-1)[: self.vocab_size].astype(bool)

    def mask(self, logits: np.ndarray) -> np.ndarray:
        """``logits`` with every forbidden token at minus infinity."""
        from engine.sampling import apply_mask

        return apply_mask(np.asarray(logits, dtype=np.float32), self.allowed())

    def advance(self, token: int) -> None:
        """Feed the chosen token; a token the mask forbade is a bug, reported as such."""
        if not self._matcher.consume_token(int(token)):
            raise RuntimeError(f"the constraint refused token {token}: {self._matcher.get_error()}")

    @property
    def done(self) -> bool:
        """The grammar is complete and allows nothing more but the end of the reply."""
        return self._matcher.is_stopped()

    @property
    def accepting(self) -> bool:
        """What was produced so far is complete (the reply may end here)."""
        return self._matcher.is_accepting()


def _first_line(messages: Iterable[str]) -> str:
    text = next((m for m in messages if m), "unknown error").strip()
    return text.splitlines()[0][:300] if text else "unknown error"
