"""Per-chat settings: the system prompt and the sampling parameters, checked before they are kept."""

from __future__ import annotations

from PySide6.QtWidgets import (
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QDoubleSpinBox,
    QFormLayout,
    QLabel,
    QLineEdit,
    QPlainTextEdit,
    QSpinBox,
    QVBoxLayout,
)

from engine.errors import HearthError
from engine.types import DEFAULT_MAX_NEW_TOKENS, ContextPolicy, SamplingParams

CONTEXT_POLICY_CHOICES = ((ContextPolicy.STOP, "Stop"), (ContextPolicy.DROP_OLDEST, "Drop the oldest messages"))


def default_settings() -> dict:
    d = SamplingParams()
    return {"temperature": d.temperature, "top_p": d.top_p, "top_k": d.top_k, "min_p": d.min_p,
            "repeat_penalty": d.repetition_penalty, "max_new_tokens": DEFAULT_MAX_NEW_TOKENS, "seed": None}


def turn_settings(settings: dict) -> tuple[SamplingParams, int]:
    """A chat's stored settings (from this dialog, defaults filled in) as the engine's sampling parameters
    and the longest reply; a bad value raises HearthError saying so."""
    values = {**default_settings(), **settings}
    try:
        seed = values["seed"]
        params = SamplingParams(temperature=float(values["temperature"]), top_k=int(values["top_k"]),
                                top_p=float(values["top_p"]), min_p=float(values["min_p"]),
                                repetition_penalty=float(values["repeat_penalty"]),
                                seed=None if seed is None else int(seed))
        max_new_tokens = int(values["max_new_tokens"])
    except (TypeError, ValueError) as exc:
        raise HearthError(f"this chat's settings are not valid ({exc}); fix them in Chat settings") from None
    params.validate()
    if max_new_tokens < 1:
        raise HearthError("this chat's longest reply must be at least 1 token; fix it in Chat settings")
    return params, max_new_tokens


class ChatSettingsDialog(QDialog):
    def __init__(self, system_prompt: str, settings: dict, parent=None):
        super().__init__(parent)
        self.setWindowTitle("Chat settings")
        self.setAccessibleName("Chat settings")
        values = {**default_settings(), **settings}
        layout = QVBoxLayout(self)
        form = QFormLayout()
        self.system = QPlainTextEdit(system_prompt)
        self.system.setPlaceholderText("Optional: how the assistant should behave in this chat")
        self.system.setAccessibleName("System prompt")
        self.system.setMinimumHeight(90)
        form.addRow("System prompt", self.system)
        self.temperature = self._double(0.0, 2.0, 0.05, values["temperature"], "Temperature")
        form.addRow("Temperature", self.temperature)
        self.top_p = self._double(0.0, 1.0, 0.01, values["top_p"], "Top-p")
        form.addRow("Top-p", self.top_p)
        self.top_k = self._int(0, 1000, values["top_k"], "Top-k (0: off)")
        form.addRow("Top-k", self.top_k)
        self.min_p = self._double(0.0, 1.0, 0.01, values["min_p"], "Min-p")
        form.addRow("Min-p", self.min_p)
        self.repeat = self._double(0.5, 2.0, 0.01, values["repeat_penalty"], "Repetition penalty")
        form.addRow("Repetition penalty", self.repeat)
        self.max_new = self._int(1, 8192, values["max_new_tokens"], "Longest reply in tokens")
        form.addRow("Longest reply (tokens)", self.max_new)
        self.seed = QLineEdit("" if values["seed"] is None else str(values["seed"]))
        self.seed.setPlaceholderText("random")
        self.seed.setAccessibleName("Seed")
        form.addRow("Seed", self.seed)
        self._add_context_policy_row(form, settings)
        layout.addLayout(form)
        self.error = QLabel("")
        self.error.setStyleSheet("color: #c0392b;")
        self.error.setWordWrap(True)
        layout.addWidget(self.error)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel
                                   | QDialogButtonBox.StandardButton.RestoreDefaults)
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        buttons.button(QDialogButtonBox.StandardButton.RestoreDefaults).clicked.connect(self.restore_defaults)
        layout.addWidget(buttons)

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
        d = default_settings()
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
        settings = {"temperature": self.temperature.value(), "top_p": self.top_p.value(),
                    "top_k": self.top_k.value(), "min_p": self.min_p.value(),
                    "repeat_penalty": self.repeat.value(), "max_new_tokens": self.max_new.value(),
                    "seed": int(seed_text) if seed_text else None}
        policy = self.context_policy.currentData()
        if self._stored_policy is not None or policy != self._shown_policy:
            settings["context_policy"] = policy
        try:
            turn_settings(settings)
        except HearthError as exc:
            raise ValueError(str(exc)) from None
        return self.system.toPlainText(), settings

    def accept(self) -> None:
        try:
            self.values()
        except ValueError as exc:
            self.error.setText(str(exc))
            return
        super().accept()
