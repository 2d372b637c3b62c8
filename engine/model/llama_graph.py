"""Build an ONNX graph for a llama-family GGUF with ONNX Runtime's fused transformer ops.

Per layer: SkipSimplifiedLayerNormalization → one fused QKV projection → GroupQueryAttention
(rotary inside, KV cache as explicit past/present inputs and outputs) → output projection →
SkipSimplifiedLayerNormalization → fused gate/up projection → SiLU·up → down projection.

Graph inputs:  input_ids int64 [batch, seq]; seqlens_k int32 [batch] (tokens in the cache after this
call, minus one); total_sequence_length int32 scalar; past_key_values.{i}.key/.value float32 (float16
for an fp16-compute precision) [batch, kv_heads, capacity, head_dim].
Graph outputs: logits float32 [batch, seq or 1, vocab]; present.{i}.key/.value, the same shape as
past. Binding one buffer as both past and present lets the cache be updated in place.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
from onnx import TensorProto

from engine.model import weights
from engine.model.gguf_file import GGUFModel, LlamaConfig
from engine.model.onnx_writer import OnnxWriter
from engine.model.precision import Precision
from engine.model.quant import BLOCK, PackedWeight, concat_packed

ProgressFn = Callable[[int, int], None]
MS = "com.microsoft"


def rotary_tables(cfg: LlamaConfig) -> tuple[np.ndarray, np.ndarray]:
    """cos/sin caches [context_length, rope_dim/2] in the non-interleaved (half-split) layout."""
    half = cfg.rope_dim // 2
    inv_freq = 1.0 / (cfg.rope_base ** (np.arange(half, dtype=np.float64) * 2.0 / cfg.rope_dim))
    positions = np.arange(cfg.context_length, dtype=np.float64) / cfg.rope_scale
    angles = np.outer(positions, inv_freq)
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


class _LlamaGraph:
    def __init__(self, model: GGUFModel, cfg: LlamaConfig, precision: Precision, w: OnnxWriter):
        self.model, self.cfg, self.precision, self.w = model, cfg, precision, w
        self._blocksums: dict[str, str] = {}
        # Activations and the KV cache: float32, or float16 where the attention kernel needs it (CUDA).
        self.half = precision.compute == "float16"
        self.np_dtype = np.float16 if self.half else np.float32
        self.onnx_dtype = TensorProto.FLOAT16 if self.half else TensorProto.FLOAT

    # building blocks ----------------------------------------------------------------------------
    def _dense_initializer(self, name: str, rows: np.ndarray) -> str:
        """Store dense rows [N, K] transposed to [K, N]; fp16 storage gets a Cast back to fp32."""
        kn = np.ascontiguousarray(rows.T)
        if self.precision.dense_dtype == "float16":
            stored = self.w.constant(name, kn.astype(np.float16))
            return stored if self.half else self.w.op1("Cast", [stored], to=TensorProto.FLOAT)
        return self.w.constant(name, kn.astype(self.np_dtype))

    def _blocksum(self, x: str, k: int) -> str:
        if x not in self._blocksums:
            shape = self.w.constant(self.w.fresh("blockshape"), np.array([0, 0, k // BLOCK, BLOCK], np.int64))
            grouped = self.w.op1("Reshape", [x, shape])
            axes = self.w.constant(self.w.fresh("axes"), np.array([-1], np.int64))
            self._blocksums[x] = self.w.op1("ReduceSum", [grouped, axes], keepdims=0)
        return self._blocksums[x]

    def linear(self, x: str, name: str, layer: weights.Layer, out: str | None = None) -> str:
        named = {"outputs": [out]} if out else {}
        if isinstance(layer, np.ndarray):
            return self.w.op("MatMul", [x, self._dense_initializer(name, layer)], **named)[0]
        inputs = [x]
        if layer.correction is not None and self.precision.q4_1_form == "zero_point":
            blob, scales, zero_points = layer.with_zero_points()
            inputs += [self.w.constant(name + ".qweight", blob), self.w.constant(name + ".scales", scales.astype(self.np_dtype)),
                       self.w.constant(name + ".zero_points", zero_points.astype(self.np_dtype))]
            layer_correction = None
        else:
            inputs += [self.w.constant(name + ".qweight", layer.blob),
                       self.w.constant(name + ".scales", layer.scales.astype(self.np_dtype))]  # must match the input
            layer_correction = layer.correction
        named_y = named if layer_correction is None else {}  # with a correction, the Add is last
        y = self.w.op(
            "MatMulNBits", inputs, domain=MS, **named_y,
            K=layer.k, N=layer.n, bits=layer.bits, block_size=BLOCK, accuracy_level=self.precision.accuracy_level,
        )[0]
        if layer_correction is None:
            return y
        corr = self.w.constant(name + ".q4_1_offset", layer.correction.astype(self.np_dtype))
        return self.w.op("Add", [y, self.w.op1("MatMul", [self._blocksum(x, layer.k), corr])], **named)[0]

    def fused(self, names: list[str], heads: list[int | None]) -> weights.Layer | list[weights.Layer]:
        """Layers that read the same input, merged into one when their forms agree."""
        layers = [weights.linear(self.model, n, self.precision, h) for n, h in zip(names, heads, strict=True)]
        if all(isinstance(x, np.ndarray) for x in layers):
            return np.concatenate(layers, axis=0)
        if all(isinstance(x, PackedWeight) for x in layers) and len({(x.bits, x.k) for x in layers}) == 1:
            return concat_packed(layers)
        return layers

    def fused_linear(self, x: str, name: str, names: list[str], heads: list[int | None]) -> str:
        merged = self.fused(names, heads)
        if not isinstance(merged, list):
            return self.linear(x, name, merged)
        parts = [self.linear(x, n, layer) for n, layer in zip(names, merged, strict=True)]
        return self.w.op1("Concat", parts, axis=-1)

    def norm_weight(self, name: str) -> str:
        return self.w.constant(name, weights.dense(self.model, name).astype(self.np_dtype).reshape(-1))

    # the model ----------------------------------------------------------------------------------
    def build(self, logits_mode: str, progress: ProgressFn | None) -> None:
        cfg, w = self.cfg, self.w
        ids = w.add_input("input_ids", TensorProto.INT64, ["batch", "seq"])
        seqlens = w.add_input("seqlens_k", TensorProto.INT32, ["batch"])
        total = w.add_input("total_sequence_length", TensorProto.INT32, [])
        cos, sin = rotary_tables(cfg)
        cos_name = w.constant("rotary.cos", cos.astype(self.np_dtype))
        sin_name = w.constant("rotary.sin", sin.astype(self.np_dtype))

        hidden = self.embed(ids)
        residual: str | None = None
        pending = hidden  # output of the previous block, not yet added to the residual
        steps = cfg.n_layers + 1
        for i in range(cfg.n_layers):
            p = f"blk.{i}."
            normed, residual = self.add_and_norm(pending, residual, p + "attn_norm.weight")
            qkv = self.fused_linear(
                normed, p + "attn_qkv", [p + "attn_q.weight", p + "attn_k.weight", p + "attn_v.weight"],
                [cfg.n_head, cfg.n_head_kv, None],
            )
            kv_shape = ["batch", cfg.n_head_kv, "capacity", cfg.head_dim]
            past_k = w.add_input(f"past_key_values.{i}.key", self.onnx_dtype, kv_shape)
            past_v = w.add_input(f"past_key_values.{i}.value", self.onnx_dtype, kv_shape)
            present = [f"present.{i}.key", f"present.{i}.value"]
            attn = w.op(
                "GroupQueryAttention", [qkv, "", "", past_k, past_v, seqlens, total, cos_name, sin_name], 3,
                domain=MS, name=f"layer{i}.attention", outputs=[f"layer{i}.attention/0", *present],
                num_heads=cfg.n_head, kv_num_heads=cfg.n_head_kv, do_rotary=1, rotary_interleaved=0,
            )[0]
            for name in present:
                w.add_output(name, self.onnx_dtype, kv_shape)
            out = self.linear(attn, p + "attn_output", weights.linear(self.model, p + "attn_output.weight", self.precision))
            normed, residual = self.add_and_norm(out, residual, p + "ffn_norm.weight")
            gate_up = self.fused_linear(normed, p + "ffn_gate_up", [p + "ffn_gate.weight", p + "ffn_up.weight"], [None, None])
            gate, up = w.op("Split", [gate_up], 2, axis=-1, num_outputs=2)
            act = w.op1("Mul", [w.op1("Mul", [gate, w.op1("Sigmoid", [gate])]), up])
            pending = self.linear(act, p + "ffn_down", weights.linear(self.model, p + "ffn_down.weight", self.precision))
            if progress:
                progress(i + 1, steps)

        final, _ = self.add_and_norm(pending, residual, "output_norm.weight")
        if logits_mode == "last":
            starts = w.constant("last.start", np.array([-1], np.int64))
            ends = w.constant("last.end", np.array([np.iinfo(np.int64).max], np.int64))
            axis = w.constant("last.axis", np.array([1], np.int64))
            final = w.op1("Slice", [final, starts, ends, axis])
        self.head(final)
        if progress:
            progress(steps, steps)

    def embed(self, ids: str) -> str:
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

    def _head_is_packed(self) -> bool:
        return weights.will_pack(self.model, "token_embd.weight", self.precision)

    def head(self, hidden: str) -> None:
        # Logits always leave the graph as float32: sampling and tests read them the same way.
        out = "logits.half" if self.half else "logits"
        if not self.cfg.tied_embeddings:
            self.linear(hidden, "output", weights.linear(self.model, "output.weight", self.precision), out=out)
        elif self._head_is_packed():
            layer = weights.linear(self.model, "token_embd.weight", self.precision)
            self.linear(hidden, "output", layer, out=out)
        else:
            self.w.op("MatMul", [hidden, self._head_matrix], outputs=[out])
        if self.half:
            self.w.op("Cast", [out], outputs=["logits"], to=TensorProto.FLOAT)
        self.w.add_output("logits", TensorProto.FLOAT, ["batch", "logit_seq", self.cfg.vocab_size])

    def add_and_norm(self, x: str, residual: str | None, weight_name: str) -> tuple[str, str]:
        """(normed, new residual): RMSNorm of residual + x, fused with the addition where possible."""
        gamma = self.norm_weight(weight_name)
        eps = float(self.cfg.norm_eps)
        if residual is None:
            return self.w.op1("SimplifiedLayerNormalization", [x, gamma], axis=-1, epsilon=eps), x
        normed, _, _, summed = self.w.op("SkipSimplifiedLayerNormalization", [x, residual, gamma], 4, domain=MS, epsilon=eps)
        return normed, summed


def build_llama_onnx(
    model: GGUFModel,
    precision: Precision,
    out_dir: Path,
    *,
    logits_mode: str = "last",
    metadata: dict[str, str] | None = None,
    progress: ProgressFn | None = None,
) -> Path:
    """Write ``model.onnx`` (+ ``model.onnx.data``) into ``out_dir`` and return the .onnx path."""
    if logits_mode not in ("last", "all"):
        raise ValueError("logits_mode must be 'last' or 'all'")
    cfg = model.config()
    out_dir.mkdir(parents=True, exist_ok=True)
    writer = OnnxWriter(out_dir / "model.onnx.data")
    try:
        _LlamaGraph(model, cfg, precision, writer).build(logits_mode, progress)
        meta = {"hearth.config": json.dumps(cfg.__dict__), "hearth.precision": precision.name,
                "hearth.logits": logits_mode, "hearth.kv_dtype": precision.compute, **(metadata or {})}
        writer.save(out_dir / "model.onnx", meta)
    finally:
        writer.close()
    return out_dir / "model.onnx"
