"""The local server's requests (issue 17), engine side: a request bound to a conversation runs the window's
turn path (engine/session/turn.py: sync → decode → store → save, with no UI events); a stateless one is
answered from the prompt cache (engine/session/prompt_cache.py). Checking a request and binding it to a
stored conversation are engine/serving.py's."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace

from engine import serving
from engine.generation import GenerationResult, TextFn, finish
from engine.session import prompt_cache
from engine.session.reports import ResumeReport, fold_prefill
from engine.session.turn import Turns, noop
from engine.types import CancelToken, ModelInfo, ReplyPiece, ServeRequest, ServeResult, ToolChoiceMode


def serve(turns: Turns, request: ServeRequest, on_text: TextFn | None = None,
          cancel: CancelToken | None = None, on_piece: Callable[[ReplyPiece], None] | None = None) -> ServeResult:
    """``Hearth.serve``: raises PromptError / ConversationError for a bad request, ModelNotLoadedError
    without a model — each before anything is stored."""
    messages = serving.request_messages(request)
    serving.check_options(request)  # what decoding would refuse, refused before anything is stored
    turns.require()  # ModelNotLoadedError before anything is stored
    options = serving.generation_options(request)
    if request.conversation is not None:
        with turns.locks.held(request.conversation, noop, cancel):
            return _serve_bound(turns, request.conversation, messages, request, options, on_text, cancel, on_piece)
    return _serve_cached(turns, messages, request, options, on_text, cancel)


def _serve_bound(turns: Turns, cid: str, messages: list[dict], request: ServeRequest, options: dict,
                 on_text: TextFn | None, cancel: CancelToken | None,
                 on_piece: Callable[[ReplyPiece], None] | None = None) -> ServeResult:
    loaded = turns.require()
    started = time.perf_counter()
    binding = serving.plan_binding(turns.conversations, cid, messages)
    loaded.sessions.check_fits(cid, binding.chat)  # a message too long is refused before it is stored
    chat = serving.store_binding(turns.conversations, binding)
    calls = request.tool_choice.mode != ToolChoiceMode.NONE  # "none": the tools are shown, no call is parsed
    try:
        answered = turns.answer(cid, chat, request.params, request.max_tokens, cancel, on_text=on_text,
                                on_piece=on_piece, started=started, top_logprobs=request.top_logprobs,
                                tools=request.tools, template_kwargs=request.template_kwargs,
                                parse_calls=calls, parallel_tool_calls=request.parallel_tool_calls, **options)
    finally:
        if binding.retry is not None:  # a retry that wrote nothing leaves the cut reply shown, as it was
            turns.restore_reply(cid, binding.retry)
    turn, reply = answered.turn, answered.reply
    served = _served(turn.generation, turn.resume, turn.prompt_tokens, loaded.info)
    return replace(served, text=reply.content, reasoning=reply.reasoning, tool_calls=reply.tool_calls,
                   finish_reason="tool_calls" if reply.tool_calls else served.finish_reason,
                   stop_sequence=turn.generation.stop_string)


def _serve_cached(turns: Turns, messages: list[dict] | None, request: ServeRequest, options: dict,
                  on_text: TextFn | None, cancel: CancelToken | None) -> ServeResult:
    loaded = turns.require()
    engine, started = loaded.engine, time.perf_counter()
    if messages is None:
        text = request.prompt.encode("utf-8")
        key = prompt_cache.thread_key(prompt_cache.raw_first_block(text))
    else:
        text = engine.render(messages).encode("utf-8")
        key = prompt_cache.thread_key(prompt_cache.chat_first_block(engine.template, messages))
    cache = prompt_cache.PromptCache(loaded.sessions)
    prepared = cache.prepare(key, text, messages, cancel)
    prompt, report = prepared.prompt, prepared.report
    if prepared.logits is None:
        result = GenerationResult(prompt, [], "", "cancelled", report.reused_tokens)
    else:
        result = _decoded(turns, prompt, prepared.logits, request, options, on_text, cancel)
        if result.rebuilt:  # the cached context gave NaN: no later request starts from its files again
            loaded.sessions.drop_sources(prepared.owner, messages, report, len(prompt))
    fold_prefill(result, report, started)
    cache.finish(prepared, serving.history_text(engine, messages, text, result.text))
    return _served(result, report, len(prompt), loaded.info)


def _decoded(turns: Turns, prompt: list[int], logits, request: ServeRequest, options: dict,
             on_text: TextFn | None, cancel: CancelToken | None) -> GenerationResult:
    steps = turns.require().engine.decode(prompt, request.params, request.max_tokens, cancel=cancel,
                                          ready_logits=logits, top_logprobs=request.top_logprobs, **options)
    return finish(steps, on_text)


def _served(result: GenerationResult, report: ResumeReport, prompt_tokens: int, info: ModelInfo) -> ServeResult:
    return ServeResult(result.text, tuple(result.tokens), serving.FINISH_REASONS.get(result.stop_reason, "stop"),
                       prompt_tokens, serving.cache_report(report), tuple(result.logprobs),
                       result.timings.freeze(info.load_ms), info)
