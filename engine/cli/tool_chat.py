"""``hearth-cli chat --tools``: the window's tool loop, headless (issue 33). The enabled tools of the configured
MCP servers (``hearth-cli tools``) are offered — narrowed by the chat's own settings as the window narrows them —
and every call the model makes runs only when ``--allow`` names it: without that it is denied and the model is
told so. ``--json`` lists each step's reply, calls, results and the tokens the step read.

Without ``--message`` the chat's loop is resumed: calls left waiting by an earlier run are settled first (a call
that was running when that run stopped is never run again: the model is told it may have run), then the model
reads the results."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import sys

from engine.api import (
    Backend,
    CallRecord,
    LoopResult,
    LoopStep,
    ToolHost,
    ToolRegistry,
    call_arguments,
    chat_tools,
    load_preferences,
    run_tool_loop,
    terminal_safe,
)
from engine.cli.common import emit, stream_text
from engine.errors import HearthError, PromptError
from engine.types import Finished, Token, ToolChoice, ToolChoiceMode, TurnRequest, Waiting

log = logging.getLogger(__name__)
MAX_ALLOW = 256
RESULT_LINE_CHARS = 160  # a result's first line on stderr; --json carries it whole


def add_arguments(chat: argparse.ArgumentParser) -> None:
    tools = chat.add_argument_group("tools (MCP servers added with 'hearth-cli tools')")
    tools.add_argument("--tools", action="store_true", help="offer the enabled tools and run the loop")
    tools.add_argument("--tool-choice", default="auto", metavar="auto|required|NAME",
                       help="the first reply: the model decides (auto), must call a tool (required) or must call "
                            "NAME; later replies decide for themselves")
    tools.add_argument("--allow", action="append", default=[], metavar="NAME",
                       help="run calls of this tool (its function name, SERVER/TOOL, or SERVER for all its tools); "
                            "repeatable. A call not allowed is denied and the model is told so")
    tools.add_argument("--max-steps", type=int, metavar="N", help="the most replies in the loop (default: Preferences, 10)")
    tools.add_argument("--tool-timeout", type=float, metavar="SECONDS",
                       help="the longest one call may run (default: Preferences, 60)")


def check_arguments(args: argparse.Namespace) -> None:
    """Tool flags without ``--tools`` are a mistake worth saying, not ignoring."""
    if not args.tools:
        used = [flag for flag, on in (("--allow", args.allow), ("--max-steps", args.max_steps is not None),
                                      ("--tool-timeout", args.tool_timeout is not None),
                                      ("--tool-choice", args.tool_choice != "auto")) if on]
        if used:
            raise PromptError(f"{', '.join(used)} only mean something with --tools")
        return
    if len(args.allow) > MAX_ALLOW:
        raise PromptError(f"--allow was given {len(args.allow)} times; at most {MAX_ALLOW}")
    if args.max_steps is not None and not 1 <= args.max_steps <= 50:
        raise PromptError(f"--max-steps must be from 1 to 50, got {args.max_steps}")
    if args.tool_timeout is not None and not 0 < args.tool_timeout <= 600:  # also NaN
        raise PromptError(f"--tool-timeout must be more than 0 and at most 600 seconds, got {args.tool_timeout}")


def tool_choice(text: str) -> ToolChoice:
    if text in ("auto", "none", "required"):
        return ToolChoice(ToolChoiceMode(text))
    return ToolChoice(ToolChoiceMode.FUNCTION, text)


def allowed(call_name: str, specs: list, allow: list[str]) -> bool:
    spec = next((s for s in specs if s.function == call_name), None)
    names = {call_name}
    if spec is not None:
        names |= {spec.server, f"{spec.server}/{spec.name}"}
    return bool(names & set(allow))


def run(args: argparse.Namespace, hearth: Backend, request: TurnRequest) -> int:
    """The loop for ``chat --tools`` on a loaded ``hearth``; its output; the exit code."""
    if not hearth.capabilities.saved_context:
        raise HearthError("--tools runs with local models only: a remote server's model is not offered tools yet")
    prefs = load_preferences(hearth.paths).preferences
    max_steps = args.max_steps or prefs.tool_steps
    timeout = args.tool_timeout or float(prefs.tool_timeout_s)
    host = ToolHost(ToolRegistry(hearth.paths.data))
    try:
        return _run(args, hearth, request, host, max_steps, timeout)
    finally:
        host.close()


def _run(args: argparse.Namespace, hearth: Backend, request: TurnRequest, host: ToolHost, max_steps: int,
         timeout: float) -> int:
    specs = host.tools()
    for status in host.status():
        if str(status.state) == "failed":
            sys.stderr.write(terminal_safe(f"warning: tool server {status.name} could not start: {status.error}") + "\n")
    conv = hearth.conversations.get(request.conversation)
    offered = chat_tools(specs, conv.settings if conv is not None else {})
    choice = tool_choice(args.tool_choice)
    if choice.mode == ToolChoiceMode.FUNCTION and all(s.function != choice.name for s in offered):
        names = ", ".join(s.function for s in offered) or "none"
        raise PromptError(f"--tool-choice {choice.name!r} is not a tool this chat offers (it offers: {names})")
    if choice.mode == ToolChoiceMode.REQUIRED and not offered:
        raise PromptError("--tool-choice required, but no tool is offered: add a server with 'hearth-cli tools add'")
    if args.allow:
        known = {s.function for s in offered} | {s.server for s in offered} | {f"{s.server}/{s.name}" for s in offered}
        unknown = [a for a in args.allow if a not in known]
        if unknown:
            raise PromptError(f"--allow {unknown[0]!r} names no tool this chat offers")
    stream = None if args.json else stream_text

    def on_event(event) -> None:
        if isinstance(event, Waiting):
            sys.stderr.write(f"waiting: conversation {event.conversation} is busy in another Hearth process…\n")
        elif isinstance(event, Token) and stream is not None and event.kind == "content":
            stream(event.text)

    def on_step(step: LoopStep) -> None:
        if args.json:
            return
        if stream is not None:
            print()
        sys.stderr.write(f"[step {step.index}: read {step.read_tokens} tokens, {step.reused_tokens} from the saved "
                         f"context; {step.finished.stop_reason}]\n")
        for record in step.calls:
            sys.stderr.write(terminal_safe(call_line(record)) + "\n")

    result = run_tool_loop(hearth, host, dataclasses.replace(request, tool_choice=choice), offered,
                           lambda call: allowed(call.name, offered, args.allow), max_steps=max_steps,
                           timeout_s=timeout, on_event=on_event, on_step=on_step, create=True)
    if args.json:
        emit(args, loop_payload(hearth, result, offered), "")
    else:
        for record in result.resumed:
            sys.stderr.write(terminal_safe("resumed: " + call_line(record)) + "\n")
        if result.ended == "step_limit":
            sys.stderr.write(f"note: the loop stopped after {max_steps} steps (--max-steps)\n")
    return 0


def call_line(record: CallRecord) -> str:
    verdict = "ran" if record.allowed else "not run"
    if record.outcome is not None and record.outcome.is_error:
        verdict = "failed"
    first = record.result.splitlines()[0] if record.result else ""
    if len(first) > RESULT_LINE_CHARS:
        first = first[:RESULT_LINE_CHARS] + "…"
    return f"  tool {record.call.name} {record.call.arguments[:RESULT_LINE_CHARS]} → {verdict}: {first}"


def record_json(record: CallRecord) -> dict:
    outcome = record.outcome
    return {"id": record.call.id, "name": record.call.name, "arguments": call_arguments(record.call),
            "allowed": record.allowed, "result": record.result,
            "is_error": bool(outcome.is_error) if outcome is not None else not record.allowed,
            "cut_from": outcome.cut_from if outcome is not None else None,
            "elapsed_ms": outcome.elapsed_ms if outcome is not None else None}


def step_json(step: LoopStep) -> dict:
    f: Finished = step.finished
    return {"index": step.index, "reply": f.reply, "reasoning": f.reasoning, "stop_reason": str(f.stop_reason),
            "prompt_tokens": f.prompt_tokens, "read_tokens": step.read_tokens, "reused_tokens": step.reused_tokens,
            "resume_source": str(f.local.resume.source) if f.local is not None else None,
            "new_tokens": len(f.tokens), "timings": f.timings.as_dict(),
            "tool_calls": [record_json(r) for r in step.calls]}


def loop_payload(hearth: Backend, result: LoopResult, offered: list) -> dict:
    last = result.steps[-1].finished
    return {"conversation": last.conversation, "reply": last.reply, "stored": True, "ended": result.ended,
            "tools": [{"function": s.function, "server": s.server, "tool": s.name} for s in offered],
            "resumed": [record_json(r) for r in result.resumed],
            "steps": [step_json(s) for s in result.steps],
            "context": {"tokens": last.context_tokens, "limit": last.context_limit},
            "model": last.model.label, "model_key": hearth.model_key}
