"""Conversations on one engine: find the saved KV that serves a conversation, verify it, resume; save back.

The engine holds one live KV cache. ``ChatSessions`` decides, for each request, how much of it can
be kept (``live``), whether a checkpoint should fill it (``disk``), or whether it must be built by
the model: ``rebuilt`` after a checkpoint failed verification (the reason is reported), ``cold``
when there was nothing to resume from. Text is the ground truth; the KV is matched to it by bytes.

One concern per module:
  sessions.py  ``ChatSessions``: the requests (prepare, sync, a turn, switching, closing, forgetting)
  prefix.py    prefix matching by bytes: BOS handling, reusable prefixes, saved frontiers, shared text
  restore.py   restore planning: live, disk, shared prefix or cold; the adaptive choice; loading a
               file with fallback to its earlier records
  repair.py    deleting a damaged file or cutting it back to its last good record
  saving.py    append-only saves, the shared-prefix save, what each file holds
  reports.py   the reports, a turn's typed steps, the timing fold and constants
  turn.py      ``Turns``: the one turn path (turn rule, storing, the view, opening a chat)
  serve.py     the server's requests (a bound one runs the turn path); complete.py: stored-nowhere replies
  context_policy.py, view_window.py   which stored messages a turn reads when the chat outgrows the context
Rows move between the cache and the files through the cache's row protocol
(engine/runtime/kv_protocol.py), so none of these knows the cache's layout.
"""

from engine.session.prefix import common_prefix_len
from engine.session.reports import (
    COLD,
    DISK,
    LIVE,
    MIN_PREFIX_TOKENS,
    REBUILT,
    SAVE_ALIGN,
    ResumeReport,
    SaveReport,
    TurnResult,
)
from engine.session.sessions import ChatSessions

__all__ = ["COLD", "DISK", "LIVE", "MIN_PREFIX_TOKENS", "REBUILT", "SAVE_ALIGN", "ChatSessions", "ResumeReport",
           "SaveReport", "TurnResult", "common_prefix_len"]
