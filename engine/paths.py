"""Where Hearth keeps things: ``--data-dir`` beats ``HEARTH_HOME`` beats the platform's own dirs."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

from engine.errors import ModelFileError


@dataclass(frozen=True)
class HearthPaths:
    models: Path  # downloaded GGUF files
    converted: Path  # ONNX conversions, keyed by (GGUF hash, converter version, precision)
    data: Path  # conversations (SQLite)
    checkpoints: Path  # KV-cache checkpoints: a cache, rebuilt from the conversations when lost

    @property
    def conversations_db(self) -> Path:
        return self.data / "conversations.sqlite3"

    @property
    def turn_locks(self) -> Path:
        """Per-conversation turn locks (engine/turn_lock.py)."""
        return self.data / "locks"

    def ensure(self) -> HearthPaths:
        """Create the directories, private to this user (engine/private_files.py)."""
        from engine.private_files import private_dir

        for p in (self.data, self.models, self.converted, self.checkpoints):
            private_dir(p)
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


# A packaged build ships the default model, already converted, in a read-only directory laid out like a
# data dir's ``models/`` and ``converted/``. Hearth reads from it and never writes there.
BUNDLED_MODEL_ENV = "HEARTH_BUNDLED_MODEL"
BUNDLED_MODEL_DIRNAME = "model"


def bundled_model_dir() -> Path | None:
    """The read-only model directory shipped with this build, or None when running from source.

    ``$HEARTH_BUNDLED_MODEL`` names it explicitly (a launcher or a test may set it); a frozen
    (PyInstaller) build looks in ``model/`` inside its bundle. A named directory that does not exist
    is an error, not a silent fallback, so a broken install says so.
    """
    named = os.environ.get(BUNDLED_MODEL_ENV)
    if named:
        path = Path(named).expanduser()
        if not path.is_dir():
            raise ModelFileError(f"{BUNDLED_MODEL_ENV}={named} is not a directory; unset it or point it at the "
                                 "bundled model directory")
        return path.resolve()
    bundle = getattr(sys, "_MEIPASS", None) if getattr(sys, "frozen", False) else None
    if bundle:
        path = Path(bundle) / BUNDLED_MODEL_DIRNAME
        if path.is_dir():
            return path
    return None
