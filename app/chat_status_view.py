"""What the banner and the status line say about the chat shown as it opens: how its context was obtained,
an opening's rebuild (started, its progress, how it ended), the reply's live figures, and the chat's size
after a version of its last reply was chosen.

It draws only for the chat ``ChatSessionModel`` shows; an event of another chat changes nothing here.
"""

from __future__ import annotations

from app.banner import CacheBanner
from app.chat_session_model import ChatSessionModel
from app.conversation_events import EventDispatcher, LiveUpdate, Rebuilding
from app.status import StatusLine
from app.text import rebuilding_note, rebuilt_note, version_chosen_note
from engine.types import ChatTokens, Progress, Rebuilt, Resumed, ResumeSource


class ChatStatusView:
    def __init__(self, model: ChatSessionModel, banner: CacheBanner, status: StatusLine):
        self.model, self.banner, self.status = model, banner, status

    def listen(self, events: EventDispatcher) -> None:
        events.on_each({Resumed: self.on_resumed, Rebuilding: self.on_rebuilding, Progress: self.on_rebuild_progress,
                        Rebuilt: self.on_rebuilt, LiveUpdate: self.on_live, ChatTokens: self.on_chat_tokens})

    def on_resumed(self, resumed: Resumed) -> None:
        conversation, resume = resumed.conversation, resumed.resume
        # An opening's rebuild is told by ``Rebuilding``/``Rebuilt``, banner and status bar together;
        # said here, the status bar would read "rebuilt" while the banner still says rebuilding.
        opening_rebuild = resume.source == ResumeSource.REBUILT and not self.model.turns.running(conversation)
        if self.model.shows(conversation) and not opening_rebuild:
            self.status.resumed(resume)

    def on_rebuilding(self, rebuilding: Rebuilding) -> None:
        conversation, resume = rebuilding.conversation, rebuilding.resume
        if self.model.shows(conversation):
            self.banner.rebuilding(conversation, resume.plain, resume.message)
            self.status.say(rebuilding_note(resume.plain or resume.reason or ""))

    def on_rebuild_progress(self, progress: Progress) -> None:
        conversation = progress.conversation
        if self.model.shows(conversation) and self.banner.conversation == conversation:
            self.banner.update_progress(progress.done, progress.total)

    def on_rebuilt(self, rebuilt: Rebuilt) -> None:
        if self.banner.conversation == rebuilt.conversation:
            self.banner.finished(rebuilt.elapsed_ms, rebuilt.tokens, rebuilt.cancelled, rebuilt.save)
        if self.model.shows(rebuilt.conversation):
            self.status.say(rebuilt_note(rebuilt))
            if not rebuilt.cancelled:
                self.status.tokens_in_context(rebuilt.tokens)

    def on_live(self, live: LiveUpdate) -> None:
        if self.model.shows(live.conversation):
            self.status.live(live.figures)

    def on_chat_tokens(self, counted: ChatTokens) -> None:
        """The chat's size with the version chosen: the meter shows it, and how much the next turn re-reads."""
        if not self.model.shows(counted.conversation) or self.model.busy:
            return  # another chat is shown, or a turn's own figures say it now
        self.status.tokens_in_context(counted.tokens)
        self.status.say(version_chosen_note(self.model.chosen_version, counted))
