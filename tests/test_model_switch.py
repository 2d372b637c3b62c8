"""Moving a chat between models: ``Hearth.switch_model`` and ``hearth-cli chat --model``. Each model's
context of the chat stays on disk beside the other's, so coming back to a model resumes it from disk;
the chat remembers the model it was last used with; a model that cannot load leaves the old one running."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from engine.api import Hearth, resolve_paths, saved_contexts
from engine.errors import HearthError, ModelFileError, ModelNotInstalledError
from engine.model.fetch import default_model
from engine.types import ContextBadge, ContextHealth, ResumeSource, SamplingParams, TurnRequest

from .checkpoint_names import conv_paths
from .test_cli import assert_clean_error, run_cli

GREEDY = SamplingParams.greedy_params()
DEFAULT = default_model().key


@pytest.fixture
def two_model_home(real_home, tiny_dir, tiny_converted, tmp_path) -> Path:
    """A data dir with the real default model and the tiny one, sharing their conversions (no copies)."""
    tiny_converted("int4")
    home = tmp_path / "two-models"
    (home / "converted").mkdir(parents=True)
    (home / "models").symlink_to(real_home / "models")
    for root in (real_home / "converted", tiny_dir / "converted"):
        for folder in root.iterdir():
            if not (home / "converted" / folder.name).exists():
                (home / "converted" / folder.name).symlink_to(folder)
    return home


def ask(hearth: Hearth, text: str, create: bool = False):
    return hearth.run_turn(TurnRequest("c", text, GREEDY, 6), create=create)


@pytest.mark.real_model
def test_a_chat_on_a_then_b_then_a_resumes_a_from_disk(two_model_home, tiny_gguf):
    hearth = Hearth(resolve_paths(two_model_home).ensure(), provider="cpu")
    try:
        a = hearth.load()
        assert hearth.model_key == DEFAULT
        first = ask(hearth, "Hi!", create=True)
        assert first.local.resume.source == ResumeSource.COLD and first.local.save.ok
        assert hearth.conversation_model("c") == DEFAULT

        b = hearth.switch_model(str(tiny_gguf))
        assert b.name == "tiny" and hearth.model is b and hearth.model_key == str(tiny_gguf.resolve())
        # Only the other model has context for the chat: the badge says so and names it.
        assert saved_contexts(hearth).context_states()["c"].badge == ContextBadge.STALE
        assert saved_contexts(hearth).context_states()["c"].model.startswith(a.name)
        status = saved_contexts(hearth).context_status("c")
        assert status.health == ContextHealth.STALE and status.model.startswith(a.name) and a.name in status.message
        second = ask(hearth, "Bye.")
        assert second.local.resume.source == ResumeSource.COLD  # b reads the chat; a's file is neither used nor deleted
        assert hearth.conversation_model("c") == str(tiny_gguf.resolve())
        assert hearth.conversations.require("c").model == b.label
        assert len(conv_paths(hearth.paths.checkpoints, "c")) == 2

        again = hearth.switch_model(None)
        assert again.name == a.name and hearth.model_key == DEFAULT
        assert saved_contexts(hearth).context_states()["c"].badge == ContextBadge.SAVED
        assert saved_contexts(hearth).context_status("c", full=True).health == ContextHealth.VALID
        third = ask(hearth, "Once more?")
        r = third.local.resume
        assert r.source == ResumeSource.DISK and r.reason is None
        assert r.restored_tokens == r.reused_tokens >= first.prompt_tokens  # a's whole first prompt from disk
        assert r.prefilled_tokens == third.prompt_tokens - r.reused_tokens  # only what a has not read
        assert hearth.conversation_model("c") == DEFAULT
        (summary,) = hearth.conversation_summaries(["c"])
        assert summary.model_key == DEFAULT and summary.model == a.label and summary.tokens > 0
    finally:
        hearth.close()


def test_switching_to_a_model_that_cannot_be_found_keeps_the_loaded_one(tiny_home, tiny_gguf, tmp_path):
    hearth = Hearth(resolve_paths(tiny_home).ensure(), model=str(tiny_gguf), provider="cpu")
    try:
        loaded = hearth.load()
        ask(hearth, "hello", create=True)
        with pytest.raises(ModelFileError, match="model file not found"):
            hearth.switch_model(str(tmp_path / "missing.gguf"))
        with pytest.raises(ModelNotInstalledError, match="model fetch gemma-3-270m"):
            hearth.switch_model("gemma-3-270m")  # a catalog model not installed in this data dir
        assert hearth.model is loaded and hearth.model_key == str(tiny_gguf.resolve())
        assert saved_contexts(hearth).context_states()["c"].badge == ContextBadge.LIVE  # nothing was dropped
        assert ask(hearth, "still there?").local.resume.source == ResumeSource.LIVE
    finally:
        hearth.close()


def test_a_model_that_fails_to_load_brings_the_previous_one_back(tiny_home, tiny_gguf, tmp_path):
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"GGUF" + bytes(60))  # found, but not a model
    hearth = Hearth(resolve_paths(tiny_home).ensure(), model=str(tiny_gguf), provider="cpu")
    try:
        hearth.load()
        first = ask(hearth, "hello", create=True)
        with pytest.raises(HearthError):
            hearth.switch_model(str(broken))
        assert hearth.model is not None and hearth.model.name == "tiny" and hearth.model_key == str(tiny_gguf.resolve())
        again = ask(hearth, "and again")  # the live context was saved before the switch: resumed from disk
        assert again.local.resume.source == ResumeSource.DISK and again.local.resume.reused_tokens >= first.prompt_tokens
        assert hearth.conversation_model("c") == str(tiny_gguf.resolve())
    finally:
        hearth.close()


def test_switching_to_the_loaded_model_changes_nothing(tiny_home, tiny_gguf):
    hearth = Hearth(resolve_paths(tiny_home).ensure(), model=str(tiny_gguf), provider="cpu")
    try:
        loaded = hearth.load()
        ask(hearth, "hello", create=True)
        assert hearth.switch_model(str(tiny_gguf)) is loaded
        assert ask(hearth, "more").local.resume.source == ResumeSource.LIVE
    finally:
        hearth.close()


@pytest.mark.real_model
def test_making_a_model_the_default_before_switching_to_it_still_switches(two_model_home, tiny_gguf):
    """The window makes the picked model the library's default and asks the engine to switch, on two
    threads; when the default changed first, the engine took the new default for the model it ran
    ("already loaded") and kept the old one (seen under load in CI)."""
    hearth = Hearth(resolve_paths(two_model_home).ensure(), provider="cpu")  # the library's default model
    try:
        a = hearth.load()
        assert hearth.model_key == DEFAULT
        tiny = hearth.library.add(tiny_gguf).name
        hearth.library.use(tiny)  # the library's thread wins the race
        assert hearth.model_key == DEFAULT and hearth.model is a  # still what is loaded
        b = hearth.switch_model(tiny)
        assert b is not a and b.name == "tiny" and hearth.model_key == tiny
    finally:
        hearth.close()


# hearth-cli chat --model ----------------------------------------------------------------------------------
def chat(home: Path, conversation: str, message: str, *model: str):
    args = ["chat", "--conversation", conversation, "--message", message, "--greedy", "--max-new-tokens", "6",
            "--json", "--provider", "cpu"]
    if model:
        args += ["--model", *model]
    return run_cli(*args, home=home)


def ok(proc) -> dict:
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.mark.real_model
def test_cli_chat_moves_between_models_and_resumes_each_from_disk(two_model_home, tiny_gguf):
    home = two_model_home
    first = ok(chat(home, "c", "Hi!"))
    assert first["model_key"] == DEFAULT and first["resume"]["source"] == "cold"
    moved = chat(home, "c", "Bye.", str(tiny_gguf))
    second = ok(moved)
    assert second["model_key"] == str(tiny_gguf.resolve()) and second["resume"]["source"] == "cold"
    assert f"was last used with {DEFAULT}" in moved.stderr and "tiny int4" in moved.stderr  # says who answers
    back = chat(home, "c", "Once more?", DEFAULT)
    third = ok(back)
    r = third["resume"]
    assert r["source"] == "disk" and r["reason"] is None
    assert r["restored_tokens"] == r["reused_tokens"] >= first["resume"]["prefilled_tokens"]  # a's whole first prompt
    assert "note:" in back.stderr  # b answered last
    # Without --model the chat runs on the model it remembers, and nothing is said.
    fourth_proc = chat(home, "c", "Thanks.")
    fourth = ok(fourth_proc)
    assert fourth["model_key"] == DEFAULT and fourth["resume"]["source"] == "disk" and "note:" not in fourth_proc.stderr

    listing = ok(run_cli("conversations", "ls", "--json", home=home))["conversations"]
    assert [(c["id"], c["model_key"]) for c in listing] == [("c", DEFAULT)]
    assert listing[0]["model"].startswith("SmolLM2")
    assert DEFAULT in run_cli("conversations", "ls", home=home).stdout
    entries = ok(run_cli("kv", "ls", "--json", home=home))["entries"]
    models = {e["model"] for e in entries if e["kind"] == "conversation"}
    assert len(models) == 2 and "tiny int4" in models and not any(e["model_gone"] for e in entries)
    text = run_cli("kv", "ls", home=home).stdout
    assert "tiny int4" in text and "SmolLM2" in text


@pytest.mark.real_model
def test_cli_chat_whose_remembered_model_is_gone_falls_back_and_says_so(two_model_home, tiny_gguf, tmp_path):
    home = two_model_home
    copy = tmp_path / "soon-gone.gguf"
    shutil.copyfile(tiny_gguf, copy)
    assert ok(chat(home, "d", "hello", str(copy)))["model_key"] == str(copy.resolve())
    copy.unlink()
    proc = chat(home, "d", "are you there?")
    out = ok(proc)
    assert out["model_key"] == DEFAULT and out["reply"]
    note = [line for line in proc.stderr.splitlines() if line.startswith("note:")]
    assert len(note) == 1 and "which is not available" in note[0] and str(copy.resolve()) in note[0]
    listing = ok(run_cli("kv", "ls", "--json", home=home))["entries"]
    assert any(e["model_gone"] and e["conversation"] == "d" for e in listing)
    assert "(gone)" in run_cli("kv", "ls", home=home).stdout


def test_cli_chat_with_a_model_that_does_not_exist_is_one_clear_error(tiny_home, tmp_path):
    proc = chat(tiny_home, "e", "hello", str(tmp_path / "nope.gguf"))
    assert_clean_error(proc, "model file not found")


def test_cli_chat_on_a_damaged_database_is_one_clear_error(tiny_home, tiny_gguf):
    (tiny_home / "conversations.sqlite3").write_bytes(b"this is not a database" * 200)
    proc = chat(tiny_home, "e", "hello", str(tiny_gguf))
    assert_clean_error(proc, "is damaged", "hearth-cli db salvage")  # no backup to restore: salvage


def test_talk_continues_a_stored_chat_on_the_model_it_remembers(two_model_home, tiny_gguf):
    home = two_model_home
    assert ok(chat(home, "t", "hello", str(tiny_gguf)))["model_key"] == str(tiny_gguf.resolve())
    proc = subprocess.run([sys.executable, "-m", "engine.cli", "talk", "--conversation", "t", "--data-dir", str(home),
                           "--max-new-tokens", "4"], input="and again\n/quit\n", capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    shown = ok(run_cli("conversations", "ls", "--json", home=home))["conversations"]
    assert [c["model_key"] for c in shown if c["id"] == "t"] == [str(tiny_gguf.resolve())]  # not the default model
