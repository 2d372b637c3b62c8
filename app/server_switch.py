"""The status bar's Local server switch: the OpenAI-compatible server inside the window.

The server shares the window's one engine: its requests run on the engine thread in order with the
window's own turns (``EngineHost.request_posted``). Starting it is done on the engine thread, where the
``Hearth`` lives; it listens on 127.0.0.1 only. The switch's menu shows the base URL and copies it or a
ready-to-run example.

"Require a key" (for the other accounts on this computer, which can reach 127.0.0.1 too): the key is
generated once and kept in a private file in the data dir (``engine/server_key.py``); the server then
refuses requests without ``Authorization: Bearer KEY``. The key is shown, with a Copy button, only in
its own dialog, and never logged.
"""

from __future__ import annotations

import logging

from PySide6.QtCore import QObject, Signal, Slot
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import (
    QDialog,
    QDialogButtonBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QMenu,
    QPushButton,
    QToolButton,
    QVBoxLayout,
)

from engine.api import create_server_key, read_server_key, remove_server_key
from engine.errors import HearthError

log = logging.getLogger(__name__)
DEFAULT_PORT = 8080


def curl_example(base_url: str, model: str, key: str | None = None) -> str:
    auth = f" -H 'Authorization: Bearer {key}'" if key else ""
    return (f"curl {base_url}/chat/completions{auth} -H 'Content-Type: application/json' -d "
            f"'{{\"model\": \"{model}\", \"messages\": [{{\"role\": \"user\", \"content\": \"Hello!\"}}]}}'")


class ServerKeyDialog(QDialog):
    """The key, selectable, with a Copy button: what a client needs to reach the server."""

    def __init__(self, key: str, parent=None):
        super().__init__(parent)
        self.setWindowTitle("Local server key — Hearth")
        self.setAccessibleName("Local server key")
        layout = QVBoxLayout(self)
        note = QLabel("Programs using the local server must send this key: "
                      "<code>Authorization: Bearer KEY</code>. Other accounts on this computer cannot "
                      "use the server without it. Keep it private.")
        note.setWordWrap(True)
        layout.addWidget(note)
        row = QHBoxLayout()
        self.field = QLineEdit(key)
        self.field.setReadOnly(True)
        self.field.setAccessibleName("The key")
        self.field.setMinimumWidth(self.field.fontMetrics().horizontalAdvance(key) + 24)
        row.addWidget(self.field, 1)
        self.copy_button = QPushButton("Copy")
        self.copy_button.setAccessibleName("Copy the key")
        self.copy_button.clicked.connect(lambda: QGuiApplication.clipboard().setText(self.field.text()))
        row.addWidget(self.copy_button)
        layout.addLayout(row)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        buttons.rejected.connect(self.reject)
        layout.addWidget(buttons)


class ServerSwitch(QObject):
    state_changed = Signal(str)  # "off", "starting", "on", or why it failed
    _started = Signal(object, str)  # (the server or None, the URL or why not): from the engine thread

    def __init__(self, window):
        super().__init__(window)
        self.window, self.host = window, window.host
        self.port = DEFAULT_PORT
        self.server = None
        self.url = ""
        self.key_dialog: ServerKeyDialog | None = None
        try:  # a few bytes in the data dir, like preferences.json
            self.key = read_server_key(window.config.paths.data)
        except HearthError as exc:
            self.key = None
            window.status.problem(str(exc))
        self.button = QToolButton()
        self.button.setText("Server: off")
        self.button.setAccessibleName("Local server")
        self.button.setToolTip("An OpenAI-compatible server for other programs, on this computer only")
        self.button.setPopupMode(QToolButton.ToolButtonPopupMode.InstantPopup)
        self.menu = QMenu(self.button)
        self.url_action = self.menu.addAction("")  # the base URL, shown here (the button stays short)
        self.url_action.setEnabled(False)
        self.toggle_action = self.menu.addAction("Start the local server", self.toggle)
        self.copy_url_action = self.menu.addAction("Copy the base URL", lambda: self._copy(self.url))
        self.copy_example_action = self.menu.addAction("Copy a curl example", self._copy_example)
        self.menu.addSeparator()
        self.require_key_action = self.menu.addAction("Require a key")
        self.require_key_action.setCheckable(True)
        self.require_key_action.setChecked(self.key is not None)
        self.require_key_action.setToolTip("Other accounts on this computer can reach 127.0.0.1 too: "
                                           "make programs send a key")
        self.require_key_action.toggled.connect(self.require_key)
        self.show_key_action = self.menu.addAction("Show the key…", self.show_key)
        self.button.setMenu(self.menu)
        self._started.connect(self._on_started)
        self._show("off")
        window.statusBar().addPermanentWidget(self.button)

    @property
    def running(self) -> bool:
        return self.server is not None

    def toggle(self) -> None:
        if self.running:
            self.stop()
        else:
            self.start()

    def start(self) -> None:
        """Build and start the server on the engine thread (where the model lives), then report here."""
        if self.running or self.window.model_info is None:
            if self.window.model_info is None:
                self._show("the model is not loaded yet")
            return
        self._show("starting")
        port, paths, post, key = self.port, self.window.config.paths, self.host.request_posted.emit, self.key

        def begin() -> None:
            from engine.server.embedded import local_server  # on first use: the window starts without the server

            worker = self.host.worker
            try:
                server = local_server(paths, worker.hearth, post, port=port, api_key=key)
                url = server.start()
            except HearthError as exc:
                self._started.emit(None, str(exc))
                return
            except Exception as exc:  # a bug: the log has the traceback, the window a plain sentence
                log.exception("the local server failed to start")
                self._started.emit(None, f"it failed unexpectedly ({exc})")
                return
            self._started.emit(server, url)

        self.host.request_posted.emit(begin)

    @Slot(object, str)
    def _on_started(self, server, url_or_problem: str) -> None:
        if server is None:
            self._show(url_or_problem)
            return
        self.server, self.url = server, url_or_problem
        self._show("on")

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()
        self.server, self.url = None, ""
        self._show("off")

    def require_key(self, on: bool) -> None:
        """Make (or keep) the key and require it, or stop requiring it (the key file goes; turning it on
        again makes a new key). A running server restarts so the change holds at once."""
        data = self.window.config.paths.data
        try:
            if on:
                self.key = create_server_key(data)
            else:
                remove_server_key(data)
                self.key = None
        except HearthError as exc:
            self.window.status.problem(str(exc))
            self.key = read_server_key_quietly(data)
        self.require_key_action.blockSignals(True)
        self.require_key_action.setChecked(self.key is not None)
        self.require_key_action.blockSignals(False)
        if self.running:
            self.stop()
            self.start()
        else:
            self._show("off")
        if on and self.key is not None:
            self.show_key()

    def show_key(self) -> ServerKeyDialog | None:
        if self.key is None:
            return None
        if self.key_dialog is not None:
            self.key_dialog.close()
        self.key_dialog = ServerKeyDialog(self.key, self.window)
        self.key_dialog.open()
        return self.key_dialog

    def _show(self, state: str) -> None:
        on = state == "on"
        self.show_key_action.setEnabled(self.key is not None)
        locked = " · key" if self.key is not None else ""
        # Short, so the status bar keeps room for how the last turn started at 1,100 px; the URL is in
        # the tooltip and the menu.
        self.button.setText(f"Server: on{locked}" if on else "Server: starting…" if state == "starting"
                            else "Server: off")
        self.button.setToolTip(f"The local server answers at {self.url}" + (" (a key is required)" if locked else "")
                               if on else "An OpenAI-compatible server for other programs, on this computer only")
        self.url_action.setText(self.url if on else "Not running")
        self.toggle_action.setText("Stop the local server" if on else "Start the local server")
        self.copy_url_action.setEnabled(on)
        self.copy_example_action.setEnabled(on)
        if state not in ("on", "off", "starting"):
            self.window.status.problem(f"the local server did not start: {state}")
        self.state_changed.emit(state)

    def _copy(self, text: str) -> None:
        QGuiApplication.clipboard().setText(text)

    def _copy_example(self) -> None:
        model = self.window.model_info.key if self.window.model_info is not None else "model"
        self._copy(curl_example(self.url, model, self.key))


def read_server_key_quietly(data) -> str | None:
    """The key on disk after a failed change, or None when even that cannot be read (already reported)."""
    try:
        return read_server_key(data)
    except HearthError:
        return None
