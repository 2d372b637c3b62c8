"""The server's prompt cache: stateless requests answered from the longest verified prefix of their prompt.

A client of the local server (a coding agent, a script) resends the whole conversation on every request.
Each request's rendered prompt (or raw prompt) is matched, by bytes as chat sessions are, against the
live KV and the checkpoints saved for earlier requests; the longest verified prefix is kept or restored
and only the rest is prefilled.

How requests map to files. A request belongs to a *thread* keyed by the SHA-256 of its first block: the
rendering of the system prompt and the first user message (a raw prompt: its first ``RAW_KEY_BYTES``
bytes). A thread has one or more *branches*, each one append-only file ``api-<key>-<branch>-<model>.hkv``
owned by ``#api-<key>-<branch>`` in ``ChatSessions`` (kind ``api`` in the store: same budget, eviction
and ``kv ls`` as chats). A request picks, in order:

1. the live KV's branch, when the live KV is this thread's and its file's last frontier spells a prefix
   of the prompt (``live``);
2. else the branch whose file's last frontier spells a prefix of the prompt, the longest (``disk``;
   ``rebuilt`` with the reason when it fails verification: the file is deleted or cut back as chats' are);
3. else (every branch diverged, or none exists) a *new* branch, seeded from the longest verified
   prefix among the live KV and the other branches' frontiers (Restorer.load), or cold.

So a growing conversation always appends to its one file, and a conversation that diverges from another
(same system prompt and first message, different later turns) starts its own file rather than cutting
the other's back. Restores here are never adaptive: a branch's file must be loaded to be appended to.

Save policy (after ds4's server). At the end of a request the live KV is cut to what the *next* request
will re-send (the prompt, then the reply as the template renders it in history: a stop token or stop
string the client never sees is dropped), then saved when the thread's file is new and the prompt is
long (``SAVE_BLOCK`` tokens or more: a record at the last block boundary before the prompt's last
``SAVE_TAIL`` tokens, one at the prompt's end, one at the reply's end), or when ``SAVE_EVERY`` or more
rows are unsaved. Otherwise the rows stay live, and are saved when the live KV is about to be replaced
(a chat turn or another thread: ``ChatSessions.switch_away``), during a long prefill (every
``SAVE_ALIGN`` tokens) and at shutdown (``Hearth.close``).
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from engine.checkpoint.chain import CHAIN_SUFFIX
from engine.checkpoint.format import CheckpointError
from engine.checkpoint.store import API_NAME_PREFIX, API_OWNER_MARK, SUFFIX, Entry, is_api_owner, model_tag
from engine.generation import CancelToken
from engine.session import repair
from engine.session.prefix import lead_tokens, matching_records, reusable
from engine.session.reports import DISK, LIVE, REBUILT, ResumeReport, SaveReport
from engine.session.restore import Restorer
from engine.session.sessions import ChatSessions
from engine.text.chat_template import ChatTemplate

log = logging.getLogger(__name__)

SAVE_BLOCK = 256  # a long first prompt is saved at a multiple of this many tokens
SAVE_TAIL = 8  # ... before its last few tokens, which the next request may tokenize differently
SAVE_EVERY = 512  # save at the end of a request that left at least this many rows unsaved
RAW_KEY_BYTES = 128  # a raw prompt's thread is keyed by its first bytes (a shorter one is cheap to re-read)
MAX_BRANCHES = 1000
_BRANCH = re.compile(r"[0-9]{3}")


def thread_key(first_block: bytes) -> str:
    """A thread's key: hex of the SHA-256 of its first block (32 characters, as file names use)."""
    return hashlib.sha256(first_block).hexdigest()[:32]


def chat_first_block(template: ChatTemplate, messages: list[dict]) -> bytes:
    """The rendering of the system prompt and the first user message: the same in every request of a thread."""
    first_user = next((i for i, m in enumerate(messages) if m["role"] == "user"), len(messages) - 1)
    return template.render(messages[: first_user + 1], add_generation_prompt=False).encode("utf-8")


def raw_first_block(prompt: bytes) -> bytes:
    return prompt[:RAW_KEY_BYTES]


def branch_owner(key: str, branch: int) -> str:
    return f"{API_OWNER_MARK}{API_NAME_PREFIX}{key}-{branch:03d}"


@dataclass
class Branch:
    owner: str
    number: int
    entry: Entry


@dataclass
class Prepared:
    """A request's prompt in the KV: its tokens, the last position's logits (None: cancelled), the report."""

    owner: str
    prompt: list[int]
    logits: np.ndarray | None
    report: ResumeReport
    lead: list[int]


class PromptCache:
    """The server's requests on one engine's ``ChatSessions`` (sharing its live KV, store and budget)."""

    # the save policy (module docstring); a test on a model with a tiny context scales them down
    save_block, save_tail, save_every = SAVE_BLOCK, SAVE_TAIL, SAVE_EVERY

    def __init__(self, sessions: ChatSessions):
        self.sessions = sessions

    @property
    def engine(self):
        return self.sessions.engine

    def branches(self, key: str) -> list[Branch]:
        """The thread's branches under the loaded model, by the index (file names, not owners: the index
        may have lost the owner)."""
        tag = model_tag(self.sessions.identity.model_fp)
        head = f"{API_NAME_PREFIX}{key}-"
        found: dict[int, Branch] = {}
        for tail in (f"-{tag}{SUFFIX}", f"-{tag}{CHAIN_SUFFIX}"):  # a checkpoint file, then its chain if both
            for e in self.sessions.store.entries(kind="api"):
                middle = e.name[len(head): -len(tail)]
                if e.name.startswith(head) and e.name.endswith(tail) and _BRANCH.fullmatch(middle):
                    found[int(middle)] = Branch(branch_owner(key, int(middle)), int(middle), e)
        return list(found.values())

    def prepare(self, key: str, text: bytes, messages: list[dict] | None,
                cancel: CancelToken | None = None) -> Prepared:
        """Fill the KV with the longest verified prefix of ``text`` for the thread ``key``, prefill the
        rest; the live KV then belongs to the branch chosen (see the module docstring)."""
        sessions = self.sessions
        lead = lead_tokens(self.engine.tokenizer, text)
        live = sessions.active if is_api_owner(sessions.active) and sessions.active.startswith(
            branch_owner(key, 0)[:-3]) else None
        if live is not None and sessions.dirty:
            kept, _ = reusable(self.engine.tokenizer, self.engine.tokens, lead, text)
            if kept < len(self.engine.tokens):  # the request leaves unsaved rows behind: they stay their branch's
                sessions.save("switch")
        branches = self.branches(key)
        clean = [b for b in branches if _spells_prefix(b.entry, text)]
        live_branch = next((b for b in branches if b.owner == live), None)
        seeded: ResumeReport | None = None
        if live is not None and (live_branch is None or live_branch in clean):
            owner = live
        elif clean:
            owner = max(clean, key=lambda b: b.entry.text_len).owner
        else:
            owner = self._new_branch(key, branches)
            seeded = self._seed(owner, text, lead, [b for b in branches if b.owner != live], live is not None)
        adaptive, sessions.adaptive = sessions.adaptive, False  # a branch's file is loaded to be appended to
        try:
            logits, prompt, report = sessions.sync_text(owner, text, cancel=cancel, messages=messages)
        finally:
            sessions.adaptive = adaptive
        if seeded is not None and seeded.source != LIVE:
            # sync_text saw the seeded KV as its own live KV: say where it came from
            report.source, report.reason = seeded.source, seeded.reason
            report.message, report.plain = seeded.message, seeded.plain
            report.restored_tokens, report.restore_ms = seeded.restored_tokens, report.restore_ms + seeded.restore_ms
        return Prepared(owner, prompt, logits, report, lead)

    def finish(self, prepared: Prepared, next_text: bytes | None, save_points: Sequence[int] = ()) -> SaveReport | None:
        """After the reply: keep in the KV only what the next request will resend (``next_text``: the
        prompt and the reply as history renders it; None: only the prompt is sure), then save by the
        policy in the module docstring. ``save_points``: prompt token counts the client marked (Anthropic's
        cache_control breakpoints): each is saved as a record of its own, whatever the policy says."""
        sessions, engine = self.sessions, self.engine
        if sessions.active != prepared.owner or not engine.tokens:
            return None
        keep, _ = reusable(engine.tokenizer, engine.tokens, prepared.lead, next_text or b"")
        if next_text is None or keep < len(prepared.prompt) - 1:
            keep = min(len(engine.tokens), len(prepared.prompt))
        if keep < len(engine.tokens):
            engine.truncate(keep)
        entry = sessions.store.conversation_entry(prepared.owner, sessions.identity.model_fp)
        have = entry.tokens if entry is not None else 0
        n, prompt_len = len(engine.tokens), len(prepared.prompt)
        if not sessions.dirty or n <= have:
            return None
        marked = [b for b in save_points if have < b <= min(n, prompt_len)]
        if not (marked or (have == 0 and prompt_len >= self.save_block) or n - have >= self.save_every):
            return None
        aligned = (min(prompt_len, n) - self.save_tail) // self.save_block * self.save_block
        return sessions.save("turn", boundaries=sorted({b for b in (aligned, prompt_len, *marked) if have < b < n}))

    def saved_frontier(self, prepared: Prepared) -> int:
        """How many tokens of the request's branch are saved now (0: none)."""
        entry = self.sessions.store.conversation_entry(prepared.owner, self.sessions.identity.model_fp)
        return entry.tokens if entry is not None else 0

    # a new branch ------------------------------------------------------------------------------------------
    @staticmethod
    def _new_branch(key: str, branches: list[Branch]) -> str:
        number = max((b.number for b in branches), default=-1) + 1
        if number >= MAX_BRANCHES:  # a thread forked a thousand times: reuse the first number (its file is cut)
            number = 0
        return branch_owner(key, number)

    def _seed(self, owner: str, text: bytes, lead: list[int], others: list[Branch], live_is_thread: bool) -> ResumeReport:
        """Give the new branch ``owner`` the longest verified prefix of ``text`` among the live KV (when it
        is this thread's) and the other branches' saved frontiers; the KV is then ``owner``'s."""
        sessions, engine = self.sessions, self.engine
        tokenizer = engine.tokenizer
        live_bytes = 0
        if live_is_thread:
            kept, live_bytes = reusable(tokenizer, engine.tokens, lead, text)
            live_bytes = live_bytes if kept else 0
        best, best_bytes, failure = None, live_bytes, None
        for b in others:
            matched, problem = self._frontier_in(b, text)
            failure = failure or problem
            if matched > best_bytes:
                best, best_bytes = b, matched
        report = ResumeReport(LIVE)
        origins: list[str] | None = None  # None: the live KV goes on, its rows its old branch's
        if best is None:
            if not live_bytes:
                sessions.switch_away()
                origins = []
            elif sessions.dirty:  # the live KV goes on as the new branch: its old branch keeps its rows
                sessions.save("switch")
        else:
            sessions.switch_away()
            restorer = Restorer(engine, sessions.store, sessions.identity, sessions.throughput, sessions._files,
                                adaptive=False)
            loaded, problem = restorer.load(best.entry, text, lead, None)
            failure, origins = failure or problem, restorer.origins
            if loaded:
                report.source, report.restored_tokens = DISK, loaded
        if failure is not None:
            report.source, report.reason = REBUILT, failure.reason
            report.message, report.plain = str(failure), failure.plain
        sessions.adopt(owner, origins)
        log.info("prompt cache: new branch %s from %d cached tokens", owner, len(engine.tokens))
        return report

    def _frontier_in(self, branch: Branch, text: bytes) -> tuple[int, CheckpointError | None]:
        """(bytes of ``text`` the branch's longest matching frontier spells, the failure of an unusable
        file, which is then deleted as chats' are): record headers only, the rows are checked on load."""
        store = self.sessions.store
        try:
            with store.open(branch.entry.name) as reader:
                reader.read_header()
                reader.check_identity(self.sessions.identity)
                records, _ = reader.scan()
        except CheckpointError as exc:
            repair.discard(store, branch.entry.name, exc)
            return 0, exc
        usable = matching_records(records, text)
        return (usable[-1].text_len if usable else 0), None


def _spells_prefix(entry: Entry, text: bytes) -> bool:
    """The file's last frontier (as the index knows it) spells a prefix of ``text``."""
    return 0 < entry.text_len <= len(text) and hashlib.sha256(text[: entry.text_len]).digest() == entry.text_sha

