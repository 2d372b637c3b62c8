"""The fp16-compute conversion (int4-half, made for CUDA's fp16 attention) and checkpoints that move
between an fp16 and an fp32 KV cache. Runs on the CPU (ONNX Runtime has fp16 CPU kernels too), so CI
checks what the GPU machine relies on."""

from __future__ import annotations

import numpy as np

from engine.checkpoint.reader import CheckpointReader
from engine.checkpoint.store import CheckpointStore
from engine.generation import Engine
from engine.sampling import SamplingParams
from engine.session import DISK, ChatSessions
from tests.checkpoint_names import conv_path

MSGS = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "a question about half floats"}]
FOLLOW = MSGS + [{"role": "assistant", "content": "an answer"}, {"role": "user", "content": "and another"}]


def test_fp16_compute_matches_fp32_within_half_precision(tiny_converted):
    full = Engine.load(tiny_converted("int4"), "cpu")
    half = Engine.load(tiny_converted("int4-half"), "cpu")
    assert half.cache.dtype == np.float16 and full.cache.dtype == np.float32
    ids = np.random.default_rng(5).integers(0, 300, 60).tolist()
    a, b = full.prefill(ids), half.prefill(ids)
    assert b.dtype == np.float32  # logits leave the graph as fp32 either way
    np.testing.assert_allclose(b, a, atol=0.01 * np.abs(a).max(), rtol=0)
    assert a.argmax() == b.argmax()


def test_int4_and_gpu_int4_share_a_fingerprint_and_nothing_else(tiny_converted):
    assert tiny_converted("int4").fingerprint == tiny_converted("int4-half").fingerprint
    assert tiny_converted("int4").fingerprint != tiny_converted("fp32").fingerprint
    assert tiny_converted("int4").onnx_path != tiny_converted("int4-half").onnx_path


def _save(engine: Engine, root) -> None:
    s = ChatSessions(engine, CheckpointStore(root), adaptive=False)
    s.sync("c", MSGS)
    s.save("turn")


def test_an_fp16_checkpoint_loads_into_an_fp32_cache_and_back(tiny_converted, tmp_path):
    full = Engine.load(tiny_converted("int4"), "cpu")
    half = Engine.load(tiny_converted("int4-half"), "cpu")
    _save(half, tmp_path / "from-half")
    with CheckpointReader(conv_path(tmp_path / "from-half", half)) as r:
        assert r.read_header().shape.dtype == "float16"
        records, _ = r.scan()
    per_token = 2 * 2 * 2 * 16 * 2  # layers × K,V × kv heads × head dim × 2 bytes
    assert records[0].payload_bytes == records[0].n_tokens * (4 + per_token)  # half the bytes of fp32
    for engine, root in ((full, tmp_path / "from-half"), (half, tmp_path / "from-full")):
        if root.name == "from-full":
            _save(full, root)
        s = ChatSessions(engine, CheckpointStore(root), adaptive=False)
        turn = s.generate("c", FOLLOW, SamplingParams.greedy_params(), 8)
        assert turn.resume.source == DISK and turn.resume.reason is None
        assert turn.resume.restored_tokens > 10
        cold = ChatSessions(engine, CheckpointStore(root / "cold"), adaptive=False)
        reference = cold.generate("c", FOLLOW, SamplingParams.greedy_params(), 8)
        assert turn.generation.tokens[:3] == reference.generation.tokens[:3]  # converted rows, same answer


def test_the_cuda_forms_compute_the_int4_model(tiny_converted):
    """What int4 runs as on CUDA (zero points, or dense fp16) is the same model as int4 within fp16
    precision, with the same fingerprint; checked here on the CPU, which runs both forms too."""
    full = Engine.load(tiny_converted("int4"), "cpu")
    ids = np.random.default_rng(6).integers(0, 300, 60).tolist()
    expected = full.prefill(ids)
    for form in ("int4-cuda", "int4-cuda-dense", "int4-half"):
        assert tiny_converted(form).fingerprint == tiny_converted("int4").fingerprint
        got = Engine.load(tiny_converted(form), "cpu").prefill(ids)
        # 2% of the logit range: fp16 zero points and fp16 accumulation on the CPU's fp16 kernels (on an
        # H200 both forms stay within 0.06 of the exact model's logits, bench/gpu_variants.py).
        np.testing.assert_allclose(got, expected, atol=0.02 * np.abs(expected).max(), rtol=0)
        assert got.argmax() == expected.argmax()


def test_the_cuda_form_depends_on_the_model_size(tmp_path):
    from engine.model.precision import DENSE_ON_CUDA_BELOW_BYTES, cuda_variant

    small, large = tmp_path / "small.gguf", tmp_path / "large.gguf"
    small.write_bytes(b"GGUF")
    with open(large, "wb") as fh:
        fh.truncate(DENSE_ON_CUDA_BELOW_BYTES)  # sparse: no real gigabyte written
    assert cuda_variant("int4", small) == "int4-cuda-dense"
    assert cuda_variant("int4", large) == "int4-half"
    assert cuda_variant("fp32", small) is None and cuda_variant("int4-fast", large) is None
