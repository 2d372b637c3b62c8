"""The local server's requests (issue 17), engine side: a request bound to a conversation runs the window's
turn path (engine/session/turn.py: sync → decode → store → save, with no UI events); a stateless one is
answered from the prompt cache (engine/session/prompt_cache.py). Checking a request and binding it to a
stored conversation are engine/serving.py's."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

from engine import serving
from engine.generation import GenerationResult, TextFn, finish
from engine.session import prompt_cache, reply_plan
from engine.session.reply_plan import PieceFn
from engine.session.reply_split import ReplySplit
from engine.session.reports import ResumeReport, fold_prefill
from engine.session.turn import Turns, noop
from engine.types import CacheReport, CancelToken, ModelInfo, PieceKind, ReplyPiece, ServeRequest, ServeResult

ReadyFn = Callable[[int, CacheReport], None]


def serve(turns: Turns, request: ServeRequest, on_text: TextFn | None = None,
          cancel: CancelToken | None = None, on_piece: PieceFn | None = None,
          on_ready: ReadyFn | None = None) -> ServeResult:
    """``Hearth.serve``: raises PromptError / ConversationError for a bad request, ModelNotLoadedError
    without a model — each before anything is stored. ``on_ready(prompt_tokens, cache)``: the prompt is in
    the context, before the first token (a stateless request: Anthropic's ``message_start`` usage)."""
    messages = serving.request_messages(request)
    serving.check_options(request)  # what decoding would refuse, refused before anything is stored
    turns.require()  # ModelNotLoadedError before anything is stored
    options = serving.generation_options(request)
    if request.conversation is not None:
        with turns.locks.held(request.conversation, noop, cancel):
            return _serve_bound(turns, request.conversation, messages, request, options, on_text, cancel, on_piece)
    return _serve_cached(turns, messages, request, options, on_text, cancel, on_piece, on_ready)


def _serve_bound(turns: Turns, cid: str, messages: list[dict], request: ServeRequest, options: dict,
                 on_text: TextFn | None, cancel: CancelToken | None, on_piece: PieceFn | None) -> ServeResult:
    """A bound request down the turn path: its tool results and calls are stored with the conversation, its
    tools and template kwargs rendered with it, and the reply's thinking and calls stored with the reply."""
    loaded = turns.require()
    engine, started = loaded.engine, time.perf_counter()
    binding = serving.plan_binding(turns.conversations, cid, messages)
    plan = reply_plan.plan_reply(engine.template, request, binding.chat)  # bad tools: refused before storing
    # a message too long (or tools that make the prompt so) is refused before it is stored
    loaded.sessions.check_fits_text(cid, plan.render(engine.template).encode("utf-8"))
    chat = serving.store_binding(turns.conversations, binding)
    plan = reply_plan.plan_reply(engine.template, request, chat)  # the chat as stored (its replies' thinking)
    prompt = plan.render(engine.template)
    options = plan.decoding(prompt, options)
    try:
        answered = turns.answer(cid, chat, request.params, request.max_tokens, cancel, on_text=on_text,
                                on_piece=on_piece, started=started, top_logprobs=request.top_logprobs,
                                prompt_text=prompt.encode("utf-8"), split=ReplySplit(plan.parser(prompt)), **options)
    finally:
        if binding.retry is not None:  # a retry that wrote nothing leaves the cut reply shown, as it was
            turns.restore_reply(cid, binding.retry)
    turn, reply = answered.turn, answered.reply
    split = reply_plan.SplitReply(turn.generation, reply.content, reply.reasoning, reply.tool_calls)
    # what this request wrote to the conversation's saved context of its prompt: all it did not reuse, saved
    saved = turn.prompt_tokens - turn.resume.reused_tokens if turn.save is not None and turn.save.ok else 0
    return _served(turn.generation, turn.resume, turn.prompt_tokens, loaded.info, split, saved)


def _serve_cached(turns: Turns, messages: list[dict] | None, request: ServeRequest, options: dict,
                  on_text: TextFn | None, cancel: CancelToken | None, on_piece: PieceFn | None,
                  on_ready: ReadyFn | None = None) -> ServeResult:
    loaded = turns.require()
    engine, started = loaded.engine, time.perf_counter()
    plan = None
    if messages is None:
        text = request.prompt.encode("utf-8")
        key = prompt_cache.thread_key(prompt_cache.raw_first_block(text))
    else:
        plan = reply_plan.plan_reply(engine.template, request, messages)
        text = plan.render(engine.template).encode("utf-8")
        key = prompt_cache.thread_key(plan.first_block(engine.template))
        options = plan.decoding(text.decode("utf-8"), options)
    cache = prompt_cache.PromptCache(loaded.sessions)
    # the saved system prompt is the template's rendering without tools: of no use to a request with them
    prepared = cache.prepare(key, text, messages if plan is None or not plan.offered else None, cancel)
    prompt, report = prepared.prompt, prepared.report
    split = None
    if prepared.logits is None:
        result = GenerationResult(prompt, [], "", "cancelled", report.reused_tokens)
    else:
        if on_ready is not None:
            on_ready(len(prompt), serving.cache_report(report))
        steps = engine.decode(prompt, request.params, request.max_tokens, cancel=cancel,
                              ready_logits=prepared.logits, top_logprobs=request.top_logprobs, **options)
        if plan is None:
            result = finish(steps, _both(on_text, on_piece))
        else:
            split = reply_plan.run_split(steps, plan.parser(text.decode("utf-8")), on_text, on_piece)
            result = split.result
        if result.rebuilt:  # the cached context gave NaN: no later request starts from its files again
            loaded.sessions.drop_sources(prepared.owner, messages, report, len(prompt))
    fold_prefill(result, report, started)
    if plan is None:
        next_text = serving.history_text(engine, messages, text, result.text)
    else:
        content, calls = (split.content, split.calls) if split is not None else ("", ())
        next_text = serving.history_text(engine, messages, text, content,
                                         lambda: plan.render_next(engine.template, content, calls))
    cache.finish(prepared, next_text, _save_points(engine, plan, request, prepared, text))
    return _served(result, report, len(prompt), loaded.info, split, cache.saved_frontier(prepared) - report.reused_tokens)


def _both(on_text: TextFn | None, on_piece: PieceFn | None) -> TextFn | None:
    """A raw completion's pieces are all content: to ``on_text`` and, as pieces, to ``on_piece``."""
    if on_piece is None:
        return on_text

    def both(piece: str) -> None:
        if on_text is not None:
            on_text(piece)
        on_piece(ReplyPiece(PieceKind.CONTENT, piece))

    return both


def _save_points(engine, plan, request: ServeRequest, prepared, text: bytes) -> list[int]:
    """The prompt's token counts at the request's save points (Anthropic's cache_control breakpoints)."""
    if plan is None or not request.save_points:
        return []
    prefixes = []
    for n in sorted(set(request.save_points)):
        if 0 < n <= len(plan.messages):
            try:
                prefixes.append(plan.render_prefix(engine.template, n).encode("utf-8"))
            except Exception:  # noqa: BLE001 (a template that refuses a prefix: that save point is skipped)
                continue
    return reply_plan.save_point_tokens(engine.tokenizer, prepared.prompt, len(prepared.lead), text, prefixes)


def _served(result: GenerationResult, report: ResumeReport, prompt_tokens: int, info: ModelInfo,
            split: reply_plan.SplitReply | None = None, saved_tokens: int = 0) -> ServeResult:
    finish_reason = serving.FINISH_REASONS.get(result.stop_reason, "stop")
    text, reasoning, calls = result.text, "", ()
    if split is not None:
        text, reasoning, calls = split.content, split.reasoning, split.calls
        if calls and finish_reason == "stop":
            finish_reason = serving.TOOL_CALLS
    saved_tokens = max(0, min(saved_tokens, prompt_tokens))
    cache = dataclasses.replace(serving.cache_report(report), saved_tokens=saved_tokens)
    return ServeResult(text, tuple(result.tokens), finish_reason, prompt_tokens, cache, tuple(result.logprobs),
                       result.timings.freeze(info.load_ms), info, reasoning, calls, result.stop_string)
