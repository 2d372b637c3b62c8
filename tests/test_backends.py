"""The backend protocol (engine/backends/protocol.py), run over two real backends: the local engine
(``engine.api.Hearth``) and a remote one (engine/backends/remote.py) that runs turns on Hearth's own
OpenAI-compatible server over HTTP on 127.0.0.1 — the proof of docs/architecture.md's "How to add a backend".
Then the front ends' text for records with no local part, as a remote backend gives them."""

from __future__ import annotations

import pytest

from engine.api import Backend, Hearth, ModelLibrary, RemoteBackend, RemoteServer, resolve_paths, saved_contexts
from engine.errors import HearthError, ModelNotLoadedError
from engine.types import (
    Accepted,
    CancelToken,
    Capabilities,
    ContextHealth,
    Finished,
    LocalModelFacts,
    LocalTurnFacts,
    ModelInfo,
    Resume,
    Resumed,
    ResumeSource,
    SamplingParams,
    SaveResult,
    StopReason,
    Timings,
    Token,
    TurnRequest,
)
from tests.server_helpers import LiveServer

GREEDY = SamplingParams.greedy_params()
TINY = "tiny"


@pytest.fixture(params=["local", "remote"])
def backend(request, tiny_home, tiny_gguf, tmp_path):
    """A backend on the tiny model, not loaded yet: the local engine, or the remote one over HTTP."""
    paths = resolve_paths(tiny_home).ensure()
    assert ModelLibrary(paths).add(tiny_gguf).name == TINY
    if request.param == "local":
        made = Hearth(paths, model=TINY, provider="cpu")
        yield made
        made.close()
        return
    server = LiveServer(paths, TINY)  # the server's own data dir; the front end's text lives in another
    made = RemoteBackend(resolve_paths(tmp_path / "front"), RemoteServer("peer", server.base), None, model=TINY)
    try:
        yield made
    finally:
        made.close()
        server.close()


def turn(backend: Backend, text: str, cancel: CancelToken | None = None, on_event=None, tokens: int = 8) -> Finished:
    return backend.run_turn(TurnRequest("c", text, GREEDY, tokens), on_event, cancel, create=True)


def test_it_is_a_backend_that_says_what_it_can(backend):
    assert isinstance(backend, Backend)
    caps = backend.capabilities
    assert isinstance(caps, Capabilities) and not caps.tools
    if isinstance(backend, RemoteBackend):  # what the remote one lacks, it says
        assert not caps.saved_context and not caps.local_facts and caps.model_switching
    else:
        assert caps.saved_context and caps.local_facts and caps.raw_completion and caps.model_switching
    names = [m.name for m in backend.list_models()]
    assert (f"peer/{TINY}" if isinstance(backend, RemoteBackend) else TINY) in names


def test_load_then_a_turn_streams_tokens_then_finished(backend):
    assert backend.model is None
    with pytest.raises(ModelNotLoadedError):  # without a model the message is stored all the same
        backend.run_turn(TurnRequest("early", "too early", GREEDY, 4), create=True)
    assert [m.content for m in backend.conversations.messages("early")] == ["too early"]
    info = backend.load()
    assert backend.model is info and info.name and backend.model_key
    assert (info.local is not None) == backend.capabilities.local_facts
    events = []
    done = turn(backend, "hello there", on_event=events.append)
    kinds = [type(e) for e in events]
    assert kinds[0] is Accepted and kinds[-1] is Finished and events[-1] is done
    assert Token in kinds and kinds.index(Token) > 0  # tokens stream between Accepted and Finished
    assert (Resumed in kinds) == backend.capabilities.saved_context  # only a backend with saved context resumes
    assert "".join(e.text for e in events if isinstance(e, Token)) == done.reply and done.reply
    assert done.stop_reason in (StopReason.EOS, StopReason.LENGTH) and done.model == info
    stored = backend.conversations.messages("c")
    assert [(m.role, m.content) for m in stored] == [("user", "hello there"), ("assistant", done.reply)]
    assert done.reply_seq == stored[1].seq
    if backend.capabilities.local_facts:
        assert isinstance(done.local, LocalTurnFacts) and done.local.resume.source == ResumeSource.COLD
        assert done.local.save is not None and done.local.save.ok
    else:
        assert done.local is None


def test_cancel_keeps_what_was_written_and_forget_drops_what_it_holds(backend):
    backend.load()
    cancel = CancelToken()

    def stop_at_first(event) -> None:
        if isinstance(event, Token):
            cancel.cancel()

    done = turn(backend, "write a long reply", cancel, stop_at_first, tokens=64)
    assert done.stop_reason == StopReason.CANCELLED and done.reply  # stopped, not lost: the reply is stored
    assert [m.role for m in backend.conversations.messages("c")] == ["user", "assistant"]
    assert backend.conversations.messages("c")[1].content == done.reply
    again = turn(backend, "and again")  # a cancelled turn leaves the backend ready for the next
    assert again.reply and again.stop_reason != StopReason.CANCELLED
    backend.forget("c")
    if backend.capabilities.saved_context:
        assert saved_contexts(backend).context_status("c").health == ContextHealth.NONE
    else:
        with pytest.raises(HearthError, match="no saved context"):
            saved_contexts(backend)
    assert backend.open_conversation("c") is None or backend.capabilities.saved_context
    assert len(backend.conversations.messages("c")) == 4  # forgetting drops context, never the text


def test_complete_raw_and_complete_store_nothing(backend):
    backend.load()
    raw = backend.complete_raw("Once upon a time", GREEDY, 4)
    assert raw.text and raw.stop_reason in (StopReason.LENGTH, StopReason.EOS) and raw.model == backend.model
    assert len(raw.tokens) <= 4
    pieces = []
    chat = backend.complete([{"role": "user", "content": "hi"}], GREEDY, 4, on_text=pieces.append)
    assert chat.text == "".join(pieces) and chat.text
    assert backend.conversations.ids() == set()  # stored nowhere


def test_a_turn_with_attachments_stores_them_and_count_tokens_sizes_them(backend):
    from engine.api import attachment_block, attachment_from_text, compose_message

    with pytest.raises(ModelNotLoadedError):
        backend.count_tokens("a word")
    backend.load()
    doc = attachment_from_text("owls.md", "# Owls\nThey hunt at night.", "markdown")
    block, whole = backend.count_tokens(attachment_block(doc)), backend.count_tokens(compose_message("why?", [doc]))
    assert 0 < block < whole
    done = backend.run_turn(TurnRequest("f", "why?", GREEDY, 4, attachments=(doc,)), create=True)
    user, reply = backend.conversations.messages("f")
    assert (user.content, user.typed_text, user.attachments) == (compose_message("why?", [doc]), "why?", (doc,))
    assert reply.content == done.reply


def test_both_backends_write_the_same_greedy_reply(tiny_home, tiny_gguf, tmp_path):
    """The remote backend runs the same model through the server: same chat, same greedy reply."""
    paths = resolve_paths(tiny_home).ensure()
    ModelLibrary(paths).add(tiny_gguf)
    local = Hearth(paths, model=TINY, provider="cpu")
    try:
        local.load()
        mine = turn(local, "hello there").reply
    finally:
        local.close()
    server = LiveServer(paths, TINY)
    remote = RemoteBackend(resolve_paths(tmp_path / "front"), RemoteServer("peer", server.base), None, model=TINY)
    try:
        remote.load()
        assert turn(remote, "hello there").reply == mine
    finally:
        remote.close()
        server.close()


# the front ends' text for records without a local part --------------------------------------------------
REMOTE_INFO = ModelInfo("tiny", "remote", "", 0, "served by http://127.0.0.1:1", key="tiny")


def finished(local: LocalTurnFacts | None, info: ModelInfo = REMOTE_INFO) -> Finished:
    return Finished("c", "hi", (1, 2), StopReason.EOS, 2, 5, 7, info.context_length, Timings(decode_tokens_per_s=3.0),
                    info, local=local)


def test_window_text_without_local_facts():
    from app.text import context_label, model_label, model_tooltip, short_model_label, turn_note

    assert model_label(REMOTE_INFO) == "tiny · remote"  # no precision told, and not called a CPU
    assert short_model_label(REMOTE_INFO) == "tiny · remote" and "127.0.0.1" in model_tooltip(REMOTE_INFO)
    assert context_label(7, 0) == "Context 7"  # the limit untold
    assert "not saved" not in turn_note(finished(None))
    failed = LocalTurnFacts(Resume(ResumeSource.COLD), SaveResult(False, "turn", error="disk full"))
    local = ModelInfo("SmolLM2", "cpu", "int4", 8192, local=LocalModelFacts("hearth", "hearth"))
    assert "context not saved: disk full" in turn_note(finished(failed, local))
    assert model_label(local) == "SmolLM2 · int4 · CPU"


def test_the_terminal_chat_says_how_many_drafted_tokens_were_accepted():
    from dataclasses import replace

    from engine.cli.terminal_chat import turn_figures

    drafted = replace(finished(None), timings=Timings(decode_tokens_per_s=3.0, drafted_tokens=52, accepted_tokens=40))
    assert turn_figures(drafted) == "3.0 tok/s, 40 of 52 drafted tokens accepted"


def test_cli_and_terminal_text_without_local_facts():
    from dataclasses import replace

    from app.self_test import kernels
    from engine.cli.store import turn_line
    from engine.cli.terminal_chat import turn_figures

    assert turn_line(finished(None)) == "[eos; cached tokens not reported]"  # a remote model's turn
    assert turn_line(replace(finished(None), server_cached_tokens=5129, prompt_tokens=5180)) == \
        "[eos; the server had 5,129 of 5,180 tokens cached]"
    assert turn_figures(finished(None)) == "3.0 tok/s"
    resume = Resume(ResumeSource.DISK, reused_tokens=4, prefilled_tokens=1, elapsed_ms=2.0)
    assert "4 tokens reused (disk)" in turn_line(finished(LocalTurnFacts(resume)))
    assert "4 tokens reused (disk), 1 read" in turn_figures(finished(LocalTurnFacts(resume)))
    assert kernels(REMOTE_INFO) == "kernels not told by this backend"
    assert kernels(ModelInfo("m", "cpu", "int4", 1, local=LocalModelFacts("hearth", "onnxruntime"))) == \
        "attention kernel hearth, head onnxruntime, matmuls onnxruntime"
    assert kernels(ModelInfo("m", "cpu", "int4", 1, local=LocalModelFacts("hearth", "onnxruntime", "hearth (avx2)"))) \
        .endswith("matmuls hearth (avx2)")
