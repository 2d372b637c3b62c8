"""The tool loop in the window (issue 33), on the UI thread, over the engine's stored loop state
(engine.api's ``pending_calls``): after a reply that called tools, each call is asked about under the reply
("wants to run `NAME`": Allow once / Always allow in this chat / Deny), run off the UI thread on the
``ToolCallWorker``'s thread with the Preferences' timeout and Stop, and its result stored as a message of its
own; once every call has its result the model reads them and goes on (``TurnControl.answer``, with the tools),
up to the Preferences' step limit.

The state lives in the store, not here: reopening a chat (or restarting Hearth) in the middle of a loop finds
its pending calls and asks again; a call that was running when Hearth closed is offered as Run again / Abandon,
never run again without asking. Refusals (Deny, Abandon, the step limit, a new message while calls wait) are
small store writes made here, as the window's other edits are, so they are stored before anything that follows.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from PySide6.QtCore import QObject, Signal, Slot

from app.chat_tools import SETTINGS_CHOICE
from app.conversation_events import TurnStarted
from app.tool_permission import ALLOW, ALWAYS, DENY, INTERRUPTED, STOP
from engine.api import (
    DENIED,
    ConversationStore,
    abandon_calls,
    allow_always,
    always_allowed,
    chat_tools,
    deny_call,
    pending_calls,
    step_limit_text,
)
from engine.api import (
    INTERRUPTED as INTERRUPTED_TEXT,
)
from engine.errors import HearthError
from engine.types import Finished, StopReason, ToolCall, ToolChoice, ToolChoiceMode

log = logging.getLogger(__name__)



class ToolLoopControl(QObject):
    """Drives the loop of every chat; draws the permission block only in the chat the pane shows."""

    changed = Signal(str)  # a chat's stored messages changed (a result or a refusal): redraw it if shown

    def __init__(self, tools, turns, store: ConversationStore, limits: Callable[[], tuple[int, int]],
                 parent: QObject | None = None):
        """``tools``: the window's ``ToolWorkerHost`` (app/tool_worker.py: lists the tools, starting the servers a
        chat needs, and runs calls on its pool, storing each result); ``limits()``: (the most tool steps per
        message, a call's timeout in seconds), as Preferences say now."""
        super().__init__(parent)
        self.tools, self.turns, self.store, self.limits = tools, turns, store, limits
        self.pane = None  # the ChatPane, once the window made it (``attach``)
        self.specs: list = []
        self._listing = False
        self._listed = False
        self._running: dict[str, ToolCall] = {}  # chat → its call running now
        self._stopped: set[str] = set()  # chats whose loop Stop ended (no next step until a new message)
        self._waiting_turns: list[Callable[[], None]] = []  # turns that wait for the tools to be listed
        tools.worker.tools_ready.connect(self._on_listed)
        tools.worker.call_finished.connect(self._on_done)
        tools.worker.servers_listed.connect(lambda _configs: self.refresh_tools())
        turns.tools_for = self.tools_for
        turns.tool_busy = self.busy
        turns.tool_stop = self.stop
        turns.events.on(Finished, self._on_finished)
        # a turn that starts in the chat (a Regenerate or an edit while a call waits) moves it past the calls asked
        # about: their block goes, so no Allow can run a call of a reply being replaced (a chat drawn again shows
        # the calls still waiting, ``shown``)
        turns.events.on(TurnStarted, lambda started: self._hide(started.conversation))

    def attach(self, pane) -> None:
        self.pane = pane
        pane.transcript.tool_permission.decided.connect(self._on_decided)

    # the tools a turn offers ---------------------------------------------------------------------------------
    def configured(self) -> bool:
        """Any server is configured and on (without one, nothing is started and turns offer no tools)."""
        return any(c.enabled for c in self.tools.configs)

    def refresh_tools(self) -> None:
        """List the tools again when a turn next needs them (servers were added, switched or changed)."""
        self._listed = False

    def _list(self, conversation: str) -> None:
        if not self._listing:
            self._listing = True
            self.tools.request_prepare.emit(conversation, None)

    def tools_for(self, conversation: str, kind: str, go: Callable[[], None]) -> tuple[tuple[dict, ...], ToolChoice] | None:
        """The tools a turn in ``conversation`` offers and its tool choice; None when the servers are still being
        started and listed: ``go`` is called once they are (the turn waits for them)."""
        if not self._listed and self.configured():
            self._waiting_turns.append(go)
            self._list(conversation)
            if self.pane is not None and self.pane.conversation == conversation:
                self.pane.status.say("Starting the chat's tools…")
            return None
        if kind == "send":
            self._stopped.discard(conversation)
        try:
            settings = self.store.require(conversation).settings
        except HearthError:
            return (), ToolChoice()
        offered = tuple(s.openai() for s in chat_tools(self.specs, settings)) if self._listed else ()
        choice = ToolChoice()
        if offered and kind == "send" and settings.get(SETTINGS_CHOICE) == "required":
            choice = ToolChoice(ToolChoiceMode.REQUIRED)  # the first reply of a message only (engine/tools/loop.py)
        return offered, choice

    @Slot(str, object)
    def _on_listed(self, _conversation: str, specs: list) -> None:
        self._listing, self._listed = False, True
        self.specs = list(specs)
        failed = [f"{s.name}: {s.error}" for s in self.tools.statuses if str(s.state) == "failed"]
        if failed and self.pane is not None:
            self.pane.status.problem("A tool server could not start — " + "; ".join(failed)[:400])
        waiting, self._waiting_turns = self._waiting_turns, []
        for go in waiting:
            go()

    # the loop ------------------------------------------------------------------------------------------------
    def busy(self, conversation: str | None) -> bool:
        return conversation in self._running if conversation is not None else bool(self._running)

    def stop(self, conversation: str | None) -> None:
        """Stop: the running call is stopped (its result says so) and the loop goes no further."""
        if conversation is None:
            return
        self._stopped.add(conversation)
        if conversation in self._running:
            self.tools.cancel(conversation)

    def _on_finished(self, finished: Finished) -> None:
        if finished.tool_calls and finished.stop_reason != StopReason.CANCELLED:
            self.advance(finished.conversation)
        self._say_step(finished)

    def advance(self, conversation: str) -> None:
        """Take the chat's loop one step on: ask about (or run) its next pending call; with none left, have the
        model read the results."""
        if conversation in self._running or self.turns.running(conversation):
            return
        try:
            pending = pending_calls(self.store, conversation)
            settings = self.store.require(conversation).settings
        except HearthError as exc:
            self._problem(conversation, str(exc))
            return
        if not pending:
            self._hide(conversation)
            if self._ends_in_results(conversation) and conversation not in self._stopped:
                self.turns.answer(conversation)
            return
        steps, timeout = self.limits()
        if self._steps(conversation) >= steps:  # the limit's last reply asked: its calls are not run (as run_tool_loop)
            self._refuse_all(conversation, step_limit_text(steps))
            if self.pane is not None and self.pane.conversation == conversation:
                self.pane.status.say(f"The tool loop stopped after {steps} steps (Preferences → Tools).")
            return
        first = pending[0]
        if first.state == "running":
            self._show(conversation, first.call, interrupted=True)
        elif first.call.name in always_allowed(settings) and conversation not in self._stopped:
            self._run(conversation, first.call, timeout)
        else:
            self._show(conversation, first.call)

    def _ends_in_results(self, conversation: str) -> bool:
        messages = self.store.messages(conversation)
        return bool(messages) and messages[-1].role == "tool"

    def _steps(self, conversation: str) -> int:
        """The replies since the person's last message: the steps this message's loop has taken."""
        count = 0
        for m in reversed(self.store.messages(conversation)):
            if m.role == "user":
                break
            count += m.role == "assistant"
        return count

    def _run(self, conversation: str, call: ToolCall, timeout_s: float) -> None:
        self._running[conversation] = call
        self._show(conversation, call, running=True)
        self.tools.call(conversation, call, float(timeout_s))

    @Slot(str, str, object)
    def _on_done(self, conversation: str, call_id: str, outcome) -> None:
        if self._running.get(conversation) is None or self._running[conversation].id != call_id:
            return
        del self._running[conversation]
        if outcome is not None and outcome.is_error and not outcome.text.startswith(("Stopped", "stopped")):
            self._problem(conversation, f"the tool failed: {outcome.text[:200]}")
        self.changed.emit(conversation)
        if conversation in self._stopped:
            self._hide(conversation)
            return
        if any(p.call.id == call_id for p in self._pending(conversation)):
            # its result could not be stored (a full disk, say): ask again rather than run it again by itself
            self._stopped.add(conversation)
            self.shown(conversation)
            return
        self.advance(conversation)

    @Slot(str, str)
    def _on_decided(self, call_id: str, choice: str) -> None:
        conversation = self.pane.conversation if self.pane is not None else None
        if conversation is None:
            return
        if choice == STOP:
            self.stop(conversation)
            return
        if self.turns.running(conversation):
            return  # the call already runs (a second Allow), or a turn writes into the chat: nothing to decide now
        pending = {p.call.id: p for p in self._pending(conversation)}
        if call_id not in pending:
            return  # already decided (a double click, or another window's answer)
        call = pending[call_id].call
        interrupted = self.pane.transcript.tool_permission.mode == INTERRUPTED
        self._stopped.discard(conversation)
        try:
            if choice == DENY:
                deny_call(self.store, conversation, call, INTERRUPTED_TEXT if interrupted else DENIED)
                self.changed.emit(conversation)
                self.advance(conversation)
                return
            if choice == ALWAYS:
                allow_always(self.store, conversation, call.name)
        except HearthError as exc:
            self._problem(conversation, str(exc))
            return
        if choice in (ALLOW, ALWAYS):
            self._run(conversation, call, self.limits()[1])

    def _pending(self, conversation: str) -> list:
        try:
            return pending_calls(self.store, conversation)
        except HearthError as exc:
            self._problem(conversation, str(exc))
            return []

    def _refuse_all(self, conversation: str, text: str) -> None:
        try:
            for p in pending_calls(self.store, conversation):
                deny_call(self.store, conversation, p.call, text)
        except HearthError as exc:
            self._problem(conversation, str(exc))
        self._hide(conversation)
        self.changed.emit(conversation)

    def before_send(self, conversation: str) -> bool:
        """A new message goes into the chat: calls still waiting are abandoned first (the model is told), so the
        message follows their results. False when that could not be stored (the message waits)."""
        if conversation in self._running:
            return False
        try:
            if abandon_calls(self.store, conversation):
                self.changed.emit(conversation)
        except HearthError as exc:
            self._problem(conversation, str(exc))
            return False
        self._hide(conversation)
        return True

    # what the pane shows ----------------------------------------------------------------------------------------
    def shown(self, conversation: str | None) -> None:
        """The pane drew ``conversation``: its loop's block, if it has one (a restart mid-loop finds it here)."""
        if conversation is None or self.pane is None:
            return
        running = self._running.get(conversation)
        if running is not None:
            self._show(conversation, running, running=True)
            return
        if self.turns.running(conversation):
            return
        pending = self._pending(conversation)
        if pending:
            self._show(conversation, pending[0].call, interrupted=pending[0].state == "running")

    def _server_of(self, call: ToolCall) -> str:
        return next((s.server for s in self.specs if s.function == call.name), "")

    def _show(self, conversation: str, call: ToolCall, *, running: bool = False, interrupted: bool = False) -> None:
        if self.pane is not None and self.pane.conversation == conversation:
            self.pane.transcript.show_tool_prompt(call, self._server_of(call), running=running, interrupted=interrupted)
            self.pane.update_buttons()

    def _hide(self, conversation: str) -> None:
        if self.pane is not None and self.pane.conversation == conversation:
            self.pane.transcript.hide_tool_prompt()
            self.pane.update_buttons()

    def _problem(self, conversation: str, why: str) -> None:
        log.warning("tool loop of %s: %s", conversation, why)
        if self.pane is not None and self.pane.conversation == conversation:
            self.pane.status.problem(why)

    def _say_step(self, finished: Finished) -> None:
        """The status bar: how much this step of a loop read, against what its saved context already held."""
        local = finished.local
        if local is None or self.pane is None or self.pane.conversation != finished.conversation:
            return
        try:
            step = self._steps(finished.conversation)
        except HearthError:
            return
        if step < 2 and not finished.tool_calls:
            return  # not a tool loop: the status line's own resume summary stands
        reused = local.resume.reused_tokens
        read = max(0, finished.prompt_tokens - reused)
        self.pane.status.say(f"Tool step {step}: read {read:,} new tokens; {reused:,} came from the saved context")

