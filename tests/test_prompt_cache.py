"""The server's prompt cache (Hearth.serve): stateless requests resumed from the live KV or from append-only
"api" checkpoints that survive restarts, verified, with typed reasons when a file is bad — on real ONNX
Runtime, real checkpoint files and real SQLite (the tiny model for speed, SmolLM2 where realism matters)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from engine.api import Hearth, resolve_paths
from engine.checkpoint.chain import open_saved
from engine.checkpoint.format import Reason
from engine.checkpoint.reader import CheckpointReader
from engine.errors import ConversationError, PromptError
from engine.session.prompt_cache import SAVE_BLOCK, PromptCache, chat_first_block, thread_key
from engine.types import CancelToken, ResumeSource, SamplingParams, ServeRequest, TurnRequest

from .checkpoint_names import as_checkpoint_file, reseal_chain
from .test_cli import run_cli

GREEDY = SamplingParams.greedy_params()
LONG_SYSTEM = "Rule one: be brief. Rule two: be kind."  # long for the tiny model's 256-token context
TINY_BLOCK, TINY_TAIL, TINY_EVERY = 32, 4, 48  # the save policy scaled to that context
OTHER_ARCH = "qwen2"  # a synthetic model of another architecture: its checkpoints are foreign here


def open_hearth(home: Path, model: Path, weights: str = "int4") -> Hearth:
    service = Hearth(resolve_paths(home).ensure(), model=str(model), weights=weights, provider="cpu")
    service.load()
    service._sessions.adaptive = False  # the tiny model re-reads faster than it restores: always restore
    return service


def share_conversion(home: Path, tiny_dir: Path) -> Path:
    home.mkdir()
    (home / "converted").symlink_to(tiny_dir / "converted")
    return home


@pytest.fixture(autouse=True)
def tiny_save_policy(monkeypatch):
    monkeypatch.setattr(PromptCache, "save_block", TINY_BLOCK)
    monkeypatch.setattr(PromptCache, "save_tail", TINY_TAIL)
    monkeypatch.setattr(PromptCache, "save_every", TINY_EVERY)


@pytest.fixture
def tiny(tiny_home, tiny_gguf):
    service = open_hearth(tiny_home, tiny_gguf)
    yield service
    service.close()


def ask(hearth: Hearth, messages: list[dict], max_tokens: int = 8, **extra):
    return hearth.serve(ServeRequest(messages=tuple(messages), params=GREEDY, max_tokens=max_tokens, **extra))


def grow(messages: list[dict], reply: str, question: str) -> list[dict]:
    return [*messages, {"role": "assistant", "content": reply}, {"role": "user", "content": question}]


def api_files(hearth: Hearth) -> dict[str, Path]:
    root = hearth.checkpoints.root
    return {e.name: root / e.name for e in hearth.checkpoints.entries(kind="api")}


def records(path: Path) -> list[tuple[int, int, bytes]]:
    with open_saved(path) as reader:  # a chain file (the block store) or a checkpoint file
        reader.read_header()
        found, problem = reader.scan()
    assert problem is None
    return [(r.start, r.end, r.text_sha) for r in found]


def thread(system: str, first: str) -> list[dict]:
    return [{"role": "system", "content": system}, {"role": "user", "content": first}]


# the persistence story ----------------------------------------------------------------------------------
def test_a_long_agent_conversation_resumes_from_disk_after_a_restart_and_replies_as_a_cold_start(
        real_model_home, tmp_path):
    system = " ".join(f"Tool {i}: lookup_{i}(query) returns the record {i} of the catalogue, or null." for i in range(85))
    first = Hearth(resolve_paths(real_model_home).ensure(), weights="int4", provider="cpu")
    first.load()
    first._sessions.adaptive = False
    messages = thread(system, "Which tool reads record 3?")
    previous_prompt = 0
    try:
        for turn in range(5):
            result = ask(first, messages, max_tokens=12)
            assert result.prompt_tokens > 1400 and result.finish_reason in ("stop", "length")
            if not turn:  # the long first prompt is saved at once, at a block boundary before its tail
                [path] = api_files(first).values()
                assert (result.prompt_tokens - 8) // SAVE_BLOCK * SAVE_BLOCK in [e for _, e, _ in records(path)]
            if turn:
                assert result.cache.source == ResumeSource.LIVE
                assert result.cache.cached_tokens >= previous_prompt and result.cache.prefilled_tokens < 60
            previous_prompt = result.prompt_tokens
            messages = grow(messages, result.text, f"And which one reads record {turn + 10}?")
    finally:
        first.close()
    again = Hearth(first.paths, weights="int4", provider="cpu")
    again.load()
    again._sessions.adaptive = False
    try:
        resumed = ask(again, messages, max_tokens=12)
    finally:
        again.close()
    assert resumed.cache.source == ResumeSource.DISK and resumed.cache.reason is None
    assert resumed.cache.cached_tokens >= previous_prompt and resumed.cache.restored_tokens == resumed.cache.reused_tokens
    cold_home = tmp_path / "cold"
    cold_home.mkdir()
    for sub in ("models", "converted"):
        (cold_home / sub).symlink_to(real_model_home / sub)
    cold = Hearth(resolve_paths(cold_home).ensure(), weights="int4", provider="cpu")
    cold.load()
    try:
        fresh = ask(cold, messages, max_tokens=12)
    finally:
        cold.close()
    assert fresh.cache.source == ResumeSource.COLD and fresh.cache.cached_tokens == 0
    assert fresh.prompt_tokens == resumed.prompt_tokens and fresh.text == resumed.text and fresh.tokens == resumed.tokens


# within one process -------------------------------------------------------------------------------------
def test_the_next_request_reuses_the_live_kv_and_after_a_chat_turn_restores_from_disk(tiny):
    messages = thread(LONG_SYSTEM, "hello")
    one = ask(tiny, messages)
    assert one.cache.source == ResumeSource.COLD and one.prompt_tokens > TINY_BLOCK
    messages = grow(messages, one.text, "and then?")
    two = ask(tiny, messages)
    assert two.cache.source == ResumeSource.LIVE and two.cache.cached_tokens >= one.prompt_tokens
    assert two.cache.prefilled_tokens == two.prompt_tokens - two.cache.reused_tokens
    tiny.run_turn(TurnRequest("chat", "something else", GREEDY, 6), create=True)  # the live KV goes to a chat
    messages = grow(messages, two.text, "one more")
    three = ask(tiny, messages)
    assert three.cache.source == ResumeSource.DISK and three.cache.restored_tokens >= two.prompt_tokens
    assert three.cache.prefilled_tokens < three.prompt_tokens - two.prompt_tokens + 8
    chat = tiny.run_turn(TurnRequest("chat", "and again", GREEDY, 6))  # the API KV was saved before the chat's
    assert chat.local.resume.source == ResumeSource.DISK


def test_two_conversations_interleaved_each_resume_their_own_context_and_files_only_grow(tiny):
    a = thread(LONG_SYSTEM, "first thread")
    b = thread("Another assistant, and a different one.", "second thread")
    sizes: dict[str, list[int]] = {}
    seen: dict[str, list] = {}
    prompts = {"a": 0, "b": 0}
    for round_ in range(3):
        for name in ("a", "b"):
            messages = a if name == "a" else b
            result = ask(tiny, messages)
            if round_:
                assert result.cache.source == ResumeSource.DISK, (name, round_)
                assert result.cache.cached_tokens >= prompts[name]
            prompts[name] = result.prompt_tokens
            grown = grow(messages, result.text, f"round {round_} of {name}")
            a, b = (grown, b) if name == "a" else (a, grown)
            for file, path in api_files(tiny).items():
                now = records(path)
                if file in seen:  # appended to, never rewritten: the old records lead the new list
                    assert now[: len(seen[file])] == seen[file] and path.stat().st_size >= sizes[file][-1]
                seen[file] = now
                sizes.setdefault(file, []).append(path.stat().st_size)
    assert len(api_files(tiny)) == 2


def test_a_request_diverging_from_a_thread_starts_a_new_branch_and_leaves_the_old_file_alone(tiny):
    messages = thread(LONG_SYSTEM, "hello")
    one = ask(tiny, messages)
    base = grow(messages, one.text, "the first way")
    ask(tiny, base)
    tiny.run_turn(TurnRequest("chat", "elsewhere", GREEDY, 4), create=True)  # saves the thread
    [(name, path)] = api_files(tiny).items()
    before, size = records(path), path.stat().st_size
    other = ask(tiny, grow(messages, one.text, "another way entirely"))
    assert other.cache.source == ResumeSource.DISK and other.cache.cached_tokens >= one.prompt_tokens
    tiny.run_turn(TurnRequest("chat", "elsewhere again", GREEDY, 4))
    files = api_files(tiny)
    assert len(files) == 2 and records(files[name]) == before and files[name].stat().st_size == size


def test_a_retry_from_the_live_kv_keeps_the_first_answer_in_its_own_file(tiny):
    messages = thread(LONG_SYSTEM, "hello")
    one = ask(tiny, messages)
    first_way = ask(tiny, grow(messages, one.text, "the first way"))  # unsaved rows in the live KV
    retry = ask(tiny, grow(messages, one.text, "a retry, worded otherwise"))
    assert retry.cache.source == ResumeSource.LIVE and retry.cache.cached_tokens >= one.prompt_tokens
    files = api_files(tiny)
    assert len(files) == 2  # the first way was saved to its branch before the retry took the live KV
    tiny.close()
    resumed = open_hearth(tiny.paths.data, Path(tiny.model_path))
    try:
        again = ask(resumed, grow(grow(messages, one.text, "the first way"), first_way.text, "next"))
    finally:
        resumed.close()
    assert again.cache.source == ResumeSource.DISK and again.cache.cached_tokens >= first_way.prompt_tokens


def test_a_raw_prompt_is_cached_too(tiny):
    prompt = "Once upon a time " * 8  # longer than the bytes a raw thread is keyed by
    one = tiny.serve(ServeRequest(prompt=prompt, params=GREEDY, max_tokens=6))
    assert one.cache.source == ResumeSource.COLD
    two = tiny.serve(ServeRequest(prompt=prompt + one.text + " and then", params=GREEDY, max_tokens=6))
    assert two.cache.source == ResumeSource.LIVE and two.cache.cached_tokens >= one.prompt_tokens - 1
    tiny.close()
    assert [e.kind for e in tiny.checkpoints.entries(kind="api")] == ["api"]


# damaged and foreign checkpoints -------------------------------------------------------------------------
def saved_thread(home: Path, model: Path, weights: str = "int4") -> tuple[list[dict], Path]:
    """One request served and the Hearth closed: the thread's file and the next request's messages."""
    service = open_hearth(home, model, weights)
    try:
        messages = thread(LONG_SYSTEM, "hello")
        result = ask(service, messages)
    finally:
        service.close()
    [path] = api_files(service).values()
    return grow(messages, result.text, "go on"), path


def cold_reply(tmp_path: Path, tiny_dir: Path, model: Path, messages: list[dict]):
    service = open_hearth(share_conversion(tmp_path / "clean", tiny_dir), model)
    try:
        return ask(service, messages)
    finally:
        service.close()


def flip_byte(path: Path, offset_from_end: int) -> None:
    data = bytearray(path.read_bytes())
    data[-offset_from_end] ^= 0x40
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("damage, reasons", [
    (lambda p: flip_byte(p, 10), {Reason.CHECKSUM}),
    (lambda p: os.truncate(p, p.stat().st_size - 100), {Reason.TRUNCATED, Reason.CHECKSUM}),
])
def test_a_damaged_api_checkpoint_is_rebuilt_with_its_reason_and_the_reply_is_unchanged(
        tiny_home, tiny_gguf, tiny_dir, tmp_path, damage, reasons):
    messages, path = saved_thread(tiny_home, tiny_gguf)
    damage(path)
    service = open_hearth(tiny_home, tiny_gguf)
    try:
        result = ask(service, messages)
        assert result.cache.source == ResumeSource.REBUILT and result.cache.reason in reasons
        again = ask(service, grow(messages, result.text, "more"))
    finally:
        service.close()
    assert again.cache.source == ResumeSource.LIVE
    assert records(path)  # cut back to its good records and appended to again, never left damaged
    assert result.text == cold_reply(tmp_path, tiny_dir, tiny_gguf, messages).text


def test_a_checkpoint_from_another_model_is_rebuilt_and_replaced(tiny_home, tiny_gguf, tiny_dir, tmp_path, arch_gguf):
    messages, foreign = saved_thread(tiny_home, arch_gguf(OTHER_ARCH))
    service = open_hearth(tiny_home, tiny_gguf)
    try:  # put it where this model's file of the thread would be
        key = thread_key(chat_first_block(service._engine.template, messages))
        ours = foreign.with_name(f"api-{key}-000-{service._sessions.identity.model_fp[:8].hex()}{foreign.suffix}")
        foreign.rename(ours)
        service.checkpoints.reconcile()
        result = ask(service, messages)
    finally:
        service.close()
    assert result.cache.source == ResumeSource.REBUILT and result.cache.reason == Reason.MODEL_MISMATCH
    assert result.text == cold_reply(tmp_path, tiny_dir, tiny_gguf, messages).text
    with open_saved(ours) as reader:  # rebuilt: the record is this model's own now
        assert reader.read_header().model_fp == service._sessions.identity.model_fp


# the save policy ------------------------------------------------------------------------------------------
def test_a_long_first_prompt_is_saved_at_a_block_boundary_and_listed_as_api(tiny, tiny_home):
    result = ask(tiny, thread(LONG_SYSTEM, "hello"))
    [path] = api_files(tiny).values()  # saved at the end of the request, before any shutdown
    ends = [end for _, end, _ in records(path)]
    aligned = (result.prompt_tokens - TINY_TAIL) // TINY_BLOCK * TINY_BLOCK
    assert aligned >= TINY_BLOCK and aligned in ends and result.prompt_tokens in ends
    listing = json.loads(run_cli("kv", "ls", "--json", home=tiny_home).stdout)
    assert [e["kind"] for e in listing["entries"] if e["name"] == path.name] == ["api"]


def test_close_saves_the_live_api_kv(tiny, monkeypatch):
    monkeypatch.setattr(PromptCache, "save_block", 200)  # a first prompt this long is saved at once
    short = thread("Hi.", "hi")  # shorter: it stays live until the KV is replaced or Hearth closes
    result = ask(tiny, short)
    assert api_files(tiny) == {}
    tiny.close()
    [path] = api_files(tiny).values()
    assert records(path)[-1][1] >= result.prompt_tokens


# binding to a stored conversation --------------------------------------------------------------------------
def test_a_bound_request_stores_its_messages_and_continues_the_conversation(tiny):
    messages = thread("Be brief.", "hello")
    one = ask(tiny, messages, conversation="bound")
    stored = tiny.conversations.messages("bound")
    assert [(m.role, m.content) for m in stored] == [("user", "hello"), ("assistant", one.text)]
    assert tiny.conversations.get("bound").system_prompt == "Be brief."
    messages = grow(messages, one.text, "and more")
    two = ask(tiny, messages, conversation="bound")
    assert two.cache.source == ResumeSource.LIVE and two.cache.cached_tokens >= one.prompt_tokens
    assert [m.content for m in tiny.conversations.messages("bound")] == ["hello", one.text, "and more", two.text]
    turn = tiny.run_turn(TurnRequest("bound", "from the window", GREEDY, 4))  # the same chat, in the window
    assert turn.local.resume.source == ResumeSource.LIVE and len(tiny.conversations.messages("bound")) == 6


def test_a_bound_request_whose_history_differs_is_refused_and_stores_nothing(tiny):
    one = ask(tiny, thread("Be brief.", "hello"), conversation="bound")
    edited = grow(thread("Be brief.", "HELLO"), one.text, "next")
    with pytest.raises(PromptError, match="this request's message 2 differs"):  # the system prompt is message 1
        ask(tiny, edited, conversation="bound")
    with pytest.raises(PromptError, match="another system prompt"):
        ask(tiny, grow(thread("Be long.", "hello"), one.text, "next"), conversation="bound")
    assert [m.content for m in tiny.conversations.messages("bound")] == ["hello", one.text]


def cut_off(hearth: Hearth, messages: list[dict], conversation: str, after: int):
    """A bound request whose client goes away after ``after`` pieces of text (the server cancels it)."""
    cancel, pieces = CancelToken(), []

    def on_text(piece: str) -> None:
        pieces.append(piece)
        if len(pieces) >= after:
            cancel.cancel()

    request = ServeRequest(messages=tuple(messages), params=GREEDY, max_tokens=40, conversation=conversation)
    return hearth.serve(request, on_text, cancel)


def test_a_bound_reply_cut_off_is_written_again_by_the_same_request_and_kept_as_a_version(tiny):
    """Issue 27: a client that gave up on a bound request got 400 "message 2 differs" on its retry."""
    messages = [{"role": "user", "content": "hello"}]
    partial = cut_off(tiny, messages, "dc1", after=3)
    assert partial.finish_reason == "cancelled" and partial.text
    assert tiny.conversations.reply_facts("dc1")[1].finish == "cancelled"
    convs = tiny.conversations
    # a retry cut off before any text stores nothing: the cut reply it was to replace is shown again
    gone = CancelToken()
    gone.cancel()
    again = tiny.serve(ServeRequest(messages=tuple(messages), params=GREEDY, max_tokens=8, conversation="dc1"),
                       None, gone)
    assert again.text == "" and [m.content for m in convs.messages("dc1")] == ["hello", partial.text]
    assert convs.reply_versions("dc1", 1).texts == (partial.text,)
    retry = ask(tiny, messages, max_tokens=40, conversation="dc1")
    assert retry.finish_reason != "cancelled" and len(retry.text) > len(partial.text)
    assert [(m.role, m.content) for m in convs.messages("dc1")] == [("user", "hello"), ("assistant", retry.text)]
    versions = convs.reply_versions("dc1", 1)
    assert versions.texts == (partial.text, retry.text) and versions.chosen == 1
    assert convs.reply_facts("dc1")[1].finish != "cancelled"


def test_a_bound_request_lacking_a_finished_reply_is_refused_naming_its_own_message_count(tiny):
    messages = [{"role": "user", "content": "hello"}]
    one = ask(tiny, messages, conversation="done")
    assert one.finish_reason != "cancelled"
    with pytest.raises(PromptError, match="holds 2 message.s. and this request only 1: it lacks the stored "
                                          "assistant message 2"):
        ask(tiny, messages, conversation="done")  # a reply the client had in full is no retry
    assert [m.content for m in tiny.conversations.messages("done")] == ["hello", one.text]


@pytest.mark.parametrize("messages, extra, needle", [
    (thread("Be brief.", "word " * 9000), {}, "context window"),  # issue 27: it was stored, then refused
    (thread("Be brief.", "hi \ud800"), {}, "lone surrogate"),
    (thread("Be brief.", "hi"), {"params": SamplingParams(seed=-1)}, "seed"),
    (thread("Be brief.", "hi"), {"params": GREEDY, "stop": ("x",) * 17}, "stop strings"),
])
def test_a_bound_request_refused_for_its_content_or_options_stores_nothing(tiny, messages, extra, needle):
    request = ServeRequest(messages=tuple(messages), max_tokens=4, conversation="refused", **{"params": GREEDY, **extra})
    with pytest.raises(PromptError, match=needle):
        tiny.serve(request)
    assert tiny.conversations.get("refused") is None


# bad requests ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("request_, error, needle", [
    (ServeRequest(), PromptError, "either messages"),
    (ServeRequest(messages=({"role": "user", "content": "x"},), prompt="x"), PromptError, "either messages"),
    (ServeRequest(prompt=""), PromptError, "prompt is empty"),
    (ServeRequest(messages=({"role": "user", "content": "x"},), max_tokens=0), PromptError, "max_tokens"),
    (ServeRequest(messages=({"role": "robot", "content": "x"},)), PromptError, "role"),
    (ServeRequest(messages=({"role": "user", "content": "x"},), conversation="/bad"), ConversationError, "invalid"),
    (ServeRequest(prompt="x", conversation="ok"), PromptError, "only to a chat request"),
    (ServeRequest(messages=({"role": "user", "content": "x"}, {"role": "system", "content": "late"}),
                  conversation="ok"), PromptError, "one system prompt"),
])
def test_bad_requests_get_a_specific_error(tiny, request_, error, needle):
    with pytest.raises(error, match=needle):
        tiny.serve(request_)
    assert api_files(tiny) == {}


def test_decoding_options_reach_the_engine_and_bad_ones_are_refused(tiny):
    import json

    from engine.serving import generation_options
    from engine.types import ResponseFormat, ResponseFormatKind

    assert generation_options(ServeRequest(prompt="x")) == {}  # nothing set: nothing passed
    schema = {"type": "object", "properties": {"n": {"type": "integer", "multipleOf": 7, "maximum": 70}},
              "required": ["n"], "additionalProperties": False}
    shaped = tiny.serve(ServeRequest(messages=({"role": "user", "content": "a number"},), max_tokens=40,
                                     params=SamplingParams.greedy_params(),
                                     response_format=ResponseFormat(ResponseFormatKind.JSON_SCHEMA, schema)))
    assert json.loads(shaped.text)["n"] % 7 == 0 and shaped.finish_reason == "stop"
    free = tiny.serve(ServeRequest(messages=({"role": "user", "content": "a number"},), max_tokens=12,
                                   params=SamplingParams.greedy_params()))
    cut = free.text[len(free.text) // 2:][:2]
    stopped = tiny.serve(ServeRequest(messages=({"role": "user", "content": "a number"},), max_tokens=12,
                                      params=SamplingParams.greedy_params(), stop=(cut,)))
    assert cut and stopped.finish_reason == "stop" and cut not in stopped.text and free.text.startswith(stopped.text)
    with pytest.raises(PromptError, match="presence"):
        tiny.serve(ServeRequest(prompt="x", presence_penalty=5.0))


def test_a_request_before_the_model_is_loaded_says_so(tiny_home, tiny_gguf):
    from engine.errors import ModelNotLoadedError

    service = Hearth(resolve_paths(tiny_home).ensure(), model=str(tiny_gguf), provider="cpu")
    try:
        with pytest.raises(ModelNotLoadedError, match="not loaded"):
            ask(service, thread("Be brief.", "hello"))
    finally:
        service.close()


def reseal_every_record(path: Path, poison) -> None:
    """``path``'s own rows changed by ``poison`` (in place), its records and frontiers kept, every checksum
    recomputed."""
    from engine.checkpoint.format import Identity
    from engine.checkpoint.writer import NewRecord, write_new
    from tests.test_sessions import saved_rows

    rows = saved_rows(path)
    with CheckpointReader(path) as reader:
        h = reader.read_header()
        found, _ = reader.scan()
        tokens = [t for r in found for t in reader.read_tokens(r, 1 << 31)]
    poison(rows)
    pieces = [NewRecord(r.start, tokens[r.start:r.end], [np.ascontiguousarray(rows[layer, k, r.start:r.end])
                                                          for layer in range(rows.shape[0]) for k in range(rows.shape[1])],
                        r.text_len, r.text_sha, "turn") for r in found]
    os.unlink(path)
    write_new(path, Identity(h.model_fp, h.tokenizer_fp, h.shape, h.label), pieces)


def test_a_new_branch_seeded_from_a_branch_whose_rows_give_nan_deletes_that_branch(tiny_home, tiny_gguf, tmp_path):
    """Issue 27, item 9: a request that diverges from a thread starts a new branch from the other branch's
    saved rows. When those rows (resealed at float32's maximum: they verify) give NaN, the reply is rebuilt
    from the prompt and the branch it was seeded from is deleted too, not only the new branch's own file."""
    from tests.test_sessions import huge_rows, saved_rows

    messages, path = saved_thread(tiny_home, tiny_gguf)
    service = open_hearth(tiny_home, tiny_gguf)
    try:
        ask(service, messages)  # the thread's second request: its file gets a second frontier
    finally:
        service.close()
    frontiers = records(path)
    if path.suffix == ".hkc":  # the block store: every block the branch reads, resealed
        reseal_chain(path.parent, path, lambda rows: rows.__setitem__((slice(None), 0), np.finfo(rows.dtype).max))
    else:
        reseal_every_record(path, huge_rows)
    assert records(path) == frontiers
    diverging = [*messages[:3], {"role": "user", "content": "something else entirely"}]
    service = open_hearth(tiny_home, tiny_gguf)
    try:
        result = ask(service, diverging)
        assert result.text and result.cache.source == ResumeSource.REBUILT and result.cache.reason == "non_finite"
        assert result.cache.cached_tokens == 0 and not path.exists() and path.name not in api_files(service)
    finally:
        service.close()
    files = api_files(service)
    assert files and all(np.abs(saved_rows(as_checkpoint_file(p))).max() < 1e6 for p in files.values())
