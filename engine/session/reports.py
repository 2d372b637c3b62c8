"""What a request reports: where its KV came from (``ResumeReport``, filled in step by step, frozen
into the API's ``Resume``), what a save wrote (``SaveReport``, the API's ``SaveResult``), a whole turn
(``TurnResult``) and the typed steps a turn's model work yields (``Ready``, then the decode's ``Step``s,
``Decoded``, then the ``TurnResult``); the resume sources and the session constants."""

from __future__ import annotations

import time
from dataclasses import MISSING, dataclass, fields
from types import SimpleNamespace

from engine.generation import GenerationResult
from engine.types import Resume, ResumeSource
from engine.types import SaveResult as SaveReport

LIVE, DISK, REBUILT, COLD = ResumeSource.LIVE, ResumeSource.DISK, ResumeSource.REBUILT, ResumeSource.COLD
SAVE_ALIGN = 2048  # during a long prefill, save at every multiple of this many tokens
MIN_PREFIX_TOKENS = 16  # shorter shared prefixes are not worth a file
_RESUME_DEFAULTS = {f.name: f.default for f in fields(Resume) if f.default is not MISSING}


class ResumeReport(SimpleNamespace):
    """A ``Resume`` (engine/types.py: its fields and their meaning) being filled in by the restore and
    prefill steps; ``freeze`` gives the API's frozen one."""

    def __init__(self, source: str, **values: object):
        super().__init__(**{**_RESUME_DEFAULTS, **values, "source": ResumeSource(source)})

    def freeze(self) -> Resume:
        return Resume(**vars(self))


@dataclass
class TurnResult:
    generation: GenerationResult
    resume: ResumeReport
    save: SaveReport | None
    prompt_tokens: int = 0


@dataclass(frozen=True)
class Ready:
    """The prompt is in the KV (``report`` says where its context came from); decoding comes next."""

    report: ResumeReport


@dataclass(frozen=True)
class Decoded:
    """The reply is decoded, its timings folded in; nothing is saved yet. The consumer stores the reply
    before it asks for the next step (the save): an exception there skips the save."""

    generation: GenerationResult
    prompt_tokens: int


def fold_prefill(result: GenerationResult, report: ResumeReport, started: float) -> None:
    """Count the restore and prefill (done before decoding, since ``started``: a ``perf_counter``) in the
    result's timings: the one place a turn's or a served request's timings are put together."""
    t = result.timings
    t.prefill_ms, t.prefill_tokens = report.elapsed_ms, report.prefilled_tokens
    t.prefill_tokens_per_s = t.prefill_tokens / (t.prefill_ms / 1000) if t.prefill_ms > 0 else 0.0
    t.ttft_ms = t.ttft_ms + report.elapsed_ms if t.ttft_ms else (time.perf_counter() - started) * 1000
    result.reused_tokens = report.reused_tokens
