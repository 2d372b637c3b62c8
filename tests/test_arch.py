"""Architectures as modules (engine/arch/): the registry, the fingerprint, llama's, qwen2's and qwen3's own
rules (gemma3's: test_gemma3.py), damaged files of each, and a model load that makes one session. (The
graphs against the float64 reference: test_graph_reference.py.)"""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFValueType

from engine.arch import (
    ModelConfig,
    architecture_for,
    get_architecture,
    llama,
    model_config,
    qwen2,
    qwen3,
    supported_architectures,
)
from engine.arch.rope import rotary_tables
from engine.errors import ModelFileError, UnsupportedModelError
from engine.model.convert import cached_conversion, ensure_converted, model_fingerprint
from engine.model.gguf_file import GGUFModel
from engine.model.synthetic import SyntheticSpec, write_synthetic_gguf
from engine.paths import resolve_paths
from engine.runtime import providers
from tests.gguf_edit import rewrite_gguf
from tests.test_cli import assert_clean_error, run_cli

REPO = Path(__file__).resolve().parent.parent
# Hearth's own sources: not what a benchmark installs into its own hidden venv (bench/.peer-venv).
SOURCES = [p for d in ("engine", "app", "bench", "packaging") for p in (REPO / d).rglob("*.py")
           if not any(part.startswith(".") for part in p.relative_to(REPO).parts)]


# the registry ------------------------------------------------------------------------------------------------
def test_another_architecture_is_refused_naming_what_hearth_runs(tmp_path):
    path = write_synthetic_gguf(tmp_path / "other.gguf", SyntheticSpec(architecture="falcon"))
    message = r"other\.gguf: architecture 'falcon' is not supported; Hearth runs llama, qwen2, qwen3, gemma3, phi3 models"
    with pytest.raises(UnsupportedModelError, match=message):
        architecture_for(GGUFModel(path))
    with pytest.raises(UnsupportedModelError, match=message):
        ensure_converted(path, "int4", tmp_path / "converted")
    assert not (tmp_path / "converted").exists()  # refused before anything was made
    with pytest.raises(UnsupportedModelError, match="'gpt2' is not supported; Hearth runs llama, qwen2, qwen3, gemma3, phi3"):
        get_architecture("gpt2")


def test_a_gguf_finds_its_module_and_config(tiny_gguf):
    model = GGUFModel(tiny_gguf)
    assert supported_architectures() == ("llama", "qwen2", "qwen3", "gemma3", "phi3")
    assert architecture_for(model) is llama and get_architecture("llama") is llama and llama.NAME == "llama"
    cfg = model_config(model)
    assert cfg == llama.read_config(model) and isinstance(cfg, ModelConfig)
    assert (cfg.architecture, cfg.n_layers, cfg.n_head, cfg.n_head_kv, cfg.head_dim, cfg.tied_embeddings) == \
        ("llama", 2, 4, 2, 16, True)
    assert ModelConfig.from_json(cfg.to_json()) == cfg


# the fingerprint -----------------------------------------------------------------------------------------------
def test_the_fingerprint_changes_with_the_architecture_and_its_graph_version(tiny_converted):
    converted = tiny_converted("int4")
    assert (converted.architecture, converted.graph_version) == (llama.NAME, llama.GRAPH_VERSION)
    prints = {converted.fingerprint, replace(converted, architecture="qwen2").fingerprint,
              replace(converted, graph_version=llama.GRAPH_VERSION + 1).fingerprint}
    assert len(prints) == 3
    base = model_fingerprint("ab" * 32, "int4", "llama", 1)
    assert base != model_fingerprint("ab" * 32, "int4", "qwen2", 1) != model_fingerprint("ab" * 32, "int4", "llama", 2)


def test_checkpoint_identity_has_the_same_fingerprint_with_or_without_onnx_runtime(tiny_converted, tiny_gguf):
    from engine.checkpoint.identity import engine_identity, gguf_identity
    from engine.generation import Engine

    engine = Engine.load(tiny_converted("int4"), "cpu")
    identity, vocab = gguf_identity(tiny_gguf, "int4")
    assert identity == engine_identity(engine) and vocab == engine.tokenizer.vocab_size
    engine.model = replace(engine.model, graph_version=llama.GRAPH_VERSION + 1)
    assert engine_identity(engine).model_fp != identity.model_fp  # a newer graph: saved context is stale


def test_a_conversion_made_by_an_older_graph_is_made_again(tmp_path, tiny_gguf):
    first = ensure_converted(tiny_gguf, "int4", tmp_path)
    done = first.onnx_path.parent / "complete.json"
    record = json.loads(done.read_text())
    assert (record["architecture"], record["graph_version"]) == ("llama", llama.GRAPH_VERSION)
    done.write_text(json.dumps({**record, "graph_version": llama.GRAPH_VERSION - 1}))
    stamp = first.onnx_path.stat().st_mtime_ns
    assert cached_conversion(first.onnx_path.parent, tiny_gguf, first.gguf_sha256, "int4") is None
    again = ensure_converted(tiny_gguf, "int4", tmp_path)
    assert again == first and first.onnx_path.stat().st_mtime_ns != stamp
    assert json.loads(done.read_text())["graph_version"] == llama.GRAPH_VERSION
    assert len(list(tmp_path.glob(".convert-old-*"))) == 1  # the old one, moved aside for removal


def test_a_converted_model_whose_config_does_not_parse_is_refused(tiny_converted, tmp_path):
    import onnx

    from engine.runtime.runner import ModelRunner

    src = tiny_converted("int4").onnx_path
    runner = ModelRunner(src, "cpu")
    assert runner.config == model_config(GGUFModel(tiny_converted("int4").gguf_path))
    model = onnx.load(str(src), load_external_data=False)
    entry = next(p for p in model.metadata_props if p.key == "hearth.config")
    entry.value = json.dumps({"architecture": "llama", "n_layers": 2, "rope_theta": 10000.0})  # not a ModelConfig
    (tmp_path / "bad").mkdir()
    onnx.save(model, str(tmp_path / "bad" / "model.onnx"))
    shutil.copyfile(src.with_name("model.onnx.data"), tmp_path / "bad" / "model.onnx.data")
    with pytest.raises(ModelFileError, match="was not made by Hearth's converter"):
        ModelRunner(tmp_path / "bad" / "model.onnx", "cpu")


# llama's own rules ---------------------------------------------------------------------------------------------
def _edited(tmp_path, tiny_gguf, **edits) -> GGUFModel:
    return GGUFModel(rewrite_gguf(tiny_gguf, tmp_path / "edited.gguf", **edits))


@pytest.mark.parametrize("edits,error,needle", [
    ({"values": {"llama.rope.dimension_count": 8}}, UnsupportedModelError, r"partial rotary embeddings \(8 of 16"),
    ({"new_values": {"llama.rope.scaling.type": ("yarn", GGUFValueType.STRING)}}, UnsupportedModelError,
     "rope scaling 'yarn'"),
    ({"add": {"rope_freqs.weight": (np.ones(6, np.float32), GGMLQuantizationType.F32)}}, ModelFileError,
     r"rope_freqs\.weight holds 6 values, expected 8 \(half the rotary dims\)"),
    ({"add": {"rope_freqs.weight": (np.array([1, 2, 0, 4, 4, 4, 4, 4], np.float32), GGMLQuantizationType.F32)}},
     ModelFileError, "not positive numbers"),
    ({"new_values": {"llama.attention.value_length": (32, GGUFValueType.UINT32)}}, UnsupportedModelError,
     "different key and value"),
    ({"values": {"llama.attention.head_count_kv": 3}}, ModelFileError, "4 query heads cannot share 3 KV heads"),
    ({"values": {"llama.block_count": 0}}, ModelFileError, "'llama.block_count' must be positive"),
    ({"values": {"llama.rope.dimension_count": 32}, "new_values": {"llama.attention.key_length": (32, GGUFValueType.UINT32),
                                                                  "llama.attention.value_length": (32, GGUFValueType.UINT32)}},
     ModelFileError,
     r"blk\.0\.attn_q\.weight has shape \[64, 64\], expected \[64, 128\] for 4 query / 2 KV heads of 32"),
])
def test_llama_refuses_what_its_graph_cannot_compute(tmp_path, tiny_gguf, edits, error, needle):
    with pytest.raises(error, match=needle):
        llama.read_config(_edited(tmp_path, tiny_gguf, **edits))


def test_linear_rope_scaling_stretches_llamas_rotary_tables(tmp_path, tiny_gguf):
    scaled = llama.read_config(_edited(tmp_path, tiny_gguf, new_values={
        "llama.rope.scaling.type": ("linear", GGUFValueType.STRING),
        "llama.rope.scaling.factor": (2.0, GGUFValueType.FLOAT32)}))
    plain = model_config(GGUFModel(tiny_gguf))
    assert (scaled.rope_scale, plain.rope_scale) == (2.0, 1.0)
    (cos2, sin2), (cos1, sin1) = rotary_tables(scaled), rotary_tables(plain)
    assert cos2.shape == (plain.context_length, plain.head_dim // 2)
    np.testing.assert_allclose(cos2[2::2], cos1[1:len(cos2[2::2]) + 1], atol=1e-6)  # position p reads as p / 2
    np.testing.assert_allclose(sin2[2::2], sin1[1:len(sin2[2::2]) + 1], atol=1e-6)


def test_rope_freqs_divide_llamas_rotary_frequencies(tmp_path, tiny_gguf):
    factors = np.array([1, 1, 2, 4, 8, 8, 8, 8], np.float32)
    model = _edited(tmp_path, tiny_gguf, add={"rope_freqs.weight": (factors, GGMLQuantizationType.F32)})
    cfg = llama.read_config(model)
    assert cfg == model_config(GGUFModel(tiny_gguf))  # the config is llama's; the factors go into the tables
    cos, sin = rotary_tables(cfg, factors)
    plain_cos, plain_sin = rotary_tables(cfg)
    np.testing.assert_array_equal(cos[:, :2], plain_cos[:, :2])  # factor 1: unchanged
    np.testing.assert_allclose(cos[8::8, 4], plain_cos[1:len(cos[8::8]) + 1, 4], atol=1e-6)  # factor 8: p reads as p / 8
    np.testing.assert_allclose(sin[8::8, 4], plain_sin[1:len(sin[8::8]) + 1, 4], atol=1e-6)


# qwen2's and qwen3's own rules ----------------------------------------------------------------------------------
def test_qwen_configs_come_from_their_own_keys(arch_gguf):
    q2, q3 = GGUFModel(arch_gguf("qwen2")), GGUFModel(arch_gguf("qwen3"))
    assert architecture_for(q2) is qwen2 and architecture_for(q3) is qwen3
    c2, c3 = model_config(q2), model_config(q3)
    assert (c2.architecture, c2.rope_base, c2.head_dim) == ("qwen2", 1e6, 16)
    assert (c3.architecture, c3.head_dim, c3.n_embd, c3.n_head) == ("qwen3", 32, 64, 4)  # heads wider than 64 / 4
    assert ModelConfig.from_json(c3.to_json()) == c3


def _bad(tmp_path, arch_gguf, tiny_gguf, case: str) -> Path:
    """A damaged file of each kind: GGUF edits of the tiny models."""
    dst = tmp_path / f"{case}.gguf"
    if case == "rope_freqs-length":
        return rewrite_gguf(tiny_gguf, dst, add={"rope_freqs.weight": (np.ones(6, np.float32), GGMLQuantizationType.F32)})
    if case == "qwen2-head-counts":
        return rewrite_gguf(arch_gguf("qwen2"), dst, values={"qwen2.attention.head_count_kv": 4})
    if case == "qwen2-no-bias":
        return rewrite_gguf(arch_gguf("qwen2"), dst, drop=("blk.1.attn_k.bias",))
    if case == "qwen3-key-length":
        return rewrite_gguf(arch_gguf("qwen3"), dst, values={"qwen3.attention.key_length": 16,
                                                             "qwen3.attention.value_length": 16,
                                                             "qwen3.rope.dimension_count": 16})
    if case == "gemma3-no-post-norm":
        return rewrite_gguf(arch_gguf("gemma3"), dst, drop=("blk.4.post_ffw_norm.weight",))
    if case == "gemma3-no-post-attention-norm":
        return rewrite_gguf(arch_gguf("gemma3"), dst, drop=("blk.0.post_attention_norm.weight",))
    if case == "gemma3-head-counts":
        return rewrite_gguf(arch_gguf("gemma3"), dst, values={"gemma3.attention.head_count_kv": 4})
    if case == "context-2^31-1":  # conversion asked numpy for 16 GiB of rope positions (issue 27)
        return rewrite_gguf(tiny_gguf, dst, values={"llama.context_length": 2**31 - 1})
    if case == "block_count-100000":  # was "needs 78.7 GB for 512 tokens of context" (issue 27)
        return rewrite_gguf(tiny_gguf, dst, values={"llama.block_count": 100_000})
    if case == "block_count-40":  # plausible, but the file holds 2 layers' tensors
        return rewrite_gguf(tiny_gguf, dst, values={"llama.block_count": 40})
    if case == "embedding_length-10^7":
        return rewrite_gguf(tiny_gguf, dst, values={"llama.embedding_length": 10**7})
    if case == "feed_forward_length-2^31":
        return rewrite_gguf(tiny_gguf, dst, values={"llama.feed_forward_length": 2**31})
    if case == "expert_count-10^6":
        return rewrite_gguf(tiny_gguf, dst, new_values={"llama.expert_count": (10**6, GGUFValueType.UINT32)})
    if case == "vocabulary-cut-to-100":  # once "internal error: Exception: Error while initializing BPE"
        return rewrite_gguf(tiny_gguf, dst, values=cut_vocabulary(GGUFModel(tiny_gguf), 100))
    if case == "merge-out-of-vocabulary":
        model = GGUFModel(tiny_gguf)
        return rewrite_gguf(tiny_gguf, dst, values={
            "tokenizer.ggml.merges": [*model.string_array("tokenizer.ggml.merges"), "zq xj"]})
    assert case == "qwen3-no-q-norm"
    return rewrite_gguf(arch_gguf("qwen3"), dst, drop=("blk.1.attn_q_norm.weight",))


BAD_FILES = {
    "rope_freqs-length": r"rope_freqs\.weight holds 6 values, expected 8",
    "qwen2-head-counts": r"blk\.0\.attn_k\.weight has shape \[64, 32\], expected \[64, 64\] for 4 query / 4 KV heads",
    "qwen2-no-bias": r"tensor 'blk\.1\.attn_k\.bias' is missing",
    "qwen3-key-length": r"blk\.0\.attn_q\.weight has shape \[64, 128\], expected \[64, 64\]",
    "qwen3-no-q-norm": r"tensor 'blk\.1\.attn_q_norm\.weight' is missing",
    "gemma3-no-post-norm": r"tensor 'blk\.4\.post_ffw_norm\.weight' is missing",
    "gemma3-no-post-attention-norm": r"tensor 'blk\.0\.post_attention_norm\.weight' is missing",
    "gemma3-head-counts": r"blk\.0\.attn_k\.weight has shape \[64, 64\], expected \[64, 128\] for 4 query / 4 KV heads of 32",
    "context-2^31-1": r"'llama\.context_length' declares a context of 2,147,483,647 tokens; Hearth runs models of up "
                      r"to 1,048,576",
    "block_count-100000": r"'llama\.block_count' declares 100,000; no real model has more than 1,024",
    "block_count-40": r"'llama\.block_count' declares 40 layers but the file holds tensors for 2 \(the file is damaged\)",
    "embedding_length-10^7": r"'llama\.embedding_length' declares 10,000,000; no real model has more than 65,536",
    "feed_forward_length-2^31": r"'llama\.feed_forward_length' declares 2,147,483,648; no real model has more than 262,144",
    "expert_count-10^6": r"'llama\.expert_count' declares 1,000,000; no real model has more than 4,096",
    "vocabulary-cut-to-100": r"the tokenizer vocabulary holds 100 tokens but the model's embedding table has",
    "merge-out-of-vocabulary": r"tokenizer merge 46 \('zq xj'\) names a token that is not in its vocabulary",
}


def cut_vocabulary(model: GGUFModel, n: int) -> dict:
    """The token list and its types cut to the first ``n`` (the merges still name the rest)."""
    return {"tokenizer.ggml.tokens": model.string_array("tokenizer.ggml.tokens")[:n],
            "tokenizer.ggml.token_type": [int(t) for t in model.int_array("tokenizer.ggml.token_type")][:n]}


@pytest.mark.parametrize("case", list(BAD_FILES))
def test_a_damaged_file_of_each_architecture_is_refused_before_converting(tmp_path, arch_gguf, tiny_gguf, case):
    path = _bad(tmp_path, arch_gguf, tiny_gguf, case)
    with pytest.raises((ModelFileError, UnsupportedModelError), match=BAD_FILES[case]) as refused:
        ensure_converted(path, "int4", tmp_path / "converted")
    assert "\n" not in str(refused.value)
    assert not (tmp_path / "converted").exists()


@pytest.mark.parametrize("case", ["qwen2-head-counts", "qwen3-no-q-norm", "gemma3-no-post-norm", "context-2^31-1",
                                  "block_count-100000", "block_count-40",
                                  "vocabulary-cut-to-100", "merge-out-of-vocabulary"])
def test_the_cli_reports_a_damaged_file_in_one_line(tmp_path, arch_gguf, tiny_gguf, case):
    path = _bad(tmp_path, arch_gguf, tiny_gguf, case)
    proc = run_cli("generate", "--prompt", "hi", "--model", str(path), "--data-dir", str(tmp_path / "home"))
    assert_clean_error(proc, re.sub(r"\\(.)", r"\1", BAD_FILES[case]))


def test_the_library_lists_an_implausible_block_count_as_damaged_not_as_too_large(tmp_path, arch_gguf, tiny_gguf):
    from engine.model.facts import read_facts

    facts = read_facts(_bad(tmp_path, arch_gguf, tiny_gguf, "block_count-100000"), "int4")
    assert facts.status == "unreadable" and "block_count" in facts.problem and "GB" not in facts.problem
    proc = run_cli("model", "info", str(tmp_path / "block_count-100000.gguf"), "--data-dir", str(tmp_path / "home"))
    assert_clean_error(proc, "'llama.block_count' declares 100,000")


# where things live ---------------------------------------------------------------------------------------------
def test_only_the_llama_module_undoes_llama_cpps_q_k_permutation():
    users = sorted(str(p.relative_to(REPO)) for p in SOURCES if "unpermute" in p.read_text())
    assert users == ["engine/arch/llama.py"]


def test_the_shared_blocks_know_no_architecture():
    for name in ("blocks.py", "io_names.py"):
        assert "llama" not in (REPO / "engine" / "arch" / name).read_text().lower()


def test_graph_io_names_are_spelled_only_in_io_names():
    spelled = re.compile(r"""["'](input_ids|seqlens_k|total_sequence_length|logits)["']|past_key_values\.|["']present\.""")
    offenders = [str(p.relative_to(REPO)) for p in SOURCES
                 if p.name != "io_names.py" and spelled.search(p.read_text())]
    assert offenders == []


# one session per load ------------------------------------------------------------------------------------------
def _load(tmp_path, tiny_gguf, provider):
    from engine.loader import load_engine

    paths = resolve_paths(tmp_path / "home").ensure()
    before = providers.sessions_opened
    engine, converted, _ = load_engine(paths, model=str(tiny_gguf), weights="int4", provider=provider)
    made = sorted(p.name for p in paths.converted.iterdir() if not p.name.startswith("."))
    return engine, converted, providers.sessions_opened - before, made


def test_loading_on_the_cpu_makes_one_session(tmp_path, tiny_gguf):
    engine, converted, sessions, made = _load(tmp_path, tiny_gguf, "cpu")
    assert sessions == 1 and engine.provider == "cpu" and engine.runner.provider_note == ""
    assert converted.precision == "int4" and made == [converted.onnx_path.parent.name]


def test_auto_without_a_usable_gpu_makes_one_cpu_session_and_no_cuda_variant(tmp_path, tiny_gguf):
    reason = providers.cuda_unavailable()
    if not reason:
        pytest.skip("CUDA may run here")
    engine, converted, sessions, made = _load(tmp_path, tiny_gguf, "auto")
    assert sessions == 1 and engine.provider == "cpu" and converted.precision == "int4"
    assert made == [converted.onnx_path.parent.name]  # the CUDA variant was not converted
    assert engine.runner.provider_note == f"CUDA is not available: {reason}; running on the CPU"


@pytest.mark.gpu
def test_auto_on_a_gpu_loads_the_cuda_variant_alone(tmp_path, tiny_gguf):
    if providers.cuda_unavailable():
        pytest.skip(f"no usable CUDA here: {providers.cuda_unavailable()}")
    engine, converted, sessions, made = _load(tmp_path, tiny_gguf, "auto")
    if engine.provider != "cuda":
        pytest.skip(f"no usable CUDA here: {engine.runner.provider_note}")
    assert converted.precision == "int4-cuda-dense" and made == [converted.onnx_path.parent.name]
    assert sessions == 1 + (engine.runner.graph is not None)  # the model's session, and the decode graph's


# the shared blocks ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("precision", ["int4", "fp32"])
def test_linear_blocks_add_a_bias_in_either_weight_form(tmp_path, tiny_gguf, precision):
    """Biases (which the next architectures have) on one linear and on fused ones, against numpy."""
    import onnxruntime as ort
    from onnx import TensorProto

    from engine.arch.blocks import Graph
    from engine.model.onnx_writer import OnnxWriter
    from engine.model.precision import get_precision
    from engine.model.weights import dense

    model = GGUFModel(tiny_gguf)
    writer = OnnxWriter(tmp_path / "model.onnx.data")
    g = Graph(model, model_config(model), get_precision(precision), writer)
    names = [f"blk.0.attn_{t}.weight" for t in "qkv"]
    rng = np.random.default_rng(3)
    biases = {names[0]: rng.standard_normal(64).astype(np.float32), names[2]: rng.standard_normal(32).astype(np.float32)}
    x = writer.add_input("x", TensorProto.FLOAT, [1, 3, 64])  # [batch, seq, k]
    one = g.linear(x, "q", g.weight(names[0]), biases[names[0]], out="one")
    fused = g.fused_linear(x, "qkv", {n: g.weight(n) for n in names}, biases)
    writer.add_output(one, TensorProto.FLOAT, [1, 3, 64])
    writer.add_output(fused, TensorProto.FLOAT, [1, 3, 128])
    writer.save(tmp_path / "model.onnx", {})
    writer.close()
    xs = rng.standard_normal((1, 3, 64)).astype(np.float32)
    got_one, got_fused = ort.InferenceSession(str(tmp_path / "model.onnx")).run(None, {"x": xs})
    rows = np.concatenate([dense(model, n) for n in names])
    expected = xs @ rows.T + np.concatenate([biases[names[0]], np.zeros(32, np.float32), biases[names[2]]])
    np.testing.assert_allclose(got_fused, expected, atol=1e-4, rtol=1e-4)
    np.testing.assert_allclose(got_one, expected[..., :64], atol=1e-4, rtol=1e-4)


# phi3 -------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("context_length,factors", [(256, "long"), (64, "short")])
def test_phi3_takes_the_long_factors_only_past_its_original_context(tmp_path, context_length, factors):
    """llama.cpp's rule: the long rotary factors where the context in use (the file's) exceeds the
    original context (64 here), else the short ones; both scaled by the attention factor."""
    from engine.arch import phi3

    spec = SyntheticSpec(architecture="phi3", rope_freqs=True, tied=False, seed=16)
    path = rewrite_gguf(write_synthetic_gguf(tmp_path / "p.gguf", spec), tmp_path / "q.gguf",
                        values={"phi3.context_length": context_length})
    model = GGUFModel(path)
    chosen, magnitude = phi3.rope_scaling(model, phi3.read_config(model))
    expected = np.asarray(model.tensor(f"rope_factors_{factors}.weight").data, np.float64)
    np.testing.assert_array_equal(chosen, expected)
    assert magnitude == pytest.approx(1.19)


@pytest.mark.parametrize("case,needle", [
    ("one factor set", "has rope_factors_long.weight without rope_factors_short.weight"),
    ("fused gate/up", "blk.0.ffn_up.weight has shape"),
    ("fused qkv", "blk.0.attn_qkv.weight has shape"),
    ("attention factor", "rope.scaling.attn_factor is -1.0"),
])
def test_a_damaged_phi3_file_is_a_one_line_error(tmp_path, case, needle):
    path = write_synthetic_gguf(tmp_path / "p.gguf", SyntheticSpec(architecture="phi3", rope_freqs=True, tied=False))
    model = GGUFModel(path)
    if case == "one factor set":
        bad = rewrite_gguf(path, tmp_path / "bad.gguf", drop=("rope_factors_short.weight",))
    elif case == "attention factor":
        bad = rewrite_gguf(path, tmp_path / "bad.gguf", values={"phi3.rope.scaling.attn_factor": -1.0})
    else:
        name = "blk.0.ffn_up.weight" if case == "fused gate/up" else "blk.0.attn_qkv.weight"
        rows = np.asarray(model.tensor(name).data)[:-1]  # one output row short
        bad = rewrite_gguf(path, tmp_path / "bad.gguf", drop=(name,),
                           add={name: (rows, model.tensor(name).tensor_type)})
    assert_clean_error(run_cli("generate", "--prompt", "hi", "--model", str(bad), "--data-dir", str(tmp_path / "d")),
                       needle)
