"""What an agent's next request re-reads after a turn that thought (not a test): Qwen3's template drops a turn's
thinking from the history it renders, so naive prefix reuse would re-read from the thinking on.

    python bench/thinking_reread.py [--budgets 16 64 256]

A tiny Qwen3 (random weights, Qwen3's real chat template: tests/templates/qwen3.jinja) answers a question
with a forced tool call after a thinking block bounded by each budget; the next request sends the call and
its result back as an OpenAI client does (no reasoning_content). Printed per budget: the first prompt, the
reply's tokens and the thinking's, the next prompt, what it reused and re-read, and the tokens of text
that are new in it (the call as history renders it, the result, the generation prompt). Hearth cuts the
live context where the next rendering diverges (the prompt's end), so re-read = new text: the thinking's
rows are never re-read, nor the reply's rows that history spells otherwise.
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

log = logging.getLogger("thinking_reread")


def main() -> None:
    from engine.api import Hearth, resolve_paths
    from engine.model.convert import ensure_converted
    from engine.model.synthetic import write_synthetic_gguf
    from engine.types import SamplingParams, ServeRequest, ToolChoice, ToolChoiceMode
    from tests.chat_models import qwen3_chat_spec
    from tests.test_serve_tools import QUESTION, WEATHER

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budgets", type=int, nargs="+", default=[16, 64, 256])
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    log.setLevel(logging.INFO)
    greedy = SamplingParams.greedy_params()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        gguf = write_synthetic_gguf(root / "qwen3-chat.gguf", qwen3_chat_spec())
        converted = root / "converted"
        ensure_converted(gguf, "int4", converted)
        log.info("| thinking budget | first prompt | reply tokens (thinking) | next prompt | reused | re-read | new text |")
        log.info("|---|---|---|---|---|---|---|")
        for budget in args.budgets:
            home = root / f"home-{budget}"
            home.mkdir()
            (home / "converted").symlink_to(converted)
            hearth = Hearth(resolve_paths(home).ensure(), model=str(gguf), provider="cpu")
            hearth.load()
            try:
                first = hearth.serve(ServeRequest(
                    messages=tuple(QUESTION), params=greedy, max_tokens=budget * 4 + 200, tools=(WEATHER,),
                    tool_choice=ToolChoice(ToolChoiceMode.FUNCTION, "get_weather"),
                    parallel_tool_calls=False, template_kwargs={"enable_thinking": True, "thinking_budget": budget}))
                [call] = first.tool_calls
                follow = [*QUESTION,
                          {"role": "assistant", "content": "", "tool_calls": [
                              {"id": call.id, "type": "function",
                               "function": {"name": call.name, "arguments": call.arguments}}]},
                          {"role": "tool", "tool_call_id": call.id, "content": "Sunny, 21 C"}]
                second = hearth.serve(ServeRequest(messages=tuple(follow), params=greedy, max_tokens=4, tools=(WEATHER,),
                                                   tool_choice=ToolChoice(ToolChoiceMode.NONE)))
                before = hearth.render_prompt(QUESTION, tools=(WEATHER,))
                new = hearth.render_prompt(follow, tools=(WEATHER,))[len(before):]
                log.info("| %d | %d | %d (%d) | %d | %d | %d | %d |", budget, first.prompt_tokens, len(first.tokens),
                         hearth.count_tokens(first.reasoning), second.prompt_tokens, second.cache.reused_tokens,
                         second.cache.prefilled_tokens, hearth.count_tokens(new))
            finally:
                hearth.close()


if __name__ == "__main__":
    main()
