"""A conversion reports its steps and can be cancelled between them, leaving nothing half-installed."""

from __future__ import annotations

import pytest

from engine.api import Hearth
from engine.errors import ConversionCancelledError
from engine.model.convert import ensure_converted
from engine.paths import resolve_paths
from engine.types import CancelToken, SetupProgress, SetupStage


def leftovers(root):
    """Everything in the conversion cache: temporaries (.convert-*) and conversions."""
    return sorted(p.name for p in root.iterdir()) if root.exists() else []


def test_steps_are_reported_in_order(tmp_path, tiny_gguf):
    steps = []
    ensure_converted(tiny_gguf, "int4", tmp_path / "c", report=lambda d, t, s: steps.append((d, t, s)))
    words = [s for _, _, s in steps]
    assert words[:3] == ["checking the model file", "reading the model file", "the token embedding"]
    assert words[3:5] == ["layer 2 of 2", "the output layer"]
    assert words[5:] == ["writing the graph", "saving the conversion", "converted"]
    assert [d for d, _, _ in steps[2:]] == [0, 1, 2, 3, 4, 5] and {t for _, t, _ in steps[2:]} == {5}
    assert steps[0][1] == steps[1][1] == 0  # hashing and reading: how long is not known
    again = []
    ensure_converted(tiny_gguf, "int4", tmp_path / "c", report=lambda d, t, s: again.append(s))
    assert again == ["checking the model file"]  # a cache hit: nothing to convert


@pytest.mark.parametrize("at", ["checking the model file", "reading the model file", "layer 2 of 2",
                                "writing the graph", "saving the conversion"])
def test_cancel_mid_conversion_keeps_nothing_and_a_later_call_converts(tmp_path, tiny_gguf, at):
    root = tmp_path / "converted"
    token = CancelToken()
    seen = []

    def report(done, total, step):
        seen.append(step)
        if step == at:
            token.cancel()  # the person clicks Cancel while this step runs

    with pytest.raises(ConversionCancelledError, match="tiny.gguf was cancelled; nothing was kept"):
        ensure_converted(tiny_gguf, "int4", root, report=report, cancel=token)
    assert seen[-1] == at  # it stopped at the next check, before any further step
    assert [name for name in leftovers(root) if not name.endswith(".sha256.json")] == []  # no temp dir, no conversion
    converted = ensure_converted(tiny_gguf, "int4", root)  # from scratch, without the token
    assert converted.onnx_path.is_file() and (converted.onnx_path.parent / "complete.json").is_file()
    assert [n for n in leftovers(root) if n.startswith(".convert-")] == []


def test_a_callable_cancels_too(tmp_path, tiny_gguf):
    calls = []
    with pytest.raises(ConversionCancelledError):
        ensure_converted(tiny_gguf, "int4", tmp_path / "c", progress=lambda d, t: calls.append(d),
                         cancel=lambda: len(calls) >= 2)
    assert len(calls) == 2 and leftovers(tmp_path / "c") == []


def test_hearth_load_reports_steps_and_cancel_leaves_the_cache_clean(tmp_path, tiny_gguf):
    """Through the API: SetupProgress carries the step; a cancelled load loads nothing; the next one works."""
    paths = resolve_paths(tmp_path / "home").ensure()
    hearth = Hearth(paths, model=str(tiny_gguf), provider="cpu")
    token = CancelToken()
    seen: list[SetupProgress] = []

    def progress(p: SetupProgress) -> None:
        seen.append(p)
        if p.step == "layer 2 of 2":
            token.cancel()

    with pytest.raises(ConversionCancelledError):
        hearth.load(progress, cancel=token)
    assert hearth.model is None and leftovers(paths.converted) == []
    assert {p.stage for p in seen} == {SetupStage.CONVERT} and seen[2].step == "the token embedding"
    seen.clear()
    info = hearth.load(progress=seen.append)
    assert info.name == "tiny" and [n for n in leftovers(paths.converted) if n.startswith(".convert-")] == []
    assert seen[-1].step == "starting the model" and "converted" in [p.step for p in seen]
    hearth.close()


def test_the_cli_meter_shows_the_step_and_skips_steps_of_unknown_length(capsys):
    from engine.cli.common import Progress

    meter = Progress("converting")
    meter.tty = True  # as on a terminal
    meter.setup(SetupProgress(SetupStage.CONVERT, 0, 0, "checking the model file"))  # every load: not shown
    assert capsys.readouterr().err == ""
    meter.setup(SetupProgress(SetupStage.CONVERT, 0, 5, "the token embedding"))
    meter.setup(SetupProgress(SetupStage.CONVERT, 1, 5, "layer 2 of 2"))
    meter.setup(SetupProgress(SetupStage.CONVERT, 5, 5, "converted"))
    meter.setup(SetupProgress(SetupStage.CONVERT, 0, 0, "starting the model"))
    err = capsys.readouterr().err
    first = "converting: 0% (the token embedding)"
    width = len(first)  # later, shorter lines are padded over it
    assert err == ("\r" + first + "\r" + "converting: 20% (layer 2 of 2)".ljust(width)
                   + "\r" + "converting: 100% (converted)".ljust(width) + "\n")
