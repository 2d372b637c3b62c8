"""GGUF weight blocks → what ONNX Runtime's MatMulNBits takes, without re-quantizing.

GGUF stores a linear layer as rows of output features, each row a run of blocks of 32 inputs:

* Q4_0: fp16 scale d, then 16 bytes of nibbles; w = d * (q - 8).
* Q4_1: fp16 scale d, fp16 minimum m, then 16 bytes of nibbles; w = d * q + m.
* Q8_0: fp16 scale d, then 32 signed bytes; w = d * q.

ggml puts element j in the low nibble of byte j and element j + 16 in its high nibble; MatMulNBits
wants elements 2i and 2i + 1 in the low and high nibbles of byte i, so nibbles are re-packed.

MatMulNBits computes d * (q - zero_point) with a default zero point of 8 (4-bit) or 128 (8-bit), so
Q4_0 and Q8_0 map exactly. Q4_1 becomes d * (q - 8) plus a per-block constant (m + 8d); the graph
adds that as ``blocksum(x) @ correction`` where ``correction[b, n] = m + 8d`` of block b in row n.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from engine.errors import ModelFileError

BLOCK = 32
Q4_0, Q4_1, Q8_0 = "Q4_0", "Q4_1", "Q8_0"
_BLOCK_BYTES = {Q4_0: 18, Q4_1: 20, Q8_0: 34}


@dataclass
class PackedWeight:
    """One linear layer in MatMulNBits form: out features N, in features K."""

    bits: int
    n: int
    k: int
    blob: np.ndarray  # uint8 [N, K/32, 32*bits/8]
    scales: np.ndarray  # float32 [N * K/32]
    correction: np.ndarray | None  # float32 [K/32, N] for Q4_1; None when exact without it

    def with_zero_points(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(blob, scales, float zero points) giving the same weights with no correction branch.

        A Q4_1 block w = d·q + m is d·(q − zp) with zp = −m/d. A block with d = 0 is the constant m:
        its nibbles become 0 and it is stored as scale m, zero point −1.
        """
        nb = self.k // BLOCK
        if self.correction is None:
            return self.blob, self.scales, np.full(self.n * nb, 8.0, np.float32)
        d = self.scales.reshape(self.n, nb)
        m = self.correction.T - 8.0 * d  # [n, nb]
        flat = d == 0
        safe = np.where(flat, 1.0, d)
        zp = np.where(flat, -1.0, -m / safe).astype(np.float32)
        scales = np.where(flat, m, d).astype(np.float32)
        blob = self.blob.copy()
        blob[flat] = 0
        return blob, scales.reshape(-1), zp.reshape(-1)

    def dequantize(self) -> np.ndarray:
        """fp32 [N, K]; used by tests and by precisions that want dense weights."""
        nb = self.k // BLOCK
        if self.bits == 4:
            q = _unpack_nibbles_onnx(self.blob).astype(np.float32) - 8.0
        else:
            q = self.blob.astype(np.float32) - 128.0
        w = q * self.scales.reshape(self.n, nb, 1)
        if self.correction is not None:
            w = w + self.correction.T.reshape(self.n, nb, 1)
        return w.reshape(self.n, self.k)


def is_packable(type_name: str) -> bool:
    return type_name in _BLOCK_BYTES


def pack_rows(type_name: str, raw: np.ndarray, n: int, k: int, name: str = "tensor") -> PackedWeight:
    """Convert raw GGUF bytes (``n`` rows of ``k`` inputs) into MatMulNBits form."""
    if type_name not in _BLOCK_BYTES:
        raise ValueError(f"{type_name} cannot be packed for MatMulNBits")
    if k % BLOCK:
        raise ModelFileError(f"{name}: input size {k} is not a multiple of the {BLOCK}-element block")
    nb = k // BLOCK
    bb = _BLOCK_BYTES[type_name]
    raw = np.ascontiguousarray(raw, dtype=np.uint8)
    if raw.size != n * nb * bb:
        raise ModelFileError(f"{name}: holds {raw.size} bytes, expected {n * nb * bb} for {type_name} [{n}, {k}]")
    blocks = raw.reshape(n, nb, bb)
    d = blocks[:, :, 0:2].copy().view(np.float16).reshape(n, nb).astype(np.float32)
    if type_name == Q8_0:
        q = blocks[:, :, 2:].view(np.int8).astype(np.int16) + 128
        return PackedWeight(8, n, k, q.astype(np.uint8), d.reshape(-1), None)
    if type_name == Q4_0:
        return PackedWeight(4, n, k, _repack_nibbles(blocks[:, :, 2:]), d.reshape(-1), None)
    m = blocks[:, :, 2:4].copy().view(np.float16).reshape(n, nb).astype(np.float32)
    correction = (m + 8.0 * d).T.copy()  # [nb, n]
    return PackedWeight(4, n, k, _repack_nibbles(blocks[:, :, 4:]), d.reshape(-1), correction)


def _repack_nibbles(qs: np.ndarray) -> np.ndarray:
    """ggml nibble order (j, j+16) → MatMulNBits order (2i, 2i+1), per block of 16 bytes."""
    low = qs & 0x0F
    high = qs >> 4
    values = np.concatenate([low, high], axis=-1)  # element order 0..31
    return (values[..., 0::2] | (values[..., 1::2] << 4)).astype(np.uint8)


def _unpack_nibbles_onnx(blob: np.ndarray) -> np.ndarray:
    out = np.empty(blob.shape[:-1] + (blob.shape[-1] * 2,), dtype=np.uint8)
    out[..., 0::2] = blob & 0x0F
    out[..., 1::2] = blob >> 4
    return out


def concat_packed(parts: list[PackedWeight]) -> PackedWeight:
    """Stack layers that share their input (Q, K, V or gate, up) into one wider layer."""
    first = parts[0]
    if any(p.bits != first.bits or p.k != first.k for p in parts):
        raise ValueError("only layers with the same bits and input size can be fused")
    corrections = [p.correction for p in parts]
    if all(c is None for c in corrections):
        correction = None
    else:
        correction = np.concatenate(
            [c if c is not None else np.zeros((p.k // BLOCK, p.n), np.float32) for c, p in zip(corrections, parts, strict=True)],
            axis=1,
        )
    return PackedWeight(
        first.bits,
        sum(p.n for p in parts),
        first.k,
        np.concatenate([p.blob for p in parts], axis=0),
        np.concatenate([p.scales for p in parts]),
        correction,
    )
