"""Streaming detokenization: turn token ids into text as they arrive, never splitting a character.

A token can end in the middle of a multi-byte UTF-8 character (emoji are often split over two or
three tokens). The incremental decoder holds incomplete bytes back until the character completes.
"""

from __future__ import annotations

import codecs

from engine.text.tokenizer import Tokenizer


class StreamDecoder:
    """``shown``: special tokens whose text is shown anyway (a tool call's marker that a vocabulary holds as a
    control token, as Llama 3.1's ``<|python_tag|>``: the reply parser must read it)."""

    def __init__(self, tokenizer: Tokenizer, shown: frozenset[int] = frozenset()):
        self._tokenizer = tokenizer
        self._shown = shown
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, token_id: int) -> str:
        """Text completed by this token (possibly empty)."""
        if self._tokenizer.is_special(token_id) and token_id not in self._shown:
            return ""
        return self._decoder.decode(self._tokenizer.token_bytes(token_id))

    def flush(self) -> str:
        """Whatever is held back at the end (a dangling partial character becomes U+FFFD)."""
        return self._decoder.decode(b"", final=True)
