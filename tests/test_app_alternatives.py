"""The window's reply versions (‹ 2/3 ›), Continue, the live figures in the status bar, the status bar
after switching chats (defect 12) and the title after an edit (defect 15): real window, real engine on
the tiny model, real SQLite."""

from __future__ import annotations

import dataclasses
import threading

from app.conversation_events import LiveUpdate
from app.text import context_label, resume_summary
from engine.types import ChatTokens, Resume, Resumed, ResumeSource

from .qt_helpers import TIMEOUT, collect, collect_pairs, new_chat_with_turn, send, use_settings, wait_idle

SHORT = {"temperature": 0.0, "max_new_tokens": 6}
VARIED = {"temperature": 1.5, "max_new_tokens": 6}


def regenerate(qtbot, w) -> None:
    w.act_regenerate.trigger()
    wait_idle(qtbot, w)


# versions of a reply -----------------------------------------------------------------------------------------
def test_regenerate_keeps_the_earlier_reply_and_the_switcher_flips_between_them(qtbot, windows):
    w = windows()
    conv = new_chat_with_turn(qtbot, w, "hello there", VARIED)
    first = w.store.messages(conv)[-1].content
    regenerate(qtbot, w)
    second = w.store.messages(conv)[-1].content
    last = w.transcript.last_reply()
    assert last.text == second and not last.versions.isHidden() and last.versions.label.text() == "2/2"
    assert not last.versions.forward.isEnabled() and last.versions.back.isEnabled()
    qtbot.mouseClick(last.versions.back, qtbot_left())
    assert last.text == first and last.versions.label.text() == "1/2"
    assert w.store.messages(conv)[-1].content == first  # the stored chat continues with the one shown
    assert [m.role for m in w.store.messages(conv)] == ["user", "assistant"]
    w.act_later_version.trigger()  # the same by keyboard (Alt+Right)
    assert last.text == second and w.store.messages(conv)[-1].content == second
    regenerate(qtbot, w)
    assert w.transcript.last_reply().versions.label.text() == "3/3"
    # The window opened again shows the versions from the store.
    w.chat.show_chat(None)
    w.chat.show_chat(conv)
    qtbot.waitUntil(lambda: w.transcript.last_reply() is not None, timeout=TIMEOUT)
    assert w.transcript.last_reply().versions.label.text() == "3/3"


def qtbot_left():
    from PySide6.QtCore import Qt

    return Qt.MouseButton.LeftButton


def test_only_the_last_reply_offers_its_versions(qtbot, windows):
    w = windows()
    conv = new_chat_with_turn(qtbot, w, "hello there", VARIED)
    regenerate(qtbot, w)
    earlier = w.transcript.last_reply()
    send(qtbot, w, "and then?")
    wait_idle(qtbot, w)
    assert earlier.versions.isHidden()
    w.chat.choose_version(earlier.seq, 0)  # refused quietly: that reply is no longer the last
    assert w.store.messages(conv)[1].content == earlier.text


def test_choosing_a_version_that_is_gone_says_so(qtbot, windows):
    w = windows()
    conv = new_chat_with_turn(qtbot, w, "hello there", VARIED)
    regenerate(qtbot, w)
    last = w.transcript.last_reply()
    w.chat.choose_version(last.seq, 7)
    assert "could not be chosen" in w.status.resume.text() and "has 2 version" in w.status.resume.text()
    assert w.store.messages(conv)[-1].content == last.text


def test_editing_the_question_drops_the_versions_of_its_replies(qtbot, windows):
    w = windows()
    conv = new_chat_with_turn(qtbot, w, "hello there", VARIED)
    regenerate(qtbot, w)
    w.chat.begin_edit(0)
    w.composer.setPlainText("hello again")
    w.chat.send(w.composer.toPlainText())
    wait_idle(qtbot, w)
    assert w.store.reply_versions(conv, 1).texts == (w.store.messages(conv)[-1].content,)
    assert w.transcript.last_reply().versions.isHidden()


# Continue ------------------------------------------------------------------------------------------------------
def test_continue_after_the_length_limit_grows_the_same_message(qtbot, windows):
    w = windows()
    conv = new_chat_with_turn(qtbot, w, "hello there", {"temperature": 0.0, "max_new_tokens": 4})
    last = w.transcript.last_reply()
    assert "length limit" in last.note.text() and not last.continue_button.isHidden()
    assert w.act_continue.isEnabled()
    before = w.store.messages(conv)[-1].content
    qtbot.mouseClick(last.continue_button, qtbot_left())
    wait_idle(qtbot, w)
    stored = w.store.messages(conv)
    assert [m.role for m in stored] == ["user", "assistant"]
    assert stored[-1].content.startswith(before) and len(stored[-1].content) > len(before)
    assert [m.seq for m in w.transcript.messages] == [0, 1] and w.transcript.last_reply().text == stored[-1].content


def test_continue_is_offered_only_for_the_version_the_limit_stopped(qtbot, windows):
    w = windows()
    conv = new_chat_with_turn(qtbot, w, "hello there", {"temperature": 1.5, "max_new_tokens": 4, "seed": 11})
    w.store.set_finish(conv, 1, "eos")  # the first version ended by itself (the tiny model never does in 4 tokens)
    regenerate(qtbot, w)
    last = w.transcript.last_reply()
    assert not last.continue_button.isHidden()
    w.act_earlier_version.trigger()  # Alt+Left: the first version shows, and the chat continues with it
    assert last.versions.label.text() == "1/2"
    assert last.continue_button.isHidden() and not w.chat.can_continue() and not w.act_continue.isEnabled()
    w.chat.continue_reply()  # nothing to continue: no turn starts
    assert not w.turns.running()
    w.act_later_version.trigger()  # back to the version the limit stopped: Continue again
    assert not last.continue_button.isHidden() and w.chat.can_continue() and w.act_continue.isEnabled()


# live figures --------------------------------------------------------------------------------------------------
def test_live_figures_update_while_the_reply_is_written(qtbot, windows):
    w = windows()
    w.new_chat()
    use_settings(w, {"temperature": 0.0, "max_new_tokens": 24})
    seen: list = []
    w.turns.events.on(LiveUpdate, lambda e: seen.append(
        (w.status.speed.text(), w.status.context.text(), e.figures.context_tokens, w.turns.running(e.conversation))))
    send(qtbot, w, "hello there")
    wait_idle(qtbot, w)
    assert seen and all(running for *_, running in seen)  # shown while the reply was being written
    speed, context, tokens, _ = seen[0]
    assert speed.startswith("first token in") and tokens > 0 and context == context_label(tokens, w.status.limit)
    assert [t for *_, t, _ in seen] == sorted(t for *_, t, _ in seen)  # the meter only fills
    assert "first token in" in w.status.speed.text() and "tokens/s" in w.status.speed.text()


# defect 12: the status bar after switching chats --------------------------------------------------------------------
def test_defect12_status_bar_never_shows_the_previous_chats_numbers(qtbot, windows):
    w = windows()
    a = new_chat_with_turn(qtbot, w, "hello there", SHORT)
    assert w.status.speed.text() and w.status.resume.text()
    w.new_chat()
    assert w.status.speed.text() == "" and w.status.resume.text() == ""
    assert w.status.context.text() == context_label(0, w.status.limit)
    resumed = collect_pairs(w.worker, Resumed, "resume")
    w.sidebar.setCurrentItem(w.sidebar.item_for(a))
    qtbot.waitUntil(lambda: any(c == a for c, _ in resumed), timeout=TIMEOUT)
    assert w.status.context.text() != context_label(0, w.status.limit)  # a's own numbers, as it opened


def test_defect12_a_brand_new_chat_does_not_say_it_resumed_from_disk(qtbot, windows):
    w = windows()
    w.preferences = dataclasses.replace(w.preferences, system_prompt="Be brief and kind. " * 3)
    w.worker.hearth._sessions.adaptive = False  # always restore the shared prefix, however fast re-reading is
    a = new_chat_with_turn(qtbot, w, "hello there", SHORT)  # a cold start saves the system prompt for other chats
    assert len(w.store.messages(a)) == 2
    resumed = collect_pairs(w.worker, Resumed, "resume")
    b = w.new_chat()
    use_settings(w, SHORT)
    send(qtbot, w, "a new question")
    wait_idle(qtbot, w)
    report = next(r for c, r in resumed if c == b)
    assert report.source == ResumeSource.DISK and report.shared_prefix  # only the system prompt came from disk
    assert "resumed" not in w.status.resume.text() and "system prompt" in w.status.resume.text()


def test_resume_wording_tells_a_shared_system_prompt_from_the_chats_own_context():
    own = Resume(ResumeSource.DISK, reused_tokens=240, restored_tokens=240, restore_ms=12)
    shared = dataclasses.replace(own, reused_tokens=24, restored_tokens=24, prefilled_tokens=9, shared_prefix=True)
    assert resume_summary(own).startswith("resumed 240 tokens from disk")
    assert resume_summary(shared) == "the system prompt's 24 tokens came from disk · read 9 new tokens"


# defect 15: the title follows an edit of the first message ------------------------------------------------------
def test_defect15_title_follows_an_edit_of_the_first_message(qtbot, windows):
    w = windows()
    conv = new_chat_with_turn(qtbot, w, "hello there", SHORT)
    assert w.sidebar.item_for(conv).text().startswith("hello there")
    w.chat.begin_edit(0)
    w.composer.setPlainText("What is a hearth?")
    w.chat.send(w.composer.toPlainText())
    assert w.sidebar.item_for(conv).text().startswith("What is a hearth?")  # at once, before the reply
    assert w.windowTitle().startswith("What is a hearth?")
    wait_idle(qtbot, w)
    assert w.store.require(conv).title == "What is a hearth?"


def test_defect15_a_title_the_person_chose_stays_after_an_edit(qtbot, windows):
    w = windows()
    conv = new_chat_with_turn(qtbot, w, "hello there", SHORT)
    w.store.rename(conv, "Mine")
    w.chat.begin_edit(0)
    w.composer.setPlainText("something else")
    w.chat.send(w.composer.toPlainText())
    wait_idle(qtbot, w)
    assert w.store.require(conv).title == "Mine"


def test_a_regenerate_stopped_before_its_first_word_shows_the_last_reply_again(qtbot, windows):
    w = windows()
    conv = new_chat_with_turn(qtbot, w, "hello there", SHORT)
    before = w.store.messages(conv)
    hold = threading.Event()
    w.host.request_posted.emit(hold.wait)  # the engine thread is busy: the regenerate waits behind this
    w.act_regenerate.trigger()
    w.act_stop.trigger()  # stopped before the engine starts it: nothing is written
    hold.set()
    wait_idle(qtbot, w)
    assert w.store.messages(conv) == before and w.store.versions_count(conv) == {}
    qtbot.waitUntil(lambda: w.transcript.entries() == [(m.seq, m.role, m.content) for m in before], timeout=TIMEOUT)
    assert w.transcript.last_reply() is not None and w.transcript.stream_widget is None


# Continue after a restart ---------------------------------------------------------------------------------------
def test_continue_is_offered_again_after_the_app_is_opened_again(qtbot, windows):
    w = windows()
    conv = new_chat_with_turn(qtbot, w, "hello there", {"temperature": 0.0, "max_new_tokens": 4})
    assert not w.transcript.last_reply().continue_button.isHidden()
    before = w.store.messages(conv)
    windows.close(w)  # the app quits; nothing of the session is remembered but what is stored
    again = windows()
    again.sidebar.setCurrentItem(again.sidebar.item_for(conv))
    qtbot.waitUntil(lambda: again.current == conv and again.transcript.last_reply() is not None, timeout=TIMEOUT)
    wait_idle(qtbot, again)
    last = again.transcript.last_reply()
    assert last.seq == before[-1].seq and not last.continue_button.isHidden()
    assert again.chat.can_continue() and again.act_continue.isEnabled()
    again.act_continue.trigger()  # Ctrl+Shift+Return
    wait_idle(qtbot, again)
    stored = again.store.messages(conv)
    assert [m.seq for m in stored] == [m.seq for m in before]  # the same message grew; none was added
    assert stored[-1].content.startswith(before[-1].content) and len(stored[-1].content) > len(before[-1].content)
    assert again.transcript.last_reply().text == stored[-1].content


# after ‹ ›: the meter and the sidebar show the chosen version's tokens -----------------------------------------------
def test_after_a_flip_the_meter_and_the_sidebar_show_the_chosen_versions_tokens(qtbot, windows):
    from app.sidebar import SUBTITLE_ROLE, TOKENS_ROLE

    w = windows()
    conv = new_chat_with_turn(qtbot, w, "hello there", {"temperature": 0.0, "max_new_tokens": 3})
    first_tokens = w.sidebar.item_for(conv).data(TOKENS_ROLE)
    use_settings(w, {"temperature": 1.5, "max_new_tokens": 16, "seed": 3})
    regenerate(qtbot, w)
    second_tokens = w.sidebar.item_for(conv).data(TOKENS_ROLE)
    assert second_tokens > first_tokens + 5 and w.status.context.text() == context_label(second_tokens, w.status.limit)
    counted = collect_pairs(w.worker, ChatTokens)
    w.act_earlier_version.trigger()
    qtbot.waitUntil(lambda: bool(counted), timeout=TIMEOUT)
    (cid, tokens), = counted
    engine = w.worker.hearth._engine  # idle now: count both versions the way the next turn's prompt reads them
    chat = w.store.chat_messages(conv)
    versions = w.store.reply_versions(conv, 1).texts

    def size(text: str) -> int:
        return len(engine.encode_prompt(engine.render(chat[:-1]) + text))

    assert chat[-1]["content"] == versions[0]
    assert cid == conv and tokens.tokens == size(versions[0]) < size(versions[1])  # the chosen one's size
    qtbot.waitUntil(lambda: w.sidebar.item_for(conv).data(TOKENS_ROLE) == tokens.tokens, timeout=TIMEOUT)
    assert w.status.context.text() == context_label(tokens.tokens, w.status.limit)
    assert f"{tokens.tokens:,} tokens" in w.sidebar.item_for(conv).data(SUBTITLE_ROLE)
    assert tokens.to_reread > 0 and f"re-reads the last {tokens.to_reread:,} tokens" in w.status.resume.text()
    # The list of contexts said again (as after any other chat's news) keeps the flipped chat's count.
    states = collect(w.worker.cache_states)
    w.host.request_states.emit()
    qtbot.waitUntil(lambda: bool(states), timeout=TIMEOUT)
    assert w.sidebar.item_for(conv).data(TOKENS_ROLE) == tokens.tokens
    # The next turn's own figures take over.
    send(qtbot, w, "and then?")
    wait_idle(qtbot, w)
    assert w.status.context.text() != context_label(tokens.tokens, w.status.limit)


def test_counting_the_tokens_of_a_chat_that_is_gone_changes_nothing(qtbot, windows):
    w = windows()
    conv = new_chat_with_turn(qtbot, w, "hello there", SHORT)
    meter = w.status.context.text()
    counted = collect_pairs(w.worker, ChatTokens)
    w.host.request_chat_tokens.emit("gone-chat")  # deleted meanwhile: the engine refuses; the meter stays
    states = collect(w.worker.cache_states)
    w.host.request_posted.emit(lambda: None)  # queued behind it; its list of contexts arrives after any answer
    qtbot.waitUntil(lambda: bool(states), timeout=TIMEOUT)
    assert counted == [] and w.status.context.text() == meter and w.current == conv
