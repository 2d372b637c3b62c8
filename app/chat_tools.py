"""Chat settings → Tools: which of the enabled tools a chat may use, and its "Always allow" list.

A chat stores its choice under the settings key "tools": absent (None) for every enabled tool, else a list
of "server" (all of that server's tools, those it adds later included) and "server/tool" entries — an empty
list is a chat without tools. "tools_always" lists the functions the person let run without asking in this
chat; here it can only be cleared. What the dialog does not change it writes back as it was, so opening and
pressing OK never widens or narrows a chat's tools.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QButtonGroup,
    QCheckBox,
    QHBoxLayout,
    QLabel,
    QPushButton,
    QRadioButton,
    QTreeWidget,
    QTreeWidgetItem,
    QVBoxLayout,
    QWidget,
)

from app.text import display_safe, display_safe_lines
from engine.api import always_allowed

SERVER_ROLE = Qt.ItemDataRole.UserRole
TOOL_ROLE = Qt.ItemDataRole.UserRole + 1
ALL_ROLE = Qt.ItemDataRole.UserRole + 2  # a server row whose tools are all known, or the "all of its tools" row
TOOLTIP_CHARS = 2000
SHOWN_ALWAYS = 8  # the "Always allow" names listed before "and N more"


SETTINGS_CHOICE = "tool_choice"  # "required": a message's first reply must call (app/tool_loop.py reads it)


@dataclass(frozen=True)
class ToolChoice:
    """One configured server as the chat's checklist shows it: its tools as far as they are known (a server
    that has not started yet lists none) and whether Preferences has it on."""

    server: str
    enabled: bool = True
    tools: tuple[tuple[str, str, bool], ...] = ()  # (tool, description, on in Preferences)


def tool_choices(configs: Sequence, statuses: Sequence) -> list[ToolChoice]:
    """The checklist from the tool worker's last word (``ToolWorkerHost.configs`` / ``.statuses``)."""
    listed = {s.name: s for s in statuses}
    choices = []
    for config in configs:
        status = listed.get(config.name)
        tools = tuple((t.name, t.description, t.enabled) for t in status.tools) if status is not None else ()
        choices.append(ToolChoice(config.name, config.enabled, tools))
    return choices


def parse_entries(value: object) -> list[str] | None:
    """A chat's stored "tools" as the turn reads it (engine/tools/loop.py ``chat_tools``): None (every enabled
    tool) unless it is a list, whose text entries count."""
    if isinstance(value, list):
        return [v for v in value if isinstance(v, str)]
    return None


class ChatToolsSection(QWidget):
    def __init__(self, settings: dict, choices: Sequence[ToolChoice], parent: QWidget | None = None):
        super().__init__(parent)
        self.stored = parse_entries(settings.get("tools"))
        self.always = sorted(always_allowed(settings))
        self.cleared_always = False
        self._touched = False  # the person changed the choice: write it from the widgets
        layout = QVBoxLayout(self)
        intro = QLabel("The tools this chat may offer the model (Preferences → Tools says which are on). "
                       "The chat asks before each call unless you chose Always allow.")
        intro.setWordWrap(True)
        intro.setEnabled(False)  # a note, not a control
        layout.addWidget(intro)
        self.all_tools = QRadioButton("All enabled tools")
        self.all_tools.setToolTip("Every tool switched on in Preferences → Tools, those added later included")
        self.only = QRadioButton("Only these:")
        group = QButtonGroup(self)
        group.addButton(self.all_tools)
        group.addButton(self.only)
        row = QHBoxLayout()
        row.addWidget(self.all_tools)
        row.addWidget(self.only)
        row.addStretch(1)
        layout.addLayout(row)
        self.tree = QTreeWidget()
        self.tree.setHeaderHidden(True)
        self.tree.setAccessibleName("The tools this chat may use")
        self.tree.setMinimumHeight(160)
        self.tree.setUniformRowHeights(True)
        layout.addWidget(self.tree, 1)
        self.empty = QLabel("No tool servers yet: add them in Preferences → Tools.")
        self.empty.setEnabled(False)
        layout.addWidget(self.empty)
        self._fill(choices)
        (self.all_tools if self.stored is None else self.only).setChecked(True)
        self.tree.setEnabled(self.stored is not None)
        self.only.toggled.connect(self._on_mode)
        self.tree.itemChanged.connect(lambda _item, _col: setattr(self, "_touched", True))
        always = QHBoxLayout()
        self.always_label = QLabel("")
        self.always_label.setWordWrap(True)
        self.always_label.setAccessibleName("Tools always allowed in this chat")
        self.clear_always = QPushButton("Clear")
        self.clear_always.setAccessibleName("Clear the tools always allowed in this chat")
        self.clear_always.setToolTip("Ask again before each of these tools runs in this chat")
        self.clear_always.clicked.connect(self._clear_always)
        always.addWidget(self.always_label, 1)
        always.addWidget(self.clear_always)
        layout.addLayout(always)
        self._show_always()
        self.must_call = QCheckBox("The first reply to each message must call a tool")
        self.must_call.setToolTip("Constrained decoding makes the model's first reply a call of one of this chat's "
                                  "tools (for a model that would not call on its own); later replies decide "
                                  "for themselves")
        self.must_call.setChecked(settings.get(SETTINGS_CHOICE) == "required")
        layout.addWidget(self.must_call)

    def _fill(self, choices: Sequence[ToolChoice]) -> None:
        stored = set(self.stored or ())
        known = {c.server for c in choices}
        extra: dict[str, list[str]] = {}  # entries naming a server that is not configured now: kept, shown
        for entry in self.stored or ():
            server = entry.split("/", 1)[0]
            if server not in known:
                extra.setdefault(server, [])
                if "/" in entry:
                    extra[server].append(entry.split("/", 1)[1])
        rows = [*choices, *(ToolChoice(s, True, tuple((t, "", True) for t in tools)) for s, tools in extra.items())]
        for choice in rows:
            label = display_safe(choice.server)
            if choice.server in extra:
                label += " (not configured now)"
            elif not choice.enabled:
                label += " (off in Preferences)"
            top = QTreeWidgetItem([label])
            top.setData(0, SERVER_ROLE, choice.server)
            top.setFlags(top.flags() | Qt.ItemFlag.ItemIsUserCheckable | Qt.ItemFlag.ItemIsAutoTristate)
            names = [t[0] for t in choice.tools]
            names += sorted(e.split("/", 1)[1] for e in stored
                            if e.startswith(choice.server + "/") and e.split("/", 1)[1] not in names)
            details = {t[0]: t for t in choice.tools}
            whole = self.stored is None or choice.server in stored
            if not choice.tools or choice.server in extra:  # its tools are not known: "all of them" is a row
                every = QTreeWidgetItem(["All of its tools (listed once it has started)"])
                every.setData(0, SERVER_ROLE, choice.server)
                every.setData(0, ALL_ROLE, True)
                every.setToolTip(0, "Checked, the chat may use every tool this server offers")
                every.setFlags(every.flags() | Qt.ItemFlag.ItemIsUserCheckable)
                every.setCheckState(0, Qt.CheckState.Checked if whole else Qt.CheckState.Unchecked)
                top.addChild(every)
            else:
                top.setData(0, ALL_ROLE, True)  # checked as a whole: the server, with tools it adds later
            for name in names:
                _tool, description, on = details.get(name, (name, "", True))
                child = QTreeWidgetItem([display_safe(name) + ("" if on else " (off in Preferences)")])
                child.setData(0, SERVER_ROLE, choice.server)
                child.setData(0, TOOL_ROLE, name)
                child.setToolTip(0, display_safe_lines((description or "")[:TOOLTIP_CHARS]))
                child.setFlags(child.flags() | Qt.ItemFlag.ItemIsUserCheckable)
                child.setCheckState(0, Qt.CheckState.Checked if whole or f"{choice.server}/{name}" in stored
                                    else Qt.CheckState.Unchecked)
                top.addChild(child)
            self.tree.addTopLevelItem(top)
            top.setExpanded(True)
        self.empty.setVisible(not rows)

    def _on_mode(self, only: bool) -> None:
        self._touched = True
        self.tree.setEnabled(only)

    def _clear_always(self) -> None:
        self.cleared_always = True
        self._show_always()

    def _show_always(self) -> None:
        names = [] if self.cleared_always else self.always
        if names:
            more = len(names) - SHOWN_ALWAYS
            shown = ", ".join(display_safe(n) for n in names[:SHOWN_ALWAYS]) + (f" and {more} more" if more > 0 else "")
            self.always_label.setText(f"Always allowed in this chat: {shown}")
        elif self.cleared_always:
            self.always_label.setText("Always allowed in this chat: none (cleared when you press OK)")
        else:
            self.always_label.setText("No tool is always allowed in this chat: each asks before it runs.")
        self.clear_always.setEnabled(bool(names))

    def entries(self) -> list[str] | None:
        """The choice as the "tools" setting: None for every enabled tool, else the checked entries."""
        if not self._touched:
            return self.stored
        if self.all_tools.isChecked():
            return None
        chosen: list[str] = []
        for i in range(self.tree.topLevelItemCount()):
            top = self.tree.topLevelItem(i)
            server = top.data(0, SERVER_ROLE)
            rows = [top.child(j) for j in range(top.childCount())]
            checked = [r for r in rows if r.checkState(0) == Qt.CheckState.Checked]
            if (top.data(0, ALL_ROLE) and top.checkState(0) == Qt.CheckState.Checked) or \
                    any(r.data(0, ALL_ROLE) for r in checked):
                chosen.append(server)  # every tool of it, those it adds later too
            else:
                chosen.extend(f"{server}/{r.data(0, TOOL_ROLE)}" for r in checked)
        return chosen

    def apply(self, settings: dict) -> dict:
        """``settings`` with this section's keys written: absent where the chat follows the default."""
        entries = self.entries()
        if entries is None:
            settings.pop("tools", None)
        else:
            settings["tools"] = entries
        if self.cleared_always:
            settings.pop("tools_always", None)
        if self.must_call.isChecked():
            settings[SETTINGS_CHOICE] = "required"
        else:
            settings.pop(SETTINGS_CHOICE, None)
        return settings
