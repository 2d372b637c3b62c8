"""What a request reports: where its KV came from (``ResumeReport``), what a save wrote
(``SaveReport``), a whole turn (``TurnResult``); the resume sources and the session constants."""

from __future__ import annotations

from dataclasses import dataclass

from engine.generation import GenerationResult

LIVE, DISK, REBUILT, COLD = "live", "disk", "rebuilt", "cold"
SAVE_ALIGN = 2048  # during a long prefill, save at every multiple of this many tokens
MIN_PREFIX_TOKENS = 16  # shorter shared prefixes are not worth a file


@dataclass
class ResumeReport:
    source: str
    reason: str | None = None  # a Reason when a checkpoint failed
    reused_tokens: int = 0  # tokens whose KV was not computed for this request
    prefilled_tokens: int = 0
    elapsed_ms: float = 0.0  # restore + verification + prefill
    restored_tokens: int = 0  # of reused_tokens, how many came from disk
    restore_ms: float = 0.0
    restore_estimate_ms: float | None = None
    prefill_estimate_ms: float | None = None
    message: str = ""  # the specific failure, for logs and details
    plain: str = ""  # the failure in plain words, for the UI


@dataclass
class SaveReport:
    ok: bool
    reason: str
    tokens: int = 0  # the frontier saved
    new_tokens: int = 0  # rows written by this save
    bytes_written: int = 0
    elapsed_ms: float = 0.0
    error: str = ""


@dataclass
class TurnResult:
    generation: GenerationResult
    resume: ResumeReport
    save: SaveReport | None
    prompt_tokens: int = 0
