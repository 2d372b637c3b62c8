"""Per-chat settings: the system prompt and the sampling parameters, checked before they are kept.

A chat keeps only what differs from what it would inherit (Preferences, or its model's recommended
values): a field left at its default follows the default when that changes. Each field says its default
and where it comes from. Which wins: the chat's own value, then the model's recommended value, then
Preferences (``engine.api.effective_settings``), so a model's recommendation hides Preferences' value;
the field says so, with Preferences' value beside it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from PySide6.QtCore import Signal
from PySide6.QtWidgets import (
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QDoubleSpinBox,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPlainTextEdit,
    QPushButton,
    QSpinBox,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from app.chat_tools import ChatToolsSection, ToolChoice
from app.theme import error_colour
from engine.errors import HearthError
from engine.types import DEFAULT_MAX_NEW_TOKENS, ContextPolicy, SamplingParams

CONTEXT_POLICY_CHOICES = ((ContextPolicy.STOP, "Stop"), (ContextPolicy.DROP_OLDEST, "Drop the oldest messages"))


def default_settings() -> dict:
    d = SamplingParams()
    return {"temperature": d.temperature, "top_p": d.top_p, "top_k": d.top_k, "min_p": d.min_p,
            "repeat_penalty": d.repetition_penalty, "max_new_tokens": DEFAULT_MAX_NEW_TOKENS, "seed": None,
            "prompt_lookup": d.prompt_lookup}


def turn_settings(settings: dict) -> tuple[SamplingParams, int]:
    """A chat's stored settings (from this dialog, defaults filled in) as the engine's sampling parameters
    and the longest reply; a bad value raises HearthError saying so."""
    values = {**default_settings(), **settings}
    try:
        seed = values["seed"]
        params = SamplingParams(temperature=float(values["temperature"]), top_k=int(values["top_k"]),
                                top_p=float(values["top_p"]), min_p=float(values["min_p"]),
                                repetition_penalty=float(values["repeat_penalty"]),
                                seed=None if seed is None else int(seed),
                                prompt_lookup=int(values["prompt_lookup"]))
        max_new_tokens = int(values["max_new_tokens"])
    except (TypeError, ValueError) as exc:
        raise HearthError(f"this chat's settings are not valid ({exc}); fix them in Chat settings") from None
    params.validate()
    if max_new_tokens < 1:
        raise HearthError("this chat's longest reply must be at least 1 token; fix it in Chat settings")
    return params, max_new_tokens


def usable_values(inherited: dict, settings: dict) -> tuple[dict, list[str]]:
    """The values to show: the chat's own where they are numbers (the seed: a whole number or None), else
    the inherited ones; and the names of the stored values that could not be shown."""
    values, unusable = dict(inherited), []
    for key, value in settings.items():
        try:
            if key == "seed":
                values[key] = None if value is None else int(value)
            elif key in inherited and key != "context_policy":
                number = float(value)
                if not math.isfinite(number):
                    raise ValueError(key)
                values[key] = number
            else:
                values[key] = value
        except (TypeError, ValueError):
            unusable.append(key)
    return values, unusable


# (key, decimals) of the fields that show their default, compared at the precision the box shows
INHERITABLE = (("temperature", 2), ("top_p", 2), ("top_k", 0), ("min_p", 2), ("repeat_penalty", 2), ("max_new_tokens", 0))
PRECEDENCE = "Which value a chat uses: its own (set here), else its model's recommended value, else Preferences."


def _shown(value, decimals: int) -> str:
    return f"{float(value):.{decimals}f}" if decimals else str(int(value))


def default_hint(key: str, inherited: Mapping, recommended: Mapping | None, preferences: Mapping | None) -> str:
    """"default: 0.20, recommended by the model (Preferences: 0.70)" or "default: 0.70, from Preferences";
    without sources (``preferences`` None) just the value."""
    decimals = dict(INHERITABLE)[key]
    text = f"default: {_shown(inherited[key], decimals)}"
    if recommended and key in recommended:
        mine = f" (Preferences: {_shown(preferences[key], decimals)})" if preferences and key in preferences else ""
        return f"{text}, recommended by the model{mine}"
    return f"{text}, from Preferences" if preferences is not None else text


class ChatSettingsDialog(QDialog):
    defaults_requested = Signal()  # "Defaults for all chats…": the window opens Preferences

    def __init__(self, system_prompt: str, settings: dict, parent=None, inherited: dict | None = None,
                 recommended: Mapping | None = None, preferences: Mapping | None = None,
                 tools: Sequence[ToolChoice] | None = None):
        """``inherited``: what the chat gets where it sets nothing (Preferences and its model's values);
        None: the built-in defaults. ``recommended``: the model's values among them, ``preferences``:
        Preferences' (so each field can say where its default comes from). ``tools``: the configured tool
        servers, for the Tools section (None: no such section)."""
        super().__init__(parent)
        self.setWindowTitle("Chat settings")
        self.setAccessibleName("Chat settings")
        self.original = dict(settings)
        self.inherited = {**default_settings(), **(inherited or {})}
        self.recommended, self.preferences = dict(recommended or {}), preferences
        values, unusable = usable_values(self.inherited, settings)
        self.hints: dict[str, QLabel] = {}
        self._boxes: dict[str, QDoubleSpinBox | QSpinBox] = {}
        outer = QVBoxLayout(self)
        page = QWidget()  # the settings; with tools, the first of two tabs
        layout = QVBoxLayout(page)
        self.precedence = QLabel(PRECEDENCE)
        self.precedence.setWordWrap(True)
        layout.addWidget(self.precedence)
        form = QFormLayout()
        self.system = QPlainTextEdit(system_prompt)
        self.system.setPlaceholderText("Optional: how the assistant should behave in this chat")
        self.system.setAccessibleName("System prompt")
        self.system.setMinimumHeight(90)
        form.addRow("System prompt", self.system)
        self.temperature = self._double(0.0, 2.0, 0.05, values["temperature"], "Temperature")
        form.addRow("Temperature", self._with_hint("temperature", self.temperature))
        self.top_p = self._double(0.0, 1.0, 0.01, values["top_p"], "Top-p")
        form.addRow("Top-p", self._with_hint("top_p", self.top_p))
        self.top_k = self._int(0, 1000, values["top_k"], "Top-k (0: off)")
        form.addRow("Top-k", self._with_hint("top_k", self.top_k))
        self.min_p = self._double(0.0, 1.0, 0.01, values["min_p"], "Min-p")
        form.addRow("Min-p", self._with_hint("min_p", self.min_p))
        self.repeat = self._double(0.5, 2.0, 0.01, values["repeat_penalty"], "Repetition penalty")
        form.addRow("Repetition penalty", self._with_hint("repeat_penalty", self.repeat))
        self.max_new = self._int(1, 8192, values["max_new_tokens"], "Longest reply in tokens")
        form.addRow("Longest reply (tokens)", self._with_hint("max_new_tokens", self.max_new))
        self.seed = QLineEdit("" if values["seed"] is None else str(values["seed"]))
        self.seed.setPlaceholderText("random")
        self.seed.setAccessibleName("Seed")
        form.addRow("Seed", self.seed)
        self._add_context_policy_row(form, settings)
        layout.addLayout(form)
        self.tools: ChatToolsSection | None = None
        self.tabs: QTabWidget | None = None
        if tools is not None:
            self.tools = ChatToolsSection(settings, tools)
            self.tabs = QTabWidget()
            self.tabs.setDocumentMode(True)
            layout.addStretch(1)
            self.tabs.addTab(page, "General")
            self.tabs.addTab(self.tools, "Tools")
            outer.addWidget(self.tabs, 1)
        else:
            layout.setContentsMargins(0, 0, 0, 0)
            outer.addWidget(page, 1)
        layout = outer
        self.error = QLabel("")
        self.error.setStyleSheet(f"color: {error_colour(self.palette())};")
        self.error.setWordWrap(True)
        if unusable:
            self.error.setText(f"This chat's stored {', '.join(unusable)} could not be used; the default is shown.")
        layout.addWidget(self.error)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel
                                   | QDialogButtonBox.StandardButton.RestoreDefaults)
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        self.reset = buttons.button(QDialogButtonBox.StandardButton.RestoreDefaults)
        self.reset.setText("Reset to defaults")
        self.reset.setToolTip("Use the defaults (Preferences, or the model's recommended values) for every setting")
        self.reset.clicked.connect(self.restore_defaults)
        self.global_defaults = QPushButton("Defaults for all chats…")
        self.global_defaults.setAccessibleName("Open Preferences")
        self.global_defaults.clicked.connect(self.defaults_requested)
        bottom = QHBoxLayout()
        bottom.addWidget(self.global_defaults)
        bottom.addWidget(buttons, 1)
        layout.addLayout(bottom)

    def _double(self, lo: float, hi: float, step: float, value: float, name: str) -> QDoubleSpinBox:
        box = QDoubleSpinBox()
        box.setRange(lo, hi)
        box.setSingleStep(step)
        box.setDecimals(2)
        box.setValue(float(value))
        box.setAccessibleName(name)
        return box

    def _int(self, lo: int, hi: int, value: int, name: str) -> QSpinBox:
        box = QSpinBox()
        box.setRange(lo, hi)
        box.setValue(int(value))
        box.setAccessibleName(name)
        return box

    def _add_context_policy_row(self, form: QFormLayout, settings: dict) -> None:
        """What the chat does once it is longer than the model's context. Written back only when the chat
        had a choice or one is made here, so a chat without one keeps following the default."""
        self.context_policy = QComboBox()
        self.context_policy.setAccessibleName("When the chat is longer than the model's context")
        for value, label in CONTEXT_POLICY_CHOICES:
            self.context_policy.addItem(label, str(value))
        self._stored_policy = settings.get("context_policy")
        self.context_policy.setCurrentIndex(max(0, self.context_policy.findData(self._stored_policy)))
        self._shown_policy = self.context_policy.currentData()
        form.addRow("When the chat is longer than the model's context", self.context_policy)

    def restore_defaults(self) -> None:
        d = self.inherited
        self.temperature.setValue(d["temperature"])
        self.top_p.setValue(d["top_p"])
        self.top_k.setValue(d["top_k"])
        self.min_p.setValue(d["min_p"])
        self.repeat.setValue(d["repeat_penalty"])
        self.max_new.setValue(d["max_new_tokens"])
        self.seed.setText("")

    def values(self) -> tuple[str, dict]:
        """(system prompt, settings); raises ValueError with a readable message if a value is bad."""
        seed_text = self.seed.text().strip()
        if seed_text and not seed_text.lstrip("-").isdigit():
            raise ValueError(f"the seed must be a whole number or empty (random), not {seed_text!r}")
        chosen = {"temperature": self.temperature.value(), "top_p": self.top_p.value(),
                  "top_k": self.top_k.value(), "min_p": self.min_p.value(),
                  "repeat_penalty": self.repeat.value(), "max_new_tokens": self.max_new.value(),
                  "seed": int(seed_text) if seed_text else None}
        try:
            turn_settings({**self.inherited, **chosen})
        except HearthError as exc:
            raise ValueError(str(exc)) from None
        overrides = self._overrides(chosen)
        policy = self.context_policy.currentData()
        if self._stored_policy is not None or policy != self._shown_policy:
            overrides["context_policy"] = policy  # else the chat keeps following the default policy
        if self.tools is not None:
            self.tools.apply(overrides)
        return self.system.toPlainText(), overrides

    def accept(self) -> None:
        try:
            self.values()
        except ValueError as exc:
            self.error.setText(str(exc))
            return
        super().accept()

    # what is inherited ------------------------------------------------------------------------------------
    def _box(self, key: str) -> QDoubleSpinBox | QSpinBox:
        return self._boxes[key]

    def _with_hint(self, key: str, box: QDoubleSpinBox | QSpinBox) -> QWidget:
        """The box with a greyed "default: 0.7" note beside it, kept up to date as the value changes."""
        hint = QLabel("")
        hint.setEnabled(False)  # a note, not a control
        hint.setAccessibleName(f"{box.accessibleName()}: default")
        self.hints[key], self._boxes[key] = hint, box
        box.valueChanged.connect(lambda _value: self._update_hint(key))
        row = QWidget()
        line = QHBoxLayout(row)
        line.setContentsMargins(0, 0, 0, 0)
        box.setFixedWidth(110)  # the same for every field, whatever its note says
        line.addWidget(box)
        line.addWidget(hint, 1)
        self._update_hint(key)
        return row

    def _is_inherited(self, key: str, decimals: int) -> bool:
        """The field shows what the chat would inherit (compared at the precision the box shows)."""
        return round(float(self._box(key).value()), decimals) == round(float(self.inherited[key]), decimals)

    def _update_hint(self, key: str) -> None:
        hint = default_hint(key, self.inherited, self.recommended, self.preferences)
        inherited = self._is_inherited(key, dict(INHERITABLE)[key])
        self.hints[key].setText(hint if inherited else f"{hint} · changed for this chat")

    def _overrides(self, chosen: dict) -> dict:
        """The chat's own settings: the values that differ from the inherited ones, the seed when set, and
        any stored key this dialog does not show (kept as it was)."""
        shown = {key for key, _ in INHERITABLE} | {"seed"}
        kept = {key: value for key, value in self.original.items() if key not in shown}
        for key, decimals in INHERITABLE:
            if not self._is_inherited(key, decimals):
                kept[key] = chosen[key]
        if chosen["seed"] is not None:
            kept["seed"] = chosen["seed"]
        return kept

    def set_inherited(self, inherited: dict, preferences: Mapping | None = None) -> None:
        """The defaults changed (Preferences saved meanwhile): fields that were inherited follow them."""
        following = [key for key, decimals in INHERITABLE if self._is_inherited(key, decimals)]
        self.inherited = {**default_settings(), **inherited}
        if preferences is not None:
            self.preferences = preferences
        for key in following:
            self._box(key).setValue(self.inherited[key])
        for key, _ in INHERITABLE:
            self._update_hint(key)
