"""A model per chat: the header's picker, the Models dialog, Open model file and drag-and-drop of a GGUF.

A chat remembers the model it was last used with. Showing a chat whose model is not the loaded one asks
the engine thread to switch first; requests to that thread run in order, so the chat's opening (and a
message sent meanwhile) waits for the switch. If the chat's model is gone from the library, a banner
offers to continue with the model that is loaded. Choosing a model in the picker runs the open chat on
it and makes it the model new chats start with.
"""

from __future__ import annotations

import logging
from pathlib import Path

from PySide6.QtCore import QObject, Qt, Signal
from PySide6.QtWidgets import QFileDialog, QHBoxLayout, QLabel, QMessageBox, QPushButton, QWidget

from app.hub_worker import HubHost
from app.library_worker import LibraryHost
from app.model_picker import ModelPicker
from app.remote_worker import RemoteHost
from app.server_banner import ServerBanner
from app.text import display_safe, sentence
from engine.api import split_model_key
from engine.types import LibraryModel, ModelInfo

log = logging.getLogger(__name__)


def gguf_paths(urls) -> list[str]:
    """The local ``.gguf`` files among dropped URLs."""
    return [u.toLocalFile() for u in urls if u.isLocalFile() and u.toLocalFile().lower().endswith(".gguf")]


class ModelControl(QObject):
    switching = Signal(str)  # the engine is loading this model for the open chat

    def __init__(self, window):
        super().__init__(window)
        self.window = window
        self.host = window.host
        self.library = LibraryHost(window.config.paths, self)
        self.remotes = RemoteHost(window.config.paths, self)
        self.hub: HubHost | None = None  # the Hub's worker, made with the Models dialog
        self.models: dict[str, LibraryModel] = {}
        self.local_models: list[LibraryModel] = []
        self.servers: list = []  # [(RemoteServer, list[LibraryModel] | str why not)], as the remote worker listed them
        self.server_names: set[str] = set()
        self.loaded: str | None = None  # the model the engine has (or is loading, once asked)
        self.dialog = None
        self._after_add_use = False  # the file being added was opened to run the chat on it
        self._adding = ""  # the name of that file, for the status line
        self._build_header()
        lw = self.library.worker
        lw.listed.connect(self._on_listed)
        lw.added.connect(self._on_added)
        lw.changed.connect(self._on_changed)
        self.remotes.worker.known.connect(self._on_servers_known)
        self.remotes.worker.listed.connect(self._on_servers_listed)
        w = self.host.worker
        w.ready.connect(self._on_ready)
        w.switch_failed.connect(self._on_switch_failed)
        w.too_large.connect(self._on_too_large)
        w.context_set.connect(lambda _name: self.library.request_refresh.emit())
        w.context_refused.connect(self._on_context_refused)
        self.library.request_refresh.emit()
        self.remotes.request_refresh.emit()

    def _build_header(self) -> None:
        """Above the chat: the model picker and a note when the chat's model is not available."""
        self.header = QWidget()
        row = QHBoxLayout(self.header)
        row.setContentsMargins(0, 0, 0, 0)
        row.addWidget(QLabel("Model:"))
        self.picker = ModelPicker()
        row.addWidget(self.picker)
        self.missing_note = QLabel("")
        self.missing_note.setWordWrap(True)
        self.missing_note.setAccessibleName("The chat's model is not available")
        self.missing_note.hide()
        row.addWidget(self.missing_note, 1)
        self.continue_button = QPushButton("Continue with the loaded model")
        self.continue_button.hide()
        self.continue_button.clicked.connect(self._continue_here)
        row.addWidget(self.continue_button)
        row.addStretch(0)
        self.window.chat.layout().insertWidget(0, self.header)
        self.server_banner = ServerBanner()
        self.server_banner.retry_requested.connect(lambda key: self.switch(key))
        self.server_banner.manage_requested.connect(self.show_servers)
        self.window.chat.layout().insertWidget(1, self.server_banner)
        self.picker.chosen.connect(self.choose)
        self.picker.manage_requested.connect(self.show_dialog)

    # the chat's model -----------------------------------------------------------------------------------
    def chat_model(self, conversation: str | None) -> str | None:
        conv = self.window.store.get(conversation) if conversation else None
        return (conv.model_key or None) if conv is not None else None

    def recommended(self, conversation: str | None) -> dict:
        """The sampling values the chat's model recommends (its own model, else the loaded one)."""
        m = self.models.get(self.chat_model(conversation) or self.loaded or "")
        return dict(m.defaults) if m is not None else {}

    def is_remote(self, key: str | None) -> bool:
        """``key`` is NAME/MODEL of an added server (its chats run there: no saved context on this disk)."""
        split = split_model_key(key or "")
        return split is not None and split[0] in self.server_names

    def title(self, name: str | None) -> str:
        if self.is_remote(name):
            return display_safe(name)
        m = self.models.get(name or "")
        return m.title if m is not None else (display_safe(name) if name else "the model")  # a path: anyone's text

    def short_title(self, name: str | None) -> str:
        """A chat's model as the sidebar shows it: the title without its details in parentheses."""
        if not name:
            return ""
        return self.title(name).split(" (")[0]

    def on_chat_shown(self, conversation: str | None) -> bool:
        """Before the chat opens in the engine: switch to its model when it has another, available one.
        True when a switch was asked for: the window opens the chat once that model is ready, not before
        (a second opening found it live and the status bar said "continued from memory" for a chat
        just restored from disk)."""
        self._hide_missing()
        wanted = self.chat_model(conversation)
        if not wanted or wanted == self.loaded:
            self.picker.show_current(self.loaded)
            return False
        m = self.models.get(wanted)
        if (m is not None and m.status == "ready") or self.is_remote(wanted):  # a server says itself what it lacks
            self.picker.show_current(wanted)
            self.switch(wanted)
            return True
        elif self.models or m is not None:  # the list is known and the model is gone or unusable
            why = m.problem if m is not None and m.problem else "it is no longer in the library"
            self.missing_note.setText(f"This chat was last used with {self.title(wanted)}, which cannot be loaded "
                                      f"({why}). Replies will come from {self.title(self.loaded)}.")
            self.missing_note.show()
            self.continue_button.show()
            self.picker.show_current(self.loaded)
        return False

    def _hide_missing(self) -> None:
        self.server_banner.hide()
        self.missing_note.hide()
        self.continue_button.hide()

    def _continue_here(self) -> None:
        conversation = self.window.current
        if conversation and self.loaded:
            self.window.store.set_model(conversation, self.title(self.loaded), self.loaded)
            self.window.reload_list()  # the window's own writes do not move data_version: the list names it now
        self._hide_missing()

    def choose(self, name: str) -> None:
        """The user picked ``name`` for the open chat: it runs there now and new chats start with it."""
        conversation = self.window.current
        if not self.is_remote(name):  # the library's default is a local model (a server may be gone next run)
            self.library.request_use.emit(name)
        self._hide_missing()
        if conversation:
            self.window.store.set_model(conversation, self.title(name), name)
            self.window.reload_list()  # the window's own writes do not move data_version: the list names it now
        if name != self.loaded:
            self.switch(name)  # once it is ready, the window opens the chat on it (MainWindow._on_ready)

    def switch(self, name: str, force: bool = False) -> None:
        self.loaded = name
        self.window.status.model.setText(f"Loading {self.title(name)}…")
        self.switching.emit(name)
        self.host.request_switch_model.emit(name, force)

    # the engine's answers --------------------------------------------------------------------------------
    def _on_ready(self, info: ModelInfo) -> None:
        if info.key == self.server_banner.key:
            self.server_banner.hide()
        self.loaded = info.key or self.loaded
        self.picker.show_current(self.loaded)

    def _on_switch_failed(self, name: str, message: str) -> None:
        if self.is_remote(name):  # no dialog: a banner says why, plainly, and the chat stays usable
            self.window.status.problem(f"{self.title(name)} cannot be used now")
            self.loaded = None  # the engine says next what still runs (its "ready")
            running = self.window.model_info
            self.server_banner.failed(name, sentence(display_safe(message)),
                                     self.short_title(running.key) if running else None)
            return
        self.window.status.problem(f"{self.title(name)} could not be loaded")
        self.loaded = None
        QMessageBox.warning(self.window, "Hearth", f"{self.title(name)} could not be loaded:\n\n{message}")

    def _on_too_large(self, name: str, message: str) -> None:
        """Loading would not fit in memory: say so with the numbers, and load only if the user insists."""
        box = QMessageBox(QMessageBox.Icon.Warning, "Not enough memory", message, QMessageBox.StandardButton.Cancel,
                          self.window)
        load = box.addButton("Load anyway", QMessageBox.ButtonRole.AcceptRole)
        box.setDefaultButton(QMessageBox.StandardButton.Cancel)
        box.setWindowModality(Qt.WindowModality.WindowModal)
        box.finished.connect(lambda _r: self.switch(name, force=True) if box.clickedButton() is load else None)
        self.loaded = None
        self.window.status.problem(f"{self.title(name)} was not loaded: not enough memory")
        box.open()

    def _on_context_refused(self, name: str, message: str) -> None:
        QMessageBox.warning(self.dialog or self.window, "Hearth", f"The context length of {self.title(name)} "
                            f"was not changed:\n\n{message}")

    # the library ------------------------------------------------------------------------------------------
    def _on_listed(self, models: list) -> None:
        self.local_models = list(models)
        self._show_models()

    def _on_servers_known(self, servers: list) -> None:
        """The servers added: a chat shown on one of their models switches to it (the models' list comes later)."""
        before, self.server_names = self.server_names, {server.name for server in servers}
        if self.server_names == before:
            return  # a refresh of the same servers: a chat whose switch failed waits for Try again
        self.window.reload_list()  # the `remote` badges
        wanted = self.chat_model(self.window.current)
        if self.is_remote(wanted) and wanted != self.loaded:
            self.on_chat_shown(self.window.current)  # the window opens the chat once it is ready there

    def _on_servers_listed(self, servers: list) -> None:
        self.servers = list(servers)
        self.server_names = {server.name for server, _models in servers}
        self._show_models()

    def _show_models(self) -> None:
        remote = [m for _server, listed in self.servers if not isinstance(listed, str) for m in listed]
        self.models = {m.name: m for m in (*self.local_models, *remote)}
        self.picker.set_models(self.local_models, self.servers)
        self.picker.show_current(self.loaded)
        self.window.reload_list()  # the sidebar names each chat's model by its title, and marks remote ones

    def show_dialog(self) -> None:
        from app.models_dialog import ModelsDialog

        if self.dialog is None:
            self.hub = self._hub_host()
            self.dialog = ModelsDialog(self.library, self.window, current=self.loaded, remotes=self.remotes,
                                       hub=self.hub)
            self.dialog.use_requested.connect(self.choose)
            self.dialog.context_requested.connect(self.host.request_set_context)
        else:
            self.library.request_refresh.emit()
        self.remotes.request_refresh.emit()
        self.dialog.current = self.loaded
        self.dialog.show()
        self.dialog.raise_()

    def show_servers(self) -> None:
        self.show_dialog()
        if self.dialog.servers is not None:
            self.dialog.tabs.setCurrentWidget(self.dialog.servers)

    def _hub_host(self) -> HubHost:
        return HubHost(self.window.config.paths, self)

    def open_file(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self.window, "Open a model file", str(Path.home()),
                                              "GGUF models (*.gguf);;All files (*)")
        if path:
            self.add_and_use(path)

    def add_and_use(self, path: str) -> None:
        """Add a GGUF to the library (linked where it is) and run the open chat on it."""
        self._after_add_use = True
        self._adding = display_safe(Path(path).name)
        self.window.status.say(f"Adding {self._adding}…")
        self.library.request_add.emit(path)

    def _not_added(self) -> None:
        """The add was refused: "Adding README.md…" must not stay on the status line after the dialog."""
        self.window.status.problem(f"{self._adding} was not added")

    def _on_added(self, model: LibraryModel) -> None:
        use, self._after_add_use = self._after_add_use, False
        if not use:
            return
        if model.status == "ready":
            self.choose(model.name)
        else:
            self._not_added()
            QMessageBox.warning(self.window, "Hearth", f"{model.title} cannot be used: {model.problem}")

    def _on_changed(self, what: str, problem: str) -> None:
        if problem and what.startswith("added") and self._after_add_use:
            self._after_add_use = False
            self._not_added()
            QMessageBox.warning(self.window, "Hearth", f"The model file could not be added:\n\n{problem}")

    def stop(self) -> None:
        if self.dialog is not None:
            self.dialog.close()
        self.library.stop()
        self.remotes.stop()
        if self.hub is not None:
            self.hub.stop()
