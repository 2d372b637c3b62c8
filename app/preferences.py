"""Edit → Preferences…: the defaults every chat starts from, kept in the data dir's preferences.json.

A chat's own settings (Chat settings) beat these, and a model's recommended values sit in between
(``engine.api.effective_settings``): a field the current model recommends a value for says so beside
it, since changing it here does not change that model's chats. The dialog saves on OK and stays open
with the reason when it cannot (a full disk, a value out of range).
"""

from __future__ import annotations

from collections.abc import Mapping

from PySide6.QtWidgets import (
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QDoubleSpinBox,
    QFormLayout,
    QLabel,
    QPlainTextEdit,
    QSpinBox,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from app.theme import error_colour
from app.tool_worker import ToolWorkerHost
from app.tools_panel import ToolsPanel
from engine.api import CONTEXT_POLICIES, SETTING_LIMITS, HearthPaths, Preferences, save_preferences
from engine.errors import HearthError

POLICY_LABELS = {"stop": "Stop the reply", "drop_oldest": "Drop the oldest messages"}
# (key, label, step, decimals) of the numeric settings, in the order shown
NUMERIC_FIELDS = (("temperature", "Temperature", 0.05, 2), ("top_p", "Top-p", 0.01, 2), ("top_k", "Top-k (0: off)", 1, 0),
                  ("min_p", "Min-p", 0.01, 2), ("repeat_penalty", "Repetition penalty", 0.01, 2),
                  ("max_new_tokens", "Longest reply (tokens)", 1, 0),
                  ("prompt_lookup", "Prompt lookup (draft tokens, 0 = off)", 1, 0))


def number_box(key: str, step: float, decimals: int, value: float, name: str) -> QDoubleSpinBox | QSpinBox:
    """A spin box limited to the setting's bounds (engine.preferences.SETTING_LIMITS)."""
    lo, hi = SETTING_LIMITS[key]
    if decimals:
        box = QDoubleSpinBox()
        box.setDecimals(decimals)
        box.setSingleStep(step)
        box.setRange(lo, hi)
        box.setValue(float(value))
    else:
        box = QSpinBox()
        box.setRange(int(lo), int(hi))
        box.setValue(int(value))
    box.setAccessibleName(name)
    return box


class PreferencesDialog(QDialog):
    def __init__(self, paths: HearthPaths, prefs: Preferences, parent: QWidget | None = None,
                 recommended: Mapping | None = None, model_title: str = "", tools: ToolWorkerHost | None = None):
        """``recommended``: the current chat's model's recommended values, which beat these in its chats.
        ``tools``: the app's tool worker, for the Tools tab (none: no such tab)."""
        super().__init__(parent)
        self.paths = paths
        self.prefs = prefs
        self.saved: Preferences | None = None  # what OK kept
        self.setWindowTitle("Preferences")
        self.setAccessibleName("Preferences")
        self.setMinimumWidth(440)
        outer = QVBoxLayout(self)
        self.tabs = QTabWidget()
        self.tabs.setDocumentMode(True)
        outer.addWidget(self.tabs, 1)
        chats = QWidget()
        self.tabs.addTab(chats, "Chats")
        layout = QVBoxLayout(chats)
        self.note = note = QLabel("Defaults for every chat. Which value a chat uses: its own (Chat settings), else its "
                      "model's recommended value, else the one here.")
        note.setWordWrap(True)
        layout.addWidget(note)
        form = QFormLayout()
        self.system = QPlainTextEdit(prefs.system_prompt)
        self.system.setPlaceholderText("Optional: how the assistant should behave in new chats")
        self.system.setAccessibleName("System prompt for new chats")
        self.system.setMinimumHeight(80)
        form.addRow("System prompt for new chats", self.system)
        self.boxes: dict[str, QDoubleSpinBox | QSpinBox] = {}
        self.notes: dict[str, QLabel] = {}  # the fields the current model overrides
        model = model_title or "the current model"
        for key, label, step, decimals in NUMERIC_FIELDS:
            self.boxes[key] = number_box(key, step, decimals, getattr(prefs, key), label)
            if recommended and key in recommended:
                value = f"{float(recommended[key]):.{decimals}f}" if decimals else str(int(recommended[key]))
                self.notes[key] = QLabel(f"{model} recommends {value}: its chats use that")
                self.notes[key].setEnabled(False)  # a note, not a control
                self.notes[key].setToolTip("A model's recommended value beats Preferences; a chat's own value "
                                           "(Chat settings) beats both")
                self.notes[key].setWordWrap(True)  # under its box: never cut off, never widens the dialog
                form.addRow(label, self.boxes[key])
                form.addRow("", self.notes[key])
            else:
                form.addRow(label, self.boxes[key])
        self.policy = QComboBox()
        self.policy.setAccessibleName("When the context is full")
        for policy in CONTEXT_POLICIES:
            self.policy.addItem(POLICY_LABELS.get(policy, policy), policy)
        self.policy.setCurrentIndex(max(self.policy.findData(prefs.context_policy), 0))
        form.addRow("When the context is full", self.policy)
        layout.addLayout(form)
        layout.addStretch(1)
        self.tools_panel: ToolsPanel | None = None
        if tools is not None:
            self.tools_panel = ToolsPanel(tools, prefs)
            self.tabs.addTab(self.tools_panel, "Tools")
            self.resize(760, 700)
        layout = outer
        self.error = QLabel("")
        self.error.setStyleSheet(f"color: {error_colour(self.palette())};")
        self.error.setWordWrap(True)
        layout.addWidget(self.error)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel
                                   | QDialogButtonBox.StandardButton.RestoreDefaults)
        self.ok = buttons.button(QDialogButtonBox.StandardButton.Ok)
        self.reset = buttons.button(QDialogButtonBox.StandardButton.RestoreDefaults)
        self.reset.setText("Reset to defaults")
        self.reset.clicked.connect(lambda: self.show_values(Preferences()))
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        layout.addWidget(buttons)

    def show_values(self, prefs: Preferences) -> None:
        self.system.setPlainText(prefs.system_prompt)
        for key, box in self.boxes.items():
            box.setValue(getattr(prefs, key))
        self.policy.setCurrentIndex(max(self.policy.findData(prefs.context_policy), 0))
        if self.tools_panel is not None:
            self.tools_panel.show_limits(prefs)

    def values(self) -> Preferences:
        limits = (self.tools_panel.limits() if self.tools_panel is not None
                  else {"tool_steps": self.prefs.tool_steps, "tool_timeout_s": self.prefs.tool_timeout_s})
        return Preferences(system_prompt=self.system.toPlainText(), context_policy=self.policy.currentData(),
                           **{key: box.value() for key, box in self.boxes.items()}, **limits)

    def accept(self) -> None:
        prefs = self.values()
        try:
            save_preferences(self.paths, prefs)
        except HearthError as exc:
            self.error.setText(f"Not saved: {exc}")
            return
        except OSError as exc:
            self.error.setText(f"Not saved: {self.paths.data} could not be written ({exc.strerror or exc})")
            return
        self.saved = prefs
        super().accept()
