"""The conversation database's file offline, by its path: check it, back it up, restore a backup over it,
salvage it (``hearth-cli db``). The window uses the data-dir forms in engine.api (``database_at_start``,
``restore_database``, ``salvage_database``)."""

from __future__ import annotations

from pathlib import Path

from engine import db_recovery
from engine.db_recovery import DbCheck, SoundDatabaseError
from engine.db_salvage import SalvageResult

__all__ = ["DbCheck", "SoundDatabaseError", "backup_database_file", "check_database_file", "database_file_problem",
           "database_way_out", "restore_database_file", "salvage_database_file"]


def check_database_file(db: Path) -> DbCheck:
    """Whether ``db`` passes its check (the problem when not), and its backups, newest first."""
    return db_recovery.check(db)


def database_file_problem(db: Path) -> str:
    """What is wrong with ``db`` ("" when it is sound)."""
    return db_recovery.problem_with(db)


def database_way_out(db: Path) -> str:
    """The advice for a damaged ``db``: the commands that restore or salvage it."""
    return db_recovery.way_out(db)


def backup_database_file(db: Path, force: bool = False) -> Path | None:
    """Copy ``db`` into its backups (``force``: even when one is not due); None when nothing was copied."""
    return db_recovery.backup(db, force=force)


def restore_database_file(db: Path, source: Path | None = None, force: bool = False) -> tuple[Path, Path | None]:
    """Put ``source`` (default: the newest sound backup) in place of ``db``; (the backup used, where the previous
    file went). SoundDatabaseError over a sound ``db`` unless ``force``."""
    return db_recovery.restore(db, source, force=force)


def salvage_database_file(db: Path) -> SalvageResult:
    """Replace a damaged ``db`` by a database of every row that can still be read, keeping the damaged file aside."""
    return db_recovery.salvage(db)
