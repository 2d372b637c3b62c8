"""Repairing a damaged checkpoint: delete a file nothing in can be trusted (its header, identity or
first record failed), or cut a file damaged further in back to its last good record, keeping the
tier's index in step. Only the record and the index: the caller drops what it remembered of them.
Both go through the record's storage tier (engine/checkpoint/tier.py), so any tier is repaired alike."""

from __future__ import annotations

import logging

from engine.checkpoint.format import CheckpointError, RecordInfo
from engine.checkpoint.store import Entry
from engine.checkpoint.tier import StorageTier

log = logging.getLogger(__name__)


def discard(store: StorageTier, name: str, exc: CheckpointError) -> None:
    """Delete a rejected file and its index entry (a failure to delete is logged: the next try repeats)."""
    log.warning("checkpoint %s rejected (%s): %s; deleting it", name, exc.reason, exc)
    try:
        store.remove(name, f"{exc.reason}: {exc}")
    except OSError as err:
        log.warning("cannot delete %s: %s", name, err)


def cut_back(store: StorageTier, entry: Entry, records: list[RecordInfo], good: int, exc: CheckpointError) -> None:
    """Keep the first ``good`` (≥ 1) records of a file damaged after them, and say so in the index."""
    log.warning("checkpoint %s damaged after token %d (%s): %s; keeping the %d record(s) before it",
                entry.name, records[good - 1].end, exc.reason, exc, good)
    try:
        store.cut(entry.name, records[:good])  # the writer's cut: the same as a save's
        last = records[good - 1]
        entry.tokens, entry.text_len, entry.text_sha, entry.bytes = last.end, last.text_len, last.text_sha, last.end_offset
        store.put(entry)
    except OSError as err:
        log.warning("cannot repair %s: %s", entry.name, err)
