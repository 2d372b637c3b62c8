"""The open chat: banner, transcript, find bar, prefill progress, composer, Send and Stop.

It renders ``ChatSessionModel`` (app/chat_session_model.py: the chat shown, its store reads and what is
remembered of each chat) and what ``TurnControl`` dispatches about it — the message you sent (pending
until the engine stores it), the reply as it streams, how the turn ended — and forwards what you do.
Each typed event reaches its handler here once (``TurnControl.events``); an event of another chat
only updates what the model remembers of it. The turns themselves are the engine's.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from PySide6.QtCore import QSettings, Signal
from PySide6.QtGui import QPalette, QTextCursor
from PySide6.QtWidgets import (
    QFileDialog,
    QHBoxLayout,
    QLabel,
    QMessageBox,
    QProgressBar,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from app.attachment_tray import AttachmentTray
from app.banner import CacheBanner
from app.chat_session_model import ChatSessionModel
from app.chat_status_view import ChatStatusView
from app.composer import Composer
from app.composer_attachments import ComposerAttachments
from app.conversation_events import (
    MessageRefused,
    OpenFailed,
    PrefillProgress,
    ReplyFailed,
    TurnStarted,
)
from app.find_bar import FindBar
from app.status import StatusLine
from app.text import display_safe, duration, turn_note, version_chosen_note
from app.transcript import MessageWidget, TranscriptView, copy_to_clipboard
from app.turns import ContextLimitHit, TurnControl
from engine.api import ConversationStore
from engine.errors import ConversationError, HearthError
from engine.types import Accepted, Finished, Resumed, Token, Waiting

log = logging.getLogger(__name__)


class ChatPane(QWidget):
    show_requested = Signal(str)  # a refused message was written in another chat: show that one (direct)
    sending = Signal()  # about to send (direct): the window first shows turns added elsewhere
    state_changed = Signal()  # busy or not, something to regenerate or not: the window updates its actions
    retitled = Signal(str)  # an edit of the first message gave the chat a new title (direct)

    def __init__(self, store: ConversationStore, turns: TurnControl, status: StatusLine,
                 new_chat: Callable[[], str], parent: QWidget | None = None, settings: QSettings | None = None):
        """``settings``: the window's settings, where the paperclip remembers the folder it last opened."""
        super().__init__(parent)
        self.model = ChatSessionModel(store, turns)
        self.turns, self.status, self._new_chat, self.settings = turns, status, new_chat, settings
        self.model_ready = False
        self._tooled: MessageWidget | None = None  # the reply showing ‹ 2/3 › and Continue
        # The tool loop's hooks (app/tool_loop.py): settle calls still waiting before a new message (False: it
        # could not, and the message waits), and draw a chat's loop block once the chat is drawn.
        self.before_send: Callable[[str], bool] = lambda _conversation: True
        self.on_rendered: Callable[[str | None], None] = lambda _conversation: None
        self._build()
        self.status_view = ChatStatusView(self.model, self.banner, status)
        self.status_view.listen(turns.events)  # first: the status line, then the transcript (as they always were)
        turns.events.on_each({
            TurnStarted: self._on_started, Waiting: self._on_waiting, Accepted: self._on_accepted,
            PrefillProgress: self._on_prefill_progress, Token: self._on_token, Finished: self._on_finished,
            ReplyFailed: self._on_failed, MessageRefused: self._on_refused, ContextLimitHit: self._on_context_full,
            Resumed: self._on_resumed,
            OpenFailed: lambda e: self._problem(e.conversation, str(e.error))})

    @property
    def conversation(self) -> str | None:
        """The chat shown."""
        return self.model.conversation

    @property
    def editing(self) -> int | None:
        """The seq of the message being edited."""
        return self.model.editing

    # building ------------------------------------------------------------------------------------------------
    def _build(self) -> None:
        rv = QVBoxLayout(self)
        rv.setContentsMargins(0, 6, 6, 6)
        self.banner = CacheBanner()
        rv.addWidget(self.banner)
        self.transcript = TranscriptView()
        rv.addWidget(self.transcript, 1)
        self.find_bar = FindBar(self.transcript)
        rv.addWidget(self.find_bar)
        self.prefill_bar = QProgressBar()
        self.prefill_bar.setAccessibleName("Reading the conversation")
        self.prefill_bar.hide()
        rv.addWidget(self.prefill_bar)
        self.edit_note = QLabel("<b>Editing your message</b> — Enter saves it and sends it again (the replies "
                                "after it are replaced) · Esc cancels")
        self.edit_note.setObjectName("editNote")
        self.edit_note.setWordWrap(True)
        self.edit_note.setAccessibleName("Editing a message: Enter saves and sends it again, Esc cancels")
        self.edit_note.hide()
        rv.addWidget(self.edit_note)
        self.tray = AttachmentTray()
        rv.addWidget(self.tray)
        rv.addLayout(self._build_composer_row())
        self.attachments = ComposerAttachments(self.tray, self.turns.host, self._context_facts, self)
        self.attachments.changed.connect(self._on_attachments_changed)
        self.composer.files_offered.connect(self.attachments.offer_paths)
        self.composer.textChanged.connect(self._on_typed)
        self.turns.host.worker.ready.connect(lambda _info: self.attachments.recount())  # another tokenizer
        self._connect_transcript()

    def _build_composer_row(self) -> QHBoxLayout:
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
        self.attach_button = QPushButton("Attach…")
        self.attach_button.setAccessibleName("Attach files to the message")
        self.attach_button.setToolTip("Attach text, code, Markdown, CSV, JSON, HTML, PDF or Word files: their "
                                      "text goes into the message (you can also drop or paste files here)")
        self.attach_button.clicked.connect(self.choose_files)
        buttons.addWidget(self.send_button)
        buttons.addWidget(self.stop_button)
        buttons.addWidget(self.attach_button)
        buttons.addStretch(1)
        row.addLayout(buttons)
        self.send_button.clicked.connect(self.composer.submit)
        self.stop_button.clicked.connect(self.stop)
        self.composer.submitted.connect(self.send)
        return row

    def _connect_transcript(self) -> None:
        """What the transcript's buttons and blocks ask for."""
        t = self.transcript
        t.copy_requested.connect(copy_to_clipboard)
        t.edit_requested.connect(self.begin_edit)
        t.regenerate_requested.connect(self.regenerate)
        t.version_requested.connect(self.choose_version)
        t.continue_requested.connect(self.continue_reply)
        t.context_limit.new_chat_requested.connect(self.new_chat_with_system_prompt)
        t.context_limit.drop_oldest_requested.connect(self.drop_oldest_and_retry)
        t.context_limit.edit_requested.connect(self._focus_composer_at_end)  # the refused message is back there
        t.unanswered.answer_requested.connect(self.answer_unanswered)
        t.unanswered.edit_requested.connect(self.edit_unanswered)
        t.documents_requested.connect(self.new_chat_with_documents)

    # what is shown ------------------------------------------------------------------------------------------
    def show_chat(self, conversation: str | None) -> None:
        self.cancel_edit()
        if conversation != self.conversation:
            self.status.clear_chat()  # never the previous chat's figures (its own come as it opens)
        self.model.conversation = conversation
        if self.banner.conversation != conversation:
            self.banner.hide()
        if conversation is None:
            self.transcript.clear()
        else:
            self.render(self.model.stored(conversation))
        self.update_buttons()

    def render(self, stored: list[tuple[int, str, str]]) -> None:
        """The stored messages, then a turn's message not stored yet and its reply so far."""
        turn = self.model.turn()
        self.transcript.load(self.model.without_continued(stored), self.model.reply_notes(), self.model.files(),
                             self.model.agents())
        self.transcript.set_dropped(self.model.dropped())
        self._tooled = None
        self.update_reply_tools()
        if turn is not None:
            if turn.pending is not None:
                self.transcript.add_pending(turn.pending, "waiting for another Hearth process…" if turn.waiting
                                            else "sending…", turn.pending_files)
            self.transcript.begin_stream(turn.reply, turn.reasoning)
        else:
            self._offer_next_step()
        self.on_rendered(self.conversation)

    def _offer_next_step(self) -> None:
        """Under the last message, when no turn is writing into the chat: the refusal it last had (a chat
        too long for the model), or, when the last message has no reply, a way to answer or edit it."""
        step = self.model.next_step(self.transcript.entries())
        if step is None:
            return
        if step.kind == "limit":
            self.transcript.show_context_limit(step.message, can_drop=step.can_drop)
        elif step.kind == "unanswered":
            self.transcript.show_unanswered(step.message)
        else:
            self.transcript.hide_unanswered()

    def refresh(self) -> None:
        """Show what is stored now, if it differs from what is shown (turns added by another process),
        unless a turn is writing into this chat (its ``accepted`` brings those turns)."""
        if self.conversation is not None and not self.busy:
            stored = self.model.stored()
            if stored != self.transcript.entries():
                self.render(stored)
                self.update_buttons()

    @property
    def busy(self) -> bool:
        return self.model.busy

    def can_regenerate(self) -> bool:
        last = self.transcript.entries()[-1:]
        return not self.busy and bool(last) and last[0][1] == "assistant"

    def update_buttons(self) -> None:
        self.send_button.setEnabled(not self.busy)
        self.stop_button.setEnabled(self.busy)
        self.attachments.refresh_total()  # another chat, or a turn ended: what the context holds changed
        self.update_reply_tools()
        self.state_changed.emit()

    # what you do ----------------------------------------------------------------------------------------------
    def send(self, text: str) -> None:
        """Send the message with its attachments (attachments and no typed text: the documents alone)."""
        if self.attachments.reading:
            reading = self.attachments.reading
            self.status.say(f"Wait a moment: {display_safe(', '.join(reading))} "
                            f"{'is' if len(reading) == 1 else 'are'} still being read.")
            return
        conv = self.conversation or self._new_chat()
        if self.turns.running(conv):
            return  # one reply at a time per chat; Send is disabled meanwhile
        self.sending.emit()
        if self.editing is not None:
            try:
                self.model.save_edit(conv, text, self.attachments.attachments())
            except ConversationError as exc:
                QMessageBox.warning(self, "Hearth", f"The message could not be saved: {exc}")
                return
            self.cancel_edit()
            self.render(self.model.stored(conv))
            self.retitled.emit(conv)  # a title made from the first message follows its edit
            self.turns.answer(conv)
        else:
            if not self.before_send(conv):
                self.status.say("Wait for the tool call to finish, or press Stop.")
                return
            files = self.attachments.attachments()
            self.composer.clear()
            self.attachments.clear()
            self.turns.send(conv, text, files)

    def regenerate(self) -> None:
        conv = self.conversation
        if conv is None or self.busy:
            return
        messages = self.model.messages(conv)
        if not messages or messages[-1].role != "assistant":
            return
        self._take_off_last_reply(messages)
        self.turns.regenerate(conv)  # the engine keeps the reply it replaces as an earlier version

    def _take_off_last_reply(self, messages: list) -> None:
        """The last reply leaves the transcript: a new one (or its continuation) streams in its place."""
        shown = self.transcript.messages[-1:]
        if shown and shown[0].seq == messages[-1].seq:
            self.transcript.remove(shown[0])
        else:
            self.render([(m.seq, m.role, m.content) for m in messages[:-1]])
        self._tooled = None

    # versions of the last reply and Continue -------------------------------------------------------------------
    def update_reply_tools(self) -> None:
        """‹ 2/3 › and Continue on the last reply, when they apply and nothing is running; no other reply
        has them (only the last reply's version can be chosen: later messages answered the one they followed)."""
        if self._tooled is not None:
            self._tooled.hide_reply_tools()
            self._tooled = None
        last = self.transcript.last_reply()
        if last is None or self.busy or self.transcript.read_only:
            return
        versions = self.model.reply_versions(last.seq)
        if versions is not None and len(versions.texts) > 1:
            last.set_versions(versions.chosen, len(versions.texts))
        if self.model.continuable_seq() == last.seq:
            last.continue_button.show()
        self._tooled = last

    def choose_version(self, seq: int, index: int) -> None:
        """Show version ``index`` of the last reply; the chat continues with it from now on."""
        conv = self.conversation
        last = self.transcript.last_reply()
        if conv is None or self.busy or last is None or last.seq != seq:
            return
        try:
            text = self.model.choose_version(seq, index)
        except ConversationError as exc:
            self.status.problem(f"That version could not be chosen: {exc}")
            return
        last.set_text(text)
        last.set_note(self.model.reply_notes().get(seq, ""))  # the version's own stop reason and model
        self.update_buttons()  # Continue follows the version shown: the store keeps why each one ended
        self.status.say(version_chosen_note(index))
        # The context still holds the other version: the engine thread counts the chat's tokens with this one.
        self.turns.host.request_chat_tokens.emit(conv)

    def can_continue(self) -> bool:
        last = self.transcript.last_reply()
        return not self.busy and last is not None and self.model.continuable_seq() == last.seq

    def continue_reply(self) -> None:
        """Write on at the end of the last reply, which the length limit stopped (or Hearth's closing cut off):
        the same message grows."""
        conv = self.conversation
        if conv is None or not self.can_continue():
            return
        messages = self.model.messages(conv)
        if not messages or messages[-1].role != "assistant":
            return
        self._take_off_last_reply(messages)
        self.turns.continue_reply(conv, messages[-1].content, messages[-1].reasoning)

    # editing ----------------------------------------------------------------------------------------------------
    def begin_edit(self, seq: int) -> None:
        if self.conversation is None or self.busy:
            return
        message = self.model.message(seq)
        if message is None:
            return
        self.model.editing = seq
        self.composer.setPlainText(message.typed_text if message.attachments else message.content)
        self.attachments.clear()
        self.attachments.add(message.attachments)  # its files, as stored: removing a chip takes the file off
        self._focus_composer_at_end()
        self.transcript.set_editing(seq)
        hl = self.palette().color(QPalette.ColorRole.Highlight)
        # Normal text contrast on a highlight tint, matching the frame around the message being edited.
        self.edit_note.setStyleSheet(f"#editNote {{ border-left: 3px solid {hl.name()}; padding: 4px 8px; "
                                     f"background-color: rgba({hl.red()}, {hl.green()}, {hl.blue()}, 0.12); }}")
        self.edit_note.show()

    def _focus_composer_at_end(self) -> None:
        """Focus the message box with the caret after the text: where one goes on typing."""
        self.composer.moveCursor(QTextCursor.MoveOperation.End)
        self.composer.setFocus()
        self.composer.ensureCursorVisible()

    def cancel_edit(self) -> None:
        if self.editing is not None:
            self.model.editing = None
            self.composer.clear()
            self.attachments.clear()
        self.transcript.set_editing(None)
        self.edit_note.hide()

    def edit_unanswered(self) -> None:
        last = self.transcript.entries()[-1:]  # (seq, role, text)
        if last and last[0][1] == "user":
            self.begin_edit(last[0][0])

    def answer_unanswered(self) -> None:
        """Have the model answer the last message, which has none (its turn failed or was stopped)."""
        conv = self.conversation
        if conv is None or self.busy:
            return
        self.sending.emit()
        messages = self.model.messages(conv)
        if not messages or messages[-1].role != "user":
            self.render(self.model.stored(conv))  # answered meanwhile (another process): show what is stored
            return
        self.turns.answer(conv)

    def stop(self) -> None:
        """Stop this chat's reply, prefill or rebuild."""
        self.turns.stop(self.conversation)

    def escape(self) -> None:
        if self.busy or self.banner.progress.isVisible():
            self.stop()
        elif self.find_bar.isVisible():
            self.find_bar.hide()
        else:
            self.cancel_edit()

    # turns ----------------------------------------------------------------------------------------------------
    def _on_started(self, started: TurnStarted) -> None:
        conversation = started.conversation
        self.model.turn_started(conversation)
        if self.model.shows(conversation):
            self.transcript.hide_context_limit()
            self.transcript.hide_unanswered()
            turn = self.model.turn()
            if turn.pending is not None:
                self.transcript.add_pending(turn.pending, "sending…", turn.pending_files)
            self.transcript.begin_stream(turn.reply, turn.reasoning)  # a Continue starts from the reply it writes on
            self.status.say("Thinking…" if self.model_ready else "Waiting for the model…")
            self.status.speed.setText("")
        self.update_buttons()

    def _on_waiting(self, waiting: Waiting) -> None:
        if self.model.shows(waiting.conversation):
            self.status.say("Waiting: another Hearth process is answering in this chat…")
            if self.transcript.pending_message is not None:
                self.transcript.pending_message.set_note("waiting for another Hearth process…")

    def _on_accepted(self, accepted: Accepted) -> None:
        """The engine stored the message: mark it stored, and show turns another process added before it."""
        if self.model.shows(accepted.conversation):
            stored = self.model.accepted_stored(accepted)
            shown = self.transcript.entries()
            pending = self.transcript.pending_message
            if (accepted.user_seq is not None and pending is not None and stored[:-1] == shown
                    and stored[-1][1:] == ("user", pending.text)):
                self.transcript.confirm_pending(accepted.user_seq)
            elif stored != shown:
                self.render(stored)
        self._note_dropped(accepted.conversation, accepted.dropped_messages)

    def _on_resumed(self, resumed: Resumed) -> None:
        self._note_dropped(resumed.conversation, resumed.dropped_messages)
        if self.model.shows(resumed.conversation):
            self.attachments.refresh_total()  # the chat holds what the status bar now says

    def _on_prefill_progress(self, progress: PrefillProgress) -> None:
        if not self.model.shows(progress.conversation):
            return
        bar = self.prefill_bar
        bar.setRange(0, progress.total)
        bar.setValue(progress.done)
        bar.setFormat(f"Reading the conversation: %v of %m tokens · about {duration(progress.left_ms)} left")
        bar.setVisible(progress.done < progress.total)

    def _on_token(self, token: Token) -> None:
        if self.model.shows(token.conversation):
            self.prefill_bar.hide()
            self.transcript.stream(token.text, token.kind)

    def _on_finished(self, finished: Finished) -> None:
        conversation = finished.conversation
        if self.model.shows(conversation):
            self.prefill_bar.hide()
            if finished.reply_seq is None:  # stopped before a word: nothing was stored (a regenerate's reply is back)
                self.transcript.remove(self.transcript.stream_widget)
                self.model.note_no_reply(conversation, "The reply was stopped before its first word.")
                self.refresh()  # a regenerate stopped before a word: the earlier reply is back
                self._offer_next_step()
            else:
                self.transcript.end_stream(finished.reply, turn_note(finished), finished.reply_seq, finished.reasoning,
                                           finished.thought_ms, finished.tool_calls)
            self.status.finished(finished)
        self.update_buttons()  # Continue: the engine stored why the reply ended before this arrives

    def _on_failed(self, failed: ReplyFailed) -> None:
        """The turn failed after its message was stored: no empty reply stays behind; the message's block
        says why and offers to answer it again (also when the chat is opened later)."""
        if self.model.shows(failed.conversation):
            self.transcript.remove(self.transcript.stream_widget)
            stored = self.model.stored()
            if stored and stored[-1][1] == "assistant":  # cut off mid-reply (a server that stopped): what arrived is kept
                self.render(stored)
                if self.transcript.messages:  # the stored caption cannot tell a server that stopped from a quit
                    self.transcript.messages[-1].set_note("the server stopped mid-reply; what arrived is kept")
                self.update_buttons()
                self._problem(failed.conversation, failed.message)
                return
        self.model.note_no_reply(failed.conversation, failed.message)
        if self.model.shows(failed.conversation):
            self._offer_next_step()
        self._problem(failed.conversation, failed.message)

    def _on_refused(self, refused: MessageRefused) -> None:
        """The engine did not store the message: take it off the transcript and give it back to edit."""
        self._give_back(refused.conversation, refused.text, refused.attachments)
        self._problem(self.conversation, refused.message)

    def _give_back(self, conversation: str, text: str | None, attachments: tuple = ()) -> None:
        """Show the chat a refused turn was in, without its message and reply; the message goes back to
        the composer (before anything typed since), so nothing typed is lost."""
        if not self.model.shows(conversation):
            self.show_requested.emit(conversation)  # the text goes back to the chat it was written in
        self.transcript.remove(self.transcript.pending_message)
        self.transcript.remove(self.transcript.stream_widget)
        if text is not None:
            typed = self.composer.toPlainText()
            self.composer.setPlainText(text + ("\n" + typed if typed.strip() else ""))
        if attachments:  # its files come back as chips, before any attached since
            kept = self.attachments.attachments()
            self.attachments.clear()
            self.attachments.add(tuple(attachments) + tuple(a for a in kept if a not in attachments))

    # a chat longer than the model's context --------------------------------------------------------------
    def _note_dropped(self, conversation: str, count: int) -> None:
        self.model.note_dropped(conversation, count)
        if self.model.shows(conversation):
            self.transcript.set_dropped(count)

    def _on_context_full(self, hit: ContextLimitHit) -> None:
        """A turn was refused because the chat is too long: an error block with the ways on, not a status line."""
        self._give_back(hit.conversation, hit.message, hit.attachments)
        self.model.note_limit(hit)
        self.prefill_bar.hide()
        self.status.say("")
        self._offer_next_step()
        self.update_buttons()

    def new_chat_with_system_prompt(self) -> None:
        """A new chat with the refused chat's system prompt and settings; the message waits in the composer."""
        source = self.model.refused_chat()
        if source is None:
            return
        self.transcript.hide_context_limit()
        self.model.forget_limit(source.id)
        conv = self._new_chat()
        try:
            self.model.copy_prompt_and_settings(source, conv)
        except ConversationError as exc:
            QMessageBox.warning(self, "Hearth", f"The new chat could not take the system prompt: {exc}")

    def drop_oldest_and_retry(self) -> None:
        """Let the refused chat drop its oldest messages from now on, and send its message again."""
        hit, conv = self.model.limit_hit, self.model.refused_chat()
        if conv is None or self.turns.running(conv.id):
            return
        try:
            self.model.drop_oldest_from_now_on(conv)
        except ConversationError as exc:
            QMessageBox.warning(self, "Hearth", f"The chat's setting could not be saved: {exc}")
            return
        self.model.forget_limit(conv.id)
        self.transcript.hide_context_limit()
        if hit.message is None:
            self.turns.answer(conv.id)
            return
        typed = self.composer.toPlainText()  # the message was given back in front of anything typed since
        if typed == hit.message or typed.startswith(hit.message + "\n"):
            self.composer.setPlainText(typed[len(hit.message) + 1:])
        for draft in [d for d in self.attachments.drafts.values() if d.attachment in hit.attachments]:
            self.attachments.remove(draft.key)  # its files go with it again
        self.sending.emit()
        self.turns.send(conv.id, hit.message, hit.attachments)

    # attachments ------------------------------------------------------------------------------------------------
    def choose_files(self) -> QFileDialog:
        """The paperclip: a file dialog in the folder last used (window-modal, no nested loop)."""
        return self.attachments.choose_files(self, self.settings)

    def _on_typed(self) -> None:
        if self.attachments.drafts:  # only then is the typed text counted (a long paste alone costs nothing)
            self.attachments.set_typed(self.composer.toPlainText())

    def _on_attachments_changed(self) -> None:
        self.composer.has_attachments = bool(self.attachments.drafts)
        if self.attachments.drafts:
            self.attachments.set_typed(self.composer.toPlainText())

    def _context_facts(self) -> tuple[int | None, int, str | None]:
        """The model's context length, what the chat shown holds now and its context policy (for the total)."""
        policy = None
        try:
            conv = self.model.store.get(self.conversation) if self.conversation else None
            if conv is not None:
                policy = self.turns.effective(conv.id, conv.settings).get("context_policy")
        except HearthError as exc:  # the total leaves the policy out; its turn says what is wrong
            log.warning("could not read the chat's context policy: %s", exc)
        return self.status.limit, self.status.used, policy

    def new_chat_with_documents(self, seq: int | None = None, source: str | None = None) -> str | None:
        """A new chat with the source chat's system prompt and settings whose message box holds the files of
        message ``seq`` (None: every file of the chat, once each), as stored: no file is read again. Its first
        message then starts as the source's did, so its saved context is restored, not read again."""
        source = source or self.conversation
        if source is None:
            return None
        documents = self.model.documents_of(source, seq)
        conv = self.model.store.get(source)
        if not documents or conv is None:
            return None
        self.cancel_edit()
        target = self._new_chat()
        if target != source:
            try:
                self.model.copy_prompt_and_settings(conv, target)
            except ConversationError as exc:
                QMessageBox.warning(self, "Hearth", f"The new chat could not take the system prompt: {exc}")
        self.attachments.clear()
        self.attachments.add(documents)
        self._focus_composer_at_end()
        self.status.say("A new chat with the same documents: type your question and send it.")
        return target

    def shutdown(self) -> None:
        """The window is closing: end the attachment reader's thread; nothing is counted any more."""
        self.attachments.shutdown()

    def _problem(self, conversation: str | None, message: str) -> None:
        if self.model.shows(conversation) or not conversation:
            self.prefill_bar.hide()
            self.status.problem(message)
        self.update_buttons()
