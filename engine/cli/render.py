"""``hearth-cli render``: the exact prompt a model's chat template makes of OpenAI-shaped messages and tools.

For debugging templates (issue 30): what the server would feed the model for a request, the generation
prompt included. Only the GGUF's header, tokenizer and template are read; the model is not loaded.
``--json`` prints ``{"prompt", "tokens", "template", "tool_format"}`` (README).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from engine.api import render_prompt, terminal_safe, validate_messages
from engine.cli.common import data_paths, read_json_file
from engine.errors import PromptError

MAX_TOOLS_FILE_BYTES = 4 << 20  # a hundred large schemas fit; the engine's own tool checks bound them further
MAX_KWARG_JSON_CHARS = 64 << 10  # as the engine's bound on all of chat_template_kwargs
MAX_MESSAGES, MAX_PARTS = 10_000, 1_000  # as the server bounds a request's messages and a message's parts


def template_kwargs(pairs: list[str]) -> dict[str, Any]:
    """``KEY=JSON`` pairs (``--template-kwarg``) as a dict; a PromptError naming the bad pair otherwise. The
    names and the total are checked by the template's own rule for ``chat_template_kwargs`` when it renders."""
    out: dict[str, Any] = {}
    for pair in pairs:
        key, eq, raw = pair.partition("=")
        if not eq or not key:
            shown = terminal_safe(pair[:80])
            raise PromptError(f"--template-kwarg {shown!r} must be KEY=JSON (for example enable_thinking=false)")
        name = terminal_safe(key[:80])  # as shown in a message
        if key in out:
            raise PromptError(f"--template-kwarg {name} is given twice")
        if len(raw) > MAX_KWARG_JSON_CHARS:
            raise PromptError(f"--template-kwarg {name}: the value is over {MAX_KWARG_JSON_CHARS >> 10} KiB")
        try:
            out[key] = json.loads(raw)
        except RecursionError:
            raise PromptError(f"--template-kwarg {name}: the value is nested too deeply") from None
        except ValueError as exc:
            raise PromptError(f"--template-kwarg {name}: the value is not JSON ({exc}); text needs quotes, "
                              f"as {name}='\"text\"'") from None
    return out


def read_tools(path: str) -> list[dict]:
    data = read_json_file(path, "tools file", MAX_TOOLS_FILE_BYTES)
    if not isinstance(data, list) or not all(isinstance(t, dict) for t in data):
        raise PromptError(f"tools file {path} must hold a JSON list of tool objects "
                          '({"type": "function", "function": {"name", "parameters"}})')
    return data


def openai_messages(path: str) -> list[dict]:
    """The messages file as the server reads a request's messages: ``"content": null`` (an assistant turn with
    only tool calls, as OpenAI's clients send it) is "", a list of ``{"type": "text", "text"}`` parts is their
    text joined, and the ``developer`` role is ``system``; the engine's own rule checks the rest."""
    data = read_json_file(path, "messages file")
    if isinstance(data, list):
        if len(data) > MAX_MESSAGES:
            raise PromptError(f"messages file {path} holds {len(data):,} messages; at most {MAX_MESSAGES:,} are read")
        data = [_as_engine_message(i, m) if isinstance(m, dict) else m for i, m in enumerate(data)]
    validate_messages(data)
    return data


def _as_engine_message(i: int, m: dict) -> dict:
    out = dict(m)
    if out.get("role") == "developer":
        out["role"] = "system"
    content = out.get("content", "")
    if content is None:
        out["content"] = ""
    elif isinstance(content, list):
        if len(content) > MAX_PARTS:
            raise PromptError(f"message {i} has {len(content):,} content parts; at most {MAX_PARTS:,} are read")
        if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str) for p in content):
            raise PromptError(f'message {i} content parts must be {{"type": "text", "text": ...}} objects')
        out["content"] = "".join(p["text"] for p in content)
    return out


def cmd_render(args: argparse.Namespace) -> int:
    # every input is checked before the model file is opened: bad input fails fast
    kwargs = template_kwargs(args.template_kwarg)
    messages = openai_messages(args.messages)
    tools = read_tools(args.tools) if args.tools else None
    rendered = render_prompt(data_paths(args), args.model, messages, tools, kwargs)
    if args.json:
        print(json.dumps({"prompt": rendered.prompt, "tokens": rendered.tokens, "template": rendered.template,
                          "tool_format": rendered.tool_format}, ensure_ascii=False))
    else:  # the text exactly as the model reads it, control characters escaped (a template may write them)
        sys.stdout.write(terminal_safe(rendered.prompt))
        sys.stdout.flush()
    return 0


def add_parser(sub, common: argparse.ArgumentParser, model_options) -> None:
    """``render`` under ``sub`` (cli.build_parser's subcommands)."""
    render = sub.add_parser("render", parents=[common],
                            help="print the prompt the chat template renders for messages and tools (no model load)")
    render.add_argument("--messages", required=True, metavar="FILE.json",
                        help="a JSON list of OpenAI-shaped messages (system, user, assistant with tool_calls, tool)")
    render.add_argument("--tools", metavar="FILE.json", help="a JSON list of OpenAI function tools")
    render.add_argument("--template-kwarg", action="append", default=[], metavar="KEY=JSON",
                        help="a variable for the template, as chat_template_kwargs (repeatable; e.g. "
                             "enable_thinking=false)")
    model_options(render, weights=False)
    render.set_defaults(func=cmd_render)
