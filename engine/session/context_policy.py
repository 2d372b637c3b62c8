"""A chat's context policy: what a turn does when the conversation no longer fits the model's context.

``stop``: the turn is refused (``ContextFullError``) and the message is not stored. ``drop_oldest``: the
model reads the system prompt and as many of the newest messages as fit (engine/session/view_window.py);
the stored conversation is never changed. The chat's own choice lives in its ``settings`` JSON under
``context_policy``; a front end may pass a default for chats that have none.
"""

from __future__ import annotations

from collections.abc import Mapping

from engine.errors import ContextPolicyError
from engine.types import ContextPolicy

STOP, DROP_OLDEST = ContextPolicy.STOP, ContextPolicy.DROP_OLDEST
POLICIES = tuple(str(p) for p in ContextPolicy)
SETTING = "context_policy"  # the key in a conversation's settings


def check_policy(value: object, where: str = "the context policy") -> ContextPolicy:
    """``value`` as a ``ContextPolicy``, else ContextPolicyError naming the choices."""
    if not isinstance(value, str) or value not in POLICIES:
        raise ContextPolicyError(f"{where} is {value!r}, which is not one of: {', '.join(POLICIES)}")
    return ContextPolicy(value)


def chat_policy(settings: Mapping, default: str | None = None) -> ContextPolicy:
    """The chat's own policy, else ``default`` (the front end's), else ``stop``; each one checked."""
    if settings.get(SETTING) is not None:
        return check_policy(settings[SETTING], "this chat's setting for a chat longer than the context")
    if default is not None:
        return check_policy(default, "the default for a chat longer than the context")
    return STOP
