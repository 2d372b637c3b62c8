"""Full-text search (whatever a person types), trash with undo, branches, and export/import."""

from __future__ import annotations

import json

import pytest

from engine.conversations import ConversationStore
from engine.search import fts_query, search, snippet_html
from engine.transfer import TransferError, export_json, export_markdown, import_json, to_document


@pytest.fixture
def store(tmp_path) -> ConversationStore:
    s = ConversationStore(tmp_path / "c.sqlite3")
    chats = {
        "rivers": ["How long is the Nile river?", "The Nile is about 6,650 km long."],
        "cooking": ["Give me a crème brûlée recipe", "You need cream, sugar and vanilla."],
        "code": ["What does `x += 1` do in C++?", "It increments x by one (C++ operator +=)."],
        "japan": ["東京の天気は？", "東京は晴れです。"],
    }
    for cid, (q, a) in chats.items():
        s.create(cid, model="SmolLM2 int4" if cid != "code" else "other-model")
        s.append(cid, "user", q)
        s.append(cid, "assistant", a)
    return s


def ids(hits) -> list[str]:
    return [h.conversation for h in hits]


def test_hits_and_misses(store):
    assert ids(search(store, "nile")) == ["rivers"]
    assert ids(search(store, "vanilla cream")) == ["cooking"]
    assert search(store, "zeppelin") == []
    assert set(ids(search(store, ""))) == {"rivers", "cooking", "code", "japan"}  # no words: everything


def test_prefix_while_typing_and_snippets(store):
    hits = search(store, "incre")
    assert ids(hits) == ["code"] and "\x02increments\x03" in hits[0].snippet
    assert "<b>increments</b>" in snippet_html(hits[0].snippet)
    assert search(store, "incre", typing=False) == []  # a finished word is matched whole


def test_unicode_and_accents(store):
    assert ids(search(store, "creme brulee")) == ["cooking"]  # diacritics folded
    assert ids(search(store, "crème")) == ["cooking"]
    assert ids(search(store, "東京は晴れです")) == ["japan"]


def test_titles_match_and_rank_first(store):
    store.rename("rivers", "Geography homework")
    hits = search(store, "geography")
    assert ids(hits) == ["rivers"] and hits[0].seq is None


def test_phrases_exclusions_and_filters(store):
    assert ids(search(store, '"about 6,650"')) == ["rivers"]
    assert ids(search(store, "the -nile", typing=False)) == []  # "the" only appears in the Nile chat
    assert "code" not in ids(search(store, "", model="SmolLM2 int4"))
    assert ids(search(store, "", since_ms=2**52)) == []


@pytest.mark.parametrize("typed", ['"', '"unclosed phrase', "(((", ")", "a AND", "OR", "NOT", "NEAR(a b)", "*", "-",
                                   "--", "-nile", "c++", "x += 1", "^", "col:umn", "a:b", "{x}", "[]", "'", "\\",
                                   "🙂", "\x00", "a" * 500, "AND OR NOT NEAR", '"a" * -"b"', "…", "%_%"])
def test_search_syntax_typed_by_a_person_never_raises(store, typed):
    search(store, typed)  # must not raise
    search(store, typed, typing=False)


def test_fts_query_never_emits_raw_syntax():
    assert fts_query("-only") is None and fts_query("(((") is None
    assert fts_query('say "hi there') == '"say" AND "hi there"'
    assert fts_query("a -b") == '"a" NOT "b"'
    assert fts_query("NEAR(a b)") == '"NEAR" AND "a" AND "b"'


def test_a_version_1_database_is_upgraded_and_indexed(tmp_path):
    import sqlite3

    from engine.conversations import MIGRATIONS

    path = tmp_path / "old.sqlite3"
    db = sqlite3.connect(path)
    db.executescript(MIGRATIONS[0] + "; PRAGMA user_version = 1;")
    db.execute("INSERT INTO conversations (id, title, created_ms, updated_ms) VALUES ('old', 'Older times', 1, 1)")
    db.execute("INSERT INTO messages (conversation_id, seq, role, content, created_ms) "
               "VALUES ('old', 0, 'user', 'written before search existed', 1)")
    db.commit()
    db.close()
    store = ConversationStore(path)
    assert ids(search(store, "search existed")) == ["old"]
    assert ids(search(store, "older")) == ["old"]


def test_trash_hides_until_purged_or_restored(store):
    store.trash(["rivers", "code"])
    assert {c.id for c in store.list()} == {"cooking", "japan"}
    assert search(store, "nile") == []
    store.untrash(["rivers"])
    assert ids(search(store, "nile")) == ["rivers"]
    assert store.trashed() == ["code"]
    store.purge(["code"])
    assert store.get("code") is None and store.messages("code") == []
    assert search(store, "increments") == []  # the search index follows deletions


def test_duplicate_as_a_branch(store):
    branch = store.duplicate("rivers", upto_seq=0)
    assert store.require(branch.id).title.endswith("(branch)")
    assert [m.content for m in store.messages(branch.id)] == ["How long is the Nile river?"]
    assert set(ids(search(store, "nile"))) == {"rivers", branch.id}


# export / import ---------------------------------------------------------------------------------------
def test_export_import_round_trips_exactly(store, tmp_path):
    store.set_system_prompt("cooking", "You are a pastry chef.")
    store.set_settings("cooking", {"temperature": 0.3, "seed": 7})
    path = tmp_path / "export.json"
    assert export_json(store, ["rivers", "cooking", "japan"], path) == 3
    fresh = ConversationStore(tmp_path / "fresh.sqlite3")
    assert import_json(fresh, path) == ["rivers", "cooking", "japan"]
    again = to_document(fresh, ["rivers", "cooking", "japan"])
    original = json.loads(path.read_text())
    again.pop("exported_ms")
    original.pop("exported_ms")
    assert again == original
    assert ids(search(fresh, "brulee")) == ["cooking"]  # imported text is searchable


def test_importing_into_a_store_that_has_the_ids_makes_copies(store, tmp_path):
    path = tmp_path / "e.json"
    export_json(store, ["rivers"], path)
    new_ids = import_json(store, path)
    assert new_ids != ["rivers"] and len(store.messages(new_ids[0])) == 2


def test_markdown_export(store, tmp_path):
    store.set_system_prompt("rivers", "Be precise.")
    path = tmp_path / "chat.md"
    export_markdown(store, ["rivers"], path)
    text = path.read_text()
    assert "## You\n\nHow long is the Nile river?" in text and "System prompt:** Be precise." in text


def test_each_replys_model_and_finish_survive_export_and_import(store, tmp_path):
    """Issue 27 item 19: the captions under replies (why one ended, which model wrote it) travel with the chat."""
    store.append("rivers", "user", "And the Amazon?")
    store.append("rivers", "assistant", "About 6,400", "cancelled", "SmolLM2-360M int4")
    store.append("rivers", "user", "Go on")
    store.append("rivers", "assistant", "km, give or take", "length", "qwen2_5-0_5b *q4*")
    path = tmp_path / "export.json"
    export_json(store, ["rivers"], path)
    replies = [m for m in json.loads(path.read_text())["conversations"][0]["messages"] if m["role"] == "assistant"]
    assert [(m["model"], m["finish_reason"]) for m in replies] == [
        ("", None), ("SmolLM2-360M int4", "cancelled"), ("qwen2_5-0_5b *q4*", "length")]
    fresh = ConversationStore(tmp_path / "fresh.sqlite3")
    import_json(fresh, path)
    assert fresh.reply_facts("rivers") == store.reply_facts("rivers")
    assert fresh.continuable_reply("rivers") == 5  # a reply the length limit stopped can be continued after import
    old = json.loads(path.read_text())  # an export from before these fields
    for m in old["conversations"][0]["messages"]:
        m.pop("model", None), m.pop("finish_reason", None)
    (tmp_path / "old.json").write_text(json.dumps(old))
    (copy,) = import_json(fresh, tmp_path / "old.json")
    assert {f.finish for f in fresh.reply_facts(copy).values()} == {None} and fresh.continuable_reply(copy) is None


def test_markdown_says_why_a_reply_ended_and_which_model_wrote_it_only_when_known(store, tmp_path):
    store.append("rivers", "user", "And the Amazon?")
    store.append("rivers", "assistant", "About 6,400", "cancelled", "qwen2_5-0_5b")
    store.append("rivers", "user", "Thanks")
    store.append("rivers", "assistant", "You are welcome.", "eos", "SmolLM2 int4")
    path = tmp_path / "chat.md"
    export_markdown(store, ["rivers"], path)
    text = path.read_text()
    assert "## Hearth\n\nAbout 6,400\n\n_stopped · qwen2\\_5-0\\_5b_\n" in text  # escaped: no stray emphasis
    assert "You are welcome.\n\n_SmolLM2 int4_\n" in text  # it simply ended: only the model
    assert "6,650 km long.\n\n## You" in text  # nothing known of the first reply: no line at all


def _doc(**conv) -> dict:
    base = {"id": "x1", "title": "t", "system_prompt": "", "settings": {}, "model": "", "created_ms": 1,
            "updated_ms": 2, "messages": [{"role": "user", "content": "hi", "created_ms": 1}]}
    return {"format": "hearth.conversations", "version": 1, "conversations": [{**base, **conv}]}


@pytest.mark.parametrize("content,needle", [
    (b"not json at all", "not valid JSON"),
    (b"\xff\xfe\x00garbage", "not UTF-8"),
    (b"[]", "JSON object"),
    (json.dumps({"format": "something else"}).encode(), "not a Hearth export"),
    (json.dumps({"format": "hearth.conversations", "version": 99, "conversations": []}).encode(), "version"),
    (json.dumps({"format": "hearth.conversations", "version": 1, "conversations": {}}).encode(), "must be a list"),
    (json.dumps(_doc(title=5)).encode(), "conversations[0].title: expected str"),
    (json.dumps(_doc(id="bad id!")).encode(), "conversations[0].id"),
    (json.dumps(_doc(messages=[{"role": "robot", "content": "x", "created_ms": 1}])).encode(),
     "conversations[0].messages[0].role: 'robot'"),
    (json.dumps(_doc(messages=[{"role": "user", "created_ms": 1}])).encode(), "messages[0]: missing 'content'"),
    (json.dumps(_doc(created_ms=-5)).encode(), "created_ms: -5"),
    (json.dumps(_doc(created_ms=True)).encode(), "created_ms: expected int"),
    (json.dumps(_doc(settings=[])).encode(), "settings: expected dict"),
    (json.dumps(_doc(messages=[{"role": "assistant", "content": "x", "created_ms": 1, "finish_reason": "bored"}])).encode(),
     "messages[0].finish_reason: 'bored' is not one of"),
    (json.dumps(_doc(messages=[{"role": "assistant", "content": "x", "created_ms": 1, "model": 7}])).encode(),
     "messages[0].model: expected str"),
    (json.dumps(_doc(messages=[{"role": "assistant", "content": "x", "created_ms": 1, "model": "m" * 201}])).encode(),
     "messages[0].model: 201 characters"),
    (json.dumps(_doc(messages=[{"role": "user", "content": "x", "created_ms": 1, "finish_reason": "length"}])).encode(),
     "only a reply (role 'assistant') has a model or finish_reason"),
])
def test_malformed_imports_name_the_problem_and_import_nothing(store, tmp_path, content, needle):
    path = tmp_path / "bad.json"
    path.write_bytes(content)
    before = {c.id for c in store.list()}
    with pytest.raises(TransferError, match=None) as err:
        import_json(store, path)
    assert needle in str(err.value)
    assert {c.id for c in store.list()} == before


def test_a_bad_conversation_late_in_the_file_imports_nothing(store, tmp_path):
    good = _doc()["conversations"][0]
    doc = _doc()
    doc["conversations"] = [dict(good, id=f"ok{i}") for i in range(5)] + [dict(good, id="late", title=None)]
    path = tmp_path / "late.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(TransferError, match=r"conversations\[5\].title"):
        import_json(store, path)
    assert store.get("ok0") is None


def test_duplicate_ids_in_one_file_are_refused(tmp_path, store):
    doc = _doc()
    doc["conversations"] *= 2
    path = tmp_path / "dup.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(TransferError, match="appears twice"):
        import_json(store, path)


def test_a_missing_import_file(store, tmp_path):
    with pytest.raises(TransferError, match="cannot read"):
        import_json(store, tmp_path / "nope.json")


# attachments in exports and imports ------------------------------------------------------------------------------
def _attached(store: ConversationStore) -> tuple:
    from engine.documents import attachment_from_text, compose_message

    docs = (attachment_from_text("plan.md", "# Plan\n```code```\nstep one", "markdown"),
            attachment_from_text("data.csv", "a,b\n1,2", "csv"))
    store.create("att", title="With files")
    store.append("att", "user", compose_message("compare them", docs), attachments=docs, typed_text="compare them")
    store.append("att", "assistant", "they differ")
    return docs


def test_attachments_survive_export_and_import(store, tmp_path):
    docs = _attached(store)
    path = tmp_path / "export.json"
    export_json(store, ["att"], path)
    saved = json.loads(path.read_text())["conversations"][0]["messages"][0]
    assert saved["typed_text"] == "compare them"
    assert [a["name"] for a in saved["attachments"]] == ["plan.md", "data.csv"]
    assert set(saved["attachments"][0]) == {"name", "size", "sha256", "kind", "pages", "text"}
    fresh = ConversationStore(tmp_path / "fresh.sqlite3")
    (cid,) = import_json(fresh, path)
    user = fresh.messages(cid)[0]
    assert (user.attachments, user.typed_text) == (docs, "compare them")
    again, original = to_document(fresh, [cid]), json.loads(path.read_text())
    assert again["conversations"] == original["conversations"]


def test_markdown_has_a_section_per_attachment(store, tmp_path):
    _attached(store)
    path = tmp_path / "out.md"
    export_markdown(store, ["att"], path)
    text = path.read_text()
    assert "### Attached: plan.md" in text and "### Attached: data.csv" in text
    assert "````text\n# Plan\n```code```\nstep one\n````" in text  # a fence the file's own ``` cannot close
    assert "[File:" not in text  # the composed form is for the model; the export is for people
    assert text.index("### Attached: data.csv") < text.index("compare them")


def _attachment_doc(**change) -> dict:
    import hashlib

    text = "hello"
    attachment = {"name": "a.txt", "size": 5, "sha256": hashlib.sha256(b"hello").hexdigest(), "kind": "text",
                  "pages": None, "text": text}
    message = {"role": "user", "content": "[File: a.txt]\nhello\n[End of file: a.txt]\n\nq", "created_ms": 1,
               "typed_text": "q", "attachments": [attachment]}
    for key, value in change.items():
        (attachment if key in attachment else message)[key] = value
    return _doc(messages=[message])


def test_a_good_attachment_document_imports(store, tmp_path):
    path = tmp_path / "ok.json"
    path.write_text(json.dumps(_attachment_doc()))
    (cid,) = import_json(store, path)
    assert store.messages(cid)[0].attachments[0].text == "hello"


@pytest.mark.parametrize("change,needle", [
    ({"content": "[File: a.txt]\nforged\n[End of file: a.txt]\n\nq"}, "content: is not the attached files' text"),
    ({"typed_text": 5}, "typed_text: expected str"),
    ({"attachments": "a.txt"}, "attachments: expected list"),
    ({"name": "../etc/passwd"}, "is not a file name"),
    ({"name": "a\nb"}, "is not a file name"),
    ({"size": -1}, "size: -1"),
    ({"sha256": "XYZ"}, "sha256: expected 64"),
    ({"kind": "exe"}, "kind: 'exe'"),
    ({"pages": -2}, "pages: expected null"),
    ({"text": 7}, "text: expected str"),
    ({"role": "assistant"}, "only a user message has attachments"),
])
def test_malformed_attachments_are_refused_and_nothing_imports(store, tmp_path, change, needle):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(_attachment_doc(**change)))
    with pytest.raises(TransferError) as err:
        import_json(store, path)
    assert needle in str(err.value)
    assert store.get("x1") is None


def test_too_many_or_too_long_attachments_are_refused(store, tmp_path):
    from engine import documents

    doc = _attachment_doc()
    message = doc["conversations"][0]["messages"][0]
    message["attachments"] = message["attachments"] * (documents.MAX_ATTACHMENTS + 1)
    path = tmp_path / "many.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(TransferError, match=f"at most {documents.MAX_ATTACHMENTS}"):
        import_json(store, path)
    path.write_text(json.dumps(_attachment_doc(text="h" * (documents.MAX_TEXT_CHARS + 1))))
    with pytest.raises(TransferError, match=f"{documents.MAX_TEXT_CHARS + 1:,} characters; a file may hold at most"):
        import_json(store, path)
    assert store.get("x1") is None
