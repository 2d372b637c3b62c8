"""The weight precisions a model can be converted to, named for people choosing between them."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Precision:
    name: str
    packed: bool  # keep the GGUF's 2- and 4-bit blocks (Q4_0, Q4_1, Q4_K, Q3_K, Q2_K) as MatMulNBits
    packed_8bit: bool  # also keep types held as 8-bit (Q8_0, e.g. the tied head; Q5_0, Q5_1, Q5_K, Q6_K) as MatMulNBits
    accuracy_level: int  # MatMulNBits: 0 = fp32 activations, 4 = int8 activations per block of 32
    dense_dtype: str  # storage of weights that are not packed
    summary: str
    compute: str = "float32"  # activations and the KV cache
    family: str = ""  # what the weights are, for the model fingerprint ("" = the name)
    q4_1_form: str = "branch"  # Q4_1 offsets: "branch" (blocksum side branch) or "zero_point" (float zero points)
    # Where 8-bit forms do not pack as 8-bit: from this GGUF size on, hold them as two 4-bit planes
    # (quant.split_planes) instead of dense rows (None: never).
    split_8bit_from: int | None = None
    # Whether the precision can run from the GGUF's blocks with Hearth's kernels (engine/runtime/native_matmul.py);
    # ``native``: it does, on this machine now (native_matmul.running decides; conversion and footprints ask it).
    native_capable: bool = False
    native: bool = False
    # The GGUF's blocks on CUDA through Hearth's CUDA kernels (engine/runtime/cuda_kernels.py), fp16 activations.
    cuda_blocks: bool = False

    @property
    def weights_id(self) -> str:
        """Precisions that share weights share a fingerprint, so a checkpoint moves between them
        (the KV rows are converted to the other's dtype on load)."""
        return self.family or self.name


# On the CPU the 4-bit planes cost 12–18% of decode against dense fp32 rows (docs/benchmarks.md), and save
# ~3 of every 4 bytes: worth it where memory is what limits, a model of 1 GiB and up.
SPLIT_8BIT_FROM_BYTES = 1 << 30

PRECISIONS: dict[str, Precision] = {
    p.name: p
    for p in (
        Precision(
            "int4", True, False, 0, "float32",
            "the GGUF's own blocks, computed with fp32 activations against each weight exactly as the GGUF "
            "stores it (Hearth's kernels; elsewhere ONNX Runtime's, 8-bit blocks dense or as two 4-bit planes); "
            "matches the dequantized model to ~1e-4",
            split_8bit_from=SPLIT_8BIT_FROM_BYTES, native_capable=True,
        ),
        Precision(
            "int4-fast", True, True, 4, "float32",
            "the GGUF's own blocks, activations quantized to int8 and integer dot products, as llama.cpp's CPU "
            "path computes; fastest, but a near-tie between two tokens can go the other way",
            native_capable=True,
        ),
        Precision("fp16", False, False, 0, "float16", "weights dequantized to fp16 on disk, computed in fp32"),
        Precision("fp32", False, False, 0, "float32", "weights dequantized to fp32; largest, the reference"),
        Precision(
            "int4-half", True, False, 0, "float16",
            "GGUF 4-bit blocks as-is, fp16 activations and KV cache: what a large int4 model runs as on CUDA "
            "(ONNX Runtime's CUDA attention is fp16 only); on the CPU about as fast as int4 with half the saved "
            "context; shares int4's fingerprint, so saved context moves between them",
            compute="float16", family="int4",
        ),
        Precision(
            "int4-cuda", True, False, 0, "float32",
            "for CUDA: GGUF 4-bit blocks as-is, fp16 activations and KV cache, offsets (Q4_1, Q4_K) as float zero "
            "points instead of the side branch: faster on a tiny model, but on a Q4_K_M 8B its kernel decodes at "
            "0.46× int4-half's (H200); slow on the CPU",
            compute="float16", family="int4", q4_1_form="zero_point",
        ),
        Precision(
            "int4-cuda-blocks", True, True, 4, "float16",
            "for CUDA: the GGUF's own blocks read by Hearth's CUDA kernels (a decode step's matmuls with the "
            "activations quantized to int8 per 32 and integer dot products, as llama.cpp's CUDA path computes; the "
            "MLP's activation and the pre-norms fused in), fp16 activations and KV cache; what an int4 model runs "
            "as on an NVIDIA GPU of compute capability 8.0 or later; no CPU kernel",
            compute="float16", family="int4", native=True, cuda_blocks=True,
        ),
        Precision(
            "int4-cuda-dense", False, False, 0, "float16",
            "for CUDA: the int4 weights dequantized to dense fp16, fp16 activations and KV cache; a small model's "
            "decode step is launch-bound and runs 1.65× faster so; what a small int4 model runs as",
            compute="float16", family="int4",
        ),
    )
}
DEFAULT_PRECISION = "int4"


def get_precision(name: str) -> Precision:
    from engine.errors import HearthError

    try:
        precision = PRECISIONS[name]
    except KeyError:
        raise HearthError(f"unknown weight precision {name!r}; choose one of: {', '.join(PRECISIONS)}") from None
    return precision


# A model below this size runs int4 as dense fp16 on CUDA: its decode step is launch-bound (hundreds
# of tiny kernels), and one cuBLAS GEMV per matrix beats a 4-bit kernel plus offsets. A larger model is
# bandwidth-bound, and the 4-bit blocks read a quarter of the bytes (bench/gpu_variants.py, docs/cuda.md):
# it runs as int4-half, whose offsets (Q4_K's mins) take the block-sum branch; fp16 float zero points
# (int4-cuda) take a kernel 3× slower, and decoded a Q4_K_M 8B at 98 tok/s against 214 (H200, docs/cuda.md).
DENSE_ON_CUDA_BELOW_BYTES = 1 << 30


def cuda_variant(weights: str, gguf: Path) -> str | None:
    """What ``weights`` runs as on CUDA (same fingerprint, fp16 compute), or None to run it as is."""
    if weights != "int4":
        return None
    return "int4-cuda-dense" if gguf.stat().st_size < DENSE_ON_CUDA_BELOW_BYTES else "int4-half"
