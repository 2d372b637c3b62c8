"""Conversations that hold an agent's turns (issue 30): tool calls, tool results and thinking in the store —
schema 10's migration, round trips, bounds and refusals, exports, imports, search and salvage."""

from __future__ import annotations

import json
import sqlite3

import pytest

from engine import db_recovery, tool_messages
from engine.conversations import MIGRATIONS, SCHEMA_VERSION, ConversationError, ConversationStore
from engine.search import search
from engine.transfer import TransferError, export_json, import_json, to_document, to_markdown
from engine.types import Message, ToolCall
from tests.test_db_recovery import _checkpointed, _overwrite_page, _page_owners

WEATHER = ToolCall("call_0123456789abcdef01234567", "get_weather", '{"city": "Paris", "unit": "celsius"}', 0)
TIME = ToolCall("call_fedcba9876543210fedcba98", "get_time", '{"zone": "Europe/Paris"}', 1)


def _tool_loop(store: ConversationStore, cid: str = "agent") -> None:
    store.create(cid, system_prompt="You call tools.")
    store.append(cid, "user", "What is the weather and the time in Paris?")
    store.append(cid, "assistant", "", "eos", "qwen3", reasoning="The user wants two things.",
                 thought_ms=1200, tool_calls=(WEATHER, TIME))
    store.append(cid, "tool", '{"temperature": 21}', tool_call_id=WEATHER.id, name="get_weather")
    store.append(cid, "tool", '{"time": "14:05"}', tool_call_id=TIME.id)
    store.append(cid, "assistant", "It is 21 °C and 14:05 in Paris.", "eos", "qwen3")


def test_a_tool_loop_round_trips_through_the_store(tmp_path):
    store = ConversationStore(tmp_path / "c.db")
    _tool_loop(store)
    held = store.messages("agent")
    assert [m.role for m in held] == ["user", "assistant", "tool", "tool", "assistant"]
    call = held[1]
    assert call.tool_calls == (WEATHER, TIME) and call.reasoning == "The user wants two things."
    assert call.thought_ms == 1200 and call.content == ""
    assert held[2].tool_call_id == WEATHER.id and held[2].name == "get_weather"
    assert held[3].tool_call_id == TIME.id and held[3].name == ""
    chat = store.chat_messages("agent")
    assert chat[2] == {"role": "assistant", "content": "", "reasoning_content": "The user wants two things.",
                       "tool_calls": [{"id": WEATHER.id, "type": "function",
                                       "function": {"name": "get_weather", "arguments": WEATHER.arguments}},
                                      {"id": TIME.id, "type": "function",
                                       "function": {"name": "get_time", "arguments": TIME.arguments}}]}
    assert chat[3] == {"role": "tool", "content": '{"temperature": 21}', "tool_call_id": WEATHER.id,
                       "name": "get_weather"}
    assert chat[4] == {"role": "tool", "content": '{"time": "14:05"}', "tool_call_id": TIME.id}
    assert chat[5] == {"role": "assistant", "content": "It is 21 °C and 14:05 in Paris."}
    # a branch carries the agent's fields too
    copy = store.duplicate("agent")
    assert store.chat_messages(copy.id) == chat


def test_a_chat_without_tools_reads_exactly_as_before(tmp_path):
    """The template receives the same dicts as before issue 30 (so it renders the same bytes): no new keys."""
    store = ConversationStore(tmp_path / "c.db")
    store.create("plain", system_prompt="Be brief.")
    store.append("plain", "user", "hi")
    store.append("plain", "assistant", "hello", "eos", "m")
    assert store.chat_messages("plain") == [{"role": "system", "content": "Be brief."},
                                            {"role": "user", "content": "hi"},
                                            {"role": "assistant", "content": "hello"}]
    assert Message(0, "user", "x").as_chat() == {"role": "user", "content": "x"}


@pytest.mark.parametrize("kwargs, needle", [
    ({"role": "user", "reasoning": "thinking"}, "only a reply"),
    ({"role": "tool", "tool_calls": (WEATHER,), "tool_call_id": "c1"}, "only a reply"),
    ({"role": "user", "tool_call_id": "call_1"}, "only a tool message"),
    ({"role": "assistant", "name": "get_weather"}, "only a tool message"),
    ({"role": "tool"}, "tool_call_id must be non-empty"),
    ({"role": "tool", "tool_call_id": "has space"}, "is not an id"),
    ({"role": "tool", "tool_call_id": "x" * 257}, "is not an id"),
    ({"role": "tool", "tool_call_id": "c1", "name": "bad name!"}, "not a function name"),
    ({"role": "assistant", "tool_calls": (ToolCall("c1", "f", "{not json"),)}, "not valid JSON"),
    ({"role": "assistant", "tool_calls": (ToolCall("c1", "f", "[1, 2]"),)}, "must be a JSON object"),
    ({"role": "assistant", "tool_calls": (ToolCall("c1", "f", {"a": 1}),)}, "must be a JSON string"),
    ({"role": "assistant", "tool_calls": (ToolCall("c1", "", "{}"),)}, "not a function name"),
    ({"role": "assistant", "tool_calls": (ToolCall("", "f", "{}"),)}, "id must be non-empty"),
    ({"role": "assistant", "tool_calls": tuple(ToolCall(f"c{i}", "f", "{}", i) for i in range(65))}, "at most 64"),
    ({"role": "assistant", "tool_calls": (ToolCall("c1", "f", json.dumps({"a": "x" * (256 << 10)})),)},
     "arguments are"),
    ({"role": "assistant", "reasoning": "x" * ((4 << 20) + 1)}, "at most"),
    ({"role": "assistant", "thought_ms": -1}, "thought_ms"),
    ({"role": "assistant", "thought_ms": True}, "thought_ms"),
])
def test_bad_agent_fields_are_refused_and_nothing_is_stored(tmp_path, kwargs, needle):
    store = ConversationStore(tmp_path / "c.db")
    store.create("c")
    role = kwargs.pop("role")
    with pytest.raises(ConversationError, match=needle):
        store.append("c", role, "text", **kwargs)
    assert store.messages("c") == []


def test_the_whole_list_of_calls_is_bounded():
    calls = tuple(ToolCall(f"c{i}", "f", json.dumps({"a": "y" * 20_000}), i) for i in range(60))
    with pytest.raises(ValueError, match="characters of JSON"):
        tool_messages.to_json(calls)


def test_stored_calls_that_do_not_read_back_are_left_out_not_fatal(tmp_path, caplog):
    store = ConversationStore(tmp_path / "c.db")
    store.create("c")
    store.append("c", "user", "hi")
    store.append("c", "assistant", "calling", tool_calls=(WEATHER,))
    with sqlite3.connect(tmp_path / "c.db") as db:  # a database edited by hand
        db.execute("UPDATE messages SET tool_calls = '{broken' WHERE seq = 1")
    held = store.messages("c")
    assert held[1].content == "calling" and held[1].tool_calls == ()
    assert "unreadable" in caplog.text
    for bad in ("{}", '[{"id": "c1"}]', '[{"id": "c1", "type": "function", "function": {"name": "f", "arguments": 3}}]'):
        with pytest.raises(ValueError):
            tool_messages.from_json(bad)


def _schema_9(path) -> None:
    with sqlite3.connect(path) as db:
        for i, sql in enumerate(MIGRATIONS[:9], 1):
            db.executescript(sql + f"; PRAGMA user_version = {i};")
        db.execute("INSERT INTO conversations (id, title, created_ms, updated_ms) VALUES ('old', 'Old', 1, 2)")
        db.execute("INSERT INTO messages (conversation_id, seq, role, content, created_ms, typed_text) "
                   "VALUES ('old', 0, 'user', '[File: a.txt]\nalpha words\n\nhello there', 1, 'hello there')")
        mid = db.execute("SELECT id FROM messages").fetchone()[0]
        db.execute("INSERT INTO attachments (message_id, position, name, size, sha256, kind, text) "
                   "VALUES (?, 0, 'a.txt', 11, ?, 'text', 'alpha words')", (mid, "0" * 64))
        db.execute("INSERT INTO messages (conversation_id, seq, role, content, created_ms, finish, model) "
                   "VALUES ('old', 1, 'assistant', 'general kenobi', 2, 'eos', 'm')")
        db.execute("INSERT INTO alternatives (conversation_id, seq, position, content, created_ms, finish, model) "
                   "VALUES ('old', 1, 0, 'an earlier version', 1, 'eos', 'm')")


def test_a_schema_9_database_migrates_with_its_files_versions_and_search(tmp_path):
    path = tmp_path / "v9.db"
    _schema_9(path)
    store = ConversationStore(path)
    assert store.read("PRAGMA user_version")[0][0] == SCHEMA_VERSION == 11
    held = store.messages("old")
    assert [m.content for m in held][1] == "general kenobi" and held[0].typed_text == "hello there"
    assert [a.name for a in held[0].attachments] == ["a.txt"]  # the rebuild kept the files (foreign keys off)
    assert store.reply_facts("old")[1].finish == "eos"
    assert store.reply_versions("old", 1).texts == ("an earlier version", "general kenobi")
    assert [h.conversation for h in search(store, "kenobi", typing=False)] == ["old"]  # the index still points right
    store.append("old", "user", "now a tool")
    store.append("old", "assistant", "", tool_calls=(WEATHER,))
    store.append("old", "tool", "sunny and warm", tool_call_id=WEATHER.id)
    assert [h.seq for h in search(store, "sunny", typing=False)] == [4]  # a tool's result is found
    store.truncate("old", 2)
    assert search(store, "sunny", typing=False) == []  # and the search triggers work on the new table
    assert store.read("PRAGMA foreign_key_check") == [] and store.read("PRAGMA integrity_check") == [("ok",)]
    store.close()
    assert db_recovery.list_backups(path)  # the copy from before the upgrade


def test_regenerate_keeps_each_versions_thinking_and_calls(tmp_path):
    store = ConversationStore(tmp_path / "c.db")
    store.create("c")
    store.append("c", "user", "hi")
    store.append("c", "assistant", "first", "eos", "m", reasoning="first thought", thought_ms=10,
                 tool_calls=(WEATHER,))
    store.set_aside_reply("c")
    store.append("c", "assistant", "second", "eos", "m", reasoning="second thought", thought_ms=20)
    assert store.choose_version("c", 1, 0) == "first"
    last = store.messages("c")[-1]
    assert (last.reasoning, last.thought_ms, last.tool_calls) == ("first thought", 10, (WEATHER,))
    store.choose_version("c", 1, 1)
    last = store.messages("c")[-1]
    assert (last.reasoning, last.thought_ms, last.tool_calls) == ("second thought", 20, ())
    seq = store.set_aside_reply("c")
    assert store.restore_reply("c", seq)
    assert store.messages("c")[-1].reasoning == "second thought"
    store.edit("c", 1, "rewritten by the person")  # no longer what the model thought
    assert store.messages("c")[-1].reasoning == "" and store.messages("c")[-1].thought_ms is None


def test_export_import_round_trip_of_a_tool_loop(tmp_path):
    store = ConversationStore(tmp_path / "a.db")
    _tool_loop(store)
    doc = to_document(store, ["agent"])
    msgs = doc["conversations"][0]["messages"]
    assert msgs[1]["tool_calls"][0]["function"] == {"name": "get_weather", "arguments": WEATHER.arguments}
    assert msgs[1]["reasoning"] == "The user wants two things." and msgs[1]["thought_ms"] == 1200
    assert msgs[2]["tool_call_id"] == WEATHER.id and msgs[2]["name"] == "get_weather"
    assert "tool_calls" not in msgs[0] and "reasoning" not in msgs[4]  # only where there are some
    export_json(store, ["agent"], tmp_path / "out.json")
    other = ConversationStore(tmp_path / "b.db")
    assert import_json(other, tmp_path / "out.json") == ["agent"]
    again = to_document(other, ["agent"])
    assert again["conversations"] == doc["conversations"]
    md = to_markdown(other, ["agent"])
    assert "> **Thought for 1 s**" in md and "**Tool call:** `get_weather`" in md
    assert '"city": "Paris"' in md and "## Tool result: get\\_weather" in md


def test_an_export_from_before_imports_as_before(tmp_path):
    old = {"format": "hearth.conversations", "version": 1, "conversations": [
        {"id": "x", "title": "T", "system_prompt": "", "settings": {}, "model": "", "created_ms": 1, "updated_ms": 1,
         "messages": [{"role": "user", "content": "hi", "created_ms": 1},
                      {"role": "assistant", "content": "hello", "created_ms": 1}]}]}
    (tmp_path / "old.json").write_text(json.dumps(old))
    store = ConversationStore(tmp_path / "c.db")
    import_json(store, tmp_path / "old.json")
    assert store.chat_messages("x") == [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]


def _doc(message: dict) -> dict:
    return {"format": "hearth.conversations", "version": 1, "conversations": [
        {"id": "x", "title": "T", "system_prompt": "", "settings": {}, "model": "", "created_ms": 1, "updated_ms": 1,
         "messages": [{"role": "user", "content": "hi", "created_ms": 1}, {"created_ms": 1, **message}]}]}


@pytest.mark.parametrize("message, needle", [
    ({"role": "assistant", "content": "", "tool_calls": "nope"}, "tool_calls: tool_calls must be a list"),
    ({"role": "assistant", "content": "", "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": "{"}}]},
     "not valid JSON"),
    ({"role": "assistant", "content": "", "tool_calls": [{"id": "c", "type": "other"}]}, "must be"),
    ({"role": "tool", "content": "r"}, "tool_call_id must be non-empty"),
    ({"role": "tool", "content": "r", "tool_call_id": 5}, "expected str"),
    ({"role": "user", "content": "r", "reasoning": "no"}, "only a reply"),
    ({"role": "assistant", "content": "r", "thought_ms": -4}, "not a time"),
    ({"role": "assistant", "content": "r", "tool_call_id": "c"}, "only a tool message"),
    ({"role": "robot", "content": "r"}, "is not one of system, user, assistant, tool"),
])
def test_bad_agent_fields_in_an_import_name_the_place_and_import_nothing(tmp_path, message, needle):
    (tmp_path / "bad.json").write_text(json.dumps(_doc(message)))
    store = ConversationStore(tmp_path / "c.db")
    with pytest.raises(TransferError, match=needle) as raised:
        import_json(store, tmp_path / "bad.json")
    assert "conversations[0].messages[1]" in str(raised.value)
    assert store.list() == []


def test_salvage_keeps_tool_messages_read_off_the_pages(tmp_path):
    db = tmp_path / "conversations.sqlite3"
    store = ConversationStore(db)
    for i in range(6):
        _tool_loop(store, f"agent{i}")
        for j in range(6):
            store.append(f"agent{i}", "user", f"more {j} " + "words " * 150)
    store.close()
    _checkpointed(db)
    owners = _page_owners(db)
    pages = [p for p, name in sorted(owners.items()) if name == "messages"]
    _overwrite_page(db, pages[len(pages) // 2])
    db_recovery.salvage(db)
    store = ConversationStore(db)
    kept = [m for c in store.list() for m in store.messages(c.id)]
    tools = [m for m in kept if m.role == "tool"]
    assert tools and all(m.tool_call_id in (WEATHER.id, TIME.id) for m in tools)
    calls = [m for m in kept if m.tool_calls]
    assert calls and all(m.tool_calls == (WEATHER, TIME) and m.thought_ms == 1200 for m in calls)
