"""Text from stored conversations, checkpoint headers and the model, made safe to print to a terminal.

Any of it may be hostile (a message planted through the local server, a GGUF's name, a bundle's title):
an ESC or C1 byte starts a sequence that can retitle the window, recolour or rewrite the screen, and a
bidi override reorders what is shown. Human-readable CLI output passes through :func:`terminal_safe`,
which writes those characters as visible escapes; ``--json`` output keeps the text exact. Log records on
stderr pass through :class:`TerminalSafeFormatter`.
"""

from __future__ import annotations

import logging
import re

# C0 controls but tab and newline, DEL, C1 controls, and the bidi embeddings, overrides and isolates
_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def terminal_safe(text: str) -> str:
    """``text`` with every control character but ``\\n`` and ``\\t`` written as ``\\x1b``, ``\\u202e`` …"""
    return _UNSAFE.sub(_escape, text)


class TerminalSafeFormatter(logging.Formatter):
    """Log records as :class:`logging.Formatter` writes them, with control characters escaped: a message
    may quote stored text, a model's file name or a template's error, and a traceback an exception's text."""

    def format(self, record: logging.LogRecord) -> str:
        return terminal_safe(super().format(record))


def log_to_stderr(level: int) -> None:
    """Send log records of ``level`` and above to stderr, escaped (the CLI's, ``serve``'s and the app's
    logging, configured once per process)."""
    handler = logging.StreamHandler()  # stderr
    handler.setFormatter(TerminalSafeFormatter("%(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=level, handlers=[handler])
