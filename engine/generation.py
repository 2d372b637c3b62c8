"""The engine: a model, its tokenizer and template, and the one KV cache it owns; prefill and decode.

The cache is explicit. ``tokens`` lists the ids whose rows the cache holds; ``truncate`` cuts it at
any position; ``export_kv``/``import_kv`` copy rows out and back (checkpoints move rows through the
cache's row protocol instead: runtime/kv_protocol.py). A new prompt reuses the longest common token
prefix of what is cached and prefills only the rest.

Decoding options beyond sampling: stop strings (the reply ends before the first one; streamed text
never shows part of one: engine/text/stop_strings.py), OpenAI's presence/frequency penalties, and a
``response_format`` constraint applied as a logits mask (engine/text/constrained.py).

Context policy: a prompt must leave room for at least one new token, otherwise ``PromptError``;
generation stops with ``stop_reason == "context_full"`` when the window fills up.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, fields
from types import SimpleNamespace

import numpy as np

from engine import types
from engine.errors import ContextLengthError, HearthError, NumericalError, PromptError
from engine.lookup import Backoff, propose
from engine.model.convert import ConvertedModel
from engine.model.gguf_file import GGUFModel
from engine.runtime.runner import ModelRunner
from engine.sampling import Sampler, SamplingParams, check_top_logprobs, token_logprob
from engine.text import builtin_templates
from engine.text.chat_template import ChatTemplate
from engine.text.constrained import Constraint
from engine.text.profile import model_kind
from engine.text.stop_strings import StopStringFilter
from engine.text.stream import StreamDecoder
from engine.text.tokenizer import Tokenizer
from engine.types import CancelToken, ResponseFormat

log = logging.getLogger(__name__)

ProgressFn = Callable[[int, int], None]  # (tokens done, tokens total)
TextFn = Callable[[str], None]
DEFAULT_PREFILL_CHUNK = 512


class Timings(SimpleNamespace):
    """The API's ``Timings`` (engine/types.py: its fields) while they are measured; ``freeze`` gives it."""

    def __init__(self, **values: float):
        super().__init__(**{**{f.name: f.default for f in fields(types.Timings)}, **values})

    def freeze(self, load_ms: float = 0.0) -> types.Timings:
        return types.Timings(**{**vars(self), "load_ms": load_ms})


@dataclass(frozen=True)
class Step:
    """One piece of a reply as ``Engine.decode`` shows it: ``text`` (never empty; never part of a stop
    string), the ``token`` whose sampling released it (None for text flushed at the end), and ``context``:
    the tokens the context holds with that token in it."""

    text: str
    token: int | None
    context: int


@dataclass
class GenerationResult:
    prompt_tokens: list[int]
    tokens: list[int]
    text: str
    # "eos" (an end-of-turn token, or a response_format constraint complete), "stop" (a stop string: the
    # text ends before it, ``tokens`` include the one that completed it), "length", "context_full", "cancelled"
    stop_reason: str
    reused_tokens: int
    timings: Timings = field(default_factory=Timings)
    logprobs: list[types.TokenLogprob] = field(default_factory=list)  # one per token, when asked for
    rebuilt: bool = False  # the reused context gave NaN logits, so the prompt was prefilled again
    stop_string: str | None = None  # stop_reason "stop": the stop string that ended the reply


class Engine:
    def __init__(self, runner: ModelRunner, tokenizer: Tokenizer, template: ChatTemplate,
                 model: ConvertedModel | None = None, prefill_chunk: int = DEFAULT_PREFILL_CHUNK):
        self.runner = runner
        self.tokenizer = tokenizer
        self.template = template
        self.model = model
        self.prefill_chunk = prefill_chunk
        self.cache = runner.new_cache()
        self.tokens: list[int] = []
        self.kind = "chat"  # or "base": a pretrained model that continues text (engine.text.profile)
        self.context_limit: int | None = None  # the user's context length setting, at most the model's own

    @classmethod
    def load(cls, converted: ConvertedModel, provider: str = "auto", threads: int | None = None, *,
             cpu_fallback: bool = True) -> Engine:
        """``cpu_fallback=False``: CUDA or a ProviderError (for a conversion made for CUDA)."""
        gguf = GGUFModel(converted.gguf_path)
        tokenizer = Tokenizer.from_gguf(gguf)
        template = cls.template_for(gguf, tokenizer)
        runner = ModelRunner(converted.onnx_path, provider, threads, cpu_fallback=cpu_fallback)
        engine = cls(runner, tokenizer, template, converted)
        engine.kind = model_kind(gguf)
        return engine

    @staticmethod
    def template_for(gguf: GGUFModel, tokenizer: Tokenizer) -> ChatTemplate:
        """The GGUF's chat template, else the built-in one for its family (``template_source`` says which)."""
        template = builtin_templates.template_for(gguf, tokenizer)
        if template is None:
            raise PromptError(f"{gguf.path.name} has no chat template, and its vocabulary fits none of Hearth's "
                              f"built-in formats ({', '.join(f.name for f in builtin_templates.FAMILIES)})")
        return template

    @property
    def stop_ids(self) -> frozenset[int]:
        """Ids that end the reply: the GGUF's EOS/EOT and turn ends, and the built-in format's turn end."""
        return builtin_templates.stop_ids(self.tokenizer, self.template)

    # facts --------------------------------------------------------------------------------------
    @property
    def context_length(self) -> int:
        """The longest prompt + reply: the model's own context, or less when the user chose less. The KV
        shape a checkpoint records stays the model's own, so saved context survives a change of setting."""
        own = self.runner.config.context_length
        return own if self.context_limit is None else min(own, self.context_limit)

    def set_context_limit(self, tokens: int | None) -> None:
        if tokens is not None and tokens < 16:
            raise PromptError(f"a context length of {tokens} tokens is too short (16 at least)")
        self.context_limit = tokens

    @property
    def provider(self) -> str:
        return self.runner.provider

    # prompts ------------------------------------------------------------------------------------
    def render(self, messages: list[dict]) -> str:
        return self.template.render(messages, add_generation_prompt=True)

    def prompt_tokens(self, messages: list[dict]) -> list[int]:
        return self.encode_prompt(self.render(messages))

    def encode_prompt(self, text: str) -> list[int]:
        """``text`` as it is (no template), with BOS in front when the model's ``add_bos`` asks for it."""
        ids = self.tokenizer.encode(text)
        bos = self.tokenizer.specials.bos
        if self.tokenizer.add_bos and bos is not None and (not ids or ids[0] != bos):
            ids = [bos, *ids]
        return ids

    def check_fits(self, prompt: Sequence[int]) -> None:
        self.check_length(len(prompt))

    def check_length(self, n: int) -> None:
        """A prompt of ``n`` tokens must leave room for at least one new token."""
        if n == 0:
            raise PromptError("the prompt is empty: write a message first")
        if n >= self.context_length:
            raise ContextLengthError(
                f"the conversation is {n} tokens but the model's context window holds "
                f"{self.context_length}; shorten it or start a new conversation", n, self.context_length)

    # the KV cache ---------------------------------------------------------------------------------
    def truncate(self, n: int) -> None:
        """Keep the first ``n`` cached tokens."""
        self.cache.truncate(n)
        del self.tokens[n:]
        if n == 0:
            self.cache.shrink_to_fit()

    def reset(self, keep_buffers: bool = False) -> None:
        """Empty the cache. ``keep_buffers``: keep its capacity, for a restore that may reuse it
        (fresh memory costs page faults: ~50 ms for an 8k-token cache); the caller shrinks after."""
        if keep_buffers:
            self.tokens.clear()
            self.cache.truncate(0)
        else:
            self.truncate(0)

    def export_kv(self, start: int = 0, end: int | None = None) -> tuple[list[int], np.ndarray, np.ndarray]:
        end = len(self.tokens) if end is None else end
        keys, values = self.cache.export(start, end)
        return self.tokens[start:end], keys, values

    def import_kv(self, tokens: Sequence[int], keys: np.ndarray, values: np.ndarray, start: int = 0) -> None:
        """Put saved rows back at ``start``; on any error the cache is emptied, never half-loaded."""
        if len(tokens) != keys.shape[2] or start > len(self.tokens):
            raise ValueError("tokens and KV rows disagree")
        try:
            self.truncate(start)
            self.cache.load(keys, values, start)
            self.tokens.extend(int(t) for t in tokens)
        except Exception:
            self.reset()
            raise

    def common_prefix(self, prompt: Sequence[int]) -> int:
        n = min(len(self.tokens), len(prompt))
        a = np.asarray(self.tokens[:n])
        b = np.asarray(prompt[:n])
        diff = np.flatnonzero(a != b)
        return int(diff[0]) if diff.size else n

    def prefill(self, tokens: Sequence[int], progress: ProgressFn | None = None,
                cancel: CancelToken | None = None) -> np.ndarray | None:
        """Run ``tokens`` after the cache in chunks; return the last position's logits (None if cancelled)."""
        total = len(tokens)
        logits = None
        done = 0
        if total:  # grow the cache once for the whole prefill, not once per chunk (each growth copies it)
            self.cache.reserve(min(len(self.tokens) + total, self.context_length))
        while done < total:
            if cancel is not None and cancel.cancelled:
                return None
            # Chunks end on multiples of the chunk size, so a prefill's frontiers (and the
            # checkpoints saved at them) fall on the same positions however it started.
            step = self.prefill_chunk - len(self.tokens) % self.prefill_chunk
            chunk = list(tokens[done : done + step])
            logits = self.runner.forward(chunk, self.cache)
            self.tokens.extend(chunk)
            done += len(chunk)
            if progress:
                progress(done, total)
        return None if logits is None else logits[-1]

    def sync(self, prompt: Sequence[int], progress: ProgressFn | None = None,
             cancel: CancelToken | None = None) -> tuple[np.ndarray | None, int]:
        """Make the cache hold exactly ``prompt``; return (last logits, tokens reused)."""
        self.check_fits(prompt)
        keep = min(self.common_prefix(prompt), len(prompt) - 1)  # the last token must run for its logits
        self.truncate(keep)
        return self.prefill(prompt[keep:], progress, cancel), keep

    def _numerical_advice(self) -> str:
        """Why NaN, and what to do, for the precision this model runs in (the advice to switch to int4
        was once given to a model already running int4)."""
        from engine.model.precision import get_precision

        name = self.model.precision if self.model is not None else ""
        try:
            compute = get_precision(name).compute if name else "float32"
        except HearthError:  # an unknown name: advice as for fp32
            compute = "float32"
        if compute == "float16":
            return (f"its activations overflowed the fp16 that --weights {name} computes in; "
                    "run it with --weights int4 or fp32")
        return (f"it already computes in fp32 (--weights {name or 'fp32'}), so the model file's weights are "
                "likely damaged (the context was dropped: the next turn rebuilds it)")

    # generation -----------------------------------------------------------------------------------
    def generate(
        self,
        prompt: Sequence[int],
        params: SamplingParams | None = None,
        max_new_tokens: int = 256,
        on_text: TextFn | None = None,
        progress: ProgressFn | None = None,
        cancel: CancelToken | None = None,
        ready_logits: np.ndarray | None = None,
        top_logprobs: int | None = None,
        stop: Sequence[str] = (),
        presence_penalty: float = 0.0,
        frequency_penalty: float = 0.0,
        response_format: ResponseFormat | None = None,
        grammar: str | None = None,
        show_specials: Collection[str] = (),
    ) -> GenerationResult:
        """``decode`` run to its end: its text pieces go to ``on_text`` (a caller that only wants the result)."""
        steps = self.decode(prompt, params, max_new_tokens, progress, cancel, ready_logits, top_logprobs, stop,
                            presence_penalty, frequency_penalty, response_format, grammar, show_specials)
        return finish(steps, on_text)

    def decode(
        self,
        prompt: Sequence[int],
        params: SamplingParams | None = None,
        max_new_tokens: int = 256,
        progress: ProgressFn | None = None,
        cancel: CancelToken | None = None,
        ready_logits: np.ndarray | None = None,
        top_logprobs: int | None = None,
        stop: Sequence[str] = (),
        presence_penalty: float = 0.0,
        frequency_penalty: float = 0.0,
        response_format: ResponseFormat | None = None,
        grammar: str | None = None,
        show_specials: Collection[str] = (),
    ) -> Iterator[Step | GenerationResult]:
        """Decode a reply to ``prompt``, yielding a ``Step`` for every piece of text as it is shown, then
        the ``GenerationResult`` last. The consumer runs at each step before the next forward pass (a
        cancel set there stops the reply after that piece). ``ready_logits``: the cache already holds exactly
        ``prompt`` and these are its last position's logits (a caller that prefilled it itself).
        ``top_logprobs``: also report each token's log-probability (of the raw distribution, before penalties
        and masks) and that many most likely tokens (None: not at all). ``stop``: the reply ends before the
        first of these strings. ``presence_penalty``/``frequency_penalty``: OpenAI's, from -2 to 2, over the
        reply's tokens. ``response_format``: constrain the reply to JSON (ConstraintError, a PromptError, for
        a bad schema). ``grammar``: an llguidance grammar the reply must follow instead (a forced tool call:
        engine/text/tool_grammar.py). ``show_specials``: special tokens' texts that are part of the reply's text
        (the markers the reply parser reads, engine/text/reply_format.reply_markers). Bad options raise at the
        first ``next``, before any model work."""
        params = params or SamplingParams()
        sampler = Sampler(params, presence_penalty, frequency_penalty)
        stops = StopStringFilter(stop)
        if max_new_tokens < 1:
            raise PromptError("max new tokens must be at least 1")
        stop_ids = self.stop_ids
        if grammar is not None and response_format is not None:
            raise PromptError("a reply can follow one constraint: a response format or a forced tool call, not both")
        constraint = (Constraint(self.tokenizer, grammar, stop_ids) if grammar is not None
                      else Constraint.for_format(response_format, self.tokenizer, stop_ids))  # before any work
        if top_logprobs is not None:
            try:
                check_top_logprobs(top_logprobs)
            except ValueError as exc:
                raise PromptError(str(exc)) from None
        timings = Timings()
        start = time.perf_counter()
        if ready_logits is not None and self.tokens == list(prompt):
            logits, reused = ready_logits, len(prompt)
        else:
            logits, reused = self.sync(prompt, progress, cancel)
        timings.prefill_ms = (time.perf_counter() - start) * 1000
        timings.prefill_tokens = len(prompt) - reused
        if timings.prefill_ms > 0:
            timings.prefill_tokens_per_s = timings.prefill_tokens / (timings.prefill_ms / 1000)
        result = GenerationResult(list(prompt), [], "", "cancelled", reused, timings)
        if logits is None:
            yield result
            return

        shown = frozenset(i for i in (self.tokenizer.token_id(t) for t in show_specials) if i is not None)
        stream = StreamDecoder(self.tokenizer, shown - stop_ids)
        pieces: list[str] = []
        history = list(prompt)
        counts = np.zeros(logits.size, dtype=np.float32) if sampler.has_reply_penalties else None
        # Prompt lookup: ``draft`` lists drafted tokens the cache already holds past self.tokens, and
        # ``ahead`` the logits after each of them (from the one verification pass that ran them).
        lookup = params.prompt_lookup if self.runner.can_verify else 0
        draft: list[int] = []
        ahead: list[np.ndarray] = []
        try:
            yield from self._decode_loop(prompt, sampler, stops, stop_ids, constraint, top_logprobs, progress,
                                         cancel, max_new_tokens, timings, start, result, logits, reused, stream,
                                         pieces, history, counts, lookup, draft, ahead)
        finally:  # rows of a rejected or unused draft are scratch past the accepted context
            if self.cache.length > len(self.tokens):
                self.cache.truncate(len(self.tokens))

    def _decode_loop(self, prompt, sampler, stops, stop_ids, constraint, top_logprobs, progress, cancel,
                     max_new_tokens, timings, start, result, logits, reused, stream, pieces, history, counts,
                     lookup, draft, ahead) -> Iterator[Step | GenerationResult]:
        decode_start = None
        backoff = Backoff()
        drafted = 0  # length of the draft in flight, to tell how many of it were accepted

        def show(text: str, token: int | None) -> Iterator[Step]:
            if text:  # the token is not in the cache yet: the context it makes is one more
                pieces.append(text)
                yield Step(text, token, len(self.tokens) + 1)

        while True:
            allowed = constraint.allowed() if constraint is not None else None
            try:
                token = sampler.sample(logits, history, counts, allowed, draft[0] if draft else None)
            except NumericalError as exc:
                if reused and not result.tokens:  # maybe the reused context: rebuilt once from the prompt
                    log.warning("NaN logits after reusing %d cached tokens: rebuilding the context", reused)
                    self.reset()
                    logits, reused = self.sync(prompt, progress, cancel)
                    result.reused_tokens, result.rebuilt = reused, True
                    if logits is None:
                        yield result
                        return
                    continue
                self.reset()  # never leave a chat on a context that gives NaN: the next turn rebuilds it
                raise NumericalError(f"{exc}: {self._numerical_advice()}") from None
            if decode_start is None:
                timings.ttft_ms = (time.perf_counter() - start) * 1000
                decode_start = time.perf_counter()
            if token in stop_ids:
                result.stop_reason = "eos"
                break
            if constraint is not None:
                constraint.advance(token)
            result.tokens.append(token)
            if top_logprobs is not None:
                result.logprobs.append(token_logprob(logits, token, top_logprobs))
            history.append(token)
            if counts is not None:
                counts[token] += 1
            yield from show(stops.push(stream.push(token)), token)
            if stops.stopped:
                result.stop_reason, result.stop_string = "stop", stops.matched
                break
            if constraint is not None and constraint.done:  # nothing but the end may follow: end now
                result.stop_reason = "eos"
                break
            if len(result.tokens) >= max_new_tokens:
                result.stop_reason = "length"
                break
            if len(self.tokens) + 1 >= self.context_length:
                result.stop_reason = "context_full"
                break
            if cancel is not None and cancel.cancelled:
                result.stop_reason = "cancelled"
                break
            if draft and draft[0] == token:  # the model agrees with the draft: its logits are computed
                draft.pop(0)
                self.tokens.append(token)
                logits = ahead.pop(0)
                timings.accepted_tokens += 1
                continue
            if drafted:  # the draft in flight ended: all accepted, or rejected at some token
                backoff.outcome(drafted - len(draft))
                drafted = 0
            if draft:  # rejected: the cache goes back to the accepted context
                draft.clear()
                ahead.clear()
                self.cache.truncate(len(self.tokens))
            room = min(lookup, self.context_length - len(self.tokens) - 2, max_new_tokens - len(result.tokens))
            proposed = propose(history, room) if room > 0 and backoff.ready() else []
            out = self.runner.forward([token, *proposed], self.cache, last=1 + len(proposed))
            out = out[-1 - len(proposed):]
            self.tokens.append(token)
            logits = out[0]
            if proposed:
                draft.extend(proposed)
                ahead.extend(out[1:])
                timings.drafted_tokens += len(proposed)
                drafted = len(proposed)
        if not stops.stopped:
            yield from show(stops.push(stream.flush()), None)
            yield from show(stops.flush(), None)
            if stops.stopped:  # a stop string completed while a longer one it might begin was pending
                result.stop_reason, result.stop_string = "stop", stops.matched
        result.text = "".join(pieces)
        steps = len(self.tokens) - len(prompt)  # decode forward passes actually run
        timings.decode_ms = (time.perf_counter() - decode_start) * 1000
        if steps > 0 and timings.decode_ms > 0:
            timings.decode_tokens_per_s = steps / (timings.decode_ms / 1000)
        yield result


def finish(steps: Iterable[Step | GenerationResult], on_text: TextFn | None = None) -> GenerationResult:
    """Run a ``decode`` to its result, handing each piece of text to ``on_text``."""
    for step in steps:
        if isinstance(step, GenerationResult):
            return step
        if on_text is not None:
            on_text(step.text)
    raise RuntimeError("a decode ended without its result")
