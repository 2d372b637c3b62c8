"""The engine's public face: the one way the window, ``hearth-cli`` and the server reach the engine.

It builds backends and the services over them, and re-exports what front ends may use (``__all__``):
``Hearth``, the local backend (engine/backends/local.py, an ``engine.backends.Backend``); the services over
its stores, ``saved_contexts(hearth)`` (badges, checks, budget, reclaim, the restore check) and
``bundles(hearth)``; and the functions a front end needs without a loaded model (the database file,
model files, saved-context files, preferences, imports and exports). ``Hearth`` is a synchronous service
used from one thread (the window's engine thread, the CLI's main thread). Front ends import this module,
``engine.types``, ``engine.errors`` and ``engine.backends`` — nothing deeper (tests/test_architecture.py).

One turn rule everywhere (``Hearth.run_turn``; kept by the session layer's one turn path,
engine/session/turn.py, which a server request bound to a conversation runs too):
1. the conversation's turn lock is taken (another process's turn on it finishes first);
2. the user's message is stored before any model work;
3. the model reads what is stored (turns added elsewhere included) and writes its reply;
4. the reply is stored — a stopped reply keeps what was written — with the model that wrote it
   (``Hearth.model_key``: the conversation remembers it), and only then
5. the context is saved; a failed save (full disk, read-only store) is reported, never costs the reply.

A turn runs on the loaded model, whatever model the conversation remembers: choosing the model is the
front end's (the window switches with ``Hearth.switch_model`` before the turn; ``hearth-cli chat``
loads the remembered one). Saved context is kept per (conversation, model), so a chat moved to another
model and back resumes each model's context from disk.

The conversation text in SQLite is the truth; saved context is a cache that can always be rebuilt.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engine.backends.local import Hearth, model_key_for, open_conversations
from engine.backends.protocol import Backend
from engine.backends.remote import RemoteBackend, open_remote, remote_models
from engine.chat_messages import validate_messages
from engine.checkpoint.block_store import BlockStore
from engine.checkpoint.store import CheckpointStore
from engine.conversations import ConversationStore, check_id
from engine.database_files import (
    DbCheck,
    SoundDatabaseError,
    backup_database_file,
    check_database_file,
    database_file_problem,
    database_way_out,
    restore_database_file,
    salvage_database_file,
)
from engine.db_recovery import RestoreResult, StartCheck
from engine.db_salvage import SalvageResult
from engine.documents import (
    MAX_ATTACHMENTS,
    MAX_FILE_BYTES,
    MAX_PDF_PAGES,
    MAX_TEXT_CHARS,
    attachment_block,
    attachment_from_text,
    compose_message,
    read_attachment,
)
from engine.errors import (
    AttachmentError,
    DownloadCancelledError,
    HearthError,
    HubChecksumError,
    HubError,
    HubGatedError,
    HubNotFoundError,
    HubOfflineError,
)
from engine.fsutil import open_regular
from engine.hub import HubClient, parse_hub_ref
from engine.hub_files import HubFile, HubProgress, HubRepo
from engine.import_dedupe import COPY_SUFFIX, DuplicatePolicy, apply_duplicates, find_duplicates
from engine.importer import import_conversations
from engine.library import ModelLibrary
from engine.model.footprint import model_footprint
from engine.model.precision import DEFAULT_PRECISION, PRECISIONS
from engine.model_files import (
    MAX_CONTEXT_LENGTH,
    ModelFileInfo,
    catalog_entry,
    convert_model_file,
    fetch_catalog_model,
    inspect_model_file,
    resolve_model_file,
    size_words,
    tokenize_file,
    tokenizer_file,
)
from engine.paths import HearthPaths, bundled_model_dir, resolve_paths
from engine.preferences import (
    CONTEXT_POLICIES,
    SETTING_LIMITS,
    TOOL_LIMITS,
    LoadedPreferences,
    Preferences,
    effective_settings,
    recommended_values,
)
from engine.remotes import RemoteError, RemoteRegistry, RemoteServer, split_model_key
from engine.reply_notes import reply_caption
from engine.runtime.providers import PROVIDER_CHOICES
from engine.saved_context_files import (
    KV_ENCODINGS,
    checkpoint_store,
    describe_checkpoint,
    model_identity,
    verify_checkpoint,
)
from engine.search import fts_query, search, snippet_html
from engine.secret_store import SecretError, SecretStore, read_secret_file
from engine.server_key import ServerKeyError, create_server_key, read_server_key, remove_server_key
from engine.text.terminal_safe import log_to_stderr, terminal_safe
from engine.tool_messages import pretty_arguments
from engine.tools.config import ToolConfigError, ToolRegistry, ToolServerConfig
from engine.tools.host import ServerState, ServerStatus, ToolHost, ToolOutcome, ToolSpec
from engine.tools.loop import (
    ABANDONED,
    DENIED,
    INTERRUPTED,
    RUNNING,
    STOPPED,
    CallRecord,
    LoopResult,
    LoopStep,
    PendingCall,
    abandon_calls,
    allow_always,
    always_allowed,
    call_arguments,
    chat_tools,
    deny_call,
    pending_calls,
    run_call,
    run_tool_loop,
    step_limit_text,
)
from engine.transfer import export_json, export_markdown, import_json, read_document, to_document
from engine.turn_lock import DEFAULT_TURN_WAIT_S
from engine.types import (
    DEFAULT_MAX_NEW_TOKENS,
    Attachment,
    Capabilities,
)

if TYPE_CHECKING:
    from engine.services.bundles import Bundles
    from engine.services.saved_contexts import SavedContexts


__all__ = [  # what front ends may use besides the Hearth class (engine.types holds the rest)
    "DEFAULT_MAX_NEW_TOKENS", "DEFAULT_PRECISION", "DEFAULT_TURN_WAIT_S", "PRECISIONS", "PROVIDER_CHOICES",
    "ConversationStore", "Hearth", "HearthPaths", "RestoreResult", "SalvageResult", "StartCheck", "bundle_signed_here",
    "bundled_model_dir",
    "check_id",
    "database_at_start", "default_model_title", "export_json", "export_markdown", "fts_query", "import_conversations",
    "import_json", "log_to_stderr", "ModelLibrary", "terminal_safe",
    "model_footprint", "model_key_for", "open_conversations", "read_bundle", "reply_caption", "resolve_paths", "restore_database",
    "salvage_database", "search", "snippet_html", "to_document",
    # backends (engine/backends) and the local backend's services (engine/services)
    "Backend", "Capabilities", "bundles", "saved_contexts",
    # remote servers (engine/remotes.py, engine/secret_store.py, engine/backends/remote.py)
    "RemoteBackend", "RemoteError", "RemoteRegistry", "RemoteServer", "SecretError", "SecretStore", "open_remote",
    "read_secret_file", "remote_models", "split_model_key",
    # preferences
    "CONTEXT_POLICIES", "SETTING_LIMITS", "LoadedPreferences", "Preferences", "effective_settings", "load_preferences",
    "save_preferences", "recommended_values",
    # imports of conversations already here (engine/import_dedupe.py)
    "COPY_SUFFIX", "DuplicatePolicy", "apply_duplicates", "find_duplicates", "read_document",
    # the window's local-server key (engine/server_key.py)
    "ServerKeyError", "create_server_key", "read_server_key", "remove_server_key",
    # an agent's turns in a conversation (engine/tool_messages.py)
    "pretty_arguments",
    # MCP servers' tools (engine/tools: the configured servers, the running ones, a call's outcome)
    "ServerState", "ServerStatus", "ToolConfigError", "ToolHost", "ToolOutcome", "ToolRegistry", "ToolServerConfig",
    "ToolSpec", "TOOL_LIMITS",
]
# what hearth-cli needs without a loaded model: model files, saved-context files, the database file, chat messages
__all__ += [
    "MAX_CONTEXT_LENGTH", "ModelFileInfo", "catalog_entry", "convert_model_file", "fetch_catalog_model",
    "inspect_model_file", "resolve_model_file", "size_words", "tokenize_file", "tokenizer_file",
    "KV_ENCODINGS", "BlockStore", "CheckpointStore", "checkpoint_store",
    "describe_checkpoint", "model_identity", "verify_checkpoint",
    "DbCheck", "SoundDatabaseError", "backup_database_file", "check_database_file", "database_file_problem",
    "database_way_out", "restore_database_file", "salvage_database_file",
    "open_regular", "validate_messages",
    "RenderedPrompt", "render_prompt",
]
# GGUFs from the Hugging Face Hub (engine/hub.py): search, list, download, install; the token for gated repos
__all__ += [
    "HubClient", "HubFile", "HubProgress", "HubRepo", "parse_hub_ref", "DownloadCancelledError", "HubChecksumError",
    "HubError", "HubGatedError", "HubNotFoundError", "HubOfflineError", "SecretError", "read_secret_file",
]
# documents attached to a message (engine/documents.py; docs/documents.md): read a file off the UI thread
__all__ += [
    "Attachment", "AttachmentError", "MAX_ATTACHMENTS", "MAX_FILE_BYTES", "MAX_PDF_PAGES", "MAX_TEXT_CHARS",
    "attachment_block", "attachment_from_text", "compose_message", "read_attachment",
]

# the tool loop of a chat turn (engine/tools/loop.py, issue 33): its stored state and its steps
__all__ += [
    "ABANDONED", "DENIED", "INTERRUPTED", "RUNNING", "STOPPED", "CallRecord", "LoopResult", "LoopStep", "PendingCall",
    "abandon_calls", "allow_always", "always_allowed", "call_arguments", "chat_tools", "deny_call", "pending_calls",
    "run_call", "run_tool_loop", "step_limit_text",
]


def database_at_start(paths: HearthPaths) -> StartCheck:
    """The conversation database's check and the day's backup (slow on a large file: not on a UI thread)."""
    from engine import db_recovery

    return db_recovery.at_start(paths.conversations_db)


def restore_database(paths: HearthPaths) -> RestoreResult:
    """Put the newest sound backup in place of a damaged database, keeping the damaged file aside."""
    from engine import db_recovery

    source, damaged = db_recovery.restore(paths.conversations_db)
    return RestoreResult(source, damaged)


def salvage_database(paths: HearthPaths) -> SalvageResult:
    """With no sound backup: replace a damaged database by one holding every row that can still be read,
    keeping the damaged file aside. Every connection to it must be closed first."""
    from engine import db_recovery

    return db_recovery.salvage(paths.conversations_db)


# the local backend's services (engine/services): what only a backend with saved context on disk offers ----
def saved_contexts(backend: Backend) -> SavedContexts:
    """Saved-context administration over ``backend``'s checkpoint store (badges, checks, budget, reclaim,
    the restore check); cheap, made for each use. HearthError for a backend without saved context."""
    from engine.services.saved_contexts import SavedContexts

    return SavedContexts(_local(backend))


def bundles(backend: Backend) -> Bundles:
    """Export and import ``.hearth`` bundles (conversations with their saved context) over ``backend``'s
    stores; cheap, made for each use. HearthError for a backend without saved context."""
    from engine.services.bundles import Bundles

    return Bundles(_local(backend))


def _local(backend: Backend) -> Hearth:
    if not backend.capabilities.saved_context or not isinstance(backend, Hearth):
        raise HearthError("this engine keeps no saved context here: there is none to administer or bundle")
    return backend


def read_bundle(path: Path) -> tuple[list[dict], dict[str, str]]:
    """A ``.hearth`` bundle's conversations (validated) and its context entries, without the model."""
    from engine.bundle import read_bundle as read

    return read(path)


def bundle_signed_here(path: Path, paths: HearthPaths) -> bool:
    """Whether this installation signed the bundle, so its saved contexts are used without asking."""
    from engine.bundle import open_zip, signed_manifest
    from engine.install_key import install_key

    with open_zip(Path(path)) as z:
        signed, _ = signed_manifest(z, Path(path).name, install_key(paths.data))
    return signed is not None


# preferences (the defaults every chat starts from) ------------------------------------------------------
def load_preferences(paths: HearthPaths) -> LoadedPreferences:
    """The preferences in the data dir (defaults when there are none); a damaged file gives the defaults
    and says why in ``problems``, never raises."""
    from engine.preferences import preferences_path, read_preferences

    return read_preferences(preferences_path(paths))


def save_preferences(paths: HearthPaths, prefs: Preferences) -> None:
    """Keep ``prefs`` (atomically, private); PreferencesError for a value out of range, OSError for the disk."""
    from engine.preferences import preferences_path, write_preferences

    write_preferences(preferences_path(paths), prefs)


def default_model_title() -> str:
    from engine.model.fetch import default_model

    return default_model().title


# the version (issue 18: Help → About) ----------------------------------------------------------------------
def hearth_version() -> str:
    """This Hearth's version, as the package declares it (engine/__init__.py)."""
    from engine import __version__

    return __version__


# the prompt a model reads (hearth-cli render, issue 30) ---------------------------------------------------
@dataclass(frozen=True)
class RenderedPrompt:
    """What the chat template makes of a request: the prompt text (the generation prompt included), its
    token count (BOS included when the model adds one), where the template came from ("gguf" or
    "builtin:<family>") and how the model writes tool calls (``ReplyFormat.tool_style``)."""

    prompt: str
    tokens: int
    template: str
    tool_format: str


def render_prompt(paths: HearthPaths, model: str | None, messages: list[dict], tools: list[dict] | None = None,
                  template_kwargs: dict[str, Any] | None = None) -> RenderedPrompt:
    """The exact prompt ``model``'s chat template renders for OpenAI-shaped ``messages`` and ``tools``, as a
    server request with them reads it (``Hearth.render_prompt``'s steps, on a template read without the
    engine). Reads the GGUF's header, tokenizer and template only (no weights, no ONNX Runtime);
    PromptError for bad messages, tools or kwargs, TemplateError when the template refuses them."""
    from engine import serving
    from engine.errors import PromptError
    from engine.model.gguf_file import GGUFModel
    from engine.session.reply_plan import plan_reply
    from engine.text.builtin_templates import template_for
    from engine.text.tokenizer import Tokenizer
    from engine.types import ServeRequest

    request = ServeRequest(messages=tuple(messages), tools=tuple(tools or ()), template_kwargs=dict(template_kwargs or {}))
    checked = serving.request_messages(request)  # before the model file is read: bad input fails fast
    gguf = GGUFModel(tokenizer_file(paths, model))
    tokenizer = Tokenizer.from_gguf(gguf)
    template = template_for(gguf, tokenizer)
    if template is None:
        raise PromptError(f"{gguf.path.name} has no chat template, and its vocabulary fits none of Hearth's "
                          "built-in formats")
    plan = plan_reply(template, request, checked)
    text = plan.render(template)
    ids = tokenizer.encode(text)
    bos = tokenizer.specials.bos
    extra = int(tokenizer.add_bos and bos is not None and (not ids or ids[0] != bos))  # as Engine.encode_prompt
    return RenderedPrompt(text, len(ids) + extra, template.template_source, plan.fmt.tool_style)

