"""Hostile chat templates: every attack stops at a limit with one clear TemplateError, a file whose
template fails its trial render falls back to the built-in format (and says so), and real templates
render exactly as plain jinja2 renders them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.errors import HearthError, PromptError, TemplateError, UnsupportedModelError
from engine.text.chat_template import ChatTemplate
from engine.text.template_check import SAMPLE, template_problem, trial_render

CHAT = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Bye"}]


def render(source: str, messages: list[dict] = CHAT) -> str:
    return ChatTemplate(source, "<s>", "</s>", name="the test template").render(messages)


# attacks -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("source,match", [
    ("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", "loop steps"),
    ("{% for i in range(100) %}{% for j in range(100) %}{% for k in range(100) %}{% endfor %}{% endfor %}{% endfor %}",
     "loop steps"),
    ("{% set l = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10] %}{% for a in l %}{% for b in l %}{% for c in l %}{% for d in l %}"
     "{% for e in l %}{% for f in l %}{% endfor %}{% endfor %}{% endfor %}{% endfor %}{% endfor %}{% endfor %}",
     "loop steps"),  # loops over lists count too, not only range()
    ("{{ range(10**12)|list }}", "range"),
    ("{{ 10**10000000 }}", "power over"),
    ("{% set ns = namespace(x=3) %}{% for i in range(40) %}{% set ns.x = ns.x * ns.x %}{% endfor %}", "integer over"),
    ("{{ 'a' * 300000000 }}", "300,000,000"),
    ("{{ [0] * 300000000 }}", "300,000,000"),
    ("{% set ns = namespace(s='ab') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}", "characters"),
    ("{% set ns = namespace(s='ab') %}{% for i in range(40) %}{% set ns.s = ns.s + ns.s %}{% endfor %}", "characters"),
    ("{{ 'a'.ljust(300000000) }}", "padding width"),
    ("{{ 'a'|center(300000000) }}", "center size"),
    ("{{ ('a' * 100000).replace('', 'b' * 100000) }}", "characters"),
    ("{{ ('a' * 100000)|replace('a', 'b' * 100000) }}", "characters"),
    ("{{ '%300000000d' % 1 }}", "format string"),
    ("{{ '{:>300000000}'.format(1) }}", "format string"),
    ("{{ '{:{w}}'.format(1, w=300000000) }}", "format width"),
    ("{{ '{a:{w}}'.format_map({'a': 1, 'w': 300000000}) }}", "format width"),
    ("{{ '%(a)300000000s' % {'a': 1} }}", "format string"),
    ("{{ 'abc'.translate({97: 'x'}) }}", "translate"),
    ("{% macro f() %}{% for i in range(90000) %}{{ 'abcdefghij' * 1000 }}{% endfor %}{% endmacro %}{{ f()|length }}",
     "output"),
    ("{% for i in range(90000) %}{{ 'abcdefghij' * 100 }}{% endfor %}", "output"),
    ("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "nested calls"),
    ("{% macro f(n) %}{% for x in [1] %}{{ f(n) }}{% endfor %}{% endmacro %}{{ f(0) }}", "nested calls"),
    ("{{ '{0}'.format() }}", "IndexError"),
    ("{{ 2.0 ** 100000 }}", "OverflowError"),
    ("{{ 1 // 0 }}", "ZeroDivisionError"),
    ("{{ '{:d}'.format('a') }}", "ValueError"),
    ("{{ messages[7]['content'] }}", "UndefinedError"),
    ("{{ raise_exception('no system role') }}", "refused these messages: no system role"),
    ("{{ lipsum(100000) }}", "lipsum"),
])
def test_each_attack_stops_at_a_limit_with_one_clear_error(source, match):
    with pytest.raises(TemplateError, match=match) as caught:
        render(source)
    message = str(caught.value)
    assert message.startswith("the test template ") and "\n" not in message and len(message) < 400


def test_the_time_limit_stops_a_slow_render():
    t = ChatTemplate("{% for i in range(100000) %}{{ i|string|length }}{% endfor %}", name="the test template")
    with pytest.raises(TemplateError, match="time limit"):
        t.render(CHAT, seconds=0.0)


@pytest.mark.parametrize("source,match", [
    ("{% for %}", "not valid Jinja"),
    ("{{ " + "(" * 5000 + "1" + ")" * 5000 + " }}", "cannot be compiled"),  # the parser's recursion
    ("x" * 1_000_001, "cannot be compiled"),
])
def test_templates_that_cannot_compile_are_a_clean_model_error(source, match):
    with pytest.raises(UnsupportedModelError, match=match):
        ChatTemplate(source)


def test_numbers_in_format_text_are_not_widths():
    assert render("{{ 'id 12345678: %s %.2f' % ('a', 2.5) }} {{ 'id 12345678: {}'.format('b') }}") == \
        "id 12345678: a 2.50 id 12345678: b"


def test_limits_leave_room_for_a_long_conversation():
    long = [{"role": "user", "content": "word " * 400_000}, {"role": "assistant", "content": "ok"}] * 3
    long.append({"role": "user", "content": "and?"})
    text = render("{% for m in messages %}{{ m['role'] + ': ' + m['content'] ~ '\n' }}{% endfor %}", long)
    assert len(text) > 3 * 2_000_000  # past the fixed caps: they grow with the messages


# real templates render as plain jinja2 renders them ---------------------------------------------------
def plain_render(source: str, messages: list[dict], add_generation_prompt: bool, bos: str, eos: str) -> str:
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    return env.from_string(source).render(messages=messages, add_generation_prompt=add_generation_prompt,
                                          bos_token=bos, eos_token=eos)


CONVERSATIONS = [
    CHAT,
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}],
    [{"role": "user", "content": "ünïcödé 🎉\n{{ not a template }} {% raw %}"}],
]


def real_template_sources() -> list[tuple[str, str]]:
    from engine.model.synthetic import CHATML_TEMPLATE
    from engine.text.builtin_templates import FAMILIES

    return [("synthetic-chatml", CHATML_TEMPLATE)] + [(f.name, f.source) for f in FAMILIES]


@pytest.mark.parametrize("source", [
    "{{ [1, 2, 3]|sum }} {{ [[1], [2]]|sum(start=[]) }} {{ [{'x': 2}, {'x': 3}]|sum(attribute='x', start=1) }}",
    "{{ '%(n)s' % {'n': 123456789} }} {{ '%s-%d' % ('a', 2) }} {{ '%s' % [1, 'b'] }}",
    "{{ ['a', 1, [2]]|join('-') }} {{ messages|map(attribute='role')|join(', ') }} {{ [1, {'k': 'v'}] }}",
])
def test_the_sized_sum_percent_join_and_output_give_what_jinja_gives(source):
    assert render(source) == plain_render(source, CHAT, True, "<s>", "</s>")


@pytest.mark.parametrize("name,source", real_template_sources())
@pytest.mark.parametrize("generation_prompt", [True, False])
def test_normal_templates_render_as_before(name, source, generation_prompt):
    for messages in CONVERSATIONS:
        expected = plain_render(source, messages, generation_prompt, "<s>", "</s>")
        assert ChatTemplate(source, "<s>", "</s>").render(messages, generation_prompt) == expected


@pytest.mark.real_model
def test_the_real_models_template_renders_as_before_and_passes_its_check(real_home):
    from engine.model.gguf_file import GGUFModel

    gguf = GGUFModel(next((real_home / "models").glob("*.gguf")))
    source = str(gguf.value("tokenizer.chat_template"))
    for messages in CONVERSATIONS:
        for prompt in (True, False):
            assert ChatTemplate(source).render(messages, prompt) == plain_render(source, messages, prompt, "", "")
    assert template_problem(source) == ""


# the trial render at load ---------------------------------------------------------------------------
HANGS = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"


def test_trial_render_reports_why_a_template_is_refused():
    assert trial_render(HANGS, "", "") == "it ran past its limit on loop steps"
    assert trial_render("{% for %}", "", "").startswith("it is not valid Jinja")
    assert trial_render("{{ raise_exception('nope') }}", "", "") == "it refused these messages: nope"
    assert trial_render("{{ messages[0]['content'] }}", "", "") == ""
    assert SAMPLE[0]["role"] == "user"  # no system message: some real templates refuse one


# Issue 27: bombs that got past the sandbox. Each must stop within a stated time and memory bound, at the
# trial when the template loads and at every turn.
SUM_BOMB = "{{ ([[0]]*1000000)|sum(start=[])|length }}"  # quadratic list copies inside one C call
PERCENT_BOMB = "{% set s = 'x' * 1000000 %}{{ '%s'*2500 % ((s,)*2500) }}"  # 2.67 GB built before the check
COMPARE_HANG = "{{ ([[0] * 1000000] * 1000000) == ([[0] * 1000000] * 1000000) }}"  # 10^12 compares in C
MEMORY_HOG = "{{ (['x' * 1000000] * 3000)|string|length }}"  # three gigabytes in one C call


def when_triggered(bomb: str) -> str:
    """A template that renders normally unless the last message says BOOM (so it passes the trial)."""
    return ("{% if 'BOOM' in messages[-1]['content'] %}" + bomb + "{% endif %}"
            "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}")


@pytest.mark.parametrize("bomb,refusal", [
    (SUM_BOMB, "it ran past its memory limit"),
    (PERCENT_BOMB, "it tried to build a value of 2,500,010,000 characters"),
])
def test_the_issue_27_bombs_are_refused_at_the_trial_and_at_a_turn(bomb, refusal):
    started = time.monotonic()
    assert template_problem(bomb).startswith(refusal)
    assert time.monotonic() - started < 10  # was 74 s for the sum (the trial re-ran it in-process)
    armed = when_triggered(bomb)
    assert template_problem(armed) == ""  # the condition hides it from the trial
    template = ChatTemplate(armed, name="the test template")
    assert template.render(CHAT).startswith("user: Hi\n")
    started = time.monotonic()
    with pytest.raises(TemplateError, match="the test template " + refusal.removeprefix("it ")):
        template.render([{"role": "user", "content": "BOOM"}])
    assert time.monotonic() - started < 10  # was more than 100 s in generate


def test_a_render_stuck_in_one_c_call_is_killed_at_its_deadline_and_the_next_render_works():
    """Nothing between Python steps can stop a C-level compare of a million lists: the child running
    the file's template is killed once the render runs a second past its time limit."""
    template = ChatTemplate(when_triggered(COMPARE_HANG), name="the test template")
    started = time.monotonic()
    with pytest.raises(TemplateError, match=r"^the test template took longer than 2 s to render, so it was stopped$"):
        template.render([{"role": "user", "content": "BOOM"}], seconds=1.0)
    assert time.monotonic() - started < 8
    assert template.render(CHAT).startswith("user: Hi\n")  # a new child renders the next turn


def test_a_trial_that_runs_past_its_time_is_refused_and_never_retried_in_this_process():
    started = time.monotonic()
    assert template_problem(COMPARE_HANG) == "it took longer than 3 s to render, so it was stopped"
    assert time.monotonic() - started < 12  # the 2 s trial limit plus a second's grace, plus a child's start


MEMORY_PROBE = """
import json, sys, time
from engine.errors import TemplateError
from engine.text.chat_template import ChatTemplate

if __name__ == "__main__":
    started = time.monotonic()
    try:
        ChatTemplate(sys.argv[1], name="T").render([{"role": "user", "content": "BOOM"}], seconds=30)
        outcome = "rendered"
    except TemplateError as exc:
        outcome = str(exc)
    # VmHWM, not ru_maxrss: Linux carries ru_maxrss over an exec, so it would be pytest's own peak
    hwm = next(line for line in open("/proc/self/status") if line.startswith("VmHWM:"))
    print(json.dumps({"outcome": outcome, "seconds": time.monotonic() - started, "parent_mb": int(hwm.split()[1]) / 1024}))
"""


def test_a_render_that_builds_gigabytes_in_one_c_call_stops_at_the_childs_memory_ceiling(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text(MEMORY_PROBE)
    proc = subprocess.run([sys.executable, str(probe), when_triggered(MEMORY_HOG)], capture_output=True, text=True,
                          timeout=100, cwd=Path(__file__).resolve().parent.parent,
                          env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)})
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["outcome"] == "T ran out of memory", result
    assert result["seconds"] < 30 and result["parent_mb"] < 400  # the gigabyte was the child's, capped


def test_a_verdict_is_kept_per_template():
    from engine.text import template_check

    source = "{{ messages|length }} kept"
    assert template_problem(source) == ""
    assert template_problem(source, seconds=0.0) == ""  # a second child would not have had time: none was started
    assert any(v == "" for v in template_check._verdicts.values())


@pytest.fixture(scope="module")
def synthetic_gguf(tmp_path_factory) -> Path:
    from engine.model.synthetic import write_synthetic_gguf

    return write_synthetic_gguf(tmp_path_factory.mktemp("templates") / "base.gguf")


def with_template(src: Path, dst: Path, template: str) -> Path:
    from tests.gguf_edit import rewrite_gguf

    return rewrite_gguf(src, dst, values={"tokenizer.chat_template": template})


def test_a_gguf_whose_template_hangs_loads_with_the_builtin_format(synthetic_gguf, tmp_path, caplog):
    from engine.generation import Engine
    from engine.model.gguf_file import GGUFModel
    from engine.text.profile import describe
    from engine.text.tokenizer import Tokenizer

    gguf = GGUFModel(with_template(synthetic_gguf, tmp_path / "hangs.gguf", HANGS))
    with caplog.at_level("WARNING"):
        template = Engine.template_for(gguf, Tokenizer.from_gguf(gguf))
    assert template.template_source == "builtin:chatml"
    assert template.refused == "it ran past its limit on loop steps"
    assert "hangs.gguf: its chat template was refused (it ran past its limit on loop steps)" in caplog.text
    assert template.render(CHAT).endswith("<|im_start|>user\nBye<|im_end|>\n<|im_start|>assistant\n")
    profile = describe(gguf)
    assert (profile.chat_template_source, profile.chat_template_refused) == ("builtin:chatml", template.refused)
    assert profile.template_label == "builtin:chatml (the file's template was refused: it ran past its limit on loop steps)"


def test_model_info_shows_the_refused_template(synthetic_gguf, tmp_path):
    model = with_template(synthetic_gguf, tmp_path / "huge.gguf", "{{ 'a' * 300000000 }}")
    proc = subprocess.run([sys.executable, "-m", "engine.cli", "model", "info", "--model", str(model)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "chat_template_source: builtin:chatml (the file's template was refused: it tried to build a value" \
        in proc.stdout
    proc = subprocess.run([sys.executable, "-m", "engine.cli", "model", "info", "--model", str(model), "--json"],
                          capture_output=True, text=True, timeout=300)
    info = json.loads(proc.stdout)
    assert info["chat_template_source"] == "builtin:chatml"
    assert info["chat_template_refused"].startswith("it tried to build a value of 300,000,000")


def test_a_refused_template_without_a_builtin_format_is_a_clean_error(tmp_path):
    from engine.generation import Engine
    from engine.model.gguf_file import GGUFModel
    from engine.text.tokenizer import Tokenizer
    from tests.text_helpers import write_bare_gguf

    write_bare_gguf(tmp_path / "bare.gguf", "{{ 10**10000000 }}")
    bare = GGUFModel(tmp_path / "bare.gguf")
    with pytest.raises(PromptError, match=r"bare.gguf was refused \(it computed a power over 4096 bits\), and its "
                                          "vocabulary fits none"):
        Engine.template_for(bare, Tokenizer.from_gguf(bare))


# fuzz: random small templates only ever fail with the project's own errors ------------------------------
SNIPPETS = [
    "{{ messages[0]['content'] }}", "{% for m in messages %}", "{% endfor %}", "{% if add_generation_prompt %}",
    "{% endif %}", "{{ 10 ** 5 }}", "{{ 'ab' * 3 }}", "{{ range(3)|list }}", "{% for i in range(50) %}",
    "{{ loop.index }}", "{% set x = 'y' ~ 'z' %}", "{{ x }}", "{{ [1, 2][5] }}", "{{ 1 / 0 }}", "{{ bos_token }}",
    "{% macro m(n) %}{{ m(n) }}{% endmacro %}", "{{ m(1) }}", "{{ '%d' % 'a' }}", "{{ 'a'|center(5) }}",
    "{{ raise_exception('x') }}", "{{ messages|map(attribute='role')|join(',') }}", "{{ 2 ** 99999 }}",
    "{{ ''.join(['a'] * 3) }}", "{{ 'a'.__class__ }}", "{{ eos_token|upper }}", "{%", "}}", "text\n",
    "{{ (1, 2)[0:] }}", "{{ none.x.y }}", "{{ 'a'|replace('a', 'bb') }}", "{{ {'a': 1}|tojson }}",
]


@settings(max_examples=50, deadline=None)
@given(st.lists(st.sampled_from(SNIPPETS), min_size=1, max_size=8))
def test_fuzzed_templates_fail_only_with_hearth_errors(parts):
    try:
        render("".join(parts))
    except HearthError:
        pass


def test_the_window_says_why_the_files_template_was_refused():
    from app.text import model_tooltip
    from engine.types import ModelInfo

    info = ModelInfo("m", "cpu", "int4", 2048, chat_template="builtin:chatml",
                     chat_template_refused="it ran past its limit on loop steps")
    assert model_tooltip(info) == ("The model file's chat template was refused (it ran past its limit on loop steps); "
                                   "Hearth uses its built-in chatml format.")


def test_the_cli_refuses_the_bombs_within_their_bounds(synthetic_gguf, tmp_path):
    """Issue 27 end to end: ``model info`` of the sum bomb took 74 s; ``generate`` with a trigger hidden
    behind a condition hung for more than 100 s. Here a C-level hang behind the condition is killed at
    the turn's deadline and reported in one line."""
    from tests.test_cli import assert_clean_error, run_cli

    bomb = with_template(synthetic_gguf, tmp_path / "sum.gguf", SUM_BOMB)
    started = time.monotonic()
    info = run_cli("model", "info", "--model", str(bomb), "--json", home=tmp_path / "home", timeout=120)
    assert info.returncode == 0, info.stderr
    assert json.loads(info.stdout)["chat_template_refused"] == "it ran past its memory limit"
    assert time.monotonic() - started < 30
    armed = with_template(synthetic_gguf, tmp_path / "armed.gguf", when_triggered(COMPARE_HANG))
    args = ("generate", "--model", str(armed), "--max-new-tokens", "2", "--provider", "cpu", "--prompt")
    started = time.monotonic()
    proc = run_cli(*args, "BOOM", home=tmp_path / "home", timeout=120)
    assert_clean_error(proc, "the chat template in armed.gguf took longer than 6 s to render, so it was stopped")
    assert time.monotonic() - started < 60  # the 5 s turn limit and its second of grace, plus converting the model
