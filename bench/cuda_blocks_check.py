"""Checks the CUDA kernels' block decoding (engine/native/cuda/hearth_cuda_blocks.cuh) on the CPU, no GPU needed:
nvcc compiles its __host__ side into a small program that decodes random rows of every type the kernels read,
and gguf-py's dequantize says what each weight must be. Needs nvcc (the GPU machine has one; so may yours).

    python bench/cuda_blocks_check.py
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

HARNESS = r"""
#include <cstdio>
#include <cstdlib>
#include <vector>
#include "hearth_cuda_blocks.cuh"
int main(int argc, char **argv) {
    int type = atoi(argv[1]); long n = atol(argv[2]), k = atol(argv[3]);
    long rb = k / hq_block_weights(type) * hq_block_bytes(type);
    std::vector<uint32_t> words((n * rb + 3) / 4);  // 4-byte aligned rows, as ONNX Runtime's buffers are
    uint8_t *raw = reinterpret_cast<uint8_t *>(words.data());
    FILE *f = fopen(argv[4], "rb");
    if (fread(raw, 1, n * rb, f) != (size_t)(n * rb)) return 2;
    fclose(f);
    std::vector<float> out(n * k, -12345.f);
    for (long r = 0; r < n; r++)
        for (int c = 0; c < k / 8; c++) {
            float w[8]; int pos, off[4];
            hq_decode8(type, raw + r * rb, c, w, &pos, off);
            for (int p = 0; p < 4; p++) { out[r * k + pos + off[p]] = w[2 * p]; out[r * k + pos + off[p] + 1] = w[2 * p + 1]; }
        }
    f = fopen(argv[5], "wb");
    fwrite(out.data(), 4, out.size(), f);
    fclose(f);
}
"""


def main() -> int:
    from gguf import GGMLQuantizationType, quants

    from tests.test_cuda_kernels import TYPES, blocks

    if not shutil.which("nvcc"):
        print("nvcc is not on PATH", file=sys.stderr)
        return 2
    rng = np.random.default_rng(0)
    failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        (work / "harness.cu").write_text(HARNESS)
        subprocess.run(["nvcc", "-O2", "-I", str(ROOT / "engine/native/cuda"), str(work / "harness.cu"), "-o",
                        str(work / "harness")], check=True)
        for type_name in TYPES:
            n, k = 5, 1024
            raw = blocks(rng, type_name, n, k)
            raw.tofile(work / "in.bin")
            qtype = GGMLQuantizationType[type_name]
            subprocess.run([str(work / "harness"), str(int(qtype)), str(n), str(k), str(work / "in.bin"),
                            str(work / "out.bin")], check=True)
            got = np.fromfile(work / "out.bin", np.float32).reshape(n, k)
            want = quants.dequantize(raw, qtype).reshape(n, k).astype(np.float32)
            diff = float(np.abs(got - want).max())
            failed += diff != 0.0
            print(f"{type_name}: max |decoded - gguf-py| = {diff:g} (largest weight {np.abs(want).max():.4g})")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
