"""The Models dialog's "Servers" tab: the remote servers added (name, address, whether a key is kept), each
server's models as NAME/MODEL with a way to use one, and why a server's models could not be listed.

It shows what the remote worker lists (app/remote_worker.py) and asks it to act; nothing here touches the
network or a file. The API key typed in the Add dialog goes to the worker, which hands it to the secret
store; the dialog forgets it as it closes.
"""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QBrush, QColor
from PySide6.QtWidgets import (
    QAbstractItemView,
    QDialog,
    QDialogButtonBox,
    QFormLayout,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QLineEdit,
    QPushButton,
    QTreeWidget,
    QTreeWidgetItem,
    QVBoxLayout,
    QWidget,
)

from app.remote_worker import RemoteHost
from app.text import display_safe, plural, sentence
from app.theme import error_colour

COLUMNS = ("Server / model", "Address", "API key", "Status")
MODEL_ROLE = Qt.ItemDataRole.UserRole  # a model row's NAME/MODEL key; a server row's: None
SERVER_ROLE = Qt.ItemDataRole.UserRole + 1  # the server's name, on both kinds of rows


class AddServerDialog(QDialog):
    """Name, address and an optional API key (typed hidden). Stays open until the worker accepts them."""

    submitted = Signal(str, str, str)

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setWindowTitle("Add a server")
        self.setAccessibleName("Add a server")
        layout = QVBoxLayout(self)
        intro = QLabel("An OpenAI-compatible server: vLLM, SGLang, llama.cpp's server, Ollama, LM Studio or another "
                       "Hearth. Its models appear in the model picker as NAME/MODEL.")
        intro.setWordWrap(True)
        layout.addWidget(intro)
        form = QFormLayout()
        self.name = QLineEdit()
        self.name.setPlaceholderText("lab")
        self.name.setAccessibleName("Server name")
        self.url = QLineEdit()
        self.url.setPlaceholderText("http://gpu-box:8000")
        self.url.setAccessibleName("Server address")
        self.key = QLineEdit()
        self.key.setEchoMode(QLineEdit.EchoMode.Password)
        self.key.setPlaceholderText("optional")
        self.key.setAccessibleName("API key")
        self.key.setToolTip("Kept in the system's keyring (or a private file), never in the database or an export")
        form.addRow("Name:", self.name)
        form.addRow("Address:", self.url)
        form.addRow("API key:", self.key)
        layout.addLayout(form)
        self.error = QLabel("")
        self.error.setWordWrap(True)
        self.error.setStyleSheet(f"color: {error_colour(self.palette())};")
        self.error.setAccessibleName("Why the server was not added")
        self.error.hide()
        layout.addWidget(self.error)
        self.buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Cancel)
        self.add_button = self.buttons.addButton("Add", QDialogButtonBox.ButtonRole.AcceptRole)
        self.add_button.setDefault(True)
        self.buttons.accepted.connect(self._submit)
        self.buttons.rejected.connect(self.reject)
        layout.addWidget(self.buttons)
        self.resize(460, self.sizeHint().height())

    def _submit(self) -> None:
        name, url = self.name.text().strip(), self.url.text().strip()
        if not name or not url:
            self.show_error("Give the server a name and its address.")
            return
        self.error.hide()
        self.add_button.setEnabled(False)
        self.submitted.emit(name, url, self.key.text())

    def show_error(self, message: str) -> None:
        self.add_button.setEnabled(True)
        self.error.setText(sentence(message))
        self.error.show()

    def done(self, result: int) -> None:
        self.key.clear()  # the key is the secret store's now, not this widget's
        super().done(result)


class RemoteServersPanel(QWidget):
    use_requested = Signal(str)  # NAME/MODEL

    def __init__(self, remotes: RemoteHost, parent: QWidget | None = None):
        super().__init__(parent)
        self.remotes = remotes
        self.add_dialog: AddServerDialog | None = None
        self._build()
        remotes.worker.listed.connect(self.show_servers)
        remotes.worker.changed.connect(self._on_changed)

    def _build(self) -> None:
        layout = QVBoxLayout(self)
        intro = QLabel("Chat with models served elsewhere (vLLM, SGLang, llama.cpp, Ollama, LM Studio, another "
                       "Hearth). Conversations stay on this computer; only the messages of a chat go to its server.")
        intro.setWordWrap(True)
        intro.setEnabled(False)
        layout.addWidget(intro)
        self.tree = QTreeWidget()
        self.tree.setColumnCount(len(COLUMNS))
        self.tree.setHeaderLabels(COLUMNS)
        self.tree.setAccessibleName("Remote servers and their models")
        self.tree.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.tree.setRootIsDecorated(True)
        self.tree.setUniformRowHeights(True)
        header = self.tree.header()
        header.setSectionResizeMode(0, QHeaderView.ResizeMode.ResizeToContents)
        header.setSectionResizeMode(1, QHeaderView.ResizeMode.ResizeToContents)
        header.setSectionResizeMode(2, QHeaderView.ResizeMode.ResizeToContents)
        header.setSectionResizeMode(3, QHeaderView.ResizeMode.Stretch)
        self.tree.itemSelectionChanged.connect(self._update_buttons)
        self.tree.itemDoubleClicked.connect(lambda _item, _col: self._use())
        layout.addWidget(self.tree, 1)
        self.empty = QLabel("No servers yet. Add one to chat with the models it serves.")
        self.empty.setEnabled(False)
        layout.addWidget(self.empty)
        self.message = QLabel("")
        self.message.setWordWrap(True)
        self.message.setStyleSheet(f"color: {error_colour(self.palette())};")
        self.message.setAccessibleName("Servers problem")
        self.message.hide()
        layout.addWidget(self.message)
        row = QHBoxLayout()
        self.add_button = QPushButton("Add server…")
        self.remove_button = QPushButton("Remove server")
        self.refresh_button = QPushButton("Refresh")
        self.use_button = QPushButton("Use for this chat")
        for b in (self.add_button, self.remove_button, self.refresh_button):
            row.addWidget(b)
        row.addStretch(1)
        row.addWidget(self.use_button)
        layout.addLayout(row)
        self.add_button.clicked.connect(self.open_add_dialog)
        self.remove_button.clicked.connect(self._remove)
        self.refresh_button.clicked.connect(self.refresh)
        self.use_button.clicked.connect(self._use)
        self._update_buttons()

    def refresh(self) -> None:
        self.refresh_button.setEnabled(False)
        self.refresh_button.setText("Refreshing…")
        self.remotes.request_refresh.emit()

    # what is shown ------------------------------------------------------------------------------------
    def show_servers(self, servers: list) -> None:
        self.refresh_button.setEnabled(True)
        self.refresh_button.setText("Refresh")
        selected = self.selected_key()
        self.tree.clear()
        red = QBrush(QColor(error_colour(self.palette())))
        for server, models in servers:
            top = QTreeWidgetItem([server.name, display_safe(server.base_url), "yes" if server.has_key else "no", ""])
            top.setData(0, SERVER_ROLE, server.name)
            top.setData(0, MODEL_ROLE, None)
            bold = top.font(0)
            bold.setBold(True)
            top.setFont(0, bold)
            if isinstance(models, str):
                top.setText(3, sentence(display_safe(models)))
                top.setToolTip(3, sentence(display_safe(models)))
                top.setForeground(3, red)
            else:
                top.setText(3, plural(len(models), "model") if models else "no models listed")
                for m in models:
                    child = QTreeWidgetItem([display_safe(m.name), "", "", "ready"])
                    child.setData(0, MODEL_ROLE, m.name)
                    child.setData(0, SERVER_ROLE, server.name)
                    child.setToolTip(0, f"Chats on this model send their messages to {display_safe(server.base_url)}")
                    top.addChild(child)
            self.tree.addTopLevelItem(top)
            top.setExpanded(True)
        self.empty.setVisible(not servers)
        if selected:
            for item in self._model_items():
                if item.data(0, MODEL_ROLE) == selected:
                    self.tree.setCurrentItem(item)
        self._update_buttons()

    def _model_items(self) -> list[QTreeWidgetItem]:
        return [self.tree.topLevelItem(i).child(j) for i in range(self.tree.topLevelItemCount())
                for j in range(self.tree.topLevelItem(i).childCount())]

    def server_row(self, name: str) -> QTreeWidgetItem | None:
        for i in range(self.tree.topLevelItemCount()):
            if self.tree.topLevelItem(i).data(0, SERVER_ROLE) == name:
                return self.tree.topLevelItem(i)
        return None

    def selected_key(self) -> str | None:
        item = self.tree.currentItem()
        return item.data(0, MODEL_ROLE) if item is not None and item.isSelected() else None

    def selected_server(self) -> str | None:
        item = self.tree.currentItem()
        return item.data(0, SERVER_ROLE) if item is not None and item.isSelected() else None

    def _update_buttons(self) -> None:
        self.use_button.setEnabled(self.selected_key() is not None)
        self.remove_button.setEnabled(self.selected_server() is not None)

    # actions --------------------------------------------------------------------------------------------
    def open_add_dialog(self) -> AddServerDialog:
        if self.add_dialog is None:
            self.add_dialog = AddServerDialog(self)
            self.add_dialog.submitted.connect(self.remotes.request_add)
            self.add_dialog.finished.connect(lambda _r: setattr(self, "add_dialog", None))
        self.add_dialog.show()
        self.add_dialog.raise_()
        return self.add_dialog

    def _remove(self) -> None:
        name = self.selected_server()
        if name:
            self.remotes.request_remove.emit(name)

    def _use(self) -> None:
        key = self.selected_key()
        if key:
            self.use_requested.emit(key)

    def _on_changed(self, what: str, problem: str) -> None:
        if what.startswith("add ") and self.add_dialog is not None:
            if problem:
                self.add_dialog.show_error(problem)
            else:
                self.add_dialog.accept()
            return
        if problem:
            self.message.setText(sentence(problem))
            self.message.show()
        else:
            self.message.hide()
