/* ai.hearth.cuda.Attention's kernel: one decode step of GroupQueryAttention (one new token, batch 1, fp16 KV cache
 * shared as past and present), in one launch a layer.
 *
 * ONNX Runtime's CUDA GroupQueryAttention spends three to four launches a layer on a decode step (sequence lengths,
 * rotary + KV append, the attention, its split-K reduction), each at the ~2–5 µs floor a launch costs inside a CUDA
 * graph: on an H100, 24% of the default model's step and 14% of a Q4_K_M 8B's at 1k tokens (docs/cuda.md). Here
 * one kernel does it all. Block (h, s) takes KV head h and split s of the visible past keys; every key row it reads
 * serves the G query heads of h's group at once (flash-decoding). Split 0 also rotates the new key, writes it and
 * the new value into the cache, and counts them among its keys (no other block reads that row in this launch).
 * The splits' partial softmaxes meet in a buffer the kernel owns; the last block of h to finish (a counter it then
 * resets) merges them, so the reduction needs no launch of its own.
 *
 * The past length comes from seqlens_k on the device, so a captured CUDA graph replays with the step's own
 * length; the grid is fixed (splits per head chosen for the device), and the keys each split takes follow
 * the length: at least MIN_CHUNK, so a short past does not wake blocks with nothing to do.
 *
 * Arithmetic: q and the new key rotated in fp32 (the half-split layout, cos/sin per position), the new key and
 * value rounded to fp16 as stored, scores, softmax and the weighted sum in fp32; out in fp16.
 */
#ifndef HEARTH_CUDA_ATTENTION_CUH
#define HEARTH_CUDA_ATTENTION_CUH

#include "hearth_cuda_kernels.cuh"

#define HQ_ATTN_THREADS 128
#define HQ_ATTN_WARPS (HQ_ATTN_THREADS / 32)
#define HQ_ATTN_MIN_CHUNK 32    /* past keys a split takes at least: one tile (128, a tile for each of four warps,
                                 * left Gemma 3's one KV head four blocks at 512 keys: 20 µs a layer, H100) */
#define HQ_ATTN_MAX_SPLITS 128
#define HQ_ATTN_MAX_GROUP 8
#define HQ_ATTN_ROW(D) ((D) + 4)  /* floats of a partial's row */
#define HQ_ATTN_NEG (-1.0e30f)  /* "no key yet": finite, so NEG - NEG is 0, never NaN */

struct HqAttnArgs {
    const __half *q;      /* the token's query heads: heads·D values, head n at n·D */
    const __half *k_new;  /* its key heads (kv_heads·D) and value heads */
    const __half *v_new;
    __half *keys;         /* the cache: [kv_heads, cap, D] each */
    __half *values;
    const int32_t *seqlens;  /* device: [0] = the past length (the new token's position) */
    const __half *q_gamma;  /* the QK norms' gains ([D] each), or null: q and the new key arrive normed (Gemma 3's and */
    const __half *k_gamma;  /* Qwen3's per-head RMSNorm, done here instead of by the graph's own nodes) */
    float qk_eps;
    const __half *qkv_bias;  /* [(heads + 2·kv_heads)·D], added to q, the new key and value first (Qwen2's), or null */
    const __half *cos;    /* [positions, half] each, or null: no rotary */
    const __half *sin;
    int64_t positions;
    int half;
    int64_t cap;
    float scale;
    int64_t window;       /* <= 0: every past key; else the last `window` keys, the new one included */
    int splits;           /* gridDim.y */
    int group;            /* query heads a KV head: G or fewer (the kernel's G rounded up to 1, 2, 4 or 8) */
    float *partial;       /* [kv_heads, splits, G, D + 4]: a split's unnormalized sums, its max, its total (and 2
                           * floats of padding: rows of whole float4s) */
    unsigned *done;       /* [kv_heads]: splits finished, reset by the one that merges */
    __half *out;          /* heads·D */
};

/* The keys split s of `splits` takes, [a, b), of the visible past [lo, pos), and how many splits have any. */
__device__ __forceinline__ int hq_attn_range(int64_t lo, int64_t pos, int splits, int s, int64_t *a, int64_t *b) {
    const int64_t n = pos - lo;
    int64_t chunk = (n + splits - 1) / splits;
    chunk = chunk < HQ_ATTN_MIN_CHUNK ? HQ_ATTN_MIN_CHUNK : (chunk + 31) & ~31LL;
    const int used = n > 0 ? (int)((n + chunk - 1) / chunk) : 1;
    *a = lo + s * chunk;
    *b = *a + chunk < pos ? *a + chunk : pos;
    return used;
}

/* x[d] (+ bias[d]) as fp32, rounded as the graph's fp16 Add stores it where there is a bias (Qwen2's). */
__device__ __forceinline__ float hq_attn_biased(const __half *x, const __half *bias, int d) {
    return __half2float(bias ? __hadd(x[d], bias[d]) : x[d]);
}

/* Rows rows[0 .. n) of D values (the G query heads, and the new key in split 0), as loaded into shared memory:
 * RMS-normed with their gain where it is set (Gemma 3's and Qwen3's per-head QK norms, each row rounded to fp16 as
 * the graph's norm node stores it), then rotated at one position (pairs (i, i + half) for i < half, the dimensions
 * past 2·half as they are) and rounded to fp16 as a rotated row is stored (the cache's keys; ONNX Runtime's rotary
 * kernel writes q so too). Every thread of the block calls it, after the barrier that made the rows visible; they
 * are ready after its last barrier. The rows' loads were all in flight at once before: a row at a time cost a memory
 * round trip a head. */
__device__ __forceinline__ const __half *hq_attn_gain(int r, int heads, int group, const __half *q_gamma,
                                                      const __half *k_gamma) {
    return r < heads ? (r < group ? q_gamma : nullptr) : k_gamma;  /* a head of zeros past the group: none */
}

/* rows: [n][D], the kernel's G query heads (`group` of them real) then, in split 0, the new key. */
template <int D>
__device__ __forceinline__ void hq_attn_prepare(float (*rows)[D], int n, int heads, int group, const __half *q_gamma,
                                                const __half *k_gamma, float eps, const __half *cos,
                                                const __half *sin, int half, float *scale_s) {
    if (q_gamma || k_gamma) {
        const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
        for (int r = warp; r < n; r += HQ_ATTN_WARPS) {  /* a warp a row's sum of squares */
            float squares = 0.0f;
            for (int d = lane; d < D; d += 32) squares += rows[r][d] * rows[r][d];
            squares = hq_warp_sum(squares);
            if (lane == 0) scale_s[r] = rsqrtf(squares / (float)D + eps);
        }
        __syncthreads();
        for (int idx = threadIdx.x; idx < n * D; idx += HQ_ATTN_THREADS) {
            const int r = idx / D, d = idx % D;
            const __half *gamma = hq_attn_gain(r, heads, group, q_gamma, k_gamma);
            if (gamma) rows[r][d] = __half2float(__float2half(rows[r][d] * scale_s[r] * __half2float(gamma[d])));
        }
        __syncthreads();
    }
    if (half > 0) {
        for (int idx = threadIdx.x; idx < n * half; idx += HQ_ATTN_THREADS) {  /* a thread a pair, in place */
            const int r = idx / half, i = idx % half;
            const float c = __half2float(cos[i]), s = __half2float(sin[i]), x1 = rows[r][i], x2 = rows[r][i + half];
            rows[r][i] = __half2float(__float2half(x1 * c - x2 * s));
            rows[r][i + half] = __half2float(__float2half(x2 * c + x1 * s));
        }
    }
    __syncthreads();
}

/* A lane's N dimensions of one value row, held as loaded (fp16, in the widest loads their alignment allows: a row
 * of V starts 64-byte aligned, a lane's share at a multiple of N values) so a whole tile's rows fit the registers
 * with their loads in flight at once; read out as fp32. */
template <int N>
struct HqAttnRow {
    __half h[N];
    __device__ __forceinline__ void load(const __half *src) {
#pragma unroll
        for (int e = 0; e < N; e++) h[e] = src[e];
    }
    __device__ __forceinline__ void zero() {
#pragma unroll
        for (int e = 0; e < N; e++) h[e] = __float2half(0.0f);
    }
    __device__ __forceinline__ float at(int e) const { return __half2float(h[e]); }
};

template <int N, typename W>
struct HqAttnWords {  /* N halves as one 4-, 8- or 16-byte word */
    union {
        W w;
        __half2 h2[N / 2];
    };
    __device__ __forceinline__ void load(const __half *src) { w = *reinterpret_cast<const W *>(src); }
    __device__ __forceinline__ void zero() {
#pragma unroll
        for (int e = 0; e < N / 2; e++) h2[e] = __float2half2_rn(0.0f);
    }
    __device__ __forceinline__ float at(int e) const {
        return e % 2 ? __high2float(h2[e / 2]) : __low2float(h2[e / 2]);
    }
};
template <>
struct HqAttnRow<2> : HqAttnWords<2, unsigned> {};
template <>
struct HqAttnRow<4> : HqAttnWords<4, uint2> {};
template <>
struct HqAttnRow<8> : HqAttnWords<8, uint4> {};

/* One warp's running softmax over the keys it has seen, for the G heads: the max m, the total l of e^(score - m),
 * and this lane's D/32 dimensions of Σ e^(score - m)·v. */
template <int D, int G>
struct HqAttnState {
    float m[G], l[G], acc[G][D / 32];
};

/* Takes in a tile's scores, sc (this lane's key's; NEG where it has none), which become p = e^(sc - m') against the
 * new max m'; a key scored by several lanes is counted in the total by one (`counted`). */
template <int D, int G>
__device__ __forceinline__ void hq_attn_rescale(HqAttnState<D, G> &st, float (&sc)[G], bool valid, bool counted) {
#pragma unroll
    for (int i = 0; i < G; i++) {
        const float top = fmaxf(st.m[i], hq_warp_max(sc[i]));
        const float fix = __expf(st.m[i] - top);
        sc[i] = valid ? __expf(sc[i] - top) : 0.0f;
        st.l[i] = st.l[i] * fix + hq_warp_sum(counted ? sc[i] : 0.0f);
        st.m[i] = top;
#pragma unroll
        for (int v = 0; v < D / 32; v++) st.acc[i][v] *= fix;
    }
}

template <int D, int G>
__global__ void __launch_bounds__(HQ_ATTN_THREADS) attention_decode_kernel(HqAttnArgs a) {
    constexpr int VD = D / 32;  /* the dimensions of V a lane sums */
    static_assert(D % 32 == 0 && D >= 64, "the merge reuses warp_acc for 2 x 128 x G floats");
    __shared__ __align__(16) float qk_s[G + 1][D];  /* the G query heads, then the new key (split 0) */
    __shared__ float new_v[D];
    __shared__ float warp_m[HQ_ATTN_WARPS][G], warp_l[HQ_ATTN_WARPS][G];
    __shared__ float warp_acc[HQ_ATTN_WARPS][G][D];
    __shared__ int last;
    __shared__ float row_scale[G + 1];
    float(*q_s)[D] = qk_s;
    float *new_k = qk_s[G];
    hq_pdl_wait();  /* q and the new key and value come from the launch before */
    hq_pdl_release();
    const int h = blockIdx.x, s = blockIdx.y, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int64_t pos = a.seqlens[0];
    __half *out = a.out + (int64_t)h * a.group * D;
    if (pos < 0 || pos >= a.cap || (a.half && pos >= a.positions)) {  /* a length the buffers cannot hold */
        if (s == 0)
            for (int d = threadIdx.x; d < a.group * D; d += HQ_ATTN_THREADS) out[d] = __float2half(__int_as_float(0x7fc00000));
        return;
    }
    const int64_t lo = a.window > 0 && pos - a.window + 1 > 0 ? pos - a.window + 1 : 0;
    int64_t k0, k1;
    const int used = hq_attn_range(lo, pos, a.splits, s, &k0, &k1);
    if (s >= used) return;
    const __half *cos = a.half ? a.cos + pos * a.half : nullptr, *sin = a.half ? a.sin + pos * a.half : nullptr;
    __half *keys = a.keys + (int64_t)h * a.cap * D, *values = a.values + (int64_t)h * a.cap * D;
    /* Every row this block needs, loaded at once (q's heads; the new key and value in split 0). */
    const __half *bias = a.qkv_bias;
    for (int idx = threadIdx.x; idx < G * D; idx += HQ_ATTN_THREADS) {
        const int i = idx / D, d = idx % D;
        const int64_t at = (int64_t)(h * a.group + i) * D;
        q_s[i][d] = i < a.group ? hq_attn_biased(a.q + at, bias ? bias + at : nullptr, d) : 0.0f;
    }
    if (s == 0)
        for (int d = threadIdx.x; d < D; d += HQ_ATTN_THREADS) {
            new_k[d] = hq_attn_biased(a.k_new + (int64_t)h * D, bias ? bias + (int64_t)(a.group * gridDim.x + h) * D : nullptr, d);
            const __half vh = bias ? __hadd(a.v_new[(int64_t)h * D + d], bias[(int64_t)((a.group + 1) * gridDim.x + h) * D + d])
                                   : a.v_new[(int64_t)h * D + d];
            values[pos * D + d] = vh;
            new_v[d] = __half2float(vh);
        }
    __syncthreads();
    hq_attn_prepare<D>(qk_s, s == 0 ? G + 1 : G, G, a.group, a.q_gamma, a.k_gamma, a.qk_eps, cos, sin, a.half,
                       row_scale);
    if (s == 0)  /* the new key into the cache, as stored */
        for (int d = threadIdx.x; d < D; d += HQ_ATTN_THREADS) keys[pos * D + d] = __float2half(new_k[d]);

    HqAttnState<D, G> st;
#pragma unroll
    for (int i = 0; i < G; i++) {
        st.m[i] = HQ_ATTN_NEG, st.l[i] = 0.0f;
#pragma unroll
        for (int v = 0; v < VD; v++) st.acc[i][v] = 0.0f;
    }
    /* Tiles of TK keys, the warps taking them in turn: KL lanes score key t0 + lane / KL against the G heads (their
     * D / KL dimensions of the row, 16 bytes a load, all in flight), then every lane adds its D/32 dimensions of the
     * tile's values, weighted, the tile's rows loaded at once (a decode step's attention waits on memory round
     * trips, not arithmetic: V a row at a time made SmolLM2's step at 8k 1.4× slower than ONNX Runtime's kernels;
     * eight rows at a time left four round trips a 32-key tile, and the 8B's attention at 21.6 µs a layer, H100,
     * 2026-12-07). Head size 256 takes two lanes a key, so a lane's share of a row fits the registers. */
    constexpr int KL = D == 256 ? 2 : 1, TK = 32 / KL, KW = D / KL;
    constexpr int VB = D == 96 ? 16 : TK;  /* value rows in flight: up to 64 registers of them */
    const int part = lane % KL;
    for (int64_t t0 = k0 + TK * warp; t0 < k1; t0 += TK * HQ_ATTN_WARPS) {
        const int64_t j = t0 + lane / KL;
        const bool valid = j < k1;
        float sc[G];
#pragma unroll
        for (int i = 0; i < G; i++) sc[i] = 0.0f;
        if (valid) {
            const uint4 *row = reinterpret_cast<const uint4 *>(keys + j * D + part * KW);
            uint4 raw[KW / 8];
#pragma unroll
            for (int c = 0; c < KW / 8; c++) raw[c] = row[c];
#pragma unroll
            for (int c = 0; c < KW / 8; c++) {
                const __half2 *h2 = reinterpret_cast<const __half2 *>(&raw[c]);
                float k8[8];
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const float2 f = __half22float2(h2[e]);
                    k8[2 * e] = f.x, k8[2 * e + 1] = f.y;
                }
                const int col = part * KW + 8 * c;
#pragma unroll
                for (int i = 0; i < G; i++) {  /* q read as float4s: a quarter of the shared-memory loads */
                    const float4 qa = *reinterpret_cast<const float4 *>(&q_s[i][col]);
                    const float4 qb = *reinterpret_cast<const float4 *>(&q_s[i][col + 4]);
                    sc[i] += qa.x * k8[0] + qa.y * k8[1] + qa.z * k8[2] + qa.w * k8[3] + qb.x * k8[4] + qb.y * k8[5] +
                             qb.z * k8[6] + qb.w * k8[7];
                }
            }
        }
#pragma unroll
        for (int i = 0; i < G; i++) {
#pragma unroll
            for (int o = 1; o < KL; o <<= 1) sc[i] += __shfl_xor_sync(0xffffffffu, sc[i], o);
            sc[i] = valid ? sc[i] * a.scale : HQ_ATTN_NEG;
        }
        hq_attn_rescale<D, G>(st, sc, valid, part == 0);  /* sc now p, 0 past the tile's keys */
        const int count = k1 - t0 < TK ? (int)(k1 - t0) : TK;
        for (int b0 = 0; b0 < count; b0 += VB) {
            HqAttnRow<VD> v[VB];
#pragma unroll
            for (int u = 0; u < VB; u++) {
                if (b0 + u < count)
                    v[u].load(values + (t0 + b0 + u) * D + lane * VD);
                else
                    v[u].zero();  /* past the keys: weight 0, and no NaN to meet */
            }
#pragma unroll
            for (int u = 0; u < VB; u++)
#pragma unroll
                for (int i = 0; i < G; i++) {
                    const float p = __shfl_sync(0xffffffffu, sc[i], (b0 + u) * KL);
#pragma unroll
                    for (int e = 0; e < VD; e++) st.acc[i][e] += p * v[u].at(e);
                }
        }
    }
    if (s == 0 && warp == 0) {  /* the new key, once */
#pragma unroll
        for (int i = 0; i < G; i++) {
            float part = 0.0f;
#pragma unroll
            for (int e = 0; e < VD; e++) part += q_s[i][lane * VD + e] * new_k[lane * VD + e];
            const float score = hq_warp_sum(part) * a.scale, top = fmaxf(st.m[i], score);
            const float fix = __expf(st.m[i] - top), p = __expf(score - top);
            st.l[i] = st.l[i] * fix + p;
            st.m[i] = top;
#pragma unroll
            for (int e = 0; e < VD; e++) st.acc[i][e] = st.acc[i][e] * fix + p * new_v[lane * VD + e];
        }
    }

    /* The block's four warps into one partial softmax. */
#pragma unroll
    for (int i = 0; i < G; i++) {
        if (lane == 0) warp_m[warp][i] = st.m[i], warp_l[warp][i] = st.l[i];
#pragma unroll
        for (int e = 0; e < VD; e++) warp_acc[warp][i][lane * VD + e] = st.acc[i][e];
    }
    __syncthreads();
    float *mine = a.partial + ((int64_t)h * a.splits + s) * G * HQ_ATTN_ROW(D);
    for (int idx = threadIdx.x; idx < G * D; idx += HQ_ATTN_THREADS) {
        const int i = idx / D, d = idx % D;
        float top = HQ_ATTN_NEG, total = 0.0f, sum = 0.0f;
        for (int w = 0; w < HQ_ATTN_WARPS; w++) top = fmaxf(top, warp_m[w][i]);
        for (int w = 0; w < HQ_ATTN_WARPS; w++) {
            const float f = __expf(warp_m[w][i] - top);
            total += warp_l[w][i] * f;
            sum += warp_acc[w][i][d] * f;
        }
        if (used == 1) {
            if (i < a.group) out[idx] = __float2half(total > 0.0f ? sum / total : 0.0f);
        } else {
            mine[i * HQ_ATTN_ROW(D) + d] = sum;
            if (d == 0) mine[i * HQ_ATTN_ROW(D) + D] = top, mine[i * HQ_ATTN_ROW(D) + D + 1] = total;
        }
    }
    if (used == 1) return;

    /* The last split of head h to finish merges them all (CUDA's threadFenceReduction pattern). */
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) last = atomicAdd(&a.done[h], 1u) == (unsigned)(used - 1);
    __syncthreads();
    if (!last) return;
    __threadfence();
    /* Each split's weight against the largest max, e^(m_p - M), and 1 / Σ_p l_p e^(m_p - M), per head, in the block's
     * shared memory (warp_acc's, no longer needed; it holds 2 · 128 · G floats), then out = Σ_p w_p acc_p / L. */
    const float *all = a.partial + (int64_t)h * a.splits * G * HQ_ATTN_ROW(D);
    float *weight = &warp_acc[0][0][0], *total_of = weight + HQ_ATTN_MAX_SPLITS * G;
    __syncthreads();
    for (int p = threadIdx.x; p < used; p += HQ_ATTN_THREADS)
#pragma unroll
        for (int i = 0; i < G; i++) {
            const float2 ml = __ldcg(reinterpret_cast<const float2 *>(all + (p * G + i) * HQ_ATTN_ROW(D) + D));
            weight[p * G + i] = ml.x;
            total_of[p * G + i] = ml.y;
        }
    __syncthreads();
    for (int i = warp; i < G; i += HQ_ATTN_WARPS) {
        float top = HQ_ATTN_NEG;
        for (int p = lane; p < used; p += 32) top = fmaxf(top, weight[p * G + i]);
        top = hq_warp_max(top);
        float total = 0.0f;
        for (int p = lane; p < used; p += 32) {
            const float f = __expf(weight[p * G + i] - top);
            weight[p * G + i] = f;
            total += f * total_of[p * G + i];
        }
        total = hq_warp_sum(total);
        if (lane == 0) warp_l[0][i] = total > 0.0f ? 1.0f / total : 0.0f;
    }
    __syncthreads();
    /* Σ_p w_p acc_p, four dimensions a load: the block's threads take (head, 4 dimensions) items, PER of them each
     * at once, and where there are fewer items than threads, SLICES threads share an item's splits, their sums then
     * added in shared memory. Every load is independent, 16 in flight a thread: the merge waits on a few round trips,
     * not on `used` of them. */
    constexpr int ITEMS = G * D / 4;
    constexpr int SLICES = ITEMS >= HQ_ATTN_THREADS ? 1 : HQ_ATTN_THREADS / ITEMS;
    constexpr int LANES = HQ_ATTN_THREADS / SLICES, PER = (ITEMS + LANES - 1) / LANES;
    constexpr int AHEAD = PER >= 16 ? 1 : 16 / PER;
    __shared__ float4 slice_sums[HQ_ATTN_THREADS];
    const int slice = threadIdx.x / LANES;
    float4 sum[PER];
#pragma unroll
    for (int k = 0; k < PER; k++) sum[k] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll(AHEAD)
    for (int p = slice; p < used; p += SLICES)
#pragma unroll
        for (int k = 0; k < PER; k++) {
            const int item = threadIdx.x % LANES + k * LANES, i = item / (D / 4), d = item % (D / 4) * 4;
            if (item < ITEMS) {
                const float w = weight[p * G + i];
                const float4 v = __ldcg(reinterpret_cast<const float4 *>(all + (p * G + i) * HQ_ATTN_ROW(D) + d));
                sum[k].x += w * v.x, sum[k].y += w * v.y, sum[k].z += w * v.z, sum[k].w += w * v.w;
            }
        }
    if (SLICES > 1) {  /* then PER is 1 */
        slice_sums[threadIdx.x] = sum[0];
        __syncthreads();
        if (slice == 0)
            for (int o = 1; o < SLICES; o++) {
                const float4 more = slice_sums[threadIdx.x + o * LANES];
                sum[0].x += more.x, sum[0].y += more.y, sum[0].z += more.z, sum[0].w += more.w;
            }
    }
    if (slice == 0)
#pragma unroll
        for (int k = 0; k < PER; k++) {
            const int item = threadIdx.x + k * LANES, i = item / (D / 4), d = item % (D / 4) * 4;
            if (item < ITEMS && i < a.group) {
                const float inv = warp_l[0][i];
                __half *o = out + i * D + d;
                o[0] = __float2half(sum[k].x * inv), o[1] = __float2half(sum[k].y * inv);
                o[2] = __float2half(sum[k].z * inv), o[3] = __float2half(sum[k].w * inv);
            }
        }
    if (threadIdx.x == 0) a.done[h] = 0;  /* for the next step's launch, which follows this one on the stream */
}

/* The head sizes and group sizes compiled (every model in the catalog: 64, 128, 256 and Phi-3's 96; groups 1–8). */
__host__ __forceinline__ bool hq_attn_supported(int d, int group) {
    return (d == 64 || d == 96 || d == 128 || d == 256) && group >= 1 && group <= HQ_ATTN_MAX_GROUP;
}

/* The kernel's G: the group size rounded up to 1, 2, 4 or 8 (a group of 3, SmolLM2's, runs as 4 with one head of
 * zeros; four instantiations a head size rather than eight keep the library's size). */
__host__ __forceinline__ int hq_attn_group_width(int group) { return group <= 2 ? group : group <= 4 ? 4 : 8; }

template <int D>
static void hq_attn_launch_d(dim3 grid, const HqAttnArgs &a, cudaStream_t stream) {
    switch (hq_attn_group_width(a.group)) {
    case 1: hq_launch(attention_decode_kernel<D, 1>, grid, dim3(HQ_ATTN_THREADS), 0, stream, a); break;
    case 2: hq_launch(attention_decode_kernel<D, 2>, grid, dim3(HQ_ATTN_THREADS), 0, stream, a); break;
    case 4: hq_launch(attention_decode_kernel<D, 4>, grid, dim3(HQ_ATTN_THREADS), 0, stream, a); break;
    default: hq_launch(attention_decode_kernel<D, 8>, grid, dim3(HQ_ATTN_THREADS), 0, stream, a); break;
    }
}

/* One decode step for kv_heads heads of head size d (hq_attn_supported; a.group query heads each). */
static void hq_attn_launch(int d, int kv_heads, const HqAttnArgs &a, cudaStream_t stream) {
    const dim3 grid((unsigned)kv_heads, (unsigned)a.splits);
    switch (d) {
    case 64: hq_attn_launch_d<64>(grid, a, stream); break;
    case 96: hq_attn_launch_d<96>(grid, a, stream); break;
    case 128: hq_attn_launch_d<128>(grid, a, stream); break;
    default: hq_attn_launch_d<256>(grid, a, stream); break;
    }
}

#endif
