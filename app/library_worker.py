"""The model library off the UI thread: listing (reads GGUF headers), downloads, adding and removing files.

Downloads run here, not on the engine thread, so chats keep answering while a model downloads. Every
slot reports back through signals carrying the API's types; a failure is a plain message, never a
traceback on a thread.
"""

from __future__ import annotations

import logging
import traceback

from PySide6.QtCore import QObject, QThread, Signal, Slot

from app.text import shown_model
from engine.api import HearthPaths, ModelLibrary
from engine.errors import HearthError
from engine.types import CancelToken

log = logging.getLogger(__name__)


class LibraryWorker(QObject):
    listed = Signal(object)  # list[LibraryModel]
    download_progress = Signal(str, object, object)  # name, bytes done, bytes total (0: unknown)
    download_done = Signal(str, str)  # name, "" when it worked, else why not in plain words
    changed = Signal(str, str)  # what was done ("added NAME", "removed NAME"), "" or why it failed
    added = Signal(object)  # LibraryModel of a file just added

    def __init__(self, paths: HearthPaths):
        super().__init__()
        self.paths = paths
        self._library: ModelLibrary | None = None

    @property
    def library(self) -> ModelLibrary:
        if self._library is None:
            self._library = ModelLibrary(self.paths)
        return self._library

    def _guard(self, what: str, call) -> str:
        """Run ``call``; return "" or the reason it failed, in words."""
        try:
            call()
            return ""
        except HearthError as exc:
            return str(exc)
        except OSError as exc:
            return f"{what} failed: {exc.strerror or exc}"
        except Exception as exc:  # a bug: keep the traceback in the log, tell the user plainly
            log.error("%s failed:\n%s", what, traceback.format_exc())
            return f"{what} failed unexpectedly: {exc}"

    @Slot()
    def refresh(self) -> None:
        models: list = []
        problem = self._guard("listing the models", lambda: models.extend(self.library.models()))
        if problem:
            self.changed.emit("list", problem)
        self.listed.emit([shown_model(m) for m in models])  # every window list and dialog names them from here

    @Slot(str, object)
    def download(self, name: str, cancel: CancelToken) -> None:
        def report(done: int, total: int) -> None:
            self.download_progress.emit(name, done, total)

        problem = self._guard("the download", lambda: self.library.fetch(name, progress=report, cancel=cancel))
        self.download_done.emit(name, problem)
        self.refresh()

    @Slot(str)
    def add(self, path: str) -> None:
        box: list = []
        problem = self._guard("adding the model file", lambda: box.append(self.library.add(path)))
        self.changed.emit(f"added {path}", problem)
        if box:
            self.added.emit(shown_model(box[0]))
        self.refresh()

    @Slot(str)
    def remove(self, name: str) -> None:
        self.changed.emit(f"removed {name}", self._guard("removing the model", lambda: self.library.remove(name)))
        self.refresh()

    @Slot(str)
    def use(self, name: str) -> None:
        """New chats use this model from now on (remembered across runs)."""
        problem = self._guard("choosing the model", lambda: self.library.use(name))
        if problem:
            self.changed.emit(f"use {name}", problem)


class LibraryHost(QObject):
    """Owns the library worker's thread and the queued signals that call it."""

    request_refresh = Signal()
    request_download = Signal(str, object)  # name, CancelToken
    request_add = Signal(str)
    request_remove = Signal(str)
    request_use = Signal(str)

    def __init__(self, paths: HearthPaths, parent: QObject | None = None):
        super().__init__(parent)
        self.thread = QThread()
        self.thread.setObjectName("hearth-library")
        self.worker = LibraryWorker(paths)
        self.worker.moveToThread(self.thread)
        w = self.worker
        for request, slot in ((self.request_refresh, w.refresh), (self.request_download, w.download),
                              (self.request_add, w.add), (self.request_remove, w.remove), (self.request_use, w.use)):
            request.connect(slot)
        self.thread.start()
        self._cancels: dict[str, CancelToken] = {}

    def download(self, name: str) -> None:
        token = self._cancels[name] = CancelToken()
        self.request_download.emit(name, token)

    def cancel_download(self, name: str) -> None:
        token = self._cancels.pop(name, None)
        if token is not None:
            token.cancel()

    def stop(self, timeout_ms: int = 10000) -> bool:
        for token in self._cancels.values():
            token.cancel()
        self.thread.quit()
        return self.thread.wait(timeout_ms)
