"""Issue 30, item 5: ``hearth-cli render`` prints the exact prompt a model's chat template renders for
OpenAI-shaped messages and tools, reading only the GGUF's header, tokenizer and template.

Real GGUFs (the tiny synthetic one, copies of it with other templates, and the real default model), the
real CLI in-process (``engine.cli.main.main``) or as a subprocess; every bad input gets its test."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from engine.cli.main import main
from engine.model.gguf_file import GGUFModel
from engine.text.tokenizer import Tokenizer

from .gguf_edit import rewrite_gguf
from .test_cli import assert_clean_error

MESSAGES = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "hello world"}]
CHATML = ("<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nhello world<|im_end|>\n"
          "<|im_start|>assistant\n")
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                    "unit": {"type": "string", "enum": ["c", "f"]}},
                   "required": ["city"]}}}]
# A template that shows what reaches it: the tools (as transformers' tojson writes them), calls (Hermes'
# <tool_call>, so it renders tools itself) and a kwarg.
TOOLS_TEMPLATE = (
    "{% if tools %}<tools>{% for t in tools %}{{ t | tojson }}{% endfor %}</tools>\n{% endif %}"
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}"
    "{% for c in m.tool_calls or [] %}<tool_call>{{ c.function | tojson }}</tool_call>{% endfor %}<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n{% endif %}{% endif %}"
)


@pytest.fixture
def home(tmp_path) -> Path:
    path = tmp_path / "home"
    path.mkdir()
    return path


@pytest.fixture
def tools_gguf(tiny_gguf, tmp_path) -> Path:
    return rewrite_gguf(tiny_gguf, tmp_path / "tools.gguf", values={"tokenizer.chat_template": TOOLS_TEMPLATE})


def write(path: Path, value) -> str:
    path.write_text(value if isinstance(value, str) else json.dumps(value), encoding="utf-8")
    return str(path)


def render(capsys, home: Path, *args: str) -> SimpleNamespace:
    """``hearth-cli render ARGS`` in this process: its exit code, stdout and stderr."""
    code = main(["render", "--data-dir", str(home), *args])
    out = capsys.readouterr()
    return SimpleNamespace(returncode=code, stdout=out.out, stderr=out.err)


def token_count(gguf: Path, text: str) -> int:
    tokenizer = Tokenizer.from_gguf(GGUFModel(gguf))
    ids = tokenizer.encode(text)
    bos = tokenizer.specials.bos
    return len(ids) + int(tokenizer.add_bos and bos is not None and (not ids or ids[0] != bos))


def test_render_prints_the_exact_prompt_with_the_generation_prompt(capsys, home, tmp_path, tiny_gguf):
    proc = render(capsys, home, "--messages", write(tmp_path / "m.json", MESSAGES), "--model", str(tiny_gguf))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == CHATML  # nothing added, nothing taken away


def test_render_json_reports_the_prompt_its_tokens_and_the_template(capsys, home, tmp_path, tiny_gguf):
    proc = render(capsys, home, "--messages", write(tmp_path / "m.json", MESSAGES), "--model", str(tiny_gguf),
                  "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert set(out) == {"prompt", "tokens", "template", "tool_format"}
    assert out["prompt"] == CHATML and out["template"] == "gguf"
    assert out["tokens"] == token_count(tiny_gguf, CHATML)
    assert out["tool_format"]  # the tiny template cannot express tools: the built-in fallback's name


def test_render_hands_the_tools_and_template_kwargs_to_the_template(capsys, home, tmp_path, tools_gguf):
    messages, tools = write(tmp_path / "m.json", MESSAGES), write(tmp_path / "t.json", TOOLS)
    proc = render(capsys, home, "--messages", messages, "--tools", tools, "--template-kwarg", "enable_thinking=false",
                  "--model", str(tools_gguf), "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["tool_format"] == "hermes"
    prompt = out["prompt"]
    # tojson as transformers writes it: keys in the order given, ", " and ": ", no HTML escaping
    assert prompt == f"<tools>{json.dumps(TOOLS[0])}</tools>\n" + CHATML + "<think>\n\n</think>\n\n"
    proc = render(capsys, home, "--messages", messages, "--template-kwarg", "enable_thinking=true",
                  "--model", str(tools_gguf))
    assert proc.returncode == 0 and proc.stdout == CHATML  # no tools: none shown; thinking left on


def test_render_reads_messages_as_the_server_does(capsys, home, tmp_path, tiny_gguf):
    """Text parts joined, the developer role as system, null content as empty text (OpenAI's wire shapes)."""
    shaped = [{"role": "developer", "content": [{"type": "text", "text": "You are "}, {"type": "text", "text": "terse."}]},
              {"role": "user", "content": "hello world"}, {"role": "assistant", "content": None},
              {"role": "user", "content": [{"type": "text", "text": "again"}]}]
    proc = render(capsys, home, "--messages", write(tmp_path / "m.json", shaped), "--model", str(tiny_gguf))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == (CHATML.removesuffix("<|im_start|>assistant\n") + "<|im_start|>assistant\n<|im_end|>\n"
                           "<|im_start|>user\nagain<|im_end|>\n<|im_start|>assistant\n")
    image = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]
    assert_clean_error(render(capsys, home, "--messages", write(tmp_path / "i.json", image), "--model", str(tiny_gguf)),
                       "message 0 content parts must be")


def test_render_refuses_more_messages_or_parts_than_the_server_takes(capsys, home, tmp_path, tiny_gguf):
    from engine.cli.render import MAX_MESSAGES, MAX_PARTS

    many = [{"role": "user", "content": "hi"}] * (MAX_MESSAGES + 1)
    assert_clean_error(render(capsys, home, "--messages", write(tmp_path / "m.json", many), "--model", str(tiny_gguf)),
                       f"at most {MAX_MESSAGES:,} are read")
    parts = [{"role": "user", "content": [{"type": "text", "text": "a"}] * (MAX_PARTS + 1)}]
    assert_clean_error(render(capsys, home, "--messages", write(tmp_path / "p.json", parts), "--model", str(tiny_gguf)),
                       f"message 0 has {MAX_PARTS + 1:,} content parts")


def test_render_escapes_control_characters_on_the_terminal_but_not_in_json(capsys, home, tmp_path, tiny_gguf):
    messages = write(tmp_path / "m.json", [{"role": "user", "content": "a\x1b]0;owned\x07b"}])
    plain = render(capsys, home, "--messages", messages, "--model", str(tiny_gguf))
    assert plain.returncode == 0 and "\x1b" not in plain.stdout and "\\x1b]0;owned\\x07b" in plain.stdout
    exact = render(capsys, home, "--messages", messages, "--model", str(tiny_gguf), "--json")
    assert "a\x1b]0;owned\x07b" in json.loads(exact.stdout)["prompt"]


LOOP = [
    {"role": "system", "content": "You are a weather bot."},
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": None, "reasoning_content": "The user wants Paris.", "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "18 C, sunny"},
    {"role": "assistant", "content": "It is 18 C and sunny in Paris."},
    {"role": "user", "content": "And in Lyon?"},
]


def test_render_of_a_tool_loop_on_qwen3_is_what_the_loaded_engine_reads(capsys, home, tmp_path, qwen3_chat_gguf,
                                                                         qwen3_chat_home):
    """Qwen3's real template: the tools, the call (arguments as an object), the result, the kwargs — byte for
    byte what ``Hearth.render_prompt`` on the loaded model (the server's rendering) makes of them."""
    from engine.api import Hearth, resolve_paths

    messages, tools = write(tmp_path / "m.json", LOOP), write(tmp_path / "t.json", TOOLS)
    proc = render(capsys, home, "--messages", messages, "--tools", tools, "--model", str(qwen3_chat_gguf),
                  "--template-kwarg", "enable_thinking=false", "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["template"] == "gguf" and out["tool_format"] == "hermes"
    prompt = out["prompt"]
    assert "# Tools" in prompt and json.dumps(TOOLS[0]) in prompt
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in prompt
    assert "<tool_response>\n18 C, sunny\n</tool_response>" in prompt
    assert prompt.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")  # enable_thinking=false
    linked = tmp_path / "linked"
    linked.mkdir()
    (linked / "converted").symlink_to(qwen3_chat_home)
    hearth = Hearth(resolve_paths(linked).ensure(), model=str(qwen3_chat_gguf), provider="cpu")
    try:
        hearth.load()
        engine_messages = [dict(m, content=m["content"] or "") for m in LOOP]
        assert prompt == hearth.render_prompt(engine_messages, TOOLS, {"enable_thinking": False})
    finally:
        hearth.close()
    assert out["tokens"] == token_count(qwen3_chat_gguf, prompt)


def test_render_refuses_bad_tools_and_tool_messages(capsys, home, tmp_path, qwen3_chat_gguf):
    messages = write(tmp_path / "m.json", MESSAGES)
    nameless = write(tmp_path / "t.json", [{"type": "function", "function": {"parameters": {}}}])
    assert_clean_error(render(capsys, home, "--messages", messages, "--tools", nameless, "--model", str(qwen3_chat_gguf)),
                       "name")
    for bad, needle in (
            ({"role": "assistant", "content": None, "tool_calls": "get_weather"}, "tool_calls must be a list"),
            ({"role": "assistant", "content": "", "tool_calls": [{"function": {"arguments": "{}"}}]},
             "needs a function with a name"),
            ({"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f", "arguments": 3}}]},
             "arguments must be a JSON string or an object"),
            ({"role": "user", "content": "hi", "tool_calls": []}, "only an assistant message may carry"),
            ({"role": "tool", "tool_call_id": 7, "content": "18 C"}, "tool_call_id must be text")):
        path = write(tmp_path / "bad.json", [*MESSAGES, bad])
        assert_clean_error(render(capsys, home, "--messages", path, "--model", str(qwen3_chat_gguf)), needle)


@pytest.mark.real_model
def test_render_matches_what_the_engine_reads_for_the_real_model(real_engine, real_home, tmp_path):
    messages = [*MESSAGES, {"role": "assistant", "content": "Hi."}, {"role": "user", "content": "And 2 + 2?"}]
    env = {**os.environ, "HEARTH_HOME": str(real_home)}
    proc = subprocess.run([sys.executable, "-m", "engine.cli", "render", "--messages", write(tmp_path / "m.json", messages),
                           "--json"], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["prompt"] == real_engine.render(messages)
    assert out["tokens"] == len(real_engine.prompt_tokens(messages))


@pytest.mark.real_model
def test_render_loads_no_model_runtime(real_home, tmp_path):
    """In-process: after ``render`` neither ONNX nor ONNX Runtime is imported (the weights are never read)."""
    messages = write(tmp_path / "m.json", MESSAGES)
    script = ("import sys; from engine.cli import main; "
              f"code = main(['render', '--data-dir', {str(real_home)!r}, '--messages', {messages!r}]); "
              "print(); print([m for m in ('onnx', 'onnxruntime') if m in sys.modules], code)")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "[] 0"


# every bad input: one clear error line, a non-zero exit, no traceback ---------------------------------------
BAD_MESSAGES = [
    ("[not json", "is not valid JSON"),
    ('{"role": "user", "content": "hi"}', "non-empty list"),
    ("[]", "non-empty list"),
    ('["hello"]', "message 0 must be an object"),
    ('[{"role": "user"}]', 'message 0 must be an object with "role" and "content"'),
    ('[{"role": "robot", "content": "hi"}]', "message 0 has role 'robot'"),
]


@pytest.mark.parametrize(("text", "needle"), BAD_MESSAGES)
def test_render_refuses_bad_messages(capsys, home, tmp_path, tiny_gguf, text, needle):
    proc = render(capsys, home, "--messages", write(tmp_path / "m.json", text), "--model", str(tiny_gguf))
    assert_clean_error(proc, needle)
    assert proc.stdout == ""


def test_render_refuses_a_messages_file_it_cannot_read(capsys, home, tmp_path, tiny_gguf):
    assert_clean_error(render(capsys, home, "--messages", str(tmp_path / "absent.json"), "--model", str(tiny_gguf)),
                       "messages file not found")
    assert_clean_error(render(capsys, home, "--messages", str(tmp_path), "--model", str(tiny_gguf)),
                       "cannot read messages file")  # a folder
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)  # reading it would hang
    assert_clean_error(render(capsys, home, "--messages", str(fifo), "--model", str(tiny_gguf)),
                       "cannot read messages file")
    latin = tmp_path / "latin.json"
    latin.write_bytes('[{"role": "user", "content": "caf\xe9"}]'.encode("latin-1"))
    assert_clean_error(render(capsys, home, "--messages", str(latin), "--model", str(tiny_gguf)), "not UTF-8")


def test_render_refuses_files_over_their_caps_before_reading_them(capsys, home, tmp_path, tiny_gguf):
    from engine.cli.common import MAX_MESSAGES_BYTES
    from engine.cli.render import MAX_TOOLS_FILE_BYTES

    big = tmp_path / "big.json"
    with big.open("wb") as fh:  # sparse: the cap, not the disk, is what is tested
        fh.truncate(MAX_MESSAGES_BYTES + 1)
    assert_clean_error(render(capsys, home, "--messages", str(big), "--model", str(tiny_gguf)),
                       f"is over {MAX_MESSAGES_BYTES >> 20} MiB")
    tools = tmp_path / "tools.json"
    with tools.open("wb") as fh:
        fh.truncate(MAX_TOOLS_FILE_BYTES + 1)
    assert_clean_error(render(capsys, home, "--messages", write(tmp_path / "m.json", MESSAGES), "--tools", str(tools),
                              "--model", str(tiny_gguf)), f"tools file {tools} is over {MAX_TOOLS_FILE_BYTES >> 20} MiB")


@pytest.mark.parametrize(("text", "needle"), [
    ("{nope", "tools file"),
    ('{"type": "function"}', "must hold a JSON list of tool objects"),
    ('"get_weather"', "must hold a JSON list of tool objects"),
    ('[1, 2]', "must hold a JSON list of tool objects"),
])
def test_render_refuses_bad_tools_files(capsys, home, tmp_path, tiny_gguf, text, needle):
    proc = render(capsys, home, "--messages", write(tmp_path / "m.json", MESSAGES),
                  "--tools", write(tmp_path / "t.json", text), "--model", str(tiny_gguf))
    assert_clean_error(proc, needle)
    assert_clean_error(render(capsys, home, "--messages", write(tmp_path / "m.json", MESSAGES),
                              "--tools", str(tmp_path / "absent.json"), "--model", str(tiny_gguf)),
                       "tools file not found")


@pytest.mark.parametrize(("kwarg", "needle"), [
    ("enable_thinking", "must be KEY=JSON"),
    ("=true", "must be KEY=JSON"),
    ("enable_thinking=maybe", "enable_thinking: the value is not JSON"),
    ("reasoning_effort=high", "text needs quotes"),
    ("messages=[]", "may not set 'messages'"),
    ("bad-name=1", "is not a template variable name"),
    ("x=" + "[" * 5000, "nested too deeply"),
    ("x=" + json.dumps("a" * (70 << 10)), "the value is over 64 KiB"),
])
def test_render_refuses_bad_template_kwargs(capsys, home, tmp_path, tiny_gguf, kwarg, needle):
    proc = render(capsys, home, "--messages", write(tmp_path / "m.json", MESSAGES), "--template-kwarg", kwarg,
                  "--model", str(tiny_gguf))
    assert_clean_error(proc, needle)


def test_render_refuses_a_template_kwarg_given_twice(capsys, home, tmp_path, tiny_gguf):
    proc = render(capsys, home, "--messages", write(tmp_path / "m.json", MESSAGES), "--model", str(tiny_gguf),
                  "--template-kwarg", "enable_thinking=true", "--template-kwarg", "enable_thinking=false")
    assert_clean_error(proc, "enable_thinking is given twice")


def test_render_of_an_unknown_model_is_one_clear_error(capsys, home, tmp_path):
    messages = write(tmp_path / "m.json", MESSAGES)
    proc = render(capsys, home, "--messages", messages, "--model", "no-such-model")
    assert_clean_error(proc, "no-such-model")
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(b"GGUF" + b"\x00" * 64)  # a GGUF's magic and nothing after it
    assert_clean_error(render(capsys, home, "--messages", messages, "--model", str(cut)))


def test_render_of_a_refused_template_says_the_built_in_format_rendered(capsys, home, tmp_path, tiny_gguf):
    broken = rewrite_gguf(tiny_gguf, tmp_path / "broken.gguf",
                          values={"tokenizer.chat_template": "{% for m in messages %}{{ m.content }"})
    proc = render(capsys, home, "--messages", write(tmp_path / "m.json", MESSAGES), "--model", str(broken), "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["template"].startswith("builtin:") and out["prompt"] == CHATML  # the vocabulary's own format


def test_render_of_a_template_that_refuses_the_messages_is_one_clear_error(capsys, home, tmp_path, tiny_gguf):
    failing = rewrite_gguf(tiny_gguf, tmp_path / "failing.gguf",
                           values={"tokenizer.chat_template": "{% if messages[0].content == 'forbidden' %}"
                                   "{{ raise_exception('no forbidden words') }}{% endif %}" + TOOLS_TEMPLATE})
    messages = write(tmp_path / "m.json", [{"role": "user", "content": "forbidden"}])
    assert_clean_error(render(capsys, home, "--messages", messages, "--model", str(failing)), "no forbidden words")
