"""An independent numpy forward pass for llama, qwen2, qwen3, gemma3 and phi3 GGUFs, for checking the ONNX graph.

It shares no code with the graph builder: it reads the GGUF with the ``gguf`` package, dequantizes
with ``gguf.quants``, and applies rotary embeddings the way llama.cpp does, in float64:
* llama: to adjacent pairs (2i, 2i+1) of the stored (permuted) Q and K rows, each frequency divided
  by ``rope_freqs.weight[i]`` when the file has it (llama 3.1/3.2);
* qwen2, qwen3 (NEOX style): to the pairs (i, i + d/2) of the rows as stored.
qwen2 adds the Q/K/V biases; qwen3 RMS-normalizes each head of Q and K before rotary.
gemma3 (NEOX style, QK norms as qwen3) also: scales the embedding by sqrt(n_embd); RMS-normalizes
the attention's and the FFN's outputs before adding them ("sandwich" norms); gates the FFN with
GELU's tanh form; and on its local layers (i % 6 < 5, when the file has a sliding window) lets a
query see only the last `sliding_window` keys, itself included, rotating with base 10000 unscaled.
Global layers rotate with rope.freq_base, positions divided by a linear scaling factor if any.
phi3 (NEOX style) splits its fused attn_qkv (Q, K, V rows) and ffn_up (gate, up rows), and where the file
has long/short rotary factors divides the frequencies by the long ones when the file's context exceeds
its original one (else the short ones) and multiplies cos and sin by rope.scaling.attn_factor.
"""

from __future__ import annotations

import numpy as np

NEOX = ("qwen2", "qwen3", "gemma3", "phi3")  # llama.cpp's rope type NEOX: half-split pairs on unpermuted rows


class Reference:
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
        self.arch = arch = meta["general.architecture"]
        self.layers = meta[f"{arch}.block_count"]
        self.heads = meta[f"{arch}.attention.head_count"]
        self.kv_heads = meta[f"{arch}.attention.head_count_kv"]
        self.dim = meta[f"{arch}.embedding_length"]
        self.head_dim = meta.get(f"{arch}.attention.key_length", self.dim // self.heads)
        self.eps = meta[f"{arch}.attention.layer_norm_rms_epsilon"]
        self.base = meta[f"{arch}.rope.freq_base"]
        self.factors = self.w.get("rope_freqs.weight", np.ones(self.head_dim // 2))
        self.magnitude = 1.0
        if arch == "phi3":
            self._split_phi3(meta)
        self.scale = 1.0 / np.sqrt(self.head_dim)
        self.window = 0  # 0: every layer attends to the whole past
        self.pos_scale = 1.0
        if meta.get(f"{arch}.rope.scaling.type") == "linear":
            self.pos_scale = meta.get(f"{arch}.rope.scaling.factor", 1.0)
        if arch == "gemma3":
            self.window = meta.get("gemma3.attention.sliding_window", 0)
            if self.layers == 62:  # the 27B model scales by its n_embd / n_head instead
                self.scale = 1.0 / np.sqrt(self.dim // self.heads)

    def _split_phi3(self, meta) -> None:
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        n_ff = meta["phi3.feed_forward_length"]
        for layer in range(self.layers):
            p = f"blk.{layer}."
            qkv = self.w.pop(p + "attn_qkv.weight")
            self.w[p + "attn_q.weight"], self.w[p + "attn_k.weight"], self.w[p + "attn_v.weight"] = (
                qkv[:q], qkv[q:q + kv], qkv[q + kv:])
            gate_up = self.w.pop(p + "ffn_up.weight")
            self.w[p + "ffn_gate.weight"], self.w[p + "ffn_up.weight"] = gate_up[:n_ff], gate_up[n_ff:]
        if "rope_factors_long.weight" in self.w:
            original = meta["phi3.rope.scaling.original_context_length"]
            long = meta["phi3.context_length"] > original
            self.factors = self.w["rope_factors_long.weight" if long else "rope_factors_short.weight"]
            self.magnitude = meta.get("phi3.rope.scaling.attn_factor", 1.0)

    def _rms(self, x, g):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + self.eps) * g

    def _local(self, layer) -> bool:
        return bool(self.window) and layer % 6 < 5

    def _rope(self, x, local=False):
        s, hd = x.shape[0], self.head_dim
        base, pos_scale = (10000.0, 1.0) if local else (self.base, self.pos_scale)
        freq = base ** (-2 * np.arange(hd // 2) / hd) / self.factors
        theta = np.arange(s)[:, None] / pos_scale * freq
        c, sn = self.magnitude * np.cos(theta)[:, None, :], self.magnitude * np.sin(theta)[:, None, :]
        if self.arch in NEOX:
            first, second = slice(0, hd // 2), slice(hd // 2, hd)
        else:
            first, second = slice(0, hd, 2), slice(1, hd, 2)
        a, b = x[..., first], x[..., second]
        out = np.empty_like(x)
        out[..., first] = a * c - b * sn
        out[..., second] = a * sn + b * c
        return out

    def _project(self, h, p, part, heads):
        y = h @ self.w[f"{p}{part}.weight"].T + self.w.get(f"{p}{part}.bias", 0.0)
        y = y.reshape(len(h), heads, self.head_dim)
        norm = self.w.get(f"{p}{part}_norm.weight")
        return y if norm is None else self._rms(y, norm)

    def logits(self, ids, first: int = 0) -> np.ndarray:
        """Logits for every position of ``ids`` from ``first`` on (a full, cache-free recomputation)."""
        w, s = self.w, len(ids)
        h_, kv_, hd = self.heads, self.kv_heads, self.head_dim
        gemma = self.arch == "gemma3"
        x = w["token_embd.weight"][np.asarray(ids)]
        if gemma:
            x = x * np.sqrt(self.dim)
        causal = np.triu(np.full((s, s), -np.inf), 1)
        behind = np.arange(s)[:, None] - np.arange(s)[None, :]  # query position - key position
        for layer in range(self.layers):
            p, local = f"blk.{layer}.", self._local(layer)
            mask = np.where(behind >= self.window, -np.inf, causal) if local else causal
            h = self._rms(x, w[p + "attn_norm.weight"])
            q = self._rope(self._project(h, p, "attn_q", h_), local)
            k = self._rope(self._project(h, p, "attn_k", kv_), local)
            v = self._project(h, p, "attn_v", kv_)
            out = np.zeros((s, h_, hd))
            for head in range(h_):
                g = head // (h_ // kv_)
                scores = q[:, head] @ k[:, g].T * self.scale + mask
                probs = np.exp(scores - scores.max(-1, keepdims=True))
                out[:, head] = (probs / probs.sum(-1, keepdims=True)) @ v[:, g]
            attn = out.reshape(s, h_ * hd) @ w[p + "attn_output.weight"].T
            x = x + (self._rms(attn, w[p + "post_attention_norm.weight"]) if gemma else attn)
            h = self._rms(x, w[p + "ffn_norm.weight"])
            gate, up = h @ w[p + "ffn_gate.weight"].T, h @ w[p + "ffn_up.weight"].T
            if gemma:
                act = 0.5 * gate * (1 + np.tanh(np.sqrt(2 / np.pi) * (gate + 0.044715 * gate ** 3)))
                ffn = self._rms((act * up) @ w[p + "ffn_down.weight"].T, w[p + "post_ffw_norm.weight"])
            else:
                ffn = (gate / (1 + np.exp(-gate)) * up) @ w[p + "ffn_down.weight"].T
            x = x + ffn
        head = w.get("output.weight", w["token_embd.weight"])
        final = self._rms(x[first:], w["output_norm.weight"])
        return np.concatenate([final @ rows.T for rows in np.array_split(head, max(1, len(head) // 16384))], axis=-1)


ReferenceLlama = Reference  # the name the llama tests import
