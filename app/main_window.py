"""The main window: the conversation list, the open chat (app/chat_pane.py), menus and the status bar.

The UI thread owns the widgets and its own connection to the conversation store (WAL: reads and the
small writes done here — create, rename, edit, truncate — cost well under a millisecond). Turns go to
the engine thread through ``TurnControl`` (app/turns.py); the engine stores the user's message and the
reply. Turns and chats added by other processes (``hearth-cli chat``) show up through the store's
``data_version``, looked at every second and before each message is sent.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping

from PySide6.QtCore import QByteArray, QSettings, Qt, QTimer
from PySide6.QtGui import QAction, QCloseEvent, QDragEnterEvent, QDropEvent, QKeySequence
from PySide6.QtWidgets import QMainWindow, QMessageBox, QPushButton, QSplitter, QVBoxLayout, QWidget

from app.banner import NoticeBanner
from app.chat_pane import ChatPane
from app.chat_tools import tool_choices
from app.config import AppConfig
from app.context_status import ContextStatusRegistry
from app.conversation_events import Rebuilding
from app.data_dialog import DataLocationsDialog
from app.engine_worker import EngineHost
from app.markdown_view import warm_up_highlighting
from app.model_control import ModelControl, gguf_paths
from app.model_setup import ModelSetup
from app.preferences import PreferencesDialog
from app.rename_dialog import RenameDialog
from app.server_switch import ServerSwitch
from app.settings_dialog import ChatSettingsDialog
from app.shell import ShellMixin, about_text
from app.sidebar import ID_ROLE, ConversationList
from app.status import StatusLine
from app.tool_loop import ToolLoopControl
from app.tool_worker import ToolWorkerHost
from app.turns import TurnControl
from engine.api import Preferences, effective_settings, load_preferences, open_conversations, recommended_values
from engine.types import Accepted, ContextBadge, Finished, ModelInfo

log = logging.getLogger(__name__)
SYNC_MS = 1000  # how often the window looks for turns and chats added by other processes


class MainWindow(ShellMixin, QMainWindow):
    def __init__(self, config: AppConfig, start_engine: bool = True):
        super().__init__()
        self.config = config
        self.store = open_conversations(config.paths)
        self.settings = QSettings(str(config.settings_file), QSettings.Format.IniFormat)
        self.host = EngineHost(config, self)
        self.worker = self.host.worker
        self.tools = ToolWorkerHost(config.paths, self)  # MCP servers: none starts until a chat or Preferences asks
        self.preferences, self._preference_problems = self._read_preferences()
        self.turns = TurnControl(self.host, self.store, self, effective=self.chat_settings)
        self.tool_loop = ToolLoopControl(self.tools, self.turns, self.store,
                                         lambda: (self.preferences.tool_steps, self.preferences.tool_timeout_s), self)
        self.model_info: ModelInfo | None = None
        self.browser = None
        self._closing = False
        self._data_version: int | None = None
        self._purge_leftover_trash()
        warm_up_highlighting()  # code in the first chat opened is then drawn without a lexer-import stall
        self.setWindowTitle("Hearth")
        self.setAcceptDrops(True)  # a .gguf dropped on the window is added to the library and used
        self._build_ui()
        self._build_actions()
        self._build_preference_actions()
        self._build_shell()
        self._connect()
        self.models = ModelControl(self)
        self.server = ServerSwitch(self)
        self._sync_list()
        self._restore_state()
        self._ages = QTimer(self)
        self._ages.timeout.connect(self.sidebar.refresh_ages)
        self._ages.start(60_000)
        self._sync_timer = QTimer(self)
        self._sync_timer.timeout.connect(self.sync_from_store)
        self._sync_timer.start(SYNC_MS)
        if start_engine:
            self.status.model.setText("Loading the model…")
            self.host.request_load.emit()

    @property
    def current(self) -> str | None:
        """The open chat."""
        return self.chat.conversation

    def _purge_leftover_trash(self) -> None:
        """Chats deleted in the browser whose Undo window ended with the app: delete them for good now."""
        for cid in self.store.trashed():
            self.store.purge([cid])
            self.host.request_forget.emit(cid)

    # building ---------------------------------------------------------------------------------------------
    def _build_ui(self) -> None:
        self.splitter = QSplitter(Qt.Orientation.Horizontal, self)
        left = QWidget()
        lv = QVBoxLayout(left)
        lv.setContentsMargins(6, 6, 0, 6)
        self.new_button = QPushButton("New chat")
        self.new_button.setToolTip("Start a new conversation (Ctrl+N)")
        self.new_button.setAccessibleName("New chat")
        lv.addWidget(self.new_button)
        self.sidebar = ConversationList()
        lv.addWidget(self.sidebar, 1)
        self.splitter.addWidget(left)
        self.status = StatusLine(self.statusBar())
        self.chat = ChatPane(self.store, self.turns, self.status, self.new_chat, settings=self.settings)
        self.splitter.addWidget(self.chat)
        self.tool_loop.attach(self.chat)
        self.chat.before_send = self.tool_loop.before_send
        self.chat.on_rendered = self.tool_loop.shown
        self.tool_loop.changed.connect(lambda cid: self.chat.refresh() if cid == self.current else None)
        self.splitter.setStretchFactor(0, 0)
        self.splitter.setStretchFactor(1, 1)
        self.splitter.setSizes([260, 740])
        self.setCentralWidget(self.splitter)
        # The chat's widgets, by the names the window has always had (tests and tools use them).
        c = self.chat
        self.banner, self.transcript, self.composer, self.find_bar = c.banner, c.transcript, c.composer, c.find_bar
        self.prefill_bar, self.edit_note, self.send_button, self.stop_button = (c.prefill_bar, c.edit_note,
                                                                                c.send_button, c.stop_button)
        self.attach_button, self.tray = c.attach_button, c.tray
        self.resize(1100, 720)

    def _action(self, text: str, shortcut: QKeySequence | str | None, slot: Callable[[], object], menu) -> QAction:
        """A menu action that calls ``slot()`` with no arguments: ``triggered`` passes ``checked`` (False), which
        a slot with a defaulted parameter would take as that parameter (Delete took it for ``confirm``)."""
        act = QAction(text, self)
        if shortcut is not None:
            act.setShortcut(QKeySequence(shortcut))
        act.triggered.connect(lambda _checked=False: slot())
        menu.addAction(act)
        return act

    def _build_actions(self) -> None:
        m = self.menuBar()
        file_menu = m.addMenu("&File")
        self.act_new = self._action("&New chat", QKeySequence.StandardKey.New, self.new_chat, file_menu)
        self._action("&Open model file…", QKeySequence.StandardKey.Open, lambda: self.models.open_file(), file_menu)
        self._action("&Models…", "Ctrl+M", lambda: self.models.show_dialog(), file_menu)
        self._action("&Browse conversations…", "Ctrl+B", self.show_browser, file_menu)
        file_menu.addSeparator()
        self._action("&Quit", QKeySequence.StandardKey.Quit, self.close, file_menu)
        edit_menu = self.edit_menu = m.addMenu("&Edit")
        self._action("&Find in chat", QKeySequence.StandardKey.Find, self.find_bar.open, edit_menu)
        self._action("Find &next", QKeySequence.StandardKey.FindNext, lambda: self.find_bar.find(False), edit_menu)
        chat_menu = self.chat_menu = m.addMenu("&Chat")
        self.act_stop = self._action("&Stop", "Esc", self.chat.escape, chat_menu)
        self.act_regenerate = self._action("&Regenerate reply", "Ctrl+R", self.regenerate, chat_menu)
        self._build_reply_actions(chat_menu)
        self.act_documents = self._action("New chat with these &documents", "Ctrl+Shift+D",
                                          lambda: self.chat.new_chat_with_documents(None), chat_menu)
        chat_menu.addSeparator()
        self.act_rename = self._action("Re&name…", "F2", self.rename_current, chat_menu)
        self.act_settings = self._action("Chat &settings…", "Ctrl+Shift+S", self.open_settings, chat_menu)
        self.act_delete = self._action("&Delete…", "Ctrl+Shift+Delete", self.delete_current, chat_menu)
        delete_key = QAction("Delete the selected chat", self.sidebar)  # plain Delete only while the list has focus
        delete_key.setShortcut(QKeySequence.StandardKey.Delete)
        delete_key.setShortcutContext(Qt.ShortcutContext.WidgetShortcut)
        delete_key.triggered.connect(lambda _checked=False: self.delete_current())
        self.sidebar.addAction(delete_key)
        help_menu = self.help_menu = m.addMenu("&Help")
        self._action("&Where is my data?", None, self.show_data_locations, help_menu)
        self._action("&About Hearth", None, self.show_about, help_menu)
        self.new_button.clicked.connect(self.new_chat)
        self.sidebar.currentItemChanged.connect(self._on_selection)

    def _build_reply_actions(self, chat_menu) -> None:
        """Continue, and the earlier/later version of a regenerated reply (its ‹ › buttons, by keyboard)."""
        self.act_continue = self._action("Con&tinue reply", "Ctrl+Shift+Return", self.chat.continue_reply, chat_menu)
        self.act_earlier_version = self._action("&Earlier version of the reply", "Alt+Left",
                                                lambda: self._step_version(-1), chat_menu)
        self.act_later_version = self._action("&Later version of the reply", "Alt+Right",
                                              lambda: self._step_version(1), chat_menu)

    def _step_version(self, delta: int) -> None:
        last = self.transcript.last_reply()
        if last is not None and not last.versions.isHidden():
            self.chat.choose_version(last.seq, last.versions.index + delta)

    def _connect(self) -> None:
        self.setup = ModelSetup(self.host, self.status.model, self)
        w = self.worker
        w.ready.connect(self._on_ready)
        self._connect_context_status()
        self.turns.events.on_each({Rebuilding: self._on_rebuilding, Accepted: self._on_accepted,
                                   Finished: self._on_turn_finished})
        self.chat.sending.connect(self.sync_from_store)
        self.chat.show_requested.connect(self.open_conversation)
        self.chat.state_changed.connect(self._update_actions)
        self.chat.retitled.connect(self._update_title)

    def _connect_context_status(self) -> None:
        """The sidebar's badges come from the one registry the browser reads too (app/context_status.py)."""
        self.contexts = ContextStatusRegistry(self.worker, self, events=self.turns.events)
        self.contexts.changed.connect(lambda _ids: self.sidebar.set_badges(self.contexts.badges()))

    # state ------------------------------------------------------------------------------------------------
    def _restore_state(self) -> None:
        geometry = self.settings.value("geometry")
        if isinstance(geometry, QByteArray):
            self.restoreGeometry(geometry)
        splitter = self.settings.value("splitter")
        if isinstance(splitter, QByteArray):
            self.splitter.restoreState(splitter)
        last = self.settings.value("last_conversation")
        item = self.sidebar.item_for(str(last)) if last else None
        self.sidebar.setCurrentItem(item or self.sidebar.item(0))
        if self.sidebar.currentItem() is None:
            self._show_conversation(None)

    def _save_state(self) -> None:
        self.settings.setValue("geometry", self.saveGeometry())
        self.settings.setValue("splitter", self.splitter.saveState())
        if self.current:
            self.settings.setValue("last_conversation", self.current)
        self.settings.sync()

    # turns and chats added elsewhere ---------------------------------------------------------------------
    def sync_from_store(self) -> None:
        """If anything was committed to the store since the last look (the engine thread, ``hearth-cli``,
        the browser), refresh the list and the open chat's transcript."""
        version = self.store.data_version()
        if version == self._data_version:
            return
        self._data_version = version
        self._sync_list()
        self.chat.refresh()
        if self.browser is not None and self.browser.isVisible():
            self.browser.reload()  # message counts and activity times changed

    def _sync_list(self) -> None:
        """The list as stored (the newest activity first); if the open chat is gone, show another."""
        self.sidebar.set_pinned_ids(self.store.pinned_ids())
        # An imported chat has no model key (exports carry the model's name only): show that name.
        chats = self.store.list()
        self.sidebar.sync([(c.id, c.title, c.updated_ms, self.models.short_title(c.model_key) or c.model)
                           for c in chats])
        self.sidebar.set_remote_ids({c.id for c in chats if self.models.is_remote(c.model_key)})
        if self.current is not None and self.sidebar.item_for(self.current) is None:
            self.sidebar.blockSignals(True)  # the list may have moved its current item already, silently
            self.sidebar.setCurrentItem(self.sidebar.item(0))
            self.sidebar.blockSignals(False)
            item = self.sidebar.currentItem()
            self._show_conversation(item.data(ID_ROLE) if item is not None else None)

    reload_list = _sync_list  # the browser changed the set of chats

    def _update_title(self, conversation: str) -> None:
        conv = self.store.get(conversation)
        if conv is not None:
            self.sidebar.upsert(conv.id, conv.title, conv.updated_ms)
            if conversation == self.current:
                self.setWindowTitle(f"{conv.title or 'New chat'} — Hearth")

    def _update_actions(self) -> None:
        for act in (self.act_rename, self.act_settings, self.act_delete):
            act.setEnabled(self.current is not None)
        self.act_regenerate.setEnabled(self.chat.can_regenerate())
        self.act_documents.setEnabled(bool(self.chat.model.files()))  # the chat shown has attached files
        self.act_continue.setEnabled(self.chat.can_continue())

    # conversations ----------------------------------------------------------------------------------------
    def new_chat(self) -> str:
        current = self.current
        if current and not self.store.messages(current) and not self.turns.running(current):
            self.composer.setFocus()  # the current chat is still empty: use it
            return current
        conv = self.store.create(system_prompt=self.preferences.system_prompt)
        item = self.sidebar.upsert(conv.id, "", conv.updated_ms, top=True)
        self.sidebar.setCurrentItem(item)
        self.composer.setFocus()
        return conv.id

    def _on_selection(self, item, _previous=None) -> None:
        self._show_conversation(item.data(ID_ROLE) if item is not None else None)

    def _show_conversation(self, conversation: str | None) -> None:
        self.chat.show_chat(conversation)
        if conversation is None:
            self.setWindowTitle("Hearth")
            return
        self._update_title(conversation)
        switching = self.models.on_chat_shown(conversation)  # then _on_ready opens it, on its model
        if self.model_info is not None and not switching and not self.turns.running(conversation):
            self.turns.open(conversation)

    def send(self, text: str) -> None:
        self.chat.send(text)

    def regenerate(self) -> None:
        self.chat.regenerate()

    def stop(self) -> None:
        self.chat.stop()

    def rename_current(self) -> RenameDialog | None:
        if self.current is None:
            return
        return self.open_rename(self.current)

    def delete_current(self) -> QMessageBox | None:
        """Chat → Delete…, Ctrl+Shift+Delete, Delete in the list: ask first (the box is returned, open)."""
        return self.ask_delete(self.current) if self.current is not None else None

    def ask_delete(self, conversation: str) -> QMessageBox | None:
        """Ask before deleting ``conversation`` for good; Cancel is the default. Window-modal, no nested loop."""
        conv = self.store.get(conversation)
        if conv is None:
            return None
        box = QMessageBox(QMessageBox.Icon.Question, "Delete chat",
                          f"Delete “{conv.title or 'New chat'}” and its saved context? This cannot be undone.",
                          QMessageBox.StandardButton.Cancel, self)
        box.setObjectName("deleteChatQuestion")
        delete = box.addButton("Delete", QMessageBox.ButtonRole.DestructiveRole)  # Qt has no standard Delete
        box.setDefaultButton(QMessageBox.StandardButton.Cancel)
        box.finished.connect(lambda _r: self.delete_chat(conversation) if box.clickedButton() is delete else None)
        box.finished.connect(box.deleteLater)
        box.open()
        return box

    def delete_chat(self, conversation: str) -> None:
        """Delete ``conversation`` and its saved context now (after the question, or when asked by code)."""
        if self.store.get(conversation) is None:
            return  # gone meanwhile (the browser, another process)
        self.turns.forget(conversation)
        self.store.delete(conversation)
        self.host.request_forget.emit(conversation)
        self._sync_list()

    def open_settings(self) -> ChatSettingsDialog | None:
        if self.current is None:
            return None
        conv = self.store.require(self.current)
        dialog = ChatSettingsDialog(conv.system_prompt, conv.settings, self, inherited=self.inherited_settings(conv.id),
                                    recommended=recommended_values(self.model_defaults(conv.id)),
                                    preferences=self.preferences.settings(),
                                    tools=tool_choices(self.tools.configs, self.tools.statuses))
        dialog.defaults_requested.connect(lambda: self.open_preferences(
            lambda: dialog.set_inherited(self.inherited_settings(conv.id), self.preferences.settings()), parent=dialog))

        def keep() -> None:
            system, settings = dialog.values()
            self.store.set_system_prompt(conv.id, system)
            self.store.set_settings(conv.id, settings)

        dialog.accepted.connect(keep)
        dialog.open()  # window-modal, without a nested event loop
        return dialog

    # preferences: the defaults for every chat ----------------------------------------------------------------
    def _read_preferences(self) -> tuple[Preferences, tuple[str, ...]]:
        loaded = load_preferences(self.config.paths)  # a small file: read here, before the window shows
        return loaded.preferences, loaded.problems

    def _build_preference_actions(self) -> None:
        self.edit_menu.addSeparator()
        self.act_preferences = self._action("&Preferences…", "Ctrl+,", lambda: self.open_preferences(), self.edit_menu)
        self.act_preferences.setMenuRole(QAction.MenuRole.PreferencesRole)
        self.notice = NoticeBanner()
        self.chat.layout().insertWidget(0, self.notice)
        if self._preference_problems:
            self.notice.say("Your preferences could not all be used: " + "; ".join(self._preference_problems))

    def open_preferences(self, after: Callable[[], None] | None = None,
                         parent: QWidget | None = None) -> PreferencesDialog:
        """Edit → Preferences… (over ``parent``, else the window); ``after`` runs once new preferences are kept."""
        dialog = PreferencesDialog(self.config.paths, self.preferences, parent or self,
                                   recommended=recommended_values(self.model_defaults(self.current)),
                                   model_title=self.models.short_title(self.models.chat_model(self.current)
                                                                       or self.models.loaded), tools=self.tools)

        def keep() -> None:
            self.preferences = dialog.saved
            if after is not None:
                after()

        dialog.accepted.connect(keep)
        dialog.open()
        return dialog

    def model_defaults(self, conversation: str) -> dict:
        """The values the chat's model recommends (the library's per-model defaults, e.g. a temperature)."""
        return self.models.recommended(conversation)

    def inherited_settings(self, conversation: str) -> dict:
        """What ``conversation`` gets where it sets nothing itself: its model's values over Preferences."""
        return effective_settings(self.preferences, self.model_defaults(conversation), {})

    def chat_settings(self, conversation: str, own: Mapping) -> dict:
        """The settings a turn of ``conversation`` uses: its own, over its model's, over Preferences."""
        return effective_settings(self.preferences, self.model_defaults(conversation), own)

    # the browser --------------------------------------------------------------------------------------------
    def show_browser(self) -> None:
        from app.browser import BrowserWindow

        if self.browser is None:
            self.browser = BrowserWindow(self.store, self.host, self, contexts=self.contexts)
            self.browser.open_requested.connect(self.open_conversation)
            self.browser.conversations_changed.connect(self._sync_list)
            self.browser.documents_requested.connect(self.new_chat_with_documents)
        self.browser.show()
        self.browser.raise_()
        self.browser.activateWindow()

    def new_chat_with_documents(self, source: str) -> None:
        """From the browser: a new chat whose message box holds every file of ``source``, once each."""
        if self.chat.new_chat_with_documents(None, source=source) is None:
            self.status.say("That chat has no attached documents.")
            return
        self.raise_()
        self.activateWindow()

    def open_conversation(self, conversation: str) -> None:
        if self.sidebar.item_for(conversation) is None:
            self._sync_list()
        item = self.sidebar.item_for(conversation)
        if item is not None:
            self.sidebar.setCurrentItem(item)
        self.raise_()
        self.activateWindow()

    # the engine's reports -------------------------------------------------------------------------------------
    def _on_ready(self, info: ModelInfo) -> None:
        self.model_info = info
        self.chat.model_ready = True
        self.status.model_ready(info)
        if self.current and not self.turns.running(self.current):
            self.turns.open(self.current)

    def _on_rebuilding(self, rebuilding: Rebuilding) -> None:
        self.sidebar.set_badge(rebuilding.conversation, ContextBadge.REBUILDING)

    def _on_accepted(self, accepted: Accepted) -> None:
        self._update_title(accepted.conversation)  # the first message titles the chat

    def _on_turn_finished(self, finished: Finished) -> None:
        conversation = finished.conversation
        conv = self.store.get(conversation)
        if conv is not None:
            self.sidebar.upsert(conversation, conv.title, conv.updated_ms, tokens=finished.context_tokens,
                                model=self.models.short_title(finished.model.key) or None)
        self._data_version = None  # look at the store again on the next tick

    # drag and drop of a model file -------------------------------------------------------------------------
    def dragEnterEvent(self, event: QDragEnterEvent) -> None:  # noqa: N802 - Qt's name
        if event.mimeData().hasUrls() and gguf_paths(event.mimeData().urls()):
            event.acceptProposedAction()

    def dropEvent(self, event: QDropEvent) -> None:  # noqa: N802 - Qt's name
        paths = gguf_paths(event.mimeData().urls()) if event.mimeData().hasUrls() else []
        if paths:
            event.acceptProposedAction()
            self.models.add_and_use(paths[0])

    # help -------------------------------------------------------------------------------------------------
    def show_data_locations(self) -> DataLocationsDialog:
        p = self.config.paths
        dialog = DataLocationsDialog([
            ("Conversations", p.conversations_db, ""),
            ("Saved context", p.checkpoints, "a cache, safe to delete"),
            ("Model files", p.models, ""),
            ("Converted models", p.converted, ""),
            ("Window settings", self.config.settings_file, ""),
        ], self)
        dialog.open()
        return dialog

    def show_about(self) -> QMessageBox:
        box = QMessageBox(QMessageBox.Icon.NoIcon, "About Hearth", about_text(self.model_info), parent=self)
        box.setTextFormat(Qt.TextFormat.RichText)
        box.setObjectName("about")
        if not self.windowIcon().isNull():
            box.setIconPixmap(self.windowIcon().pixmap(64, 64))
        box.open()
        return box

    # closing ----------------------------------------------------------------------------------------------
    def closeEvent(self, event: QCloseEvent) -> None:  # noqa: N802 - Qt's name
        if self._closing:
            event.accept()
            return
        self._closing = True
        self._sync_timer.stop()
        self._save_state()
        if self.browser is not None:
            self.browser.close()  # ends its undo window: trashed chats are deleted for good
            self.browser.shutdown()  # a running import is cancelled and removes what it added
        self.turns.interrupt_all()
        self.chat.shutdown()
        self.server.stop()  # before the engine thread stops: requests in flight end at their next token
        self.models.stop()
        if not self.tools.stop():  # stops every tool server and call in flight
            log.warning("the tool thread did not stop in time")
        if not self.host.stop():
            log.warning("the engine thread did not stop in time")
        self.store.close()
        event.accept()
