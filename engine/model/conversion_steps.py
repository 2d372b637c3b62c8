"""What a conversion is doing, in words, and the point where a cancel stops it.

A conversion runs for seconds to minutes, so it reports each step ("layer 12 of 30", "writing the
graph") and, before each one, looks whether the person cancelled. A cancel raises
``ConversionCancelledError`` there; ``ensure_converted`` then removes what it had built.
"""

from __future__ import annotations

from collections.abc import Callable

from engine.errors import ConversionCancelledError
from engine.types import CancelToken

ProgressFn = Callable[[int, int], None]  # done, total
StepFn = Callable[[int, int, str], None]  # done, total (0: not known), what is being done now
Cancel = CancelToken | Callable[[], bool] | None

CHECKING = "checking the model file"
READING = "reading the model file"
EMBEDDING = "the token embedding"
OUTPUT = "the output layer"
WRITING = "writing the graph"
SAVING = "saving the conversion"


def is_cancelled(cancel: Cancel) -> bool:
    """A CancelToken's state, or what a callable says (None: never cancelled)."""
    if cancel is None:
        return False
    if isinstance(cancel, CancelToken):
        return cancel.cancelled
    return bool(cancel())


def step_reporter(progress: ProgressFn | None, report: StepFn | None) -> StepFn | None:
    """One step callback from the two a caller may give: ``report`` gets every step; the older ``progress``
    (counts only) gets the steps whose total is known, so a cache hit still reports nothing to it."""
    if progress is None:
        return report

    def both(done: int, total: int, step: str) -> None:
        if total:
            progress(done, total)
        if report is not None:
            report(done, total, step)

    return both


class ConversionSteps:
    """Reports the steps of one model's conversion and raises at the next one once it is cancelled."""

    def __init__(self, model_name: str, report: StepFn | None = None, cancel: Cancel = None):
        self.model_name, self.report, self.cancel = model_name, report, cancel
        self.n_layers = 0

    def check(self) -> None:
        if is_cancelled(self.cancel):
            raise ConversionCancelledError(f"the conversion of {self.model_name} was cancelled; nothing was kept, "
                                           "and loading the model again converts it from the start")

    def step(self, done: int, total: int, text: str) -> None:
        """Stop here if cancelled, else say what comes next."""
        self.check()
        if self.report is not None:
            self.report(done, total, text)

    # the graph's layers: the layers, the output layer, writing and saving the graph --------------------
    @property
    def total(self) -> int:
        return self.n_layers + 3

    def start_layers(self, n_layers: int) -> None:
        self.n_layers = n_layers
        self.step(0, self.total, EMBEDDING)

    def graph_progress(self, done: int, _total: int) -> None:
        """The graph builder's report after each layer (``done`` of n_layers) and after the output layer
        (n_layers + 1): between layers is where a cancel takes effect."""
        n = self.n_layers
        if done < n:
            self.step(done, self.total, f"layer {done + 1} of {n}")
        elif done == n:
            self.step(done, self.total, OUTPUT)
        else:
            self.step(n + 1, self.total, WRITING)

    def saving(self) -> None:
        self.step(self.n_layers + 2, self.total, SAVING)

    def done(self) -> None:
        if self.report is not None:  # past the point of no return: no cancel check
            self.report(self.total, self.total, "converted")
