"""The tool loop of a chat turn (issue 33): the model answers with the enabled tools offered; each call it makes
is allowed or denied, run (off the caller's UI thread, with a timeout and Stop), and its result stored as a
message of its own; then the model reads the results and goes on, up to a step limit.

Every step is an ordinary turn (engine/session/turn.py) with ``TurnRequest.tools``, so each one appends to the
conversation's saved context: the live KV (or the file, after a restart) already holds everything up to the
last reply, and a step reads only the results that came after it (``LoopStep.read_tokens``).

What is stored is the loop's state, so a restart in the middle loses nothing and repeats nothing: the last
reply's calls without a result are ``pending_calls``; one marked running (``ConversationStore.start_tool_run``)
was started and Hearth stopped before its result was stored, so it may have run — it is offered again only
by asking (the window's Run again / Abandon), never run again silently.

The window drives these pieces one by one (a permission prompt waits for the person); ``run_tool_loop`` drives
them synchronously for ``hearth-cli chat --tools`` and the benchmark, with a ``decide`` function as the
permission."""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from engine.conversations import ConversationStore
from engine.errors import ConversationError, PromptError
from engine.tools.host import ToolHost, ToolOutcome, ToolSpec
from engine.types import (
    CancelToken,
    EventSink,
    Finished,
    StopReason,
    ToolCall,
    ToolChoice,
    ToolChoiceMode,
    TurnRequest,
)

log = logging.getLogger(__name__)

ASKED = "asked"  # never started: the chat asks for permission (again)
RUNNING = "running"  # started, no result stored: it may have run

# What the model (and the person) reads in place of a result, for a call that did not run
DENIED = "The user denied this call, so the tool was not run."
ABANDONED = "Not run: the user left this call unanswered and went on."
INTERRUPTED = ("Not run again: this call was running when Hearth stopped, so it may or may not have finished, and "
               "the user chose not to run it again.")
STOPPED = "Stopped by the user before the tool finished."


def step_limit_text(limit: int) -> str:
    return f"Not run: this message reached its limit of {limit} tool steps."


SETTINGS_TOOLS = "tools"  # a chat's narrowed set: None (all enabled tools) or a list of "server" / "server/tool"
SETTINGS_ALWAYS = "tools_always"  # function names "Always allow in this chat"
MAX_ALWAYS = 256


@dataclass(frozen=True)
class PendingCall:
    """A call of the chat's last reply that has no result yet."""

    call: ToolCall
    reply_seq: int
    state: str  # ASKED or RUNNING


def pending_calls(store: ConversationStore, cid: str) -> list[PendingCall]:
    """The last reply's calls that have no stored result, in the order the model made them; [] when the chat
    does not end in a reply with calls (and its results)."""
    messages = store.messages(cid)
    i = len(messages) - 1
    while i >= 0 and messages[i].role == "tool":
        i -= 1
    if i < 0 or messages[i].role != "assistant" or not messages[i].tool_calls:
        return []
    answered = {m.tool_call_id for m in messages[i + 1:]}
    runs = store.tool_runs(cid)
    return [PendingCall(c, messages[i].seq, RUNNING if runs.get(c.id) == RUNNING else ASKED)
            for c in messages[i].tool_calls if c.id not in answered]


def run_call(host: ToolHost, store: ConversationStore, cid: str, call: ToolCall, cancel: CancelToken | None = None,
             timeout_s: float | None = None) -> ToolOutcome:
    """Run an allowed call and store its result (a readable error when the tool or its server failed). Marked
    running first, so a restart before the result is stored asks instead of running it again. A call cut off
    because Hearth is closing (``cancel.interrupt()``) stores nothing: it stays running, and the next start asks
    whether to run it again."""
    store.start_tool_run(cid, call.id)
    outcome = host.call(call.name, call.arguments, cancel, timeout_s)
    if cancel is not None and cancel.interrupted:  # Hearth is closing: it stays "running", and the next start asks
        return outcome
    if cancel is not None and cancel.cancelled and outcome.is_error:
        outcome = dataclasses.replace(outcome, text=STOPPED)
    store.append_tool_result(cid, call.id, call.name, outcome.text, "error" if outcome.is_error else "done")
    return outcome


def deny_call(store: ConversationStore, cid: str, call: ToolCall, text: str = DENIED) -> None:
    """Store that the call was not run; the model reads ``text`` as its result."""
    store.append_tool_result(cid, call.id, call.name, text, "denied")


def abandon_calls(store: ConversationStore, cid: str, text: str | None = None) -> int:
    """Give every pending call a result saying it was not run (a call that was running: that it may have run);
    the chat can then take a new message. Returns how many."""
    pending = pending_calls(store, cid)
    for p in pending:
        why = text or (INTERRUPTED if p.state == RUNNING else ABANDONED)
        store.append_tool_result(cid, p.call.id, p.call.name, why, "abandoned")
    return len(pending)


# which tools a chat offers, and which it runs without asking ---------------------------------------------------
def chat_tools(specs: Iterable[ToolSpec], settings: Mapping) -> list[ToolSpec]:
    """The enabled tools this chat offers: all of them, or those its settings narrow the set to."""
    chosen = settings.get(SETTINGS_TOOLS)
    specs = [s for s in specs if s.enabled]
    if not isinstance(chosen, list):
        return specs
    names = {c for c in chosen if isinstance(c, str)}
    return [s for s in specs if s.server in names or f"{s.server}/{s.name}" in names]


def always_allowed(settings: Mapping) -> frozenset[str]:
    listed = settings.get(SETTINGS_ALWAYS)
    if not isinstance(listed, list):
        return frozenset()
    return frozenset(n for n in listed[:MAX_ALWAYS] if isinstance(n, str))


def allow_always(store: ConversationStore, cid: str, function: str) -> None:
    """Remember "Always allow in this chat" for ``function``."""
    conv = store.require(cid)
    settings = dict(conv.settings)
    names = sorted(always_allowed(settings) | {function})
    if len(names) > MAX_ALWAYS:
        raise ConversationError(f"this chat already always allows {MAX_ALWAYS} tools")
    settings[SETTINGS_ALWAYS] = names
    store.set_settings(cid, settings)


# the loop, run synchronously (hearth-cli chat --tools, the benchmark) ------------------------------------------
Decide = Callable[[ToolCall], bool]


@dataclass(frozen=True)
class CallRecord:
    call: ToolCall
    allowed: bool
    outcome: ToolOutcome | None  # None: not run (denied, the step limit, Stop before it)
    result: str  # what the model reads


@dataclass(frozen=True)
class LoopStep:
    """One model reply of the loop and what came of its calls."""

    index: int  # 1-based
    finished: Finished
    calls: tuple[CallRecord, ...]

    @property
    def read_tokens(self) -> int:
        """The prompt tokens this step read (computed), as against those its saved context already held."""
        return max(0, self.finished.prompt_tokens - self.reused_tokens)

    @property
    def reused_tokens(self) -> int:
        local = self.finished.local
        return local.resume.reused_tokens if local is not None else 0


@dataclass(frozen=True)
class LoopResult:
    steps: tuple[LoopStep, ...]
    ended: str  # "answered" (a reply without calls), "step_limit", "stopped" (Stop), "no_tools" (no calls)
    resumed: tuple[CallRecord, ...] = ()  # calls left pending by an earlier run, settled first


def run_tool_loop(backend, host: ToolHost, request: TurnRequest, specs: Sequence[ToolSpec], decide: Decide, *,
                  max_steps: int, timeout_s: float | None = None, on_event: EventSink | None = None,
                  on_step: Callable[[LoopStep], None] | None = None, cancel: CancelToken | None = None,
                  create: bool = False) -> LoopResult:
    """Answer ``request`` with ``specs`` offered, running the calls ``decide`` allows, until a reply makes no
    call, Stop, or ``max_steps`` replies. ``request.tool_choice`` holds for the first reply only; later ones
    are "auto" (as OpenAI's Agents SDK resets it), so a forced call cannot loop forever.

    Calls an earlier run left pending are settled first: with a new message they are abandoned (the chat went
    on); without one (a resume) each is decided and run — except one that was running when Hearth stopped,
    which is never run again here."""
    if max_steps < 1:
        raise ValueError("a tool loop takes at least one step")
    convs = backend.conversations
    resumed: list[CallRecord] = []
    if convs.get(request.conversation) is not None:
        if request.user_message is not None:
            abandon_calls(convs, request.conversation)
        else:
            resumed = _settle(host, convs, request.conversation, decide, cancel, timeout_s)
            last = convs.messages(request.conversation)[-1:]
            if not resumed and last and last[0].role == "assistant":
                raise PromptError("there is no tool loop to resume: the chat's last reply called no tool (send a "
                                  "new message)")
    tools = tuple(s.openai() for s in specs)
    step_request = dataclasses.replace(request, tools=tools)
    steps: list[LoopStep] = []
    while True:
        finished = backend.run_turn(step_request, on_event, cancel, create=create and not steps)
        index = len(steps) + 1
        calls = finished.tool_calls
        if not calls or finished.stop_reason == StopReason.CANCELLED:
            steps.append(_stepped(LoopStep(index, finished, ()), on_step))
            return LoopResult(tuple(steps), "stopped" if _stopped(cancel) else "answered", tuple(resumed))
        if index >= max_steps:
            records = tuple(_refuse(convs, request.conversation, c, step_limit_text(max_steps)) for c in calls)
            steps.append(_stepped(LoopStep(index, finished, records), on_step))
            return LoopResult(tuple(steps), "step_limit", tuple(resumed))
        records = tuple(_decide_and_run(host, convs, request.conversation, c, decide, cancel, timeout_s) for c in calls)
        steps.append(_stepped(LoopStep(index, finished, records), on_step))
        if _stopped(cancel):
            return LoopResult(tuple(steps), "stopped", tuple(resumed))
        step_request = dataclasses.replace(step_request, user_message=None, attachments=(), system_prompt=None,
                                           regenerate=False, continue_reply=False, tool_choice=_next_choice(request))


def _next_choice(request: TurnRequest) -> ToolChoice:
    return request.tool_choice if request.tool_choice.mode == ToolChoiceMode.NONE else ToolChoice()


def _stopped(cancel: CancelToken | None) -> bool:
    return cancel is not None and cancel.cancelled


def _stepped(step: LoopStep, on_step: Callable[[LoopStep], None] | None) -> LoopStep:
    if on_step is not None:
        on_step(step)
    return step


def _settle(host: ToolHost, convs: ConversationStore, cid: str, decide: Decide, cancel: CancelToken | None,
            timeout_s: float | None) -> list[CallRecord]:
    records = []
    for p in pending_calls(convs, cid):
        if p.state == RUNNING:
            records.append(_refuse(convs, cid, p.call, INTERRUPTED, "abandoned"))
        else:
            records.append(_decide_and_run(host, convs, cid, p.call, decide, cancel, timeout_s))
    return records


def _decide_and_run(host: ToolHost, convs: ConversationStore, cid: str, call: ToolCall, decide: Decide,
                    cancel: CancelToken | None, timeout_s: float | None) -> CallRecord:
    if _stopped(cancel):
        return _refuse(convs, cid, call, STOPPED, "abandoned")
    if not decide(call):
        return _refuse(convs, cid, call, DENIED)
    outcome = run_call(host, convs, cid, call, cancel, timeout_s)
    return CallRecord(call, True, outcome, outcome.text)


def _refuse(convs: ConversationStore, cid: str, call: ToolCall, text: str, state: str = "denied") -> CallRecord:
    convs.append_tool_result(cid, call.id, call.name, text, state)
    return CallRecord(call, False, None, text)


def call_arguments(call: ToolCall) -> object:
    """A call's arguments as JSON (for a front end's display and --json); the text itself when it is not JSON."""
    try:
        return json.loads(call.arguments)
    except (ValueError, RecursionError):
        return call.arguments
