"""Stop strings over a stream of text pieces, for engines that cannot stop on strings themselves.

Text that could be the start of a stop string is held back until it is known not to be one, so a
streaming client never sees any part of the stop string.
"""

from __future__ import annotations


class StopScanner:
    def __init__(self, stops: tuple[str, ...]):
        self.stops = tuple(s for s in stops if s)
        self.stopped = False
        self._held = ""
        self.emitted = ""  # everything released so far: the reply's text

    def feed(self, piece: str) -> str:
        """The part of the text so far that is safe to show; sets ``stopped`` at a stop string."""
        if self.stopped:
            return ""
        text = self._held + piece
        cut = min((i for i in (text.find(s) for s in self.stops) if i >= 0), default=-1)
        if cut >= 0:
            self.stopped, self._held = True, ""
            return self._release(text[:cut])
        keep = max((k for s in self.stops for k in range(1, min(len(s), len(text) + 1))
                    if text.endswith(s[:k])), default=0)
        self._held = text[len(text) - keep:] if keep else ""
        return self._release(text[:len(text) - keep])

    def flush(self) -> str:
        """The end of the reply: what was held back is not a stop string after all."""
        held, self._held = self._held, ""
        return "" if self.stopped else self._release(held)

    def _release(self, text: str) -> str:
        self.emitted += text
        return text
