"""The grammar that makes a reply a tool call (``tool_choice`` required, or a named function), so its
arguments are valid against the tool's JSON schema by construction.

An llguidance lark grammar: an optional thinking block (bounded in tokens), then one call, or one or more
when calls may be parallel, written in the template's own format (reply_format.py), each call's arguments
a ``%json`` value of its tool's schema. JSON is written with ", " and ": " and no other whitespace: what
``json.dumps`` and a template's ``tojson`` write, so the history a client sends back renders to the same
bytes the model wrote.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

from engine.errors import PromptError
from engine.text.constrained import ConstraintError
from engine.text.reply_format import (
    LLAMA3_JSON,
    MISTRAL,
    MISTRAL_ARGS,
    MISTRAL_ARGS_MARK,
    MISTRAL_CALLS,
    TOOL_CALL_CLOSE,
    TOOL_CALL_OPEN,
    ReplyFormat,
    check_tool_choice,
    check_tools,
)
from engine.text.reply_parse import MAX_CALLS
from engine.types import ToolChoice, ToolChoiceMode

# Compact JSON with json.dumps's separators: no free whitespace, so a small model cannot wander off
JSON_OPTIONS = {"item_separator": ", ", "key_separator": ": ", "whitespace_flexible": False}
THINK_SEPARATOR = "\n\n"  # Qwen3 and the R1 distills write a blank line after </think>
CHARS_PER_TOKEN = 4  # the thinking budget is enforced in characters: about this many per token


def tool_grammar(fmt: ReplyFormat, tools: Sequence[Mapping], choice: ToolChoice, parallel: bool, *,
                 think: bool, think_budget: int | None = None, think_first: bool = False) -> str | None:
    """The llguidance grammar for ``choice`` (None for auto and none: the model decides, unconstrained).

    ``think``: the prompt left a thinking block open, so the reply starts in it; otherwise a template that
    thinks may open one, and must when ``think_first`` (thinking asked for: ``enable_thinking`` true, as Qwen3
    in thinking mode always opens its block). ``think_budget`` bounds the thinking in tokens (None: only the reply's
    max_tokens). Raises PromptError for bad tools or choice, ConstraintError for a schema llguidance
    cannot compile."""
    import llguidance

    mode = ToolChoiceMode(choice.mode) if isinstance(choice, ToolChoice) else None
    if mode in (ToolChoiceMode.AUTO, ToolChoiceMode.NONE):
        return None
    checked = check_tools(tools)
    choice = check_tool_choice(choice, checked)
    if think_budget is not None and (not isinstance(think_budget, int) or think_budget < 1):
        raise PromptError(f"the thinking budget must be a positive number of tokens, not {think_budget!r}")
    chosen = [t for t in checked if choice.mode != ToolChoiceMode.FUNCTION or t["function"]["name"] == choice.name]
    lark = _lark(fmt, chosen, parallel, think, think_budget, think_first)
    grammar = llguidance.LLMatcher.grammar_from_lark(lark)
    is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar)
    if is_error:
        raise ConstraintError(f"the tools' schemas cannot be used for a constrained call: {_first_line(messages)}")
    return grammar


def thinking_grammar(fmt: ReplyFormat, *, think: bool, think_budget: int, think_first: bool = False) -> str | None:
    """A grammar that only bounds the thinking (Anthropic's ``thinking.budget_tokens`` on a reply that is not a
    forced call): the thinking block at most ``think_budget`` tokens (in characters, as ``tool_grammar``), then
    any text. None for a template that does not think."""
    import llguidance

    if not fmt.thinks:
        return None
    if isinstance(think_budget, bool) or not isinstance(think_budget, int) or think_budget < 1:
        raise PromptError(f"the thinking budget must be a positive number of tokens, not {think_budget!r}")
    rules = _think_rules(fmt, think, think_budget, think_first)
    lark = "\n".join([f"start: {rules[0]}rest", "rest: /(.|\\n)*/", *rules[1:]]) + "\n"
    grammar = llguidance.LLMatcher.grammar_from_lark(lark)
    is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar)
    if is_error:
        raise ConstraintError(f"the thinking budget cannot be applied: {_first_line(messages)}")
    return grammar


def _think_rules(fmt: ReplyFormat, think: bool, think_budget: int | None, think_first: bool) -> list[str]:
    """[the start rule's lead, then the thinking rules] ("" and none for a template that does not think)."""
    if not fmt.thinks:
        return [""]
    # A lazy lexeme that ends at the first closing marker, at most a budget's worth of characters after
    # the opening one, so the budget forces the marker (a token-counted lexeme would end without it).
    reach = "*" if think_budget is None else f"{{0,{think_budget * CHARS_PER_TOKEN}}}"
    rules = [f"think_body[lazy]: /(.|\\n){reach}{_regex(fmt.think_close)}/", f"think_tail: {_q(THINK_SEPARATOR)}"]
    if think:
        lead = "think_body think_tail "
    elif think_first:
        lead = f"{_q(fmt.think_open)} think_body think_tail "
    else:
        lead = f"({_q(fmt.think_open)} think_body think_tail)? "
    return [lead, *rules]


def _lark(fmt: ReplyFormat, tools: list[dict], parallel: bool, think: bool, think_budget: int | None,
          think_first: bool = False) -> str:
    lead, *rules = _think_rules(fmt, think, think_budget, think_first)
    first, sep, last = _frame(fmt)
    more = (f" ({_q(sep)} call){{0,{MAX_CALLS - 1}}}" if sep else f" call{{0,{MAX_CALLS - 1}}}") if parallel else ""
    rules.insert(0, f"start: {lead}{_join(first, 'call' + more, last)}")
    rules.append("call: " + " | ".join(f"call_{i}" for i in range(len(tools))))
    for i, tool in enumerate(tools):
        name = tool["function"]["name"]
        head, tail = _call_frame(fmt, name)
        rules.append(f"call_{i}: {_q(head)} args_{i}" + (f" {_q(tail)}" if tail else ""))
        rules.append(f"args_{i}: %json {json.dumps(_schema(tool), ensure_ascii=False)}")
    return "\n".join(rules) + "\n"


def _frame(fmt: ReplyFormat) -> tuple[str, str, str]:
    """What comes before the calls, between two calls, and after them."""
    if fmt.tool_style == MISTRAL:
        return MISTRAL_CALLS + "[", ", ", "]"
    if fmt.tool_style == MISTRAL_ARGS:
        return "", "", ""  # each call brings its own marker
    if fmt.tool_style == LLAMA3_JSON:
        return "", "; ", ""
    return "", "\n", ""  # hermes and the fallback: one tagged call after another


def _call_frame(fmt: ReplyFormat, name: str) -> tuple[str, str]:
    """The text around one call's arguments."""
    if fmt.tool_style == LLAMA3_JSON:
        return f'{{"name": "{name}", "parameters": ', "}"
    if fmt.tool_style == MISTRAL:
        return f'{{"name": "{name}", "arguments": ', "}"
    if fmt.tool_style == MISTRAL_ARGS:
        return f"{MISTRAL_CALLS}{name}{MISTRAL_ARGS_MARK}", ""
    return f'{TOOL_CALL_OPEN}\n{{"name": "{name}", "arguments": ', f"}}\n{TOOL_CALL_CLOSE}"


def _schema(tool: dict) -> dict:
    schema = _closed(dict(tool["function"].get("parameters") or {}), 0)
    schema.setdefault("type", "object")  # check_tools refused any other type
    schema["x-guidance"] = JSON_OPTIONS
    return schema


MAX_SCHEMA_DEPTH = 64  # check_tools bounds a schema's bytes; this bounds the walk below


def _closed(schema: object, depth: int) -> object:
    """``schema`` with every object that does not say otherwise closed (``additionalProperties: false``, as
    OpenAI's strict tools are): JSON Schema's default lets a call carry any extra key, and a small model
    under the grammar then writes keys until max_tokens (SmolLM2-135M did: the reply ended "length" with
    no call). Every value the closed schema allows, the open one allows too."""
    if depth > MAX_SCHEMA_DEPTH:
        raise PromptError(f"a tool's parameters schema nests more than {MAX_SCHEMA_DEPTH} levels deep")
    if isinstance(schema, list):
        return [_closed(item, depth + 1) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: (_closed(v, depth + 1) if k not in ("enum", "const", "default", "examples") else v)
           for k, v in schema.items()}
    if "properties" in out and "additionalProperties" not in out and "patternProperties" not in out:
        out["additionalProperties"] = False
    return out


def _join(first: str, body: str, last: str) -> str:
    return " ".join(p for p in (_q(first) if first else "", body, _q(last) if last else "") if p)


def _q(text: str) -> str:
    """A lark string literal (names are [a-zA-Z0-9_-], markers ASCII: JSON's escapes are lark's)."""
    return json.dumps(text)


def _regex(text: str) -> str:
    """``text`` matched literally inside a lark ``/regex/``."""
    return "".join("\\" + c if c in "\\/.+*?()|[]{}^$#&-~" else c for c in text)


def _first_line(messages) -> str:
    text = next((m for m in messages if m), "unknown error").strip()
    return text.splitlines()[0][:300] if text else "unknown error"
