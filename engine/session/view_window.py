"""The model's view of a chat: which stored messages a turn reads, by the chat's context policy.

Under ``stop`` the view is the whole chat, or ``ContextFullError`` when it cannot fit. Under
``drop_oldest`` it is the system prompt and the newest messages that fit, starting at a user message;
the newest user message is always in it. Room for the reply is kept (the turn's longest reply, at most
a quarter of the context), and when messages must go, the view shrinks to about three quarters of what
fits, so the next few turns extend the live KV instead of re-reading from the system prompt each time.

The view depends only on the stored messages, the policy, the context length and the longest reply, so
a fresh process finds the same one (the window shows how many messages are outside it after a
restart, and the saved context matches it). To get that without replaying every past turn exactly,
where the view starts is decided turn by turn on per-message token estimates that err on the long side
(each message tokenized alone, plus the template's overhead and a little slack, cached by content);
only the newest turn is then checked exactly, dropping further whole turns in the rare case the
estimate was short.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass

from engine.errors import ContextFullError, HearthError
from engine.generation import Engine
from engine.session import prefix
from engine.session.context_policy import DROP_OLDEST, STOP, check_policy

log = logging.getLogger(__name__)

REPLY_SHARE = 4  # the room kept for the reply is at most 1/REPLY_SHARE of the context
REFILL = (3, 4)  # after a drop the view holds about this fraction of what fits
ESTIMATE_SLACK = 2  # tokens per message an estimate adds (tokenizing a message alone may merge differently)
FALLBACK_OVERHEAD = 8  # a message's template tokens when the template cannot render the probe
MAX_CACHED_COUNTS = 100_000


@dataclass(frozen=True)
class ViewWindow:
    """What a turn reads. ``messages``: the system prompt (if any) and the kept messages; ``dropped``:
    how many stored messages come before them; ``moved``: the view starts later than it did for the
    previous user message (this turn dropped messages, so a saved context of the old view is useless)."""

    messages: list[dict]
    dropped: int = 0
    moved: bool = False


class ViewPlanner:
    """Plans views on one engine (its template and tokenizer), caching each message's token estimate."""

    def __init__(self, engine: Engine):
        self.engine = engine
        self._counts: dict[bytes, int] = {}
        self._overhead: int | None = None

    def reply_room(self, max_new_tokens: int) -> int:
        """The tokens kept free for the reply under ``drop_oldest``."""
        return max(1, min(max_new_tokens, self.engine.context_length // REPLY_SHARE))

    def plan(self, chat: list[dict], policy: str, max_new_tokens: int,
             live_tokens: list[int] | None = None) -> ViewWindow:
        """The view of ``chat`` (the system prompt first, if any) a turn reads. ``live_tokens``: the live
        KV when it belongs to this chat (``stop`` counts the prompt cheaper with it; ``drop_oldest``
        never uses it, so its view is the same in every process). Raises ContextFullError."""
        check_policy(policy)
        if not any(m["role"] == "user" for m in chat):
            return ViewWindow(list(chat))
        if policy == STOP:
            limit = self.engine.context_length
            n = self.prompt_length(chat, limit, live_tokens)
            if n >= limit:
                raise ContextFullError(n, limit, STOP)
            return ViewWindow(list(chat))
        return self._drop_oldest(chat, max_new_tokens)

    # drop_oldest ----------------------------------------------------------------------------------------
    def _drop_oldest(self, chat: list[dict], max_new_tokens: int) -> ViewWindow:
        system = [m for m in chat[:1] if m["role"] == "system"]
        body = chat[len(system):]
        users = [i for i, m in enumerate(body) if m["role"] == "user"]
        limit = self.engine.context_length
        budget = limit - self.reply_room(max_new_tokens)
        starts = self._estimated_starts(system, body, users, budget)
        start, newest = starts[-1], users[-1]
        while True:  # the newest turn, exactly: whole turns go until it fits with room for the reply
            n = self.prompt_length(system + body[start : newest + 1], budget + 1)
            if n <= budget:
                break
            if start == newest:
                if n < limit:
                    break  # the newest message alone fits, with less room for the reply
                raise ContextFullError(n, limit, DROP_OLDEST, (
                    f"Your message and the system prompt are {n:,} tokens, but the model reads at most "
                    f"{limit:,}. Shorten the message (or the system prompt)."))
            start = next(u for u in users if u > start)
        previous = starts[-2] if len(starts) > 1 else 0
        if start:
            log.info("the model reads the last %d of %d messages (%d tokens of %d)", len(body) - start, len(body),
                     n, limit)
        return ViewWindow(system + body[start:], start, start != previous)

    def _estimated_starts(self, system: list[dict], body: list[dict], users: list[int], budget: int) -> list[int]:
        """Where the view started for each user message's turn, replayed on estimates: it stays put while
        the turn fits ``budget``, else moves to the first user message that leaves it at REFILL of it."""
        ends = [0]
        for m in body:
            ends.append(ends[-1] + self._message_estimate(m))
        base = self._base_estimate(system)
        target = budget * REFILL[0] // REFILL[1]
        starts, j = [], 0  # j: the index in ``users`` of the view's first message
        for k, u in enumerate(users):
            cost = base + ends[u + 1]
            if cost - ends[users[j]] > budget:
                while j < k and cost - ends[users[j]] > target:
                    j += 1
            starts.append(users[j])
        return starts

    # counting -------------------------------------------------------------------------------------------
    def prompt_length(self, messages: list[dict], below: int, live_tokens: list[int] | None = None) -> int:
        """Tokens in the prompt of ``messages``, or an upper bound when that is below ``below`` already (a
        token spells at least one byte, so a short rendering needs no tokenizing). With ``live_tokens``
        the prefix they spell is not tokenized again."""
        tokenizer = self.engine.tokenizer
        text = self.engine.render(messages).encode("utf-8")
        lead = prefix.lead_tokens(tokenizer, text)
        if len(lead) + len(text) < below:
            return len(lead) + len(text)
        kept, spelled = prefix.reusable(tokenizer, live_tokens, lead, text) if live_tokens else (0, 0)
        return (kept or len(lead)) + len(tokenizer.encode(text[spelled:].decode("utf-8")))

    def _message_estimate(self, message: dict) -> int:
        content = message["content"]
        key = hashlib.blake2b(f"{message['role']}\0{content}".encode(), digest_size=16).digest()
        count = self._counts.get(key)
        if count is None:
            if len(self._counts) >= MAX_CACHED_COUNTS:
                self._counts.clear()
            count = self._counts[key] = len(self.engine.tokenizer.encode(content))
        return count + self._message_overhead() + ESTIMATE_SLACK

    def _base_estimate(self, system: list[dict]) -> int:
        """The system prompt, the template's preamble and the reply's opening: a prompt with one short
        user message, less that message's estimate."""
        probe = {"role": "user", "content": "x"}
        whole = len(self.engine.prompt_tokens(system + [probe]))
        return max(0, whole - self._message_estimate(probe) + ESTIMATE_SLACK)

    def _message_overhead(self) -> int:
        """The tokens a template adds around one message's text, measured once."""
        if self._overhead is None:
            render, encode = self.engine.template.render, self.engine.tokenizer.encode
            one = [{"role": "user", "content": "a"}]
            three = one + [{"role": "assistant", "content": "b"}, {"role": "user", "content": "c"}]
            try:
                extra = len(encode(render(three, add_generation_prompt=False))) - len(
                    encode(render(one, add_generation_prompt=False))) - len(encode("b")) - len(encode("c"))
                self._overhead = max(0, -(-extra // 2))  # rounded up
            except HearthError as exc:  # a template that refuses the probe: a generous guess
                log.debug("no template overhead measured: %s", exc)
                self._overhead = FALLBACK_OVERHEAD
        return self._overhead
