"""The Hugging Face Hub off the UI thread: searching GGUF repositories, listing a repository's GGUF files,
downloading one into the library (resumable, cancellable), and the access token for gated repositories.

Every answer is a signal. A failure is one plain sentence; without the network it says so and adds that
everything on this computer keeps working. The token goes to the engine's secret store, never to a
signal, a log or a message.
"""

from __future__ import annotations

import logging
import traceback

from PySide6.QtCore import QObject, QThread, Signal, Slot

from app.text import sentence, shown_model
from engine.api import HearthPaths, HubClient, HubGatedError, HubNotFoundError, HubOfflineError
from engine.errors import DownloadCancelledError, HearthError
from engine.types import CancelToken

log = logging.getLogger(__name__)
OFFLINE = "The Hugging Face Hub cannot be reached (no network?). Models on this computer keep working."


def hub_problem(what: str, exc: BaseException) -> tuple[str, str]:
    """(kind, message) for a failed hub call: kind is "offline", "gated", "missing", "cancelled" or "error"."""
    if isinstance(exc, HubOfflineError):
        return "offline", OFFLINE
    if isinstance(exc, HubGatedError):
        return "gated", (f"{sentence(str(exc))} Paste an access token from huggingface.co/settings/tokens below, after "
                         "accepting the model's terms on its page.")
    if isinstance(exc, HubNotFoundError):
        return "missing", sentence(str(exc))
    if isinstance(exc, DownloadCancelledError):
        return "cancelled", "The download was cancelled. Download again to resume where it stopped."
    if isinstance(exc, HearthError):
        return "error", sentence(str(exc))
    if isinstance(exc, OSError):
        return "error", f"{what} failed: {exc.strerror or exc}"
    log.error("%s failed:\n%s", what, traceback.format_exc())
    return "error", f"{what} failed unexpectedly: {type(exc).__name__}"


class HubWorker(QObject):
    found = Signal(str, object)  # query, list[HubRepo]
    files_listed = Signal(str, object)  # repo, list[HubFile]
    progress = Signal(object)  # HubProgress
    installed = Signal(object)  # LibraryModel
    failed = Signal(str, str, str)  # what ("search", "files", "download", "token"), kind, message
    token_state = Signal(bool)  # whether a token is kept

    def __init__(self, paths: HearthPaths, endpoint: str | None = None):
        super().__init__()
        self.paths = paths
        self.endpoint = endpoint
        self._client: HubClient | None = None

    @property
    def client(self) -> HubClient:
        if self._client is None:
            self._client = HubClient(self.paths, endpoint=self.endpoint)
        return self._client

    def _run(self, what: str, label: str, call):
        try:
            return call()
        except Exception as exc:
            kind, message = hub_problem(label, exc)
            self.failed.emit(what, kind, message)
            return None

    @Slot(str)
    def search(self, query: str) -> None:
        repos = self._run("search", "searching the Hub", lambda: self.client.search(query))
        if repos is not None:
            self.found.emit(query, list(repos))

    @Slot(str)
    def list_files(self, repo: str) -> None:
        files = self._run("files", "listing the repository's files", lambda: self.client.files(repo))
        if files is not None:
            self.files_listed.emit(repo, list(files))

    @Slot(object, object)
    def install(self, file, cancel: CancelToken) -> None:
        model = self._run("download", "the download", lambda: self.client.install(file, self.progress.emit, cancel))
        if model is not None:
            self.installed.emit(shown_model(model))

    @Slot(str)
    def set_token(self, token: str) -> None:
        self._run("token", "keeping the token", lambda: self.client.set_token(token.strip()))
        self.report_token()

    @Slot()
    def clear_token(self) -> None:
        self._run("token", "forgetting the token", self.client.clear_token)
        self.report_token()

    @Slot()
    def report_token(self) -> None:
        has = self._run("token", "reading the token", self.client.has_token)
        self.token_state.emit(bool(has))


class HubHost(QObject):
    """Owns the hub worker's thread and the queued signals that call it."""

    request_search = Signal(str)
    request_files = Signal(str)
    request_install = Signal(object, object)  # HubFile, CancelToken
    request_set_token = Signal(str)
    request_clear_token = Signal()
    request_token_state = Signal()

    def __init__(self, paths: HearthPaths, parent: QObject | None = None, endpoint: str | None = None):
        super().__init__(parent)
        self.thread = QThread()
        self.thread.setObjectName("hearth-hub")
        self.worker = HubWorker(paths, endpoint)
        self.worker.moveToThread(self.thread)
        w = self.worker
        for request, slot in ((self.request_search, w.search), (self.request_files, w.list_files),
                              (self.request_install, w.install), (self.request_set_token, w.set_token),
                              (self.request_clear_token, w.clear_token), (self.request_token_state, w.report_token)):
            request.connect(slot)
        self.thread.start()
        self._cancel: CancelToken | None = None

    def install(self, file) -> None:
        self._cancel = CancelToken()
        self.request_install.emit(file, self._cancel)

    def cancel(self) -> None:
        if self._cancel is not None:
            self._cancel.cancel()

    def stop(self, timeout_ms: int = 10000) -> bool:
        self.cancel()
        self.thread.quit()
        return self.thread.wait(timeout_ms)
