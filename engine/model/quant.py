"""GGUF weight blocks → what ONNX Runtime's MatMulNBits takes, without re-quantizing.

GGUF stores a linear layer as rows of output features, each row a run of blocks of inputs:

* Q4_0: fp16 scale d, then 16 bytes of nibbles; w = d * (q - 8).
* Q4_1: fp16 scale d, fp16 minimum m, then 16 bytes of nibbles; w = d * q + m.
* Q8_0: fp16 scale d, then 32 signed bytes; w = d * q.
* Q5_0 / Q5_1: as Q4_0 / Q4_1 with a fifth bit per element; w = d * (q - 16) or d * q + m.
* K-quants (Q3_K … Q6_K): super-blocks of 256 elements, sub-blocks of 16 or 32 with 4- or 8-bit
  integer scales (and mins) under fp16 super-scales d (and dmin); w = (d·sc) * q − dmin·m.

ggml puts element j in the low nibble of byte j and element j + 16 in its high nibble; MatMulNBits
wants elements 2i and 2i + 1 in the low and high nibbles of byte i, so codes are unpacked to one
byte each and packed again in MatMulNBits' order.

MatMulNBits computes scale * (code − z) with a default zero point z = 2^(bits−1) (8 or 128), a fp32
scale per block of ``block`` inputs. Each type maps onto that as:

* Q4_0 → 4-bit; Q8_0 → 8-bit (code q + 128); Q5_0 → 8-bit (code q + 112, so code − 128 = q − 16).
* Q6_K → 8-bit, block 16, scale d·sc, code q + 96 (q in 0..63 stands for q − 32).
* Q3_K → 4-bit, block 16, scale d·(sc − 32), code q + 4 (q in 0..7 stands for q − 4).
* Types with an offset (Q4_1, Q5_1, Q4_K, Q5_K) keep their integer part as above and add a per-block
  constant c: the graph adds it as ``blocksum(x) @ correction`` where ``correction[b, n] = c`` of
  block b in row n. Q5_1 and Q5_K are stored 8-bit (code q + 128, so c = m or −dmin·m); Q4_1 and
  Q4_K stay 4-bit with c = 8·scale + offset.

Everything is bit-identical to gguf's own dequantizer except Q4_K: scale·(q − 8) + (8·scale − dmin·m)
rounds differently from scale·q − dmin·m in fp32 (within an ulp of the weight plus half an ulp of the
correction). The side branch works on every provider; 8-bit with float zero points does not run on
the CPU (onnxruntime 1.31), which is why the 5-bit mins are not zero points.

Layers held as 8-bit can also run as two 4-bit planes (split_planes) where 8-bit matmuls are slow.

Q2_K is left dense: it maps onto 2-bit MatMulNBits (block 16, the min in the branch), but onnxruntime
1.31's CPU kernel for 2 bits ran a 2048×2048 decode matmul 20–40× slower than dense fp32, at every
accuracy level, with or without float zero points.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from engine.errors import ModelFileError

BLOCK = 32  # MatMulNBits' block for every type but the 16-element K-quant sub-blocks
SUPER = 256  # a K-quant super-block
Q4_0, Q4_1, Q8_0 = "Q4_0", "Q4_1", "Q8_0"
Q5_0, Q5_1 = "Q5_0", "Q5_1"
Q3_K, Q4_K, Q5_K, Q6_K = "Q3_K", "Q4_K", "Q5_K", "Q6_K"


class BlockGeometry:
    """``n_blocks`` and MatMulNBits' ``matmul_k`` from a layer's k, block and planes (a packed layer's
    arrays, or the graph's handle on them once written: engine/arch/packed_ops.py)."""

    k: int
    block: int
    planes: int

    @property
    def matmul_k(self) -> int:
        """The K MatMulNBits is built with: the input size, doubled for a split layer's doubled input."""
        return self.k * self.planes

    @property
    def n_blocks(self) -> int:
        return self.k // self.block


@dataclass
class PackedWeight(BlockGeometry):
    """One linear layer in MatMulNBits form: out features N, in features K."""

    bits: int
    n: int
    k: int
    blob: np.ndarray  # uint8 [N, K/block, block*bits/8]
    scales: np.ndarray  # float32 [N * K/block]
    correction: np.ndarray | None  # float32 [K/block, N] for types with offsets; None when exact without
    block: int = BLOCK
    planes: int = 1  # 2: 8-bit codes held as two 4-bit planes per block (see split_planes); MatMulNBits' K is 2·k

    def stored_bytes(self, float_size: int = 4) -> int:
        """What the layer takes in the converted model: codes, scales and correction (floats of
        ``float_size`` bytes, the activations' type), plane zero points."""
        floats = self.scales.size + (0 if self.correction is None else self.correction.size)
        return self.blob.nbytes + floats * float_size + (self.n * self.n_blocks if self.planes == 2 else 0)

    def plane_zero_points(self) -> np.ndarray:
        """A split layer's zero points, as MatMulNBits takes 4-bit ones (two per byte, first lowest):
        0 for each block's low plane, 8 for its high plane."""
        if self.planes != 2:
            raise ValueError("only a layer split into planes has plane zero points")
        return np.full(self.n * self.n_blocks, 0x80, np.uint8)

    @property
    def zero(self) -> int:
        """MatMulNBits' default zero point for these bits."""
        return 1 << (self.bits - 1)

    def with_zero_points(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(blob, scales, float zero points) giving the same weights with no correction branch
        (below 8 bits only: ONNX Runtime's CPU kernel refuses 8-bit float zero points).

        A block w = d·q + m is d·(q − zp) with zp = −m/d. A block with d = 0 is the constant m:
        its codes become 0 and it is stored as scale m, zero point −1.
        """
        nb = self.n_blocks
        if self.planes != 1:
            raise ValueError("a layer split into planes has no zero-point form")
        if self.correction is None:
            return self.blob, self.scales, np.full(self.n * nb, float(self.zero), np.float32)
        d = self.scales.reshape(self.n, nb)
        m = self.correction.T - float(self.zero) * d  # [n, nb]: the offset of code 0
        flat = d == 0
        safe = np.where(flat, 1.0, d)
        zp = np.where(flat, -1.0, -m / safe).astype(np.float32)
        scales = np.where(flat, m, d).astype(np.float32)
        blob = self.blob.copy()
        blob[flat] = 0
        return blob, scales.reshape(-1), zp.reshape(-1)

    def codes(self) -> np.ndarray:
        """The stored codes, one per byte: uint8 [N, K/block, block]."""
        return unpack_codes(self.blob, self.bits)

    def dequantize(self) -> np.ndarray:
        """fp32 [N, K]: what MatMulNBits (plus the side branch) multiplies by; tests and dense use."""
        nb = self.n_blocks
        zero = np.array([self.zero] if self.planes == 1 else [0, 8], np.float32)  # per plane
        q = self.codes().reshape(self.n, nb, self.planes, self.block).astype(np.float32) - zero[:, None]
        w = q * self.scales.reshape(self.n, nb, self.planes, 1)
        w = w[:, :, 0] if self.planes == 1 else w[:, :, 0] + w[:, :, 1]
        if self.correction is not None:
            w = w + self.correction.T.reshape(self.n, nb, 1)
        return w.reshape(self.n, self.k)


# Unpacking: each returns (codes uint8 [n, k] as MatMulNBits stores them, scales fp32 [n, k/block],
# offsets fp32 [n, k/block] or None) from blocks uint8 [n, blocks per row, bytes per GGUF block].
Unpacked = tuple[np.ndarray, np.ndarray, np.ndarray | None]


@dataclass(frozen=True)
class _Layout:
    bytes: int  # per GGUF block
    elements: int  # per GGUF block
    bits: int  # MatMulNBits' bits
    block: int  # MatMulNBits' block
    unpack: Callable[[np.ndarray], Unpacked]


def _f16(raw: np.ndarray) -> np.ndarray:
    """Two bytes per block (last axis) → fp32 [n, blocks]."""
    return raw.copy().view(np.float16)[..., 0].astype(np.float32)


def _low_high(qs: np.ndarray) -> np.ndarray:
    """ggml's half-split nibbles: bytes [..., 16·g] → element j of each group of 2·b from the low
    nibble of byte j, element b + j from its high nibble (b = bytes in the group)."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=-1)


def _high_bits(qh: np.ndarray, count: int) -> np.ndarray:
    """Little-endian bit fields: bytes [..., B] → bit i of byte j is element i·B + j, over ``count``
    bits of each byte (Q5_K/Q3_K's per-byte layout)."""
    shifts = np.arange(count, dtype=np.uint8).reshape(count, 1)
    return ((qh[..., None, :] >> shifts) & 1).reshape(qh.shape[:-1] + (count * qh.shape[-1],))


def _crumbs(qs: np.ndarray) -> np.ndarray:
    """2-bit fields of K-quants: B bytes → 4·B elements, element B·t + j = bits 2t..2t+1 of byte j."""
    shifts = np.array([0, 2, 4, 6], np.uint8).reshape(4, 1)
    return ((qs[..., None, :] >> shifts) & 3).reshape(qs.shape[:-1] + (4 * qs.shape[-1],))


def _q5_bits(blocks: np.ndarray, qh_at: int) -> np.ndarray:
    """Q5_0/Q5_1's 5-bit values [n, nb, 32]: 4 bytes of high bits (bit j → element j), then nibbles."""
    qh = np.unpackbits(blocks[..., qh_at:qh_at + 4], axis=-1, bitorder="little")
    return _low_high(blocks[..., qh_at + 4:]) | (qh << 4)


def _unpack_q4_0(blocks: np.ndarray) -> Unpacked:
    return _low_high(blocks[..., 2:]), _f16(blocks[..., 0:2]), None


def _unpack_q4_1(blocks: np.ndarray) -> Unpacked:
    d, m = _f16(blocks[..., 0:2]), _f16(blocks[..., 2:4])
    return _low_high(blocks[..., 4:]), d, m + 8.0 * d


def _unpack_q8_0(blocks: np.ndarray) -> Unpacked:
    q = blocks[..., 2:].view(np.int8).astype(np.int16) + 128
    return q.astype(np.uint8), _f16(blocks[..., 0:2]), None


def _unpack_q5_0(blocks: np.ndarray) -> Unpacked:
    return _q5_bits(blocks, 2) + np.uint8(112), _f16(blocks[..., 0:2]), None


def _unpack_q5_1(blocks: np.ndarray) -> Unpacked:
    return _q5_bits(blocks, 4) + np.uint8(128), _f16(blocks[..., 0:2]), _f16(blocks[..., 2:4])


def _k_scale_min(packed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K/Q5_K's twelve bytes → 8 six-bit scales and 8 six-bit mins, [..., 8] each: sub-blocks 0–3
    sit in the low 6 bits of bytes 0–3 (scales) and 4–7 (mins); 4–7 take their low 4 bits from the
    nibbles of bytes 8–11 and their top 2 bits from the spare top bits of bytes 0–3 / 4–7."""
    a, b, c = packed[..., 0:4], packed[..., 4:8], packed[..., 8:12]
    scale = np.concatenate([a & 63, (c & 0x0F) | ((a >> 6) << 4)], axis=-1)
    low_min = np.concatenate([b & 63, (c >> 4) | ((b >> 6) << 4)], axis=-1)
    return scale.astype(np.float32), low_min.astype(np.float32)


def _k_super(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K/Q5_K's head: (d·sc, dmin·m) per sub-block, fp32 [n, nb·8]; both products are exact."""
    d, dmin = _f16(blocks[..., 0:2])[..., None], _f16(blocks[..., 2:4])[..., None]
    sc, mn = _k_scale_min(blocks[..., 4:16])
    n = blocks.shape[0]
    return (d * sc).reshape(n, -1), (dmin * mn).reshape(n, -1)


def _unpack_q4_k(blocks: np.ndarray) -> Unpacked:
    scale, low = _k_super(blocks)
    q = _low_high(blocks[..., 16:].reshape(blocks.shape[:2] + (4, 32)))  # 4 pairs of sub-blocks
    return q.reshape(blocks.shape[0], -1), scale, 8.0 * scale - low


def _unpack_q5_k(blocks: np.ndarray) -> Unpacked:
    scale, low = _k_super(blocks)
    low4 = _low_high(blocks[..., 48:].reshape(blocks.shape[:2] + (4, 32)))
    q = low4.reshape(blocks.shape[:2] + (SUPER,)) | (_high_bits(blocks[..., 16:48], 8) << 4)
    return (q + np.uint8(128)).reshape(blocks.shape[0], -1), scale, -low


def _unpack_q6_k(blocks: np.ndarray) -> Unpacked:
    n, nb = blocks.shape[:2]
    # Each half of 128 elements: 64 bytes of nibbles (elements j, 64 + j) and 32 of 2-bit highs.
    low4 = _low_high(blocks[..., 0:128].reshape(n, nb, 2, 64))
    high2 = _crumbs(blocks[..., 128:192].reshape(n, nb, 2, 32))
    q = (low4 | (high2 << 4)).reshape(n, nb * SUPER)
    d = _f16(blocks[..., 208:210])[..., None]
    scale = d * blocks[..., 192:208].view(np.int8).astype(np.float32)  # [n, nb, 16]
    return q + np.uint8(96), scale.reshape(n, -1), None


def _unpack_q3_k(blocks: np.ndarray) -> Unpacked:
    n, nb = blocks.shape[:2]
    low2 = _crumbs(blocks[..., 32:96].reshape(n, nb, 2, 32)).reshape(n, nb, SUPER)
    q = low2 | (_high_bits(blocks[..., 0:32], 8) << 2)  # 0..7 standing for q − 4
    packed = blocks[..., 96:108]
    low4 = np.concatenate([packed[..., 0:8] & 0x0F, packed[..., 0:8] >> 4], axis=-1)
    top2 = _crumbs(packed[..., 8:12])
    sc = (low4 | (top2 << 4)).astype(np.float32) - 32.0
    scale = _f16(blocks[..., 108:110])[..., None] * sc
    return (q + np.uint8(4)).reshape(n, -1), scale.reshape(n, -1), None


_LAYOUTS: dict[str, _Layout] = {
    Q4_0: _Layout(18, 32, 4, 32, _unpack_q4_0),
    Q4_1: _Layout(20, 32, 4, 32, _unpack_q4_1),
    Q8_0: _Layout(34, 32, 8, 32, _unpack_q8_0),
    Q5_0: _Layout(22, 32, 8, 32, _unpack_q5_0),
    Q5_1: _Layout(24, 32, 8, 32, _unpack_q5_1),
    Q3_K: _Layout(110, SUPER, 4, 16, _unpack_q3_k),
    Q4_K: _Layout(144, SUPER, 4, 32, _unpack_q4_k),
    Q5_K: _Layout(176, SUPER, 8, 32, _unpack_q5_k),
    Q6_K: _Layout(210, SUPER, 8, 16, _unpack_q6_k),
}


_WITH_OFFSETS = frozenset({Q4_1, Q5_1, Q4_K, Q5_K})


def has_offsets(type_name: str) -> bool:
    """Whether a packable type's blocks carry an offset (a min) that needs the correction branch."""
    return type_name in _WITH_OFFSETS


def is_packable(type_name: str) -> bool:
    return type_name in _LAYOUTS


def packed_bits(type_name: str) -> int:
    """The MatMulNBits bits a packable type is stored with."""
    return _LAYOUTS[type_name].bits


def pack_rows(type_name: str, raw: np.ndarray, n: int, k: int, name: str = "tensor", planes: int = 1) -> PackedWeight:
    """Convert raw GGUF bytes (``n`` rows of ``k`` inputs) into MatMulNBits form; ``planes=2`` gives an
    8-bit type as two 4-bit planes (split_planes) without making the 8-bit form first."""
    if type_name not in _LAYOUTS:
        raise ValueError(f"{type_name} cannot be packed for MatMulNBits")
    layout = _LAYOUTS[type_name]
    if planes not in (1, 2) or (planes == 2 and layout.bits != 8):
        raise ValueError(f"{type_name} cannot be packed as {planes} planes")
    if k % layout.elements:
        raise ModelFileError(f"{name}: input size {k} is not a multiple of {type_name}'s {layout.elements}-element block")
    nb = k // layout.elements
    raw = np.ascontiguousarray(raw, dtype=np.uint8)
    if raw.size != n * nb * layout.bytes:
        raise ModelFileError(f"{name}: holds {raw.size} bytes, expected {n * nb * layout.bytes} for {type_name} [{n}, {k}]")
    blocks = raw.reshape(n, nb, layout.bytes)
    kb = k // layout.block
    bits = layout.bits // planes
    blob = np.empty((n, kb * planes, layout.block * bits // 8), np.uint8)
    scales = np.empty((n, kb, planes), np.float32)
    correction = None  # [K/block, N]
    # Rows a few MB of GGUF blocks at a time: unpacking makes several temporaries per element, so a
    # 128k-vocabulary table unpacked whole would briefly take ~5× its packed size.
    chunk = max(1, (8 << 20) // max(1, nb * layout.bytes))
    for start in range(0, n, chunk):
        rows = slice(start, min(n, start + chunk))
        codes, chunk_scales, offsets = layout.unpack(blocks[rows])
        codes = codes.reshape(-1, kb, layout.block)
        chunk_scales = chunk_scales.reshape(-1, kb)
        if planes == 2:
            blob[rows], scales[rows] = _split_chunk(codes, chunk_scales)
        else:
            blob[rows], scales[rows, :, 0] = pack_codes(codes, bits), chunk_scales
        if offsets is not None:
            if correction is None:
                correction = np.empty((kb, n), np.float32)
            correction[:, rows] = offsets.reshape(-1, kb).T
    return PackedWeight(bits, n, k, blob, scales.reshape(-1), correction, layout.block, planes)


def _split_chunk(codes: np.ndarray, scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """8-bit codes [r, nb, block] and scales [r, nb] → the planes' packed codes [r, 2·nb, block/2] and
    scales [r, nb, 2] (split_planes says why)."""
    r, nb, block = codes.shape
    pairs = np.stack([codes & 0x0F, codes >> 4], axis=2).reshape(r, 2 * nb, block)
    return pack_codes(pairs, 4), np.stack([scales, scales * 16.0], axis=2)


def split_planes(layer: PackedWeight, rows_per_chunk: int = 4096) -> PackedWeight:
    """An 8-bit layer as two 4-bit planes, for where 8-bit MatMulNBits is slow: with fp32 activations
    onnxruntime 1.31's CPU kernel takes ~70× as long as the 4-bit one (bench/matmul_kernels.py).

    Code c of a block with scale d (w = d·(c − 128)) splits into lo = c & 15 and hi = c >> 4. Each
    block b becomes two 4-bit blocks, 2b holding lo with scale d and zero point 0, 2b + 1 holding hi
    with scale 16·d and zero point 8, read against the input block twice (Graph doubles the input):
    d·lo + 16·d·(hi − 8) = d·(c − 128). 16·d is exact; the weight differs from the single product by
    the rounding of one more fp32 addition. (Default zero points with 8·d in the correction branch
    instead measured 3× the error: the planes' terms grow far past the weight they sum to.)
    """
    if layer.bits != 8 or layer.planes != 1:
        raise ValueError("only an 8-bit layer splits into 4-bit planes")
    n, nb, block = layer.n, layer.n_blocks, layer.block
    blob = np.empty((n, 2 * nb, block // 2), np.uint8)
    scales = np.empty((n, nb, 2), np.float32)
    d = layer.scales.reshape(n, nb)
    for start in range(0, n, rows_per_chunk):  # bounded temporaries for a large table
        rows = slice(start, min(n, start + rows_per_chunk))
        blob[rows], scales[rows] = _split_chunk(unpack_codes(layer.blob[rows], 8), d[rows])
    return PackedWeight(4, n, layer.k, blob, scales.reshape(-1), layer.correction, block, planes=2)


def pack_codes(codes: np.ndarray, bits: int) -> np.ndarray:
    """One code per byte [..., block] → MatMulNBits' packing: 8 // bits codes per byte, first lowest."""
    per_byte = 8 // bits
    out = np.zeros(codes.shape[:-1] + (codes.shape[-1] // per_byte,), np.uint8)
    for i in range(per_byte):
        out |= (codes[..., i::per_byte] << (i * bits)).astype(np.uint8)
    return out


def unpack_codes(blob: np.ndarray, bits: int) -> np.ndarray:
    per_byte = 8 // bits
    out = np.empty(blob.shape[:-1] + (blob.shape[-1] * per_byte,), np.uint8)
    for i in range(per_byte):
        out[..., i::per_byte] = (blob >> (i * bits)) & ((1 << bits) - 1)
    return out


def _unpack_nibbles_onnx(blob: np.ndarray) -> np.ndarray:
    return unpack_codes(blob, 4)


def concat_packed(parts: list[PackedWeight]) -> PackedWeight:
    """Stack layers that share their input (Q, K, V or gate, up) into one wider layer."""
    first = parts[0]
    if any((p.bits, p.k, p.block, p.planes) != (first.bits, first.k, first.block, first.planes) for p in parts):
        raise ValueError("only layers with the same bits, input size and block can be fused")
    corrections = [p.correction for p in parts]
    if all(c is None for c in corrections):
        correction = None
    else:
        correction = np.concatenate(
            [c if c is not None else np.zeros((p.n_blocks, p.n), np.float32) for c, p in zip(corrections, parts, strict=True)],
            axis=1,
        )
    return PackedWeight(
        first.bits,
        sum(p.n for p in parts),
        first.k,
        np.concatenate([p.blob for p in parts], axis=0),
        np.concatenate([p.scales for p in parts]),
        correction,
        first.block,
        first.planes,
    )
