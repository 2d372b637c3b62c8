"""One turn path: the turn rule, the model's view of a chat, and opening a chat, for every front end.

The window, ``hearth-cli chat``/``talk`` (through ``Hearth.run_turn``) and a server request bound to a
conversation (engine/session/serve.py) all run ``Turns.answer``: sync → decode → store the reply → save,
consuming ``ChatSessions.run``'s typed steps, so nothing calls back up into the API. The turn rule
(engine/api.py's docstring) is kept here:

1. the conversation's turn lock is taken (another process's turn on it finishes first);
2. the user's message is stored before any model work (``store_message``: planned, then stored);
3. the model reads what is stored, through the chat's view (engine/session/view_window.py);
4. the reply is stored with the model that wrote it (a stopped reply keeps what was written), then
5. the context is saved; a failed save is reported, never costs the reply.

``Turns`` holds no state of its own: the API makes one per call over its stores and loaded model.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from engine.conversations import Conversation, ConversationStore, check_id
from engine.errors import (
    ContextFullError,
    ConversationError,
    HearthError,
    ModelNotLoadedError,
    PromptError,
    TurnCancelledError,
)
from engine.generation import Engine, GenerationResult, Step
from engine.session.context_policy import chat_policy, check_policy
from engine.session.reply_split import ReplySplit, continue_reply, turn_reply
from engine.session.reports import REBUILT, Decoded, Ready, TurnResult
from engine.session.sessions import ChatSessions
from engine.session.view_window import ViewPlanner, ViewWindow
from engine.turn_checks import check_message, check_rewrite, user_content
from engine.turn_lock import TurnLock
from engine.types import (
    DEFAULT_MAX_NEW_TOKENS,
    Accepted,
    CancelToken,
    ContextPolicy,
    EventSink,
    Finished,
    LocalTurnFacts,
    ModelInfo,
    PieceKind,
    Progress,
    ProgressPhase,
    Rebuilt,
    ReplyPiece,
    Resume,
    Resumed,
    SamplingParams,
    StopReason,
    Token,
    TurnRequest,
    Waiting,
)

log = logging.getLogger(__name__)


def noop(_event: object) -> None:
    pass


@dataclass(frozen=True)
class Loaded:
    """The loaded model's parts a turn works with."""

    engine: Engine
    sessions: ChatSessions
    planner: ViewPlanner
    info: ModelInfo


@dataclass(frozen=True)
class TurnLocks:
    """Where the per-conversation turn locks live, and how long a turn waits for another process's."""

    folder: Path
    wait_s: float

    def held(self, cid: str, emit: EventSink, cancel: CancelToken | None = None):
        def give_up() -> HearthError | None:
            if cancel is not None and cancel.cancelled:
                return TurnCancelledError(f"stopped while conversation {cid} was busy in another Hearth process; "
                                          "nothing was stored")
            return None

        return TurnLock(self.folder, cid, self.wait_s).held(lambda: emit(Waiting(cid)), give_up)


@dataclass(frozen=True)
class Answered:
    """A turn's model work and what it stored: the seq of the reply (None: nothing stored)."""

    turn: TurnResult
    stored: int | None
    reply: ReplySplit = field(default_factory=ReplySplit)  # the reply's parts: visible text, thinking, calls


def ended(result: GenerationResult, cancel: CancelToken | None) -> StopReason:
    """Why the reply ended; a turn cancelled by Hearth closing is not one the person stopped."""
    interrupted = result.stop_reason == StopReason.CANCELLED and cancel is not None and cancel.interrupted
    return StopReason.INTERRUPTED if interrupted else StopReason(result.stop_reason)


def continue_prompt(engine: Engine, messages: list[dict]) -> bytes:
    """The prompt of a Continue (``continue_reply``'s): what a turn that wrote the last reply leaves the context."""
    return continue_reply(engine, messages).prompt


def chat_of(conv: Conversation, messages: Sequence) -> list[dict]:
    """What the model sees of a conversation read once: its system prompt (if any), then its messages."""
    head = [{"role": "system", "content": conv.system_prompt}] if conv.system_prompt else []
    return head + [m.as_chat() for m in messages]


def whole_context_progress(engine: Engine, conversation: str, emit: EventSink) -> Callable[[int, int], None]:
    """A rebuild's progress over the whole context, as its ``Rebuilt`` counts it: the prefill reports only
    the tokens it re-reads, after a prefix kept from the restore (the system prompt, a sound head)."""
    def report(done: int, total: int) -> None:
        kept = len(engine.tokens) - done  # the prefill extends the tokens before it reports
        emit(Progress(conversation, ProgressPhase.REBUILD, kept + done, kept + total))

    return report


@dataclass
class Turns:
    """The turn path over one service's stores and (maybe) loaded model."""

    # the conversation store, opened on first use (a completion never opens it; a bad request fails first)
    open_conversations: Callable[[], ConversationStore]
    loaded: Loaded | None
    locks: TurnLocks
    # chat → its token count after a version of its last reply was chosen (the API's context_states)
    chosen: dict[str, int] = field(default_factory=dict)

    @property
    def conversations(self) -> ConversationStore:
        return self.open_conversations()

    def require(self) -> Loaded:
        if self.loaded is None:
            raise ModelNotLoadedError("the model is not loaded yet")
        return self.loaded

    # a turn of a stored conversation ------------------------------------------------------------------
    def run_turn(self, request: TurnRequest, on_event: EventSink | None = None,
                 cancel: CancelToken | None = None, *, create: bool = False) -> Finished:
        """``Hearth.run_turn``: events [Waiting], Accepted, Progress*, Resumed, Token*, Finished (returned)."""
        emit = on_event or noop
        cid = check_id(request.conversation)
        request.params.validate()
        if request.max_new_tokens < 1:
            raise PromptError("the longest reply must be at least 1 token")
        check_message(request)
        if request.context_policy is not None:
            check_policy(request.context_policy, "the default for a chat longer than the context")
        check_rewrite(request)
        self.chosen.pop(cid, None)  # the turn's own figures say it from now on
        with self.locks.held(cid, emit, cancel):
            set_aside = self._set_aside_reply(cid, request)
            try:
                user_seq, planned = self._store_message(request, create)  # checked, then stored
                convs = self.conversations
                chat = convs.chat_messages(cid)
                if planned is not None and planned[0] == chat:
                    view = planned[1]
                else:  # no model to check with, or the stored chat is not what was checked
                    view = self._plan_view(cid, chat, request, convs.require(cid).settings)
                emit(Accepted(cid, user_seq, tuple(convs.messages(cid)), view.dropped))
                return self._finish_turn(cid, view, request, emit, cancel)
            finally:
                if set_aside is not None:
                    self.restore_reply(cid, set_aside)

    def store_message(self, request: TurnRequest, *, create: bool = False) -> int | None:
        """Only store the request's message (and system prompt), as a turn would before any model work."""
        with self.locks.held(check_id(request.conversation), noop):
            return self._store_message(request, create)[0]

    def _set_aside_reply(self, cid: str, request: TurnRequest) -> int | None:
        """Regenerate: the last reply becomes an earlier version (kept, ``reply_versions``); its seq."""
        if not request.regenerate:
            return None
        try:
            return self.conversations.set_aside_reply(cid)
        except ConversationError as exc:
            raise PromptError(str(exc)) from None

    def restore_reply(self, cid: str, seq: int) -> None:
        """A regenerate (or a server retry) that wrote nothing gives the chat its last reply back."""
        try:
            if self.conversations.restore_reply(cid, seq):
                log.info("the regenerate of %s wrote nothing: its last reply is back", cid)
        except ConversationError as exc:  # the reply stays kept as a version; the turn's own error matters more
            log.warning("could not put the last reply of %s back: %s", cid, exc)

    def _store_message(self, request: TurnRequest, create: bool,
                       ) -> tuple[int | None, tuple[list[dict], ViewWindow] | None]:
        """(the stored message's seq, (the chat it made, the view a turn reads of it)). Plan, then store,
        as a bound server request does: the chat the turn would read (the new system prompt, the stored
        messages, the new message) is checked and, with a model, rendered against the context first;
        only a turn that passes creates the conversation or stores its system prompt and message. So a
        refused turn (ContextFullError, a template that rejects the chat, nothing to answer) leaves no
        empty conversation, no system prompt that makes every later turn too long, and no message no
        turn can answer. Without a model only the shape is checked (the turn then stops at
        ModelNotLoadedError)."""
        convs, cid = self.conversations, request.conversation
        conv = convs.get(cid) if create else convs.require(cid)
        stored_system = conv.system_prompt if conv is not None else ""
        system = stored_system if request.system_prompt is None else request.system_prompt
        content = user_content(request)
        new = [] if content is None else [{"role": "user", "content": content}]
        stored = [m.as_chat() for m in convs.messages(cid)] if conv is not None else []
        chat = ([{"role": "system", "content": system}] if system else []) + stored + new
        if request.continue_reply and (not chat or chat[-1]["role"] != "assistant"):
            raise PromptError("the conversation does not end in a reply, so there is none to continue")
        if not any(m["role"] == "user" for m in chat):
            raise PromptError("the conversation has no message to answer")
        planned = None
        if self.loaded is not None:
            planned = chat, self._plan_view(cid, chat, request, conv.settings if conv is not None else {})
            if request.tools:  # the tools' text counts too; bad tools (PromptError) are refused here, before storing
                engine = self.loaded.engine
                prompt = turn_reply(engine, planned[1].messages, tuple(request.tools), request.tool_choice).prompt
                self.loaded.sessions.check_fits_text(cid, prompt)
        if conv is None:
            conv = convs.ensure(cid, system)  # created with its system prompt in one write
        if system != conv.system_prompt:
            convs.set_system_prompt(cid, system)
        seq = None if content is None else convs.append(cid, "user", content, attachments=tuple(request.attachments),
                                                        typed_text=request.user_message).seq
        return seq, planned

    def _finish_turn(self, cid: str, view: ViewWindow, request: TurnRequest, emit: EventSink,
                     cancel: CancelToken | None) -> Finished:
        loaded = self.require()
        engine, info = loaded.engine, loaded.info
        continued = request.continue_reply
        last = self.conversations.messages(cid)[-1] if continued else None
        before = view.messages[-1]["content"] if continued else ""
        tools = tuple(request.tools)
        written = continue_reply(engine, view.messages, tools) if continued else None
        if written is None and tools:  # a tool loop's step: the tools in the prompt, the reply parsed for calls
            written = turn_reply(engine, view.messages, tools, request.tool_choice)
        if view.moved:
            self._drop_saved_view(cid)
        answered = self.answer(cid, view.messages, request.params, request.max_new_tokens, cancel, emit=emit,
                               dropped=view.dropped, continued_seq=last.seq if last else None, before=before,
                               prompt_text=written.prompt if written else None, split=written.split if written else None,
                               **(written.decoding if written else {}))
        turn = answered.turn
        result = turn.generation
        reply = answered.reply
        reasoning, thought_ms = reply.reasoning, reply.thought_ms
        if last is not None and last.reasoning:  # a Continue: the thinking is the whole message's
            reasoning, thought_ms = last.reasoning + reasoning, (last.thought_ms or 0) + (thought_ms or 0)
        finished = Finished(cid, before + reply.content, tuple(result.tokens), ended(result, cancel), answered.stored,
                            turn.prompt_tokens, len(engine.tokens), engine.context_length,
                            result.timings.freeze(info.load_ms), info, dropped_messages=view.dropped,
                            continued=continued, local=LocalTurnFacts(turn.resume.freeze(), turn.save),
                            reasoning=reasoning, thought_ms=thought_ms, tool_calls=reply.tool_calls)
        emit(finished)
        return finished

    # the one path: sync → decode → store → save ------------------------------------------------------------
    def answer(self, cid: str, messages: list[dict], params: SamplingParams | None, max_new_tokens: int,
               cancel: CancelToken | None, *, emit: EventSink | None = None,
               on_text: Callable[[str], None] | None = None, on_piece: Callable[[ReplyPiece], None] | None = None,
               dropped: int = 0, continued_seq: int | None = None, before: str = "", prompt_text: bytes | None = None,
               started: float | None = None, top_logprobs: int | None = None, split: ReplySplit | None = None,
               **decoding) -> Answered:
        """The model answers ``messages`` (the chat's view) and the reply is stored, then the context saved.

        ``emit``: the window's events (Progress, Resumed, Token) and a reply that cannot be stored raised as
        "written but could not be stored" with its text; None for a server request, which streams its visible
        text to ``on_text`` and every piece (thinking, text, each whole tool call) to ``on_piece``.
        ``continued_seq``: the reply a Continue writes on (``before``: its text so far). ``prompt_text``: the
        prompt already rendered (a Continue's, a bound request's with its tools), ``split`` how its reply splits
        (None: not at all); without them the turn renders its messages and splits the reply when the template
        thinks (engine/session/reply_split.py). The visible text is stored as the reply, the thinking and the
        calls beside it. ``started``: when the request began (its time to first token counts from there)."""
        loaded = self.require()
        events = emit or noop
        progress = None if emit is None else (lambda d, t: events(Progress(cid, ProgressPhase.PREFILL, d, t)))
        if prompt_text is None:
            planned = turn_reply(loaded.engine, messages)
            prompt_text, split, decoding = planned.prompt, planned.split, {**planned.decoding, **decoding}
        elif split is None:  # a Continue writes on the visible reply
            split = ReplySplit()

        def shown(pieces: list[ReplyPiece], context: int) -> None:
            for piece in pieces:
                if piece.kind != PieceKind.TOOL_CALL:
                    events(Token(cid, piece.text, context, str(piece.kind)))
                if on_text is not None and piece.kind == PieceKind.CONTENT:
                    on_text(piece.text)
                if on_piece is not None:
                    on_piece(piece)

        stored: int | None = None
        context = 0
        for step in loaded.sessions.run(cid, messages, params, max_new_tokens, progress, cancel, prompt_text,
                                        started=started, top_logprobs=top_logprobs, **decoding):
            if isinstance(step, Step):
                context = step.context
                shown(split.feed(step.text), context)
            elif isinstance(step, Ready):
                events(Resumed(cid, step.report.freeze(), dropped))
            elif isinstance(step, Decoded):  # before the save: the turn rule's step 5
                shown(split.finish(), context)  # what the parser held back (a marker that never finished)
                stored = self._keep_reply(cid, step.generation, split, cancel, continued_seq, before, emit is not None)
            elif isinstance(step, TurnResult):
                return Answered(step, stored, split)
        raise RuntimeError("a turn ended without its result")

    def _keep_reply(self, cid: str, result: GenerationResult, split: ReplySplit, cancel: CancelToken | None,
                    continued_seq: int | None, before: str, say_lost: bool) -> int | None:
        try:
            return self._store_reply(cid, result, split, cancel, continued_seq)
        except ConversationError as exc:
            if not say_lost:
                raise
            lost = type(exc)(f"the reply was written but could not be stored: {exc}")  # say which text was lost
            lost.unstored_reply = before + split.content
            raise lost from None

    def _store_reply(self, cid: str, result: GenerationResult, split: ReplySplit, cancel: CancelToken | None,
                     continued_seq: int | None) -> int | None:
        info = self.require().info
        convs = self.conversations
        finish = str(ended(result, cancel))  # stored with the reply: Continue outlives the session
        if continued_seq is not None:  # the same message, written on
            if result.text:
                convs.extend_reply(cid, continued_seq, split.content, finish, info.label, reasoning=split.reasoning,
                                   thought_ms=split.thought_ms)
                convs.set_model(cid, info.label, info.key)
            elif result.stop_reason != StopReason.CANCELLED:  # it ended at once: the reply is whole now
                convs.set_finish(cid, continued_seq, finish)
            return continued_seq
        if result.text or result.stop_reason != StopReason.CANCELLED:  # a stopped reply keeps what was written
            seq = convs.append(cid, "assistant", split.content, finish, info.label, reasoning=split.reasoning,
                               thought_ms=split.thought_ms, tool_calls=split.tool_calls).seq
            convs.set_model(cid, info.label, info.key)
            return seq
        return None

    # the model's view of a chat (engine/session/view_window.py) ------------------------------------------
    def _plan_view(self, cid: str, chat: list[dict], request: TurnRequest, settings: Mapping) -> ViewWindow:
        """What a turn on ``chat`` reads, by the chat's context policy; raises ContextFullError."""
        return self.view_of(cid, chat, settings, request.context_policy, request.max_new_tokens)

    def view_of(self, cid: str, chat: list[dict], settings: Mapping, default_policy: str | None,
                max_new_tokens: int) -> ViewWindow:
        policy = chat_policy(settings, default_policy)
        if self.loaded is None:  # no model: the turn stops with ModelNotLoadedError
            return ViewWindow(list(chat))
        live = list(self.loaded.engine.tokens) if self.loaded.sessions.active == cid else None
        return self.loaded.planner.plan(chat, policy, max_new_tokens, live)

    def _drop_saved_view(self, cid: str) -> None:
        """This turn dropped messages: the chat's saved context holds the old view, which no longer
        starts the prompt. Delete it now rather than have the restore try it and report it damaged;
        the live KV (when it is this chat's) or the shared-prefix file serves the system prompt."""
        if self.loaded is None:
            return
        try:  # only this model's file: another model's context of the chat is another view, kept for it
            store = self.loaded.sessions.store
            store.remove(store.record_name(cid, self.loaded.sessions.identity.model_fp),
                         "the chat dropped its oldest messages")
        except OSError as exc:  # the restore then finds it unusable and deletes it itself
            log.warning("could not delete the outdated saved context of %s: %s", cid, exc)

    def view_window(self, conversation: str, max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
                    context_policy: str | None = None) -> int:
        """``Hearth.view_window``: how many stored messages its last turn's model did not read."""
        self.require()
        conv = self.conversations.require(conversation)
        if chat_policy(conv.settings, context_policy) == ContextPolicy.STOP:
            return 0  # nothing is left out under "stop": a turn that cannot fit is refused instead
        chat = chat_of(conv, self.conversations.messages(conversation))
        return self._dropped(conversation, chat, conv.settings, max_new_tokens, context_policy)

    def _dropped(self, conversation: str, chat: list[dict], settings: Mapping, max_new_tokens: int,
                 context_policy: str | None) -> int:
        """``view_window`` of a chat already read: the view of it up to its last user message."""
        if chat_policy(settings, context_policy) == ContextPolicy.STOP:
            return 0
        upto = max((i for i, m in enumerate(chat) if m["role"] == "user"), default=-1) + 1
        return self.view_of(conversation, chat[:upto], settings, context_policy, max_new_tokens).dropped

    # opening a chat ---------------------------------------------------------------------------------------
    def open_conversation(self, conversation: str, on_event: EventSink | None = None,
                          cancel: CancelToken | None = None, *, max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
                          context_policy: str | None = None) -> Resume | None:
        """``Hearth.open_conversation``. The chat is read once, and a rebuild prefills what the one restore
        left (a second restore would find the bad file gone and see a cold start)."""
        emit = on_event or noop
        loaded = self.require()
        sessions = loaded.sessions
        self.chosen.pop(conversation, None)  # the restore checks the saved context against the chat as it is
        conv = self.conversations.require(conversation)
        messages = chat_of(conv, self.conversations.messages(conversation))
        if not any(m["role"] == "user" for m in messages):
            sessions.switch_away()
            return None
        try:
            dropped = self._dropped(conversation, messages, conv.settings, max_new_tokens, context_policy)
        except ContextFullError as exc:  # its next turn says so; there is no view to restore
            log.info("not restoring %s: %s", conversation, exc)
            sessions.switch_away()
            return None
        system = 1 if messages[0]["role"] == "system" else 0
        messages = messages[:system] + messages[system + dropped:]
        # rendered as its next turn renders it (a chat with tool turns goes through the template's inputs)
        prompt, report = sessions.prepare_text(conversation, turn_reply(loaded.engine, messages).prompt)
        resume = report.freeze()
        emit(Resumed(conversation, resume, dropped))
        if resume.source == REBUILT:
            started = time.perf_counter()
            logits = sessions.fill(prompt, report, whole_context_progress(loaded.engine, conversation, emit), cancel,
                                   messages)
            saved = sessions.save("rebuild") if logits is not None else None  # "saved again" is true when said
            emit(Rebuilt(conversation, len(prompt), (time.perf_counter() - started) * 1000, logits is None, saved))
        return resume
