"""The worker's one event signal and its dispatch by type (app/conversation_events.py): each typed event
reaches its handlers once, in order; the pane draws only the chat it shows; and the models the views
render (app/chat_session_model.py, app/browser_listing.py), fed by real turns and a real store."""

from __future__ import annotations

from app.browser_listing import BrowserListing, ListingQuery
from app.chat_session_model import ChatSessionModel, NextStep
from app.context_status import ContextStatusRegistry
from app.conversation_events import EventDispatcher, OpenFailed, Rebuilding, TurnStarted
from app.text import context_label
from engine.api import open_conversations
from engine.errors import HearthError
from engine.types import (
    Accepted,
    ChatTokens,
    Finished,
    Progress,
    ProgressPhase,
    Rebuilt,
    Resume,
    Resumed,
    ResumeSource,
    Token,
    Waiting,
)

from .qt_helpers import TIMEOUT, collect_dispatched, new_chat_with_turn, send, use_settings, wait_idle

GREEDY = {"temperature": 0.0, "max_new_tokens": 8}
DAMAGED = Resume(ResumeSource.REBUILT, reason="checksum", plain="the saved context was damaged (checksum)")


# the dispatcher --------------------------------------------------------------------------------------------
def test_the_dispatcher_calls_each_types_handlers_in_the_order_registered_and_base_class_handlers_last():
    events = EventDispatcher()
    seen: list = []
    events.on(Token, lambda e: seen.append(("first", e.text)))
    events.on(Token, lambda e: seen.append(("second", e.text)))
    events.on_each({Waiting: lambda e: seen.append(("waiting", e.conversation)),
                    object: lambda e: seen.append(("any", type(e).__name__))})
    events.dispatch(Token("a", "hi"))
    events.dispatch(Waiting("b"))
    events.dispatch(Rebuilding("c", DAMAGED))  # no handler of its own: only the catch-all
    assert seen == [("first", "hi"), ("second", "hi"), ("any", "Token"), ("waiting", "b"), ("any", "Waiting"),
                    ("any", "Rebuilding")]


def test_a_real_turn_reaches_the_window_as_one_typed_event_of_each_kind_in_order(qtbot, windows):
    w = windows()
    order: list = []
    for kind in (TurnStarted, Accepted, Resumed, Token, Finished):
        w.turns.events.on(kind, lambda e, kind=kind: order.append((kind, e.conversation)))
    conv = new_chat_with_turn(qtbot, w, "hello there", GREEDY)
    kinds = [kind for kind, c in order if c == conv]
    assert kinds[0] is TurnStarted and kinds[-1] is Finished
    assert kinds.count(TurnStarted) == kinds.count(Accepted) == kinds.count(Finished) == 1
    assert kinds.index(Accepted) < kinds.index(Token) and Resumed in kinds and kinds.count(Token) > 1
    assert w.transcript.messages[-1].text == w.store.messages(conv)[-1].content  # the pane drew it, once


# each event reaches the pane showing its chat, and only that one --------------------------------------------
def test_a_turn_in_a_chat_not_shown_is_not_drawn_into_the_one_shown(qtbot, windows):
    w = windows()
    a = w.new_chat()
    use_settings(w, {"temperature": 0.0, "max_new_tokens": 24})
    tokens = collect_dispatched(w.turns, Token)
    send(qtbot, w, "Name three rivers.")
    b = w.new_chat()  # shown before any of a's events is handled: every piece of a's reply comes while b is shown
    assert w.current == b != a
    wait_idle(qtbot, w)
    assert tokens and all(c == a for c, _ in tokens)
    assert w.transcript.messages == [] and w.transcript.stream_widget is None and not w.prefill_bar.isVisible()
    w.sidebar.setCurrentItem(w.sidebar.item_for(a))
    qtbot.waitUntil(lambda: not w.transcript.loading, timeout=TIMEOUT)
    stored = w.store.messages(a)
    assert [m.text for m in w.transcript.messages] == [m.content for m in stored]  # a's own, when a is shown


def test_each_opening_event_reaches_its_handler_for_the_chat_shown_and_none_for_another(qtbot, windows):
    w = windows()
    shown = new_chat_with_turn(qtbot, w, "hello there", GREEDY)
    said, context = w.status.resume.text(), w.status.context.text()
    other = "a-chat-not-shown"
    for event in (Rebuilding(other, DAMAGED), Progress(other, ProgressPhase.REBUILD, 5, 10),
                  Rebuilt(other, 10, 12.0, False, None), ChatTokens(other, 99, None),
                  OpenFailed(other, HearthError("not this chat's trouble"))):
        w.worker.conversation_event.emit(event)  # from the UI thread: handled at once
    assert not w.banner.isVisible() and w.banner.conversation != other
    assert (w.status.resume.text(), w.status.context.text()) == (said, context)

    w.worker.conversation_event.emit(Rebuilding(shown, DAMAGED))
    assert w.banner.isVisible() and w.banner.conversation == shown and "damaged (checksum)" in w.banner.message.text()
    assert w.sidebar.badge(shown) == "rebuilding"  # the window's handler of the same event
    w.worker.conversation_event.emit(Progress(shown, ProgressPhase.REBUILD, 5, 10))
    assert w.banner.progress.value() == 5
    w.worker.conversation_event.emit(Rebuilt(shown, 10, 12.0, False, None))
    assert "Rebuilt" in w.banner.message.text() and w.status.context.text() == context_label(10, w.status.limit)
    w.worker.conversation_event.emit(ChatTokens(shown, 99, None))
    assert w.status.context.text() == context_label(99, w.status.limit)
    w.worker.conversation_event.emit(OpenFailed(shown, HearthError("this chat's trouble")))
    assert w.status.resume.text() == "⚠ this chat's trouble"


# the models ------------------------------------------------------------------------------------------------
def test_the_chat_model_follows_a_real_turn_and_remembers_each_chat_between_visits(qtbot, windows):
    w = windows()
    accepted = collect_dispatched(w.turns, Accepted)
    a = new_chat_with_turn(qtbot, w, "hello there", GREEDY)
    model = w.chat.model
    stored = [(m.seq, m.role, m.content) for m in w.store.messages(a)]
    assert model.conversation == a and model.stored() == stored and model.next_step(stored) == NextStep("")
    fresh = ChatSessionModel(w.store, w.turns)  # fed the turn's own Accepted: what was stored then
    fresh.conversation = a
    (_, event), = accepted
    assert fresh.accepted_stored(event) == stored[:1] and event.user_seq == stored[0][0]

    w.store.append(a, "user", "a message with no reply")
    model.note_no_reply(a, "The reply was stopped before its first word.")
    b = w.new_chat()
    assert model.conversation == b and model.next_step([]) == NextStep("")
    w.sidebar.setCurrentItem(w.sidebar.item_for(a))
    assert model.next_step(model.stored()) == NextStep("unanswered", "The reply was stopped before its first word.")
    assert w.transcript.unanswered.isVisible()  # the pane renders what the model offers


def test_the_browser_listing_finds_filters_and_previews_from_the_store(config):
    store = open_conversations(config.paths)
    try:
        rivers = store.create(title="Rivers")
        store.append(rivers.id, "user", "Name three rivers.")
        store.append(rivers.id, "assistant", "The Nile, the Amazon and the Danube.")
        store.create(title="Empty")
        listing = BrowserListing(store, ContextStatusRegistry())
        listing.reload()
        assert len(listing.find(ListingQuery()).rows) == 2
        found = listing.find(ListingQuery("Danube"))
        assert [r["id"] for r in found.rows] == [rivers.id] and "Danube" in found.rows[0]["snippet"]
        assert listing.find(ListingQuery(status="valid")).rows == []  # no saved context anywhere
        assert len(listing.find(ListingQuery(status="none")).rows) == 2
        preview = listing.preview(rivers.id)
        assert preview.conversation.title == "Rivers" and [role for _, role, _ in preview.messages] == [
            "user", "assistant"]
        assert listing.preview("gone") is None
    finally:
        store.close()
