"""engine.api: the one turn rule, its events, the per-conversation turn lock, race-free creation, and
errors that say what happened — on real ONNX Runtime, real SQLite and real files, across processes."""

from __future__ import annotations

import json
import multiprocessing
import os
import resource
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from engine.api import Hearth, open_conversations, resolve_paths, saved_contexts
from engine.checkpoint.block_store import BlockStore
from engine.conversations import ConversationStore
from engine.errors import (
    ConversationBusyError,
    DiskFullError,
    ModelNotInstalledError,
    ModelNotLoadedError,
    PromptError,
    TurnCancelledError,
)
from engine.turn_lock import TurnLock
from engine.types import (
    Accepted,
    CancelToken,
    ContextBadge,
    ContextHealth,
    Finished,
    ProgressPhase,
    Rebuilt,
    RestoreCheck,
    Resume,
    Resumed,
    ResumeSource,
    SamplingParams,
    StopReason,
    Token,
    TurnRequest,
    Waiting,
)

from .checkpoint_names import only_conv_path
from .test_cli import assert_clean_error

GREEDY = SamplingParams.greedy_params()


def test_a_turn_reports_typed_events_in_order_and_stores_both_messages(hearth):
    events = []
    done = hearth.run_turn(TurnRequest("c1", "hello there", GREEDY, 6), events.append, create=True)
    kinds = [type(e) for e in events]
    assert kinds[0] is Accepted and kinds[-1] is Finished and Resumed in kinds
    assert kinds.index(Resumed) < kinds.index(Finished)
    assert all(k is Token for k in kinds[kinds.index(Resumed) + 1 : -1])
    accepted = events[0]
    assert accepted.user_seq == 0 and [m.content for m in accepted.messages] == ["hello there"]
    assert done is events[-1] and done.local.resume.source == ResumeSource.COLD
    assert "".join(e.text for e in events if isinstance(e, Token)) == done.reply
    stored = hearth.conversations.messages("c1")
    assert [(m.seq, m.role) for m in stored] == [(0, "user"), (1, "assistant")]
    assert stored[1].content == done.reply and done.reply_seq == 1
    assert done.local.save is not None and done.local.save.ok and done.local.save.tokens == done.context_tokens
    assert hearth.conversations.get("c1").model == done.model.label
    again = hearth.run_turn(TurnRequest("c1", "and again", GREEDY, 6))
    assert again.local.resume.source == ResumeSource.LIVE and again.local.resume.reused_tokens >= done.prompt_tokens


def test_a_stopped_reply_keeps_what_was_written(hearth):
    cancel = CancelToken()
    seen = []

    def stop_after_two_tokens(event) -> None:
        seen.append(event)
        if sum(isinstance(e, Token) for e in seen) == 2:
            cancel.cancel()

    done = hearth.run_turn(TurnRequest("s", "write a long story", GREEDY, 50), stop_after_two_tokens, cancel,
                           create=True)
    assert done.stop_reason == StopReason.CANCELLED and done.reply
    assert hearth.conversations.messages("s")[-1].content == done.reply


def test_a_reply_stopped_before_its_first_word_stores_nothing_but_the_message(hearth):
    cancel = CancelToken()
    cancel.cancel()
    done = hearth.run_turn(TurnRequest("s0", "hello", GREEDY, 8), cancel=cancel, create=True)
    assert done.stop_reason == StopReason.CANCELLED and done.reply == "" and done.reply_seq is None
    assert [m.role for m in hearth.conversations.messages("s0")] == ["user"]


def test_the_window_path_never_creates_a_deleted_conversation(hearth):
    with pytest.raises(Exception, match="no conversation 'gone'"):
        hearth.run_turn(TurnRequest("gone", "hello", GREEDY, 4))
    assert hearth.conversations.get("gone") is None


def test_a_message_that_cannot_fit_is_refused_before_it_is_stored(hearth):
    hearth.conversations.create("long")
    with pytest.raises(PromptError, match=r"This chat is [\d,]+ tokens, but the model reads at most 256\."):
        hearth.run_turn(TurnRequest("long", "word " * 2000, GREEDY, 4))
    assert hearth.conversations.messages("long") == []  # the conversation is not left ending in it


def test_bad_requests_are_refused_before_anything_is_stored(hearth):
    with pytest.raises(PromptError, match="empty"):
        hearth.run_turn(TurnRequest("e", "   ", GREEDY, 4), create=True)
    with pytest.raises(PromptError, match="at least 1"):
        hearth.run_turn(TurnRequest("e", "hi", GREEDY, 0), create=True)
    with pytest.raises(Exception, match="temperature"):
        hearth.run_turn(TurnRequest("e", "hi", SamplingParams(temperature=-1), 4), create=True)
    assert hearth.conversations.get("e") is None


def test_a_failed_save_never_costs_the_reply(hearth):
    """The reply is stored before the context is saved: a save that cannot write still leaves it."""
    first = hearth.run_turn(TurnRequest("ro", "hello", GREEDY, 4), create=True)
    assert first.local.save.ok
    # Make the checkpoint's path unusable for any user, root included: a directory stands where the
    # file must be renamed to, so the save's write fails.
    target = only_conv_path(hearth.paths.checkpoints, "ro")
    hearth.forget("ro")
    target.mkdir()
    second = hearth.run_turn(TurnRequest("ro", "and again", GREEDY, 4))
    assert second.local.save is not None and not second.local.save.ok and "could not save" in second.local.save.error
    assert [m.role for m in hearth.conversations.messages("ro")] == ["user", "assistant", "user", "assistant"]
    assert hearth.conversations.messages("ro")[-1].content == second.reply


def test_opening_a_damaged_context_reports_and_rebuilds_it(hearth):
    hearth.run_turn(TurnRequest("d", "hello there", GREEDY, 6), create=True)
    hearth.open_conversation("d")  # make it live, then switch away so the next open reads the file
    hearth.conversations.create("other")
    assert hearth.open_conversation("other") is None  # no user message: nothing to resume
    path = only_conv_path(hearth.paths.checkpoints, "d")
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    events = []
    resume = hearth.open_conversation("d", events.append)
    assert resume.source == ResumeSource.REBUILT and resume.reason == "checksum" and resume.plain
    assert isinstance(events[0], Resumed) and isinstance(events[-1], Rebuilt) and not events[-1].cancelled
    assert any(getattr(e, "phase", None) == ProgressPhase.REBUILD for e in events)
    assert events[-1].save is not None and events[-1].save.ok
    assert saved_contexts(hearth).context_status("d", full=True).health == ContextHealth.VALID  # saved again after the rebuild
    assert saved_contexts(hearth).context_states()["d"].badge == ContextBadge.LIVE


def test_opening_a_chat_reads_it_once_and_a_rebuild_restores_once(hearth, monkeypatch):
    from engine.session import sessions as sessions_module
    from engine.session.restore import Restorer

    hearth.run_turn(TurnRequest("d", "hello there", GREEDY, 6), create=True)
    hearth.run_turn(TurnRequest("d", "and once more", GREEDY, 6))
    hearth.conversations.create("other")
    hearth.open_conversation("other")  # switch away, so the open below restores from the file
    path = only_conv_path(hearth.paths.checkpoints, "d")
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))

    restores = []

    class CountingRestorer(Restorer):  # the real restorer, counted
        def restore(self, conversation, *args, **kwargs):
            restores.append(conversation)
            return super().restore(conversation, *args, **kwargs)

    monkeypatch.setattr(sessions_module, "Restorer", CountingRestorer)
    statements = []
    db = hearth.conversations._db  # the real store's own connection: every statement it runs is traced
    db.set_trace_callback(statements.append)
    try:  # drop_oldest: the view is planned from the stored chat, which the old code read a second time
        resume = hearth.open_conversation("d", context_policy="drop_oldest")
    finally:
        db.set_trace_callback(None)
    assert resume.source == ResumeSource.REBUILT
    assert restores == ["d"]  # the rebuild prefills what the one restore left, it does not restore again
    reads = [" ".join(s.split()).upper() for s in statements if s.lstrip().upper().startswith("SELECT")]
    assert len([s for s in reads if "FROM CONVERSATIONS" in s]) == 1, reads
    assert len([s for s in reads if "FROM MESSAGES" in s]) == 1, reads
    assert saved_contexts(hearth).context_status("d", full=True).health == ContextHealth.VALID  # saved again after the rebuild


def test_saved_context_administration(hearth):
    for cid in ("a", "b"):
        hearth.run_turn(TurnRequest(cid, f"hello {cid}", GREEDY, 4), create=True)
    saved = saved_contexts(hearth)
    assert saved.copy_context("a", "a2") and saved.context_status("a2").health == ContextHealth.VALID
    assert not saved.copy_context("nothing-here", "x")
    report = saved.inspect_contexts(["a", "b", "none"], full=True)
    assert {k: v.health for k, v in report.items.items()} == {
        "a": ContextHealth.VALID, "b": ContextHealth.VALID, "none": ContextHealth.NONE}
    assert report.bytes == saved.usage().bytes > 0
    saved.drop_contexts(["b"])
    assert saved.context_status("b").health == ContextHealth.NONE and hearth.conversations.get("b") is not None
    gc = saved.reclaim()  # a2 has no conversation: an orphan
    assert any("a2" in o or o for o in gc.orphans) and saved.context_status("a2").health == ContextHealth.NONE
    summaries = {s.id: s for s in hearth.conversation_summaries()}
    assert summaries["a"].messages == 2 and summaries["a"].tokens > 0 and summaries["b"].tokens == 0


def test_check_restore_matches_a_cold_prefill(hearth):
    hearth.run_turn(TurnRequest("r", "hello there", GREEDY, 6), create=True)
    hearth.close()
    again = Hearth(hearth.paths, model=hearth.model_path, provider="cpu")
    again.load()
    try:
        check = saved_contexts(again).check_restore("r")
    finally:
        again.close()
    assert check.resume.source == ResumeSource.DISK and check.same_next_token and check.max_logit_diff < 1e-3
    assert check.tolerance == 1e-2 and check.matches  # float32 on the CPU: only the order of sums differs


def test_check_restore_allows_fp16_rounding_relative_to_the_logits(hearth):
    """fp16 activations (what every CUDA variant computes in) round the logits: the bound scales with them."""
    hearth.run_turn(TurnRequest("h", "hello there", GREEDY, 6), create=True)
    hearth.close()
    half = Hearth(hearth.paths, model=hearth.model_path, weights="int4-half", provider="cpu")
    half.load()
    try:
        check = saved_contexts(half).check_restore("h")
    finally:
        half.close()
    assert check.resume.source == ResumeSource.DISK and check.matches
    assert check.tolerance > 1e-2 and check.max_logit_diff <= check.tolerance


def test_a_restore_check_that_predicts_another_token_does_not_match():
    resume = Resume(ResumeSource.DISK)
    assert not RestoreCheck(resume, 0.0, same_next_token=False).matches
    assert not RestoreCheck(resume, 0.5, same_next_token=True, tolerance=0.1).matches
    assert RestoreCheck(resume, 0.05, same_next_token=True, tolerance=0.1).matches


def test_check_restore_restores_from_disk_even_when_re_reading_looks_faster(hearth):
    """On a fast GPU the adaptive resume re-reads a short context instead of restoring it; the self-test's
    check must still restore it (it failed on the H200 with "expected the context from disk, got cold")."""
    hearth.run_turn(TurnRequest("r", "hello there", GREEDY, 6), create=True)
    hearth.close()
    rates = hearth.paths.checkpoints / "throughput.json"
    rates.write_text(json.dumps({"cpu": {"read_bps": 1.0e6, "prefill_tps": 1.0e9}}))  # the disk looks hopeless
    again = Hearth(hearth.paths, model=hearth.model_path, provider="cpu")
    again.load()
    try:
        check = saved_contexts(again).check_restore("r")
        # ...and an ordinary turn afterwards still makes the adaptive choice: it re-reads
        turn = again.run_turn(TurnRequest("r", "and again", GREEDY, 2))
    finally:
        again.close()
    assert check.resume.source == ResumeSource.DISK and check.resume.restored_tokens > 0 and check.same_next_token
    assert turn.local.resume.source != ResumeSource.DISK


def test_model_info_says_whether_it_is_a_chat_model_and_where_its_chat_format_comes_from(hearth, tmp_path):
    from tests.gguf_edit import rewrite_gguf

    info = hearth.model
    assert info.kind == "chat" and info.chat_template == "gguf"  # the tiny model carries a ChatML template
    # The same file without its template, as the Gemma 3 270M base model comes: a base model, with the
    # built-in format its vocabulary fits.
    bare = rewrite_gguf(hearth.model_path, tmp_path / "bare.gguf", drop=("tokenizer.chat_template",))
    service = Hearth(resolve_paths(tmp_path / "home").ensure(), model=bare, provider="cpu")
    try:
        info = service.load()
    finally:
        service.close()
    assert info.kind == "base" and info.chat_template == "builtin:chatml"


def test_a_missing_default_model_is_a_typed_error(tmp_path, monkeypatch):
    monkeypatch.delenv("HEARTH_BUNDLED_MODEL", raising=False)
    service = Hearth(resolve_paths(tmp_path / "empty").ensure(), provider="cpu")
    with pytest.raises(ModelNotInstalledError, match="hearth-cli model fetch"):
        service.load()
    with pytest.raises(ModelNotLoadedError):
        service.open_conversation("x")
    # the message of a turn that cannot run is still kept
    assert service.store_message(TurnRequest("kept", "remember me"), create=True) == 0
    assert service.conversations.messages("kept")[0].content == "remember me"
    with pytest.raises(ModelNotLoadedError):
        service.run_turn(TurnRequest("kept", "and me"))
    assert [m.content for m in service.conversations.messages("kept")] == ["remember me", "and me"]
    service.close()


# across processes ----------------------------------------------------------------------------------------
def _ensure_and_append(db: str, cid: str, text: str, barrier) -> str:
    store = ConversationStore(Path(db))
    barrier.wait()
    try:
        store.ensure(cid)
        store.append(cid, "user", text)
        return "ok"
    except Exception as exc:  # reported to the test, which fails with it
        return f"{type(exc).__name__}: {exc}"
    finally:
        store.close()


def test_creating_a_conversation_is_race_free_across_processes(tmp_path):
    """Before ensure(), get-then-create lost one of two simultaneous first messages ("already exists")."""
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(4) as pool:
        for round_ in range(12):
            db = str(tmp_path / f"race{round_}.sqlite3")
            ConversationStore(Path(db)).close()  # the schema exists; the conversation does not
            barrier = ctx.Manager().Barrier(4)
            results = pool.starmap(_ensure_and_append, [(db, "new", f"message {i}", barrier) for i in range(4)])
            assert results == ["ok"] * 4
            stored = ConversationStore(Path(db)).messages("new")
            assert sorted(m.content for m in stored) == [f"message {i}" for i in range(4)]


def _chat(home: Path, model: Path, message: str, *extra: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "engine.cli", "chat", "--conversation", "shared", "--message", message,
                             "--greedy", "--max-new-tokens", "24", "--json", "--provider", "cpu", "--model", str(model),
                             *extra], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "HEARTH_HOME": str(home)})


def test_two_concurrent_chats_on_one_new_conversation_never_interleave(tiny_home, tiny_gguf):
    """Two processes start turns on the same, not yet existing, conversation: both messages are kept,
    and each reply follows its own message (user, assistant, user, assistant), the second turn reading
    the first one's exchange."""
    for attempt in range(3):
        home = tiny_home / f"round{attempt}"
        home.mkdir()
        (home / "converted").symlink_to(tiny_home / "converted")
        procs = [_chat(home, tiny_gguf, f"first {attempt}"), _chat(home, tiny_gguf, f"second {attempt}")]
        outs = [p.communicate(timeout=600) for p in procs]
        for p, (_out, err) in zip(procs, outs, strict=True):
            assert p.returncode == 0, err
        replies = [json.loads(out) for out, _ in outs]
        stored = ConversationStore(home / "conversations.sqlite3").messages("shared")
        assert [m.role for m in stored] == ["user", "assistant", "user", "assistant"]
        by_message = {stored[0].content: stored[1].content, stored[2].content: stored[3].content}
        assert by_message == {f"first {attempt}": replies[0]["reply"], f"second {attempt}": replies[1]["reply"]}
        later = max(replies, key=lambda r: r["context"]["tokens"])
        assert later["resume"]["reused_tokens"] > 0  # the later turn continued the earlier one's context


def test_a_busy_conversation_times_out_with_a_clear_message(tiny_home, tiny_gguf):
    paths = resolve_paths(tiny_home).ensure()
    with TurnLock(paths.turn_locks, "shared", timeout_s=1).held():
        proc = _chat(tiny_home, tiny_gguf, "hello?", "--wait", "1")
        _, err = proc.communicate(timeout=600)
    assert proc.returncode == 1 and "Traceback" not in err
    assert "conversation shared is busy in another Hearth process" in err
    assert "waiting: conversation shared is busy" in err  # it said it was waiting before giving up
    with pytest.raises(ConversationBusyError, match="conversation x is busy"):
        # two turns on one conversation conflict even inside one process (each holds its own lock file handle)
        with TurnLock(paths.turn_locks, "x", 0.2).held(), TurnLock(paths.turn_locks, "x", 0.2).held():
            pass
    assert open_conversations(paths).get("shared") is None  # it never got to store anything


def test_stop_ends_a_wait_for_a_busy_conversation(hearth):
    """Stop (the window's Esc) ends a turn still waiting for another process's turn: nothing stored."""
    import threading

    hearth.conversations.create("busy")
    cancel = CancelToken()
    waits = []

    def on_event(event) -> None:
        if isinstance(event, Waiting):
            waits.append(event)
            threading.Timer(0.2, cancel.cancel).start()

    with TurnLock(hearth.paths.turn_locks, "busy", timeout_s=5).held():
        with pytest.raises(TurnCancelledError, match="stopped while conversation busy"):
            hearth.run_turn(TurnRequest("busy", "hello", GREEDY, 4), on_event, cancel)
    assert waits and hearth.conversations.messages("busy") == []


def _limit_file_size(limit: int):
    def apply() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # fail the write with EFBIG instead of killing us
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return apply


def test_a_full_disk_says_so_and_keeps_what_was_stored(tiny_home, tiny_gguf):
    """Before: 'cannot rollback - no transaction is active' (the ROLLBACK after a failed COMMIT hid
    SQLITE_FULL/IOERR) and the turn was gone. Now the error names the full disk, exit 1, and the
    conversation still holds everything stored before."""
    store = ConversationStore(tiny_home / "conversations.sqlite3")
    store.create("full")
    store.append("full", "user", "an earlier message")
    # Both indexes stay open here, so their shared-memory files exist and the limit bites on the first
    # real write: storing the new message.
    index = BlockStore(tiny_home / "checkpoints")  # the store Hearth opens: its tables exist
    proc = subprocess.run([sys.executable, "-m", "engine.cli", "chat", "--conversation", "full", "--message", "hello there",
                           "--max-new-tokens", "4", "--provider", "cpu", "--model", str(tiny_gguf)],
                          capture_output=True, text=True, env={**os.environ, "HEARTH_HOME": str(tiny_home)},
                          preexec_fn=_limit_file_size(4096), timeout=600)
    assert_clean_error(proc, "is full")
    assert "rollback" not in proc.stderr
    assert [m.content for m in store.messages("full")] == ["an earlier message"]
    index.close()
    store.close()


def test_a_full_disk_at_the_first_run_says_so(tiny_home, tiny_gguf):
    """Nothing exists yet and nothing can be written: one clear line, no internal error."""
    proc = subprocess.run([sys.executable, "-m", "engine.cli", "chat", "--conversation", "c", "--message", "hi",
                           "--max-new-tokens", "4", "--provider", "cpu", "--model", str(tiny_gguf)],
                          capture_output=True, text=True, env={**os.environ, "HEARTH_HOME": str(tiny_home)},
                          preexec_fn=_limit_file_size(4096), timeout=600)
    assert_clean_error(proc, "full")


def test_a_disk_full_error_from_sqlite_is_typed(tmp_path):
    store = ConversationStore(tmp_path / "c.sqlite3")
    store.create("c")
    code = ("import sys; from pathlib import Path; from engine.conversations import ConversationStore\n"
            "from engine.errors import DiskFullError\n"
            f"s = ConversationStore(Path({str(tmp_path / 'c.sqlite3')!r}))\n"
            "try:\n    s.append('c', 'user', 'y' * 20000)\nexcept DiskFullError as e:\n    print('typed:', e)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=Path(__file__).parent.parent,
                          preexec_fn=_limit_file_size(4096), timeout=120)
    assert proc.stdout.startswith("typed: the disk holding"), proc.stdout + proc.stderr
    assert store.messages("c") == []
    assert issubclass(DiskFullError, Exception)


def test_complete_carries_logprobs_and_continues_raw_prompts(hearth):
    from engine.sampling import log_softmax

    plain = hearth.complete([{"role": "user", "content": "hello"}], GREEDY, 3)
    assert plain.logprobs == ()
    sampled = hearth.complete([{"role": "user", "content": "hello"}], SamplingParams(temperature=1.3, seed=5), 4,
                              top_logprobs=3)
    assert [lp.token for lp in sampled.logprobs] == list(sampled.tokens)
    assert all(len(lp.top) == 3 and lp.logprob <= lp.top[0][1] <= 0 for lp in sampled.logprobs)
    raw = hearth.complete_raw("hello world", GREEDY, 2, top_logprobs=0)
    engine = hearth._require_engine()
    assert list(raw.prompt_tokens) == engine.tokenizer.encode("hello world")  # the tiny model has add_bos false
    assert raw.logprobs[0].top == () and raw.logprobs[0].token == raw.tokens[0]
    assert hearth.token_text(raw.tokens[0]) == engine.tokenizer.token_bytes(raw.tokens[0]).decode("utf-8", "replace")
    with pytest.raises(PromptError, match="from 0 to 20"):
        hearth.complete_raw("hello", GREEDY, 2, top_logprobs=21)
    with pytest.raises(PromptError, match="empty"):
        hearth.complete_raw("", GREEDY, 2)
    huge = np.array([1e4, -1e4, 1e4 - 1.0, 0.0])  # no overflow, still sums to 1
    assert np.isfinite(log_softmax(huge)).all() and abs(np.exp(log_softmax(huge)).sum() - 1) < 1e-12
