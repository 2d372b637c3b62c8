"""Adaptive resume: restore from disk only when that is faster than reading the text again.

Both rates are measured as the engine runs (restore bytes/s including verification, prefill
tokens/s) and kept in ``throughput.json`` next to the checkpoints, as moving averages, so a restart
starts from what this machine did last time: the disk's rate per provider, the prefill rate per
provider and model (a tiny model's prefill says nothing of a larger one's, which shares the store).
With a tiny model on a fast GPU a prefill can beat the disk; on a CPU the disk nearly always wins.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path

from engine.fsutil import atomic_write, read_json

log = logging.getLogger(__name__)
ALPHA = 0.3  # weight of the newest measurement
# Until something is measured: a conservative disk and a prefill rate typical of the provider.
DEFAULTS = {"cpu": (1.0e9, 800.0), "cuda": (1.0e9, 20000.0)}
FIXED_RESTORE_MS = 2.0  # opening, header checks, index work
SAVE_EVERY_S = 30.0  # the figures are a hint: no fsync on every turn
MAX_FILE_BYTES = 1 << 20  # a few figures per provider and model


@dataclass
class Estimate:
    restore_ms: float
    prefill_ms: float

    @property
    def restore_wins(self) -> bool:
        return self.restore_ms <= self.prefill_ms


class Throughput:
    def __init__(self, path: Path, provider: str, model: str = ""):
        """``model``: a name for the model whose prefill is measured ("" keeps it per provider only)."""
        self.path, self.provider = Path(path), provider
        self.model_key = f"{provider}:{model}" if model else provider
        self._saved_at = -SAVE_EVERY_S
        read_bps, prefill_tps = DEFAULTS.get(provider, DEFAULTS["cpu"])
        self.read_bps, self.prefill_tps = read_bps, prefill_tps
        try:
            data = read_json(self.path, MAX_FILE_BYTES)
            self.read_bps = _positive(data.get(provider, {}).get("read_bps"), read_bps)
            self.prefill_tps = _positive(data.get(self.model_key, {}).get("prefill_tps"), prefill_tps)
        except (OSError, ValueError, AttributeError):
            pass

    def estimate(self, restore_bytes: int, prefill_tokens: int) -> Estimate:
        return Estimate(FIXED_RESTORE_MS + restore_bytes / self.read_bps * 1000, prefill_tokens / self.prefill_tps * 1000)

    def flush(self) -> None:
        self._save(force=True)

    def record_restore(self, nbytes: int, ms: float) -> None:
        if nbytes >= 1 << 20 and ms > 0:  # small reads say more about overhead than bandwidth
            self.read_bps = (1 - ALPHA) * self.read_bps + ALPHA * nbytes / (ms / 1000)
            self._save()

    def record_prefill(self, tokens: int, ms: float) -> None:
        if tokens >= 64 and ms > 0:
            self.prefill_tps = (1 - ALPHA) * self.prefill_tps + ALPHA * tokens / (ms / 1000)
            self._save()

    def _save(self, force: bool = False) -> None:
        if not force and time.monotonic() - self._saved_at < SAVE_EVERY_S:
            return
        self._saved_at = time.monotonic()
        try:
            data = read_json(self.path, MAX_FILE_BYTES) if self.path.exists() else {}
            if not isinstance(data, dict):
                data = {}
        except (OSError, ValueError):
            data = {}
        figures_by_key = ((self.provider, {"read_bps": self.read_bps}), (self.model_key, {"prefill_tps": self.prefill_tps}))
        for key, figures in figures_by_key:
            kept = data.get(key)
            data[key] = {**(kept if isinstance(kept, dict) else {}), **figures}
        try:
            with atomic_write(self.path) as fh:
                fh.write(json.dumps(data).encode())
        except OSError as exc:  # only the estimate suffers
            log.debug("cannot save throughput figures: %s", exc)


def _positive(value: object, default: float) -> float:
    return float(value) if isinstance(value, int | float) and value > 0 else default
