"""Preferences: the file round trip, damaged and out-of-range files, and the chat > model > global rule."""

from __future__ import annotations

import dataclasses
import json
import stat

import pytest

from engine.api import Preferences, effective_settings, load_preferences, save_preferences
from engine.errors import PreferencesError
from engine.paths import resolve_paths
from engine.preferences import MAX_FILE_BYTES, preferences_path


@pytest.fixture
def paths(tmp_path):
    return resolve_paths(tmp_path / "home").ensure()


def test_no_file_gives_the_defaults(paths):
    loaded = load_preferences(paths)
    assert loaded.preferences == Preferences() and loaded.problems == ()
    assert Preferences().temperature == 0.7 and Preferences().context_policy == "stop"


def test_round_trip_is_atomic_and_private(paths):
    prefs = Preferences(system_prompt="Answer in French. ✓", temperature=0.25, top_p=0.8, top_k=12, min_p=0.1,
                        repeat_penalty=1.3, max_new_tokens=64, context_policy="drop_oldest")
    save_preferences(paths, prefs)
    path = preferences_path(paths)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert [p.name for p in path.parent.iterdir() if p.name.startswith(".preferences")] == []  # no temp file left
    assert load_preferences(paths).preferences == prefs
    assert json.loads(path.read_text())["version"] == 1


@pytest.mark.parametrize("content", [b"{not json", b"\xff\xfe garbage", b"[1, 2, 3]", b"null",
                                     b"{" + b" " * MAX_FILE_BYTES + b"}"])
def test_a_damaged_file_gives_the_defaults_and_is_kept_aside(paths, content):
    path = preferences_path(paths)
    path.write_bytes(content)
    loaded = load_preferences(paths)
    assert loaded.preferences == Preferences()
    assert len(loaded.problems) == 1 and "preferences.json" in loaded.problems[0]
    assert "kept as preferences.json.corrupt" in loaded.problems[0] and "defaults" in loaded.problems[0]
    assert path.with_name("preferences.json.corrupt").read_bytes() == content  # what was there is not lost
    assert not path.exists()
    save_preferences(paths, Preferences(temperature=0.3))  # and saving afresh works
    assert load_preferences(paths) .preferences.temperature == 0.3


def test_an_unreadable_file_gives_the_defaults(paths):
    preferences_path(paths).mkdir()  # a directory where the file should be: reading fails
    loaded = load_preferences(paths)
    assert loaded.preferences == Preferences() and "could not be read" in loaded.problems[0]


def test_out_of_range_values_are_clamped_and_wrong_kinds_replaced(paths):
    preferences_path(paths).write_text(json.dumps({
        "temperature": 9.5, "top_p": 0, "top_k": 12.5, "min_p": "lots", "repeat_penalty": True,
        "max_new_tokens": -4, "context_policy": "panic", "system_prompt": 42, "unknown": 1}))
    loaded = load_preferences(paths)
    p = loaded.preferences
    assert (p.temperature, p.top_p, p.top_k, p.max_new_tokens) == (2.0, 0.01, 12, 1)
    assert (p.min_p, p.repeat_penalty, p.context_policy, p.system_prompt) == (0.05, 1.1, "stop", "")
    text = "\n".join(loaded.problems)
    for said in ("temperature 9.5 is outside 0–2; using 2", "top_p 0 is outside 0.01–1; using 0.01",
                 "top_k 12.5 is not a whole number; using 12", "min_p 'lots' is not a number; using the default, 0.05",
                 "repeat_penalty True is not a number", "max_new_tokens -4 is outside 1–8192; using 1",
                 "context_policy must be one of stop, drop_oldest, not 'panic'", "system prompt is not text"):
        assert said in text
    assert len(loaded.problems) == 8  # the unknown key is no problem (a newer Hearth may write more)


def test_a_very_long_system_prompt_is_cut_when_read_and_refused_when_saved(paths):
    preferences_path(paths).write_text(json.dumps({"system_prompt": "x" * 20_000}))
    loaded = load_preferences(paths)
    assert len(loaded.preferences.system_prompt) == 16_000 and "longer than" in loaded.problems[0]
    with pytest.raises(PreferencesError, match="the most is 16,000"):
        save_preferences(paths, Preferences(system_prompt="x" * 16_001))


@pytest.mark.parametrize(("change", "message"), [
    ({"temperature": 2.5}, "temperature must be between 0 and 2, not 2.5"),
    ({"top_k": 3.5}, "top_k must be a whole number"),
    ({"max_new_tokens": 0}, "max_new_tokens must be between 1 and 8192, not 0"),
    ({"top_p": float("nan")}, "top_p must be a number"),
    ({"context_policy": "wrap"}, "context_policy must be one of stop, drop_oldest"),
])
def test_saving_refuses_a_bad_value_and_keeps_the_file(paths, change, message):
    save_preferences(paths, Preferences(temperature=0.4))
    with pytest.raises(PreferencesError, match=message):
        save_preferences(paths, dataclasses.replace(Preferences(), **change))
    assert load_preferences(paths).preferences == Preferences(temperature=0.4)


def test_precedence_is_chat_then_model_then_global():
    prefs = Preferences(temperature=0.9, top_k=30, max_new_tokens=100, context_policy="drop_oldest")
    model = {"temperature": 0.2, "top_k": 20}
    chat = {"temperature": 0.5}
    s = effective_settings(prefs, model, chat)
    assert (s["temperature"], s["top_k"], s["max_new_tokens"], s["context_policy"]) == (0.5, 20, 100, "drop_oldest")
    assert effective_settings(prefs, model, {})["temperature"] == 0.2
    assert effective_settings(prefs, {}, {})["temperature"] == 0.9
    assert effective_settings(prefs, {}, {"context_policy": "stop"})["context_policy"] == "stop"
    assert s["seed"] is None  # no global seed: random unless the chat sets one


def test_a_bad_model_default_is_ignored_and_the_engine_name_is_understood():
    s = effective_settings(Preferences(), {"temperature": 7.0, "repetition_penalty": 1.25, "flavour": "mint",
                                           "top_k": "many"}, {})
    assert s["temperature"] == 0.7 and s["repeat_penalty"] == 1.25 and s["top_k"] == 40 and "flavour" not in s


def test_a_chat_value_passes_as_it_is_so_the_turn_can_report_it():
    assert effective_settings(Preferences(), {}, {"temperature": "warm"})["temperature"] == "warm"


# tool use (issue 33): two plain preferences, not chat settings ------------------------------------------
def test_the_tool_limits_default_round_trip_and_are_no_chat_setting(paths):
    assert (Preferences().tool_steps, Preferences().tool_timeout_s) == (10, 60)
    save_preferences(paths, Preferences(tool_steps=3, tool_timeout_s=600))
    loaded = load_preferences(paths)
    assert (loaded.preferences.tool_steps, loaded.preferences.tool_timeout_s) == (3, 600) and loaded.problems == ()
    assert "tool_steps" not in Preferences().settings() and "tool_timeout_s" not in Preferences().settings()


def test_an_older_file_without_the_tool_limits_gives_their_defaults(paths):
    preferences_path(paths).write_text(json.dumps({"version": 1, "temperature": 0.4, "context_policy": "stop"}))
    loaded = load_preferences(paths)
    assert loaded.problems == () and loaded.preferences == Preferences(temperature=0.4)


def test_bad_tool_limits_in_the_file_are_clamped_or_replaced(paths):
    preferences_path(paths).write_text(json.dumps({"tool_steps": 500, "tool_timeout_s": "soon"}))
    loaded = load_preferences(paths)
    assert (loaded.preferences.tool_steps, loaded.preferences.tool_timeout_s) == (50, 60)
    text = "\n".join(loaded.problems)
    assert "tool_steps 500 is outside 1–50; using 50" in text
    assert "tool_timeout_s 'soon' is not a number; using the default, 60" in text
    preferences_path(paths).write_text(json.dumps({"tool_steps": 2.5, "tool_timeout_s": 0}))
    loaded = load_preferences(paths)
    assert (loaded.preferences.tool_steps, loaded.preferences.tool_timeout_s) == (2, 1)
    assert "tool_steps 2.5 is not a whole number; using 2" in loaded.problems[0]
    assert "tool_timeout_s 0 is outside 1–600; using 1" in loaded.problems[1]


@pytest.mark.parametrize(("change", "message"), [
    ({"tool_steps": 0}, "tool_steps must be between 1 and 50, not 0"),
    ({"tool_steps": 51}, "tool_steps must be between 1 and 50, not 51"),
    ({"tool_steps": 2.5}, "tool_steps must be a whole number"),
    ({"tool_steps": True}, "tool_steps must be a number"),
    ({"tool_timeout_s": 601}, "tool_timeout_s must be between 1 and 600, not 601"),
    ({"tool_timeout_s": float("inf")}, "tool_timeout_s must be a number"),
    ({"tool_timeout_s": "60"}, "tool_timeout_s must be a number"),
])
def test_saving_refuses_a_bad_tool_limit(paths, change, message):
    save_preferences(paths, Preferences(tool_steps=4))
    with pytest.raises(PreferencesError, match=message):
        save_preferences(paths, dataclasses.replace(Preferences(), **change))
    assert load_preferences(paths).preferences == Preferences(tool_steps=4)
