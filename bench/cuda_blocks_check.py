"""Checks the CUDA kernels' block decoding (engine/native/cuda/hearth_cuda_blocks.cuh) on the CPU, no GPU needed:
nvcc compiles its __host__ side into a small program that decodes random rows of every type the kernels read,
and gguf-py's dequantize says what each weight must be. Needs nvcc (the GPU machine has one; so may yours).

Then the GEMV's share-out of the work (hearth_cuda_kernels.cuh: hq_locate, hq_dispatch, hq_rows_dot, also
__host__): for every block of R rows and every one of its 256 threads, the same functions run on the CPU, and the
threads' sums added up must be x·Wᵀ (float64 reference), for one and several rows of x, rows of one type and a
block straddling two types. What this leaves to the GPU test: the staging into shared memory, the warp and block
reductions, and the launch.

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

GEMV_HARNESS = r"""
#include <cstdio>
#include <cstdlib>
#include <vector>
#include "hearth_cuda_kernels.cuh"
// argv: K, MT, then per segment: type rows file; x file (MT x K float32); out file (MT x N float32)
template <int MT>
static void run(const HqSegments &segs, int k, const float *x, float *y) {
    constexpr int R = hq_rows_per_block(MT);
    const int tile = (int)hq_tile(MT, k);
    std::vector<float> xs((size_t)MT * tile);
    for (int64_t r0 = 0; r0 < segs.total; r0 += R) {
        const uint8_t *row[R];
        int type[R];
        const bool uniform = hq_locate<R>(segs, r0, row, type);
        float sum[MT][R] = {};
        for (int k0 = 0; k0 < k; k0 += tile) {
            const int kt = k - k0 < tile ? k - k0 : tile;
            for (int m = 0; m < MT; m++)
                for (int j = 0; j < kt; j++) xs[(size_t)m * tile + j] = x[(size_t)m * k + k0 + j];
            for (int t = 0; t < HQ_THREADS; t++) {
                float acc[MT][R] = {};
                if (uniform) {
                    hq_dispatch<MT, R>(type[0], row, k0 / 8, (k0 + kt) / 8, k0, xs.data(), tile, acc, t);
                } else {
                    for (int i = 0; i < R; i++) {
                        float one[MT][1] = {};
                        const uint8_t *single[1] = {row[i]};
                        hq_dispatch<MT, 1>(type[i], single, k0 / 8, (k0 + kt) / 8, k0, xs.data(), tile, one, t);
                        for (int m = 0; m < MT; m++) acc[m][i] += one[m][0];
                    }
                }
                for (int m = 0; m < MT; m++)
                    for (int i = 0; i < R; i++) sum[m][i] += acc[m][i];
            }
        }
        for (int m = 0; m < MT; m++)
            for (int i = 0; i < R; i++)
                if (r0 + i < segs.total) y[(size_t)m * segs.total + r0 + i] = sum[m][i];
    }
}
int main(int argc, char **argv) {
    const int k = atoi(argv[1]), mt = atoi(argv[2]);
    HqSegments segs = {};
    int a = 3;
    std::vector<std::vector<uint32_t>> keep;
    while (a + 3 < argc && segs.count < HQ_MAX_SEGMENTS) {
        const int type = atoi(argv[a]);
        const long n = atol(argv[a + 1]);
        const long rb = k / hq_block_weights(type) * hq_block_bytes(type);
        keep.emplace_back((n * rb + 3) / 4);
        FILE *f = fopen(argv[a + 2], "rb");
        if (fread(keep.back().data(), 1, n * rb, f) != (size_t)(n * rb)) return 2;
        fclose(f);
        const int s = segs.count++;
        segs.rows[s] = reinterpret_cast<const uint8_t *>(keep.back().data());
        segs.row_bytes[s] = rb;
        segs.type[s] = type;
        segs.start[s + 1] = segs.start[s] + n;
        segs.total = segs.start[s + 1];
        a += 3;
    }
    std::vector<float> x((size_t)mt * k), y((size_t)mt * segs.total, -12345.f);
    FILE *f = fopen(argv[a], "rb");
    if (fread(x.data(), 4, x.size(), f) != x.size()) return 2;
    fclose(f);
    switch (mt) {
    case 1: run<1>(segs, k, x.data(), y.data()); break;
    case 2: run<2>(segs, k, x.data(), y.data()); break;
    case 4: run<4>(segs, k, x.data(), y.data()); break;
    default: run<8>(segs, k, x.data(), y.data()); break;
    }
    f = fopen(argv[a + 1], "wb");
    fwrite(y.data(), 4, y.size(), f);
    fclose(f);
}
"""

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
        failed += check_gemv(work, rng)
    return 1 if failed else 0


def check_gemv(work: Path, rng) -> int:
    """The GEMV's work share-out on the CPU against x·Wᵀ in float64; returns the number of cases that failed."""
    from gguf import GGMLQuantizationType, quants

    from tests.test_cuda_kernels import blocks

    (work / "gemv.cu").write_text(GEMV_HARNESS)
    subprocess.run(["nvcc", "-O2", "-I", str(ROOT / "engine/native/cuda"), str(work / "gemv.cu"), "-o",
                    str(work / "gemv")], check=True)
    cases = [([("Q4_K", 37)], 1024, 1), ([("Q4_0", 21)], 768, 2), ([("Q8_0", 9)], 9216, 1),
             ([("Q4_K", 13), ("Q4_K", 6), ("Q6_K", 7)], 512, 1), ([("Q5_0", 10), ("Q4_1", 5)], 640, 4),
             ([("Q5_K", 11)], 256, 8), ([("Q6_K", 3)], 2048, 1), ([("Q5_1", 17)], 256, 1)]
    failed = 0
    for parts, k, mt in cases:
        args, dense = [], []
        for i, (type_name, n) in enumerate(parts):
            raw = blocks(rng, type_name, n, k)
            raw.tofile(work / f"w{i}.bin")
            qtype = GGMLQuantizationType[type_name]
            args += [str(int(qtype)), str(n), str(work / f"w{i}.bin")]
            dense.append(quants.dequantize(raw, qtype).reshape(n, k).astype(np.float64))
        x = rng.standard_normal((mt, k)).astype(np.float32)
        x.tofile(work / "x.bin")
        subprocess.run([str(work / "gemv"), str(k), str(mt), *args, str(work / "x.bin"), str(work / "y.bin")],
                       check=True)
        want = x.astype(np.float64) @ np.concatenate(dense).T
        got = np.fromfile(work / "y.bin", np.float32).reshape(mt, -1).astype(np.float64)
        err = float(np.abs(got - want).max() / np.abs(want).max())
        ok = got.shape == want.shape and err < 1e-5
        failed += not ok
        label = " + ".join(f"{t}[{n}]" for t, n in parts)
        print(f"GEMV {label}, K={k}, {mt} row(s) of x: max error {err:.2e} of the largest output {'ok' if ok else 'WRONG'}")
    return failed


if __name__ == "__main__":
    sys.exit(main())
