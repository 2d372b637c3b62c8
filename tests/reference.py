"""An independent numpy forward pass for llama GGUFs, for checking the ONNX graph.

It shares no code with the graph builder: it reads the GGUF with the ``gguf`` package, dequantizes
with ``gguf.quants``, and applies rotary embeddings the way llama.cpp does for llama models, to
adjacent pairs (2i, 2i+1) of the stored (permuted) Q and K rows, in float64.
"""

from __future__ import annotations

import numpy as np


class ReferenceLlama:
    def __init__(self, path):
        import gguf
        from gguf import quants

        reader = gguf.GGUFReader(path)
        meta = {k: f.contents() for k, f in reader.fields.items() if not k.startswith("tokenizer")}
        self.w = {}
        for t in reader.tensors:
            shape = [int(x) for x in reversed(t.shape)]
            data = np.asarray(t.data)
            if t.tensor_type.name in ("F32", "F16"):
                arr = data.astype(np.float64)
            else:
                arr = quants.dequantize(data, t.tensor_type).astype(np.float64)
            self.w[t.name] = arr.reshape(shape)
        self.layers = meta["llama.block_count"]
        self.heads = meta["llama.attention.head_count"]
        self.kv_heads = meta["llama.attention.head_count_kv"]
        self.dim = meta["llama.embedding_length"]
        self.head_dim = self.dim // self.heads
        self.eps = meta["llama.attention.layer_norm_rms_epsilon"]
        self.base = meta["llama.rope.freq_base"]

    def _rms(self, x, g):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + self.eps) * g

    def _rope(self, x):
        s, hd = x.shape[0], self.head_dim
        theta = np.arange(s)[:, None] * self.base ** (-2 * np.arange(hd // 2) / hd)
        c, sn = np.cos(theta)[:, None, :], np.sin(theta)[:, None, :]
        a, b = x[..., 0::2], x[..., 1::2]
        out = np.empty_like(x)
        out[..., 0::2] = a * c - b * sn
        out[..., 1::2] = a * sn + b * c
        return out

    def logits(self, ids) -> np.ndarray:
        """Logits for every position of ``ids`` (a full, cache-free recomputation)."""
        w, s = self.w, len(ids)
        h_, kv_, hd = self.heads, self.kv_heads, self.head_dim
        x = w["token_embd.weight"][np.asarray(ids)]
        mask = np.triu(np.full((s, s), -np.inf), 1)
        for layer in range(self.layers):
            p = f"blk.{layer}."
            h = self._rms(x, w[p + "attn_norm.weight"])
            q = self._rope((h @ w[p + "attn_q.weight"].T).reshape(s, h_, hd))
            k = self._rope((h @ w[p + "attn_k.weight"].T).reshape(s, kv_, hd))
            v = (h @ w[p + "attn_v.weight"].T).reshape(s, kv_, hd)
            out = np.zeros((s, h_, hd))
            for head in range(h_):
                g = head // (h_ // kv_)
                scores = q[:, head] @ k[:, g].T / np.sqrt(hd) + mask
                probs = np.exp(scores - scores.max(-1, keepdims=True))
                out[:, head] = (probs / probs.sum(-1, keepdims=True)) @ v[:, g]
            x = x + out.reshape(s, self.dim) @ w[p + "attn_output.weight"].T
            h = self._rms(x, w[p + "ffn_norm.weight"])
            gate, up = h @ w[p + "ffn_gate.weight"].T, h @ w[p + "ffn_up.weight"].T
            x = x + (gate / (1 + np.exp(-gate)) * up) @ w[p + "ffn_down.weight"].T
        head = w.get("output.weight", w["token_embd.weight"])
        return self._rms(x, w["output_norm.weight"]) @ head.T
