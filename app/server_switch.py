"""The status bar's Local server switch: the OpenAI-compatible server inside the window.

The server shares the window's one engine: its requests run on the engine thread in order with the
window's own turns (``EngineHost.request_posted``). Starting it is done on the engine thread, where the
``Hearth`` lives; it listens on 127.0.0.1 only. The switch's menu shows the base URL and copies it or a
ready-to-run example.
"""

from __future__ import annotations

import logging

from PySide6.QtCore import QObject, Signal, Slot
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import QMenu, QToolButton

from engine.api import local_server
from engine.errors import HearthError

log = logging.getLogger(__name__)
DEFAULT_PORT = 8080


def curl_example(base_url: str, model: str) -> str:
    return (f"curl {base_url}/chat/completions -H 'Content-Type: application/json' -d "
            f"'{{\"model\": \"{model}\", \"messages\": [{{\"role\": \"user\", \"content\": \"Hello!\"}}]}}'")


class ServerSwitch(QObject):
    state_changed = Signal(str)  # "off", "starting", "on", or why it failed
    _started = Signal(object, str)  # (the server or None, the URL or why not): from the engine thread

    def __init__(self, window):
        super().__init__(window)
        self.window, self.host = window, window.host
        self.port = DEFAULT_PORT
        self.server = None
        self.url = ""
        self.button = QToolButton()
        self.button.setText("Local server: off")
        self.button.setAccessibleName("Local server")
        self.button.setToolTip("An OpenAI-compatible server for other programs, on this computer only")
        self.button.setPopupMode(QToolButton.ToolButtonPopupMode.InstantPopup)
        self.menu = QMenu(self.button)
        self.toggle_action = self.menu.addAction("Start the local server", self.toggle)
        self.copy_url_action = self.menu.addAction("Copy the base URL", lambda: self._copy(self.url))
        self.copy_example_action = self.menu.addAction("Copy a curl example", self._copy_example)
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
        port, paths, post = self.port, self.window.config.paths, self.host.request_posted.emit

        def begin() -> None:
            worker = self.host.worker
            try:
                server = local_server(paths, worker.hearth, post, port=port)
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

    def _show(self, state: str) -> None:
        on = state == "on"
        self.button.setText(f"Local server: {self.url}" if on else "Local server: starting…" if state == "starting"
                            else "Local server: off")
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
        self._copy(curl_example(self.url, model))
