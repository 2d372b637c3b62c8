/* hearth.MatMulQ's shared pieces: the job one op call hands its instruction-set path, and the paths
 * themselves (hearth_matmul_impl.h compiled once per ISA by hearth_matmul_<isa>.c; build.sh gives each
 * its -m flags, and hearth_matmul.c calls one only after checking the CPU has it). */
#ifndef HEARTH_MATMUL_H
#define HEARTH_MATMUL_H

#include <stddef.h>
#include <stdint.h>

/* Y[m, n] = X[m, :] · dequant(W[n, :]) for m < rows, n in the range a path is given. */
typedef struct {
    int type, fast;            /* ggml type id; fast: 8-bit activations and integer dots */
    int64_t rows, k, n, row_bytes;
    const float *x;            /* [rows, k] */
    const uint8_t *w;          /* [n, row_bytes]: the GGUF's rows as stored */
    float *y;                  /* [rows, n] */
    /* fast only, filled by the path's quantize(): X in 8 bits as llama.cpp's CPU path quantizes it */
    int8_t *xq;                /* [rows, k] codes */
    float *xd;                 /* [rows, k / 32] the scale of each run of 32 (a Q8_K scale repeats 8 times) */
    float *xs;                 /* [rows, k / 16] scale · sum of codes over each run of 16 (for the offsets) */
    int *failed;               /* set (atomically) by a path that could not get its scratch tile */
} HearthMatJob;

typedef struct {
    const char *name;
    void (*quantize)(HearthMatJob *job);                                  /* fast: fill xq, xd, xs */
    void (*rows)(const HearthMatJob *job, int64_t first, int64_t last);   /* output features [first, last) */
} HearthMatIsa;

extern const HearthMatIsa hearth_matmul_portable, hearth_matmul_avx2, hearth_matmul_avx512,
    hearth_matmul_avx512vnni;

/* A per-thread buffer of at least ``bytes`` (kept for the thread's life; NULL when out of memory). */
void *hearth_scratch(size_t bytes);

/* Rows of W a path decodes together (and a parallel work item's size): each is decoded once per op call
 * and reused for every row of X. */
#define HEARTH_TILE_ROWS 16
/* A tile's bytes: fp32 rows (exact); codes and a scale and an offset per 16 codes (fast, fused exact). */
#define HEARTH_EXACT_TILE_BYTES(k) ((size_t)HEARTH_TILE_ROWS * (size_t)(k) * sizeof(float))
#define HEARTH_FAST_TILE_BYTES(k) ((size_t)HEARTH_TILE_ROWS * (size_t)(k) * 3 / 2 + 64)

#endif
