"""Where Hearth keeps things: ``--data-dir`` beats ``HEARTH_HOME`` beats the platform's own dirs."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class HearthPaths:
    models: Path  # downloaded GGUF files
    converted: Path  # ONNX conversions, keyed by (GGUF hash, converter version, precision)
    data: Path  # conversations (SQLite)
    checkpoints: Path  # KV-cache checkpoints: a cache, rebuilt from the conversations when lost

    @property
    def conversations_db(self) -> Path:
        return self.data / "conversations.sqlite3"

    def ensure(self) -> HearthPaths:
        for p in (self.models, self.converted, self.data, self.checkpoints):
            p.mkdir(parents=True, exist_ok=True)
        return self


def resolve_paths(data_dir: str | os.PathLike | None = None) -> HearthPaths:
    root = data_dir or os.environ.get("HEARTH_HOME")
    if root:
        base = Path(root).expanduser().resolve()
        return HearthPaths(base / "models", base / "converted", base, base / "checkpoints")
    import platformdirs

    cache = Path(platformdirs.user_cache_dir("hearth", appauthor=False))
    data = Path(platformdirs.user_data_dir("hearth", appauthor=False))
    return HearthPaths(cache / "models", cache / "converted", data, cache / "checkpoints")
