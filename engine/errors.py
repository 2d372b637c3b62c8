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


class NumericalError(HearthError):
    """The model computed NaN or infinity: its activations overflowed the precision it runs in."""


class ModelFetchError(HearthError):
    """Downloading or unpacking the default model failed."""


class PromptError(HearthError):
    """The prompt or messages cannot be run (empty, malformed, longer than the context)."""


class TemplateError(PromptError):
    """A chat template refused the messages, failed while rendering, or ran past its limits."""


class ProviderError(HearthError):
    """An execution provider was asked for and cannot be used."""

    def __init__(self, message: str, reason: str = ""):
        super().__init__(message)
        self.reason = reason or message  # why, in a few words, for a fallback note


class ModelNotInstalledError(ModelFileError):
    """The default model is not installed (and no packaged copy is there): fetch it first."""


class ConversationError(HearthError):
    """A conversation that does not exist, a bad id or message, or an unusable database."""

    # A turn whose reply was written but could not be stored sets this to the reply's text (a Continue's:
    # the whole reply): that text exists nowhere else now, so a front end can still show or print it.
    unstored_reply: str | None = None


class DiskFullError(ConversationError):
    """A write failed because the disk (or the file size limit) is full; what was stored before stays."""


class ConversationBusyError(HearthError):
    """Another Hearth process is running a turn on the conversation and did not finish in time."""


class ModelNotLoadedError(HearthError):
    """A turn was asked for before a model was loaded."""


class TransferError(ConversationError):
    """An import file that is not a valid Hearth export; the message says where and what."""


class ImportCancelledError(TransferError):
    """The user cancelled an import; what it had added was removed (the message says how much)."""


class CheckpointStoreError(HearthError):
    """The saved-context store (its index) cannot be opened; saved context is a cache, text is safe."""


class TurnCancelledError(HearthError):
    """The user stopped a turn while it waited for another process's turn on the conversation."""


# the model library (engine/library.py) --------------------------------------------------------------------
class ModelNotFoundError(ModelFileError):
    """A model name that is neither in the library nor a file; the message lists the known names."""


class ModelTooLargeError(HearthError):
    """Loading the model would not fit in the memory that is free; ``fit`` holds the numbers."""

    def __init__(self, message: str, fit=None):
        super().__init__(message)
        self.fit = fit  # engine.types.MemoryFit


class DownloadCancelledError(ModelFetchError):
    """The user cancelled a download; nothing was installed (a partial file is kept to resume)."""


class ConversionCancelledError(HearthError):
    """The person cancelled a model's conversion; nothing half-built was kept, so the next load starts over."""


class PreferencesError(HearthError):
    """A preference that cannot be kept (out of range, wrong kind); the message names it and its bounds."""


class ContextFullError(PromptError):
    """The conversation the model would have to read is longer than its context window.

    ``tokens`` and ``limit`` are the numbers behind the message; ``policy`` is the chat's context policy
    when it was refused ("stop": letting the chat drop its oldest messages would help; "drop_oldest":
    even the newest message alone does not fit)."""

    def __init__(self, tokens: int, limit: int, policy: str = "stop", message: str | None = None):
        if message is None:
            message = (f"This chat is {tokens:,} tokens, but the model reads at most {limit:,}. Start a new chat "
                       "(it keeps the system prompt) or let this chat drop its oldest messages.")
        super().__init__(message)
        self.tokens, self.limit, self.policy = tokens, limit, policy


class ContextPolicyError(HearthError):
    """A chat's setting for what happens when it outgrows the context is not one of the choices."""


class ContextLengthError(PromptError):
    """A prompt (a server request's, a raw one) is longer than the model's context window; ``tokens`` and
    ``limit`` are the numbers. The server answers it as OpenAI does (``context_length_exceeded``)."""

    def __init__(self, message: str, tokens: int, limit: int):
        super().__init__(message)
        self.tokens, self.limit = tokens, limit


class AttachmentError(HearthError):
    """A file that cannot be attached to a message (engine/documents.py); nothing is sent.

    ``reason`` is one of a stable set a front end can rely on: "too_large", "binary", "encoding", "encrypted",
    "image_only", "unreadable", "unsupported", "empty", "too_many"; ``name`` is the file's name ("" for none)."""

    def __init__(self, message: str, reason: str, name: str = ""):
        super().__init__(message)
        self.reason, self.name = reason, name


# GGUFs from the Hugging Face Hub (engine/hub.py) ---------------------------------------------------------
class HubError(ModelFetchError):
    """Searching, listing or downloading from the Hugging Face Hub failed; the message says what to do."""


class HubOfflineError(HubError):
    """The hub cannot be reached (no network, a closed port, a proxy refusing); local models keep working."""


class HubGatedError(HubError):
    """The repository is gated: its terms must be accepted on huggingface.co and a token given."""

    def __init__(self, message: str, repo: str = ""):
        super().__init__(message)
        self.repo = repo


class HubNotFoundError(HubError):
    """No such repository or file on the hub (or a private one the token cannot see)."""


class HubChecksumError(HubError):
    """A downloaded file does not match the SHA-256 the hub lists for it; the file was deleted."""
