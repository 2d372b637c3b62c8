"""The window when a chat outgrows the model's context (the tiny model: 256 tokens): the marker above the
first message the model reads, after a turn, on reopening the chat and after a restart; under "stop" the
error block and its two buttons; the per-chat setting. Real engine thread, real SQLite, real widgets."""

from __future__ import annotations

from PySide6.QtCore import Qt

from app.main_window import MainWindow
from app.settings_dialog import ChatSettingsDialog
from engine.types import Finished, Resumed

from .qt_helpers import TIMEOUT, collect_dispatched, collect_pairs, send, use_settings, wait_idle

SYSTEM = "You are a helpful assistant who answers briefly and kindly."
DROP = {"temperature": 0.0, "max_new_tokens": 16, "context_policy": "drop_oldest"}
STOP = {"temperature": 0.0, "max_new_tokens": 16}


def chat_with_system_prompt(w: MainWindow, settings: dict) -> str:
    conv = w.new_chat()
    w.store.set_system_prompt(conv, SYSTEM)
    use_settings(w, settings)
    return conv


def turns_until(qtbot, w: MainWindow, done, most: int = 20) -> int:
    """Send numbered messages until ``done()``; return how many were sent."""
    for i in range(most):
        send(qtbot, w, f"message number {i} says hello")
        wait_idle(qtbot, w)
        if done():
            return i + 1
    raise AssertionError(f"not done after {most} messages")


def marker_shown(w: MainWindow) -> int:
    """The count the marker shows, after checking it sits right above the message it names (0: none)."""
    t = w.transcript
    if t.view_marker.isHidden():
        return 0
    n = t.view_marker.count
    layout = t.widget().layout()
    first_read = [m for m in t.messages if m.seq >= 0][n]
    assert layout.indexOf(t.view_marker) == layout.indexOf(first_read) - 1
    assert first_read.role == "user"
    assert t.view_marker.label.text() == f"{n} earlier messages are outside the model's view"
    return n


def test_the_marker_shows_how_many_messages_the_model_no_longer_reads(qtbot, windows, config):
    w = windows()
    conv = chat_with_system_prompt(w, DROP)
    finished = collect_dispatched(w.turns, Finished)
    turns_until(qtbot, w, lambda: finished[-1][1].dropped_messages > 0)
    dropped = finished[-1][1].dropped_messages
    assert marker_shown(w) == dropped
    assert len(w.store.messages(conv)) == len(w.transcript.messages)  # every message is kept and shown
    # another chat, then back: the engine reports the same view when it opens the chat again
    other = w.new_chat()
    assert w.current == other and marker_shown(w) == 0
    reports = collect_pairs(w.worker, Resumed, "dropped_messages")
    w.sidebar.setCurrentItem(w.sidebar.item_for(conv))
    qtbot.waitUntil(lambda: (conv, dropped) in reports, timeout=TIMEOUT)
    qtbot.waitUntil(lambda: not w.transcript.loading, timeout=TIMEOUT)
    assert marker_shown(w) == dropped
    # a restart: a fresh engine computes it from the stored chat alone
    windows.close(w)
    again = windows()
    assert again.current == conv
    qtbot.waitUntil(lambda: not again.transcript.loading and marker_shown(again) == dropped, timeout=TIMEOUT)


def test_at_the_limit_under_stop_an_error_block_offers_a_new_chat_or_dropping(qtbot, windows):
    w = windows()
    conv = chat_with_system_prompt(w, STOP)
    block = w.transcript.context_limit
    sent = turns_until(qtbot, w, block.isVisible)
    refused = f"message number {sent - 1} says hello"
    assert "but the model reads at most 256. Start a new chat" in block.message.text()
    assert block.new_chat_button.isVisible() and block.drop_button.isVisible()
    assert w.composer.toPlainText() == refused  # given back, not stored
    stored = [m.content for m in w.store.messages(conv)]
    assert refused not in stored and w.status.resume.text() == ""

    # a new chat carrying the system prompt; the message waits in the composer
    qtbot.mouseClick(block.new_chat_button, Qt.MouseButton.LeftButton)
    assert w.current != conv and w.store.require(w.current).system_prompt == SYSTEM
    assert w.store.messages(w.current) == [] and w.composer.toPlainText() == refused and block.isHidden()
    assert [m.content for m in w.store.messages(conv)] == stored

    # back in the long chat, the same refusal; this time let it drop its oldest messages
    w.sidebar.setCurrentItem(w.sidebar.item_for(conv))
    wait_idle(qtbot, w)
    w.composer.submit()
    qtbot.waitUntil(block.isVisible, timeout=TIMEOUT)
    finished = collect_dispatched(w.turns, Finished)
    qtbot.mouseClick(block.drop_button, Qt.MouseButton.LeftButton)
    assert w.store.require(conv).settings["context_policy"] == "drop_oldest"
    qtbot.waitUntil(lambda: bool(finished), timeout=TIMEOUT)
    wait_idle(qtbot, w)
    assert [m.content for m in w.store.messages(conv)][:-1] == stored + [refused]
    assert w.composer.toPlainText() == "" and block.isHidden()
    assert marker_shown(w) == finished[-1][1].dropped_messages > 0


def test_a_message_too_long_even_alone_says_so_without_buttons(qtbot, windows):
    w = windows()
    conv = chat_with_system_prompt(w, DROP)
    w.composer.setPlainText("word " * 300)
    w.composer.submit()
    qtbot.waitUntil(w.transcript.context_limit.isVisible, timeout=TIMEOUT)
    block = w.transcript.context_limit
    assert block.message.text().startswith("Your message and the system prompt are")
    assert block.new_chat_button.isHidden() and block.drop_button.isHidden()
    assert w.store.messages(conv) == [] and w.composer.toPlainText() == "word " * 300


def test_the_chat_settings_row_sets_the_policy_only_when_chosen(qtbot):
    untouched = ChatSettingsDialog("", {"temperature": 0.5})
    qtbot.addWidget(untouched)
    assert untouched.context_policy.currentText() == "Stop"
    assert "context_policy" not in untouched.values()[1]  # a chat without a choice keeps following the default
    chosen = ChatSettingsDialog("", {"context_policy": "drop_oldest"})
    qtbot.addWidget(chosen)
    assert chosen.context_policy.currentText() == "Drop the oldest messages"
    assert chosen.values()[1]["context_policy"] == "drop_oldest"
    chosen.context_policy.setCurrentIndex(chosen.context_policy.findText("Stop"))
    assert chosen.values()[1]["context_policy"] == "stop"
    broken = ChatSettingsDialog("", {"context_policy": "sometimes"})  # a bad stored value shows as Stop, fixed on OK
    qtbot.addWidget(broken)
    assert broken.context_policy.currentText() == "Stop" and broken.values()[1]["context_policy"] == "stop"


def test_a_bad_stored_policy_is_a_readable_refusal(qtbot, windows):
    w = windows()
    conv = chat_with_system_prompt(w, {"context_policy": "sometimes"})
    send(qtbot, w, "hello")
    wait_idle(qtbot, w)
    assert "is 'sometimes', which is not one of: stop, drop_oldest" in w.status.resume.text()
    assert w.store.messages(conv) == [] and w.composer.toPlainText() == "hello"


def test_the_default_policy_in_preferences_applies_to_chats_without_their_own(qtbot, windows, config):
    from engine.api import Preferences, save_preferences

    save_preferences(config.paths, Preferences(context_policy="drop_oldest", temperature=0.0, max_new_tokens=16))
    w = windows()
    chat_with_system_prompt(w, {})  # no policy of its own: it follows Preferences
    finished = collect_dispatched(w.turns, Finished)
    turns_until(qtbot, w, lambda: finished[-1][1].dropped_messages > 0)  # never refused: it drops instead
    assert not w.transcript.context_limit.isVisible()
    qtbot.waitUntil(lambda: marker_shown(w) == finished[-1][1].dropped_messages, timeout=TIMEOUT)
