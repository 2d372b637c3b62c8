"""Gemma 3's own rules (engine/arch/gemma3.py): its config, the sliding window (a prompt longer than the
window, decoding past it, cutting the cache), the two rope bases, the 8-bit embedding; and the real
Gemma 3 270M against the float64 reference (tests/reference.py), with a conversation past the window
resumed from its checkpoint. (Every architecture's shared checks, gemma3's included: test_graph_reference.py,
test_engine.py, test_sessions.py, test_arch.py.)"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import onnx
import pytest
from gguf import GGUFValueType

from engine.arch import architecture_for, gemma3, model_config
from engine.generation import Engine
from engine.model.convert import build_onnx, ensure_converted
from engine.model.gguf_file import GGUFModel
from engine.model.precision import PRECISIONS
from engine.model.synthetic import write_synthetic_gguf
from engine.runtime.runner import ModelRunner
from engine.sampling import SamplingParams
from tests.arch_models import ARCH_SPECS
from tests.conftest import TEST_CACHE
from tests.gguf_edit import rewrite_gguf
from tests.reference import Reference

GREEDY = SamplingParams.greedy_params()
IDS = [int(x) for x in np.random.default_rng(21).integers(0, 300, 60)]
SPEC = ARCH_SPECS["gemma3"]  # window 8, layers 0–4 local, 5 global


def _runner(path, tmp_path, precision="int4", logits_mode="all") -> ModelRunner:
    return ModelRunner(ensure_converted(path, precision, tmp_path / "converted", logits_mode=logits_mode).onnx_path, "cpu")


# the config -----------------------------------------------------------------------------------------------------
def test_the_config_holds_the_window_the_local_layers_and_the_attention_scale(arch_gguf):
    model = GGUFModel(arch_gguf("gemma3"))
    cfg = model_config(model)
    assert architecture_for(model) is gemma3
    assert (cfg.architecture, cfg.n_layers, cfg.head_dim, cfg.rope_base, cfg.tied_embeddings) == ("gemma3", 6, 32, 1e6, True)
    assert cfg.extras == {"sliding_window": 8, "local_layers": [0, 1, 2, 3, 4], "local_rope_base": 10000.0,
                          "attention_scale": 1 / math.sqrt(32)}  # key_length's, not n_embd / n_head's (16)
    assert [gemma3.is_local(i) for i in range(13)] == [True] * 5 + [False] + [True] * 5 + [False, True]
    assert type(cfg).from_json(cfg.to_json()) == cfg


# the sliding window -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("precision", ["int4", "fp32"])
def test_a_prompt_longer_than_the_window_and_decoding_past_it_match_the_reference(arch_gguf, tmp_path, precision):
    """Prefill 20 tokens (window 8), then decode 40 more one at a time: every step equals the float64
    reference, whose local layers see exactly the last 8 keys; a window of 7 or 9 would not match."""
    path = arch_gguf("gemma3")
    reference = Reference(path)
    expected = reference.logits(IDS)
    runner = _runner(path, tmp_path, precision)
    cache = runner.new_cache()
    stepped = np.concatenate([runner.forward(IDS[:20], cache)] + [runner.forward([t], cache) for t in IDS[20:]])
    np.testing.assert_allclose(stepped, expected, atol=1e-4, rtol=1e-4)
    for other in (7, 9, 0):  # 0: no window at all
        reference.window = other
        assert np.abs(reference.logits(IDS) - stepped).max() > 0.1, other


def test_cutting_the_cache_inside_and_past_the_window_equals_a_fresh_prefill(arch_gguf, tmp_path):
    """Every layer keeps full-length KV, so a cut to any length (below the window, just past it, far
    past it) continues exactly as a fresh prefill of the kept tokens."""
    runner = _runner(arch_gguf("gemma3"), tmp_path, logits_mode="last")
    for keep in (5, 9, 33):
        cache = runner.new_cache()
        runner.forward(IDS, cache)
        cache.truncate(keep)
        cut = runner.forward(IDS[keep:keep + 4], cache)
        fresh = runner.forward(IDS[:keep + 4], runner.new_cache())
        np.testing.assert_allclose(cut, fresh, atol=1e-5, rtol=1e-5)


def test_without_a_sliding_window_every_layer_is_global(tmp_path):
    path = write_synthetic_gguf(tmp_path / "no-window.gguf", replace(SPEC, sliding_window=0))
    cfg = model_config(GGUFModel(path))
    assert (cfg.extras["sliding_window"], cfg.extras["local_layers"]) == (0, [])
    runner = _runner(path, tmp_path)
    np.testing.assert_allclose(runner.forward(IDS, runner.new_cache()), Reference(path).logits(IDS), atol=1e-4, rtol=1e-4)


def test_linear_rope_scaling_stretches_the_global_layers_only(arch_gguf, tmp_path):
    """Linear scaling (factor 4) applies to the global layer's base-1e6 rotary, not to the local
    layers' base 10000: the reference that scales only the global layer matches."""
    path = rewrite_gguf(arch_gguf("gemma3"), tmp_path / "scaled.gguf", new_values={
        "gemma3.rope.scaling.type": ("linear", GGUFValueType.STRING),
        "gemma3.rope.scaling.factor": (4.0, GGUFValueType.FLOAT32)})
    assert model_config(GGUFModel(path)).rope_scale == 4.0
    reference = Reference(path)
    runner = _runner(path, tmp_path)
    got = runner.forward(IDS, runner.new_cache())
    np.testing.assert_allclose(got, reference.logits(IDS), atol=1e-4, rtol=1e-4)
    reference.pos_scale = 1.0
    assert np.abs(reference.logits(IDS) - got).max() > 1e-2  # the scaling is what made them match


# the 8-bit embedding ----------------------------------------------------------------------------------------
def _graph(converted) -> onnx.ModelProto:
    return onnx.load(str(converted.onnx_path), load_external_data=False)


def _embedding_alone(path, tmp_path, ids: np.ndarray, precision) -> np.ndarray:
    """The embedding block as a graph of its own, run on ``ids``."""
    import onnxruntime as ort
    from onnx import TensorProto

    from engine.arch.blocks import Graph
    from engine.model.onnx_writer import OnnxWriter

    model = GGUFModel(path)
    writer = OnnxWriter(tmp_path / "embedding.onnx.data")
    g = Graph(model, model_config(model), precision, writer)
    rows = g.embed(g.inputs())
    writer.add_output(rows, TensorProto.FLOAT, ["batch", "seq", model_config(model).n_embd])
    writer.save(tmp_path / "embedding.onnx", {})
    writer.close()
    session = ort.InferenceSession(str(tmp_path / "embedding.onnx"), providers=["CPUExecutionProvider"])
    lengths = {"seqlens_k": np.array([ids.shape[1] - 1], np.int32), "total_sequence_length": np.array(ids.shape[1], np.int32)}
    return session.run(None, {"input_ids": ids, **lengths})[0]


INT4_SPLIT = replace(PRECISIONS["int4"], split_8bit_from=0)  # int4 as it runs a model of 1 GiB and up


@pytest.mark.parametrize("precision,embedding_type", [(PRECISIONS["int4-fast"], "Q8_0"), (PRECISIONS["int4-fast"], "Q5_0"),
                                                      (INT4_SPLIT, "Q8_0"), (PRECISIONS["int4"], "Q8_0")],
                         ids=["fast-q8_0", "fast-q5_0", "split-q8_0", "int4-q8_0"])
def test_the_tied_table_stays_in_blocks(tmp_path, precision, embedding_type):
    """The tied 8-bit table stays in blocks. Where the head is packed (8-bit under int4-fast, 4-bit
    planes under int4 on a large model) it runs on the same initializers, one copy for both; where it
    is dense (int4 on a small model) it is a matrix of its own and the table plain 8-bit blocks. The
    rows are what the packed form holds; from 8-bit blocks bit-identical to the dense table's."""
    from engine.model.weights import EMBEDDING, dense, gathered_table

    path = write_synthetic_gguf(tmp_path / "g.gguf", replace(SPEC, embedding_type=embedding_type))
    graph = onnx.load(str(build_onnx(GGUFModel(path), precision, tmp_path / "c")), load_external_data=False).graph
    gather = next(n for n in graph.node if n.op_type == "Gather" and n.input[0] == "token_embd.weight.qweight")
    assert sum(i.name == "token_embd.weight.qweight" for i in graph.initializer) == 1
    assert "token_embd.weight" not in {i.name for i in graph.initializer}
    head = next(n for n in graph.node if n.output[0] == "logits")
    planes = precision.split_8bit_from == 0
    if precision is PRECISIONS["int4"]:
        assert head.op_type == "MatMul" and head.input[1] == "token_embd.weight_t"
    else:
        assert head.op_type == "MatMulNBits" and head.input[1] == gather.input[0]
        assert {a.name: a.i for a in head.attribute}["bits"] == (4 if planes else 8)

    rows = _embedding_alone(path, tmp_path, np.array([IDS], np.int64), precision)[0]
    model = GGUFModel(path)
    np.testing.assert_array_equal(rows, gathered_table(model, precision).dequantize()[IDS])
    table = dense(model, EMBEDDING)[IDS]
    if planes:  # the planes' one extra fp32 addition
        np.testing.assert_allclose(rows, table, rtol=0, atol=2 ** -21 * np.abs(table).max())
    else:
        np.testing.assert_array_equal(rows, table)


# the real Gemma 3 270M ----------------------------------------------------------------------------------------
CHAT = "<start_of_turn>user\n{}<end_of_turn>\n<start_of_turn>model\n"
PROMPTS = [
    "The capital of France is",
    CHAT.format("Write one sentence about the sea."),
    "def fibonacci(n):\n    ",
]
STORY = ("The lighthouse keeper climbed the spiral stairs each evening, counting the steps as his father had, "
         "and lit the lamp before the fishing boats came home. ")


@pytest.fixture(scope="module")
def gemma_reference(gemma_gguf) -> Reference:
    return Reference(gemma_gguf)  # its own reader: the reference shares nothing with the engine


@pytest.fixture(scope="module")
def gemma_converted(gemma_gguf):
    return ensure_converted(gemma_gguf, "int4", TEST_CACHE / "home" / "converted")


@pytest.fixture(scope="module")
def gemma_engine(gemma_converted, gemma_model, gemma_tokenizer):
    """The engine, built from the session's tokenizer (opening the GGUF again would take seconds)."""
    def make() -> Engine:
        template = Engine.template_for(gemma_model, gemma_tokenizer)
        return Engine(ModelRunner(gemma_converted.onnx_path, "cpu"), gemma_tokenizer, template, gemma_converted)

    return make


def _encode(tokenizer, text: str) -> list[int]:
    return [tokenizer.specials.bos] + tokenizer.encode(text)


def _check_greedy(engine: Engine, reference: Reference, prompt: list[int], max_new: int) -> None:
    """The engine's greedy reply is the reference's own: at each position the reference's argmax is
    the engine's next token (one teacher-forced pass instead of one per token), and where the reply
    stopped at a turn end the reference's next pick is one too."""
    engine.reset()
    result = engine.generate(prompt, GREEDY, max_new)
    reply = result.tokens
    assert len(reply) > 0
    picks = [int(x) for x in reference.logits(prompt + reply, first=len(prompt) - 1).argmax(-1)]
    assert picks[:-1] == reply
    if result.stop_reason == "eos":
        assert picks[-1] in engine.stop_ids


@pytest.mark.real_model
def test_real_gemma_greedy_continuations_match_the_float64_reference(gemma_engine, gemma_reference, gemma_tokenizer):
    engine = gemma_engine()
    for text in PROMPTS:
        prompt = _encode(gemma_tokenizer, text)
        _check_greedy(engine, gemma_reference, prompt, 12)
        last = engine.runner.forward(prompt, engine.runner.new_cache())[-1]  # the prompt's logits, close too
        expected = gemma_reference.logits(prompt, first=len(prompt) - 1)[-1]
        assert np.abs(last - expected).max() < 1e-3 * np.abs(expected).max()


@pytest.mark.real_model
def test_real_gemma_past_its_512_token_window_matches_the_float64_reference(gemma_engine, gemma_reference, gemma_tokenizer):
    """A prompt of ~590 tokens (the local layers' window is 512) and 24 greedy tokens after it."""
    engine = gemma_engine()
    prompt = _encode(gemma_tokenizer, STORY * 20 + "The keeper's daughter")
    assert 560 < len(prompt) < 620
    _check_greedy(engine, gemma_reference, prompt, 24)


@pytest.mark.real_model
def test_real_gemma_conversation_past_the_window_resumes_from_its_checkpoint_bit_identically(gemma_engine, tmp_path):
    from engine.checkpoint.store import CheckpointStore
    from engine.session import DISK, LIVE, ChatSessions

    first = [{"role": "user", "content": STORY * 20 + "Summarize the story."}]
    live = ChatSessions(gemma_engine(), CheckpointStore(tmp_path / "checkpoints"), adaptive=False)
    live.generate("c", first, GREEDY, 16)
    assert len(live.engine.tokens) > 512  # past the window: the local layers drop keys
    second = first + [{"role": "assistant", "content": "A keeper lights the lamp."},
                      {"role": "user", "content": "And his daughter?"}]
    logits_live, prompt_live, r_live = live.sync("c", second)
    restored = ChatSessions(gemma_engine(), CheckpointStore(tmp_path / "checkpoints"), adaptive=False)
    logits_disk, prompt_disk, r_disk = restored.sync("c", second)
    assert r_live.source == LIVE and r_disk.source == DISK and r_disk.restored_tokens > 512
    assert prompt_live == prompt_disk
    np.testing.assert_array_equal(logits_live, logits_disk)  # bit for bit
    a = live.engine.generate(prompt_live, GREEDY, 12, ready_logits=logits_live)
    b = restored.engine.generate(prompt_disk, GREEDY, 12, ready_logits=logits_disk)
    assert a.tokens == b.tokens


# fp16 (issue 34): the residual stream kept at 1/8 of its size, so the CUDA forms run Gemma 3 ---------------------
@pytest.mark.real_model
@pytest.mark.parametrize("precision", ["int4-cuda-dense", "int4-half"])
def test_real_gemma_on_fp16_activations_matches_the_int4_model(gemma_gguf, gemma_converted, gemma_model,
                                                               gemma_tokenizer, tmp_path, precision):
    """The real 270M file's residual stream reaches ~104,000, past fp16's 65,504 (bench/gemma_ranges.py): its fp16
    runs gave NaN logits until the stream was scaled. On ONNX Runtime's fp16 CPU kernels (what CUDA runs, in
    tests/test_gpu.py too) the prompt's logits stay within 1% of the int4 model's largest and the greedy replies
    are the same."""
    half_conv = ensure_converted(gemma_gguf, precision, tmp_path / "converted")
    template = Engine.template_for(gemma_model, gemma_tokenizer)
    full = Engine(ModelRunner(gemma_converted.onnx_path, "cpu"), gemma_tokenizer, template, gemma_converted)
    half = Engine(ModelRunner(half_conv.onnx_path, "cpu"), gemma_tokenizer, template, half_conv)
    assert half_conv.fingerprint == gemma_converted.fingerprint  # saved context moves between the two
    for text in PROMPTS[:2] + [STORY * 3]:
        prompt = _encode(gemma_tokenizer, text)
        a = full.runner.forward(prompt, full.runner.new_cache())[-1]
        b = half.runner.forward(prompt, half.runner.new_cache())[-1]
        assert np.isfinite(b).all()
        assert np.abs(a - b).max() < 0.01 * np.abs(a).max(), np.abs(a - b).max()
        full.reset()
        half.reset()
        assert half.generate(prompt, GREEDY, 12).tokens == full.generate(prompt, GREEDY, 12).tokens


@pytest.mark.parametrize("precision", ["int4-half", "int4-cuda-dense"])
def test_the_scaled_residual_stream_is_the_same_model(arch_gguf, tmp_path, precision):
    """The scale is an identity (a norm reads x/8 with epsilon/64, a post-norm writes gain/8): a synthetic Gemma 3
    in an fp16 form computes the fp32 model's logits to fp16's precision, past its sliding window too."""
    gguf = arch_gguf("gemma3")
    full = ModelRunner(ensure_converted(gguf, "int4", tmp_path / "converted").onnx_path, "cpu")
    half = ModelRunner(ensure_converted(gguf, precision, tmp_path / "converted").onnx_path, "cpu")
    ids = np.random.default_rng(3).integers(1, 200, 90).tolist()
    a = full.forward(ids, full.new_cache())
    b = half.forward(ids, half.new_cache())
    assert np.abs(a - b).max() < 0.02 * np.abs(a).max()
    assert (a.argmax(-1) == b.argmax(-1)).mean() > 0.9
