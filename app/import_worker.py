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

from engine.api import (
    ConversationStore,
    apply_duplicates,
    find_duplicates,
    import_conversations,
    read_bundle,
    read_document,
)
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


@dataclass(frozen=True)
class PendingImport:
    """A read and validated JSON export some of whose conversations are already here: held while the
    person chooses, then stored without reading the file again."""

    path: str
    conversations: list[dict]
    duplicates: list[int]  # indices into ``conversations``
    entries: dict[str, str] | None = None  # a bundle's context entries; None for a JSON export

    @property
    def titles(self) -> list[str]:
        return [self.conversations[i]["title"] or "New chat" for i in self.duplicates]


class ImportWorker(QObject):
    progress = Signal(int, int)  # conversations stored, total (after each batch)
    finished = Signal(object)  # list[str] of imported ids | HearthError (nothing was imported)
    bundle_finished = Signal(object)  # BundleConversations | HearthError (nothing was imported)
    duplicates_found = Signal(object)  # PendingImport: nothing stored yet, the window asks what to do

    @Slot(str, str, object, str)
    def run_bundle(self, database: str, path: str, cancel: CancelToken, duplicates: str) -> None:
        """A bundle's conversations: read and validated, then stored in batches as a JSON import is (those
        already here as ``duplicates`` says, or "" asks first); its saved contexts are the engine
        thread's job afterwards."""

        def work(store: ConversationStore) -> object:
            conversations, entries = read_bundle(Path(path))
            found = find_duplicates(store, conversations)
            if found and not duplicates:
                return PendingImport(path, conversations, found, entries)
            return self._store_bundle(store, PendingImport(path, conversations, found, entries),
                                      duplicates or "copy", cancel)

        result = self._attempt(database, path, work)
        (self.duplicates_found if isinstance(result, PendingImport) else self.bundle_finished).emit(result)

    def _store_bundle(self, store: ConversationStore, pending: PendingImport, duplicates: str,
                      cancel: CancelToken) -> BundleConversations:
        stored = apply_duplicates(pending.conversations, pending.duplicates, duplicates)
        return BundleConversations(pending.path, stored, pending.entries or {}, self._store(store, stored, cancel))

    @Slot(str, str, object, str)
    def run(self, database: str, path: str, cancel: CancelToken, duplicates: str) -> None:
        """Read and validate ``path``; conversations already here are handled by ``duplicates`` ("skip" or
        "copy"), or with "" the window is asked first (``duplicates_found``) and nothing is stored yet."""

        def work(store: ConversationStore) -> object:
            conversations = read_document(Path(path))
            found = find_duplicates(store, conversations)
            if found and not duplicates:
                return PendingImport(path, conversations, found)
            return self._store(store, apply_duplicates(conversations, found, duplicates or "copy"), cancel)

        result = self._attempt(database, path, work)
        (self.duplicates_found if isinstance(result, PendingImport) else self.finished).emit(result)

    @Slot(str, object, str, object)
    def run_pending(self, database: str, pending: PendingImport, duplicates: str, cancel: CancelToken) -> None:
        """Store an import held by ``duplicates_found``, now that the person chose "skip" or "copy"."""
        if pending.entries is not None:
            self.bundle_finished.emit(self._attempt(database, pending.path, lambda store: self._store_bundle(
                store, pending, duplicates, cancel)))
            return
        self.finished.emit(self._attempt(database, pending.path, lambda store: self._store(
            store, apply_duplicates(pending.conversations, pending.duplicates, duplicates), cancel)))

    def _store(self, store: ConversationStore, conversations: list[dict], cancel: CancelToken) -> list[str]:
        return import_conversations(store, conversations, progress=self.progress.emit, cancel=cancel)

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

    request = Signal(str, str, object, str)  # database path, file path, CancelToken, duplicates ("" asks)
    request_pending = Signal(str, object, str, object)  # database path, PendingImport, duplicates, CancelToken
    request_bundle = Signal(str, str, object, str)  # database path, bundle path, CancelToken, duplicates

    def __init__(self, parent: QObject | None = None):
        super().__init__(parent)
        self.thread = QThread()
        self.thread.setObjectName("hearth-import")
        self.worker = ImportWorker()
        self.worker.moveToThread(self.thread)
        self.request.connect(self.worker.run)
        self.request_pending.connect(self.worker.run_pending)
        self.request_bundle.connect(self.worker.run_bundle)
        self.thread.start()

    def start(self, database: Path, path: str, cancel: CancelToken, duplicates: str = "") -> None:
        """Queue a JSON import; ``duplicates`` "skip" or "copy" decides for conversations already here,
        "" asks the window first (``worker.duplicates_found``)."""
        self.request.emit(str(database), path, cancel, duplicates)

    def store_pending(self, database: Path, pending: PendingImport, duplicates: str, cancel: CancelToken) -> None:
        self.request_pending.emit(str(database), pending, duplicates, cancel)

    def start_bundle(self, database: Path, path: str, cancel: CancelToken, duplicates: str = "") -> None:
        self.request_bundle.emit(str(database), path, cancel, duplicates)

    def stop(self, timeout_ms: int = 30000) -> bool:
        """Let a running import finish its rollback (its token is cancelled first), then end the thread."""
        self.thread.quit()
        return self.thread.wait(timeout_ms)
