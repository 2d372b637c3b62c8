"""The engine API's vocabulary: what ``engine.api`` takes and gives back.

Frozen dataclasses and string enums only, so a front end (the window's worker, the CLI, the coming
HTTP server) can pass them around, across threads and through Qt signals, as they are. Nothing here
runs a model or touches a file.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from enum import StrEnum

from engine.errors import HearthError, PromptError

# The longest reply when a caller does not say: the same for the window, `chat`, `talk` and `generate`.
DEFAULT_MAX_NEW_TOKENS = 512
# The most alternatives a completion reports per token (OpenAI's API allows 20 as well).
MAX_TOP_LOGPROBS = 20


class CancelToken:
    """Set from any thread; the engine checks it before every forward pass."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self._interrupted = False

    def cancel(self) -> None:
        self._event.set()

    def interrupt(self) -> None:
        """Cancel because Hearth is closing: the reply so far is stored as StopReason.INTERRUPTED, so the
        chat says it was cut off (not stopped by the person) and offers Continue."""
        if not self._event.is_set():  # a reply the person stopped just before stays stopped
            self._interrupted = True  # before the event: a turn that sees it cancelled sees why
        self._event.set()

    @property
    def interrupted(self) -> bool:
        return self._interrupted

    @property
    def cancelled(self) -> bool:
        return self._event.is_set()


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.7
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    repetition_penalty: float = 1.1
    penalty_window: int = 64  # how many recent tokens the repetition penalty looks at
    seed: int | None = None
    greedy: bool = False
    # Prompt-lookup decoding (engine/lookup.py): draft at most this many tokens from earlier context and
    # verify them in one forward pass; 0 turns it off. The tokens (greedy) or their distribution stay the same.
    prompt_lookup: int = 0

    def validate(self) -> None:
        if (not isinstance(self.prompt_lookup, int) or isinstance(self.prompt_lookup, bool)
                or not 0 <= self.prompt_lookup <= 64):
            raise PromptError(f"prompt lookup drafts 0 (off) to 64 tokens, got {self.prompt_lookup!r}")
        if self.seed is not None and (not isinstance(self.seed, int) or not 0 <= self.seed < 2**64):
            # numpy's generator takes none else; refused here, before a turn stores anything
            raise PromptError(f"the seed must be a whole number from 0 to {2**64 - 1}, got {self.seed!r}")
        if self.greedy:
            return
        if not self.temperature >= 0:
            raise HearthError(f"temperature must be 0 or more, got {self.temperature}")
        if self.top_k < 0:
            raise HearthError(f"top-k must be 0 (off) or more, got {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise HearthError(f"top-p must be in (0, 1], got {self.top_p}")
        if not 0 <= self.min_p < 1:
            raise HearthError(f"min-p must be in [0, 1), got {self.min_p}")
        if not self.repetition_penalty > 0:
            raise HearthError(f"repetition penalty must be positive, got {self.repetition_penalty}")

    @classmethod
    def greedy_params(cls) -> SamplingParams:
        return cls(greedy=True, repetition_penalty=1.0)


# enums ------------------------------------------------------------------------------------------------
class ResumeSource(StrEnum):
    LIVE = "live"  # the KV in memory already held (part of) this conversation
    DISK = "disk"  # restored from its verified checkpoint
    REBUILT = "rebuilt"  # a checkpoint failed verification; the model re-reads the text
    COLD = "cold"  # nothing to resume from


class StopReason(StrEnum):
    EOS = "eos"  # an end-of-turn token, or a response_format constraint complete
    STOP = "stop"  # a stop string: the text ends before it
    LENGTH = "length"
    CONTEXT_FULL = "context_full"
    CANCELLED = "cancelled"
    # Cancelled because Hearth closed mid-turn (CancelToken.interrupt), not by the person: decoding never
    # says it; the turn stores it with the reply, and Continue writes on from there as after LENGTH.
    INTERRUPTED = "interrupted"


class ContextBadge(StrEnum):
    """What the sidebar says of a conversation's saved context."""

    LIVE = "live"
    SAVED = "saved"
    STALE = "stale"
    REBUILDING = "rebuilding"
    NONE = "none"


class ContextHealth(StrEnum):
    """A checkpoint's standing after a quick or full check."""

    VALID = "valid"
    STALE = "stale"  # made by another model or tokenizer: rebuilt on open
    DAMAGED = "damaged"
    NONE = "none"


class SetupStage(StrEnum):
    DOWNLOAD = "download"
    CONVERT = "convert"


class ProgressPhase(StrEnum):
    PREFILL = "prefill"  # reading the new part of the prompt during a turn
    REBUILD = "rebuild"  # re-reading a conversation whose saved context failed


# backends (engine/backends/protocol.py) -------------------------------------------------------------------
@dataclass(frozen=True)
class Capabilities:
    """What a backend can do beyond the protocol's core (load a model, run a turn, cancel, forget): a front
    end asks before it offers a feature, rather than catching the error. The local engine can do it all;
    a remote one says what it lacks, and its records carry ``local=None``."""

    saved_context: bool = False  # conversations' context kept on disk between runs (engine.api.saved_contexts, bundles)
    constrained_output: bool = False  # ResponseFormat: JSON objects, JSON schemas
    tools: bool = False  # tool calls in a turn (no backend has them yet)
    raw_completion: bool = False  # complete_raw: a prompt read as it is, no chat template
    logprobs: bool = False  # complete's top_logprobs
    model_switching: bool = False  # switch_model to another model of list_models
    serving: bool = False  # answers the local server's requests (Hearth.serve, the embedded server)
    local_facts: bool = False  # Finished.local and ModelInfo.local are filled (resume source, save, kernels)


# model ---------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SetupProgress:
    stage: SetupStage
    done: int
    total: int  # 0: how far along is not known (a busy indicator)
    step: str = ""  # what is being done now, in words: "layer 12 of 30", "writing the graph"


@dataclass(frozen=True)
class LocalModelFacts:
    """What only a local engine knows of the model it runs (``ModelInfo.local``)."""

    attention: str = "onnxruntime"  # whose attention kernel runs: "hearth" (its own CPU kernel) or ONNX Runtime's
    head: str = "onnxruntime"  # whose output head: "hearth" (from the token table's 8-bit blocks) or ONNX Runtime's
    # whose matmuls: "hearth (avx512vnni)" (the GGUF's blocks, Hearth's kernels, that instruction set) or ONNX Runtime's
    matmul: str = "onnxruntime"


@dataclass(frozen=True)
class ModelInfo:
    name: str  # the GGUF's stem, e.g. "SmolLM2-135M-Instruct-Q4_1"
    provider: str  # "cpu" or "cuda": what actually runs
    weights: str  # the precision that runs
    context_length: int
    note: str = ""  # why the provider differs from the request, or ""
    load_ms: float = 0.0
    kind: str = "chat"  # "chat" (instruction-tuned) or "base" (continues text; chats through a template anyway)
    chat_template: str = "gguf"  # where its chat format comes from: "gguf" or "builtin:<family>"
    chat_template_refused: str = ""  # why the file's own template was set aside for the built-in one, or ""
    key: str = ""  # the library name or GGUF path it was loaded by (what a conversation remembers)
    local: LocalModelFacts | None = None  # what only the local engine knows of it; None from a remote backend

    @property
    def label(self) -> str:
        """How a conversation records the model it was last used with."""
        return f"{self.name} {self.weights}"


@dataclass(frozen=True)
class WeightTypeUse:
    """The tensors of one GGUF type and the form a precision gives them in memory."""

    tensors: int
    form: str  # "packed" (MatMulNBits), "dense", "dense fallback" (no packed form), "unsupported"
    file_bytes: int
    ram_bytes: int  # in the converted model, by this form
    dense_fp32_bytes: int


@dataclass(frozen=True)
class ModelFootprint:
    """What a GGUF holds and an estimate of the memory it takes under one precision."""

    architecture: str
    weights: str  # the precision estimated for
    types: Mapping[str, WeightTypeUse]  # GGUF type name → its tensors
    weights_bytes: int
    dense_fp32_bytes: int  # the same tensors all dequantized to fp32, for comparison
    kv_dtype: str
    context_length: int | None  # None when the architecture cannot run (no config)
    kv_cache_bytes: int | None  # at the full context

    @property
    def quant_types(self) -> dict[str, int]:
        return {name: use.tensors for name, use in self.types.items()}

    def ram_dict(self) -> dict:
        total = None if self.kv_cache_bytes is None else self.weights_bytes + self.kv_cache_bytes
        return {"weights_bytes": self.weights_bytes, "dense_fp32_bytes": self.dense_fp32_bytes,
                "kv_cache_bytes": self.kv_cache_bytes, "kv_dtype": self.kv_dtype,
                "context_length": self.context_length, "total_bytes": total}


@dataclass(frozen=True)
class ModelSource:
    """Where the model to run comes from, before it is loaded (for the self-test and diagnostics)."""

    gguf: str | None  # the GGUF's path, or None when a packaged build ships only the conversion
    bundled: bool  # it is the packaged build's read-only copy
    description: str


# conversations (the text) --------------------------------------------------------------------------------
@dataclass(frozen=True)
class Conversation:
    id: str
    title: str
    system_prompt: str
    settings: Mapping = field(default_factory=dict)
    model: str = ""
    created_ms: int = 0
    updated_ms: int = 0
    model_key: str = ""  # the library name or GGUF path it was last used with ("" for none yet)


@dataclass(frozen=True)
class Attachment:
    """A file attached to a user message (engine/documents.py reads one): what is kept of it, so nothing
    depends on the original file staying where it was."""

    name: str  # the file's name, without its folder
    size: int  # bytes of the original file
    sha256: str  # hex of the original file's bytes
    kind: str  # "text", "markdown", "code", "csv", "json", "html", "pdf", "docx"
    text: str  # the extracted text, as the model reads it
    pages: int | None = None  # a PDF's pages; None for the other kinds


@dataclass(frozen=True)
class Message:
    """A stored message. ``content`` is what the model reads: for a user message with attachments, the files'
    text then the typed words (``engine.documents.compose_message``); ``typed_text`` is the words alone (the
    content itself when there are no attachments)."""

    seq: int
    role: str
    content: str
    created_ms: int = 0
    attachments: tuple[Attachment, ...] = ()
    typed_text: str | None = None  # None: the same as content (filled in by __post_init__)
    # an agent's turns (issue 30): a reply's thinking (and how long it took, None when not known) and the calls
    # it made; a tool message's result answers ``tool_call_id`` (``name``: the tool's, "" when not sent)
    reasoning: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str = ""
    name: str = ""
    thought_ms: int | None = None

    def __post_init__(self) -> None:
        if self.typed_text is None:
            object.__setattr__(self, "typed_text", self.content)

    @property
    def agentic(self) -> bool:
        """It carries a reply's thinking or tool calls, or is a tool's result (the window draws blocks for them)."""
        return bool(self.reasoning or self.tool_calls or self.role == "tool")

    def as_chat(self) -> dict:
        """The message as the chat template reads it (OpenAI's shape): the tool fields and the thinking only
        when there are some, so a chat without them renders as it always did."""
        chat: dict = {"role": self.role, "content": self.content}
        if self.tool_calls:
            chat["tool_calls"] = openai_tool_calls(self.tool_calls)
        if self.tool_call_id:
            chat["tool_call_id"] = self.tool_call_id
        if self.name:
            chat["name"] = self.name
        if self.reasoning:
            chat["reasoning_content"] = self.reasoning
        return chat


@dataclass(frozen=True)
class ReplyFacts:
    """What the store knows of how a reply was written: why it ended (a StopReason value, None when not
    known) and the model that wrote it, in words ("" when not known: replies from before, imports of exports
    from before)."""

    seq: int
    finish: str | None
    model: str


@dataclass(frozen=True)
class ReplyVersions:
    """The versions of one reply (Regenerate keeps the earlier ones), oldest first; the chat continues
    with ``texts[chosen]``."""

    seq: int
    chosen: int
    texts: tuple[str, ...]


@dataclass(frozen=True)
class ConversationSummary:
    id: str
    title: str
    created_ms: int
    updated_ms: int
    model: str
    messages: int
    tokens: int = 0  # tokens of saved context, 0 when none
    model_key: str = ""  # the model it was last used with, as a library name or GGUF path ("" before it had one)


# a turn --------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Resume:
    """How a conversation's context was obtained for a turn (or on opening it)."""

    source: ResumeSource
    reason: str | None = None  # the checkpoint's failure reason (see docs/checkpoint-format.md), else None
    reused_tokens: int = 0  # tokens whose KV was not computed for this request
    prefilled_tokens: int = 0
    elapsed_ms: float = 0.0  # restore + verification + prefill
    restored_tokens: int = 0  # of reused_tokens, how many came from disk
    restore_ms: float = 0.0
    restore_estimate_ms: float | None = None
    prefill_estimate_ms: float | None = None
    message: str = ""  # the specific failure, for logs and details
    plain: str = ""  # the failure in plain words, for the UI
    shared_prefix: bool = False  # what came from disk is the system prompt other chats share, not this chat's own

    def as_dict(self) -> dict:
        d = asdict(self)
        d["source"] = str(self.source)
        for k in ("elapsed_ms", "restore_ms", "restore_estimate_ms", "prefill_estimate_ms"):
            if d[k] is not None:
                d[k] = round(d[k], 3)
        return d


@dataclass(frozen=True)
class SaveResult:
    ok: bool
    reason: str  # why it saved: "turn", "switch", "shutdown", "rebuild", "prefill"
    tokens: int = 0  # the frontier saved
    new_tokens: int = 0  # rows written by this save (a turn's: by all its saves, the prefill's included)
    bytes_written: int = 0  # bytes those rows took on disk
    elapsed_ms: float = 0.0
    error: str = ""  # why a save failed; the turn still succeeds
    file_bytes: int = 0  # the conversation's checkpoint file's size after it (0: none)
    # a turn's: the shared-prefix file (the preamble + system prompt, engine/session/prefix.py) it wrote
    # besides the conversation's own; its rows repeat the conversation's, so not in new_tokens/bytes_written
    prefix_bytes_written: int = 0

    def as_dict(self) -> dict:
        return {**asdict(self), "elapsed_ms": round(self.elapsed_ms, 3)}


@dataclass(frozen=True)
class Timings:
    prefill_ms: float = 0.0
    prefill_tokens: int = 0
    prefill_tokens_per_s: float = 0.0
    decode_ms: float = 0.0
    decode_tokens_per_s: float = 0.0
    ttft_ms: float = 0.0
    load_ms: float = 0.0
    drafted_tokens: int = 0  # prompt lookup: tokens drafted, and how many of them the model agreed with
    accepted_tokens: int = 0

    def as_dict(self) -> dict:
        return {k: round(v, 3) if isinstance(v, float) else v for k, v in asdict(self).items()}


@dataclass(frozen=True)
class TurnRequest:
    """One turn of a stored conversation. ``user_message`` None: answer what is stored (regenerate,
    or after an edit). The conversation is created when it does not exist."""

    conversation: str
    user_message: str | None = None
    params: SamplingParams = field(default_factory=SamplingParams)
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS
    system_prompt: str | None = None  # set the conversation's system prompt first, when given
    # What to do when the chat outgrows the context, when the chat's own setting does not say:
    # "stop" or "drop_oldest" (engine/session/context_policy.py); None: "stop".
    context_policy: str | None = None
    # Regenerate: keep the last reply as an earlier version (``ConversationStore.reply_versions``) and write
    # a new one in its place; when nothing is written, the last reply comes back.
    regenerate: bool = False
    # Continue: write on at the end of the last reply (one stopped by the length limit), the same message.
    continue_reply: bool = False
    # Files attached to ``user_message`` (engine.documents.read_attachment): the stored content is
    # compose_message(user_message, attachments), and the attachments are stored with the message.
    attachments: tuple[Attachment, ...] = ()
    # Tools offered to the model (issue 33): OpenAI's function tools (``{"type": "function", "function": {...}}``),
    # rendered through the chat template; the reply's calls come back in ``Finished.tool_calls``, stored with it.
    tools: tuple[dict, ...] = ()
    tool_choice: ToolChoice = field(default_factory=lambda: ToolChoice())


# the events a turn (or opening a conversation) reports, in order -----------------------------------------
@dataclass(frozen=True)
class Waiting:
    """The conversation is busy in another Hearth process; this turn waits for it."""

    conversation: str


@dataclass(frozen=True)
class Accepted:
    """The turn holds the conversation; the user's message (if any) is stored as ``user_seq``."""

    conversation: str
    user_seq: int | None
    messages: tuple[Message, ...]  # what is stored now, turns added by other processes included
    dropped_messages: int = 0  # stored messages before the model's view (policy "drop_oldest")


@dataclass(frozen=True)
class Resumed:
    """How the chat's context was obtained (opening it, or a turn): only a backend with saved context
    (``Capabilities.saved_context``) reports it."""

    conversation: str
    resume: Resume
    dropped_messages: int = 0  # stored messages before the model's view (policy "drop_oldest")


@dataclass(frozen=True)
class Progress:
    conversation: str
    phase: ProgressPhase
    done: int
    total: int


@dataclass(frozen=True)
class Token:
    conversation: str
    text: str
    context_tokens: int = 0  # tokens in the context with this piece's token (the live context meter); 0: not told
    # the visible reply, or the model's thinking (a template that thinks: the window shows it in its own block)
    kind: str = "content"  # a PieceKind value: CONTENT or REASONING


@dataclass(frozen=True)
class Rebuilt:
    """Opening a conversation rebuilt its context (after ``Resumed`` with source REBUILT). Only a backend
    with saved context (``Capabilities.saved_context``) reports it, as it does ``Resumed``."""

    conversation: str
    tokens: int
    elapsed_ms: float
    cancelled: bool
    save: SaveResult | None


@dataclass(frozen=True)
class LocalTurnFacts:
    """What only a local engine knows of a turn (``Finished.local``): where its context came from, and how
    saving it went (None: nothing was saved)."""

    resume: Resume
    save: SaveResult | None = None


@dataclass(frozen=True)
class Finished:
    conversation: str
    reply: str
    tokens: tuple[int, ...]
    stop_reason: StopReason
    reply_seq: int | None  # the stored reply's seq; None when nothing was written (stopped at once)
    prompt_tokens: int
    context_tokens: int  # tokens in the KV after the turn
    context_limit: int
    timings: Timings
    model: ModelInfo
    dropped_messages: int = 0  # stored messages the model did not read this turn (policy "drop_oldest")
    continued: bool = False  # a Continue: ``reply`` is the whole stored message, ``tokens`` only what was added
    local: LocalTurnFacts | None = None  # where the context came from and how its save went; None from a remote backend
    # what a remote server said of its prefix cache (usage.prompt_tokens_details.cached_tokens); None: not reported
    server_cached_tokens: int | None = None
    # the reply's thinking (``reply`` is the visible text only), how long it took (None: it did not think), and
    # the tool calls it made (a bound server request with tools: the window's own turns make none)
    reasoning: str = ""
    thought_ms: int | None = None
    tool_calls: tuple[ToolCall, ...] = ()


@dataclass(frozen=True)
class TokenLogprob:
    """One generated token's natural-log probability under the raw model distribution (the log-softmax
    of the logits, before repetition penalty, temperature, top-k/top-p/min-p), and the ``k`` most likely
    tokens there, most likely first (ties: lower id first)."""

    token: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()

    def as_dict(self) -> dict:
        return {"token": self.token, "logprob": self.logprob, "top": [[t, lp] for t, lp in self.top]}


@dataclass(frozen=True)
class Completion:
    """A reply stored nowhere (``Hearth.complete``: ``hearth-cli generate``, the server's completions)."""

    prompt_tokens: tuple[int, ...]  # the rendered prompt's ids, generation prompt included
    tokens: tuple[int, ...]  # the reply's ids, the stop token excluded
    text: str
    stop_reason: StopReason
    timings: Timings
    model: ModelInfo
    logprobs: tuple[TokenLogprob, ...] = ()  # one per token of ``tokens`` when asked for, else empty


TurnEvent = Waiting | Accepted | Resumed | Progress | Token | Rebuilt | Finished
EventSink = Callable[[TurnEvent], None]


# saved context administration ---------------------------------------------------------------------------
@dataclass(frozen=True)
class ContextState:
    badge: ContextBadge
    tokens: int
    # The model in words whose saved context this is (its label); with STALE, the other model that saved
    # it (the loaded model has none for the chat). "" when unknown.
    model: str = ""


@dataclass(frozen=True)
class ChatTokens:
    """A chat's size in tokens as it is stored now (``Hearth.note_version_chosen``: after the last reply's
    version changed), and how much of the live context still matches it."""

    conversation: str
    tokens: int  # the context the chat has with the chosen version: its prompt and the reply, as a turn leaves it
    kept: int | None  # of those, the tokens the live context holds already; None when the chat is not live

    @property
    def to_reread(self) -> int | None:
        """Tokens the next turn reads again (the chosen version differs there); None when not known."""
        return None if self.kept is None else self.tokens - self.kept


@dataclass(frozen=True)
class ContextStatus:
    conversation: str
    health: ContextHealth
    reason: str | None = None
    message: str = ""
    tokens: int = 0
    bytes: int = 0
    model: str = ""  # the model in words whose saved context was checked (STALE: another model's), or ""
    # the chat's other saved contexts, (model in words, bytes) each: kept for other models, on disk too
    others: tuple[tuple[str, int], ...] = ()

    @property
    def disk_bytes(self) -> int:
        """Every saved context of the chat: the one checked and those kept for other models."""
        return self.bytes + sum(n for _, n in self.others)


@dataclass(frozen=True)
class ContextReport:
    full: bool  # every checksum was checked, not only headers
    items: Mapping[str, ContextStatus]
    bytes: int
    budget: int
    cancelled: bool = False
    by_kind: Mapping[str, int] = field(default_factory=dict)  # ``bytes`` per kind of file (StoreUsage's)


@dataclass(frozen=True)
class StoreUsage:
    bytes: int
    budget: int
    # ``bytes`` per kind of file: "conversation" (what the browser's rows show, for each chat's model),
    # "prefix" (shared system prompts), "api" (the local server's prompt cache), "orphan" (leftovers)
    by_kind: Mapping[str, int] = field(default_factory=dict)
    # the block store: bytes of blocks more than one saved context uses (counted once in ``bytes``), and
    # bytes it has written since it was made (a save writes only blocks no record held yet)
    shared: int = 0
    written: int = 0


@dataclass(frozen=True)
class GcReport:
    temp_files: int
    orphans: tuple[str, ...]
    evicted: tuple[str, ...]
    bytes: int
    budget: int


@dataclass(frozen=True)
class BundleExported:
    conversations: int
    contexts: int


@dataclass(frozen=True)
class BundleImported:
    used: tuple[str, ...]  # conversations whose saved context verified and was installed
    rebuilt: Mapping[str, str]  # conversation → why its context will be rebuilt on open (a reason id)
    notes: Mapping[str, str] = field(default_factory=dict)  # conversation → one line saying what happened
    trusted: bool = False  # the user trusted the bundle's contexts without this installation's signature
    conversations: Mapping[str, str] = field(default_factory=dict)  # new id → id in the bundle (Bundles.import_bundle)
    skipped: int = 0  # the bundle's chats already here and left out (Bundles.import_bundle with duplicates "skip")
    copied: int = 0  # the bundle's chats already here and imported as marked copies (duplicates "copy")


@dataclass(frozen=True)
class RestoreCheck:
    """A saved context restored into the engine, compared with re-reading the same prompt."""

    resume: Resume
    max_logit_diff: float
    same_next_token: bool
    # How far the two may differ and still be the same computation: float32 differs only by the order of
    # its sums (chunking); fp16 activations, or CUDA's TF32 matrix products, differ by a few units in the
    # last place of the largest logit whenever a kernel for another batch size is chosen.
    tolerance: float = 1e-2

    @property
    def matches(self) -> bool:
        return self.max_logit_diff <= self.tolerance and self.same_next_token


# the model library (engine/library.py) ------------------------------------------------------------------
class ModelStatus(StrEnum):
    READY = "ready"
    NOT_DOWNLOADED = "not downloaded"  # a catalog model not fetched yet
    MISSING = "missing"  # an added file that is gone
    UNSUPPORTED = "unsupported"  # a GGUF this engine cannot run (architecture, tensor types)
    UNREADABLE = "unreadable"  # not a GGUF, damaged, or not readable


class ModelOrigin(StrEnum):
    CATALOG = "catalog"  # resources/models.json, fetched by Hearth
    ADDED = "added"  # a file the user added by path (linked in place, or copied into the models dir)
    FOLDER = "folder"  # a .gguf found in the models folder the user chose
    REMOTE = "remote"  # a model an added remote server lists (engine/remotes.py): its name is NAME/MODEL
    HUB = "hub"  # a GGUF downloaded from the Hugging Face Hub (engine/hub.py)


@dataclass(frozen=True)
class LibraryModel:
    """One model the library knows, with what a picker shows before (and without) loading it.

    Sizes are bytes; memory figures are estimates for the library's precision (int4 unless asked).
    A field the file could not tell (a catalog model not downloaded, an unreadable file) is 0, "" or {}
    — except what the catalog pins (architecture, parameters, quant, context length)."""

    name: str  # the unique key: a catalog key, or a slug of the file's stem ("foo", "foo-2")
    title: str
    source: ModelOrigin
    path: str | None  # the GGUF, or None for a catalog model not downloaded
    status: ModelStatus
    problem: str = ""  # why it cannot be loaded, in plain words ("" when ready or not downloaded)
    architecture: str = ""
    parameters: str = ""  # a short label, e.g. "135M", "8.0B"
    parameter_count: int = 0  # counted from the tensors (0 when unknown)
    quant: str = ""  # a short label, e.g. "Q4_1", "Q4_K_M"
    quant_mix: Mapping[str, int] = field(default_factory=dict)  # GGUF tensor type → tensor count
    file_bytes: int = 0
    context_length: int = 0  # the model's own
    chosen_context: int = 0  # what loading it uses: the user's setting, else the model's own capped to fit memory
    context_setting: int | None = None  # the user's setting (None: automatic)
    converted: bool = False  # a conversion for the library's precision is in the cache
    # Memory (engine/model/memory.py): ram_weights_bytes is the most the model takes whatever its context
    # (loading it: the weights and a transient copy of one matrix); ram_kv_bytes what chosen_context tokens
    # add on top (the KV cache and working memory, past what loading needed). Their sum is the peak.
    ram_weights_bytes: int = 0
    ram_kv_bytes: int = 0
    ram_resident_bytes: int = 0  # the weights once loaded
    kv_bytes_per_token: int = 0  # the KV cache per token of context
    description: str = ""
    license: str = ""
    defaults: Mapping[str, float] = field(default_factory=dict)  # recommended sampling settings (SamplingParams names)
    is_default: bool = False  # what Hearth loads when no model is named

    @property
    def loadable(self) -> bool:
        return self.status == ModelStatus.READY

    @property
    def ram_bytes(self) -> int:
        return self.ram_weights_bytes + self.ram_kv_bytes

    def as_dict(self) -> dict:
        """The ``hearth-cli model ls --json`` entry (a stable contract: README)."""
        d = asdict(self)
        d["source"], d["status"] = str(self.source), str(self.status)
        d["quant_mix"], d["defaults"] = dict(self.quant_mix), dict(self.defaults)
        d["ram_bytes"] = self.ram_bytes
        return d


@dataclass(frozen=True)
class MemoryFit:
    """Whether a model at a context length fits the memory that is free, in numbers and plain words."""

    model: str  # the model's title
    context: int  # tokens of context the KV figure is for
    weights_bytes: int
    kv_bytes: int
    available_bytes: int
    where: str  # "RAM" or "GPU memory"
    fits: bool
    message: str  # the numbers in plain words; says what to do when it does not fit

    @property
    def needed_bytes(self) -> int:
        return self.weights_bytes + self.kv_bytes


# a chat longer than the context ------------------------------------------------------------------------
class ContextPolicy(StrEnum):
    """What a turn does when the chat no longer fits the model's context (a chat's ``context_policy``
    setting; engine/session/context_policy.py)."""

    STOP = "stop"  # refuse the turn (ContextFullError); the message is not stored
    DROP_OLDEST = "drop_oldest"  # the model reads the system prompt and the newest messages that fit


# the local OpenAI-compatible server (issue 17) ----------------------------------------------------------
class ResponseFormatKind(StrEnum):
    TEXT = "text"
    JSON_OBJECT = "json_object"  # any JSON object
    JSON_SCHEMA = "json_schema"  # JSON valid against ``ResponseFormat.schema``


@dataclass(frozen=True)
class ResponseFormat:
    """A constraint on the reply, applied as a mask on the logits at every step (engine/text/constrained.py)."""

    kind: ResponseFormatKind = ResponseFormatKind.TEXT
    schema: Mapping | None = None  # the JSON schema for JSON_SCHEMA
    name: str = ""  # the schema's name, as the OpenAI API carries it


class ToolChoiceMode(StrEnum):
    """OpenAI's ``tool_choice`` (Anthropic's ``auto`` / ``any`` / ``tool`` / ``none`` map onto it)."""

    AUTO = "auto"  # the model decides; a call that does not parse comes back as text
    NONE = "none"  # no call: the tools are still shown to the template, as OpenAI does
    REQUIRED = "required"  # at least one call, of any tool (constrained decoding)
    FUNCTION = "function"  # a call of the tool named by ``ToolChoice.name`` (constrained decoding)


@dataclass(frozen=True)
class ToolChoice:
    mode: ToolChoiceMode = ToolChoiceMode.AUTO
    name: str = ""  # FUNCTION: the tool the reply must call


@dataclass(frozen=True)
class ToolCall:
    """A call the model wrote. ``arguments`` is the JSON text of an object (OpenAI's wire form), exactly as
    the model wrote it, so a client's echo of it renders back to the same prompt bytes."""

    id: str
    name: str
    arguments: str
    index: int = 0  # its place among the reply's calls (OpenAI streams ``delta.tool_calls`` by index)


def openai_tool_calls(calls: tuple[ToolCall, ...] | list[ToolCall]) -> list[dict]:
    """Calls as OpenAI's ``tool_calls`` list: what a chat template and an export receive."""
    return [{"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}} for c in calls]


class PieceKind(StrEnum):
    CONTENT = "content"  # the visible reply
    REASONING = "reasoning"  # text between the template's thinking markers
    TOOL_CALL = "tool_call"  # a whole, parsed call (``ReplyPiece.call``)


@dataclass(frozen=True)
class ReplyPiece:
    """One piece of a reply as it streams, split by kind (engine/text/reply_parse.py)."""

    kind: PieceKind
    text: str = ""
    call: ToolCall | None = None


@dataclass(frozen=True)
class ServeRequest:
    """One stateless request to the server: the whole conversation (``messages``) or a raw ``prompt``.

    A message is ``{"role", "content"}`` with role system, user, assistant or tool; an assistant message may
    carry ``tool_calls`` (OpenAI's shape: ``[{"id", "type": "function", "function": {"name", "arguments"}}]``,
    arguments a JSON string) and ``reasoning_content``; a tool message carries ``tool_call_id`` (and maybe
    ``name``). ``content`` is text ("" for an assistant message that only calls tools)."""

    messages: tuple[Mapping, ...] | None = None  # in order; None for a raw completion
    prompt: str | None = None  # a /v1/completions prompt, read as it is (no chat template)
    params: SamplingParams = field(default_factory=SamplingParams)
    max_tokens: int = DEFAULT_MAX_NEW_TOKENS
    stop: tuple[str, ...] = ()  # the reply ends before the first of these strings (not included)
    presence_penalty: float = 0.0  # OpenAI's: subtracted once from every token already in the reply
    frequency_penalty: float = 0.0  # OpenAI's: subtracted per occurrence in the reply
    top_logprobs: int | None = None  # report each token's logprob and this many alternatives
    response_format: ResponseFormat | None = None
    conversation: str | None = None  # X-Hearth-Conversation: bind to (and store into) this conversation
    # OpenAI function tools, as the template receives them: {"type": "function", "function": {"name",
    # "description", "parameters"}}
    tools: tuple[Mapping, ...] = ()
    tool_choice: ToolChoice = field(default_factory=ToolChoice)
    parallel_tool_calls: bool = True  # False: at most one call per reply
    # Extra variables for the chat template (``chat_template_kwargs``: ``enable_thinking``, ``reasoning_effort``)
    template_kwargs: Mapping = field(default_factory=dict)
    # Message counts after which a saved record is kept (Anthropic's ``cache_control`` breakpoints): the
    # prompt rendered through ``messages[:n]`` is a save point, so a later request sharing it restores it.
    save_points: tuple[int, ...] = ()


@dataclass(frozen=True)
class CacheReport:
    """How a served request's context was obtained (the response's ``hearth`` object and headers)."""

    source: ResumeSource
    reason: str | None = None  # why a saved context was not usable (Reason), else None
    reused_tokens: int = 0  # prompt tokens not computed for this request (live KV or restored)
    prefilled_tokens: int = 0
    restore_ms: float = 0.0
    restored_tokens: int = 0  # of reused_tokens, how many came from disk
    saved_tokens: int = 0  # prompt tokens this request wrote to saved context (Anthropic's cache creation)

    @property
    def cached_tokens(self) -> int:
        """OpenAI's ``usage.prompt_tokens_details.cached_tokens``."""
        return self.reused_tokens


@dataclass(frozen=True)
class ServeResult:
    text: str  # the visible reply: no thinking, no tool calls
    tokens: tuple[int, ...]
    # OpenAI's: "stop" (end of turn or a stop string), "length", "tool_calls", "cancelled"
    finish_reason: str
    prompt_tokens: int
    cache: CacheReport
    logprobs: tuple[TokenLogprob, ...] = ()
    timings: Timings | None = None
    model: ModelInfo | None = None
    reasoning: str = ""  # the text between the thinking markers ("" when the model did not think)
    tool_calls: tuple[ToolCall, ...] = ()
    stop_sequence: str | None = None  # the stop string that ended the reply (Anthropic's ``stop_sequence``)

    @property
    def completion_tokens(self) -> int:
        return len(self.tokens)
