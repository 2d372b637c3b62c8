"""Which conversations of an import are already here, and what to do with them.

A conversation is already here when its id is taken, or when a conversation with the same creation time
holds the same system prompt and messages (an earlier import as a copy got a new id but kept its
content). The person chooses: skip those, or import them as copies titled "<title> (imported)" so the
two can be told apart. Only candidates with the same creation time and message count have their messages
read, so checking a large import against a large store stays a few indexed queries.
"""

from __future__ import annotations

import hashlib
import json
from enum import StrEnum

from engine.conversations import ConversationStore

COPY_SUFFIX = " (imported)"


class DuplicatePolicy(StrEnum):
    SKIP = "skip"  # leave out conversations already here
    COPY = "copy"  # import them anyway, under new ids, titled "<title> (imported)"


def _fingerprint(system_prompt: str, messages: list[tuple[str, str]]) -> str:
    data = json.dumps([system_prompt, messages], ensure_ascii=False).encode("utf-8")
    return hashlib.sha256(data).hexdigest()


def find_duplicates(store: ConversationStore, conversations: list[dict]) -> list[int]:
    """Indices of the validated ``conversations`` whose id or content already exists in ``store``."""
    taken = store.ids()
    wanted = {(c["created_ms"], len(c["messages"])) for c in conversations}
    candidates: dict[tuple[int, int], list[str]] = {}
    for s in store.summaries():
        key = (s["created_ms"], s["messages"])
        if key in wanted:
            candidates.setdefault(key, []).append(s["id"])
    known: set[str] = set()
    for ids in candidates.values():
        for cid in ids:
            conv = store.get(cid)
            if conv is not None:
                known.add(_fingerprint(conv.system_prompt, [(m.role, m.content) for m in store.messages(cid)]))
    found = []
    for i, c in enumerate(conversations):
        if c.get("id") and c["id"] in taken:
            found.append(i)
        elif (c["created_ms"], len(c["messages"])) in candidates and _fingerprint(
                c["system_prompt"], [(m["role"], m["content"]) for m in c["messages"]]) in known:
            found.append(i)
    return found


def apply_duplicates(conversations: list[dict], duplicates: list[int], policy: DuplicatePolicy | str) -> list[dict]:
    """The conversations to store: without the duplicates (SKIP), or with them as marked copies (COPY)."""
    policy = DuplicatePolicy(policy)
    marked = set(duplicates)
    if policy is DuplicatePolicy.SKIP:
        return [c for i, c in enumerate(conversations) if i not in marked]
    # The id stays: the store gives a copy whose id is taken a new one, and a bundle still finds the
    # copy's saved context by the id it had in the file.
    return [{**c, "title": (c["title"] or "New chat") + COPY_SUFFIX} if i in marked else c
            for i, c in enumerate(conversations)]
