"""Errors the engine raises on purpose.

Each carries a message written for the person at the keyboard: what went wrong and, where there is
one, what to do about it. The CLI prints ``str(error)`` on one line; the window shows it in a banner.
"""

from __future__ import annotations


class HearthError(Exception):
    """Base class: an expected failure with a message fit to show a user."""


class ModelFileError(HearthError):
    """A model file is missing, truncated, not a GGUF, or internally inconsistent."""


class UnsupportedModelError(HearthError):
    """A well-formed GGUF that this engine cannot run (architecture, tensor type, rope layout)."""


class ModelFetchError(HearthError):
    """Downloading or unpacking the default model failed."""


class PromptError(HearthError):
    """The prompt or messages cannot be run (empty, malformed, longer than the context)."""


class ProviderError(HearthError):
    """An execution provider was asked for and cannot be used."""

    def __init__(self, message: str, reason: str = ""):
        super().__init__(message)
        self.reason = reason or message  # why, in a few words, for a fallback note
