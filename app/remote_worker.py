"""The remote servers off the UI thread: listing each server's models (a request to each), adding and
removing servers (remotes.json and the secret store).

Every slot answers through signals: ``listed`` with, for each server, its models or why they could not be
listed, in plain words; ``changed`` with what was done and "" or why it failed. An API key travels from
the dialog to the engine's secret store and nowhere else: not into a signal, a log or a message.
"""

from __future__ import annotations

import logging

from PySide6.QtCore import QObject, QThread, Signal, Slot

from app.worker_guard import guarded
from engine.api import HearthPaths, RemoteRegistry, remote_models

log = logging.getLogger(__name__)
LIST_TIMEOUT_S = 5.0


class RemoteWorker(QObject):
    known = Signal(object)  # list[RemoteServer]: the servers added, before their models are asked for
    listed = Signal(object)  # list[(RemoteServer, list[LibraryModel] | str why not)]
    changed = Signal(str, str)  # what ("add NAME", "remove NAME", "list"), "" or why it failed

    def __init__(self, paths: HearthPaths):
        super().__init__()
        self.paths = paths

    def _guard(self, what: str, call) -> str:
        """Run ``call``; "" or why it failed, in words (app/worker_guard.py)."""
        return guarded(what, call)

    @Slot()
    def refresh(self) -> None:
        servers: list = []
        if not self._guard("reading the servers", lambda: servers.extend(RemoteRegistry(self.paths.data).servers())):
            self.known.emit(servers)  # quick: a chat on a server is known as one before a slow server answers
        found: list = []
        problem = self._guard("listing the servers' models",
                              lambda: found.extend(remote_models(self.paths, timeout_s=LIST_TIMEOUT_S)))
        if problem:
            self.changed.emit("list", problem)
        self.listed.emit(found)

    @Slot(str, str, str)
    def add(self, name: str, base_url: str, api_key: str) -> None:
        registry = RemoteRegistry(self.paths.data)
        problem = self._guard("adding the server",
                              lambda: registry.add(name.strip(), base_url.strip(), api_key or None))
        self.changed.emit(f"add {name}", problem)
        if not problem:
            self.refresh()

    @Slot(str)
    def remove(self, name: str) -> None:
        registry = RemoteRegistry(self.paths.data)
        problem = self._guard("removing the server", lambda: registry.remove(name))
        self.changed.emit(f"remove {name}", problem)
        self.refresh()


class RemoteHost(QObject):
    """Owns the remote worker's thread and the queued signals that call it."""

    request_refresh = Signal()
    request_add = Signal(str, str, str)  # name, base URL, API key ("" for none)
    request_remove = Signal(str)

    def __init__(self, paths: HearthPaths, parent: QObject | None = None):
        super().__init__(parent)
        self.thread = QThread()
        self.thread.setObjectName("hearth-remotes")
        self.worker = RemoteWorker(paths)
        self.worker.moveToThread(self.thread)
        self.request_refresh.connect(self.worker.refresh)
        self.request_add.connect(self.worker.add)
        self.request_remove.connect(self.worker.remove)
        self.thread.start()

    def stop(self, timeout_ms: int = 10000) -> bool:
        self.thread.quit()
        return self.thread.wait(timeout_ms)
