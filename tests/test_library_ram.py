"""The library's RAM estimate against what loading each catalog model really takes: the peak resident set
of a fresh process, measured with /proc (Linux), within 20%.

"Loading at N tokens" here means ``Hearth.load()`` and then reading a prompt that fills about N tokens
of context: on the CPU the KV cache grows with the conversation, so a bare load would leave the KV
part of the estimate untested. The baseline is taken after ONNX Runtime and the engine are imported,
so what is measured is the model's own memory, as the estimate means it.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from engine.api import ModelLibrary
from engine.model.convert import ensure_converted
from engine.model.fetch import load_manifest
from engine.paths import HearthPaths
from tests.conftest import TEST_CACHE

CONTEXT = 1024
MEASURE = r"""
import json, sys
from pathlib import Path

def status():
    values = {}
    for line in open("/proc/self/status"):
        key, _, rest = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            values[key] = int(rest.split()[0]) * 1024
    return values

import onnxruntime  # noqa: F401
import engine.generation, engine.loader, engine.session  # noqa: F401, E401
from engine.api import Hearth
from engine.paths import HearthPaths
from engine.types import SamplingParams

home, gguf, context = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
paths = HearthPaths(home / "models", home / "converted", home, home / "checkpoints")
base = status()["VmRSS"]
hearth = Hearth(paths, model=gguf, provider="cpu", threads=2, context_length=context)
hearth.load()
result = hearth.complete_raw(" hello" * (context - 40), SamplingParams.greedy_params(), 8)
print(json.dumps({"peak": status()["VmHWM"] - base, "tokens": len(result.prompt_tokens) + len(result.tokens)}))
"""


@pytest.mark.real_model
@pytest.mark.parametrize("name", list(load_manifest()[1]))
def test_ram_estimate_matches_the_measured_peak_of_loading(name, tmp_path):
    entry = load_manifest()[1][name]
    cache = TEST_CACHE / "home"
    gguf = cache / "models" / entry.filename
    if not gguf.is_file():
        pytest.skip(f"{entry.filename} is not in the test cache ({gguf.parent}); fetch it with 'hearth-cli model fetch {name}'")
    ensure_converted(gguf, "int4", cache / "converted")  # a conversion's own peak is not loading's
    home = tmp_path / "home"
    home.mkdir()
    for sub in ("models", "converted"):
        (home / sub).symlink_to(cache / sub)
    paths = HearthPaths(home / "models", home / "converted", home, home / "checkpoints").ensure()
    fit = ModelLibrary(paths).memory_fit(str(gguf), CONTEXT, available_bytes=1 << 50)
    proc = subprocess.run([sys.executable, "-c", MEASURE, str(home), str(gguf), str(CONTEXT)], capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    measured = json.loads(proc.stdout.splitlines()[-1])
    assert measured["tokens"] > CONTEXT * 0.9  # the context really was filled
    estimate = fit.needed_bytes
    assert abs(estimate - measured["peak"]) <= 0.2 * measured["peak"], (
        f"{name}: estimated {estimate / 2**20:.0f} MiB (weights {fit.weights_bytes / 2**20:.0f}, KV "
        f"{fit.kv_bytes / 2**20:.0f}), measured a peak of {measured['peak'] / 2**20:.0f} MiB")
