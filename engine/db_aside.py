"""Moving a conversation database and its -wal/-shm out of the way, under a name that says why: a restore
and a salvage both keep the file they replace."""

from __future__ import annotations

import os
import time
from pathlib import Path


def set_aside(db: Path, why: str) -> Path:
    """Move ``db`` and its -wal/-shm to ``<name>.<why>-<time>`` (never over an older one: two restores in
    one second must not lose the first file set aside); returns the new name of ``db``."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    aside = db.with_name(f"{db.name}.{why}-{stamp}")
    n = 1
    while any(Path(str(aside) + s).exists() for s in ("", "-wal", "-shm")):
        n += 1
        aside = db.with_name(f"{db.name}.{why}-{stamp}-{n}")
    for suffix in ("", "-wal", "-shm"):
        part = Path(str(db) + suffix)
        if part.exists():
            os.replace(part, Path(str(aside) + suffix))
    return aside
