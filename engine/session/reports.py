"""What a request reports: where its KV came from (``ResumeReport``, filled in step by step, frozen
into the API's ``Resume``), what a save wrote (``SaveReport``, the API's ``SaveResult``), a whole turn
(``TurnResult``); the resume sources and the session constants."""

from __future__ import annotations

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
