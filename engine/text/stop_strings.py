"""Stop strings: the reply ends just before the first occurrence of any of them.

Streamed text must never show part of a stop string that then completes, so text that could be the
start of one is held back until the next piece proves it is not (or the reply ends).
"""

from __future__ import annotations

from collections.abc import Sequence

from engine.errors import PromptError

MAX_STOP_STRINGS = 16  # OpenAI allows 4; llama.cpp's server more: 16 covers agents' turn markers
MAX_STOP_LENGTH = 512  # characters; a longer "stop string" is a mistake, not a marker


def check_stop_strings(stop: Sequence[str]) -> tuple[str, ...]:
    """``stop`` as a tuple, or a PromptError saying what is wrong with it."""
    if isinstance(stop, str):  # one string is a common slip for a list of one
        stop = (stop,)
    stop = tuple(stop)
    if len(stop) > MAX_STOP_STRINGS:
        raise PromptError(f"at most {MAX_STOP_STRINGS} stop strings are allowed, got {len(stop)}")
    for s in stop:
        if not isinstance(s, str):
            raise PromptError(f"a stop string must be text, got {type(s).__name__}")
        if not s:
            raise PromptError("a stop string must not be empty")
        if len(s) > MAX_STOP_LENGTH:
            raise PromptError(f"a stop string may be at most {MAX_STOP_LENGTH} characters, got one of {len(s)}")
    return stop


class StopStringFilter:
    """Fed the reply's text piece by piece; gives back what may be shown, and says when a stop string came."""

    def __init__(self, stop: Sequence[str]):
        self.stop = check_stop_strings(stop)
        self._held = ""
        self.stopped = False
        self.matched: str | None = None  # the stop string that ended the text, once ``stopped``

    def push(self, piece: str) -> str:
        """Text that is safe to show now. After a stop string, ``stopped`` is True and nothing more comes."""
        if self.stopped:
            return ""
        text = self._held + piece
        if not self.stop:
            return text
        first = self._first_hit(text)
        # A stop string that begins before the first complete one and runs off the end may still complete
        # (text "<<b" with stops "b" and "<b<": "<b" can become "<b<", which would stop at 1, not 2): hold
        # from where it begins, and decide when more text comes.
        start = len(text) - self._partial_tail(text)
        if start < len(text) and (first is None or start < first):
            self._held = text[start:]
            return text[:start]
        self._held = ""
        if first is not None:
            self._stop_at(text, first)
            return text[:first]
        return text

    def _stop_at(self, text: str, at: int) -> None:
        self.stopped = True
        self.matched = max((s for s in self.stop if text.startswith(s, at)), key=len)

    def flush(self) -> str:
        """The held-back text, when the reply ended without completing a stop string (or up to the one
        it completed, when a longer one it was waiting on never came)."""
        text, self._held = ("" if self.stopped else self._held), ""
        first = self._first_hit(text)
        if first is not None:
            self._stop_at(text, first)
            return text[:first]
        return text

    def _first_hit(self, text: str) -> int | None:
        """Where the earliest complete stop string in ``text`` begins, or None."""
        hits = [i for i in (text.find(s) for s in self.stop) if i >= 0]
        return min(hits) if hits else None

    def _partial_tail(self, text: str) -> int:
        """The length of the longest end of ``text`` that is the start of some stop string."""
        best = 0
        for s in self.stop:
            for n in range(min(len(s) - 1, len(text)), best, -1):
                if text.endswith(s[:n]):
                    best = n
                    break
        return best
