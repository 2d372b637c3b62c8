"""The chat transcript: one widget per message, streamed replies, copy/edit/regenerate, find.

Each message is a read-only QTextBrowser sized to its content (so text can be selected and searched)
inside one scroll area. A streaming reply is re-rendered at most every 50 ms, however fast tokens
arrive, so long replies never stall the event loop.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping

from PySide6.QtCore import QEvent, Qt, QTimer, QUrl, Signal
from PySide6.QtGui import (
    QDesktopServices,
    QGuiApplication,
    QPalette,
    QTextCharFormat,
    QTextCursor,
    QTextDocument,
    QTextOption,
)
from PySide6.QtWidgets import (
    QFrame,
    QHBoxLayout,
    QLabel,
    QScrollArea,
    QSizePolicy,
    QTextBrowser,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from app.agent_blocks import ThinkingBlock, ToolCallBlock, ToolResultBlock, thought_title
from app.alternatives import VersionSwitcher
from app.attachment_block import AttachmentBlock
from app.context_blocks import ContextLimitBlock, UnansweredBlock, ViewMarker
from app.markdown_view import OPENABLE_SCHEMES, appendable, copy_index, in_open_fence, prepare, render
from app.tool_permission import ToolPermissionBlock

ROLE_NAMES = {"user": "You", "assistant": "Hearth", "system": "System prompt", "tool": "Tool"}
STREAM_RENDER_MS = 50
RENDER_BUDGET_MS = 5.0  # UI work per event-loop turn when filling in a long chat; layout and paint follow
SETTLE_MS = 30  # after a chat is drawn and its messages shown (they are shown a turn or two later)
GRAVEYARD_BATCH = 12
UNSTORED = -1  # the seq of a message shown but not (yet) stored: a pending message, a reply being written


def open_link(url: QUrl) -> bool:
    """Open a link from a message outside Hearth, only if it is http, https or mailto (model output is
    untrusted: no file:, no custom schemes). True if it was opened."""
    if url.scheme().lower() not in OPENABLE_SCHEMES:
        logging.getLogger(__name__).info("not opening a %r link from a message", url.scheme())
        return False
    return QDesktopServices.openUrl(url)


class MessageBody(QTextBrowser):
    """Rich text that is exactly as tall as its content, wrapped to its width (an unbroken run of
    characters wraps anywhere, so nothing ever needs a horizontal scrollbar)."""

    code_copy_requested = Signal(int)  # the Copy link of code block N

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setOpenLinks(False)  # links are checked first: see open_link
        self.anchorClicked.connect(self._on_link)
        self.setWordWrapMode(QTextOption.WrapMode.WrapAtWordBoundaryOrAnywhere)
        self.setFrameShape(QFrame.Shape.NoFrame)
        self.setVerticalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
        self.viewport().setAutoFillBackground(False)
        self.setStyleSheet("background: transparent;")
        self.document().documentLayout().documentSizeChanged.connect(self._fit)

    def _on_link(self, url: QUrl) -> None:
        index = copy_index(url.toString())
        if index is not None:
            self.code_copy_requested.emit(index)
        else:
            open_link(url)

    def _fit(self, *_: object) -> None:
        height = int(self.document().size().height()) + 4
        if height != self.height():
            self.setFixedHeight(height)
            if self.parentWidget() is not None:
                # The transcript's layout caches each message's size: without this it kept the height
                # the message had while it was first laid out narrow (a tall empty box in the preview).
                self.parentWidget().updateGeometry()

    def resizeEvent(self, event) -> None:  # noqa: N802 - Qt's name
        super().resizeEvent(event)
        self.document().setTextWidth(self.viewport().width())
        self._fit()


class MessageWidget(QFrame):
    _redrawing = False
    copy_requested = Signal(str)
    edit_requested = Signal(int)  # message seq
    regenerate_requested = Signal()
    version_requested = Signal(int, int)  # message seq, the version (from 0) to show and continue with
    continue_requested = Signal()  # write on at the end of this reply
    documents_requested = Signal(int)  # message seq: a new chat whose first message carries its attachments

    def __init__(self, seq: int, role: str, text: str, parent: QWidget | None = None, read_only: bool = False,
                 files: tuple[tuple, str] | None = None, agent=None):
        """``files``: (the attachments, the typed text) of a user message that carries files; ``agent``: the
        stored message (engine.api's Message) when it carries a reply's thinking or tool calls, or is a tool's
        result: those are collapsed blocks around the text."""
        super().__init__(parent)
        self.read_only = read_only
        self.seq, self.role, self.text = seq, role, text
        self.thinking_block: ThinkingBlock | None = None
        self.tool_blocks: list[ToolCallBlock] = []
        self.result_block: ToolResultBlock | None = None
        self._thinking_from: float | None = None  # a streamed reply: when its first thinking piece came
        self.codes: list[str] = []  # the exact text of each code block shown, for its Copy link
        self.attachments: tuple = ()  # the files this message carries (engine.api.Attachment)
        self.attachment_blocks: list[AttachmentBlock] = []
        self.typed_text: str | None = None  # with attachments: what was typed (``text`` is the whole message)
        self.documents_button: QToolButton | None = None
        self.editing = False
        self._colours = self._palette_key()  # the palette its text and frame were drawn with
        self.setObjectName(f"message-{role}")
        self.setFrameShape(QFrame.Shape.StyledPanel if role == "user" else QFrame.Shape.NoFrame)
        # Never taller than its content: spare height in a short chat belongs below the messages (a
        # preview's first message was drawn as a tall empty box).
        self.setSizePolicy(QSizePolicy.Policy.Preferred, QSizePolicy.Policy.Maximum)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(10, 6, 10, 6)
        head = QHBoxLayout()
        self.who = QLabel(f"<b>{ROLE_NAMES.get(role, role)}</b>")
        head.addWidget(self.who)
        self.note = QLabel("")
        self.note.setEnabled(False)  # drawn in the palette's dim text colour
        self.note.setTextFormat(Qt.TextFormat.PlainText)  # a model's name comes from a file: never markup
        # A long note wraps and never widens the message (it pushed Copy off-screen).
        self.note.setWordWrap(True)
        self.note.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        head.addWidget(self.note, 1)
        self.copy_button = self._tool("Copy", "Copy this message", lambda: self.copy_requested.emit(self.copy_text()))
        head.addWidget(self.copy_button)
        self._add_reply_tools(head)
        if role == "user" and not read_only:
            head.addWidget(self._tool("Edit", "Edit this message and send it again",
                                      lambda: self.edit_requested.emit(self.seq)))
        self.regenerate_button = self._tool("Regenerate", "Write this reply again", self.regenerate_requested.emit)
        self.regenerate_button.setVisible(False)
        head.addWidget(self.regenerate_button)
        layout.addLayout(head)
        self.body = MessageBody(self)
        self.body.setAccessibleName(f"{ROLE_NAMES.get(role, role)} message")
        self.body.code_copy_requested.connect(self._copy_code)
        layout.addWidget(self.body)
        if files is not None and files[0]:
            self.text = text  # never laid out whole: the documents are collapsed blocks
            self.set_attachments(*files)
        else:
            self.set_text(text)
        if role == "tool":
            self._show_result(agent)
        elif agent is not None:
            self.set_agent(agent.reasoning, agent.thought_ms, agent.tool_calls)

    # an agent's parts: thinking, tool calls, a tool's result (app/agent_blocks.py) -------------------------------
    def _show_result(self, agent) -> None:
        """A tool's result: the whole message is one collapsed block (its body stays hidden: it is the block's
        text, still found by Find)."""
        self.result_block = ToolResultBlock(self.text, getattr(agent, "name", ""), getattr(agent, "tool_call_id", ""),
                                            self, getattr(agent, "run_state", ""))
        self.layout().insertWidget(self.layout().indexOf(self.body), self.result_block)
        self.body.hide()

    def set_agent(self, reasoning: str, thought_ms: int | None, tool_calls: tuple) -> None:
        """A reply's thinking (a block above its text) and its tool calls (a block each, below it)."""
        if reasoning:
            if self.thinking_block is None:
                self._add_thinking(ThinkingBlock(reasoning, thought_ms, parent=self))
            else:
                self.thinking_block.finish(reasoning, thought_ms)
        for block in self.tool_blocks:
            block.hide()
            block.deleteLater()
        self.tool_blocks = [ToolCallBlock(c, self) for c in tool_calls]
        for block in self.tool_blocks:
            self.layout().addWidget(block)
        if tool_calls and not self.text:
            self.body.hide()  # a reply that only calls tools: no empty "…" above its calls

    def _add_thinking(self, block: ThinkingBlock) -> None:
        self.thinking_block = block
        self.layout().insertWidget(self.layout().indexOf(self.body), block)  # thought before it answered

    def stream_thinking(self, piece: str) -> None:
        """A piece of the thinking of a reply being written: the block says "Thinking…" until the reply starts."""
        if self.thinking_block is None:
            self._thinking_from = time.monotonic()
            self._add_thinking(ThinkingBlock("", None, streaming=True, parent=self))
        self.thinking_block.append_text(piece)

    def thinking_ended(self) -> None:
        """The first piece of the reply after the thinking: how long it thought, as measured here (the stored
        figure replaces it at the end)."""
        block = self.thinking_block
        if block is not None and block.streaming:
            block.streaming = False
            block.thought_ms = int((time.monotonic() - (self._thinking_from or time.monotonic())) * 1000)
            block.set_title(thought_title(block.thought_ms))

    def copy_text(self) -> str:
        """What Copy copies: the reply's text (never its thinking), then each call it made with its arguments."""
        calls = [f"{b.call.name}({b.text})" for b in self.tool_blocks]
        return "\n\n".join(([self.text] if self.text else []) + calls)

    def _tool(self, label: str, tip: str, slot) -> QToolButton:
        b = QToolButton(self)
        b.setText(label)
        b.setToolTip(tip)
        b.setAccessibleName(tip)
        b.setAutoRaise(True)
        b.clicked.connect(slot)
        return b

    def set_attachments(self, attachments: tuple, typed_text: str) -> None:
        """A user message with files: the body shows what was typed, and each file is a collapsed block
        under it; ``text`` stays the whole message as stored (what Copy copies and the store compares)."""
        for block in self.attachment_blocks:
            block.hide()
            block.deleteLater()
        self.attachments, self.typed_text = tuple(attachments), typed_text
        self.attachment_blocks = [AttachmentBlock(a, self) for a in self.attachments]
        layout = self.layout()
        for block in self.attachment_blocks:
            layout.insertWidget(layout.indexOf(self.body), block)  # the documents come first, as the model reads them
        self.body.setPlainText(typed_text)
        self.body.setVisible(bool(typed_text))
        if self.attachments and not self.read_only and self.documents_button is None:
            self.documents_button = self._tool("New chat with these documents",
                                               "Start a new chat whose first message carries these files",
                                               lambda: self.documents_requested.emit(self.seq))
            self._put_in_head(self.documents_button)
        if self.documents_button is not None:
            self.documents_button.setVisible(bool(self.attachments))

    def set_text(self, text: str) -> None:
        """Replies are Markdown; what the person typed is shown exactly as typed (and lays out ~5×
        faster, which matters for pasted pages of text)."""
        self.text = text
        self.codes = []
        if self.attachments and self.typed_text is not None:
            return  # the body shows the typed text (set_attachments); the files are their own blocks
        if not text:
            self.body.setHtml("<i>…</i>")
            self.body.setVisible(not self.tool_blocks and self.role != "tool")
        elif self.role == "assistant":
            self.body.setVisible(True)
            rendered = render(text, self.palette())
            self.codes = rendered.codes
            self.body.setHtml(rendered.html)
        else:
            self.body.setPlainText(text)

    def _palette_key(self) -> tuple[str, str, str]:
        p = self.palette()
        return tuple(p.color(r).name() for r in (QPalette.ColorRole.Base, QPalette.ColorRole.Text,
                                                 QPalette.ColorRole.Highlight))

    def changeEvent(self, event) -> None:  # noqa: N802 - Qt's name
        """A new palette (the light/dark theme changed): draw the code colours and the edit frame again."""
        super().changeEvent(event)
        if event.type() != QEvent.Type.PaletteChange or self._redrawing or not hasattr(self, "_colours"):
            return
        self._redrawing = True  # reading the palette or setting a style sheet may send this event again
        try:
            if self._palette_key() != self._colours:
                self._colours = self._palette_key()
                if self.role == "assistant" and self.text:
                    self.set_text(self.text)
                if self.editing:
                    self.set_editing(True)
        finally:
            self._redrawing = False

    def show_partial(self, text: str) -> None:
        """A reply being written, redrawn every 50 ms: when it only grew by more lines of the code block
        being written or more plain words, those characters are appended to what is drawn (laying out a
        long reply with its code blocks again costs tens of ms each time); else it is drawn whole. Its
        final text is drawn whole (``set_text``), highlighted."""
        added = appendable(self.text, text) if self.role == "assistant" else None
        if added is None:
            self.set_text(text)
            return
        cursor = QTextCursor(self.body.document())
        cursor.movePosition(QTextCursor.MoveOperation.End)  # the block being written ends the document
        plain = QTextCharFormat(cursor.charFormat())  # the code font (or the paragraph's), not a token's colour
        plain.setForeground(self.palette().color(QPalette.ColorRole.Text))
        plain.setFontWeight(400)
        plain.setFontItalic(False)
        plain.setAnchor(False)
        plain.setAnchorHref("")
        cursor.insertText(added, plain)
        self.text = text
        if in_open_fence(text) and self.codes:
            self.codes[-1] += added  # the Copy link of the block being written copies what is there

    def _copy_code(self, index: int) -> None:
        if 0 <= index < len(self.codes):
            self.copy_requested.emit(self.codes[index])

    def set_note(self, note: str) -> None:
        self.note.setText(note)
        self.note.setToolTip(note)

    def set_editing(self, editing: bool) -> None:
        """Mark this message as the one being edited: a highlight-coloured frame and tint from the palette
        (so it shows on light and dark themes alike)."""
        self.editing = editing
        if editing:
            hl = self.palette().color(QPalette.ColorRole.Highlight)
            name = self.objectName()
            self.setStyleSheet(f"#{name} {{ border: 2px solid {hl.name()}; border-radius: 6px; "
                               f"background-color: rgba({hl.red()}, {hl.green()}, {hl.blue()}, 0.12); }}")
            self.note.setText("editing")
            self.note.setEnabled(True)
        else:
            self.setStyleSheet("")
            self.note.setEnabled(False)
            if self.note.text() == "editing":
                self.note.setText("")

    # versions of a reply and Continue (the header row) --------------------------------------------------------
    def _add_reply_tools(self, head: QHBoxLayout) -> None:
        """‹ 2/3 › for a regenerated reply, and Continue for one stopped by the length limit: made when first
        asked for (only the last reply ever has them), so drawing a long chat makes no widgets for them."""
        self._head = head
        self._versions: VersionSwitcher | None = None
        self._continue: QToolButton | None = None

    def _put_in_head(self, w: QWidget) -> None:
        self._head.insertWidget(self._head.indexOf(self.copy_button), w)  # left of Copy

    @property
    def versions(self) -> VersionSwitcher:
        if self._versions is None:
            self._versions = VersionSwitcher(self)
            self._versions.step_requested.connect(
                lambda delta: self.version_requested.emit(self.seq, self._versions.index + delta))
            self._put_in_head(self._versions)
        return self._versions

    @property
    def continue_button(self) -> QToolButton:
        if self._continue is None:
            self._continue = self._tool("Continue", "Continue this reply where the length limit stopped it",
                                        self.continue_requested.emit)
            self._continue.setVisible(False)
            self._put_in_head(self._continue)
        return self._continue

    def set_versions(self, index: int, count: int) -> None:
        self.versions.set_versions(index, count)

    def hide_reply_tools(self) -> None:
        """No longer the last reply (or busy): no ‹ › and no Continue (nothing is made to hide them)."""
        if self._versions is not None:
            self._versions.hide()
        if self._continue is not None:
            self._continue.hide()


class TranscriptView(QScrollArea):
    copy_requested = Signal(str)
    edit_requested = Signal(int)
    regenerate_requested = Signal()
    version_requested = Signal(int, int)  # seq, version
    continue_requested = Signal()
    documents_requested = Signal(int)  # seq of a message whose attachments start a new chat

    def __init__(self, parent: QWidget | None = None, read_only: bool = False):
        super().__init__(parent)
        self.read_only = read_only  # a preview: no Edit or Regenerate
        self.setWidgetResizable(True)
        self.setAccessibleName("Conversation transcript")
        self.setFrameShape(QFrame.Shape.NoFrame)
        # Messages wrap to the width; a sideways scrollbar only ever clipped text (defect 3).
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        inner = QWidget()
        self._layout = QVBoxLayout(inner)
        self._layout.setContentsMargins(12, 12, 12, 12)
        self._layout.setSpacing(8)
        self._layout.addStretch(1)
        self.setWidget(inner)
        self.messages: list[MessageWidget] = []
        self._streaming: MessageWidget | None = None
        self._pending: str | None = None  # streamed text not yet rendered
        self.pending_message: MessageWidget | None = None  # the user's message until the engine stores it
        self._render_timer = QTimer(self)
        self._render_timer.setInterval(STREAM_RENDER_MS)
        self._render_timer.timeout.connect(self._flush)
        self._find_index = 0
        self._backlog: list[tuple[int, str, str]] = []  # older messages still to render, oldest first
        self._notes: dict[int, str] = {}  # seq → the note a stored message is drawn with (a reply's caption)
        self._files: dict[int, tuple[tuple, str]] = {}  # seq → (its attachments, the typed text) for messages with files
        self._agents: dict[int, object] = {}  # seq → the stored Message, for those with thinking, tool calls or results
        self._prepared: tuple[int, str] | None = None  # the backlog message whose code is already highlighted
        self._graveyard: list[MessageWidget] = []  # widgets of the previous chat, deleted a few at a time
        self._chores = QTimer(self)
        self._chores.setInterval(0)
        self._chores.timeout.connect(self._do_chores)
        # Stick to the newest message while the reader is at the bottom, as content and heights settle.
        self._stick = True
        bar = self.verticalScrollBar()
        bar.rangeChanged.connect(lambda _lo, hi: bar.setValue(hi) if self._stick else None)
        bar.valueChanged.connect(lambda v: setattr(self, "_stick", v >= bar.maximum() - 24))
        self.empty_hint = QLabel("Start the conversation below.", inner)
        self.empty_hint.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.empty_hint.setEnabled(False)
        self._layout.insertWidget(0, self.empty_hint)
        self._dropped = 0  # stored messages before the first one the model reads
        self.view_marker = ViewMarker(inner)
        self.context_limit = ContextLimitBlock(inner)
        self.unanswered = UnansweredBlock(inner)
        self.tool_permission = ToolPermissionBlock(inner)  # a tool call waiting for permission, or running

    # content ------------------------------------------------------------------------------------------
    def clear(self) -> None:
        self._render_timer.stop()
        self._streaming, self._pending, self.pending_message = None, None, None
        self.set_dropped(0)
        self.hide_context_limit()
        self.hide_unanswered()
        self.hide_tool_prompt()
        for w in self.messages:
            w.hide()
        self._graveyard.extend(self.messages)
        self.messages.clear()
        self._backlog.clear()
        self._notes = {}
        self._files = {}
        self._agents = {}
        self.empty_hint.setVisible(True)
        self._chores.start()

    def load(self, messages: list[tuple[int, str, str]], notes: Mapping[int, str] | None = None,
             files: Mapping[int, tuple[tuple, str]] | None = None, agents: Mapping[int, object] | None = None) -> None:
        """Show a whole conversation: the newest messages at once, older ones a few per event-loop
        turn (within a frame's budget), so opening a long chat never freezes the window. ``notes``: seq →
        the small note beside that message (why a reply stopped, the model that wrote it); ``files``: seq →
        (the attachments, the typed text) of each message that carries files; ``agents``: seq → the stored
        message of each that carries thinking or tool calls, or is a tool's result."""
        self.clear()
        self._notes = dict(notes or {})
        self._files = dict(files or {})
        self._agents = dict(agents or {})
        self._stick = True
        self._backlog = list(messages)
        self._render_backlog(RENDER_BUDGET_MS, split=False)  # the newest messages are shown at once
        self.scroll_to_bottom()

    def _render_backlog(self, budget_ms: float, split: bool = True) -> None:
        started = time.perf_counter()
        at_bottom = self._at_bottom()
        steps = 0
        while self._backlog and (time.perf_counter() - started) * 1000 < budget_ms:
            seq, role, text = self._backlog[-1]
            if split and role == "assistant" and self._prepared != (seq, text) and budget_ms < 1e9:
                # Lexing a reply's code (Pygments) and building the reply's widget cost ~5 ms each: the
                # lexing gets a turn of the event loop of its own (the highlighted blocks are cached, and
                # building the widget next turn reuses them), so no turn pays for both.
                if steps:
                    break
                prepare(text, self.palette())
                self._prepared = (seq, text)
                break
            steps += 1
            self._backlog.pop()
            w = self._make(seq, role, text)
            self._layout.insertWidget(1, w)  # above the rendered ones, below the empty hint
            self.messages.insert(0, w)
        self.empty_hint.setVisible(not self.messages)
        self._update_regenerate()
        if self._dropped and self.view_marker.isHidden():
            self._place_marker()  # its message may have just been drawn
        if at_bottom:
            self.scroll_to_bottom()
        if self._backlog:
            self._chores.start()
        else:
            QTimer.singleShot(SETTLE_MS, self, self._settle)

    def _settle(self) -> None:
        """Once a chat is drawn: have the layout ask every message its size again. A message fitted to its
        text before it was shown keeps, in the layout's cache, the size a fresh text box asks for (~190 px:
        a tall empty box in the browser's preview)."""
        for w in self.messages:
            w.updateGeometry()

    @property
    def loading(self) -> bool:
        """Older messages are still being rendered, a few per event-loop turn."""
        return bool(self._backlog)

    def entries(self) -> list[tuple[int, str, str]]:
        """The stored messages shown, (seq, role, text) oldest first: not the pending message, not a reply
        being written or one that failed. The window compares this with the store to notice turns added
        elsewhere."""
        shown = [(w.seq, w.role, w.text) for w in self.messages if w.seq != UNSTORED]
        return self._backlog + shown

    def finish_loading(self) -> None:
        """Render everything still pending now (before a search over the whole chat)."""
        while self._backlog:
            self._render_backlog(1e9)

    def _do_chores(self) -> None:
        for w in self._graveyard[:GRAVEYARD_BATCH]:
            w.deleteLater()
        del self._graveyard[:GRAVEYARD_BATCH]
        if self._backlog:
            self._render_backlog(RENDER_BUDGET_MS)
        if not self._graveyard and not self._backlog:
            self._chores.stop()

    def _make(self, seq: int, role: str, text: str, files: tuple[tuple, str] | None = None) -> MessageWidget:
        w = MessageWidget(seq, role, text, self.widget(), self.read_only, files or self._files.get(seq),
                          self._agents.get(seq))
        if self._notes.get(seq):
            w.set_note(self._notes[seq])
        w.copy_requested.connect(self.copy_requested)
        w.edit_requested.connect(self.edit_requested)
        w.regenerate_requested.connect(self.regenerate_requested)
        w.version_requested.connect(self.version_requested)
        w.continue_requested.connect(self.continue_requested)
        w.documents_requested.connect(self.documents_requested)
        return w

    def add(self, seq: int, role: str, text: str, files: tuple[tuple, str] | None = None) -> MessageWidget:
        at_bottom = self._at_bottom()
        w = self._make(seq, role, text, files)
        self._layout.insertWidget(self._layout.count() - 1, w)
        self.messages.append(w)
        self.empty_hint.setVisible(False)
        self._update_regenerate()
        if at_bottom or role == "user":
            self.scroll_to_bottom()
        return w

    # the model's view and the context limit -----------------------------------------------------------------
    def set_dropped(self, count: int) -> None:
        """Mark where the model's view starts: ``count`` stored messages come before it (0: no marker)."""
        self._dropped = max(0, count)
        self._place_marker()

    def _place_marker(self) -> None:
        marker = self.view_marker
        self._layout.removeWidget(marker)
        marker.hide()
        stored = [w for w in self.messages if w.seq != UNSTORED]
        first = self._dropped - len(self._backlog)  # the first message read, among those drawn
        if self._dropped <= 0 or not 0 <= first < len(stored):
            return  # no marker, or its message is not drawn yet (placed when it is)
        marker.set_count(self._dropped)
        self._layout.insertWidget(self._layout.indexOf(stored[first]), marker)
        marker.show()

    def show_context_limit(self, message: str, can_drop: bool) -> None:
        """The error block at the end of the chat: the turn was refused because the chat is too long."""
        self.hide_unanswered()
        self.context_limit.set_problem(message, can_drop)
        self._show_last(self.context_limit)

    def hide_context_limit(self) -> None:
        self._layout.removeWidget(self.context_limit)
        self.context_limit.hide()
        self.empty_hint.setVisible(not self.messages)

    def show_unanswered(self, reason: str = "") -> None:
        """The block under a last message that has no reply: answer it now, or edit it."""
        self.hide_context_limit()
        self.unanswered.set_reason(reason)
        self._show_last(self.unanswered)

    def hide_unanswered(self) -> None:
        self._layout.removeWidget(self.unanswered)
        self.unanswered.hide()
        self.empty_hint.setVisible(not self.messages)

    def show_tool_prompt(self, call, server: str = "", *, running: bool = False, interrupted: bool = False) -> None:
        """The block under the last message: the model wants to run ``call`` (or it runs, or it was running when
        Hearth closed)."""
        self.hide_unanswered()
        self.hide_context_limit()
        if running:
            self.tool_permission.running(call, server)
        else:
            self.tool_permission.ask(call, server, interrupted)
        self._show_last(self.tool_permission)

    def hide_tool_prompt(self) -> None:
        self._layout.removeWidget(self.tool_permission)
        self.tool_permission.hide()
        self.empty_hint.setVisible(not self.messages)

    def _show_last(self, block: QWidget) -> None:
        self._layout.removeWidget(block)
        self._layout.insertWidget(self._layout.count() - 1, block)  # after the last message
        self.empty_hint.hide()  # "Start the conversation below." above an error reads wrong
        block.show()
        self.scroll_to_bottom()

    def set_editing(self, seq: int | None) -> None:
        """Highlight the message being edited (None: none is)."""
        for w in self.messages:
            if w.editing != (w.seq == seq and seq is not None):
                w.set_editing(not w.editing)
        if seq is not None:
            target = next((w for w in self.messages if w.seq == seq), None)
            if target is not None:
                self.ensureWidgetVisible(target)

    def _update_regenerate(self) -> None:
        for i, w in enumerate(self.messages):
            w.regenerate_button.setVisible(w.role == "assistant" and i == len(self.messages) - 1
                                           and self._streaming is None and not self.read_only)

    def last_reply(self) -> MessageWidget | None:
        """The last message shown, when it is a stored reply (the one Regenerate, a version and Continue act on)."""
        last = self.messages[-1] if self.messages else None  # the newest are drawn first: never in the backlog
        return last if last is not None and last.role == "assistant" and last.seq != UNSTORED else None

    def add_pending(self, text: str, note: str, files: tuple[tuple, str] | None = None) -> MessageWidget:
        """The user's message, shown at once while the engine has not stored it yet (``files``: its
        attachments and the typed text, when it carries files; ``text`` is then the whole message)."""
        self.pending_message = self.add(UNSTORED, "user", text, files)
        self.pending_message.set_note(note)
        return self.pending_message

    def confirm_pending(self, seq: int) -> None:
        """The engine stored the pending message as ``seq``."""
        if self.pending_message is not None:
            self.pending_message.seq = seq
            if self.pending_message.attachments:
                self._files[seq] = (self.pending_message.attachments, self.pending_message.typed_text or "")
            self.pending_message.set_note("")
            self.pending_message = None

    def remove(self, w: MessageWidget | None) -> None:
        if w is None or w not in self.messages:
            return
        if w is self._streaming:
            self._render_timer.stop()
            self._streaming, self._pending = None, None
        if w is self.pending_message:
            self.pending_message = None
        self.messages.remove(w)
        w.hide()
        self._graveyard.append(w)
        self._chores.start()
        self.empty_hint.setVisible(not self.messages)
        self._update_regenerate()

    def begin_stream(self, text: str = "", reasoning: str = "") -> MessageWidget:
        """An empty reply to stream into (or one already ``text`` long, with ``reasoning`` thought so far, when
        switching back to a chat)."""
        w = self.add(UNSTORED, "assistant", "")
        self._streaming, self._pending = w, text
        if reasoning:
            w.stream_thinking(reasoning)
            if text:
                w.thinking_ended()
        if text:
            self._render_timer.start()
        self._update_regenerate()
        return w

    @property
    def streaming(self) -> bool:
        return self._streaming is not None

    @property
    def stream_widget(self) -> MessageWidget | None:
        return self._streaming

    def stream(self, piece: str, kind: str = "content") -> None:
        """A piece of the reply being written; ``kind`` "reasoning": of its thinking (its own block)."""
        if self._streaming is None:
            return
        if kind == "reasoning":
            self._streaming.stream_thinking(piece)
            return
        self._streaming.thinking_ended()
        self._pending = (self._pending or "") + piece
        if not self._render_timer.isActive():
            self._render_timer.start()

    def end_stream(self, text: str, note: str = "", seq: int = UNSTORED, reasoning: str = "",
                   thought_ms: int | None = None, tool_calls: tuple = ()) -> None:
        """The reply is done: its final text, a note (why it stopped, a failed save), its stored seq, and its
        thinking (with how long it took, as stored) and tool calls."""
        self._render_timer.stop()
        if self._streaming is not None:
            self._streaming.seq = seq
            self._streaming.set_text(text)
            self._streaming.set_note(note)
            if reasoning or tool_calls or self._streaming.thinking_block is not None:
                self._streaming.set_agent(reasoning, thought_ms, tool_calls)
        self._streaming, self._pending = None, None
        self._update_regenerate()

    def _flush(self) -> None:
        if self._streaming is None or self._pending is None:
            self._render_timer.stop()
            return
        at_bottom = self._at_bottom()
        self._streaming.show_partial(self._pending)
        if at_bottom:
            self.scroll_to_bottom()

    def _at_bottom(self) -> bool:
        bar = self.verticalScrollBar()
        return bar.value() >= bar.maximum() - 24

    def scroll_to_bottom(self) -> None:
        # with the view as the timer's context: a view deleted before the timer fires is not touched
        QTimer.singleShot(0, self, lambda: self.verticalScrollBar().setValue(self.verticalScrollBar().maximum()))

    # find -----------------------------------------------------------------------------------------------
    def find(self, needle: str, backward: bool = False) -> bool:
        """Select the next match of ``needle`` across messages (wrapping); False if there is none."""
        self.finish_loading()
        if not needle or not self.messages:
            return False
        flags = QTextDocument.FindFlag.FindBackward if backward else QTextDocument.FindFlag(0)
        n = len(self.messages)
        start = min(self._find_index, n - 1)
        for step in range(n + 1):
            i = (start - step) % n if backward else (start + step) % n
            body = self.messages[i].body
            if step > 0:  # entering another message: search it from its start (or end)
                cursor = body.textCursor()
                cursor.movePosition(QTextCursor.MoveOperation.End if backward else QTextCursor.MoveOperation.Start)
                body.setTextCursor(cursor)
            if body.find(needle, flags):
                for j, other in enumerate(self.messages):
                    if j != i:
                        c = other.body.textCursor()
                        c.clearSelection()
                        other.body.setTextCursor(c)
                self._find_index = i
                self.ensureWidgetVisible(self.messages[i])
                return True
        return False

    def match_count(self, needle: str) -> int:
        if not needle:
            return 0
        low = needle.lower()
        return sum(w.body.toPlainText().lower().count(low) for w in self.messages)

    # colours (issue 18: dark mode) -------------------------------------------------------------------------
    def restyle(self) -> None:
        """Draw every message again from its text: replies are HTML whose colours were taken from the
        palette when rendered, so a theme switch needs this."""
        self._restyle_due = False
        for w in self.messages:
            # A style sheet fixes a widget's palette when it is polished: polish the body again so its
            # text takes the new palette's colour.
            w.body.setStyleSheet(w.body.styleSheet())
            # The next flush renders a streaming reply in the new colours anyway; a message whose own
            # PaletteChange already redrew it is not laid out twice.
            if w is not self._streaming and w._colours != w._palette_key():
                w._colours = w._palette_key()
                w.set_text(w.text)

    def changeEvent(self, event) -> None:  # noqa: N802 - Qt's name
        super().changeEvent(event)
        if event.type() == QEvent.Type.FontChange:
            # A body's style sheet stops Qt from passing a new font down to it once it is shown.
            for w in self.messages:
                w.body.setFont(w.font())
        if event.type() == QEvent.Type.PaletteChange and not getattr(self, "_restyle_due", False):
            self._restyle_due = True  # once, after every child has its new palette
            QTimer.singleShot(0, self, self.restyle)


def copy_to_clipboard(text: str) -> None:
    QGuiApplication.clipboard().setText(text)
