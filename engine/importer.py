"""Store validated conversations in batches, all or nothing for whoever is looking.

A million conversations in one transaction held SQLite's write lock for minutes (the CLI timed out
meanwhile). Here each batch of ``BATCH_CONVERSATIONS`` is its own short transaction, so other writers
get in between; every row carries the import's id and stays hidden (``conversations.visible``) until
the last batch is in, when one statement shows them all. A failure, an exception in a progress
callback, or Cancel removes everything the import added (in batches too) and says so. Rows of an
import whose process died mid-way stay hidden and are removed by the next import.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from engine.conversations import ConversationStore
from engine.errors import HearthError, ImportCancelledError
from engine.types import CancelToken

log = logging.getLogger(__name__)
BATCH_CONVERSATIONS = 1000


def _plural(n: int) -> str:
    return f"{n:,} conversation{'s' if n != 1 else ''}"


def import_conversations(store: ConversationStore, conversations: list[dict], *,
                         progress: Callable[[int, int], None] | None = None, cancel: CancelToken | None = None,
                         batch: int = BATCH_CONVERSATIONS) -> list[str]:
    """Insert validated conversations (``transfer.validate_document``'s output); return the ids used.

    ``progress(done, total)`` is called before the first batch and after each one commits, outside any
    transaction. ``cancel`` is checked before each batch. Raises HearthError (ImportCancelledError on
    Cancel) after removing whatever was added."""
    total = len(conversations)
    import_id = store.begin_import()
    used: list[str] = []
    try:
        if progress is not None:
            progress(0, total)
        for start in range(0, total, batch):
            if cancel is not None and cancel.cancelled:
                raise ImportCancelledError("the import was cancelled")
            used += store.insert_batch(conversations[start:start + batch], import_id)
            if progress is not None:
                progress(len(used), total)
        if cancel is not None and cancel.cancelled:
            raise ImportCancelledError("the import was cancelled")
        store.finish_import(import_id)
    except BaseException as exc:  # KeyboardInterrupt too: nothing half-imported stays behind
        note = _undo(store, import_id, len(used))
        if isinstance(exc, HearthError):
            exc.args = (f"{exc}; {note}",)  # same type (DiskFullError stays one), fuller message
        raise
    return used


def _undo(store: ConversationStore, import_id: str, added: int) -> str:
    """Remove what the import added; the sentence that tells the user how that went."""
    try:
        removed = store.abort_import(import_id)
    except HearthError as exc:
        log.warning("could not remove the rows of import %s: %s", import_id, exc)
        return (f"the {_plural(added)} it had added stay hidden and will be removed by the next import "
                f"({exc}); nothing was imported")
    return f"the {_plural(removed)} it had added were removed; nothing was imported"
