"""Completions stored nowhere (``hearth-cli generate``, ``--raw``): the live KV is saved for its
conversation first, then the prompt is decoded with the same typed steps as a turn."""

from __future__ import annotations

from collections.abc import Sequence

from engine.errors import PromptError
from engine.generation import TextFn, finish
from engine.session.turn import Loaded, Turns
from engine.types import Completion, ResponseFormat, SamplingParams, StopReason


def complete(turns: Turns, messages: list[dict], params: SamplingParams | None, max_new_tokens: int,
             on_text: TextFn | None, cancel, **decoding) -> Completion:
    """A reply to chat ``messages`` (checked first), rendered by the model's template."""
    from engine.text.chat_template import validate_messages

    validate_messages(messages)
    loaded = turns.require()
    return complete_tokens(loaded, loaded.engine.prompt_tokens(messages), params, max_new_tokens, on_text, cancel,
                           **decoding)


def complete_raw(turns: Turns, prompt: str, params: SamplingParams | None, max_new_tokens: int,
                 on_text: TextFn | None, cancel, **decoding) -> Completion:
    """A continuation of ``prompt`` read as it is (BOS in front when the model asks for one)."""
    if not prompt:
        raise PromptError("the prompt is empty: write something to continue")
    loaded = turns.require()
    return complete_tokens(loaded, loaded.engine.encode_prompt(prompt), params, max_new_tokens, on_text, cancel,
                           **decoding)


def complete_tokens(loaded: Loaded, prompt: list[int], params: SamplingParams | None, max_new_tokens: int,
                    on_text: TextFn | None, cancel, *, top_logprobs: int | None = None, stop: Sequence[str] = (),
                    presence_penalty: float = 0.0, frequency_penalty: float = 0.0,
                    response_format: ResponseFormat | None = None) -> Completion:
    engine, sessions, info = loaded.engine, loaded.sessions, loaded.info
    if sessions.active is not None:
        sessions.switch_away()  # the live KV belongs to a conversation: save it before reuse
    result = finish(engine.decode(prompt, params, max_new_tokens, cancel=cancel, top_logprobs=top_logprobs, stop=stop,
                                  presence_penalty=presence_penalty, frequency_penalty=frequency_penalty,
                                  response_format=response_format), on_text)
    return Completion(tuple(result.prompt_tokens), tuple(result.tokens), result.text, StopReason(result.stop_reason),
                      result.timings.freeze(info.load_ms), info, tuple(result.logprobs))
