"""Preferences → Tools → Add server… and Edit…: an MCP server run as a command, or reached at a URL.

A command is the program, its arguments (one line, split the way a shell splits it: quotes keep spaces),
environment variables and a working folder; a URL is a streamable HTTP endpoint and the headers sent to
it. Variables' and headers' values are secrets: typed hidden, handed to the tool worker (which keeps them
in the secret store) and cleared from the dialog as it closes — never shown again. The dialog stays open
until the worker accepts the server, and shows why it did not.
"""

from __future__ import annotations

import shlex

from PySide6.QtCore import Signal
from PySide6.QtWidgets import (
    QDialog,
    QDialogButtonBox,
    QFileDialog,
    QFormLayout,
    QGridLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPushButton,
    QTabWidget,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from app.text import sentence
from app.theme import error_colour

MAX_PAIRS = 64  # more variables than any server needs; a pasted file is not an environment


class SecretPairs(QWidget):
    """Rows of a name and a hidden value (``KEY=VALUE`` environment variables, ``Name: value`` headers).

    Typing or pasting ``KEY=VALUE`` into a name box moves the value into the hidden box beside it."""

    def __init__(self, what: str, separator: str, name_hint: str, parent: QWidget | None = None):
        super().__init__(parent)
        self.what, self.separator, self.name_hint = what, separator, name_hint
        self.rows: list[tuple[QLineEdit, QLineEdit, QToolButton]] = []
        self.kept: dict[QLineEdit, str] = {}  # a row showing a kept value: its name as it was
        outer = QVBoxLayout(self)
        outer.setContentsMargins(0, 0, 0, 0)
        self.grid = QGridLayout()
        self.grid.setColumnStretch(0, 2)
        self.grid.setColumnStretch(2, 3)
        outer.addLayout(self.grid)
        self.add_button = QPushButton(f"Add {what}")
        self.add_button.setAccessibleName(f"Add another {what}")
        self.add_button.clicked.connect(lambda: self.add_row().setFocus())
        line = QHBoxLayout()
        line.addWidget(self.add_button)
        line.addStretch(1)
        outer.addLayout(line)
        self.add_row()

    def add_row(self, name: str = "", kept: bool = False) -> QLineEdit:
        """A row (``kept``: for a value already in the secret store, left empty to keep it)."""
        if self.rows and kept and not any(k.text() or v.text() for k, v, _d in self.rows):
            self._forget_rows()  # the empty first row gives way to the kept ones
        if len(self.rows) >= MAX_PAIRS:
            return self.rows[-1][0]
        n = len(self.rows) + 1
        key = QLineEdit(name)
        key.setPlaceholderText(self.name_hint)
        key.setAccessibleName(f"{self.what.capitalize()} {n} name")
        value = QLineEdit()
        value.setEchoMode(QLineEdit.EchoMode.Password)
        value.setPlaceholderText("kept: ••• (type to replace)" if kept else "value (hidden)")
        value.setAccessibleName(f"{self.what.capitalize()} {n} value")
        value.setToolTip("Kept in the system's keyring (or a private file), never shown again, never in the "
                         "database, a log or an export")
        drop = QToolButton()
        drop.setText("✕")
        drop.setAccessibleName(f"Clear {self.what} {n}")
        drop.setToolTip("Clear this row")
        row = len(self.rows)
        self.grid.addWidget(key, row, 0)
        self.grid.addWidget(QLabel(self.separator.strip()), row, 1)
        self.grid.addWidget(value, row, 2)
        self.grid.addWidget(drop, row, 3)
        self.rows.append((key, value, drop))
        if kept:
            self.kept[key] = name
        key.textEdited.connect(lambda text, k=key, v=value: self._split(text, k, v))
        drop.clicked.connect(lambda _c=False, k=key, v=value: (k.clear(), v.clear()))
        return key

    def _forget_rows(self) -> None:
        while self.grid.count():
            item = self.grid.takeAt(0)
            if item.widget() is not None:
                item.widget().deleteLater()
        self.rows.clear()
        self.kept.clear()

    def _split(self, text: str, key: QLineEdit, value: QLineEdit) -> None:
        sep = self.separator.strip()
        if sep in text:
            name, rest = text.split(sep, 1)
            key.setText(name.strip())
            value.setText(value.text() + rest.lstrip())
            value.setFocus()

    def pairs(self) -> dict[str, str | None]:
        """The rows with something in them, a kept value left as it was as None; ValueError naming the row
        that has a value but no name, or a name twice."""
        found: dict[str, str | None] = {}
        for n, (key, value, _drop) in enumerate(self.rows, 1):
            name = key.text().strip()
            if not name and not value.text():
                continue
            if not name:
                raise ValueError(f"{self.what} {n} has a value but no name")
            if name in found:
                raise ValueError(f"the {self.what} {name} is given twice")
            keep = not value.text() and self.kept.get(key) == name
            found[name] = None if keep else value.text()
        return found

    def clear(self) -> None:
        for key, value, _drop in self.rows:
            key.clear()
            value.clear()


class AddToolServerDialog(QDialog):
    """Two kinds: Command (stdio) and URL (streamable HTTP). Stays open until the worker accepts it."""

    submitted_stdio = Signal(str, str, object, object, str, bool)  # name, command, args, env, folder, replace
    submitted_http = Signal(str, str, object, bool)  # name, URL, headers, replace

    def __init__(self, parent: QWidget | None = None, config=None):
        """``config``: the ToolServerConfig to edit (its name stays); None: a new server."""
        super().__init__(parent)
        self.editing = config
        title = f"Edit the tool server {config.name}" if config is not None else "Add a tool server"
        self.setWindowTitle(title)
        self.setAccessibleName(title)
        self.submitted_name = ""
        layout = QVBoxLayout(self)
        intro = QLabel("A Model Context Protocol server gives the model tools. Hearth runs a command on this computer, "
                       "or talks to a server at a URL. It starts when a chat first needs it.")
        intro.setWordWrap(True)
        layout.addWidget(intro)
        top = QFormLayout()
        self.name = QLineEdit()
        self.name.setPlaceholderText("files")
        self.name.setAccessibleName("Server name")
        self.name.setToolTip("A short name: letters, digits, - and _ (the model sees it in the tools' names)")
        top.addRow("Name:", self.name)
        layout.addLayout(top)
        self.kinds = QTabWidget()
        self.kinds.setAccessibleName("Kind of server")
        self.kinds.addTab(self._command_page(), "Command")
        self.kinds.addTab(self._url_page(), "URL")
        layout.addWidget(self.kinds, 1)
        self.error = QLabel("")
        self.error.setWordWrap(True)
        self.error.setStyleSheet(f"color: {error_colour(self.palette())};")
        self.error.setAccessibleName("Why the server was not added")
        self.error.hide()
        layout.addWidget(self.error)
        self.buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Cancel)
        self.add_button = self.buttons.addButton("Add" if config is None else "Save",
                                                 QDialogButtonBox.ButtonRole.AcceptRole)
        self.add_button.setDefault(True)
        self.buttons.accepted.connect(self._submit)
        self.buttons.rejected.connect(self.reject)
        layout.addWidget(self.buttons)
        if config is not None:
            self._show_config(config)
        self.resize(560, self.sizeHint().height())

    def _show_config(self, config) -> None:
        """An edit: the server's settings, its secrets' names with their values kept (never shown)."""
        self.name.setText(config.name)
        self.name.setReadOnly(True)
        self.name.setToolTip("A server keeps its name: remove it and add it again to rename it")
        http = config.transport == "http"
        self.kinds.setCurrentIndex(1 if http else 0)
        self.kinds.setTabEnabled(0 if http else 1, False)
        if http:
            self.url.setText(config.url)
            for header in config.header_names:
                self.headers.add_row(header, kept=True)
        else:
            self.command.setText(config.command)
            self.arguments.setText(shlex.join(config.args))
            self.cwd.setText(config.cwd or "")
            for variable in config.env_names:
                self.env.add_row(variable, kept=True)

    def _command_page(self) -> QWidget:
        page = QWidget()
        form = QFormLayout(page)
        self.command = QLineEdit()
        self.command.setPlaceholderText("npx")
        self.command.setAccessibleName("Command")
        self.command.setToolTip("The program to run: a name found on the PATH, or its full path")
        self.arguments = QLineEdit()
        self.arguments.setPlaceholderText('-y @modelcontextprotocol/server-filesystem "/home/me/My notes"')
        self.arguments.setAccessibleName("Arguments")
        self.arguments.setToolTip("Split as a shell splits them: quote an argument that holds spaces")
        self.env = SecretPairs("variable", "=", "API_KEY")
        self.cwd = QLineEdit()
        self.cwd.setPlaceholderText("optional")
        self.cwd.setAccessibleName("Working folder")
        browse = QPushButton("Choose…")
        browse.setAccessibleName("Choose the working folder")
        browse.clicked.connect(self._choose_folder)
        folder = QHBoxLayout()
        folder.addWidget(self.cwd, 1)
        folder.addWidget(browse)
        form.addRow("Command:", self.command)
        form.addRow("Arguments:", self.arguments)
        form.addRow("Environment:", self.env)
        form.addRow("Working folder:", folder)
        return page

    def _url_page(self) -> QWidget:
        page = QWidget()
        form = QFormLayout(page)
        self.url = QLineEdit()
        self.url.setPlaceholderText("https://tools.example.com/mcp")
        self.url.setAccessibleName("Server URL")
        self.url.setToolTip("A streamable HTTP endpoint")
        self.headers = SecretPairs("header", ":", "Authorization")
        form.addRow("URL:", self.url)
        form.addRow("Headers:", self.headers)
        return page

    def _choose_folder(self) -> None:
        folder = QFileDialog.getExistingDirectory(self, "Working folder of the server", self.cwd.text())
        if folder:
            self.cwd.setText(folder)

    def is_command(self) -> bool:
        return self.kinds.currentIndex() == 0

    def _submit(self) -> None:
        name = self.name.text().strip()
        try:
            if not name:
                raise ValueError("give the server a name")
            if self.is_command():
                command = self.command.text().strip()
                if not command:
                    raise ValueError("give the command that runs the server")
                try:
                    args = shlex.split(self.arguments.text())
                except ValueError as exc:  # "No closing quotation"
                    raise ValueError(f"the arguments cannot be split: {str(exc).lower()}") from None
                env = self.env.pairs()
            else:
                url = self.url.text().strip()
                if not url:
                    raise ValueError("give the server's URL")
                headers = self.headers.pairs()
        except ValueError as exc:
            self.show_error(str(exc))
            return
        self.error.hide()
        self.add_button.setEnabled(False)
        self.submitted_name = name
        replace = self.editing is not None
        if self.is_command():
            self.submitted_stdio.emit(name, command, args, env, self.cwd.text().strip(), replace)
        else:
            self.submitted_http.emit(name, url, headers, replace)

    def show_error(self, message: str) -> None:
        self.add_button.setEnabled(True)
        self.error.setText(sentence(message))
        self.error.show()

    def done(self, result: int) -> None:
        self.env.clear()  # the values are the secret store's now, not this widget's
        self.headers.clear()
        super().done(result)
