"""The chat header's model picker: the open chat's model, switchable, and a way to the Models dialog."""

from __future__ import annotations

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QComboBox, QWidget

from app.text import display_safe
from engine.types import LibraryModel

MANAGE = "\x00manage"  # the last entry's data: opens the Models dialog instead of choosing a model


class ModelPicker(QComboBox):
    chosen = Signal(str)  # the user picked this model for the open chat
    manage_requested = Signal()

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setAccessibleName("Model for this chat")
        self.setToolTip("The model this chat runs on; new chats use the one chosen last")
        self.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToContents)
        self.setMinimumContentsLength(18)
        self._current: str | None = None
        self.activated.connect(self._on_activated)
        self.set_models([])

    def set_models(self, models: list[LibraryModel], servers: list | tuple = ()) -> None:
        """Ready models (the ones a chat can run on), then each remote server's models under its name
        (NAME/MODEL; a server that could not list them shows why, greyed), then "Manage models…"."""
        self.blockSignals(True)
        self.clear()
        for m in models:
            if m.status == "ready":
                self.addItem(m.title, m.name)  # the library thread made the title display-safe (shown_model)
                self.setItemData(self.count() - 1, m.description or display_safe(m.path or m.name), 3)  # ToolTipRole
        for server, listed in servers:
            self.insertSeparator(self.count())
            self.addItem(f"{server.name} — {display_safe(server.base_url)}", None)
            self._disable(self.count() - 1)
            if isinstance(listed, str):
                self.addItem(f"    cannot list its models: {display_safe(listed)}"[:120], None)
                self.setItemData(self.count() - 1, display_safe(listed), 3)
                self._disable(self.count() - 1)
                continue
            for m in listed:
                self.addItem(display_safe(m.name), m.name)
                self.setItemData(self.count() - 1, f"on the server {server.name} ({display_safe(server.base_url)})", 3)
        self.insertSeparator(self.count())
        self.addItem("Manage models…", MANAGE)
        self.blockSignals(False)
        self.show_current(self._current)

    def _disable(self, index: int) -> None:
        """A heading or a note in the list: shown, not choosable."""
        item = self.model().item(index)
        if item is not None:
            item.setEnabled(False)

    def show_current(self, name: str | None) -> None:
        """Show ``name`` as the chat's model without reporting a choice (one not listed is shown as is)."""
        self._current = name
        self.blockSignals(True)
        index = self.findData(name) if name else -1
        if index < 0 and name:
            self.insertItem(0, name, name)  # e.g. still loading the list, or a model the library lost
            index = 0
        self.setCurrentIndex(index)
        self.blockSignals(False)

    def current_name(self) -> str | None:
        return self._current

    def _on_activated(self, index: int) -> None:
        name = self.itemData(index)
        if name == MANAGE:
            self.show_current(self._current)
            self.manage_requested.emit()
        elif name and name != self._current:
            self._current = name
            self.chosen.emit(name)
