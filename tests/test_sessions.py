"""Sessions over checkpoints: exact round trips, suffix-only prefill on edit and regenerate, switching,
shared prefixes, aligned saves during a long prefill, adaptive resume, append-only saves. The restore
tests run on each storage tier (``tiers``: the file store and the in-memory one, tests/tier_helpers.py)."""

from __future__ import annotations

import numpy as np
import pytest

from engine.checkpoint.format import Reason
from engine.checkpoint.reader import CheckpointReader
from engine.checkpoint.store import CheckpointStore, conversation_file
from engine.generation import CancelToken, Engine
from engine.sampling import SamplingParams
from engine.session import COLD, DISK, LIVE, REBUILT, ChatSessions
from tests.arch_models import ARCH_SPECS
from tests.tier_helpers import TIER_KINDS, Tiers

GREEDY = SamplingParams.greedy_params()
SEEDED = SamplingParams(temperature=0.9, top_k=40, top_p=0.95, seed=1234)
SYSTEM = {"role": "system", "content": "You are a careful assistant. Answer briefly and precisely."}


def chat(*turns: str) -> list[dict]:
    """System prompt, then alternating user/assistant messages."""
    roles = ("user", "assistant")
    return [SYSTEM] + [{"role": roles[i % 2], "content": t} for i, t in enumerate(turns)]


@pytest.fixture(params=TIER_KINDS)
def tiers(request) -> Tiers:
    """The kind of storage tier a restore test runs on."""
    return Tiers(request.param)


def new_sessions(converted, root, adaptive: bool = False, tiers: Tiers | None = None, **kw) -> ChatSessions:
    """Sessions that always restore (the tiny model prefills faster than a file opens); the adaptive
    choice has its own test. ``tiers``: the kind of store at ``root`` (None: the file store)."""
    store = tiers.open(root) if tiers is not None else CheckpointStore(root)
    return ChatSessions(Engine.load(converted, "cpu"), store, adaptive=adaptive, **kw)


@pytest.mark.parametrize("precision", ["int4", "fp32"])
@pytest.mark.parametrize("params", [GREEDY, SEEDED], ids=["greedy", "seeded"])
def test_round_trip_continuation_is_bit_identical(tiny_converted, tmp_path, tiers, precision, params):
    converted = tiny_converted(precision)
    first = chat("hello there", "hi! how can I help?", "tell me about rivers")
    live = new_sessions(converted, tmp_path / "live", tiers=tiers)
    live.generate("c", first, params, 12)
    # The same state, saved by the first process and restored by a second one.
    restored = new_sessions(converted, tmp_path / "live", tiers=tiers)
    second = first + [{"role": "assistant", "content": "rivers flow"}, {"role": "user", "content": "and lakes?"}]
    logits_live, prompt_live, r_live = live.sync("c", second)
    logits_disk, prompt_disk, r_disk = restored.sync("c", second)
    assert r_live.source == LIVE and r_disk.source == DISK and r_disk.reason is None
    assert prompt_live == prompt_disk
    assert r_live.reused_tokens == r_disk.reused_tokens > 0
    np.testing.assert_array_equal(logits_live, logits_disk)  # bit for bit
    a = live.engine.generate(prompt_live, params, 24, ready_logits=logits_live)
    b = restored.engine.generate(prompt_disk, params, 24, ready_logits=logits_disk)
    assert a.tokens == b.tokens and len(a.tokens) > 0


# Whose saved context each architecture's model is shown: another architecture's (qwen3's KV rows are wider).
FOREIGN = {"llama-rope-freqs": "qwen3", "qwen2": "llama-rope-freqs", "qwen3": "qwen2", "gemma3": "qwen3",
           "llama-q4km": "llama-rope-freqs", "phi3": "qwen2"}


@pytest.mark.parametrize("name", list(ARCH_SPECS))
def test_each_architecture_resumes_its_own_saved_context_and_rejects_another_models(arch_converted, tmp_path, name):
    first = chat("hello there", "hi! how can I help?", "tell me about rivers")
    second = first + [{"role": "assistant", "content": "rivers flow"}, {"role": "user", "content": "and lakes?"}]
    converted = arch_converted(name)
    live = new_sessions(converted, tmp_path / "own")
    live.generate("c", first, GREEDY, 8)
    logits_live, _, r_live = live.sync("c", second)
    logits_disk, _, r_disk = new_sessions(converted, tmp_path / "own").sync("c", second)
    assert r_live.source == LIVE and r_disk.source == DISK and r_disk.restored_tokens > 0
    np.testing.assert_array_equal(logits_live, logits_disk)  # bit for bit
    foreign = new_sessions(arch_converted(FOREIGN[name]), tmp_path / "foreign")
    foreign.generate("c", first, GREEDY, 8)
    theirs = foreign.store.path(conversation_file("c", foreign.identity.model_fp))
    # Another model's context of the same chat is kept beside this model's, never read for it.
    logits_cold, _, r_other = new_sessions(converted, tmp_path / "foreign").sync("c", second)
    assert r_other.source == COLD and r_other.reason is None and theirs.exists()
    np.testing.assert_allclose(logits_cold, logits_live, atol=1e-4, rtol=1e-4)  # its own answer, from scratch
    # A file named for this model that holds another model's context is damage: reported, replaced.
    mine = tmp_path / "foreign" / conversation_file("c", live.identity.model_fp)
    mine.write_bytes(theirs.read_bytes())
    logits_rebuilt, _, r_foreign = new_sessions(converted, tmp_path / "foreign").sync("c", second)
    assert r_foreign.source == REBUILT and r_foreign.reason == Reason.MODEL_MISMATCH
    np.testing.assert_allclose(logits_rebuilt, logits_live, atol=1e-4, rtol=1e-4)
    assert theirs.exists()  # the other model's own file is left alone


def test_restart_resumes_from_disk_with_no_prefill_of_the_old_prefix(tiny_converted, tmp_path, tiers):
    converted = tiny_converted("int4")
    msgs = chat("first question")
    s = new_sessions(converted, tmp_path, tiers=tiers)
    _, prompt, report = s.sync("c", msgs)
    assert report.source == COLD and report.prefilled_tokens == len(prompt)
    shutdown = s.close()  # nothing was saved yet: shutdown saves it
    assert shutdown.ok and shutdown.reason == "shutdown" and shutdown.tokens == len(prompt)
    again = new_sessions(converted, tmp_path, tiers=tiers)
    _, prompt2, report2 = again.sync("c", msgs + [{"role": "assistant", "content": "an answer"},
                                                 {"role": "user", "content": "second"}])
    assert report2.source == DISK and report2.restored_tokens == len(prompt)
    assert report2.prefilled_tokens == len(prompt2) - len(prompt)
    with again.store.open(again.store.record_name("c", again.identity.model_fp)) as r:
        header = r.read_header()
    assert header.hits == 1 and header.last_used_ms >= header.created_ms  # the usage slot counts restores
    assert again.store.conversation_entry("c", again.identity.model_fp).hits == 1


def test_editing_an_earlier_message_prefills_only_the_suffix(tiny_converted, tmp_path, tiers):
    s = new_sessions(tiny_converted("int4"), tmp_path, tiers=tiers)
    original = chat("alpha question", "alpha answer", "beta question", "beta answer", "gamma question")
    _, before, _ = s.sync("c", original)
    edited = chat("alpha question", "alpha answer", "delta question")
    _, after, report = s.sync("c", edited)
    canonical = s.engine.tokenizer.encode(s.engine.render(edited))
    common = next(i for i, (x, y) in enumerate(zip(before, canonical, strict=False)) if x != y)
    assert after == canonical  # the cut fell on a token boundary: same ids as a cold tokenization
    assert report.source == LIVE
    assert report.reused_tokens == common
    assert report.prefilled_tokens == len(after) - common


def test_regenerating_the_last_reply_runs_one_token(tiny_converted, tmp_path):
    s = new_sessions(tiny_converted("int4"), tmp_path)
    msgs = chat("write a poem")
    first = s.generate("c", msgs, SEEDED, 16)
    again = s.generate("c", msgs, SEEDED, 16)
    assert again.resume.source == LIVE
    assert again.resume.prefilled_tokens == 1  # the prompt's last token, for fresh logits
    assert again.resume.reused_tokens == first.prompt_tokens - 1
    assert again.generation.tokens == first.generation.tokens  # same seed, same state


def test_turn_saves_write_only_the_new_rows(tiny_converted, tmp_path, tiers):
    s = new_sessions(tiny_converted("int4"), tmp_path, tiers=tiers)
    msgs = chat("one")
    t1 = s.generate("c", msgs, GREEDY, 8)
    msgs += [{"role": "assistant", "content": "ok"}, {"role": "user", "content": "two"}]
    t2 = s.generate("c", msgs, GREEDY, 8)
    per_token = s.identity.shape.bytes_per_token + 4
    assert t1.save.ok and t2.save.ok
    assert t2.save.new_tokens == t2.save.tokens - t2.resume.reused_tokens - (t2.save.tokens - len(s.engine.tokens))
    assert t2.save.bytes_written < per_token * t2.save.new_tokens + 3 * 128  # record headers only on top
    assert t2.save.bytes_written < t2.save.tokens * per_token  # not a rewrite of the whole context
    with s.store.open(s.store.record_name("c", s.identity.model_fp)) as r:
        r.read_header()
        records, problem = r.scan()
    assert problem is None and records[-1].end == t2.save.tokens
    assert [x.reason for x in records] == ["turn"] * len(records) and len(records) >= 3


def test_switching_saves_the_conversation_left_and_restores_it(tiny_converted, tmp_path, tiers):
    s = new_sessions(tiny_converted("int4"), tmp_path, tiers=tiers)
    a, b = chat("chat A"), chat("chat B is different")
    _, prompt_a, _ = s.sync("a", a)
    s.sync("b", b)  # switching away saves "a"
    assert s.store.conversation_entry("a", s.identity.model_fp).tokens == len(prompt_a)
    _, _, back = s.sync("a", a)
    assert back.source == DISK and back.restored_tokens == len(prompt_a) and back.prefilled_tokens == 1


def test_a_new_conversation_reuses_the_saved_system_prompt(tiny_converted, tmp_path, tiers):
    s = new_sessions(tiny_converted("int4"), tmp_path, tiers=tiers)
    s.sync("a", chat("first conversation"))
    prefixes = s.store.entries(kind="prefix")
    assert len(prefixes) == 1
    fresh = new_sessions(tiny_converted("int4"), tmp_path, tiers=tiers)
    _, prompt, report = fresh.sync("b", chat("a second, unrelated conversation"))
    assert report.source == DISK and report.restored_tokens == prefixes[0].tokens
    assert report.prefilled_tokens == len(prompt) - prefixes[0].tokens


def test_forget_drops_live_state_and_checkpoints(tiny_converted, tmp_path, tiers):
    s = new_sessions(tiny_converted("int4"), tmp_path, tiers=tiers)
    s.generate("c", chat("remember me"), GREEDY, 4)
    name = s.store.record_name("c", s.identity.model_fp)
    assert tiers.has(tmp_path, name)
    assert s.forget("c") == 1
    assert not tiers.has(tmp_path, name) and s.engine.tokens == [] and s.store.entries(conversation="c") == []


def test_interrupted_long_prefill_resumes_from_the_last_aligned_frontier(tiny_converted, tmp_path, tiers):
    converted = tiny_converted("int4")
    s = new_sessions(converted, tmp_path, save_align=64, tiers=tiers)
    s.engine.prefill_chunk = 32
    msgs = chat("word " * 52)  # about 231 tokens: frontiers at 64, 128, 192
    cancel = CancelToken()

    def stop_late(done: int, total: int) -> None:
        if done >= 160:
            cancel.cancel()

    logits, prompt, report = s.sync("c", msgs, progress=stop_late, cancel=cancel)
    assert logits is None and len(prompt) > 192
    entry = s.store.conversation_entry("c", s.identity.model_fp)
    assert entry.tokens == 128  # saved at 64 and 128; the cancel came before 192
    again = new_sessions(converted, tmp_path, save_align=64, tiers=tiers)
    _, prompt2, report2 = again.sync("c", msgs)
    assert prompt2 == prompt
    assert report2.source == DISK and report2.restored_tokens == 128
    assert report2.prefilled_tokens == len(prompt) - 128


def test_adaptive_resume_prefills_when_that_is_faster(tiny_converted, tmp_path, tiers):
    converted = tiny_converted("int4")
    s = new_sessions(converted, tmp_path, tiers=tiers)
    msgs = chat("a question long enough to matter " * 3)
    s.generate("c", msgs, GREEDY, 4)
    s.close()
    follow = msgs + [{"role": "assistant", "content": "x"}, {"role": "user", "content": "y"}]
    slow_disk = new_sessions(converted, tmp_path, adaptive=True, tiers=tiers)
    slow_disk.throughput.read_bps, slow_disk.throughput.prefill_tps = 1e3, 1e6  # a slow disk, a fast model
    _, _, report = slow_disk.sync("c", follow)
    assert report.source == COLD and report.restore_estimate_ms > report.prefill_estimate_ms
    fast_disk = new_sessions(converted, tmp_path, adaptive=True, tiers=tiers)
    fast_disk.throughput.read_bps, fast_disk.throughput.prefill_tps = 1e12, 1.0
    _, _, report = fast_disk.sync("c", follow)
    assert report.source == DISK and report.restore_estimate_ms < report.prefill_estimate_ms


def test_throughput_is_measured_and_remembered(tiny_converted, tmp_path):
    converted = tiny_converted("int4")
    s = new_sessions(converted, tmp_path)
    s.sync("c", chat("measure " * 12))
    rate = s.throughput.prefill_tps
    assert rate != 800.0  # moved off the default by a real measurement
    assert new_sessions(converted, tmp_path).throughput.prefill_tps == pytest.approx(rate)


def test_text_that_splits_a_character_across_tokens_resumes_cleanly(tiny_converted, tmp_path, tiers):
    # The tiny vocabulary spells most non-ASCII characters byte by byte, so a frontier can fall
    # inside a character; resuming must back off to a character boundary and still match a cold run.
    converted = tiny_converted("int4")
    s = new_sessions(converted, tmp_path, tiers=tiers)
    msgs = chat("naïve café 日本語 ✓")
    s.sync("c", msgs)
    follow = msgs + [{"role": "assistant", "content": "日本"}, {"role": "user", "content": "語 ✓ ok"}]
    _, prompt, report = new_sessions(converted, tmp_path, tiers=tiers).sync("c", follow)
    assert report.source == DISK
    text = s.engine.render(follow).encode()
    assert b"".join(s.engine.tokenizer.token_bytes(t) for t in prompt) == text


def test_the_cheap_fit_check_agrees_with_a_full_tokenization(tiny_converted, tmp_path):
    """check_fits (run before a message is stored) refuses exactly the prompts that cannot fit, for a
    conversation whose KV is live (only the new text is tokenized) and for one that is not."""
    from engine.errors import PromptError

    sessions = new_sessions(tiny_converted("int4"), tmp_path)
    engine = sessions.engine
    sessions.generate("live", chat("hello there"), GREEDY, 4)
    checked = set()
    for n in range(0, 400, 7):
        messages = chat("hello there", "hi", "word " * n)
        fits = len(engine.prompt_tokens(messages)) < engine.context_length
        for cid in ("live", "other"):
            try:
                sessions.check_fits(cid, messages)
                got = True
            except PromptError as exc:
                got = False
                assert f"holds {engine.context_length}" in str(exc)
            assert got == fits, (n, cid)
            checked.add(fits)
    assert checked == {True, False}  # both sides of the limit were tried


# a poisoned shared prefix (issue 27, item 9) -----------------------------------------------------------------
def saved_rows(path) -> np.ndarray:
    """Every row of a checkpoint, [layer, 2 × KV head, token, dim], after a full verification."""
    with CheckpointReader(path) as r:
        s = r.read_header().shape
        records, problem = r.scan()
        assert problem is None
        rows = np.zeros((s.n_layers, 2 * s.n_kv_heads, records[-1].end, s.head_dim), np.dtype(s.dtype))
        _, problem = r.load_rows(records, lambda start, end: [rows[layer, k, start:end] for layer in range(s.n_layers)
                                                              for k in range(2 * s.n_kv_heads)])
    assert problem is None
    return rows


def nan_rows(rows: np.ndarray) -> None:
    rows[0, 0, 0, 0], rows[-1, -1, -1, -1] = np.nan, np.inf


def huge_rows(rows: np.ndarray) -> None:  # finite, so they verify, but they overflow the attention
    rows[:, :, 0, :] = np.finfo(rows.dtype).max


@pytest.mark.parametrize("poison", [nan_rows, huge_rows], ids=["nan_rows", "finite_rows_giving_nan"])
def test_a_resealed_shared_prefix_is_replaced_and_the_next_chat_still_replies(tiny_converted, tmp_path, poison,
                                                                               caplog):
    """Issue 27: a saved system prompt resealed with NaN rows (every checksum recomputed), or with finite rows
    that overflow the attention, was left in the store: every new chat with that system prompt started from
    it. The turn replies, the prefix file is deleted and saved again from the rebuilt rows, and the next
    chat resumes from the new one."""
    from tests.test_bundle_security import reseal

    first = new_sessions(tiny_converted("int4"), tmp_path)
    first.generate("a", chat("first conversation"), GREEDY, 4)
    first.close()
    [entry] = first.store.entries(kind="prefix")
    path = first.store.path(entry.name)
    reseal(path, tmp_path / "poisoned.hkv", poison)
    (tmp_path / "poisoned.hkv").replace(path)
    s = new_sessions(tiny_converted("int4"), tmp_path)
    with caplog.at_level("WARNING"):
        turn = s.generate("b", chat("a second, unrelated conversation"), GREEDY, 4)
    assert turn.generation.tokens and entry.name in caplog.text  # it replied, and said which file went
    [again] = s.store.entries(kind="prefix")
    assert again.name == entry.name and np.abs(saved_rows(path)).max() < 1e6  # replaced by the rebuilt rows
    third = new_sessions(tiny_converted("int4"), tmp_path)
    caplog.clear()
    with caplog.at_level("WARNING"):
        turn = third.generate("c", chat("yet another conversation"), GREEDY, 4)
    assert turn.resume.shared_prefix and turn.resume.source == DISK and not turn.generation.rebuilt
    assert "invalid numbers" not in caplog.text and "rejected" not in caplog.text
