"""Preferences → Tools: the MCP servers configured, each with its state and tools, and the limits of tool use.

A server row has its on/off switch (a check box), its state (off, stopped, starting…, ready, failed) and what
it runs; its tools sit under it, each with its own switch and its description as tooltip (a server lists its
tools once it has started). Below the list, the selected server's details: its command or URL, the names of
its secrets (never their values: "kept"), and for a failed server why, with the end of its error output in a
box that opens on request. Changes to servers take effect at once (through the tool worker, never on this
thread); the two limits are Preferences, kept with the dialog's OK.
"""

from __future__ import annotations

import shlex
from html import escape

from PySide6.QtCore import Qt
from PySide6.QtGui import QBrush, QColor, QFont, QFontDatabase
from PySide6.QtWidgets import (
    QAbstractItemView,
    QFileDialog,
    QFormLayout,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QMessageBox,
    QPlainTextEdit,
    QPushButton,
    QSpinBox,
    QToolButton,
    QTreeWidget,
    QTreeWidgetItem,
    QVBoxLayout,
    QWidget,
)

from app.text import display_safe, display_safe_lines, plural, sentence
from app.theme import error_colour
from app.tool_server_dialog import AddToolServerDialog
from app.tool_worker import ToolWorkerHost
from engine.api import TOOL_LIMITS, Preferences, ServerState, ServerStatus

COLUMNS = ("Server / tool", "State", "Runs / does")
SERVER_ROLE = Qt.ItemDataRole.UserRole  # the server's name, on its row and its tools' rows
TOOL_ROLE = Qt.ItemDataRole.UserRole + 1  # a tool row's tool name; a server row's: None
STATE_WORDS = {ServerState.STOPPED: "stopped", ServerState.STARTING: "starting…", ServerState.READY: "ready",
               ServerState.FAILED: "failed"}
DESCRIPTION_CHARS = 120  # a tool's description in its row (the whole of it is the tooltip)
TOOLTIP_CHARS = 2000  # a server's description can be long, and is the server's text: bound it


def first_line(text: str, limit: int = DESCRIPTION_CHARS) -> str:
    line = (text or "").strip().split("\n", 1)[0]
    return line if len(line) <= limit else line[: limit - 1] + "…"


def runs_text(config) -> str:
    """What a server runs, as a person would type it: ``npx -y server /tmp`` or its URL."""
    if config.transport == "http":
        return config.url
    return shlex.join([config.command, *config.args])


class ToolsPanel(QWidget):
    def __init__(self, tools: ToolWorkerHost, prefs: Preferences, parent: QWidget | None = None):
        super().__init__(parent)
        self.tools = tools
        self.configs: dict = {}  # name → ToolServerConfig
        self.statuses: dict[str, ServerStatus] = {}
        self.add_dialog: AddToolServerDialog | None = None
        self.import_dialog: QFileDialog | None = None  # Import mcp.json…'s, while it is open
        self.message_box: QMessageBox | None = None  # the last question or problem shown (tests look at it)
        self._filling = False  # the tree is being rebuilt: its check boxes' changes are not the person's
        self._known_rows: set[str] = set()  # the servers shown before: a new one opens, one closed stays closed
        self._select_next = ""  # a server just added: selected once it is listed
        self._build(prefs)
        w = tools.worker
        w.servers_listed.connect(self._on_listed)
        w.status_changed.connect(self._on_status)
        w.changed.connect(self._on_changed)
        w.imported.connect(self._on_imported)
        self._on_listed(tools.configs)  # what is known already, at once; the worker's answer follows
        self._on_status(tools.statuses)
        tools.request_refresh.emit()

    # building -------------------------------------------------------------------------------------------------
    def _build(self, prefs: Preferences) -> None:
        layout = QVBoxLayout(self)
        intro = QLabel("Tool servers (Model Context Protocol) let the model act: read files, search, fetch pages. "
                       "A server starts when a chat first needs it and stops when Hearth quits. A chat asks before "
                       "each tool runs.")
        intro.setWordWrap(True)
        intro.setEnabled(False)  # a note, not a control
        layout.addWidget(intro)
        self.tree = QTreeWidget()
        self.tree.setColumnCount(len(COLUMNS))
        self.tree.setHeaderLabels(COLUMNS)
        self.tree.setAccessibleName("Tool servers and their tools")
        self.tree.setMinimumHeight(180)
        self.tree.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.tree.setUniformRowHeights(True)
        header = self.tree.header()
        header.setSectionResizeMode(0, QHeaderView.ResizeMode.ResizeToContents)
        header.setSectionResizeMode(1, QHeaderView.ResizeMode.ResizeToContents)
        header.setSectionResizeMode(2, QHeaderView.ResizeMode.Stretch)
        header.setStretchLastSection(True)
        self.tree.itemChanged.connect(self._on_item_changed)
        self.tree.itemSelectionChanged.connect(self._show_details)
        layout.addWidget(self.tree, 1)
        self.empty = QLabel("No tool servers yet. Add one, or import an mcp.json from another app.")
        self.empty.setEnabled(False)
        layout.addWidget(self.empty)
        self._build_details(layout)
        self.message = QLabel("")
        self.message.setWordWrap(True)
        self.message.setAccessibleName("Tool servers problem")
        self.message.hide()
        layout.addWidget(self.message)
        self._build_buttons(layout)
        self._build_limits(layout, prefs)
        self._update_buttons()

    def _build_details(self, layout: QVBoxLayout) -> None:
        self.details = QLabel("")
        self.details.setWordWrap(True)
        self.details.setTextFormat(Qt.TextFormat.RichText)
        self.details.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.details.setAccessibleName("The selected server")
        layout.addWidget(self.details)
        self.error_toggle = QToolButton()
        self.error_toggle.setCheckable(True)
        self.error_toggle.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextBesideIcon)
        self.error_toggle.setArrowType(Qt.ArrowType.RightArrow)
        self.error_toggle.setText("Its error output")
        self.error_toggle.setAccessibleName("Show the server's error output")
        self.error_toggle.setAutoRaise(True)
        self.error_toggle.toggled.connect(self._toggle_output)
        layout.addWidget(self.error_toggle)
        self.error_output = QPlainTextEdit()
        self.error_output.setReadOnly(True)
        mono = QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont)
        mono.setStyleHint(QFont.StyleHint.Monospace)
        mono.setFixedPitch(True)
        self.error_output.setFont(mono)
        self.error_output.setLineWrapMode(QPlainTextEdit.LineWrapMode.NoWrap)
        self.error_output.setAccessibleName("The server's error output (its last lines)")
        self.error_output.setMaximumHeight(110)  # the last lines; the list keeps the room
        layout.addWidget(self.error_output)
        self.error_toggle.hide()
        self.error_output.hide()

    def _build_buttons(self, layout: QVBoxLayout) -> None:
        row = QHBoxLayout()
        self.add_button = QPushButton("Add server…")
        self.import_button = QPushButton("Import mcp.json…")
        self.import_button.setToolTip("The servers of a Claude Desktop, Cursor or VS Code configuration file")
        self.edit_button = QPushButton("Edit…")
        self.edit_button.setToolTip("Change the selected server's command, URL, environment or headers")
        self.remove_button = QPushButton("Remove…")
        self.restart_button = QPushButton("Restart")
        self.start_button = QPushButton("Start all")
        self.start_button.setToolTip("Start every server that is on, to see its tools (a chat starts them when "
                                     "it needs them)")
        self.refresh_button = QPushButton("Refresh")
        for b in (self.add_button, self.import_button, self.edit_button, self.remove_button, self.restart_button):
            row.addWidget(b)
        for b in (self.add_button, self.import_button, self.edit_button, self.remove_button, self.restart_button,
                  self.start_button, self.refresh_button):
            b.setAutoDefault(False)  # Return in the dialog is its OK, not the button that last had the focus
        row.addStretch(1)
        row.addWidget(self.start_button)
        row.addWidget(self.refresh_button)
        layout.addLayout(row)
        self.add_button.clicked.connect(lambda: self.open_add_dialog())
        self.edit_button.clicked.connect(self.open_edit_dialog)
        self.import_button.clicked.connect(self._choose_import)
        self.remove_button.clicked.connect(self.ask_remove)
        self.restart_button.clicked.connect(self._restart)
        self.start_button.clicked.connect(lambda: self.tools.request_ensure.emit(None))
        self.refresh_button.clicked.connect(self.tools.request_refresh.emit)

    def _build_limits(self, layout: QVBoxLayout, prefs: Preferences) -> None:
        form = QFormLayout()
        self.steps = QSpinBox()
        self.steps.setRange(*TOOL_LIMITS["tool_steps"])
        self.steps.setValue(prefs.tool_steps)
        self.steps.setAccessibleName("Most tool steps per message")
        self.steps.setToolTip("How many times the model may call tools while answering one message")
        self.timeout = QSpinBox()
        self.timeout.setRange(*TOOL_LIMITS["tool_timeout_s"])
        self.timeout.setValue(prefs.tool_timeout_s)
        self.timeout.setSuffix(" s")
        self.timeout.setAccessibleName("Tool call timeout in seconds")
        self.timeout.setToolTip("A tool call still running after this long is stopped and reported as failed")
        for box in (self.steps, self.timeout):
            box.setFixedWidth(110)
        form.addRow("Most tool steps per message", self.steps)
        form.addRow("Tool call timeout", self.timeout)
        layout.addLayout(form)

    # what is shown ----------------------------------------------------------------------------------------------
    def _on_listed(self, configs: list) -> None:
        self.configs = {c.name: c for c in configs}
        self._fill()

    def _on_status(self, statuses: list) -> None:
        self.statuses = {s.name: s for s in statuses}
        self._fill()

    def _fill(self) -> None:
        """The tree from the configured servers and their states, keeping what was selected and opened."""
        selected, opened = self.selected_server(), self._opened()
        if self._select_next in self.configs:
            selected, self._select_next = self._select_next, ""
        self._filling = True
        self.tree.clear()
        red = QBrush(QColor(error_colour(self.palette())))
        for name, config in self.configs.items():
            status = self.statuses.get(name, ServerStatus(name, ServerState.STOPPED))
            top = QTreeWidgetItem([name, self.state_text(config, status), display_safe(runs_text(config))])
            top.setData(0, SERVER_ROLE, name)
            top.setData(0, TOOL_ROLE, None)
            top.setFlags(top.flags() | Qt.ItemFlag.ItemIsUserCheckable)
            top.setCheckState(0, Qt.CheckState.Checked if config.enabled else Qt.CheckState.Unchecked)
            top.setToolTip(0, "On: chats may use its tools" if config.enabled else "Off: no chat uses its tools")
            bold = top.font(0)
            bold.setBold(True)
            top.setFont(0, bold)
            if status.state == ServerState.FAILED and config.enabled:
                top.setForeground(1, red)
                top.setToolTip(1, sentence(display_safe(status.error or "it failed")))
            self._add_tools(top, config, status)
            self.tree.addTopLevelItem(top)
            top.setExpanded(name in opened or name not in self._known_rows)
        self._known_rows = set(self.configs)
        self._filling = False
        self.empty.setVisible(not self.configs)
        row = self.server_row(selected) if selected else None
        if row is not None:
            self.tree.setCurrentItem(row)
        self._show_details()

    def _add_tools(self, top: QTreeWidgetItem, config, status: ServerStatus) -> None:
        names = {t.name for t in status.tools}
        for spec in status.tools:
            child = QTreeWidgetItem([spec.name, "on" if spec.enabled else "off",
                                     display_safe(first_line(spec.description))])
            child.setToolTip(0, display_safe_lines((spec.description or "No description")[:TOOLTIP_CHARS]))
            child.setToolTip(2, child.toolTip(0))
            self._tool_row(top, child, config, spec.name, spec.enabled)
        for tool in sorted(config.disabled_tools - names):  # switched off, and not listed now (not started)
            self._tool_row(top, QTreeWidgetItem([tool, "off", ""]), config, tool, False)
        if not status.tools and status.state != ServerState.READY:
            words = ("Off: switch it on to offer its tools" if not config.enabled
                     else "No tools: it did not start (see why below)" if status.state == ServerState.FAILED
                     else "Its tools are listed once it starts")
            hint = QTreeWidgetItem([words, "", ""])
            hint.setFlags(Qt.ItemFlag.NoItemFlags)
            hint.setData(0, SERVER_ROLE, config.name)
            top.addChild(hint)
        elif not status.tools:
            hint = QTreeWidgetItem(["It offers no tools", "", ""])
            hint.setFlags(Qt.ItemFlag.NoItemFlags)
            top.addChild(hint)

    def _tool_row(self, top: QTreeWidgetItem, child: QTreeWidgetItem, config, tool: str, on: bool) -> None:
        child.setData(0, SERVER_ROLE, config.name)
        child.setData(0, TOOL_ROLE, tool)
        flags = Qt.ItemFlag.ItemIsSelectable | Qt.ItemFlag.ItemIsUserCheckable
        if config.enabled:
            flags |= Qt.ItemFlag.ItemIsEnabled  # a server that is off: its tools' switches rest
        child.setFlags(flags)
        child.setCheckState(0, Qt.CheckState.Checked if tool not in config.disabled_tools else Qt.CheckState.Unchecked)
        top.addChild(child)

    @staticmethod
    def state_text(config, status: ServerStatus) -> str:
        if not config.enabled:
            return "off"
        text = STATE_WORDS.get(status.state, str(status.state))
        if status.state == ServerState.READY:
            enabled = sum(1 for t in status.tools if t.enabled)
            return f"ready · {plural(enabled, 'tool')} on" if status.tools else "ready"
        return text

    def _opened(self) -> set[str]:
        return {self.tree.topLevelItem(i).data(0, SERVER_ROLE) for i in range(self.tree.topLevelItemCount())
                if self.tree.topLevelItem(i).isExpanded()}

    def server_row(self, name: str) -> QTreeWidgetItem | None:
        for i in range(self.tree.topLevelItemCount()):
            if self.tree.topLevelItem(i).data(0, SERVER_ROLE) == name:
                return self.tree.topLevelItem(i)
        return None

    def tool_row(self, server: str, tool: str) -> QTreeWidgetItem | None:
        top = self.server_row(server)
        for j in range(top.childCount() if top is not None else 0):
            if top.child(j).data(0, TOOL_ROLE) == tool:
                return top.child(j)
        return None

    def selected_server(self) -> str | None:
        item = self.tree.currentItem()
        return item.data(0, SERVER_ROLE) if item is not None and item.isSelected() else None

    def _show_details(self) -> None:
        self._update_buttons()
        name = self.selected_server()
        config = self.configs.get(name) if name else None
        if config is None:
            self.details.setText("Select a server to see its details." if self.configs else "")
            self._show_output("")
            return
        status = self.statuses.get(name, ServerStatus(name, ServerState.STOPPED))
        lines = [f"<b>{escape(display_safe(name))}</b> — {escape(self.state_text(config, status))}"]
        if config.transport == "http":
            lines.append(f"URL: <code>{escape(display_safe(config.url))}</code>")
            if config.header_names:
                lines.append("Headers: " + escape(", ".join(config.header_names)) + " (values kept, never shown)")
        else:
            lines.append(f"Runs: <code>{escape(display_safe(runs_text(config)))}</code>")
            if config.cwd:
                lines.append(f"In: <code>{escape(display_safe(config.cwd))}</code>")
            if config.env_names:
                lines.append("Environment: " + escape(", ".join(f"{n}=•••" for n in config.env_names))
                             + " (values kept, never shown)")
        if status.state == ServerState.FAILED and status.error:
            red = error_colour(self.palette())
            lines.append(f"<span style='color:{red}'>{escape(sentence(display_safe(status.error)))}</span>")
        self.details.setText("<br>".join(lines))
        self._show_output(status.stderr_tail if status.state == ServerState.FAILED else "")

    def _show_output(self, tail: str) -> None:
        shown = display_safe_lines(tail)
        if self.error_output.toPlainText() != shown:
            self.error_output.setPlainText(shown)
        self.error_toggle.setVisible(bool(tail))
        self.error_output.setVisible(bool(tail) and self.error_toggle.isChecked())

    def _toggle_output(self, shown: bool) -> None:
        self.error_toggle.setArrowType(Qt.ArrowType.DownArrow if shown else Qt.ArrowType.RightArrow)
        self.error_output.setVisible(shown and self.error_toggle.isVisible())
        if shown:
            bar = self.error_output.verticalScrollBar()
            bar.setValue(bar.maximum())  # the last lines say what went wrong

    def _update_buttons(self) -> None:
        name = self.selected_server()
        config = self.configs.get(name) if name else None
        self.remove_button.setEnabled(config is not None)
        self.edit_button.setEnabled(config is not None)
        state = self.statuses[name].state if name in self.statuses else ServerState.STOPPED
        self.restart_button.setEnabled(config is not None and config.enabled and state != ServerState.STARTING)
        self.restart_button.setText("Start" if state == ServerState.STOPPED else "Restart")
        self.start_button.setEnabled(any(c.enabled for c in self.configs.values()))

    # the person's changes ------------------------------------------------------------------------------------------
    def _on_item_changed(self, item: QTreeWidgetItem, column: int) -> None:
        if self._filling or column != 0:
            return
        name, tool = item.data(0, SERVER_ROLE), item.data(0, TOOL_ROLE)
        config = self.configs.get(name)
        if config is None:
            return
        on = item.checkState(0) == Qt.CheckState.Checked
        if tool is None and on != config.enabled:
            self.tools.request_set_enabled.emit(name, on)
        elif tool is not None and on != (tool not in config.disabled_tools):
            self.tools.request_set_tool_enabled.emit(name, tool, on)

    def open_edit_dialog(self) -> AddToolServerDialog | None:
        name = self.selected_server()
        if name not in self.configs:
            return None
        if self.add_dialog is not None:
            self.add_dialog.reject()  # one add or edit at a time
        return self.open_add_dialog(self.configs[name])

    def open_add_dialog(self, config=None) -> AddToolServerDialog:
        """Add server… (``config``: Edit… of that server)."""
        if self.add_dialog is not None and (config is not None or self.add_dialog.editing is not None):
            self.add_dialog.reject()
        if self.add_dialog is None:
            self.add_dialog = AddToolServerDialog(self, config)
            self.add_dialog.submitted_stdio.connect(self.tools.request_add_stdio)
            self.add_dialog.submitted_http.connect(self.tools.request_add_http)
            self.add_dialog.finished.connect(lambda _r: setattr(self, "add_dialog", None))
        self.add_dialog.show()
        self.add_dialog.raise_()
        return self.add_dialog

    def _choose_import(self) -> QFileDialog:
        """Import mcp.json…: a window-modal file dialog opened without a nested event loop (as the paperclip's)."""
        dialog = QFileDialog(self, "Import tool servers")
        dialog.setObjectName("importToolsDialog")
        dialog.setFileMode(QFileDialog.FileMode.ExistingFile)
        dialog.setNameFilters(["MCP configuration (*.json)", "All files (*)"])
        dialog.fileSelected.connect(self.import_file)
        dialog.open()
        self.import_dialog = dialog
        return dialog

    def import_file(self, path: str) -> None:
        """Read on the worker thread; the answer comes back as ``imported`` and ``changed``."""
        self.import_button.setEnabled(False)
        self.tools.request_import.emit(path)

    def ask_remove(self) -> QMessageBox | None:
        name = self.selected_server()
        if name is None:
            return None
        box = QMessageBox(QMessageBox.Icon.Question, "Remove tool server",
                          f"Remove the tool server “{display_safe(name)}”? Its settings and kept secrets are "
                          "deleted; chats can no longer call its tools.", QMessageBox.StandardButton.Cancel, self)
        box.setObjectName("removeToolServerQuestion")
        remove = box.addButton("Remove", QMessageBox.ButtonRole.DestructiveRole)
        box.setDefaultButton(QMessageBox.StandardButton.Cancel)
        box.finished.connect(lambda _r: self.tools.request_remove.emit(name) if box.clickedButton() is remove else None)
        box.finished.connect(box.deleteLater)
        self.message_box = box
        box.open()
        return box

    def _restart(self) -> None:
        name = self.selected_server()
        if name is None:
            return
        state = self.statuses[name].state if name in self.statuses else ServerState.STOPPED
        if state == ServerState.STOPPED:
            self.tools.request_ensure.emit([name])
        else:
            self.tools.request_restart.emit(name)

    # the worker's answers -----------------------------------------------------------------------------------------
    def _on_changed(self, what: str, problem: str) -> None:
        if what.startswith("add ") and self.add_dialog is not None:
            if problem:
                self.add_dialog.show_error(problem)
            else:
                self.add_dialog.accept()
                self._select_next = what[4:]
            return
        if what.startswith("import "):
            self.import_button.setEnabled(True)
            if problem:
                self._show_problem("Could not import the file", problem)
            return  # else ``imported`` said what came in
        self.say(problem, error=bool(problem))

    def _on_imported(self, names: list, notes: list) -> None:
        shown = ", ".join(display_safe(str(n)) for n in names)
        text = f"Imported {plural(len(names), 'server')}" + (f": {shown}." if names else ".")
        if notes:
            text += " Not used: " + "; ".join(display_safe(str(n)) for n in notes[:5]) + ("…" if len(notes) > 5 else "")
        self.say(text)

    def say(self, text: str, error: bool = False) -> None:
        self.message.setStyleSheet(f"color: {error_colour(self.palette())};" if error else "")
        self.message.setText(sentence(text))
        self.message.setVisible(bool(text))

    def _show_problem(self, title: str, problem: str) -> QMessageBox:
        box = QMessageBox(QMessageBox.Icon.Warning, title, sentence(display_safe(problem)),
                          QMessageBox.StandardButton.Ok, self)
        box.setObjectName("toolServersProblem")
        box.finished.connect(box.deleteLater)
        self.message_box = box
        box.open()
        return box

    def limits(self) -> dict[str, int]:
        """The two Preferences fields this tab shows."""
        return {"tool_steps": self.steps.value(), "tool_timeout_s": self.timeout.value()}

    def show_limits(self, prefs: Preferences) -> None:
        self.steps.setValue(prefs.tool_steps)
        self.timeout.setValue(prefs.tool_timeout_s)
