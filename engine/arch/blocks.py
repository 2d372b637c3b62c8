"""The blocks every architecture's graph is built from, on ONNX Runtime's fused transformer ops.

An architecture's ``build(g)`` (engine/arch/__init__.py says what a module provides) strings them
together: inputs → embedding → per layer (norms, linears, GroupQueryAttention, MLP) → final norm →
logits. Each block reads the GGUF tensors it needs in the form the precision asks for (packed 4-bit
blocks or dense rows) and writes them into the graph; the graph's inputs and outputs are named by
engine/arch/io_names.py. Nothing here is particular to one architecture.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np
from onnx import TensorProto

from engine.arch import io_names
from engine.arch.config import ModelConfig
from engine.arch.packed_ops import PackedInitializers, gather_rows, write_packed
from engine.arch.rope import RotaryTable
from engine.model import weights
from engine.model.gguf_file import GGUFModel
from engine.model.onnx_writer import OnnxWriter
from engine.model.precision import Precision
from engine.model.quant import PackedWeight, concat_packed
from engine.runtime import cuda_kernels, native_matmul

ProgressFn = Callable[[int, int], None]
MS = "com.microsoft"


class Graph:
    """One model's graph under construction: its GGUF, config and precision, and the writer."""

    def __init__(self, model: GGUFModel, cfg: ModelConfig, precision: Precision, writer: OnnxWriter,
                 logits_mode: str = "last", progress: ProgressFn | None = None):
        self.model, self.cfg, self.precision, self.w = model, cfg, precision, writer
        self.logits_mode, self.progress = logits_mode, progress
        self._input_forms: dict[str, str] = {}  # block sums and doubled copies, per input
        self._head_matrix = ""  # the tied head's matrix, when embed() stores it for both
        self._tied_head: PackedInitializers | None = None  # embed()'s table in blocks, when the head shares it
        self._tied_blocks: tuple[str, str] | None = None  # (initializer, type): embed()'s GGUF rows, shared likewise
        self.seqlens = self.total = ""  # the length inputs, once inputs() has declared them
        # Activations and the KV cache: float32, or float16 where the attention kernel needs it (CUDA).
        self.half = precision.compute == "float16"
        self.np_dtype = np.float16 if self.half else np.float32
        self.onnx_dtype = TensorProto.FLOAT16 if self.half else TensorProto.FLOAT

    # inputs and the layer loop -------------------------------------------------------------------
    def inputs(self) -> str:
        """Declare the token and length inputs; return the token ids."""
        w = self.w
        ids = w.add_input(io_names.INPUT_IDS, TensorProto.INT64, ["batch", "seq"])
        self.seqlens = w.add_input(io_names.SEQLENS_K, TensorProto.INT32, ["batch"])
        self.total = w.add_input(io_names.TOTAL_SEQUENCE_LENGTH, TensorProto.INT32, [])
        return ids

    def layers(self) -> Iterator[int]:
        """The layer indices, reporting conversion progress after each layer."""
        steps = self.cfg.n_layers + 1
        for i in range(self.cfg.n_layers):
            yield i
            self.model.release_pages()  # this layer's tensors are written out
            if self.progress:
                self.progress(i + 1, steps)

    # weights ------------------------------------------------------------------------------------
    def weight(self, name: str, reorder_rows: weights.RowOrder | None = None) -> weights.Layer:
        return weights.linear(self.model, name, self.precision, reorder_rows)

    def vector(self, name: str) -> np.ndarray:
        """A 1-D tensor (a norm's gain, a bias) as fp32."""
        return weights.dense(self.model, name).reshape(-1)

    def _dense_initializer(self, name: str, rows: np.ndarray) -> str:
        """Store dense rows [N, K] transposed to [K, N]; fp16 storage gets a Cast back to fp32."""
        kn = np.ascontiguousarray(rows.T)
        if self.precision.dense_dtype == "float16":
            stored = self.w.constant(name, kn.astype(np.float16))
            return stored if self.half else self.w.op1("Cast", [stored], to=TensorProto.FLOAT)
        return self.w.constant(name, kn.astype(self.np_dtype))

    # linear layers -------------------------------------------------------------------------------
    def linear(self, x: str, name: str, layer: weights.Layer, bias: np.ndarray | None = None,
               out: str | None = None) -> str:
        """x @ layer.T (+ bias); ``out`` names the result."""
        last = {"outputs": [out]} if out else {}
        y = self._matmul(x, name, layer, last if bias is None else {})
        if bias is None:
            return y
        return self.w.op("Add", [y, self.w.constant(name + ".bias", bias.astype(self.np_dtype))], **last)[0]

    def _matmul(self, x: str, name: str, layer: weights.Layer, named: dict) -> str:
        if isinstance(layer, np.ndarray):
            return self.w.op("MatMul", [x, self._dense_initializer(name, layer)], **named)[0]
        if isinstance(layer, weights.RawRows):
            return self._matmul_blocks(x, self._blocks(name, layer), layer.type_name, named)
        return self._matmul_packed(x, self._packed(name, layer), named)

    def _blocks(self, name: str, layer: weights.RawRows) -> str:
        """The GGUF's rows of ``layer`` as one uint8 initializer [N, bytes per row]."""
        return self.w.constant(name + ".blocks", layer.raw)

    def _matmul_blocks(self, x: str, blocks: str, type_name: str, named: dict) -> str:
        """x @ W.T straight from the GGUF's blocks: Hearth's MatMulQ (engine/native/hearth_matmul*.c),
        exact fp32 or, for int4-fast, int8 activations and integer dots, as the GGUF's own CPU kernels compute;
        on CUDA (precision.cuda_blocks), the CUDA library's MatMulQ (engine/native/cuda/)."""
        if self.precision.cuda_blocks:
            return self._matmul_cuda_blocks(x, [(blocks, type_name)], named)
        return self.w.op(native_matmul.MATMUL_OP, [x, blocks], domain=native_matmul.DOMAIN, **named,
                         type=native_matmul.TYPE_IDS[type_name], fast=int(self.precision.accuracy_level == 4))[0]

    def _matmul_cuda_blocks(self, x: str, parts: list[tuple[str, str]], named: dict, act: int = 0) -> str:
        """One launch of the CUDA MatMulQ over up to three matrices side by side ((initializer, GGUF type) each,
        their outputs concatenated); ``act`` (cuda_kernels.ACT_*): x is gate|up and the matmul reads act(gate)·up."""
        types = {("type", "type1", "type2")[i]: cuda_kernels.TYPE_IDS[t] for i, (_, t) in enumerate(parts)}
        if act:
            types["act"] = act
        if self.precision.accuracy_level == 4:
            # int8 activations per 32 and dp4a (hearth_cuda_q8.cuh), x quantized into the node's third output, a
            # scratch no node reads (ONNX Runtime allocates it, so a captured CUDA graph keeps its address); no
            # residual sum yet.
            types["numerics"] = cuda_kernels.NUMERICS_INT8
            base = self.w.fresh(cuda_kernels.MATMUL_OP)
            y = named["outputs"][0] if named.get("outputs") else f"{base}/0"
            named = {"name": base, "outputs": [y, "", f"{base}/q8"]}
        return self.w.op(cuda_kernels.MATMUL_OP, [x, *(b for b, _ in parts)], domain=cuda_kernels.DOMAIN, **named,
                         **types)[0]

    def _packed(self, name: str, layer: PackedWeight) -> PackedInitializers:
        return write_packed(self.w, name, layer, self.np_dtype, self.precision.q4_1_form == "zero_point")

    def _matmul_packed(self, x: str, p: PackedInitializers, named: dict) -> str:
        # A layer split into planes reads each input block twice (engine/model/quant.py: split_planes).
        inputs = [x if p.planes == 1 else self._doubled(x, p.k, p.block), p.blob, p.scales]
        if p.zero_points is not None:
            inputs.append(p.zero_points)
        y = self.w.op(
            "MatMulNBits", inputs, domain=MS, **(named if p.correction is None else {}),  # else the Add is last
            K=p.matmul_k, N=p.n, bits=p.bits, block_size=p.block, accuracy_level=self.precision.accuracy_level,
        )[0]
        if p.correction is None:
            return y
        # Per-block offsets (Q4_1's m + 8d, the K-quants' mins): blocksum(x) @ correction, see engine/model/quant.py.
        blocksum = self._blocksum(x, p.k, p.block)
        return self.w.op("Add", [y, self.w.op1("MatMul", [blocksum, p.correction])], **named)[0]

    def _blocksum(self, x: str, k: int, block: int) -> str:
        key = f"{x}/{block}"  # layers that share an input and a block size share its block sums
        if key not in self._input_forms:
            shape = self.w.constant(self.w.fresh("blockshape"), np.array([0, 0, k // block, block], np.int64))
            grouped = self.w.op1("Reshape", [x, shape])
            axes = self.w.constant(self.w.fresh("axes"), np.array([-1], np.int64))
            self._input_forms[key] = self.w.op1("ReduceSum", [grouped, axes], keepdims=0)
        return self._input_forms[key]

    def _doubled(self, x: str, k: int, block: int) -> str:
        """x with each block of ``block`` inputs repeated once: [.., k] → [.., 2k]."""
        key = f"{x}/{block}/doubled"
        if key not in self._input_forms:
            shape = self.w.constant(self.w.fresh("blockshape"), np.array([0, 0, k // block, 1, block], np.int64))
            grouped = self.w.op1("Reshape", [x, shape])
            pairs = self.w.op1("Concat", [grouped, grouped], axis=3)
            flat = self.w.constant(self.w.fresh("doubledshape"), np.array([0, 0, 2 * k], np.int64))
            self._input_forms[key] = self.w.op1("Reshape", [pairs, flat])
        return self._input_forms[key]

    def fused_linear(self, x: str, name: str, layers: dict[str, weights.Layer],
                     biases: dict[str, np.ndarray] | None = None) -> str:
        """Layers (keyed by tensor name) that read the same input, as one matmul with their outputs
        side by side when their forms agree, else one each, concatenated. ``biases``: by tensor name."""
        parts, biases = list(layers.values()), biases or {}
        merged: weights.Layer | None = None
        if all(isinstance(p, np.ndarray) for p in parts):
            merged = np.concatenate(parts, axis=0)
        elif all(isinstance(p, PackedWeight) for p in parts) and len({(p.bits, p.k, p.block) for p in parts}) == 1:
            merged = concat_packed(parts)
        elif all(isinstance(p, weights.RawRows) for p in parts) and len({(p.type_name, p.k) for p in parts}) == 1:
            first = parts[0]
            merged = weights.RawRows(first.type_name, np.concatenate([p.raw for p in parts]), sum(p.n for p in parts),
                                     first.k)
        elif self.precision.cuda_blocks and len(parts) <= 3 and all(isinstance(p, weights.RawRows) for p in parts):
            # Different block types (Q4_K_M's Q6_K value rows beside Q4_K query and key rows): one launch all the same.
            y = self._matmul_cuda_blocks(x, [(self._blocks(n, p), p.type_name) for n, p in layers.items()], {})
            if not biases:
                return y
            bias = np.concatenate([biases[n] if n in biases else np.zeros(p.n, np.float32) for n, p in layers.items()])
            return self.w.op1("Add", [y, self.w.constant(name + ".bias", bias.astype(self.np_dtype))])
        if merged is None:
            outs = [self.linear(x, n, layer, biases.get(n)) for n, layer in layers.items()]
            return self.w.op1("Concat", outs, axis=-1)
        bias = None
        if biases:
            bias = np.concatenate([biases[n] if n in biases else np.zeros(_out_features(p), np.float32)
                                   for n, p in layers.items()])
        return self.linear(x, name, merged, bias)

    # norms, attention, MLP -------------------------------------------------------------------------
    def add_and_norm(self, x: str, residual: str | None, weight_name: str, *, gain_scale: float = 1.0,
                     eps_scale: float = 1.0) -> tuple[str, str]:
        """(normed, new residual): RMSNorm of residual + x, fused with the addition where possible;
        ``residual`` None: the first norm, of x alone. ``gain_scale`` multiplies the gain and ``eps_scale`` the
        epsilon: a residual stream kept at 1/S of its size (gemma3's on fp16) is read exactly by a norm with
        epsilon / S², and a sublayer's post-norm with gain / S writes into it at that size."""
        gamma = self.w.constant(weight_name, (self.vector(weight_name) * gain_scale).astype(self.np_dtype))
        eps = float(self.cfg.norm_eps) * eps_scale
        if residual is None:
            return self.w.op1("SimplifiedLayerNormalization", [x, gamma], axis=-1, epsilon=eps), x
        normed, _, _, summed = self.w.op("SkipSimplifiedLayerNormalization", [x, residual, gamma], 4, domain=MS, epsilon=eps)
        return normed, summed

    def head_norm(self, x: str, n_heads: int, weight_name: str) -> str:
        """RMSNorm of each head of x [batch, seq, n_heads · head_dim] with one [head_dim] gain (QK norm).
        Done here, not by GQA's q_norm_weight inputs: only CUDA and WebGPU honour those."""
        w, gamma = self.w, self.vector(weight_name)
        head_dim = gamma.size
        heads = w.op1("Reshape", [x, w.constant(w.fresh("heads.shape"), np.array([0, 0, n_heads, head_dim], np.int64))])
        normed = w.op1("SimplifiedLayerNormalization", [heads, w.constant(weight_name, gamma.astype(self.np_dtype))],
                       axis=-1, epsilon=float(self.cfg.norm_eps))
        return w.op1("Reshape", [normed, w.constant(w.fresh("flat.shape"), np.array([0, 0, n_heads * head_dim], np.int64))])

    def split(self, x: str, sizes: list[int]) -> list[str]:
        """x split along its last axis into parts of ``sizes``."""
        return self.w.op("Split", [x, self.w.constant(self.w.fresh("split"), np.array(sizes, np.int64))], len(sizes),
                         axis=-1)

    def qk_normed_qkv(self, x: str, prefix: str) -> tuple[str, str, str]:
        """(q, k, v) of one fused QKV projection, with a per-head RMSNorm on q and k (``attn_q_norm``,
        ``attn_k_norm``): for GQA's separate query, key and value inputs."""
        cfg = self.cfg
        qkv = self.fused_linear(x, prefix + "attn_qkv", {
            prefix + t + ".weight": self.weight(prefix + t + ".weight") for t in ("attn_q", "attn_k", "attn_v")})
        kv_width = cfg.n_head_kv * cfg.head_dim
        q, k, v = self.split(qkv, [cfg.n_head * cfg.head_dim, kv_width, kv_width])
        q = self.head_norm(q, cfg.n_head, prefix + "attn_q_norm.weight")
        k = self.head_norm(k, cfg.n_head_kv, prefix + "attn_k_norm.weight")
        return q, k, v

    def rotary(self, cos: RotaryTable, sin: RotaryTable, name: str = "rotary") -> tuple[str, str]:
        """cos/sin caches [context_length, rotary_dim / 2], half-split layout, as GQA takes them, streamed
        to the weights file a block of positions at a time (engine/arch/rope.py: a long context's whole
        tables once peaked at three times their size); ``name``: another pair's (layers that rotate
        with another base)."""
        return (self.w.constant_blocks(name + ".cos", cos.shape, self.np_dtype, cos.blocks(self.np_dtype)),
                self.w.constant_blocks(name + ".sin", sin.shape, self.np_dtype, sin.blocks(self.np_dtype)))

    def attention(self, layer: int, qkv: str, rotary: tuple[str, str], key: str = "", value: str = "",
                  **attrs) -> str:
        """GroupQueryAttention over the packed Q|K|V projection (or Q alone, with ``key`` and ``value``),
        rotary applied inside, with the layer's KV cache as past inputs and present outputs.
        ``attrs``: more GQA attributes (a window, a scale)."""
        cfg, w = self.cfg, self.w
        kv_shape = ["batch", cfg.n_head_kv, "capacity", cfg.head_dim]
        past_k = w.add_input(io_names.past_key(layer), self.onnx_dtype, kv_shape)
        past_v = w.add_input(io_names.past_value(layer), self.onnx_dtype, kv_shape)
        present = [io_names.present_key(layer), io_names.present_value(layer)]
        attn = w.op(
            "GroupQueryAttention", [qkv, key, value, past_k, past_v, self.seqlens, self.total, *rotary], 3,
            domain=MS, name=f"layer{layer}.attention", outputs=[f"layer{layer}.attention/0", *present],
            num_heads=cfg.n_head, kv_num_heads=cfg.n_head_kv, do_rotary=1, rotary_interleaved=0, **attrs,
        )[0]
        for name in present:
            w.add_output(name, self.onnx_dtype, kv_shape)
        return attn

    def swiglu_mlp(self, x: str, prefix: str) -> str:
        """down(silu(gate(x)) · up(x)), gate and up fused; GGUF's ffn_gate/ffn_up/ffn_down tensors."""
        return self.swiglu_from(self._gate_up(x, prefix), prefix)

    def _gate_up(self, x: str, prefix: str) -> str:
        """The gate and up projections of x side by side (gate first), as one matmul where their forms agree."""
        return self.fused_linear(x, prefix + "ffn_gate_up", {
            prefix + "ffn_gate.weight": self.weight(prefix + "ffn_gate.weight"),
            prefix + "ffn_up.weight": self.weight(prefix + "ffn_up.weight"),
        })

    def swiglu_from(self, gate_up: str, prefix: str) -> str:
        """down(silu(gate) · up) from the gate and up outputs side by side (gate first)."""
        return self._gated_down(gate_up, prefix, cuda_kernels.ACT_SILU)

    def geglu_mlp(self, x: str, prefix: str) -> str:
        """down(gelu_tanh(gate(x)) · up(x)), gate and up fused: the MLP with GELU's tanh form as the gate."""
        return self._gated_down(self._gate_up(x, prefix), prefix, cuda_kernels.ACT_GELU_TANH)

    def _gated_down(self, gate_up: str, prefix: str, act: int) -> str:
        """down(act(gate) · up) from gate|up (``act``: cuda_kernels.ACT_SILU or ACT_GELU_TANH). Where the CUDA
        kernels run the down projection, it reads act(gate)·up itself: the Split, the activation and the Mul are
        three launches fewer a layer (a small model's decode step is launch-bound; docs/cuda.md)."""
        w = self.w
        down = self.weight(prefix + "ffn_down.weight")
        if self.precision.cuda_blocks and isinstance(down, weights.RawRows):
            return self._matmul_cuda_blocks(gate_up, [(self._blocks(prefix + "ffn_down", down), down.type_name)], {},
                                            act)
        gate, up = w.op("Split", [gate_up], 2, axis=-1, num_outputs=2)
        if act == cuda_kernels.ACT_SILU:
            gated = w.op1("Mul", [gate, w.op1("Sigmoid", [gate])])
        else:
            gated = w.op1("Gelu", [gate], approximate="tanh")
        return self.linear(w.op1("Mul", [gated, up]), prefix + "ffn_down", down)

    def scale(self, x: str, factor: float, name: str) -> str:
        """x · factor, the factor rounded once to the activations' type."""
        return self.w.op1("Mul", [x, self.w.constant(name, np.array(factor, self.np_dtype))])

    # embedding and head --------------------------------------------------------------------------
    def _embed_dense(self, ids: str) -> str:
        """The token table as dense rows; tied to a dense head, one matrix serves both."""
        table = weights.dense(self.model, "token_embd.weight")  # [vocab, n_embd]
        if self.cfg.tied_embeddings and not self._head_is_packed():
            # One [n_embd, vocab] matrix serves as both the head and (gathered along axis 1) the table.
            self._head_matrix = self._dense_initializer("token_embd.weight_t", table)
            columns = self.w.op1("Gather", [self._head_matrix, ids], axis=1)  # [n_embd, batch, seq]
            return self.w.op1("Transpose", [columns], perm=[1, 2, 0])
        stored = self.w.constant("token_embd.weight", table.astype(self.precision.dense_dtype))
        if self.precision.dense_dtype != self.precision.compute:
            stored = self.w.op1("Cast", [stored], to=self.onnx_dtype)
        return self.w.op1("Gather", [stored, ids], axis=0)

    def embed(self, ids: str) -> str:
        """The token embedding kept in its GGUF blocks, in the precision's packed form, where activations
        are fp32: only the gathered rows are dequantized (packed_ops.gather_rows), exactly the weights
        the packed matmul computes with. A tied head runs on the same blocks: one copy for both. Falls
        back to _embed_dense() where the table has no packed form or activations are fp16.

        Measured on Gemma 3 270M (its Q8_0 table [262,144 × 640]; 2 CPU threads, decode): a dense fp32
        head took ~41 ms a step and, shared with the embedding's Gather, stayed in memory next to ONNX
        Runtime's prepacked copy (1.67 GB resident against 1.04 GB with the table in blocks). 8-bit
        MatMulNBits with fp32 activations takes ~0.9 s a step (so exact int4 splits 8-bit forms into
        4-bit planes), with int8 activations (accuracy level 4) ~11 ms; bench/matmul_kernels.py."""
        name = weights.EMBEDDING
        if not weights.embedding_in_blocks(self.model, self.precision):
            return self._embed_dense(ids)
        gathered = weights.gathered_table(self.model, self.precision)
        if isinstance(gathered, weights.RawRows):  # Hearth's kernels: GatherQ, and a tied head's MatMulQ, on one copy
            blocks = self._blocks(name, gathered)
            if self.cfg.tied_embeddings:
                self._tied_blocks = (blocks, gathered.type_name)
            self.model.release_pages()
            if self.precision.cuda_blocks:
                return self.w.op1(cuda_kernels.GATHER_OP, [ids, blocks], domain=cuda_kernels.DOMAIN,
                                  type=cuda_kernels.TYPE_IDS[gathered.type_name])
            return self.w.op1(native_matmul.GATHER_OP, [ids, blocks], domain=native_matmul.DOMAIN,
                              type=native_matmul.TYPE_IDS[gathered.type_name], k=gathered.k)
        table = self._packed(name, gathered)  # written: not kept
        if self.cfg.tied_embeddings and self._head_is_packed():
            self._tied_head = table
        self.model.release_pages()
        return gather_rows(self.w, table, ids, "token_embd")

    def _head_is_packed(self) -> bool:
        return weights.will_pack(self.model, "token_embd.weight", self.precision)

    def logits(self, hidden: str) -> None:
        """The output head over the final hidden states (the last position's only, unless the graph
        was asked for all), as the ``logits`` output."""
        w = self.w
        if self.logits_mode == "last":
            # The slice starts where the runner says (-1 to decode, -n to verify n drafted positions
            # at once: prompt-lookup decoding), so one conversion serves both.
            starts = w.add_input(io_names.LOGITS_START, TensorProto.INT64, [1])
            ends = w.constant("last.end", np.array([np.iinfo(np.int64).max], np.int64))
            axis = w.constant("last.axis", np.array([1], np.int64))
            hidden = w.op1("Slice", [hidden, starts, ends, axis])
        # Logits always leave the graph as float32: sampling and tests read them the same way.
        out = io_names.LOGITS + ".half" if self.half else io_names.LOGITS
        if not self.cfg.tied_embeddings:
            self.linear(hidden, "output", self.weight("output.weight"), out=out)
        elif self._tied_blocks is not None:  # the table's GGUF rows, shared with GatherQ
            self._matmul_blocks(hidden, *self._tied_blocks, {"outputs": [out]})
        elif self._tied_head is not None:  # the embedding's blocks, one copy for both
            self._matmul_packed(hidden, self._tied_head, {"outputs": [out]})
        elif self._head_is_packed():
            self.linear(hidden, "output", self.weight("token_embd.weight"), out=out)
        else:  # the matrix _embed_dense() stored for both, else one for the head alone
            head = self._head_matrix or self._dense_initializer(
                "token_embd.weight_t", weights.dense(self.model, "token_embd.weight"))
            w.op("MatMul", [hidden, head], outputs=[out])
        self.model.release_pages()
        if self.half:
            w.op("Cast", [out], outputs=[io_names.LOGITS], to=TensorProto.FLOAT)
        w.add_output(io_names.LOGITS, TensorProto.FLOAT, ["batch", "logit_seq", self.cfg.vocab_size])
        if self.progress:
            self.progress(self.cfg.n_layers + 1, self.cfg.n_layers + 1)


def _out_features(layer: weights.Layer) -> int:
    return layer.shape[0] if isinstance(layer, np.ndarray) else layer.n
