"""Preferences: the defaults every chat starts from, kept in ``preferences.json`` in the data dir.

A turn's settings come from three places, most specific first (``effective_settings``): the chat's own
values (its ``settings``), the values its model recommends (the library's per-model defaults), then
these preferences. The file is read as untrusted input: a damaged one gives the defaults and says so
(the file kept aside), an out-of-range value is clamped and named, a value of the wrong kind is
replaced by its default. Saving refuses what reading would have to repair.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from engine.errors import PreferencesError
from engine.fsutil import atomic_write, open_regular
from engine.paths import HearthPaths
from engine.types import DEFAULT_MAX_NEW_TOKENS, SamplingParams

log = logging.getLogger(__name__)

PREFERENCES_FILE = "preferences.json"
FORMAT_VERSION = 1
MAX_FILE_BYTES = 64 * 1024  # a real file is well under 1 KiB: a larger one is not Hearth's
MAX_SYSTEM_PROMPT_CHARS = 16_000
CONTEXT_POLICIES = ("stop", "drop_oldest")  # a full context stops the reply, or drops the oldest messages
# The settings a chat, a model or the preferences may give, with their bounds (the dialogs' ranges too).
SETTING_LIMITS: dict[str, tuple[float, float]] = {
    "temperature": (0.0, 2.0),
    "top_p": (0.01, 1.0),
    "top_k": (0, 1000),
    "min_p": (0.0, 0.99),
    "repeat_penalty": (0.5, 2.0),
    "max_new_tokens": (1, 8192),
    "prompt_lookup": (0, 64),  # draft tokens per verification pass (engine/lookup.py); 0 = off
}
# The tool loop's bounds (issue 33): Preferences only, not a chat's settings. LM Studio and Jan stop an agent's
# loop after a count of steps; 10 is enough for a look-up chain and stops a model that calls the same tool forever.
TOOL_LIMITS = {
    "tool_steps": (1, 50),  # model replies in one message's tool loop
    "tool_timeout_s": (1, 600),  # one tool call, in seconds
}
_LIMITS = {**SETTING_LIMITS, **TOOL_LIMITS}
WHOLE_NUMBERS = frozenset({"top_k", "max_new_tokens", "prompt_lookup", *TOOL_LIMITS})
# The engine's names for settings chats store under shorter ones (a model's defaults may use either).
ALIASES = {"repetition_penalty": "repeat_penalty"}


def _sampling_default(name: str) -> float | int:
    return getattr(SamplingParams(), name)


@dataclass(frozen=True)
class Preferences:
    """The defaults for every chat: a new chat's system prompt, sampling, the longest reply and what
    happens when the context is full."""

    system_prompt: str = ""
    temperature: float = _sampling_default("temperature")
    top_p: float = _sampling_default("top_p")
    top_k: int = _sampling_default("top_k")
    min_p: float = _sampling_default("min_p")
    repeat_penalty: float = _sampling_default("repetition_penalty")
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS
    prompt_lookup: int = _sampling_default("prompt_lookup")
    context_policy: str = "stop"
    tool_steps: int = 10
    tool_timeout_s: int = 60

    def settings(self) -> dict:
        """What a chat inherits, under the keys a chat's own ``settings`` use (no seed: random)."""
        values = {key: getattr(self, key) for key in SETTING_LIMITS}
        return {**values, "context_policy": self.context_policy, "seed": None}

    def validate(self) -> None:
        """PreferencesError naming the first value that cannot be kept."""
        for key in _LIMITS:
            check_setting(key, getattr(self, key))
        check_context_policy(self.context_policy)
        if not isinstance(self.system_prompt, str):
            raise PreferencesError("the system prompt must be text")
        if len(self.system_prompt) > MAX_SYSTEM_PROMPT_CHARS:
            raise PreferencesError(f"the system prompt is {len(self.system_prompt):,} characters; "
                                   f"the most is {MAX_SYSTEM_PROMPT_CHARS:,}")


@dataclass(frozen=True)
class LoadedPreferences:
    preferences: Preferences
    problems: tuple[str, ...] = ()  # what was wrong with the file and what was used instead, one line each


def check_setting(key: str, value: object) -> float | int:
    """``value`` for setting ``key`` if it is a number of the right kind within its bounds, else
    PreferencesError saying which bound."""
    lo, hi = _LIMITS[key]
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise PreferencesError(f"{key} must be a number, not {value!r}")
    if key in WHOLE_NUMBERS and value != int(value):
        raise PreferencesError(f"{key} must be a whole number, not {value!r}")
    if not lo <= value <= hi:
        raise PreferencesError(f"{key} must be between {lo:g} and {hi:g}, not {value:g}")
    return int(value) if key in WHOLE_NUMBERS else float(value)


def check_context_policy(value: object) -> str:
    if value not in CONTEXT_POLICIES:
        raise PreferencesError(f"context_policy must be one of {', '.join(CONTEXT_POLICIES)}, not {value!r}")
    return str(value)


def preferences_path(paths: HearthPaths) -> Path:
    return paths.data / PREFERENCES_FILE


# reading -------------------------------------------------------------------------------------------------
def read_preferences(path: Path) -> LoadedPreferences:
    """The preferences in ``path``; the defaults when it does not exist. Never raises for its content:
    a damaged file is kept aside (``<name>.corrupt``) and reported in ``problems``."""
    path = Path(path)
    try:
        with open_regular(path) as fh:  # a FIFO would hang the read
            raw = fh.read(MAX_FILE_BYTES + 1)
    except FileNotFoundError:
        return LoadedPreferences(Preferences())
    except OSError as exc:
        return _defaults_because(f"{path.name} could not be read ({exc.strerror or exc})")
    if len(raw) > MAX_FILE_BYTES:
        return _set_aside(path, f"{path.name} is larger than {MAX_FILE_BYTES // 1024} KiB, so it is not a preferences "
                                "file")
    try:
        document = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:  # RecursionError: lists nested thousands deep
        return _set_aside(path, f"{path.name} is not valid JSON ({exc})")
    if not isinstance(document, dict):
        return _set_aside(path, f"{path.name} does not hold an object of settings")
    return _from_document(document, path.name)


def _from_document(document: dict, name: str) -> LoadedPreferences:
    defaults, values, problems = Preferences(), {}, []
    for key in _LIMITS:
        if key in document:
            values[key], problem = _repaired(key, document[key], getattr(defaults, key))
            if problem:
                problems.append(f"{name}: {problem}")
    if "context_policy" in document:
        try:
            values["context_policy"] = check_context_policy(document["context_policy"])
        except PreferencesError as exc:
            problems.append(f"{name}: {exc}; using {defaults.context_policy!r}")
    if "system_prompt" in document:
        prompt = document["system_prompt"]
        if not isinstance(prompt, str):
            problems.append(f"{name}: the system prompt is not text; using none")
        elif len(prompt) > MAX_SYSTEM_PROMPT_CHARS:
            problems.append(f"{name}: the system prompt is longer than {MAX_SYSTEM_PROMPT_CHARS:,} characters; "
                            "using the first part")
            values["system_prompt"] = prompt[:MAX_SYSTEM_PROMPT_CHARS]
        else:
            values["system_prompt"] = prompt
    for problem in problems:
        log.warning("%s", problem)
    return LoadedPreferences(dataclasses.replace(defaults, **values), tuple(problems))


def _repaired(key: str, value: object, default: float | int) -> tuple[float | int, str]:
    """(the value to use, what was wrong or ""): out of range → the nearest bound; not a number → the default."""
    try:
        return check_setting(key, value), ""
    except PreferencesError:
        pass
    lo, hi = _LIMITS[key]
    if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value):
        return default, f"{key} {value!r} is not a number; using the default, {default:g}"
    nearest = min(max(value, lo), hi)
    nearest = int(round(nearest)) if key in WHOLE_NUMBERS else float(nearest)
    if lo <= value <= hi:  # in range, but a whole number was wanted
        return nearest, f"{key} {value:g} is not a whole number; using {nearest}"
    return nearest, f"{key} {value:g} is outside {lo:g}–{hi:g}; using {nearest:g}"


def _defaults_because(problem: str) -> LoadedPreferences:
    log.warning("preferences: %s; using the defaults", problem)
    return LoadedPreferences(Preferences(), (f"{problem}; the defaults are used",))


def _set_aside(path: Path, problem: str) -> LoadedPreferences:
    """Keep a damaged file as ``<name>.corrupt`` (saving would replace it) and use the defaults."""
    aside = path.with_name(path.name + ".corrupt")
    try:
        os.replace(path, aside)
    except OSError as exc:
        log.warning("could not keep %s aside: %s", path, exc)
        return _defaults_because(problem)
    return _defaults_because(f"{problem} (kept as {aside.name})")


# writing -------------------------------------------------------------------------------------------------
def write_preferences(path: Path, prefs: Preferences) -> None:
    """Replace ``path`` atomically (a private file, 0600); PreferencesError, writing nothing, for a bad value."""
    prefs.validate()
    document = {"version": FORMAT_VERSION, **dataclasses.asdict(prefs)}
    with atomic_write(Path(path)) as fh:
        fh.write(json.dumps(document, indent=2, ensure_ascii=False).encode("utf-8"))


# precedence ----------------------------------------------------------------------------------------------
def recommended_values(model_defaults: Mapping) -> dict:
    """The model's recommended values that count, under the keys a chat's settings use: known settings
    within bounds (another is ignored, logged). These beat Preferences (``effective_settings``)."""
    values = {}
    for key, value in model_defaults.items():
        key = ALIASES.get(key, key)
        try:
            if key in SETTING_LIMITS:
                values[key] = check_setting(key, value)
            elif key == "context_policy":
                values[key] = check_context_policy(value)
            else:
                log.debug("a model default %r is not a setting; ignored", key)
        except PreferencesError as exc:
            log.warning("a model's recommended %s is ignored: %s", key, exc)
    return values


def effective_settings(global_prefs: Preferences, model_defaults: Mapping, chat_overrides: Mapping) -> dict:
    """A chat's settings for a turn: its own values, over its model's recommended values, over the
    preferences (chat > model > global). A model's value that is not a known setting within bounds is
    ignored (logged); a chat's values pass as they are, so a bad one is reported when the turn is built."""
    settings = {**global_prefs.settings(), **recommended_values(model_defaults)}
    for key, value in chat_overrides.items():
        settings[ALIASES.get(key, key)] = value
    return settings
