"""The window's shell around the chat (issue 18): the View menu (theme, text size), Help → Keyboard
shortcuts and About, the rename dialog, and the sidebar's filter, context menu and pins.

A mixin of MainWindow, kept apart so the window's own module stays about conversations and turns.
It expects the window's ``settings``, ``store``, ``sidebar``, ``transcript``, ``composer``, menus
and actions to exist when ``_build_shell`` runs.
"""

from __future__ import annotations

import html
import logging

from PySide6.QtCore import QPoint, Qt
from PySide6.QtGui import QAction, QActionGroup, QKeySequence
from PySide6.QtWidgets import QMenu

from app.rename_dialog import RenameDialog
from app.shortcuts_dialog import ShortcutsDialog
from app.sidebar import ID_ROLE, ConversationFilter
from app.text_size import MAX_PT, MIN_PT, apply_size, clamp, default_size, parse_size
from app.theme import ThemeController, ThemeMode, parse_mode
from engine.api import hearth_version
from engine.errors import ConversationError
from engine.types import ModelInfo

log = logging.getLogger(__name__)
THEME_KEY, TEXT_SIZE_KEY = "theme", "text_size"
THEME_NAMES = {ThemeMode.SYSTEM: "&System", ThemeMode.LIGHT: "&Light", ThemeMode.DARK: "&Dark"}


def about_text(info: ModelInfo | None) -> str:
    model = html.escape(f"{info.name} · {info.weights} · {info.provider.upper()}") if info else "none loaded yet"
    return (f"<h3>Hearth {html.escape(hearth_version())}</h3>"
            "<p>Chat with a local language model that never makes you wait twice for the same conversation.</p>"
            f"<p><b>Model:</b> {model}</p>")


class ShellMixin:
    # building ---------------------------------------------------------------------------------------------
    def _build_shell(self) -> None:
        self.theme = ThemeController(self)
        self._build_view_menu()
        self._build_shell_help()
        self._build_sidebar_shell()
        self.theme.set_mode(parse_mode(self.settings.value(THEME_KEY)))
        self._sync_theme_actions()
        self._text_size: int | None = parse_size(self.settings.value(TEXT_SIZE_KEY))
        self._apply_text_size()

    def _build_view_menu(self) -> None:
        view = self.view_menu = QMenu("&View", self)
        self.menuBar().insertMenu(self.chat_menu.menuAction(), view)
        themes = view.addMenu("&Theme")
        group = QActionGroup(self)
        self.theme_actions: dict[ThemeMode, QAction] = {}
        for mode, name in THEME_NAMES.items():
            act = themes.addAction(name)
            act.setCheckable(True)
            act.setActionGroup(group)
            act.triggered.connect(lambda _=False, m=mode: self.set_theme(m))
            self.theme_actions[mode] = act
        view.addSeparator()
        self.act_larger = self._action("&Larger text", "Ctrl+=", self.larger_text, view)
        self.act_larger.setShortcuts([QKeySequence("Ctrl+="), QKeySequence("Ctrl++")])
        self.act_smaller = self._action("S&maller text", "Ctrl+-", self.smaller_text, view)
        self.act_reset_text = self._action("&Reset text size", "Ctrl+0", self.reset_text_size, view)
        view.addSeparator()
        self.act_filter = self._action("&Filter chats…", "Ctrl+Shift+F", self.focus_filter, view)

    def _build_shell_help(self) -> None:
        first = self.help_menu.actions()[0] if self.help_menu.actions() else None
        self.act_shortcuts = QAction("&Keyboard shortcuts", self)
        self.act_shortcuts.setShortcuts([QKeySequence("F1"), QKeySequence("Ctrl+/")])
        self.act_shortcuts.triggered.connect(self.show_shortcuts)
        self.help_menu.insertAction(first, self.act_shortcuts)
        if first is not None:
            self.help_menu.insertSeparator(first)

    def _build_sidebar_shell(self) -> None:
        self.filter_box = ConversationFilter(self.sidebar)
        self.filter_box.setPlaceholderText(f"Filter chats ({self.act_filter.shortcut().toString()})")
        self.sidebar.parentWidget().layout().insertWidget(1, self.filter_box)
        self.act_pin = QAction("&Pin to top", self)
        self.act_pin.setCheckable(True)
        self.act_pin.setShortcut(QKeySequence("Ctrl+Shift+P"))
        self.act_pin.toggled.connect(self._pin_toggled)
        self.chat_menu.insertAction(self.act_rename, self.act_pin)
        self.sidebar.setContextMenuPolicy(Qt.ContextMenuPolicy.CustomContextMenu)
        self.sidebar.customContextMenuRequested.connect(self._show_sidebar_menu)
        self.sidebar.currentItemChanged.connect(lambda *_: self._update_pin_action())
        self._update_pin_action()

    # theme ------------------------------------------------------------------------------------------------
    def set_theme(self, mode: ThemeMode) -> None:
        """View → Theme: remembered; every message is drawn again in the new colours."""
        self.settings.setValue(THEME_KEY, str(mode))
        self.theme.set_mode(mode)
        self._sync_theme_actions()

    def _sync_theme_actions(self) -> None:
        self.theme_actions[self.theme.mode].setChecked(True)

    # text size --------------------------------------------------------------------------------------------
    @property
    def text_size(self) -> int:
        return self._text_size if self._text_size is not None else default_size()

    def larger_text(self) -> None:
        self._set_text_size(self.text_size + 1)

    def smaller_text(self) -> None:
        self._set_text_size(self.text_size - 1)

    def reset_text_size(self) -> None:
        self._text_size = None
        self.settings.remove(TEXT_SIZE_KEY)
        self._apply_text_size()

    def _set_text_size(self, points: int) -> None:
        self._text_size = clamp(points)
        self.settings.setValue(TEXT_SIZE_KEY, self._text_size)
        self._apply_text_size()

    def _apply_text_size(self) -> None:
        size = self.text_size
        apply_size([self.transcript, self.composer], size)
        self.act_larger.setEnabled(size < MAX_PT)
        self.act_smaller.setEnabled(size > MIN_PT)

    # help -------------------------------------------------------------------------------------------------
    def show_shortcuts(self) -> ShortcutsDialog:
        dialog = ShortcutsDialog(self)
        dialog.open()
        return dialog

    # rename -----------------------------------------------------------------------------------------------
    def open_rename(self, conversation: str) -> RenameDialog:
        conv = self.store.require(conversation)
        dialog = RenameDialog(conv.title, self)

        def keep() -> None:
            try:
                self.store.rename(conversation, dialog.title())
            except ConversationError as exc:  # deleted meanwhile (the browser, hearth-cli)
                self.notice.say(f"The chat could not be renamed: {exc}")
                return
            self._update_title(conversation)

        dialog.accepted.connect(keep)
        dialog.open()
        return dialog

    # the sidebar: filter, pins, context menu ----------------------------------------------------------------
    def focus_filter(self) -> None:
        self.filter_box.setFocus()
        self.filter_box.selectAll()

    def set_pinned(self, conversation: str, pinned: bool) -> None:
        """Pin a chat to the top of the list (stored, so it stays pinned after a restart)."""
        try:
            self.store.set_pinned(conversation, pinned)
        except ConversationError as exc:
            self.notice.say(f"The chat could not be pinned: {exc}")
            return
        self._sync_list()  # pinned first; an unpinned chat goes back to where its last activity puts it
        self._update_pin_action()

    def _pin_toggled(self, checked: bool) -> None:
        if self.current is not None and checked != self.sidebar.is_pinned(self.current):
            self.set_pinned(self.current, checked)

    def _update_pin_action(self) -> None:
        current = self.current
        self.act_pin.setEnabled(current is not None)
        self.act_pin.blockSignals(True)  # showing the state is not toggling it
        self.act_pin.setChecked(current is not None and self.sidebar.is_pinned(current))
        self.act_pin.blockSignals(False)

    def sidebar_menu(self, conversation: str) -> QMenu:
        """The context menu of a chat in the list."""
        menu = QMenu(self)
        pinned = self.sidebar.is_pinned(conversation)
        menu.addAction("Unpin" if pinned else "Pin to top", lambda: self.set_pinned(conversation, not pinned))
        menu.addAction("Rename…", lambda: self.open_rename(conversation))
        menu.addSeparator()
        menu.addAction("Delete…", lambda: self.ask_delete(conversation))  # asks first, as Chat → Delete… does
        return menu

    def _show_sidebar_menu(self, pos: QPoint) -> None:
        item = self.sidebar.itemAt(pos)
        if item is None:
            return
        self.sidebar.setCurrentItem(item)
        menu = self.sidebar_menu(item.data(ID_ROLE))
        menu.popup(self.sidebar.viewport().mapToGlobal(pos))
