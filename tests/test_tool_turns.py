"""A turn that offers tools (issue 33): the template renders them, the reply's calls are parsed and stored with
it, a forced call is constrained to the tool's schema, a tool result stored as a message of its own is read by
the next step — which re-reads only what came after the last reply — and the loop's state (schema 11) says
which calls are pending, running or settled. The tiny model, real ONNX Runtime, real SQLite."""

from __future__ import annotations

import json

import pytest

from engine.api import Hearth, resolve_paths
from engine.conversations import ConversationStore
from engine.errors import ContextLengthError, ConversationError, PromptError
from engine.tools.loop import (
    ABANDONED,
    INTERRUPTED,
    RUNNING,
    abandon_calls,
    allow_always,
    always_allowed,
    chat_tools,
    deny_call,
    pending_calls,
)
from engine.types import Finished, PieceKind, SamplingParams, Token, ToolChoice, ToolChoiceMode, TurnRequest

GREEDY = SamplingParams(temperature=0.0)


@pytest.fixture
def hearth(tmp_path, qwen3_chat_gguf, qwen3_chat_home):
    """A tiny Qwen3 with Qwen3's real template (Hermes' call format), so tools fit its context."""
    home = tmp_path / "home"
    home.mkdir()
    (home / "converted").symlink_to(qwen3_chat_home)
    service = Hearth(resolve_paths(home).ensure(), model=str(qwen3_chat_gguf), provider="cpu")
    service.load()
    service._sessions.adaptive = False  # the tiny model re-reads faster than it restores: always restore
    yield service
    service.close()
ADD = {"type": "function", "function": {"name": "add", "description": "Add two numbers",
                                        "parameters": {"type": "object", "properties": {
                                            "a": {"type": "integer", "minimum": 0, "maximum": 99},
                                            "b": {"type": "integer", "minimum": 0, "maximum": 99}},
                                            "required": ["a", "b"], "additionalProperties": False}}}
REQUIRED = ToolChoice(ToolChoiceMode.REQUIRED)


def _forced_call(hearth, cid: str = "t1", message: str = "What is 2 + 3?") -> Finished:
    return hearth.run_turn(TurnRequest(cid, message, GREEDY, max_new_tokens=96, tools=(ADD,), tool_choice=REQUIRED),
                           create=True)


def test_a_forced_call_is_parsed_checked_against_its_schema_and_stored_with_the_reply(hearth):
    events: list = []
    finished = hearth.run_turn(TurnRequest("t1", "What is 2 + 3?", GREEDY, max_new_tokens=96, tools=(ADD,),
                                           tool_choice=REQUIRED), events.append, create=True)
    assert len(finished.tool_calls) >= 1
    call = finished.tool_calls[0]
    assert call.name == "add"
    args = json.loads(call.arguments)
    assert set(args) >= {"a", "b"} and all(isinstance(args[k], int) for k in ("a", "b"))
    stored = hearth.conversations.messages("t1")[-1]
    assert stored.role == "assistant" and stored.tool_calls == finished.tool_calls
    assert not any(isinstance(e, Token) and "<tool_call>" in e.text for e in events)  # a call is not shown as text
    assert all(e.kind != str(PieceKind.TOOL_CALL) for e in events if isinstance(e, Token))
    assert [p.call for p in pending_calls(hearth.conversations, "t1")] == list(finished.tool_calls)


def test_the_next_step_reads_only_the_result_after_the_reply(hearth):
    first = _forced_call(hearth)
    convs = hearth.conversations
    for call in first.tool_calls:
        convs.append_tool_result("t1", call.id, call.name, "5", "done")
    assert pending_calls(convs, "t1") == []
    second = hearth.run_turn(TurnRequest("t1", None, GREEDY, max_new_tokens=4, tools=(ADD,)))
    reused = second.local.resume.reused_tokens
    read = second.prompt_tokens - reused
    assert str(second.local.resume.source) == "live"
    assert reused >= first.context_tokens - 2  # the KV kept the call as the model wrote it (the template's echo)
    assert 0 < read < 40, (reused, second.prompt_tokens)  # the result and the next turn's header, no more
    assert convs.tool_runs("t1") == {c.id: "done" for c in first.tool_calls}


def test_after_a_restart_the_step_resumes_from_disk_and_reads_only_the_result(hearth, tmp_path, qwen3_chat_gguf):
    first = _forced_call(hearth)
    hearth.close()
    again = Hearth(resolve_paths(tmp_path / "home").ensure(), model=str(qwen3_chat_gguf), provider="cpu")
    again.load()
    again._sessions.adaptive = False
    try:
        for call in first.tool_calls:
            again.conversations.append_tool_result("t1", call.id, call.name, "5", "done")
        second = again.run_turn(TurnRequest("t1", None, GREEDY, max_new_tokens=4, tools=(ADD,)))
        assert str(second.local.resume.source) == "disk"
        assert second.prompt_tokens - second.local.resume.reused_tokens < 40
    finally:
        again.close()


def test_bad_tools_are_refused_before_the_message_is_stored(hearth):
    bad = {"type": "function", "function": {"name": "no spaces allowed", "parameters": {"type": "object"}}}
    with pytest.raises(PromptError, match="no spaces allowed"):
        hearth.run_turn(TurnRequest("t2", "hi", GREEDY, max_new_tokens=4, tools=(bad,)), create=True)
    assert hearth.conversations.get("t2") is None
    with pytest.raises(PromptError):  # a named function that is not offered
        hearth.run_turn(TurnRequest("t2", "hi", GREEDY, max_new_tokens=4, tools=(ADD,),
                                    tool_choice=ToolChoice(ToolChoiceMode.FUNCTION, "subtract")), create=True)
    assert hearth.conversations.get("t2") is None


def test_tools_too_long_for_the_context_are_refused_before_storing(hearth):
    many = tuple({"type": "function", "function": {"name": f"tool{i}", "description": "word " * 10000,
                                                   "parameters": {"type": "object"}}} for i in range(8))
    with pytest.raises(ContextLengthError, match="context window"):
        hearth.run_turn(TurnRequest("t3", "hi", GREEDY, max_new_tokens=4, tools=many), create=True)
    assert hearth.conversations.get("t3") is None


def test_pending_running_denied_and_abandoned_calls(hearth):
    first = _forced_call(hearth)
    convs = hearth.conversations
    call = first.tool_calls[0]
    convs.start_tool_run("t1", call.id)
    assert [p.state for p in pending_calls(convs, "t1")][0] == RUNNING  # a restart finds it may have run
    assert abandon_calls(convs, "t1") == len(first.tool_calls)
    results = [m for m in convs.messages("t1") if m.role == "tool"]
    assert results[0].content == INTERRUPTED and results[0].tool_call_id == call.id
    assert all(m.content == ABANDONED for m in results[1:])
    assert convs.tool_runs("t1")[call.id] == "abandoned"
    assert pending_calls(convs, "t1") == []

    second = _forced_call(hearth, "t4")
    deny_call(hearth.conversations, "t4", second.tool_calls[0])
    assert hearth.conversations.tool_runs("t4")[second.tool_calls[0].id] == "denied"


def test_the_store_refuses_a_bad_state_and_an_unknown_chat(tmp_path):
    store = ConversationStore(tmp_path / "c.db")
    store.create("c1")
    with pytest.raises(ConversationError, match="not 'maybe'"):
        store.append_tool_result("c1", "call_1", "add", "5", "maybe")
    with pytest.raises(ConversationError, match="no conversation"):
        store.start_tool_run("nope", "call_1")
    with pytest.raises(ValueError):
        store.start_tool_run("c1", "has spaces")
    assert store.messages("c1") == []  # nothing half-stored
    store.close()


def test_a_result_that_comes_after_the_chat_went_on_is_refused(tmp_path):
    """A call runs off the thread that stores messages: a new message (another process's, a Regenerate) or an
    answer for it can come first. Its late result must not follow them: the model would read it out of place."""
    from engine.types import ToolCall

    store = ConversationStore(tmp_path / "c.db")
    store.create("c1")
    store.append("c1", "user", "add and multiply")
    calls = (ToolCall("call_a", "add", "{}", 0), ToolCall("call_b", "mul", "{}", 1))
    store.append("c1", "assistant", "", tool_calls=calls)
    store.append_tool_result("c1", "call_a", "add", "5", "done")
    with pytest.raises(ConversationError, match="already has its result"):
        store.append_tool_result("c1", "call_a", "add", "5 again", "done")
    with pytest.raises(ConversationError, match="went on"):
        store.append_tool_result("c1", "call_zz", "add", "5", "done")  # no call of the last reply
    store.append("c1", "user", "never mind")
    with pytest.raises(ConversationError, match="went on before the result of the call call_b"):
        store.append_tool_result("c1", "call_b", "mul", "6", "done")
    assert [m.role for m in store.messages("c1")] == ["user", "assistant", "tool", "user"]
    assert store.tool_runs("c1") == {"call_a": "done"}
    store.close()


def test_a_chat_narrows_its_tools_and_remembers_always_allowed(tmp_path):
    from engine.tools.host import ToolSpec

    specs = [ToolSpec("calc", "add", "add", "", {"type": "object"}), ToolSpec("calc", "mul", "mul", "", {"type": "object"}),
             ToolSpec("files", "read", "read", "", {"type": "object"}),
             ToolSpec("files", "rm", "rm", "", {"type": "object"}, enabled=False)]
    assert [s.function for s in chat_tools(specs, {})] == ["add", "mul", "read"]
    assert [s.function for s in chat_tools(specs, {"tools": ["files"]})] == ["read"]
    assert [s.function for s in chat_tools(specs, {"tools": ["calc/mul", 7]})] == ["mul"]
    assert chat_tools(specs, {"tools": []}) == []
    store = ConversationStore(tmp_path / "c.db")
    store.create("c1")
    allow_always(store, "c1", "add")
    allow_always(store, "c1", "add")
    assert always_allowed(store.require("c1").settings) == {"add"}
    assert always_allowed({"tools_always": "add"}) == frozenset()
    store.close()
