"""Tool styles read from real chat templates, the tools checks, and what the templates are given to render.

Every fixture template in tests/templates/ is rendered through LocalTemplate with ``template_inputs``: a
whole tool loop (a call, its result, the answer), and the model's own call text read back by
``parse_reply`` and echoed into the history renders to the same bytes the model wrote.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine.errors import PromptError
from engine.text.builtin_templates import FAMILIES
from engine.text.reply_format import (
    FALLBACK_FOOTER,
    FALLBACK_HEADER,
    MAX_TOOL_BYTES,
    MAX_TOOLS,
    ReplyFormat,
    call_text,
    check_tool_choice,
    check_tools,
    fallback_system_section,
    opens_thinking,
    reply_format_for,
    reply_markers,
    template_inputs,
)
from engine.text.reply_parse import parse_reply
from engine.text.template_render import LocalTemplate
from engine.types import ToolChoice, ToolChoiceMode

TEMPLATES = Path(__file__).parent / "templates"
BOS = {"llama3.1": "<|begin_of_text|>", "llama3.2": "<|begin_of_text|>", "mistral-nemo": "<s>", "mistral-small-3.2": "<s>",
       "gemma3": "<bos>",
       "deepseek-r1-distill-qwen": "<｜begin▁of▁sentence｜>"}
EOS = {"mistral-nemo": "</s>", "mistral-small-3.2": "</s>", "deepseek-r1-distill-qwen": "<｜end▁of▁sentence｜>"}
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
SEARCH = {"type": "function", "function": {"name": "search", "parameters": {"type": "object", "properties": {}}}}


def source(name: str) -> str:
    return (TEMPLATES / f"{name}.jinja").read_text()


def template(name: str) -> LocalTemplate:
    return LocalTemplate(source(name), BOS.get(name, ""), EOS.get(name, ""), name=name)


def render(name: str, messages, tools=(), variables=None, add_generation_prompt=True) -> str:
    fmt = reply_format_for(source(name))
    msgs, tmpl_tools = template_inputs(fmt, messages, tools)
    return template(name).render(msgs, add_generation_prompt, tools=tmpl_tools, variables=variables)


# --- detection ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("name, style, native, thinks", [
    ("qwen3", "hermes", True, True),
    ("qwen2.5", "hermes", True, False),
    ("hermes3", "hermes", True, False),
    ("llama3.1", "llama3_json", True, False),
    ("llama3.2", "llama3_json", True, False),
    ("mistral-nemo", "mistral", True, False),
    ("mistral-small-3.2", "mistral_args", True, False),
    ("deepseek-r1-distill-qwen", "fallback", False, True),  # its own call format, but it never shows the tools
    ("smollm2", "fallback", False, False),
    ("gemma3", "fallback", False, False),
])
def test_style_read_from_each_real_template(name, style, native, thinks):
    fmt = reply_format_for(source(name))
    assert (fmt.tool_style, fmt.native_tools, fmt.thinks) == (style, native, thinks)
    if thinks:
        assert (fmt.think_open, fmt.think_close) == ("<think>", "</think>")
    else:
        assert (fmt.think_open, fmt.think_close) == ("", "")


@pytest.mark.parametrize("name, markers", [
    ("qwen3", ("<think>", "</think>", "<tool_call>", "</tool_call>")),
    ("llama3.2", ("<|python_tag|>",)),
    ("mistral-nemo", ("[TOOL_CALLS]",)),
    ("mistral-small-3.2", ("[TOOL_CALLS]", "[ARGS]", "[CALL_ID]")),
    ("gemma3", ("<tool_call>", "</tool_call>")),
])
def test_reply_markers(name, markers):
    assert reply_markers(reply_format_for(source(name))) == markers


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.name)
def test_builtin_templates_get_the_fallback(family):
    assert reply_format_for(family.source) == ReplyFormat()


def test_a_template_that_names_a_marker_but_renders_no_tools_gets_the_fallback():
    assert reply_format_for("{{ '<tool_call>' }}{{ '</tool_call>' }}{{ messages[0].content }}").tool_style == "fallback"
    assert reply_format_for("").tool_style == "fallback"


# --- check_tools / check_tool_choice ------------------------------------------------------------------

def test_check_tools_returns_plain_copies():
    tools = (WEATHER, SEARCH)
    checked = check_tools(tools)
    assert checked == [WEATHER, SEARCH] and checked[0] is not WEATHER
    assert check_tools(None) == [] and check_tools([]) == []


def function_tool(**function) -> dict:
    return {"type": "function", "function": function}


@pytest.mark.parametrize("tools, message", [
    ({"type": "function"}, "must be a list"),
    ("get_weather", "must be a list"),
    (["get_weather"], r"tools\[0\] must be an object"),
    ([{"type": "code_interpreter"}], "only \"function\" tools"),
    ([{"type": "function"}], r"tools\[0\].function must be an object"),
    ([function_tool(name="has space")], "letters, digits"),
    ([function_tool(name="")], "letters, digits"),
    ([function_tool(name="x" * 65)], "letters, digits"),
    ([function_tool(name=7)], "letters, digits"),
    ([function_tool(name="f.g")], "letters, digits"),
    ([function_tool(name="f"), function_tool(name="f")], "used by another tool"),
    ([function_tool(name="f", description=3)], "description must be text"),
    ([function_tool(name="f", parameters=[1])], "JSON Schema object"),
    ([function_tool(name="f", parameters={"type": "string"})], "must describe an object"),
    ([function_tool(name="f", parameters={"type": "object", "default": float("nan")})], "not valid JSON"),
    ([function_tool(name="f", parameters={"type": "object", "x": {1, 2}})], "not valid JSON"),
    ([function_tool(name=f"f{i}") for i in range(MAX_TOOLS + 1)], f"at most {MAX_TOOLS}"),
    ([function_tool(name="f", parameters={"type": "object", "description": "d" * MAX_TOOL_BYTES})], "bytes of JSON"),
])
def test_check_tools_refusals(tools, message):
    with pytest.raises(PromptError, match=message):
        check_tools(tools)


def test_check_tools_at_the_limits_passes():
    assert len(check_tools([function_tool(name=f"f{i}") for i in range(MAX_TOOLS)])) == MAX_TOOLS
    assert check_tools([function_tool(name="a-Z_9" + "x" * 59)])


@pytest.mark.parametrize("choice, tools, message", [
    (ToolChoice(ToolChoiceMode.REQUIRED), [], "offers no tools"),
    (ToolChoice(ToolChoiceMode.FUNCTION, "get_weather"), [], "offers no tools"),
    (ToolChoice(ToolChoiceMode.FUNCTION, "nope"), [WEATHER, SEARCH], "not among the tools"),
    ("auto", [WEATHER], "tool_choice must be"),
    (ToolChoice("sometimes"), [WEATHER], "not one of"),
])
def test_check_tool_choice_refusals(choice, tools, message):
    with pytest.raises(PromptError, match=message):
        check_tool_choice(choice, tools)


@pytest.mark.parametrize("choice", [ToolChoice(), ToolChoice(ToolChoiceMode.NONE), ToolChoice(ToolChoiceMode.REQUIRED),
                                    ToolChoice(ToolChoiceMode.FUNCTION, "search")])
def test_check_tool_choice_accepts(choice):
    assert check_tool_choice(choice, [WEATHER, SEARCH]) == choice


def test_auto_and_none_need_no_tools():
    assert check_tool_choice(ToolChoice(), []).mode == ToolChoiceMode.AUTO
    assert check_tool_choice(ToolChoice(ToolChoiceMode.NONE), []).mode == ToolChoiceMode.NONE


# --- template_inputs ----------------------------------------------------------------------------------

ARGS = '{"city":"Paris"}'  # compact, as a client may send it


def loop_messages(args: str = ARGS, call_id: str = "call_0123456789abcdef01234567") -> list[dict]:
    return [
        {"role": "system", "content": "You help with weather."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": call_id, "type": "function", "function": {"name": "get_weather", "arguments": args}}]},
        {"role": "tool", "tool_call_id": call_id, "content": '{"temp_c": 21}'},
        {"role": "assistant", "content": "It is 21 °C in Paris."},
        {"role": "user", "content": "And tomorrow?"},
    ]


def test_native_arguments_become_objects_unless_the_template_writes_text():
    qwen25 = reply_format_for(source("qwen2.5"))
    msgs, tools = template_inputs(qwen25, loop_messages(), [WEATHER])
    assert msgs[2]["tool_calls"][0]["function"]["arguments"] == {"city": "Paris"}
    assert tools == [WEATHER]
    qwen3 = reply_format_for(source("qwen3"))
    msgs, _ = template_inputs(qwen3, loop_messages(), [WEATHER])
    assert msgs[2]["tool_calls"][0]["function"]["arguments"] == ARGS  # Qwen3 writes the string as it is


def test_native_no_tools_is_none_and_empty_tool_calls_are_left_out():
    fmt = reply_format_for(source("llama3.2"))
    msgs, tools = template_inputs(fmt, [{"role": "user", "content": "hi"},
                                        {"role": "assistant", "content": "yo", "tool_calls": []}], [])
    assert tools is None and "tool_calls" not in msgs[1]  # Llama's template tests `'tool_calls' in message`


@pytest.mark.parametrize("name", ["qwen2.5", "smollm2"])
@pytest.mark.parametrize("args, message", [("{not json", "are not valid JSON"), ("[1, 2]", "must be a JSON object")])
def test_bad_call_arguments_are_prompt_errors(name, args, message):
    with pytest.raises(PromptError, match=f"message 2 tool call 0 arguments {message}"):
        template_inputs(reply_format_for(source(name)), loop_messages(args), [WEATHER])


def test_mistral_ids_become_nine_characters_and_still_pair_up():
    fmt = reply_format_for(source("mistral-nemo"))
    msgs, _ = template_inputs(fmt, loop_messages(), [WEATHER])
    call_id = msgs[2]["tool_calls"][0]["id"]
    assert len(call_id) == 9 and call_id.isalnum() and msgs[3]["tool_call_id"] == call_id
    again, _ = template_inputs(fmt, loop_messages(), [WEATHER])
    assert again[2]["tool_calls"][0]["id"] == call_id  # the same bytes every time
    kept, _ = template_inputs(fmt, loop_messages(call_id="abcDEF123"), [WEATHER])
    assert kept[2]["tool_calls"][0]["id"] == "abcDEF123"


def test_fallback_inputs():
    msgs, tools = template_inputs(ReplyFormat(), loop_messages() + [
        {"role": "assistant", "content": "Checking.", "tool_calls": [
            {"id": "a", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}},
            {"id": "b", "type": "function", "function": {"name": "search", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "a", "content": "cold"},
        {"role": "tool", "tool_call_id": "b", "content": "nothing"},
    ], [WEATHER, SEARCH])
    assert tools is None
    assert msgs[0] == {"role": "system", "content": "You help with weather.\n\n" + fallback_system_section([WEATHER, SEARCH])}
    assert msgs[2] == {"role": "assistant", "content": call_text("get_weather", ARGS)}
    assert msgs[3] == {"role": "user", "content": '<tool_response>\n{"temp_c": 21}\n</tool_response>'}
    assert msgs[6] == {"role": "assistant", "content": "Checking.\n" + call_text("get_weather", '{"city": "Oslo"}')
                       + "\n" + call_text("search", "{}")}
    assert msgs[7] == {"role": "user", "content": "<tool_response>\ncold\n</tool_response>\n"
                                                  "<tool_response>\nnothing\n</tool_response>"}
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "user", "assistant", "user", "assistant", "user"]


def test_fallback_without_a_system_message_adds_one():
    msgs, _ = template_inputs(ReplyFormat(), [{"role": "user", "content": "hi"}], [WEATHER])
    assert msgs == [{"role": "system", "content": fallback_system_section([WEATHER])}, {"role": "user", "content": "hi"}]
    plain, _ = template_inputs(ReplyFormat(), [{"role": "user", "content": "hi"}], [])
    assert plain == [{"role": "user", "content": "hi"}]


def test_fallback_section_is_the_documented_text():
    doc = (Path(__file__).parent.parent / "docs" / "tool-calls.md").read_text()
    section = fallback_system_section([WEATHER])
    assert section.startswith(FALLBACK_HEADER) and section.endswith(FALLBACK_FOOTER)
    assert section == FALLBACK_HEADER + "\n" + json.dumps(WEATHER, ensure_ascii=False) + FALLBACK_FOOTER
    for line in (FALLBACK_HEADER + "\n{tool}" + FALLBACK_FOOTER).splitlines():
        assert line in doc, line


# --- rendering every fixture ----------------------------------------------------------------------

@pytest.mark.parametrize("name, expected", [
    ("qwen3", ['<tool_call>\n{"name": "get_weather", "arguments": {"city":"Paris"}}\n</tool_call>',
               '<|im_start|>user\n<tool_response>\n{"temp_c": 21}\n</tool_response><|im_end|>',
               json.dumps(WEATHER, ensure_ascii=False)]),
    ("qwen2.5", ['<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
                 "<tool_response>\n{\"temp_c\": 21}\n</tool_response>"]),
    ("hermes3", ['"arguments": {"city":"Paris"}', "<tool_response>", "get_weather"]),
    ("llama3.1", ['{"name": "get_weather", "parameters": {"city": "Paris"}}',
                  # Llama's template tojsons a result that is text (a string is iterable in Jinja), as it does
                  # under transformers
                  '<|start_header_id|>ipython<|end_header_id|>\n\n"{\\"temp_c\\": 21}"<|eot_id|>']),
    ("llama3.2", ['{"name": "get_weather", "parameters": {"city": "Paris"}}',
                  '<|start_header_id|>ipython<|end_header_id|>\n\n"{\\"temp_c\\": 21}"<|eot_id|>', '"name": "get_weather"']),
    ("mistral-nemo", ['[AVAILABLE_TOOLS][{"type": "function", "function": {"name": "get_weather"',
                      '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}, "id": "',
                      '[TOOL_RESULTS]{"content": {"temp_c": 21}, "call_id": "']),
    ("mistral-small-3.2", ['[AVAILABLE_TOOLS][{"type": "function", "function": {"name": "get_weather"',
                           '[TOOL_CALLS]get_weather[CALL_ID]', '[ARGS]{"city": "Paris"}</s>[TOOL_RESULTS]',
                           '[TOOL_CONTENT]{"temp_c": 21}[/TOOL_RESULTS]']),
    ("deepseek-r1-distill-qwen", [FALLBACK_HEADER, call_text("get_weather", ARGS), "<tool_response>"]),
    ("smollm2", ["<|im_start|>system\nYou help with weather.\n\n" + FALLBACK_HEADER,
                 "<|im_start|>assistant\n" + call_text("get_weather", ARGS) + "<|im_end|>",
                 "<|im_start|>user\n<tool_response>\n{\"temp_c\": 21}\n</tool_response><|im_end|>"]),
    ("gemma3", ["<start_of_turn>user\nYou help with weather.\n\n" + FALLBACK_HEADER,
                "<start_of_turn>model\n" + call_text("get_weather", ARGS) + "<end_of_turn>"]),
])
def test_each_template_renders_a_whole_tool_loop(name, expected):
    prompt = render(name, loop_messages(), [WEATHER])
    for part in expected:
        assert part in prompt, f"{name}: {part!r} not in\n{prompt}"
    assert "And tomorrow?" in prompt


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.name)
def test_builtin_templates_render_the_fallback(family):
    fmt = reply_format_for(family.source)
    msgs, tools = template_inputs(fmt, loop_messages(), [WEATHER])
    prompt = LocalTemplate(family.source, "<s>", "</s>").render(msgs, tools=tools)
    assert FALLBACK_HEADER in prompt and call_text("get_weather", ARGS) in prompt and "<tool_response>" in prompt


MODEL_WRITES = {
    "qwen3": '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
    "qwen2.5": '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
    "hermes3": '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
    "llama3.2": '{"name": "get_weather", "parameters": {"city": "Paris"}}',
    "smollm2": '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
    "gemma3": '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
}


@pytest.mark.parametrize("name", list(MODEL_WRITES))
def test_a_parsed_call_echoed_back_renders_the_bytes_the_model_wrote(name):
    """The prompt with the call in its history starts with the prompt the model answered plus its call."""
    fmt = reply_format_for(source(name))
    first = loop_messages()[:2]
    asked = render(name, first, [WEATHER])
    reply = parse_reply(fmt, MODEL_WRITES[name], tools=[WEATHER])
    assert [c.name for c in reply.tool_calls] == ["get_weather"]
    echoed = {"role": "assistant", "content": reply.content, "tool_calls": [
        {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}} for c in reply.tool_calls]}
    history = render(name, first + [echoed, {"role": "tool", "tool_call_id": reply.tool_calls[0].id, "content": "21"}],
                     [WEATHER])
    assert history.startswith(asked + MODEL_WRITES[name]), f"{name}:\n{asked + MODEL_WRITES[name]!r}\n{history!r}"


def test_qwen3_enable_thinking_false_and_opens_thinking():
    fmt = reply_format_for(source("qwen3"))
    messages = [{"role": "user", "content": "hi"}]
    assert not opens_thinking(fmt, render("qwen3", messages))
    closed = render("qwen3", messages, variables={"enable_thinking": False})
    assert closed.endswith("<think>\n\n</think>\n\n") and not opens_thinking(fmt, closed)


def test_deepseek_r1_prompt_opens_thinking():
    fmt = reply_format_for(source("deepseek-r1-distill-qwen"))
    prompt = render("deepseek-r1-distill-qwen", [{"role": "user", "content": "hi"}])
    assert prompt.endswith("<think>\n") and opens_thinking(fmt, prompt)


def test_opens_thinking_needs_markers_and_an_open_block_at_the_end():
    fmt = reply_format_for(source("qwen3"))
    assert opens_thinking(fmt, "x<think>\n") and opens_thinking(fmt, "x<think>")
    assert not opens_thinking(fmt, "x<think>\nwords")
    assert not opens_thinking(fmt, "x<think></think>")
    assert not opens_thinking(ReplyFormat(), "x<think>\n")
