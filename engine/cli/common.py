"""What every ``hearth-cli`` command shares: progress on stderr, output, paths, sampling flags.

The command modules (``main.py``, ``store.py``, ``library.py``, ``hub.py``, ``bundle.py``, ``render.py``,
``terminal_chat.py``) import this one and never each other, except ``main.py``, which builds the parser over all of them.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

from engine.api import (
    DEFAULT_MAX_NEW_TOKENS,
    PROVIDER_CHOICES,
    Backend,
    HearthPaths,
    RemoteRegistry,
    open_regular,
    open_remote,
    resolve_paths,
    split_model_key,
    terminal_safe,
    validate_messages,
)
from engine.errors import PromptError
from engine.types import SamplingParams, SetupProgress

MAX_MESSAGES_BYTES = 64 << 20  # generate --messages: far more than any context holds


class Progress:
    """A one-line progress meter on stderr; quiet when stderr is not a terminal except at 100%."""

    def __init__(self, label: str, unit: str = ""):
        self.label, self.unit = terminal_safe(label), unit  # a label may hold a file's name
        self.tty = sys.stderr.isatty()
        self._last = -1
        self._width = 0  # the longest line written since the last newline

    def setup(self, progress: SetupProgress) -> None:
        """As a ``Hearth.load`` / ``fetch_default_model`` progress callback. Steps of unknown length
        (checking the file, starting the model) come on every load, converted or not: not shown."""
        if progress.total:
            self(progress.done, progress.total, progress.step)

    def __call__(self, done: int, total: int, step: str = "") -> None:
        pct = int(done * 100 / total) if total else -1
        if pct == self._last:
            return
        self._last = pct
        amount = f"{done >> 20} MiB" if self.unit == "bytes" else f"{done}/{total}"
        if self.tty:
            end = "\n" if total and done >= total else ""
            line = f"{self.label}: {pct if pct >= 0 else '?'}% ({step or amount})"
            sys.stderr.write("\r" + line.ljust(self._width) + end)  # padded over a longer step's text
            self._width = 0 if end else max(self._width, len(line))
            sys.stderr.flush()
        elif total and done >= total:
            sys.stderr.write(f"{self.label}: done ({amount})\n")


def emit(args: argparse.Namespace, payload: dict[str, Any], human: str) -> None:
    """The JSON payload exactly, or the human text with its control characters escaped (stored text in it
    may carry terminal escapes)."""
    print(json.dumps(payload, ensure_ascii=False) if args.json else terminal_safe(human))


def stream_text(text: str) -> None:
    """Write a piece of a reply as it comes, control characters escaped as in :func:`emit`."""
    sys.stdout.write(terminal_safe(text))
    sys.stdout.flush()


def data_paths(args: argparse.Namespace) -> HearthPaths:
    return resolve_paths(args.data_dir).ensure()


def remote_backend(paths: HearthPaths, model: str | None) -> Backend | None:
    """The remote backend for ``--model NAME/MODEL`` of an added server; None for a local model. A NAME/MODEL
    whose NAME is no added server (and that is no file) is refused in words naming the servers there are."""
    if not model:
        return None
    remote = open_remote(paths, model)
    if remote is not None:
        return remote
    split = split_model_key(model)
    if split is not None and not model.endswith(".gguf") and not Path(model).expanduser().exists():
        RemoteRegistry(paths.data).get(split[0])  # raises: there is no server of that name
    return None


def read_json_file(path: str, what: str, cap: int = MAX_MESSAGES_BYTES) -> Any:
    """The JSON value in the file at ``path`` (at most ``cap`` bytes); a PromptError naming ``what`` ("messages
    file") and the problem otherwise."""
    try:
        with open_regular(Path(path)) as fh:  # a FIFO would hang the read
            raw = fh.read(cap + 1)
        if len(raw) > cap:
            raise PromptError(f"{what} {path} is over {size_text(cap)}")
        return json.loads(raw.decode("utf-8"))
    except FileNotFoundError:
        raise PromptError(f"{what} not found: {path}") from None
    except OSError as exc:  # strerror alone: "[Errno 22] …: 'path'" says the path twice, in Python's words
        raise PromptError(f"cannot read {what} {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise PromptError(f"cannot read {what} {path}: it is not UTF-8 text ({exc.reason})") from None
    except RecursionError:  # nested thousands deep: the parser's guard
        raise PromptError(f"{what} {path} is nested too deeply") from None
    except ValueError as exc:
        raise PromptError(f"{what} {path} is not valid JSON: {exc}") from None


def size_text(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 else f"{n >> 10} KiB"


def read_messages(path: str) -> list[dict]:
    data = read_json_file(path, "messages file")
    validate_messages(data)
    return data


def sampling_from_args(args: argparse.Namespace) -> SamplingParams:
    lookup = getattr(args, "prompt_lookup", 0)
    if args.greedy:
        params = dataclasses.replace(SamplingParams.greedy_params(), prompt_lookup=lookup)
        params.validate()
        return params
    defaults = SamplingParams()
    params = SamplingParams(
        temperature=defaults.temperature if args.temperature is None else args.temperature,
        top_k=defaults.top_k if args.top_k is None else args.top_k,
        top_p=defaults.top_p if args.top_p is None else args.top_p,
        min_p=defaults.min_p if args.min_p is None else args.min_p,
        repetition_penalty=defaults.repetition_penalty if args.repeat_penalty is None else args.repeat_penalty,
        seed=args.seed,
        prompt_lookup=lookup,
    )
    params.validate()
    return params


def lookup_figures(timings: dict) -> str:
    """"; 40 of 52 drafted tokens accepted" when prompt lookup drafted any, else ""."""
    if not timings.get("drafted_tokens"):
        return ""
    return f"; {timings['accepted_tokens']} of {timings['drafted_tokens']} drafted tokens accepted"


def sampling_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--max-new-tokens", type=int, default=DEFAULT_MAX_NEW_TOKENS,
                   help="the longest reply in tokens (default: %(default)s)")
    p.add_argument("--greedy", action="store_true", help="always take the most likely token")
    p.add_argument("--temperature", type=float)
    p.add_argument("--top-p", type=float)
    p.add_argument("--top-k", type=int)
    p.add_argument("--min-p", type=float)
    p.add_argument("--repeat-penalty", type=float)
    p.add_argument("--seed", type=int, help="the same seed reproduces the same reply")
    p.add_argument("--prompt-lookup", type=int, default=0, metavar="N",
                   help="prompt-lookup decoding: draft up to N tokens from earlier context and verify them "
                        "in one pass (0 = off, the default; up to 64). Pays when the reply repeats the "
                        "prompt, e.g. editing a file; slows ordinary chat")
    p.add_argument("--provider", choices=PROVIDER_CHOICES, default="auto")


