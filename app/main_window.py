"""The main window: conversation list, transcript, composer, banner, status bar.

The UI thread only touches widgets and the SQLite conversation store (WAL, no fsync per commit: a
write costs well under a millisecond). Everything that runs the model or reads and writes checkpoints
goes to ``EngineWorker`` on its own thread and comes back as signals. Text is stored before any
model work starts, and a reply is stored when it ends (a stopped reply keeps what was written).
"""

from __future__ import annotations

import logging

from PySide6.QtCore import QByteArray, QSettings, Qt, QTimer
from PySide6.QtGui import QAction, QCloseEvent, QKeySequence
from PySide6.QtWidgets import (
    QApplication,
    QHBoxLayout,
    QInputDialog,
    QLabel,
    QLineEdit,
    QMainWindow,
    QMessageBox,
    QProgressBar,
    QPushButton,
    QSplitter,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from app.banner import CacheBanner
from app.composer import Composer
from app.config import AppConfig
from app.engine_worker import EngineHost
from app.model_setup import ModelSetupDialog
from app.settings_dialog import ChatSettingsDialog, default_settings
from app.sidebar import ID_ROLE, ConversationList
from app.text import count, duration, resume_summary
from app.transcript import TranscriptView, copy_to_clipboard
from engine.conversations import ConversationError, ConversationStore
from engine.generation import CancelToken

log = logging.getLogger(__name__)
PROGRESS_MIN_TOKENS = 128  # shorter prefills finish before a progress bar would help


class MainWindow(QMainWindow):
    def __init__(self, config: AppConfig, start_engine: bool = True):
        super().__init__()
        self.config = config
        self.store = ConversationStore(config.paths.conversations_db)
        self.settings = QSettings(str(config.settings_file), QSettings.Format.IniFormat)
        self.host = EngineHost(config, self)
        self.worker = self.host.worker
        self.current: str | None = None
        self.engine_info: dict | None = None
        self.setup_dialog: ModelSetupDialog | None = None
        self._cancels: dict[str, list[CancelToken]] = {}
        self._streams: dict[str, str] = {}  # conversation → reply text so far, while a turn runs
        self._prefill_started: dict[str, float] = {}
        self._editing: int | None = None
        self._closing = False
        self.browser = None
        self._purge_leftover_trash()
        self.setWindowTitle("Hearth")
        self._build_ui()
        self._build_actions()
        self._connect_worker()
        self._load_list()
        self._restore_state()
        self._ages = QTimer(self)
        self._ages.timeout.connect(self.sidebar.refresh_ages)
        self._ages.start(60_000)
        if start_engine:
            self.status_model.setText("Loading the model…")
            self.host.request_load.emit()

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

        right = QWidget()
        rv = QVBoxLayout(right)
        rv.setContentsMargins(0, 6, 6, 6)
        self.banner = CacheBanner()
        rv.addWidget(self.banner)
        self.transcript = TranscriptView()
        rv.addWidget(self.transcript, 1)
        self.find_bar = self._build_find_bar()
        rv.addWidget(self.find_bar)
        self.prefill_bar = QProgressBar()
        self.prefill_bar.setAccessibleName("Reading the conversation")
        self.prefill_bar.hide()
        rv.addWidget(self.prefill_bar)
        self.edit_note = QLabel("Editing a message: sending replaces it and every reply after it (Esc cancels).")
        self.edit_note.setEnabled(False)
        self.edit_note.hide()
        rv.addWidget(self.edit_note)
        row = QHBoxLayout()
        self.composer = Composer()
        row.addWidget(self.composer, 1)
        buttons = QVBoxLayout()
        self.send_button = QPushButton("Send")
        self.send_button.setAccessibleName("Send the message")
        self.send_button.setDefault(True)
        self.stop_button = QPushButton("Stop")
        self.stop_button.setAccessibleName("Stop the reply")
        self.stop_button.setToolTip("Stop the reply (Esc)")
        self.stop_button.setEnabled(False)
        buttons.addWidget(self.send_button)
        buttons.addWidget(self.stop_button)
        buttons.addStretch(1)
        row.addLayout(buttons)
        rv.addLayout(row)
        self.splitter.addWidget(right)
        self.splitter.setStretchFactor(0, 0)
        self.splitter.setStretchFactor(1, 1)
        self.splitter.setSizes([260, 740])
        self.setCentralWidget(self.splitter)

        bar = self.statusBar()
        self.status_model = QLabel("")
        self.status_context = QLabel("")
        self.status_speed = QLabel("")
        self.status_resume = QLabel("")
        self.status_resume.setAccessibleName("How the last turn started")
        bar.addWidget(self.status_resume, 1)
        for label in (self.status_speed, self.status_context, self.status_model):
            bar.addPermanentWidget(label)
        self.resize(1100, 720)

    def _build_find_bar(self) -> QWidget:
        bar = QWidget()
        h = QHBoxLayout(bar)
        h.setContentsMargins(0, 2, 0, 2)
        h.addWidget(QLabel("Find:"))
        self.find_edit = QLineEdit()
        self.find_edit.setAccessibleName("Find in the conversation")
        self.find_edit.setPlaceholderText("text in this conversation")
        h.addWidget(self.find_edit, 1)
        self.find_count = QLabel("")
        h.addWidget(self.find_count)
        for label, tip, backward in (("↑", "Previous match (Shift+Enter)", True), ("↓", "Next match (Enter)", False)):
            b = QToolButton()
            b.setText(label)
            b.setToolTip(tip)
            b.setAccessibleName(tip)
            b.clicked.connect(lambda _=False, back=backward: self.find(back))
            h.addWidget(b)
        close = QToolButton()
        close.setText("✕")
        close.setAccessibleName("Close find")
        close.clicked.connect(lambda: bar.hide())
        h.addWidget(close)
        self.find_edit.textChanged.connect(lambda _: self.find(False))
        self.find_edit.returnPressed.connect(
            lambda: self.find(bool(QApplication.keyboardModifiers() & Qt.KeyboardModifier.ShiftModifier)))
        bar.hide()
        return bar

    def _action(self, text: str, shortcut: QKeySequence | str | None, slot, menu, tip: str = "") -> QAction:
        act = QAction(text, self)
        if shortcut is not None:
            act.setShortcut(QKeySequence(shortcut))
        if tip:
            act.setStatusTip(tip)
        act.triggered.connect(slot)
        menu.addAction(act)
        return act

    def _build_actions(self) -> None:
        m = self.menuBar()
        file_menu = m.addMenu("&File")
        self.act_new = self._action("&New chat", QKeySequence.StandardKey.New, self.new_chat, file_menu)
        file_menu.addSeparator()
        self._action("&Quit", QKeySequence.StandardKey.Quit, self.close, file_menu)
        edit_menu = m.addMenu("&Edit")
        self._action("&Find in chat", QKeySequence.StandardKey.Find, self.show_find, edit_menu)
        self._action("Find &next", QKeySequence.StandardKey.FindNext, lambda: self.find(False), edit_menu)
        self._action("&Browse conversations…", "Ctrl+B", self.show_browser, file_menu)
        chat_menu = m.addMenu("&Chat")
        self.act_stop = self._action("&Stop", "Esc", self.escape, chat_menu, "Stop the reply")
        self.act_regenerate = self._action("&Regenerate reply", "Ctrl+R", self.regenerate, chat_menu)
        chat_menu.addSeparator()
        self.act_rename = self._action("Re&name…", "F2", self.rename_current, chat_menu)
        self.act_settings = self._action("Chat &settings…", "Ctrl+,", self.open_settings, chat_menu)
        self.act_delete = self._action("&Delete…", "Ctrl+Shift+Delete", self.delete_current, chat_menu)
        delete_key = QAction(self.sidebar)  # plain Delete only while the list has focus
        delete_key.setShortcut(QKeySequence.StandardKey.Delete)
        delete_key.setShortcutContext(Qt.ShortcutContext.WidgetShortcut)
        delete_key.triggered.connect(self.delete_current)
        self.sidebar.addAction(delete_key)
        help_menu = m.addMenu("&Help")
        self._action("&Where is my data?", None, self.show_data_locations, help_menu)
        self._action("&About Hearth", None, self.show_about, help_menu)

        self.new_button.clicked.connect(self.new_chat)
        self.send_button.clicked.connect(self.composer.submit)
        self.stop_button.clicked.connect(self.stop)
        self.composer.submitted.connect(self.send)
        self.sidebar.currentItemChanged.connect(self._on_selection)
        self.transcript.copy_requested.connect(copy_to_clipboard)
        self.transcript.edit_requested.connect(self.begin_edit)
        self.transcript.regenerate_requested.connect(self.regenerate)

    def _connect_worker(self) -> None:
        w = self.worker
        w.needs_model.connect(self._on_needs_model)
        w.setup_progress.connect(self._on_setup_progress)
        w.setup_failed.connect(self._on_setup_failed)
        w.ready.connect(self._on_ready)
        w.resumed.connect(self._on_resumed)
        w.rebuilding.connect(self._on_rebuilding)
        w.rebuild_progress.connect(self._on_rebuild_progress)
        w.rebuilt.connect(self._on_rebuilt)
        w.prefill_progress.connect(self._on_prefill_progress)
        w.token.connect(self._on_token)
        w.turn_finished.connect(self._on_turn_finished)
        w.failed.connect(self._on_failed)
        w.cache_states.connect(self.sidebar.set_badges)

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

    def _load_list(self) -> None:
        for conv in self.store.list():
            self.sidebar.upsert(conv.id, conv.title, conv.updated_ms)

    # conversations ----------------------------------------------------------------------------------------
    def new_chat(self) -> str:
        if self.current and not self.store.messages(self.current):
            self.composer.setFocus()  # the current chat is still empty: use it
            return self.current
        conv = self.store.create()
        item = self.sidebar.upsert(conv.id, "", conv.updated_ms, top=True)
        self.sidebar.setCurrentItem(item)
        self.composer.setFocus()
        return conv.id

    def _on_selection(self, item, _previous=None) -> None:
        self._show_conversation(item.data(ID_ROLE) if item is not None else None)

    def _show_conversation(self, conversation: str | None) -> None:
        self.cancel_edit()
        self.current = conversation
        self.transcript.clear()
        if self.banner.conversation != conversation:
            self.banner.hide()
        if conversation is None:
            self._update_buttons()
            return
        self.transcript.load([(m.seq, m.role, m.content) for m in self.store.messages(conversation)])
        if conversation in self._streams:  # a reply still being written
            w = self.transcript.begin_stream(len(self.transcript.messages))
            w.set_text(self._streams[conversation])
        conv = self.store.get(conversation)
        self.setWindowTitle(f"{conv.title or 'New chat'} — Hearth" if conv else "Hearth")
        self._update_buttons()
        if self.engine_info is not None and conversation not in self._streams:
            self._open_in_engine(conversation)

    def _open_in_engine(self, conversation: str) -> None:
        token = CancelToken()
        self._cancels.setdefault(conversation, []).append(token)
        self.host.request_open.emit(conversation, self.store.chat_messages(conversation), token)

    def send(self, text: str) -> None:
        if self.current is not None and self.current in self._streams:
            return  # one reply at a time per chat; Send is disabled meanwhile
        conv = self.current or self.new_chat()
        try:
            if self._editing is not None:
                self.store.edit(conv, self._editing, text)
                self.cancel_edit()
                self._show_messages_only(conv)
            else:
                msg = self.store.append(conv, "user", text)
                self.transcript.add(msg.seq, "user", text)
        except ConversationError as exc:
            QMessageBox.warning(self, "Hearth", f"The message could not be saved: {exc}")
            return
        self.composer.clear()
        self._start_turn(conv)

    def _show_messages_only(self, conversation: str) -> None:
        self.transcript.load([(m.seq, m.role, m.content) for m in self.store.messages(conversation)])

    def _start_turn(self, conversation: str) -> None:
        conv = self.store.require(conversation)
        messages = self.store.chat_messages(conversation)
        settings = {**default_settings(), **conv.settings}
        token = CancelToken()
        self._cancels.setdefault(conversation, []).append(token)
        self._streams[conversation] = ""
        if conversation == self.current:
            self.transcript.begin_stream(len(self.store.messages(conversation)))
        self.sidebar.upsert(conversation, conv.title, conv.updated_ms, top=True)
        self.setWindowTitle(f"{conv.title or 'New chat'} — Hearth")
        self.status_resume.setText("Waiting for the model…" if self.engine_info is None else "Thinking…")
        self.host.request_generate.emit(conversation, messages, settings, token)
        self._update_buttons()

    def regenerate(self) -> None:
        conv = self.current
        if conv is None or conv in self._streams:
            return
        messages = self.store.messages(conv)
        if not messages or messages[-1].role != "assistant":
            return
        self.store.truncate(conv, messages[-1].seq)
        self._show_messages_only(conv)
        self._start_turn(conv)

    def begin_edit(self, seq: int) -> None:
        if self.current is None or self.current in self._streams:
            return
        message = next((m for m in self.store.messages(self.current) if m.seq == seq), None)
        if message is None:
            return
        self._editing = seq
        self.composer.setPlainText(message.content)
        self.composer.setFocus()
        self.edit_note.show()

    def cancel_edit(self) -> None:
        if self._editing is not None:
            self._editing = None
            self.composer.clear()
        self.edit_note.hide()

    def stop(self) -> None:
        """Stop the current chat's reply, prefill or rebuild."""
        for token in self._cancels.get(self.current, []):
            token.cancel()

    def escape(self) -> None:
        if self.current in self._streams or self.banner.progress.isVisible():
            self.stop()
        elif self.find_bar.isVisible():
            self.find_bar.hide()
        else:
            self.cancel_edit()

    def rename_current(self) -> None:
        if self.current is None:
            return
        conv = self.store.require(self.current)
        title, ok = QInputDialog.getText(self, "Rename chat", "Title:", QLineEdit.EchoMode.Normal, conv.title)
        if ok and title.strip():
            self.store.rename(conv.id, title)
            self.sidebar.upsert(conv.id, title.strip(), conv.updated_ms)
            self.setWindowTitle(f"{title.strip()} — Hearth")

    def delete_current(self, confirm: bool = True) -> None:
        if self.current is None:
            return
        conv = self.store.require(self.current)
        if confirm:
            answer = QMessageBox.question(
                self, "Delete chat", f"Delete “{conv.title or 'New chat'}” and its saved context? This cannot be undone.",
                QMessageBox.StandardButton.Delete | QMessageBox.StandardButton.Cancel, QMessageBox.StandardButton.Cancel)
            if answer != QMessageBox.StandardButton.Delete:
                return
        for token in self._cancels.pop(conv.id, []):
            token.cancel()
        self._streams.pop(conv.id, None)
        self.store.delete(conv.id)
        self.host.request_forget.emit(conv.id)
        item = self.sidebar.item_for(conv.id)
        self.sidebar.takeItem(self.sidebar.row(item))
        if self.sidebar.count() == 0:
            self._show_conversation(None)

    def open_settings(self) -> None:
        if self.current is None:
            return
        conv = self.store.require(self.current)
        dialog = ChatSettingsDialog(conv.system_prompt, conv.settings, self)
        if dialog.exec():
            system, settings = dialog.values()
            self.store.set_system_prompt(conv.id, system)
            self.store.set_settings(conv.id, settings)

    # the browser --------------------------------------------------------------------------------------------
    def show_browser(self) -> None:
        from app.browser import BrowserWindow

        if self.browser is None:
            self.browser = BrowserWindow(self.store, self.host, self)
            self.browser.open_requested.connect(self.open_conversation)
            self.browser.conversations_changed.connect(self.reload_list)
        self.browser.show()
        self.browser.raise_()
        self.browser.activateWindow()

    def open_conversation(self, conversation: str) -> None:
        item = self.sidebar.item_for(conversation)
        if item is None:
            self.reload_list()
            item = self.sidebar.item_for(conversation)
        if item is not None:
            self.sidebar.setCurrentItem(item)
        self.raise_()
        self.activateWindow()

    def reload_list(self) -> None:
        """The browser changed the set of chats: rebuild the list, keeping the current one if it lives."""
        current = self.current
        self.sidebar.blockSignals(True)
        self.sidebar.clear()
        self._load_list()
        item = self.sidebar.item_for(current) if current else None
        self.sidebar.setCurrentItem(item or self.sidebar.item(0))
        self.sidebar.blockSignals(False)
        chosen = self.sidebar.currentItem()
        new = chosen.data(ID_ROLE) if chosen is not None else None
        if new != current:
            self._show_conversation(new)

    # find -------------------------------------------------------------------------------------------------
    def show_find(self) -> None:
        self.find_bar.show()
        self.find_edit.setFocus()
        self.find_edit.selectAll()

    def find(self, backward: bool = False) -> None:
        needle = self.find_edit.text()
        found = self.transcript.find(needle, backward)
        n = self.transcript.match_count(needle)
        self.find_count.setText("" if not needle else f"{n} match{'es' if n != 1 else ''}" if found else "no matches")

    # worker signals ---------------------------------------------------------------------------------------
    def _on_needs_model(self) -> None:
        self.setup_dialog = ModelSetupDialog(self)
        self.setup_dialog.retry.clicked.connect(self.host.request_fetch.emit)
        self.setup_dialog.rejected.connect(self.close)
        self.setup_dialog.show()
        self.host.request_fetch.emit()

    def _on_setup_progress(self, stage: str, done: int, total: int) -> None:
        if self.setup_dialog is not None:
            self.setup_dialog.on_progress(stage, done, total)
        elif stage == "convert" and total:
            self.status_model.setText(f"Preparing the model… {done * 100 // total}%")

    def _on_setup_failed(self, message: str) -> None:
        self.status_model.setText("The model could not be loaded")
        if self.setup_dialog is not None:
            self.setup_dialog.on_failed(message)
            return
        box = QMessageBox(QMessageBox.Icon.Warning, "Hearth", f"The model could not be loaded:\n\n{message}",
                          QMessageBox.StandardButton.Retry | QMessageBox.StandardButton.Close, self)
        box.setWindowModality(Qt.WindowModality.WindowModal)
        box.finished.connect(lambda r: self.host.request_load.emit()
                             if r == QMessageBox.StandardButton.Retry else None)
        box.open()

    def _on_ready(self, info: dict) -> None:
        self.engine_info = info
        if self.setup_dialog is not None:
            self.setup_dialog.accept()
            self.setup_dialog = None
        provider = "CUDA" if info["provider"] == "cuda" else "CPU"
        self.status_model.setText(f"{info['model']} · {info['weights']} · {provider}")
        self.status_model.setToolTip(info.get("note") or "")
        self.status_context.setText(f"Context 0 / {count(info['context'])}")
        if self.current and self.current not in self._streams:
            self._open_in_engine(self.current)

    def _on_resumed(self, conversation: str, report: dict) -> None:
        if conversation != self.current:
            return
        self.status_resume.setText(resume_summary(report))
        if self.engine_info:
            used = report.get("reused_tokens", 0) + report.get("prefilled_tokens", 0)
            self.status_context.setText(f"Context {count(used)} / {count(self.engine_info['context'])}")

    def _on_rebuilding(self, conversation: str, report: dict) -> None:
        self.sidebar.set_badge(conversation, "rebuilding")
        if conversation == self.current:
            self.banner.rebuilding(conversation, report.get("plain", ""), report.get("message", ""))

    def _on_rebuild_progress(self, conversation: str, done: int, total: int) -> None:
        if conversation == self.current and self.banner.conversation == conversation:
            self.banner.update_progress(done, total)

    def _on_rebuilt(self, conversation: str, info: dict) -> None:
        if self.banner.conversation == conversation:
            self.banner.finished(info["ms"], info["tokens"], info["cancelled"])
        if conversation == self.current and self.engine_info and not info["cancelled"]:
            self.status_context.setText(f"Context {count(info['tokens'])} / {count(self.engine_info['context'])}")

    def _on_prefill_progress(self, conversation: str, done: int, total: int) -> None:
        import time

        if conversation != self.current or total < PROGRESS_MIN_TOKENS:
            return
        started = self._prefill_started.setdefault(conversation, time.monotonic())
        self.prefill_bar.setRange(0, total)
        self.prefill_bar.setValue(done)
        left = (time.monotonic() - started) / max(done, 1) * (total - done) * 1000
        self.prefill_bar.setFormat(f"Reading the conversation: %v of %m tokens · about {duration(left)} left")
        self.prefill_bar.setVisible(done < total)

    def _on_token(self, conversation: str, piece: str) -> None:
        if conversation in self._streams:
            self._streams[conversation] += piece
        if conversation == self.current:
            self.prefill_bar.hide()
            self.transcript.stream(piece)

    def _on_turn_finished(self, conversation: str, info: dict) -> None:
        self._prefill_started.pop(conversation, None)
        self._streams.pop(conversation, None)
        self._cancels.pop(conversation, None)
        text = info["text"]
        stopped = info["stop_reason"] == "cancelled"
        note = {"cancelled": "stopped", "length": "reached the length limit",
                "context_full": "the context window is full"}.get(info["stop_reason"], "")
        if text or not stopped:
            try:
                self.store.append(conversation, "assistant", text)
                if self.engine_info:
                    self.store.set_model(conversation, f"{self.engine_info['model']} {self.engine_info['weights']}")
            except ConversationError as exc:  # the chat was deleted meanwhile
                log.info("reply not stored: %s", exc)
        save = info.get("save") or {}
        if save and not save.get("ok", True):
            note = (note + " · " if note else "") + "context not saved: " + save.get("error", "")
        if conversation == self.current:
            self.prefill_bar.hide()
            self.transcript.end_stream(text, note)
            t = info["timings"]
            if t.get("decode_tokens_per_s"):
                self.status_speed.setText(f"{t['decode_tokens_per_s']:.1f} tokens/s")
            if self.engine_info:
                self.status_context.setText(f"Context {count(info['context'])} / {count(self.engine_info['context'])}")
        conv = self.store.get(conversation)
        if conv is not None:
            self.sidebar.upsert(conversation, conv.title, conv.updated_ms, tokens=info["context"])
        if self.browser is not None and self.browser.isVisible():
            self.browser.reload()  # its message counts and activity times just changed
        self._update_buttons()

    def _on_failed(self, conversation: str, message: str) -> None:
        self._prefill_started.pop(conversation, None)
        if conversation in self._streams:
            self._streams.pop(conversation)
            self._cancels.pop(conversation, None)
            if conversation == self.current:
                self.transcript.end_stream("", f"⚠ {message}")
        if conversation == self.current or not conversation:
            self.prefill_bar.hide()
            self.status_resume.setText(f"⚠ {message}")
        self._update_buttons()

    def _update_buttons(self) -> None:
        busy = self.current in self._streams
        self.send_button.setEnabled(not busy)
        self.stop_button.setEnabled(busy)
        has = self.current is not None
        for act in (self.act_rename, self.act_settings, self.act_delete):
            act.setEnabled(has)
        msgs = self.store.messages(self.current) if has else []
        self.act_regenerate.setEnabled(not busy and bool(msgs) and msgs[-1].role == "assistant")

    # help -------------------------------------------------------------------------------------------------
    def show_data_locations(self) -> None:
        p = self.config.paths
        QMessageBox.information(self, "Where Hearth keeps your data", (
            f"Conversations: {p.conversations_db}\nSaved context (a cache, safe to delete): {p.checkpoints}\n"
            f"Model files: {p.models}\nConverted models: {p.converted}\nWindow layout: {self.config.settings_file}"))

    def show_about(self) -> None:
        QMessageBox.about(self, "About Hearth", "Hearth — chat with a local language model that never makes you "
                          "wait twice for the same conversation.")

    # closing ----------------------------------------------------------------------------------------------
    def closeEvent(self, event: QCloseEvent) -> None:  # noqa: N802 - Qt's name
        if self._closing:
            event.accept()
            return
        self._closing = True
        self._save_state()
        if self.browser is not None:
            self.browser.close()  # ends its undo window: trashed chats are deleted for good
        for tokens in self._cancels.values():
            for token in tokens:
                token.cancel()
        if not self.host.stop():
            log.warning("the engine thread did not stop in time")
        self.store.close()
        event.accept()
