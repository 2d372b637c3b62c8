"""What a turn request must be before any backend stores it: the checks every backend shares.

Outside engine/session/ (whose package imports the engine) so a backend without a model here (engine/backends/remote.py) uses
them without importing the engine: ``hearth-cli tokenize`` imports no model runtime (test_cli_fast.py).
"""

from __future__ import annotations

from engine.documents import check_attachments, compose_message
from engine.errors import PromptError
from engine.types import TurnRequest


def check_message(request: TurnRequest) -> None:
    """A new message has words or files (or both); files go only with a new message, at most MAX_ATTACHMENTS."""
    if request.attachments:
        if request.user_message is None:
            raise PromptError("attached files go with a new message: this turn has none")
        check_attachments(request.attachments)
    elif request.user_message is not None and not request.user_message.strip():
        raise PromptError("the message is empty: write something to say")


def user_content(request: TurnRequest) -> str | None:
    """The user message the model reads: the attached files' text, then the typed words (engine/documents.py)."""
    if request.user_message is None:
        return None
    return compose_message(request.user_message, request.attachments)


def check_rewrite(request: TurnRequest) -> None:
    if request.regenerate and request.continue_reply:
        raise PromptError("a turn either writes the last reply again or continues it, not both")
    if (request.regenerate or request.continue_reply) and request.user_message is not None:
        raise PromptError("regenerating or continuing a reply answers what is stored: it takes no new message")
