"""Configuring MCP tool servers in the window (issue 33): Preferences → Tools, typed into the real widgets, with
the real tool worker on its own thread, the real registry (tools.json and the secret store) and real MCP
servers (tests/mcp_servers/): adding a command or URL server, editing one with its secrets kept, importing an
mcp.json (good and bad), removing with a question, switching servers and tools, a failing server's error and
error output, a server that hangs while the window goes on, the limits of tool use kept in Preferences, a
chat narrowing its tools, and secrets kept out of every widget, file and log line but the secret store."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

import pytest
from PySide6.QtCore import Qt, QThread, QTimer
from PySide6.QtWidgets import QFileDialog, QMessageBox

from app.preferences import PreferencesDialog
from app.tool_worker import ToolWorkerHost
from engine.api import (
    STOPPED,
    Preferences,
    ServerState,
    ToolOutcome,
    ToolRegistry,
    load_preferences,
    open_conversations,
    resolve_paths,
)
from engine.types import ToolCall
from tests.mcp_helpers import SERVERS, process_dead, start_http_calculator, wait_for
from tests.qt_helpers import TIMEOUT

SECRET = "s3cret-value-9f8e7d"
HEADER_SECRET = "Bearer tok-4a4b4c4d"
SHOT = Path("/tmp/tools_tab.png")


@pytest.fixture
def paths(tmp_path):
    return resolve_paths(tmp_path / "home").ensure()


@pytest.fixture
def tools(paths):
    host = ToolWorkerHost(paths)
    yield host
    assert host.stop(30_000)


@pytest.fixture
def prefs_dialog(qtbot, paths, tools):
    """Edit → Preferences… on its Tools tab, as the window opens it."""
    made = []

    def open_it(prefs: Preferences | None = None) -> PreferencesDialog:
        dialog = PreferencesDialog(paths, prefs or Preferences(), tools=tools)
        qtbot.addWidget(dialog)
        made.append(dialog)
        dialog.show()
        dialog.tabs.setCurrentWidget(dialog.tools_panel)
        qtbot.waitExposed(dialog)
        return dialog

    return open_it


def registry(paths) -> ToolRegistry:
    return ToolRegistry(paths.data)


def choose_import(qtbot, panel, path) -> None:
    """Import mcp.json… clicked, and ``path`` chosen in its file dialog."""
    qtbot.mouseClick(panel.import_button, Qt.MouseButton.LeftButton)
    dialog = panel.import_dialog
    assert dialog.isVisible() and dialog.fileMode() == QFileDialog.FileMode.ExistingFile
    dialog.fileSelected.emit(str(path))
    dialog.close()


def wait_row(qtbot, panel, name: str, state_has: str = ""):
    qtbot.waitUntil(lambda: panel.server_row(name) is not None and state_has in panel.server_row(name).text(1),
                    timeout=TIMEOUT)
    return panel.server_row(name)


def type_command_server(qtbot, panel, name: str, command: str, arguments: str = "", env: dict | None = None,
                        cwd: str = ""):
    """Add server…, the Command kind, typed as a person would; Add."""
    qtbot.mouseClick(panel.add_button, Qt.MouseButton.LeftButton)
    add = panel.add_dialog
    assert add is not None and add.isVisible() and add.is_command()
    qtbot.keyClicks(add.name, name)
    qtbot.keyClicks(add.command, command)
    qtbot.keyClicks(add.arguments, arguments)
    for i, (key, value) in enumerate((env or {}).items()):
        if i:
            qtbot.mouseClick(add.env.add_button, Qt.MouseButton.LeftButton)
        name_box, value_box, _clear = add.env.rows[i]
        qtbot.keyClicks(name_box, key)
        qtbot.keyClicks(value_box, value)
        assert value_box.echoMode() == value_box.EchoMode.Password
    if cwd:
        qtbot.keyClicks(add.cwd, cwd)
    qtbot.mouseClick(add.add_button, Qt.MouseButton.LeftButton)
    return add


def every_text(widget) -> str:
    """What a person could read in ``widget`` and its children: labels, line edits, tree rows, tooltips."""
    from PySide6.QtWidgets import QLabel, QLineEdit, QPlainTextEdit, QTreeWidget

    texts = []
    for w in [widget, *widget.findChildren(object)]:
        if isinstance(w, QLabel | QLineEdit):
            texts.append(w.text())
        elif isinstance(w, QPlainTextEdit):
            texts.append(w.toPlainText())
        elif isinstance(w, QTreeWidget):
            stack = [w.topLevelItem(i) for i in range(w.topLevelItemCount())]
            while stack:
                item = stack.pop()
                texts += [item.text(c) + item.toolTip(c) for c in range(w.columnCount())]
                stack += [item.child(j) for j in range(item.childCount())]
        if hasattr(w, "toolTip"):
            texts.append(w.toolTip())
    return "\n".join(texts)


# adding, editing, removing -------------------------------------------------------------------------------------
def test_a_command_server_typed_into_the_dialog_is_kept_with_its_secret_out_of_sight(qtbot, paths, prefs_dialog,
                                                                                      caplog):
    caplog.set_level(logging.DEBUG)
    dialog = prefs_dialog()
    panel = dialog.tools_panel
    assert panel.empty.isVisible()
    add = type_command_server(qtbot, panel, "notes", sys.executable, '-m notes_server "/tmp/My notes" --fast',
                              env={"NOTES_TOKEN": SECRET}, cwd=str(paths.data))
    row = wait_row(qtbot, panel, "notes")
    assert not add.isVisible() and panel.add_dialog is None
    assert all(not v.text() for _k, v, _d in add.env.rows)  # the dialog forgot the value as it closed
    config = registry(paths).get("notes")
    assert config.command == sys.executable and config.args == ("-m", "notes_server", "/tmp/My notes", "--fast")
    assert config.env_names == ("NOTES_TOKEN",) and config.cwd == str(paths.data) and config.enabled
    assert registry(paths).env_of("notes") == {"NOTES_TOKEN": SECRET}  # in the secret store
    assert row.text(1) == "stopped"  # added, not started: servers start when a chat needs them
    assert row.checkState(0) == Qt.CheckState.Checked and not panel.empty.isVisible()
    assert panel.selected_server() == "notes"  # the server just added is the one shown below the list
    assert "NOTES_TOKEN=•••" in panel.details.text() and "never shown" in panel.details.text()
    assert "'/tmp/My notes'" in row.text(2)  # what it runs, quoted as a shell would
    for where in (every_text(dialog), (paths.data / "tools.json").read_text(), caplog.text):
        assert SECRET not in where


def test_a_url_server_with_a_header_and_the_registrys_refusal_shown_in_the_dialog(qtbot, paths, prefs_dialog,
                                                                                    caplog):
    caplog.set_level(logging.DEBUG)
    panel = prefs_dialog().tools_panel
    qtbot.mouseClick(panel.add_button, Qt.MouseButton.LeftButton)
    add = panel.add_dialog
    add.kinds.setCurrentIndex(1)
    qtbot.keyClicks(add.name, "web")
    qtbot.keyClicks(add.url, "ftp://tools.example.com/mcp")
    name_box, value_box, _clear = add.headers.rows[0]
    qtbot.keyClicks(name_box, "Authorization")
    qtbot.keyClicks(value_box, HEADER_SECRET)
    qtbot.mouseClick(add.add_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: add.error.isVisible(), timeout=TIMEOUT)
    assert "http" in add.error.text().lower() and add.isVisible() and add.add_button.isEnabled()
    assert registry(paths).servers() == []
    add.url.clear()
    qtbot.keyClicks(add.url, "http://127.0.0.1:9/mcp")
    qtbot.mouseClick(add.add_button, Qt.MouseButton.LeftButton)
    row = wait_row(qtbot, panel, "web")
    config = registry(paths).get("web")
    assert config.transport == "http" and config.url == "http://127.0.0.1:9/mcp"
    assert config.header_names == ("Authorization",)
    assert registry(paths).headers_of("web") == {"Authorization": HEADER_SECRET}
    assert row.text(2) == "http://127.0.0.1:9/mcp"
    assert "Authorization (values kept, never shown)" in panel.details.text()
    assert HEADER_SECRET not in caplog.text and HEADER_SECRET not in (paths.data / "tools.json").read_text()


@pytest.mark.parametrize(("fill", "said"), [
    (lambda add: None, "Give the server a name"),
    (lambda add: add.name.setText("x"), "Give the command that runs the server"),
    (lambda add: (add.name.setText("x"), add.command.setText("npx"), add.arguments.setText('-y "unclosed')),
     "The arguments cannot be split: no closing quotation"),
    (lambda add: (add.name.setText("x"), add.command.setText("npx"), add.env.rows[0][1].setText("v")),
     "Variable 1 has a value but no name"),
    (lambda add: (add.name.setText("x"), add.kinds.setCurrentIndex(1)), "Give the server's URL"),
])
def test_the_dialog_says_what_is_missing_and_sends_nothing(qtbot, paths, prefs_dialog, fill, said):
    panel = prefs_dialog().tools_panel
    add = panel.open_add_dialog()
    sent: list = []
    add.submitted_stdio.connect(lambda *a: sent.append(a))
    add.submitted_http.connect(lambda *a: sent.append(a))
    fill(add)
    qtbot.mouseClick(add.add_button, Qt.MouseButton.LeftButton)
    assert add.error.isVisible() and add.error.text().startswith(said) and add.add_button.isEnabled()
    assert sent == []


def test_a_name_taken_is_refused_in_plain_words(qtbot, paths, prefs_dialog):
    registry(paths).add_stdio("files", sys.executable, ["-V"])
    panel = prefs_dialog().tools_panel
    wait_row(qtbot, panel, "files")
    add = type_command_server(qtbot, panel, "files", sys.executable, "-c pass")
    qtbot.waitUntil(lambda: add.error.isVisible(), timeout=TIMEOUT)
    assert "files" in add.error.text() and "Traceback" not in add.error.text()
    assert registry(paths).get("files").args == ("-V",)


def test_typing_key_equals_value_into_a_name_box_hides_the_value(qtbot, prefs_dialog):
    add = prefs_dialog().tools_panel.open_add_dialog()
    name_box, value_box, _clear = add.env.rows[0]
    qtbot.keyClicks(name_box, "API_KEY=")
    qtbot.keyClicks(value_box, "abc")
    assert name_box.text() == "API_KEY" and value_box.text() == "abc"
    name_box.clear()
    value_box.clear()
    name_box.setText("")
    name_box.textEdited.emit("TOKEN=pasted-secret")  # a pasted line
    assert name_box.text() == "TOKEN" and value_box.text() == "pasted-secret"
    assert add.env.pairs() == {"TOKEN": "pasted-secret"}


def test_editing_a_server_keeps_a_secret_left_as_it_was_and_replaces_one_typed(qtbot, paths, prefs_dialog, caplog):
    caplog.set_level(logging.DEBUG)
    registry(paths).add_stdio("notes", sys.executable, ["-V"], env={"KEEP_ME": SECRET, "NEW_ME": "old-value-1"})
    panel = prefs_dialog().tools_panel
    panel.tree.setCurrentItem(wait_row(qtbot, panel, "notes"))
    qtbot.mouseClick(panel.edit_button, Qt.MouseButton.LeftButton)
    edit = panel.add_dialog
    assert edit.editing is not None and edit.name.isReadOnly() and edit.add_button.text() == "Save"
    assert [(k.text(), v.text()) for k, v, _d in edit.env.rows] == [("KEEP_ME", ""), ("NEW_ME", "")]
    assert "kept" in edit.env.rows[0][1].placeholderText() and SECRET not in every_text(edit)
    assert edit.arguments.text() == "-V"
    edit.arguments.setText("-c pass")
    qtbot.keyClicks(edit.env.rows[1][1], "new-value-2")
    qtbot.mouseClick(edit.add_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: panel.add_dialog is None, timeout=TIMEOUT)
    assert registry(paths).get("notes").args == ("-c", "pass")
    assert registry(paths).env_of("notes") == {"KEEP_ME": SECRET, "NEW_ME": "new-value-2"}
    assert SECRET not in caplog.text and "new-value-2" not in caplog.text


def test_remove_asks_first_and_cancel_keeps_the_server(qtbot, paths, prefs_dialog):
    registry(paths).add_stdio("notes", sys.executable, ["-V"], env={"TOKEN": SECRET})
    panel = prefs_dialog().tools_panel
    panel.tree.setCurrentItem(wait_row(qtbot, panel, "notes"))
    qtbot.mouseClick(panel.remove_button, Qt.MouseButton.LeftButton)
    box = panel.message_box
    assert box.isVisible() and "notes" in box.text() and box.defaultButton() == box.button(QMessageBox.StandardButton.Cancel)
    qtbot.mouseClick(box.button(QMessageBox.StandardButton.Cancel), Qt.MouseButton.LeftButton)
    qtbot.wait(200)
    assert registry(paths).get("notes").name == "notes" and panel.server_row("notes") is not None
    qtbot.mouseClick(panel.remove_button, Qt.MouseButton.LeftButton)
    box = panel.message_box
    remove = next(b for b in box.buttons() if b.text() == "Remove")
    qtbot.mouseClick(remove, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: panel.server_row("notes") is None, timeout=TIMEOUT)
    assert registry(paths).servers() == [] and panel.empty.isVisible()
    assert SECRET not in (paths.data / "secrets.json").read_text()  # its secrets went with it


def test_a_server_switched_off_and_on(qtbot, paths, prefs_dialog):
    registry(paths).add_stdio("notes", sys.executable, ["-V"])
    panel = prefs_dialog().tools_panel
    row = wait_row(qtbot, panel, "notes")
    row.setCheckState(0, Qt.CheckState.Unchecked)  # the person clicks its check box
    row = wait_row(qtbot, panel, "notes", "off")
    assert not registry(paths).get("notes").enabled and row.checkState(0) == Qt.CheckState.Unchecked
    assert not panel.start_button.isEnabled()  # nothing to start: the only server is off
    row.setCheckState(0, Qt.CheckState.Checked)
    wait_row(qtbot, panel, "notes", "stopped")
    assert registry(paths).get("notes").enabled


# importing ------------------------------------------------------------------------------------------------------
def test_importing_an_mcp_json_adds_its_servers(qtbot, paths, tmp_path, prefs_dialog):
    document = {"mcpServers": {
        "files": {"command": sys.executable, "args": ["-m", "files_server", "/tmp"], "env": {"FILES_KEY": SECRET}},
        "search": {"url": "http://127.0.0.1:9/mcp", "headers": {"Authorization": HEADER_SECRET}},
    }}
    path = tmp_path / "mcp.json"
    path.write_text(json.dumps(document))
    panel = prefs_dialog().tools_panel
    choose_import(qtbot, panel, path)
    wait_row(qtbot, panel, "files")
    wait_row(qtbot, panel, "search")
    qtbot.waitUntil(lambda: panel.message.isVisible() and "Imported" in panel.message.text(), timeout=TIMEOUT)
    assert panel.message.text().startswith("Imported 2 servers: ") and panel.import_button.isEnabled()
    assert registry(paths).env_of("files") == {"FILES_KEY": SECRET}
    assert registry(paths).get("search").url == "http://127.0.0.1:9/mcp"
    assert SECRET not in every_text(panel) and HEADER_SECRET not in every_text(panel)


@pytest.mark.parametrize(("content", "said"), [
    (b"{not json", "not valid JSON"),
    (b'{"mcpServers": {"bad name!": {"command": "x"}}}', "bad name!"),
    (b'{"mcpServers": {"files": {"args": ["no command"]}}}', "files"),
    (None, "missing.json"),
])
def test_a_bad_import_file_is_shown_in_a_readable_box_and_changes_nothing(qtbot, paths, tmp_path, prefs_dialog,
                                                                             content, said):
    registry(paths).add_stdio("kept", sys.executable, ["-V"])
    path = tmp_path / "missing.json"
    if content is not None:
        path = tmp_path / "mcp.json"
        path.write_bytes(content)
    panel = prefs_dialog().tools_panel
    wait_row(qtbot, panel, "kept")
    choose_import(qtbot, panel, path)
    qtbot.waitUntil(lambda: panel.message_box is not None and panel.message_box.isVisible(), timeout=TIMEOUT)
    box = panel.message_box
    assert box.windowTitle() == "Could not import the file" and box.icon() == QMessageBox.Icon.Warning
    assert said.lower() in box.text().lower() and "Traceback" not in box.text()
    assert panel.import_button.isEnabled()
    assert [s.name for s in registry(paths).servers()] == ["kept"]
    box.accept()


def test_an_import_that_names_a_server_already_there_adds_nothing(qtbot, paths, tmp_path, prefs_dialog):
    registry(paths).add_stdio("files", sys.executable, ["-V"])
    path = tmp_path / "mcp.json"
    path.write_text(json.dumps({"mcpServers": {"other": {"command": "x"}, "files": {"command": "y"}}}))
    panel = prefs_dialog().tools_panel
    wait_row(qtbot, panel, "files")
    choose_import(qtbot, panel, path)
    qtbot.waitUntil(lambda: panel.message_box is not None and panel.message_box.isVisible(), timeout=TIMEOUT)
    assert "files" in panel.message_box.text()
    assert [s.name for s in registry(paths).servers()] == ["files"]  # all or nothing


# Preferences' limits of tool use -------------------------------------------------------------------------------
def test_the_step_limit_and_timeout_are_kept_with_ok_and_reset_to_defaults(qtbot, paths, prefs_dialog):
    dialog = prefs_dialog()
    panel = dialog.tools_panel
    assert (panel.steps.value(), panel.timeout.value()) == (10, 60)
    assert (panel.steps.minimum(), panel.steps.maximum(), panel.timeout.minimum(), panel.timeout.maximum()) == (1, 50, 1, 600)
    panel.steps.clear()
    qtbot.keyClicks(panel.steps, "25")
    panel.timeout.clear()
    qtbot.keyClicks(panel.timeout, "120")
    qtbot.mouseClick(dialog.ok, Qt.MouseButton.LeftButton)
    assert dialog.result() == 1 and (dialog.saved.tool_steps, dialog.saved.tool_timeout_s) == (25, 120)
    kept = load_preferences(paths).preferences
    assert (kept.tool_steps, kept.tool_timeout_s) == (25, 120) and kept.temperature == Preferences().temperature
    again = prefs_dialog(kept)
    assert (again.tools_panel.steps.value(), again.tools_panel.timeout.value()) == (25, 120)
    qtbot.mouseClick(again.reset, Qt.MouseButton.LeftButton)
    assert (again.tools_panel.steps.value(), again.tools_panel.timeout.value()) == (10, 60)


def test_preferences_without_the_tools_tab_keep_the_limits_as_they_were(qtbot, paths):
    dialog = PreferencesDialog(paths, Preferences(tool_steps=7, tool_timeout_s=9))
    qtbot.addWidget(dialog)
    assert dialog.tools_panel is None and dialog.tabs.count() == 1
    dialog.accept()
    assert (dialog.saved.tool_steps, dialog.saved.tool_timeout_s) == (7, 9)


# the UI thread never waits for the registry or a server ----------------------------------------------------------
def test_every_change_goes_through_the_worker_thread(qtbot, paths, tools, prefs_dialog):
    """The panel only asks: its requests are queued to the worker's thread, and the answers come back."""
    assert tools.worker.thread() is tools.thread and tools.thread.isRunning()
    seen = []
    tools.worker.changed.connect(lambda what, _p: seen.append((what, QThread.currentThread())),
                                 Qt.ConnectionType.DirectConnection)  # runs where the worker did the work
    panel = prefs_dialog().tools_panel
    type_command_server(qtbot, panel, "one", sys.executable, "-V")
    wait_row(qtbot, panel, "one")
    assert seen == [("add one", tools.thread)]


# a chat's own set of tools --------------------------------------------------------------------------------------
def test_a_chat_narrows_its_tools_and_clears_its_always_allowed_list(qtbot, windows, config):
    registry(config.paths).add_stdio("files", sys.executable, ["-V"])
    registry(config.paths).add_http("search", "http://127.0.0.1:9/mcp")
    w = windows()
    qtbot.waitUntil(lambda: [c.name for c in w.tools.configs] == ["files", "search"], timeout=TIMEOUT)
    conv = w.new_chat()
    w.store.set_settings(conv, {"temperature": 0.5, "tools_always": ["files_read", "search_web"]})
    dialog = w.open_settings()
    qtbot.waitExposed(dialog)
    dialog.tabs.setCurrentWidget(dialog.tools)  # Chat settings → Tools
    assert dialog.tabs.tabText(1) == "Tools"
    section = dialog.tools
    assert section.all_tools.isChecked() and not section.tree.isEnabled()
    assert "files_read, search_web" in section.always_label.text() and section.clear_always.isEnabled()
    qtbot.mouseClick(section.only, Qt.MouseButton.LeftButton)
    assert section.tree.isEnabled()
    section.tree.topLevelItem(1).setCheckState(0, Qt.CheckState.Unchecked)  # search: not in this chat
    qtbot.mouseClick(section.clear_always, Qt.MouseButton.LeftButton)
    assert "cleared when you press OK" in section.always_label.text() and not section.clear_always.isEnabled()
    dialog.accept()
    assert w.store.require(conv).settings == {"temperature": 0.5, "tools": ["files"]}

    dialog = w.open_settings()  # shown as stored; OK without a change keeps it as it is
    qtbot.waitExposed(dialog)
    section = dialog.tools
    assert section.only.isChecked()
    assert [section.tree.topLevelItem(i).checkState(0) for i in range(2)] == [Qt.CheckState.Checked,
                                                                             Qt.CheckState.Unchecked]
    assert "No tool is always allowed" in section.always_label.text()
    dialog.accept()
    assert w.store.require(conv).settings == {"temperature": 0.5, "tools": ["files"]}

    dialog = w.open_settings()
    qtbot.waitExposed(dialog)
    dialog.tabs.setCurrentWidget(dialog.tools)
    qtbot.mouseClick(dialog.tools.all_tools, Qt.MouseButton.LeftButton)
    dialog.accept()
    assert w.store.require(conv).settings == {"temperature": 0.5}  # every enabled tool: nothing stored

    dialog = w.open_settings()  # a model that would not call on its own: its first reply must
    qtbot.waitExposed(dialog)
    dialog.tabs.setCurrentWidget(dialog.tools)
    assert not dialog.tools.must_call.isChecked()
    dialog.tools.must_call.click()
    dialog.accept()
    assert w.store.require(conv).settings == {"temperature": 0.5, "tool_choice": "required"}
    dialog = w.open_settings()
    qtbot.waitExposed(dialog)
    assert dialog.tools.must_call.isChecked()
    dialog.tools.must_call.setChecked(False)
    dialog.accept()
    assert w.store.require(conv).settings == {"temperature": 0.5}


def test_the_window_shows_the_tools_tab_and_stops_its_worker_when_it_closes(qtbot, windows):
    w = windows()
    dialog = w.open_preferences()
    qtbot.waitExposed(dialog)
    assert dialog.tools_panel is not None and dialog.tabs.tabText(1) == "Tools"
    dialog.reject()
    windows.close(w)
    assert w.tools.thread.isFinished()


def test_the_checklist_stores_servers_and_single_tools_and_keeps_what_it_cannot_show(qtbot):
    from app.chat_tools import ChatToolsSection, ToolChoice

    choices = [ToolChoice("files", True, (("read", "Read a file.\nIt reads.", True), ("write", "Write a file", False))),
               ToolChoice("search", True, ())]
    section = ChatToolsSection({"tools": ["files/read", "gone/tool", "search"]}, choices)
    qtbot.addWidget(section)
    files, search, gone = (section.tree.topLevelItem(i) for i in range(3))
    assert gone.text(0) == "gone (not configured now)" and gone.checkState(0) == Qt.CheckState.PartiallyChecked
    assert [(gone.child(i).text(0), gone.child(i).checkState(0)) for i in range(2)] == [
        ("All of its tools (listed once it has started)", Qt.CheckState.Unchecked), ("tool", Qt.CheckState.Checked)]
    assert files.checkState(0) == Qt.CheckState.PartiallyChecked and search.checkState(0) == Qt.CheckState.Checked
    assert search.child(0).text(0).startswith("All of its tools")  # not started: its tools are not known yet
    assert files.child(0).toolTip(0) == "Read a file.\nIt reads." and files.child(1).text(0) == "write (off in Preferences)"
    assert section.entries() == ["files/read", "gone/tool", "search"]  # untouched: as stored
    files.child(1).setCheckState(0, Qt.CheckState.Checked)
    assert files.checkState(0) == Qt.CheckState.Checked
    search.setCheckState(0, Qt.CheckState.Unchecked)
    assert section.entries() == ["files", "gone/tool"]
    gone.setCheckState(0, Qt.CheckState.Checked)  # all of a server whose tools are not known: the server
    assert section.entries() == ["files", "gone"]
    files.setCheckState(0, Qt.CheckState.Unchecked)
    gone.setCheckState(0, Qt.CheckState.Unchecked)
    assert section.entries() == []  # a chat without tools
    assert section.apply({"tools_always": ["x"]}) == {"tools": [], "tools_always": ["x"]}


@pytest.mark.parametrize("stored", ["files", 7, {"files": True}])
def test_a_damaged_tools_setting_reads_as_every_tool(qtbot, stored):
    from app.chat_tools import ChatToolsSection, ToolChoice

    section = ChatToolsSection({"tools": stored, "tools_always": "not a list"}, [ToolChoice("files")])
    qtbot.addWidget(section)
    assert section.all_tools.isChecked() and section.entries() is None
    assert not section.clear_always.isEnabled()
    assert section.apply({"tools": stored}) == {}


# running servers (the real host, the test servers in tests/mcp_servers/) ------------------------------------------
def status_of(tools: ToolWorkerHost, name: str):
    return next((s for s in tools.statuses if s.name == name), None)


def start_selected(qtbot, panel, name: str) -> None:
    panel.tree.setCurrentItem(wait_row(qtbot, panel, name))
    assert panel.restart_button.text() == "Start"
    qtbot.mouseClick(panel.restart_button, Qt.MouseButton.LeftButton)


def test_a_started_server_lists_its_tools_and_a_tool_is_switched_off(qtbot, paths, tools, prefs_dialog):
    registry(paths).add_stdio("calc", sys.executable, [str(SERVERS / "calculator.py")])
    panel = prefs_dialog().tools_panel
    row = wait_row(qtbot, panel, "calc", "stopped")
    assert row.child(0).text(0) == "Its tools are listed once it starts"
    assert status_of(tools, "calc").state == ServerState.STOPPED  # opening Preferences starts nothing
    start_selected(qtbot, panel, "calc")
    row = wait_row(qtbot, panel, "calc", "ready")
    assert row.text(1) == "ready · 5 tools on"
    add = panel.tool_row("calc", "add")
    assert add.checkState(0) == Qt.CheckState.Checked and add.toolTip(0) == "Add two numbers."
    assert add.text(2) == "Add two numbers." and panel.restart_button.text() == "Restart"
    panel.tool_row("calc", "multiply").setCheckState(0, Qt.CheckState.Unchecked)  # the person's click
    qtbot.waitUntil(lambda: "4 tools on" in panel.server_row("calc").text(1), timeout=TIMEOUT)
    assert registry(paths).get("calc").disabled_tools == frozenset({"multiply"})
    assert panel.tool_row("calc", "multiply").checkState(0) == Qt.CheckState.Unchecked
    assert not next(t for t in status_of(tools, "calc").tools if t.name == "multiply").enabled
    panel.tool_row("calc", "multiply").setCheckState(0, Qt.CheckState.Checked)
    qtbot.waitUntil(lambda: "5 tools on" in panel.server_row("calc").text(1), timeout=TIMEOUT)
    assert registry(paths).get("calc").disabled_tools == frozenset()


def test_a_failing_server_shows_its_error_and_the_end_of_its_error_output(qtbot, paths, tools, prefs_dialog, caplog):
    caplog.set_level(logging.DEBUG)
    registry(paths).add_stdio("broken", sys.executable, [str(SERVERS / "bad_start.py")], env={"BAD_TOKEN": SECRET})
    dialog = prefs_dialog()
    panel = dialog.tools_panel
    start_selected(qtbot, panel, "broken")
    row = wait_row(qtbot, panel, "broken", "failed")
    assert row.foreground(1).color().name() != panel.palette().text().color().name()  # in the error colour
    status = status_of(tools, "broken")
    assert status.error and status.error[:20].lower() in panel.details.text().lower()
    assert panel.error_toggle.isVisible() and not panel.error_output.isVisible()  # closed until asked for
    qtbot.mouseClick(panel.error_toggle, Qt.MouseButton.LeftButton)
    assert panel.error_output.isVisible() and panel.error_output.font().fixedPitch()
    assert "bad_start: cannot read my settings file" in panel.error_output.toPlainText()
    assert panel.error_output.toPlainText().count("\n") >= 1  # its lines as lines
    assert panel.restart_button.text() == "Restart" and panel.restart_button.isEnabled()
    dialog.grab().save(str(SHOT))  # looked at: the layout is readable with a failed server open
    for where in (every_text(dialog), caplog.text):
        assert SECRET not in where


def test_a_server_that_hangs_while_starting_never_holds_up_the_window(qtbot, paths, tools, prefs_dialog):
    """The start waits on the worker's pool: the UI keeps its event loop, the state says "starting…", and the
    registry's changes (another server added) go on meanwhile."""
    registry(paths).add_stdio("slow", sys.executable, [str(SERVERS / "hang.py"), "--at-start"])
    panel = prefs_dialog().tools_panel
    ticks: list = []
    timer = QTimer()
    timer.timeout.connect(lambda: ticks.append(panel.server_row("slow").text(1) if panel.server_row("slow") else ""))
    timer.start(20)
    start_selected(qtbot, panel, "slow")
    wait_row(qtbot, panel, "slow", "starting…")
    assert not panel.restart_button.isEnabled()  # no second start of a server starting
    type_command_server(qtbot, panel, "other", sys.executable, "-V")
    wait_row(qtbot, panel, "other", "stopped")
    assert panel.server_row("slow").text(1) == "starting…"  # still: the add did not wait for it
    qtbot.waitUntil(lambda: ticks.count("starting…") >= 10, timeout=TIMEOUT)  # the UI thread went on running
    timer.stop()


def test_restart_runs_a_new_process_and_closing_stops_the_servers(qtbot, paths, tools, prefs_dialog):
    registry(paths).add_stdio("calc", sys.executable, [str(SERVERS / "calculator.py")])
    conv = open_conversations(paths).create().id
    panel = prefs_dialog().tools_panel
    start_selected(qtbot, panel, "calc")
    wait_row(qtbot, panel, "calc", "ready")
    pid_tool = next(t.function for t in status_of(tools, "calc").tools if t.name == "pid")

    store = open_conversations(paths)

    def pid(call_id: str) -> int:
        call = ToolCall(call_id, pid_tool, "{}")
        store.append(conv, "assistant", "", tool_calls=(call,))  # the reply that made the call: a result answers it
        with qtbot.waitSignal(tools.worker.call_finished, timeout=TIMEOUT,
                              check_params_cb=lambda c, i, _o: (c, i) == (conv, call_id)) as got:
            tools.call(conv, call, 30)
        outcome = got.args[2]
        assert not outcome.is_error, outcome.text
        return int(outcome.text.strip())

    first = pid("call_a")
    with qtbot.waitSignal(tools.worker.changed, timeout=TIMEOUT, check_params_cb=lambda what, _p: what == "restart calc"):
        qtbot.mouseClick(panel.restart_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: status_of(tools, "calc").state == ServerState.READY
                    and panel.server_row("calc").text(1).startswith("ready"), timeout=TIMEOUT)
    second = pid("call_b")
    assert second != first and wait_for(lambda: process_dead(first))
    assert tools.stop(30_000)
    assert wait_for(lambda: process_dead(second))  # the servers stop with the app


# calls, for the chat's tool loop ------------------------------------------------------------------------------------
def test_a_call_stores_its_result_and_stop_ends_a_hanging_call(qtbot, paths, tools):
    registry(paths).add_stdio("calc", sys.executable, [str(SERVERS / "calculator.py")])
    registry(paths).add_stdio("slow", sys.executable, [str(SERVERS / "hang.py")])
    store = open_conversations(paths)
    conv = store.create().id
    with qtbot.waitSignal(tools.worker.tools_ready, timeout=TIMEOUT) as ready:
        tools.request_prepare.emit(conv, None)
    specs = {(s.server, s.name): s for s in ready.args[1]}
    assert ready.args[0] == conv and ("calc", "add") in specs and ("slow", "hang") in specs
    add = ToolCall("call_1", specs["calc", "add"].function, '{"a": 2, "b": 3}')
    hang = ToolCall("call_2", specs["slow", "hang"].function, "{}")
    store.append(conv, "user", "add and hang")
    store.append(conv, "assistant", "", finish="tool_calls", tool_calls=(add, hang))
    with qtbot.waitSignal(tools.worker.call_finished, timeout=TIMEOUT) as done:
        tools.call(conv, add, 30)
    assert done.args[:2] == [conv, "call_1"] and not done.args[2].is_error and done.args[2].text.strip() in ("5", "5.0")
    assert store.tool_runs(conv)["call_1"] == "done"
    assert store.messages(conv)[-1].role == "tool" and store.messages(conv)[-1].tool_call_id == "call_1"
    assert not tools.running(conv)

    finished: list = []
    tools.worker.call_finished.connect(lambda *a: finished.append(a))
    tools.call(conv, hang, 600)
    assert tools.running(conv)
    qtbot.waitUntil(lambda: store.tool_runs(conv).get("call_2") == "running", timeout=TIMEOUT)
    tools.cancel(conv)  # Stop
    qtbot.waitUntil(lambda: bool(finished), timeout=TIMEOUT)
    (cid, call_id, outcome), = finished
    assert (cid, call_id, outcome.is_error, outcome.text) == (conv, "call_2", True, STOPPED)
    assert store.tool_runs(conv)["call_2"] == "error" and store.messages(conv)[-1].content == STOPPED
    assert not tools.running(conv)
    store.close()


def test_a_call_the_store_refuses_still_finishes_with_a_readable_error(qtbot, paths, tools):
    registry(paths).add_stdio("calc", sys.executable, [str(SERVERS / "calculator.py")])
    with qtbot.waitSignal(tools.worker.call_finished, timeout=TIMEOUT) as done:
        tools.call("no-such-chat", ToolCall("call_1", "calc_add", "{}"), 30)
    cid, call_id, outcome = done.args
    assert (cid, call_id, outcome.is_error) == ("no-such-chat", "call_1", True)
    assert "no-such-chat" in outcome.text and "Traceback" not in outcome.text


def test_a_call_after_the_worker_stopped_is_answered_not_lost(qtbot, paths):
    tools = ToolWorkerHost(paths)
    assert tools.stop(30_000) and tools.stop()  # idempotent
    seen: list = []
    tools.worker.call_finished.connect(lambda *a: seen.append(a))
    token = tools.call("chat", ToolCall("call_1", "calc_add", "{}"), 30)
    assert token.cancelled and seen == [("chat", "call_1", ToolOutcome("Not run: Hearth is closing.", True))]


def test_a_url_server_typed_with_its_header_starts_and_the_header_stays_hidden(qtbot, paths, tools, prefs_dialog,
                                                                                caplog):
    caplog.set_level(logging.DEBUG)
    token = "tok-7c6b5a49"
    proc, url = start_http_calculator(token)
    try:
        dialog = prefs_dialog()
        panel = dialog.tools_panel
        qtbot.mouseClick(panel.add_button, Qt.MouseButton.LeftButton)
        add = panel.add_dialog
        add.kinds.setCurrentIndex(1)
        qtbot.keyClicks(add.name, "remote-calc")
        qtbot.keyClicks(add.url, url)
        qtbot.keyClicks(add.headers.rows[0][0], "Authorization:")  # the separator moves on to the hidden box
        qtbot.keyClicks(add.headers.rows[0][1], f"Bearer {token}")
        assert add.headers.rows[0][0].text() == "Authorization"
        qtbot.mouseClick(add.add_button, Qt.MouseButton.LeftButton)
        start_selected(qtbot, panel, "remote-calc")
        row = wait_row(qtbot, panel, "remote-calc", "ready")
        assert row.text(1) == "ready · 5 tools on"
        for where in (every_text(dialog), caplog.text, (paths.data / "tools.json").read_text()):
            assert token not in where
    finally:
        proc.kill()
        proc.wait()
