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

# What both GEMV harnesses read and write: the weight segments of their command line (type, rows, file; three at
# most), each into 16-byte aligned memory as ONNX Runtime's buffers are (argc counts up to the x file and one output
# after it), and float32 files.
READ_SEGMENTS = r"""
static bool read_segments(int k, int argc, char **argv, int *a, HqSegments *segs, std::vector<std::vector<int4>> &keep) {
    keep.reserve(HQ_MAX_SEGMENTS);
    while (*a + 3 < argc && segs->count < HQ_MAX_SEGMENTS) {
        const int type = atoi(argv[*a]);
        const long n = atol(argv[*a + 1]);
        const long rb = k / hq_block_weights(type) * hq_block_bytes(type);
        keep.emplace_back((n * rb + 15) / 16);
        FILE *f = fopen(argv[*a + 2], "rb");
        if (!f || fread(keep.back().data(), 1, n * rb, f) != (size_t)(n * rb)) return false;
        fclose(f);
        const int s = segs->count++;
        segs->rows[s] = reinterpret_cast<const uint8_t *>(keep.back().data());
        segs->row_bytes[s] = rb;
        segs->type[s] = type;
        segs->start[s + 1] = segs->start[s] + n;
        segs->total = segs->start[s + 1];
        *a += 3;
    }
    return true;
}
static bool read_floats(const char *path, std::vector<float> &v) {
    FILE *f = fopen(path, "rb");
    const bool ok = f && fread(v.data(), 4, v.size(), f) == v.size();
    if (f) fclose(f);
    return ok;
}
static void write_floats(const char *path, const std::vector<float> &v) {
    FILE *f = fopen(path, "wb");
    fwrite(v.data(), 4, v.size(), f);
    fclose(f);
}
"""

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
READ_SEGMENTS
int main(int argc, char **argv) {
    const int k = atoi(argv[1]), mt = atoi(argv[2]);
    HqSegments segs = {};
    int a = 3;
    std::vector<std::vector<int4>> keep;
    if (!read_segments(k, argc, argv, &a, &segs, keep)) return 2;
    std::vector<float> x((size_t)mt * k), y((size_t)mt * segs.total, -12345.f);
    if (!read_floats(argv[a], x)) return 2;
    switch (mt) {
    case 1: run<1>(segs, k, x.data(), y.data()); break;
    case 2: run<2>(segs, k, x.data(), y.data()); break;
    case 4: run<4>(segs, k, x.data(), y.data()); break;
    default: run<8>(segs, k, x.data(), y.data()); break;
    }
    write_floats(argv[a + 1], y);
}
"""

Q8_HARNESS = r"""
#include <cstdio>
#include <cstdlib>
#include <cmath>
#include <vector>
#include "hearth_cuda_q8.cuh"
// argv: K, MT, then per segment: type rows file; x file (MT x K float32); out file (MT x N float32); xdeq file
// (MT x K float32: the activations as the codes and scales hold them); together file (MT x N float32)
template <int MT>
static void run(const HqSegments &segs, int k, const float *x, float *y, float *xdeq, float *together) {
    const int tile = (int)hq_q8_tile(MT, k);
    std::vector<int4> mem((size_t)MT * tile * 11 / 8 / 16 + 1);
    int8_t *xq = reinterpret_cast<int8_t *>(mem.data());
    float *xd = reinterpret_cast<float *>(xq + MT * tile);
    int *xs = reinterpret_cast<int *>(xd + MT * (tile / 32));
    HqXq staged[MT];
    for (int m = 0; m < MT; m++) staged[m] = {xq + m * tile, xd + m * (tile / 32), xs + m * (tile / 16)};
    std::vector<float> acc_all((size_t)MT * segs.total, 0.0f);
    for (int k0 = 0; k0 < k; k0 += tile) {
        const int kt = k - k0 < tile ? k - k0 : tile;
        for (int m = 0; m < MT; m++)  // hq_q8_stage's arithmetic, a group of 32 at a time
            for (int col = 0; col < kt; col += 32) {
                const float *v = x + (size_t)m * k + k0 + col;
                float amax = 0.0f;
                for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(v[j]));
                int sums[4];
                for (int e = 0; e < 4; e++) {
                    int lo, hi;
                    sums[e] = hq_q8_pack8(v + 8 * e, amax, &lo, &hi);
                    reinterpret_cast<int *>(xq + m * tile + col + 8 * e)[0] = lo;
                    reinterpret_cast<int *>(xq + m * tile + col + 8 * e)[1] = hi;
                }
                xs[m * (tile / 16) + col / 16] = sums[0] + sums[1];
                xs[m * (tile / 16) + col / 16 + 1] = sums[2] + sums[3];
                xd[m * (tile / 32) + col / 32] = amax / 127.0f;
                for (int j = 0; j < 32; j++)
                    xdeq[(size_t)m * k + k0 + col + j] = (float)xq[m * tile + col + j] * (amax / 127.0f);
            }
        for (int64_t r = 0; r < segs.total; r++) {
            const uint8_t *row[1];
            int type[1];
            hq_locate<1>(segs, r, row, type);
            for (int lane = 0; lane < 32; lane++) {
                float acc[MT] = {};
                hq_q8_dispatch<MT>(type[0], row[0], k0, kt, staged, acc, lane, 32);
                for (int m = 0; m < MT; m++) acc_all[(size_t)m * segs.total + r] += acc[m];
            }
        }
    }
    for (size_t i = 0; i < acc_all.size(); i++) y[i] = acc_all[i];
    // hq_q8_rows (a warp's rows of one type read together, one row of x, all of K staged): groups of four rows,
    // a group straddling two types one row at a time as the kernel does; into together (y where it does not run).
    for (size_t i = 0; i < acc_all.size(); i++) together[i] = y[i];
    if (MT != 1 || hq_q8_tile(1, k) < k) return;
    for (int64_t r0 = 0; r0 + 4 <= segs.total; r0 += 4) {
        const uint8_t *row[4];
        int type[4];
        if (!hq_locate<4>(segs, r0, row, type)) continue;
        float sums[4] = {};
        for (int lane = 0; lane < 32; lane++) {
            float acc[4] = {};
            hq_q8_rows_dispatch<4>(type[0], row, k, staged[0], acc, lane, 32);
            for (int j = 0; j < 4; j++) sums[j] += acc[j];
        }
        for (int j = 0; j < 4; j++) together[r0 + j] = sums[j];
    }
}
READ_SEGMENTS
int main(int argc, char **argv) {
    const int k = atoi(argv[1]), mt = atoi(argv[2]);
    HqSegments segs = {};
    int a = 3;
    std::vector<std::vector<int4>> keep;
    if (!read_segments(k, argc - 2, argv, &a, &segs, keep)) return 2;  // its third and fourth outputs
    std::vector<float> x((size_t)mt * k), y((size_t)mt * segs.total, -12345.f), xdeq((size_t)mt * k),
        together((size_t)mt * segs.total);
    if (!read_floats(argv[a], x)) return 2;
    switch (mt) {
    case 1: run<1>(segs, k, x.data(), y.data(), xdeq.data(), together.data()); break;
    case 2: run<2>(segs, k, x.data(), y.data(), xdeq.data(), together.data()); break;
    case 4: run<4>(segs, k, x.data(), y.data(), xdeq.data(), together.data()); break;
    default: run<8>(segs, k, x.data(), y.data(), xdeq.data(), together.data()); break;
    }
    write_floats(argv[a + 1], y);
    write_floats(argv[a + 2], xdeq);
    write_floats(argv[a + 3], together);
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
        failed += check_gemv_q8(work, rng)
    return 1 if failed else 0


def _write_segments(work: Path, rng, parts: list[tuple[str, int]], k: int) -> tuple[list[str], list[np.ndarray]]:
    """Random rows of each (type, rows) part written for a harness: its command-line arguments, and each part's
    weights as gguf-py dequantizes them (float64)."""
    from gguf import GGMLQuantizationType, quants

    from tests.test_cuda_kernels import blocks

    args, dense = [], []
    for i, (type_name, n) in enumerate(parts):
        raw = blocks(rng, type_name, n, k)
        raw.tofile(work / f"w{i}.bin")
        qtype = GGMLQuantizationType[type_name]
        args += [str(int(qtype)), str(n), str(work / f"w{i}.bin")]
        dense.append(quants.dequantize(raw, qtype).reshape(n, k).astype(np.float64))
    return args, dense


def check_gemv(work: Path, rng) -> int:
    """The GEMV's work share-out on the CPU against x·Wᵀ in float64; returns the number of cases that failed."""


    (work / "gemv.cu").write_text(GEMV_HARNESS.replace("READ_SEGMENTS", READ_SEGMENTS))
    subprocess.run(["nvcc", "-O2", "-I", str(ROOT / "engine/native/cuda"), str(work / "gemv.cu"), "-o",
                    str(work / "gemv")], check=True)
    cases = [([("Q4_K", 37)], 1024, 1), ([("Q4_0", 21)], 768, 2), ([("Q8_0", 9)], 9216, 1),
             ([("Q4_K", 13), ("Q4_K", 6), ("Q6_K", 7)], 512, 1), ([("Q5_0", 10), ("Q4_1", 5)], 640, 4),
             ([("Q5_K", 11)], 256, 8), ([("Q6_K", 3)], 2048, 1), ([("Q5_1", 17)], 256, 1)]
    failed = 0
    for parts, k, mt in cases:
        args, dense = _write_segments(work, rng, parts, k)
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


def check_gemv_q8(work: Path, rng) -> int:
    """The 8-bit GEMV (hearth_cuda_q8.cuh): every lane of every row on the CPU, against the float64 product of the
    dequantized weights with the activations as its codes and scales hold them (so every type's code layout and
    scales are checked exactly), and how far the 8-bit activations move it from x·Wᵀ. Returns failures."""

    from tests.test_cuda_kernels import TYPES

    (work / "q8.cu").write_text(Q8_HARNESS.replace("READ_SEGMENTS", READ_SEGMENTS))
    subprocess.run(["nvcc", "-O2", "-std=c++17", "-I", str(ROOT / "engine/native/cuda"), str(work / "q8.cu"), "-o",
                    str(work / "q8")], check=True)
    cases = [([(t, 7)], 512, 1) for t in TYPES]
    cases += [([(t, 8)], 512, 1) for t in TYPES]  # whole groups of four for hq_q8_rows
    cases += [([("Q4_K", 13), ("Q4_K", 6), ("Q6_K", 7)], 768, 1), ([("Q5_0", 10), ("Q4_1", 5)], 640, 4),
              ([("Q5_K", 11)], 256, 8), ([("Q6_K", 3)], 24576, 1), ([("Q8_0", 5)], 4096, 8), ([("Q4_0", 9)], 96, 2)]
    failed = 0
    for parts, k, mt in cases:
        args, dense = _write_segments(work, rng, parts, k)
        x = (rng.standard_normal((mt, k)) * rng.uniform(0.1, 30, (mt, 1))).astype(np.float32)
        x[:, 5] *= 40  # an outlier, as real activations have
        x.tofile(work / "x.bin")
        subprocess.run([str(work / "q8"), str(k), str(mt), *args, str(work / "x.bin"), str(work / "y.bin"),
                        str(work / "xq.bin"), str(work / "yt.bin")], check=True)
        w = np.concatenate(dense)
        xq = np.fromfile(work / "xq.bin", np.float32).reshape(mt, k).astype(np.float64)
        want = xq @ w.T
        got = np.fromfile(work / "y.bin", np.float32).reshape(mt, -1).astype(np.float64)
        err = float(np.abs(got - want).max() / np.abs(want).max())
        together = np.fromfile(work / "yt.bin", np.float32).reshape(mt, -1).astype(np.float64)
        err = max(err, float(np.abs(together - want).max() / np.abs(want).max()))
        exact = x.astype(np.float64) @ w.T
        moved = float(np.abs(got - exact).max() / np.abs(exact).max())
        ok = got.shape == want.shape and err < 1e-5 and moved < 2e-2
        failed += not ok
        label = " + ".join(f"{t}[{n}]" for t, n in parts)
        print(f"8-bit GEMV {label}, K={k}, {mt} row(s) of x: max error {err:.2e} against the codes' product, "
              f"{moved:.2e} against x·Wᵀ (of the largest output) {'ok' if ok else 'WRONG'}")
    return failed


if __name__ == "__main__":
    sys.exit(main())
