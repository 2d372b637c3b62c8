"""JSON imports on their own thread, so a large file never freezes the window.

Same shape as ``engine_worker``: a QObject living in a QThread, called through a queued signal, results
back as signals, stopping by a ``CancelToken`` the window sets directly. Its own thread (not the engine
thread) so an import neither waits behind a model load nor holds up a turn; its own connection to the
conversation database, whose batches let the window's and the CLI's writes in between.
"""

from __future__ import annotations

import logging
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from PySide6.QtCore import QObject, QThread, Signal, Slot

from engine.api import ConversationStore, import_conversations, import_json, read_bundle
from engine.errors import HearthError
from engine.types import CancelToken

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BundleConversations:
    """A bundle's conversations, stored: what the window needs to ask about and install its contexts."""

    path: str
    conversations: list[dict]
    entries: dict[str, str]  # context entries, by the bundle's conversation id
    ids: list[str]  # the ids they were stored under, in order


class ImportWorker(QObject):
    progress = Signal(int, int)  # conversations stored, total (after each batch)
    finished = Signal(object)  # list[str] of imported ids | HearthError (nothing was imported)
    bundle_finished = Signal(object)  # BundleConversations | HearthError (nothing was imported)

    @Slot(str, str, object)
    def run_bundle(self, database: str, path: str, cancel: CancelToken) -> None:
        """A bundle's conversations: read and validated, then stored in batches as a JSON import is; its
        saved contexts are the engine thread's job afterwards."""

        def work(store: ConversationStore) -> BundleConversations:
            conversations, entries = read_bundle(Path(path))
            ids = import_conversations(store, conversations, progress=self.progress.emit, cancel=cancel)
            return BundleConversations(path, conversations, entries, ids)

        self.bundle_finished.emit(self._attempt(database, path, work))

    @Slot(str, str, object)
    def run(self, database: str, path: str, cancel: CancelToken) -> None:
        self.finished.emit(self._attempt(
            database, path, lambda store: import_json(store, Path(path), progress=self.progress.emit, cancel=cancel)))

    @staticmethod
    def _attempt(database: str, path: str, work: Callable[[ConversationStore], object]) -> object:
        """``work`` on a connection of this thread's own; its result, or the HearthError that says why
        nothing was imported."""
        try:
            store = ConversationStore(Path(database))
            try:
                return work(store)
            finally:
                store.close()
        except HearthError as exc:
            return exc
        except Exception as exc:  # a bug: keep the traceback in the log, give the window a readable line
            log.error("importing %s failed:\n%s", path, traceback.format_exc())
            return HearthError(f"the import failed unexpectedly: {exc}")


class ImportHost(QObject):
    """Owns the import thread; ``start`` queues one import."""

    request = Signal(str, str, object)  # database path, file path, CancelToken
    request_bundle = Signal(str, str, object)  # database path, bundle path, CancelToken

    def __init__(self, parent: QObject | None = None):
        super().__init__(parent)
        self.thread = QThread()
        self.thread.setObjectName("hearth-import")
        self.worker = ImportWorker()
        self.worker.moveToThread(self.thread)
        self.request.connect(self.worker.run)
        self.request_bundle.connect(self.worker.run_bundle)
        self.thread.start()

    def start(self, database: Path, path: str, cancel: CancelToken) -> None:
        self.request.emit(str(database), path, cancel)

    def start_bundle(self, database: Path, path: str, cancel: CancelToken) -> None:
        self.request_bundle.emit(str(database), path, cancel)

    def stop(self, timeout_ms: int = 30000) -> bool:
        """Let a running import finish its rollback (its token is cancelled first), then end the thread."""
        self.thread.quit()
        return self.thread.wait(timeout_ms)
