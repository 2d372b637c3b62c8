"""An agent's turns in the window (issue 30): a reply's thinking as a collapsed "Thought for N s" block that
streams while open, tool calls and tools' results as collapsed blocks, for stored chats and a reply being
written, and a chat the local server stores into while it is open. Real widgets (pytest-qt, offscreen), the
real store; PNGs of the blocks collapsed and open go to /tmp/i30/png/."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import Qt
from PySide6.QtGui import QGuiApplication

from app.agent_blocks import ThinkingBlock, ToolCallBlock, thought_title
from app.collapsible_block import DISPLAY_CHARS
from app.transcript import TranscriptView
from engine.api import ConversationStore
from engine.types import Message, ToolCall

from .qt_helpers import TIMEOUT

PNG = Path("/tmp/i30/png")
CALL = ToolCall("call_0123456789abcdef01234567", "get_weather", '{"city": "Paris", "days": [1, 2]}', 0)
THOUGHT = "The user asks about Paris.\nI should call the weather tool first."


def _agent_chat() -> tuple[list, dict]:
    rows = [Message(0, "user", "What is the weather in Paris?"),
            Message(1, "assistant", "", reasoning=THOUGHT, thought_ms=12_400, tool_calls=(CALL,)),
            Message(2, "tool", '{"temperature": 21, "sky": "clear"}', tool_call_id=CALL.id, name="get_weather"),
            Message(3, "assistant", "It is **21 °C** and clear in Paris.", reasoning="Now answer.", thought_ms=800)]
    return [(m.seq, m.role, m.content) for m in rows], {m.seq: m for m in rows if m.agentic}


def _view(qtbot) -> TranscriptView:
    view = TranscriptView()
    qtbot.addWidget(view)
    view.resize(720, 900)
    view.show()
    return view


def click(qtbot, button) -> None:
    """A mouse click once the button is laid out: a busy machine lays the transcript out over several event
    loop turns, and a click on a button still without its size does nothing."""
    qtbot.waitUntil(lambda: button.isVisible() and not button.rect().isEmpty(), timeout=TIMEOUT)
    qtbot.mouseClick(button, Qt.MouseButton.LeftButton)


def _save(widget, name: str) -> None:
    PNG.mkdir(parents=True, exist_ok=True)
    assert widget.grab().save(str(PNG / name))


def test_thinking_and_tool_blocks_are_collapsed_and_open_by_click_and_keyboard(qtbot):
    view = _view(qtbot)
    messages, agents = _agent_chat()
    view.load(messages, agents=agents)
    qtbot.waitUntil(lambda: len(view.messages) == 4 and not view.loading, timeout=TIMEOUT)
    call_msg, result_msg, answer = view.messages[1], view.messages[2], view.messages[3]
    thinking = call_msg.thinking_block
    assert thinking is not None and not thinking.expanded and thinking.text_view is None  # not even laid out
    assert thinking.title == "Thought for 12 s"
    assert thinking.toggle.accessibleName() == "Thought for 12 s: Show what the model thought before it answered"
    (call_block,) = call_msg.tool_blocks
    assert call_block.title == "Tool call: get_weather" and not call_block.expanded
    assert call_msg.body.isHidden()  # a reply that only calls a tool: no empty "…"
    assert result_msg.result_block.title == "Tool result: get_weather" and not result_msg.result_block.expanded
    assert result_msg.body.isHidden() and result_msg.who.text() == "<b>Tool</b>"
    assert answer.thinking_block.title == "Thought for 1 s" and answer.tool_blocks == []
    _save(view, "agent-collapsed.png")
    click(qtbot, thinking.toggle)
    assert thinking.expanded and thinking.text_view.isVisible() and thinking.shown_text() == THOUGHT
    assert thinking.text_view.isReadOnly() and thinking.toggle.accessibleName().endswith("Hide the thinking")
    call_block.toggle.setFocus()
    qtbot.keyClick(call_block.toggle, Qt.Key.Key_Space)  # the keyboard opens it too
    assert call_block.expanded
    assert call_block.shown_text() == '{\n  "city": "Paris",\n  "days": [\n    1,\n    2\n  ]\n}'
    click(qtbot, result_msg.result_block.toggle)
    assert result_msg.result_block.shown_text() == '{\n  "temperature": 21,\n  "sky": "clear"\n}'
    qtbot.wait(50)
    _save(view, "agent-open.png")
    qtbot.keyClick(call_block.toggle, Qt.Key.Key_Space)
    assert not call_block.expanded and not call_block.text_view.isVisible()


def test_copy_copies_the_reply_and_its_calls_never_the_thinking(qtbot):
    view = _view(qtbot)
    messages, agents = _agent_chat()
    view.load(messages, agents=agents)
    qtbot.waitUntil(lambda: len(view.messages) == 4, timeout=TIMEOUT)
    copied = []
    view.copy_requested.connect(copied.append)
    click(qtbot, view.messages[3].copy_button)
    click(qtbot, view.messages[1].copy_button)
    assert copied[0] == "It is **21 °C** and clear in Paris."
    assert copied[1].startswith("get_weather({") and "Paris" in copied[1] and "weather tool" not in copied[1]


def test_a_streamed_reply_shows_thinking_then_how_long_it_took(qtbot):
    view = _view(qtbot)
    view.load([(0, "user", "Think first.")])
    w = view.begin_stream()
    view.stream("Let me ", "reasoning")
    block = w.thinking_block
    assert block.title == "Thinking…" and block.streaming and not block.expanded
    click(qtbot, block.toggle)  # opened while it streams
    view.stream("think.", "reasoning")
    assert block.shown_text() == "Let me think."  # streams into the open block
    qtbot.wait(50)
    _save(view, "thinking-streaming.png")
    qtbot.wait(1100)
    view.stream("The answer", "content")
    assert block.title == "Thought for 1 s" and not block.streaming  # measured to the first reply piece
    view.stream(" is 4.", "content")
    qtbot.waitUntil(lambda: "is 4." in w.body.toPlainText(), timeout=TIMEOUT)
    assert "think" not in w.body.toPlainText()
    view.end_stream("The answer is 4.", "", 1, "Let me think.", 3_000)  # the stored figure wins
    assert block.title == "Thought for 3 s" and w.text == "The answer is 4." and w.seq == 1
    qtbot.wait(50)
    _save(view, "thinking-done-open.png")
    # switching back to a chat mid-turn draws what was thought and written so far
    again = view.begin_stream("So far", "Thought so far")
    assert again.thinking_block.shown_text() == "" and again.thinking_block.text == "Thought so far"
    assert not again.thinking_block.streaming


def test_a_long_thinking_is_laid_out_only_in_part_until_show_all(qtbot):
    block = ThinkingBlock("x" * (DISPLAY_CHARS + 10), 5_000)
    qtbot.addWidget(block)
    block.set_expanded(True)
    assert len(block.shown_text()) == DISPLAY_CHARS and block.show_all is not None and block.show_all.isVisibleTo(block)
    block.append_text("more")  # past what is laid out: not drawn until Show all
    assert len(block.shown_text()) == DISPLAY_CHARS
    qtbot.mouseClick(block.show_all, Qt.MouseButton.LeftButton)  # a widget never shown: nothing to wait for
    assert block.shown_text().endswith("xmore")


def test_titles_and_bad_arguments():
    assert thought_title(None) == "Thought" and thought_title(12_400) == "Thought for 12 s"
    assert thought_title(200) == "Thought for <1 s" and thought_title(0, streaming=True) == "Thinking…"
    assert thought_title(600) == "Thought for 1 s"
    block = ToolCallBlock(ToolCall("c1", "f", "{not json"))
    assert block.text == "{not json"  # a model's text that is not JSON is shown as written
    block.deleteLater()


def test_the_open_chat_shows_tool_turns_the_server_stores_into_it(qtbot, windows, tmp_path):
    w = windows()
    conv = w.new_chat()
    other = ConversationStore(w.config.paths.conversations_db)  # another connection, as the server's
    try:
        other.append(conv, "user", "Weather in Paris?")
        other.append(conv, "assistant", "", "eos", "tiny", reasoning="Call the tool.", thought_ms=2_000,
                     tool_calls=(CALL,))
        other.append(conv, "tool", '{"temperature": 21}', tool_call_id=CALL.id, name="get_weather")
        other.append(conv, "assistant", "21 °C.", "eos", "tiny")
    finally:
        other.close()
    qtbot.waitUntil(lambda: len(w.transcript.messages) == 4, timeout=TIMEOUT)  # noticed through data_version
    shown = w.transcript.messages
    assert shown[1].thinking_block.title == "Thought for 2 s" and shown[1].tool_blocks[0].call == CALL
    assert shown[2].result_block is not None and shown[3].text == "21 °C."
    qtbot.wait(300)  # the heights settle
    _save(w, "window-tool-turns.png")
    QGuiApplication.clipboard().clear()


def test_the_windows_own_turn_on_a_model_that_thinks_shows_and_stores_the_thinking(qtbot, windows, tiny_gguf,
                                                                                    tmp_path):
    """DeepSeek-R1's template on the tiny model: its generation prompt opens the thinking block, so the reply
    streams as thinking ("Thinking…"), and what is stored is the visible text with the thinking beside it."""
    from app.config import AppConfig
    from engine.paths import resolve_paths
    from tests.gguf_edit import rewrite_gguf

    from .qt_helpers import send, use_settings, wait_idle

    template = (Path(__file__).parent / "templates" / "deepseek-r1-distill-qwen.jinja").read_text()
    gguf = rewrite_gguf(tiny_gguf, tmp_path / "thinks.gguf", values={"tokenizer.chat_template": template})
    home = tmp_path / "thinking-home"
    home.mkdir()
    w = windows(AppConfig(resolve_paths(home).ensure(), model=str(gguf), weights="int4", provider="cpu"))
    conv = w.new_chat()
    use_settings(w, {"temperature": 0.0, "max_new_tokens": 8})
    wait_idle(qtbot, w)  # the new chat drawn (on a busy machine it lags) before its reply streams into it
    seen: list[str] = []  # the thinking block's title each time a piece streams into the transcript
    streamed = w.transcript.stream

    def stream_and_look(piece: str, kind: str = "content") -> None:
        streamed(piece, kind)
        block = w.transcript.stream_widget.thinking_block if w.transcript.stream_widget is not None else None
        seen.append(block.title if block is not None else "")

    w.transcript.stream = stream_and_look
    send(qtbot, w, "What is 2 + 2?")
    wait_idle(qtbot, w)
    stored = w.store.messages(conv)[-1]
    assert stored.role == "assistant" and stored.reasoning and stored.content == ""
    assert "Thinking…" in seen  # while it streamed
    reply = w.transcript.messages[-1]
    assert reply.thinking_block.title == thought_title(stored.thought_ms) and not reply.thinking_block.expanded
    assert reply.thinking_block.text == stored.reasoning and reply.text == ""
    click(qtbot, reply.thinking_block.toggle)
    qtbot.wait(100)
    _save(w, "window-thinking-turn-open.png")
    # the length limit stopped it thinking: Continue writes on in the thinking, in the same message
    qtbot.waitUntil(lambda: w.transcript.messages[-1].continue_button.isVisible(), timeout=TIMEOUT)
    click(qtbot, w.transcript.messages[-1].continue_button)
    wait_idle(qtbot, w)
    longer = w.store.messages(conv)[-1]
    assert len(w.store.messages(conv)) == 2 and longer.content == ""
    assert longer.reasoning.startswith(stored.reasoning) and len(longer.reasoning) > len(stored.reasoning)
    assert w.transcript.messages[-1].thinking_block.text == longer.reasoning


def test_a_request_to_the_windows_server_bound_to_the_open_chat_shows_its_thinking(qtbot, windows, tiny_gguf,
                                                                                 tmp_path):
    """End to end: the window's own server (real HTTP) answers a request bound to the chat shown, on a model
    whose template thinks; the transcript refreshes with the reply and its collapsed thinking block."""
    import dataclasses

    import httpx

    from engine.api import ModelLibrary
    from tests.gguf_edit import rewrite_gguf

    from .test_app_server import start

    template = (Path(__file__).parent / "templates" / "deepseek-r1-distill-qwen.jinja").read_text()
    gguf = rewrite_gguf(tiny_gguf, tmp_path / "thinks.gguf", values={"tokenizer.chat_template": template})
    config = windows.config
    library = ModelLibrary(config.paths)
    name = library.add(gguf).name
    library.use(name)
    w = windows(dataclasses.replace(config, model=None))
    conv = w.new_chat()
    start(qtbot, w)
    try:
        r = httpx.post(w.server.url + "/chat/completions", timeout=60, headers={"X-Hearth-Conversation": conv},
                       json={"model": name, "max_tokens": 6, "temperature": 0,
                             "messages": [{"role": "user", "content": "What is 2 + 2?"}]})
        assert r.status_code == 200, r.text
    finally:
        w.server.stop()
    qtbot.waitUntil(lambda: len(w.transcript.messages) == 2, timeout=TIMEOUT)
    stored = w.store.messages(conv)[-1]
    reply = w.transcript.messages[-1]
    assert stored.reasoning and reply.thinking_block is not None and not reply.thinking_block.expanded
    assert reply.thinking_block.text == stored.reasoning and reply.thinking_block.title.startswith("Thought for")
    assert (r.json()["choices"][0]["message"]["content"] or "") == stored.content == reply.text
