"""A download's speed and time left, from (time, bytes) samples over a short window: the Models dialog's
library downloads and its Hugging Face downloads alike."""

from __future__ import annotations

import time

from app.text import byte_size

SPEED_WINDOW_S = 3.0  # the speed shown is the average over the last few seconds


class DownloadMeter:
    """Speed and time left from (time, bytes) samples over a short window."""

    def __init__(self) -> None:
        self.samples: list[tuple[float, int]] = []

    def add(self, done: int, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        self.samples.append((now, done))
        while len(self.samples) > 2 and now - self.samples[0][0] > SPEED_WINDOW_S:
            self.samples.pop(0)

    def speed(self) -> float:
        """Bytes per second, 0 until two samples exist."""
        if len(self.samples) < 2:
            return 0.0
        (t0, b0), (t1, b1) = self.samples[0], self.samples[-1]
        return (b1 - b0) / (t1 - t0) if t1 > t0 else 0.0

    def describe(self, done: int, total: int) -> str:
        speed = self.speed()
        parts = [f"{byte_size(done)} of {byte_size(total)}" if total else byte_size(done)]
        if speed > 0:
            parts.append(f"{byte_size(int(speed))}/s")
            if total > done:
                left = (total - done) / speed
                parts.append(f"about {int(left)} s left" if left < 120 else f"about {int(left // 60)} min left")
        return " · ".join(parts)
