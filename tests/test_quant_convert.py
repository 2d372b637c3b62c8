"""GGUFs of every packable quant type through the real converter, against the float64 reference
(tests/reference.py), with a look at the graph to see the layers really stayed packed."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import onnx
import pytest

from engine.errors import ModelFileError
from engine.model.convert import build_onnx, ensure_converted
from engine.model.gguf_file import GGUFModel
from engine.model.precision import PRECISIONS
from engine.model.synthetic import SyntheticSpec, write_synthetic_gguf
from engine.runtime.runner import ModelRunner
from tests.gguf_edit import rewrite_gguf
from tests.reference import ReferenceLlama

IDS = np.random.default_rng(7).integers(0, 300, 24)
# K-quant rows are whole 256-element super-blocks: every input size (n_embd, n_ff) a multiple of 256.
# An F16 tied head stays dense, so every MatMulNBits is one of the layers under test.
K_SPEC = SyntheticSpec(n_embd=256, n_head=4, n_head_kv=2, n_ff=512, embedding_type="F16", seed=4)
# int4 with 8-bit packing and fp32 activations: the exact path for the types held as 8-bit.
INT4_8BIT = replace(PRECISIONS["int4"], packed_8bit=True)
# int4 as it runs a model of 1 GiB and up: 8-bit forms as two 4-bit planes, whatever the file's size.
INT4_SPLIT = replace(PRECISIONS["int4"], split_8bit_from=0)
FORMS = {  # bits, block of the packed linear layers; None: dense
    "Q5_0": (8, 32), "Q5_1": (8, 32), "Q2_K": None, "Q3_K": (4, 16), "Q4_K": (4, 32), "Q5_K": (8, 32), "Q6_K": (8, 16),
}


def _matmulnbits(onnx_path) -> list[tuple[int, int]]:
    """(bits, block_size) of every MatMulNBits node of a converted graph."""
    graph = onnx.load(str(onnx_path), load_external_data=False).graph
    attrs = [{a.name: a.i for a in n.attribute} for n in graph.node if n.op_type == "MatMulNBits"]
    return [(a["bits"], a["block_size"]) for a in attrs]


def _convert(gguf_path, precision, out_dir):
    return build_onnx(GGUFModel(gguf_path), precision, out_dir, logits_mode="all")


def _assert_matches(logits: np.ndarray, ref: np.ndarray) -> None:
    """fp32 rounding, relative to the logits' size: this wider model's logits reach ±65, and its dense
    fp32 conversion differs from the float64 reference by up to 2e-5 of that too."""
    np.testing.assert_allclose(logits, ref, atol=3e-5 * np.abs(ref).max(), rtol=0)


def _logits(onnx_path, ids=IDS) -> np.ndarray:
    runner = ModelRunner(onnx_path, "cpu")
    return runner.forward(ids, runner.new_cache())


@pytest.mark.parametrize("weight_type", list(FORMS))
def test_each_quant_type_converts_packed_and_exact(tmp_path, weight_type):
    path = write_synthetic_gguf(tmp_path / f"{weight_type}.gguf", replace(K_SPEC, weight_type=weight_type))
    ref = ReferenceLlama(path).logits(IDS)
    onnx_path = _convert(path, INT4_8BIT, tmp_path / "c")
    forms = [] if FORMS[weight_type] is None else [FORMS[weight_type]] * (2 * 4)  # QKV, output, gate/up, down
    assert _matmulnbits(onnx_path) == forms
    _assert_matches(_logits(onnx_path), ref)


@pytest.mark.parametrize("weight_type", ["Q4_K", "Q6_K", "Q5_K", "Q5_0", "Q8_0"])
def test_int4_packs_4_bit_forms_and_splits_8_bit_ones_exactly(tmp_path, weight_type):
    """int4 on a large model: 4-bit forms stay packed; forms held as 8-bit run as two 4-bit planes
    (K doubled, zero points 0/8), with an untied head of the same type. The model stays exact."""
    spec = replace(K_SPEC, weight_type=weight_type, tied=False)
    path = write_synthetic_gguf(tmp_path / "m.gguf", spec)
    onnx_path = _convert(path, INT4_SPLIT, tmp_path / "c")
    graph = onnx.load(str(onnx_path), load_external_data=False).graph
    nodes = [n for n in graph.node if n.op_type == "MatMulNBits"]
    assert len(nodes) == 2 * 4 + 1  # QKV, output, gate/up, down per layer; the head
    split = weight_type != "Q4_K"  # the others are held as 8-bit
    for node in nodes:
        attrs = {a.name: a.i for a in node.attribute}
        assert attrs["bits"] == 4 and (len(node.input) == 4) == split
    head = next(n for n in nodes if n.input[1] == "output.qweight")
    assert {a.name: a.i for a in head.attribute}["K"] == spec.n_embd * (2 if split else 1)
    _assert_matches(_logits(onnx_path), ReferenceLlama(path).logits(IDS))


def test_named_int4_splits_8_bit_forms_from_a_gguf_size_on(tmp_path):
    """The named int4 keeps a small model's 8-bit forms dense (faster on the CPU) and splits them from
    split_8bit_from's GGUF size on (less memory); the rule is the file's size."""
    from engine.model.weights import splits_8bit

    path = write_synthetic_gguf(tmp_path / "m.gguf", replace(K_SPEC, weight_type="Q6_K"))
    model, size = GGUFModel(path), path.stat().st_size
    assert PRECISIONS["int4"].split_8bit_from == 1 << 30 > size and not splits_8bit(model, PRECISIONS["int4"])
    assert splits_8bit(model, replace(PRECISIONS["int4"], split_8bit_from=size))
    assert not splits_8bit(model, replace(PRECISIONS["int4"], split_8bit_from=size + 1))
    assert not splits_8bit(model, PRECISIONS["int4-fast"])  # packs 8-bit as it is
    converted = ensure_converted(path, "int4", tmp_path / "c", logits_mode="all")
    assert _matmulnbits(converted.onnx_path) == []  # every layer Q6_K, dense; the F16 table dense


def test_mixed_types_in_fused_layers(tmp_path):
    """A Q4_K_M-like mix: within one fused QKV and one gate/up, layers of different bits and blocks
    (Q4_K 4-bit/32, Q6_K 8-bit/16, Q3_K 4-bit/16, Q5_0 8-bit/32) go unfused, each in its own form."""
    import gguf

    from engine.model.synthetic import random_k_blocks

    base = write_synthetic_gguf(tmp_path / "base.gguf", replace(K_SPEC, weight_type="Q4_K"))
    kv, dim, ff = K_SPEC.n_head_kv * (K_SPEC.n_embd // K_SPEC.n_head), K_SPEC.n_embd, K_SPEC.n_ff
    rng, t = np.random.default_rng(1), gguf.GGMLQuantizationType
    w = rng.standard_normal((ff, dim)).astype(np.float32) * 0.2
    swaps = {
        "blk.0.attn_v.weight": (random_k_blocks(rng, "Q6_K", kv, dim, 0.3 * np.sqrt(dim)), t.Q6_K),
        "blk.1.ffn_up.weight": (random_k_blocks(rng, "Q3_K", ff, dim, 0.2 * np.sqrt(dim)), t.Q3_K),
        "blk.1.ffn_gate.weight": (gguf.quants.quantize(w, t.Q5_0), t.Q5_0),
    }
    path = rewrite_gguf(base, tmp_path / "mixed.gguf", drop=tuple(swaps), add=swaps)
    ref = ReferenceLlama(path).logits(IDS)
    onnx_path = _convert(path, INT4_8BIT, tmp_path / "c")
    forms = _matmulnbits(onnx_path)
    assert {(8, 16), (4, 16), (8, 32), (4, 32)} <= set(forms)
    _assert_matches(_logits(onnx_path), ref)


def _shrink_rows(src, dst, tensor: str, rows: int, cols: int) -> None:
    """Rewrite one tensor's dims in the header (same byte count), so its row no longer holds whole blocks:
    the gguf package cannot write such a file."""
    data = bytearray(src.read_bytes())
    name = tensor.encode()
    at = data.index(len(name).to_bytes(8, "little") + name) + 8 + len(name)
    assert int.from_bytes(data[at:at + 4], "little") == 2
    data[at + 4:at + 20] = cols.to_bytes(8, "little") + rows.to_bytes(8, "little")
    dst.write_bytes(bytes(data))


def test_k_quant_row_of_partial_blocks_is_a_one_line_error(tmp_path):
    src = write_synthetic_gguf(tmp_path / "m.gguf", replace(K_SPEC, weight_type="Q4_K"))
    # ffn_down is [256 out, 512 in]: as [512 out, 256 in] it would be fine, as [1024, 128] it is not.
    _shrink_rows(src, tmp_path / "bad.gguf", "blk.0.ffn_down.weight", 1024, 128)
    with pytest.raises(ModelFileError) as err:
        ensure_converted(tmp_path / "bad.gguf", "int4", tmp_path / "c")
    message = str(err.value)
    assert "\n" not in message and "128" in message and "Q4_K" in message, message


@pytest.mark.parametrize("precision,weight_type", [
    ("int4-fast", "Q6_K"),  # 8-bit block 16 with int8 activations
    ("int4-half", "Q4_K"),  # fp16 scales, correction and activations
    ("int4-cuda", "Q4_K"),  # Q4_K's min as fp16 float zero points instead of the branch
])
def test_approximate_precisions_run_the_new_types(tmp_path, precision, weight_type):
    """The precisions that are close rather than exact, held to test_graph_reference.py's int4-fast
    bound. (Random Q4_K blocks are harsh for fp16: their block means vary 4× more than Gaussian
    weights', so a few positions of this wide model move by a few % of the logits' spread; one
    fp16 MatMulNBits of them errs as much as Q4_1's.)"""
    path = write_synthetic_gguf(tmp_path / "m.gguf", replace(K_SPEC, weight_type=weight_type))
    ref = ReferenceLlama(path).logits(IDS)
    converted = ensure_converted(path, precision, tmp_path / "c", logits_mode="all")
    assert _matmulnbits(converted.onnx_path)  # packed
    got = _logits(converted.onnx_path)
    assert np.abs(got - ref).max() < 0.1 * np.ptp(ref)
    assert (got.argmax(-1) == ref.argmax(-1)).mean() > 0.8


@pytest.mark.parametrize("tied", [True, False])
@pytest.mark.parametrize("embedding_type", ["Q4_K", "Q5_K", "Q6_K", "Q4_1"])
def test_a_k_quant_table_stays_in_its_blocks_and_the_model_stays_exact(tmp_path, embedding_type, tied):
    """Llama 3 8B's Q4_K_M table is Q4_K: dense fp32 it would take 2.1 GB, in its blocks 0.4 GB. Its rows
    are gathered and dequantized in the graph (offsets included); tied, the head shares the blocks."""
    spec = replace(K_SPEC, weight_type="Q4_K", embedding_type=embedding_type, tied=tied)
    path = write_synthetic_gguf(tmp_path / "m.gguf", spec)
    onnx_path = _convert(path, INT4_SPLIT, tmp_path / "c")
    graph = onnx.load(str(onnx_path), load_external_data=False).graph
    names = {i.name for i in graph.initializer}
    assert "token_embd.weight.qweight" in names and not names & {"token_embd.weight", "token_embd.weight_t"}
    heads = [n for n in graph.node if n.op_type == "MatMulNBits" and n.input[1] == "token_embd.weight.qweight"]
    assert len(heads) == (1 if tied else 0)
    _assert_matches(_logits(onnx_path), ReferenceLlama(path).logits(IDS))
