"""The models a checkpoint store holds saved context for, in words, and which of them are gone.

``models.json`` maps a model fingerprint (hex) to ``{"label", "gguf", "last_used_ms"}``. A model's
sessions note it when they start, so the store can say whose files it holds (``kv ls``) and tell the
files of a model whose GGUF no longer exists, which eviction removes first: no one can use them again.
Like every file in the store it is untrusted: an unreadable or malformed file reads as empty and a
malformed entry is skipped, so the worst a bad file costs is eviction order.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from engine.fsutil import atomic_write, read_json

log = logging.getLogger(__name__)
MAX_FILE_BYTES = 1 << 20
MAX_MODELS = 256  # the least recently used are forgotten past this (their files then just count as unknown)
MAX_TEXT = 4096
REFRESH_MS = 3600 * 1000  # last_used_ms is for ordering: rewriting it more often than hourly buys nothing


@dataclass(frozen=True)
class KnownModel:
    label: str
    gguf: str | None  # None: the engine was built without a GGUF (its files are never called gone)
    last_used_ms: int

    @property
    def gone(self) -> bool:
        """Its GGUF no longer exists, so nothing here can load that model again."""
        return self.gguf is not None and not Path(self.gguf).exists()


def _entry(value: object) -> KnownModel | None:
    if not isinstance(value, dict):
        return None
    label, gguf, used = value.get("label"), value.get("gguf"), value.get("last_used_ms")
    if not isinstance(label, str) or len(label) > MAX_TEXT:
        return None
    if gguf is not None and (not isinstance(gguf, str) or not gguf or len(gguf) > MAX_TEXT or "\0" in gguf):
        return None
    if not isinstance(used, int) or isinstance(used, bool) or used < 0:
        return None
    return KnownModel(label, gguf, used)


class ModelRegistry:
    def __init__(self, path: Path):
        self.path = Path(path)

    def read(self) -> dict[str, KnownModel]:
        """Fingerprint (hex) → what is known of the model; empty when the file is missing or unusable."""
        try:
            raw = read_json(self.path, MAX_FILE_BYTES)
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            log.warning("cannot read %s (%s); the store's models are unknown until one is used", self.path, exc)
            return {}
        if not isinstance(raw, dict):
            return {}
        known = {}
        for key, value in raw.items():
            entry = _entry(value)
            if entry is not None and isinstance(key, str) and len(key) == 64 and _is_hex(key):
                known[key] = entry
        return known

    def note(self, model_fp: bytes, label: str, gguf: Path | None) -> None:
        """Record that this model is in use now (the caller holds the store lock). Raises OSError."""
        known = self.read()
        now = int(time.time() * 1000)
        entry = KnownModel(label, None if gguf is None else str(Path(gguf).resolve()), now)
        old = known.get(model_fp.hex())
        if old is not None and (old.label, old.gguf) == (entry.label, entry.gguf) and now - old.last_used_ms < REFRESH_MS:
            return  # nothing new to say: no write (every session start would otherwise fsync the file)
        known[model_fp.hex()] = entry
        newest = sorted(known.items(), key=lambda kv: -kv[1].last_used_ms)[:MAX_MODELS]
        with atomic_write(self.path) as fh:
            fh.write(json.dumps({k: asdict(v) for k, v in newest}, ensure_ascii=False).encode("utf-8"))

    def gone(self) -> set[bytes]:
        """Fingerprints of the models whose GGUF no longer exists."""
        return {bytes.fromhex(k) for k, m in self.read().items() if m.gone}


def _is_hex(text: str) -> bool:
    try:
        bytes.fromhex(text)
    except ValueError:
        return False
    return True
