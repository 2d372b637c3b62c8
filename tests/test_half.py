"""The fp16-compute conversion (int4-half, made for CUDA's fp16 attention) and checkpoints that move
between an fp16 and an fp32 KV cache. Runs on the CPU (ONNX Runtime has fp16 CPU kernels too), so CI
checks what the GPU machine relies on."""

from __future__ import annotations

import numpy as np

from engine.checkpoint.reader import CheckpointReader
from engine.checkpoint.store import CheckpointStore, conversation_file
from engine.generation import Engine
from engine.sampling import SamplingParams
from engine.session import DISK, ChatSessions

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
    with CheckpointReader(tmp_path / "from-half" / conversation_file("c")) as r:
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
