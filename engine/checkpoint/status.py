"""A checkpoint's standing for the browser and ``kv verify``: valid, stale (another model or
tokenizer: it will be rebuilt) or damaged, from a quick header-and-records check or a full one."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from engine.checkpoint.chain import open_saved
from engine.checkpoint.format import CheckpointError, Identity, Reason
from engine.checkpoint.reader import CheckpointReader
from engine.checkpoint.tier import StorageTier

STALE_REASONS = {Reason.MODEL_MISMATCH, Reason.TOKENIZER_MISMATCH}
VALID, STALE, DAMAGED, NONE = "valid", "stale", "damaged", "none"


def checkpoint_status(path: Path | Callable[[], CheckpointReader], identity: Identity | None,
                      vocab_size: int | None = None, full: bool = False) -> tuple[str, CheckpointError | None, int]:
    """(status, the problem if any, tokens usable). Quick: header, identity and record headers only;
    full: every checksum too. Without an identity only the file's own integrity is judged. ``path``: a
    checkpoint file, or an opener of a tier's record (``record_status``)."""
    tokens = 0
    try:
        with (path() if callable(path) else open_saved(path)) as reader:
            reader.read_header()
            if identity is not None:
                reader.check_identity(identity)
            if full:
                records, problem = reader.verify_all(vocab_size or (1 << 32) - 1)
            else:
                records, problem = reader.scan()
            tokens = records[-1].end if records else 0
    except CheckpointError as exc:
        problem = exc
    if problem is None:
        return VALID, None, tokens
    return (STALE if problem.reason in STALE_REASONS else DAMAGED), problem, tokens


def record_status(tier: StorageTier, name: str, identity: Identity | None, vocab_size: int | None = None,
                  full: bool = False) -> tuple[str, CheckpointError | None, int]:
    """``checkpoint_status`` of a record of ``tier``, opened (and so verified) by the tier's reader."""
    return checkpoint_status(lambda: tier.open(name), identity, vocab_size, full)
