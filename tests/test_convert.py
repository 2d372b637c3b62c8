"""Conversion cache: converted once, keyed by (GGUF hash, converter version, precision)."""

from __future__ import annotations

import json
import os
import time

import pytest

from engine.arch import llama, model_config
from engine.errors import HearthError, ModelFileError
from engine.model.convert import CONVERTER_VERSION, ensure_converted, gguf_digest
from engine.model.synthetic import SyntheticSpec, write_synthetic_gguf
from tests.test_cli import run_cli


def test_converted_once_then_reused(tmp_path, tiny_gguf):
    calls = []
    first = ensure_converted(tiny_gguf, "int4", tmp_path, progress=lambda d, t: calls.append((d, t)))
    assert calls[-1][0] == calls[-1][1] and len(calls) > 1
    stamp = first.onnx_path.stat().st_mtime_ns
    calls.clear()
    again = ensure_converted(tiny_gguf, "int4", tmp_path, progress=lambda d, t: calls.append((d, t)))
    assert again == first and calls == [] and first.onnx_path.stat().st_mtime_ns == stamp
    assert first.fingerprint == f"{gguf_digest(tiny_gguf)}:{CONVERTER_VERSION}:llama.{llama.GRAPH_VERSION}:int4"


def test_each_precision_and_model_has_its_own_entry(tmp_path, tiny_gguf):
    a = ensure_converted(tiny_gguf, "int4", tmp_path)
    b = ensure_converted(tiny_gguf, "fp32", tmp_path)
    other = write_synthetic_gguf(tmp_path / "other.gguf", SyntheticSpec(seed=11))
    c = ensure_converted(other, "int4", tmp_path)
    assert len({a.onnx_path.parent, b.onnx_path.parent, c.onnx_path.parent}) == 3
    assert a.fingerprint != b.fingerprint != c.fingerprint


def test_digest_sidecar_is_refreshed_when_the_file_changes(tmp_path):
    path = write_synthetic_gguf(tmp_path / "m.gguf", SyntheticSpec(seed=1))
    d1 = gguf_digest(path)
    write_synthetic_gguf(path, SyntheticSpec(seed=2))
    os.utime(path, ns=(time.time_ns(), time.time_ns() + 10_000_000))
    assert gguf_digest(path) != d1


@pytest.mark.parametrize("damage", ["fifo", "deep"])
def test_a_completion_record_or_digest_sidecar_that_is_a_fifo_or_nested_too_deeply_is_rebuilt(tmp_path, damage):
    gguf = write_synthetic_gguf(tmp_path / "m.gguf", SyntheticSpec(seed=3))
    first = ensure_converted(gguf, "int4", tmp_path / "converted")
    complete, sidecar = first.onnx_path.with_name("complete.json"), gguf.with_name(gguf.name + ".sha256.json")
    for file in (complete, sidecar):
        file.unlink()
        os.mkfifo(file) if damage == "fifo" else file.write_bytes(b"[" * 100_000)
    # in a subprocess: reading a FIFO once blocked for ever, and 100,000 '[' raised RecursionError
    proc = run_cli("model", "convert", "--model", str(gguf), "--json", env={"HEARTH_HOME": str(tmp_path)}, timeout=120)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    assert json.loads(proc.stdout)["onnx"] == str(first.onnx_path)
    assert json.loads(complete.read_text())["architecture"] == "llama"  # built again, a regular file once more
    assert json.loads(sidecar.read_text())["sha256"] == first.gguf_sha256


def test_stale_temporary_conversions_are_removed(tmp_path, tiny_gguf):
    stale = tmp_path / ".convert-abandoned"
    stale.mkdir()
    (stale / "model.onnx.data").write_bytes(b"half")
    old = time.time() - 7200
    os.utime(stale, (old, old))
    young = tmp_path / ".convert-running"
    young.mkdir()
    ensure_converted(tiny_gguf, "int4", tmp_path)
    assert not stale.exists() and young.exists()


def test_unknown_precision(tmp_path, tiny_gguf):
    with pytest.raises(HearthError, match="unknown weight precision 'int3'"):
        ensure_converted(tiny_gguf, "int3", tmp_path)


def test_missing_tensor_is_reported(tmp_path):
    from tests.gguf_edit import rewrite_gguf

    src = write_synthetic_gguf(tmp_path / "full.gguf", SyntheticSpec())
    rewrite_gguf(src, tmp_path / "holey.gguf", drop=("blk.1.ffn_up.weight",))
    with pytest.raises(ModelFileError, match="blk.1.ffn_up.weight"):
        ensure_converted(tmp_path / "holey.gguf", "int4", tmp_path / "converted")
    assert not list((tmp_path / "converted").glob(".convert-*"))  # nothing half-built is left


def test_a_random_block_model_of_a_large_shape_converts_and_runs(tmp_path):
    """The speed-benchmark models (Llama-3-8B's layout, scaled down here): random Q4_0 blocks, an untied
    head and a vocabulary padded past the small one go through the real converter and run."""
    from dataclasses import replace

    import numpy as np

    from engine.generation import Engine
    from engine.model.synthetic import LLAMA3_8B_SHAPE

    spec = replace(LLAMA3_8B_SHAPE, n_layers=2, n_embd=128, n_head=4, n_head_kv=2, n_ff=256, vocab_size=1000,
                   context_length=128)
    engine = Engine.load(ensure_converted(write_synthetic_gguf(tmp_path / "m.gguf", spec), "int4", tmp_path / "c"), "cpu")
    cfg = engine.runner.config
    assert (cfg.vocab_size, cfg.tied_embeddings, cfg.n_head_kv) == (1000, False, 2)
    assert engine.tokenizer.vocab_size == 1000
    logits = engine.prefill(list(range(40, 80)))
    assert logits.shape == (1000,) and np.isfinite(logits).all() and np.ptp(logits) > 0


_CONVERT_AND_MEASURE = """
import json, resource, sys
from pathlib import Path
import numpy as np
from engine.model.convert import ensure_converted
import onnx, onnxruntime  # noqa: F401 (the converter's imports, in the baseline)
np.cos(np.ones(1 << 20))  # numpy's own working memory, in the baseline too
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
model = ensure_converted(Path(sys.argv[1]), "int4", Path(sys.argv[2]))
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"grew_mb": (peak - base) / 1024, "data": str(model.onnx_path) + ".data"}))
"""


def test_a_million_token_context_converts_without_its_rotary_tables_whole_in_memory(tmp_path):
    """Issue 27, item 14: a model declaring 1,000,000 tokens of context (under the 1,048,576 Hearth takes)
    made the converter build its rotary cos/sin tables whole, in float64 temporaries: 3.0 GB at the peak
    for 256-dim heads. They are streamed to the weights file a block at a time; with 64-dim heads here
    (256 MB of tables, which once took ~750 MB) the conversion grows by far less than one table."""
    import json
    import subprocess
    import sys

    from engine.model.gguf_file import GGUFModel
    from tests.conftest import REPO
    from tests.gguf_edit import rewrite_gguf

    small = write_synthetic_gguf(tmp_path / "wide.gguf", SyntheticSpec(n_embd=128, n_head=2, n_head_kv=1, head_dim=64))
    long = rewrite_gguf(small, tmp_path / "long.gguf", values={"llama.context_length": 1_000_000})
    assert model_config(GGUFModel(long)).context_length == 1_000_000
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-c", _CONVERT_AND_MEASURE, str(long), str(tmp_path / "converted")],
                          capture_output=True, text=True, timeout=300, cwd=REPO, env=env)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.splitlines()[-1])
    tables = 2 * 1_000_000 * 32 * 4  # cos and sin, [positions, head_dim / 2] float32
    assert os.path.getsize(out["data"]) > tables  # the whole context's tables are in the file
    assert out["grew_mb"] < tables / 4 / 2**20, out  # … and never were whole in memory


def test_a_million_token_contexts_rotary_tables_count_in_the_memory_a_load_needs(tmp_path):
    """The rotary tables of a declared 1,000,000-token context are loaded with the weights (256 MB here, 1.0
    GB with 256-dim heads), yet the estimate before a conversion left them out: a load that could not fit
    went on to convert. It is refused plainly, before converting anything."""
    from engine.api import Hearth, resolve_paths
    from engine.errors import ModelTooLargeError
    from engine.model.facts import read_facts
    from tests.gguf_edit import rewrite_gguf

    small = write_synthetic_gguf(tmp_path / "wide.gguf", SyntheticSpec(n_embd=128, n_head=2, n_head_kv=1, head_dim=64))
    long = rewrite_gguf(small, tmp_path / "long.gguf", values={"llama.context_length": 1_000_000})
    tables = 2 * 1_000_000 * 32 * 4
    assert read_facts(long, "int4").weights_bytes - read_facts(small, "int4").weights_bytes == tables - 2 * 256 * 32 * 4
    paths = resolve_paths(tmp_path / "home").ensure()
    hearth = Hearth(paths, model=str(long), weights="int4", provider="cpu")
    hearth.available_memory = 450 * 10**6  # the weights alone fit that; their tables do not
    with pytest.raises(ModelTooLargeError, match=r"needs about 3\d\d MB for its weights.*even its weights do not fit"):
        hearth.load()
    assert not any(paths.converted.iterdir())  # refused before converting
