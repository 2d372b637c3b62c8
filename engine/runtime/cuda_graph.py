"""Decode steps replayed as a CUDA graph (ONNX Runtime's ``enable_cuda_graph``), for CUDA only.

A decode step of a small model is launch-bound: hundreds of tiny kernels. ONNX Runtime can capture
one run as a CUDA graph and replay it, if every input and output keeps its address between runs. So
a second session (the same model, graph capture on) gets fixed buffers: the token id and
``seqlens_k`` on the GPU, ``total_sequence_length`` in host memory, the logits on the GPU, and the
KV cache's own buffers (allocated once for the whole context on a GPU). Each step writes the new
values into those buffers in place and replays. Prefill keeps the ordinary session.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from engine.arch import io_names
from engine.runtime import cuda_attention, providers
from engine.runtime.kv_cache import KVCache

log = logging.getLogger(__name__)


class GraphDecoder:
    def __init__(self, onnx_path: Path, options, vocab_size: int):
        cuda = [(providers.ort_name("cuda"), {"enable_cuda_graph": "1"})]
        # Whose attention the decode steps run: "hearth (CUDA)", one launch a layer (cuda_attention.py), or ONNX
        # Runtime's GroupQueryAttention, where Hearth's cannot run or fails to open.
        self.attention = "onnxruntime"
        self.session = None
        model = cuda_attention.decode_model(onnx_path, options)
        if model is not None:
            try:
                self.session = providers.open_session(model, options, cuda)
                self.attention = "hearth (CUDA)"
            except Exception as exc:  # ORT raises its own types; fall back to the graph as converted
                log.warning("CUDA decode attention unavailable (%s); using ONNX Runtime's",
                            str(exc).splitlines()[0][:200])
        if self.session is None:
            self.session = providers.open_session(onnx_path, options, cuda)
        self.vocab_size = vocab_size
        self.cache: KVCache | None = None
        self.binding = None

    def _bind(self, cache: KVCache) -> None:
        import onnxruntime as ort

        self.ids = ort.OrtValue.ortvalue_from_numpy(np.zeros((1, 1), np.int64), "cuda", 0)
        self.seqlens = ort.OrtValue.ortvalue_from_numpy(np.zeros(1, np.int32), "cuda", 0)
        self.total = ort.OrtValue.ortvalue_from_numpy(np.zeros((), np.int32))  # GQA reads it on the host
        self.logits = ort.OrtValue.ortvalue_from_shape_and_type([1, 1, self.vocab_size], np.float32, "cuda", 0)
        b = self.session.io_binding()
        b.bind_ortvalue_input(io_names.INPUT_IDS, self.ids)
        b.bind_ortvalue_input(io_names.SEQLENS_K, self.seqlens)
        b.bind_ortvalue_input(io_names.TOTAL_SEQUENCE_LENGTH, self.total)
        if io_names.LOGITS_START in {i.name for i in self.session.get_inputs()}:
            self.start = ort.OrtValue.ortvalue_from_numpy(np.array([-1], np.int64))
            b.bind_ortvalue_input(io_names.LOGITS_START, self.start)
        b.bind_ortvalue_output(io_names.LOGITS, self.logits)
        for i in range(cache.n_layers):
            cache.bind_layer(b, i)
        self.binding, self.cache = b, cache

    def step(self, token: int, cache: KVCache) -> np.ndarray:
        """One decode step; the logits [1, vocab] as float32 on the host."""
        if cache is not self.cache:
            self._bind(cache)
        total = cache.length + 1
        self.ids.update_inplace(np.array([[token]], np.int64))
        self.seqlens.update_inplace(np.array([total - 1], np.int32))
        # A replayed graph keeps the launch parameters of its capture, so the host-side length must
        # not change: pass the buffer's length (the present tensor's length anyway, with past and
        # present shared). The tokens actually attended to come from seqlens_k, on the device.
        self.total.update_inplace(np.array(cache.capacity, np.int32))
        self.session.run_with_iobinding(self.binding)
        cache.length = total
        return self.logits.numpy()[0]
