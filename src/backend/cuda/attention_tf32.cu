/* CUDA kernels: Attention (ops/attention.h) on TF32 tensor cores, flash
 * attention 2 style, for calls that allow TF32 (ctx->tf32: the tf32
 * precision, and bf16's calls that cuDNN's SDPA does not take). The
 * float32 kernels of attention.cu stay for the float32 precision; these
 * compute the same quantities with the matrix products on mma.sync:
 *
 *   mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 (sm_80 and later)
 *
 * one warp multiplying a 16 x 8 tile of A by an 8 x 8 tile of B into a
 * 16 x 8 float32 accumulator. Fragments per lane (PTX ISA, "Matrix
 * fragments for mma.m16n8k8" with .tf32; g = lane / 4, t = lane % 4):
 *   A (row): a0 (g, t), a1 (g + 8, t), a2 (g, t + 4), a3 (g + 8, t + 4)
 *   B (col): b0 (t, g), b1 (t + 4, g)
 *   C:       c0 (g, 2t), c1 (g, 2t + 1), c2 (g + 8, 2t), c3 (g + 8, 2t + 1)
 *
 * Forward: a block of 64 query rows of one batch and head (4 warps of 16
 * rows) walks the keys in tiles of 64; Q, K, V tiles sit in shared memory
 * already rounded to TF32 (cvt.rna, once per element loaded). Per tile a
 * warp computes its 16 x 64 scores S = Q K^T (8 accumulator tiles), adds
 * the mask, keeps the online softmax (max m and sum l per row, a lane
 * holding 2 rows x 16 columns: row maxima over the 4 lanes of a quad by
 * shuffles; the sums stay per lane until the end), and adds P V into its
 * 16 x DMAX output accumulator. Scores are kept in base 2 (scale * log2 e
 * folded in, tf_exp2); Y = acc / l and lse = (m + log2 l) ln 2, the natural
 * logsumexp of the scaled scores, per row as attention.cu saves it, so
 * either backward reads either forward's.
 *
 * P as the A operand of P V without shuffles: the k index of an mma is a
 * slot that only has to mean the same key in A and in B. Slot t is taken
 * as key 2t and slot t + 4 as key 2t + 1 of the 8-key group: then a lane's
 * A fragment (g, t), (g + 8, t), (g, t + 4), (g + 8, t + 4) is exactly its
 * accumulator c0, c2, c1, c3 of S, and B reads V's rows 2t and 2t + 1. The
 * same holds for P^T dY, dS^T Q and dS K in the backward.
 *
 * Shared memory rows are DMAX + 4 floats apart: the fragment loads read
 * addresses row * (DMAX + 4) + col with (row, col) = (g, t) (Q, K as A or
 * K^T-like B) or (2t, g) and (2t + 1, g) (V, dY, Q, K as the B of a
 * product over keys or queries); with a row stride of 4 mod 32 banks both
 * patterns hit 32 distinct banks.
 *
 * Backward, deterministic as attention.cu's (no atomics; every gradient
 * element summed by one lane in a fixed order and put once: put_grad):
 * D_i = dY_i . Y_i comes from attention.cu's dsum kernel; then
 *   dQ: blocks of 64 query rows walking key tiles: S = Q K^T,
 *       P = exp2(S' - lse'), dP = dY V^T, dS = P (dP - D), dQ += dS K
 *   dK, dV: blocks of 64 keys (a warp's 16 keys are the mma rows) walking
 *       query tiles: S^T = K Q^T, dP^T = V dY^T, dV += P^T dY,
 *       dK += dS^T Q
 * dQ and dK are scaled once at the end. The walked tiles are 64 long for
 * head sizes up to 64 and 32 for 128, so that the accumulators (dK and dV
 * whole: 2 x DMAX / 2 registers) leave room.
 *
 * Causal: tiles wholly above the diagonal are skipped (forward and dQ end
 * at the block's last row, dK / dV start at the block's first key); a
 * tile is masked element by element (mask_term: causal, bool or additive
 * mask, lengths) unless it has no mask, lies within both lengths and
 * below the diagonal.
 *
 * Rounding: Q, K, V and dY rounded to TF32 (10 mantissa bits, 2^-11
 * relative) as their tiles load, P and dS truncated to TF32 (2^-10:
 * tf_score) before their products, float32 accumulation; tf_exp2 (the
 * hardware's ex2.approx.ftz: within 2^-22 relative, results below 2^-126
 * flushed to 0, far inside the TF32 roundings that follow). Head sizes
 * under the template's are padded with zeros (they add nothing). bfloat16
 * storage: loads widen (exact in TF32), stores round once.
 *
 * 3xTF32 (X3, float32 calls): tiles keep float32 values and nothing is
 * rounded to TF32; each operand of a product is split where it is used
 * into hi + lo (split) and each mma becomes three, lo hi, hi lo, hi hi,
 * smallest first: a product within about 2^-20 of exact, float32
 * accumulation, at three times the TF32 kernels' products. */
#include <math.h>
#include <stdint.h>

#include "backend/cuda/attention_tf32.h"
#include "backend/cuda/bf16.cuh"

#define TF_WARPS 4
#define TF_THREADS (32 * TF_WARPS)
#define TF_ROWS (16 * TF_WARPS) /* query rows (forward, dQ) or keys (dK / dV) per block */
#define TF_LOG2E 1.4426950408889634f
#define TF_LN2 0.6931471805599453f

/* The tile walked in the backward (keys for dQ, queries for dK / dV). */
template <int DMAX> struct tf_walk { static const int n = DMAX > 64 ? 32 : 64; };

__device__ static inline float tf32_round(float x)
{
    uint32_t r;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
    return __uint_as_float(r);
}

__device__ static inline uint32_t bits(float x) { return __float_as_uint(x); }

/* What a tile or a weight keeps for its products: TF32, the value rounded
 * once; 3xTF32 (X3), the float32 value, split where it is multiplied. */
template <bool X3> __device__ static inline float tf_keep(float x) { return X3 ? x : tf32_round(x); }

/* What a score-sized operand (P, dS: one per score, made in registers)
 * keeps for its product: TF32 truncates it (round toward zero, within
 * 2^-10 of the value; one AND, where cvt.rna compiles to a test for NaN
 * and infinity, a constant, a predicated add and the AND: with two such
 * values a score, the roundings were over a third of the backward's
 * per-score instructions); a NaN stays a NaN unless only its low 13 bits
 * were set (it becomes an infinity). 3xTF32 keeps the float32 value. The
 * tiles loaded from memory (tf_keep) are rounded to nearest, once per
 * value loaded. */
template <bool X3> __device__ static inline float tf_score(float x)
{
    return X3 ? x : __uint_as_float(__float_as_uint(x) & 0xffffe000u);
}

/* x = hi + lo exactly: hi is x rounded to TF32 (|lo| at most 2^-11 of
 * x), lo the rest (x - hi is exact in float32), left unrounded: the mma
 * reads it as TF32 by ignoring its low 13 bits, as CUTLASS's
 * round-toward-zero TF32 operands rely on, which costs under 2^-10 of lo,
 * 2^-21 of x. With the lo times lo product left out (under 2^-22), a
 * product is within about 2^-20 of exact.
 *
 * hi rounds as cvt.rna does (to nearest, ties away from zero) by adding
 * half of TF32's last place to the bits and truncating: two independent
 * integer instructions, where cvt.rna is a test for NaN and infinity, an
 * add under its predicate and, for x - hi, the mask. A NaN's hi may come
 * out as anything (0x7fffffff, CUDA's NaN, carries into the sign), but its
 * lo is x - hi, a NaN, and the lo products carry it into the sum. */
__device__ static inline void split(float x, float &hi, float &lo)
{
    hi = __uint_as_float((__float_as_uint(x) + 0x1000u) & 0xffffe000u);
    lo = x - hi;
}

/* 2^x as the one MUFU instruction: exp2f wraps the same instruction in
 * scalings for subnormal results, three more instructions per score. */
__device__ static inline float tf_exp2(float x)
{
    float r;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
    return r;
}

/* c += A B, one m16n8k8 TF32 product (operands already TF32). */
__device__ static inline void mma8(float c[4], float a0, float a1, float a2, float a3, float b0, float b1)
{
    asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(bits(a0)), "r"(bits(a1)), "r"(bits(a2)), "r"(bits(a3)), "r"(bits(b0)), "r"(bits(b1)));
}

/* c += A B with operands of either kind: TF32 (already rounded), one
 * product; 3xTF32, float32 values split in two TF32 parts each and the
 * three products that matter, smallest first: lo hi, hi lo, hi hi. */
template <bool X3>
__device__ static inline void mma_any(float c[4], const float a[4], const float alo[4], float b0, float b1)
{
    if constexpr (!X3) {
        mma8(c, a[0], a[1], a[2], a[3], b0, b1);
        return;
    }
    float h0, l0, h1, l1;
    split(b0, h0, l0);
    split(b1, h1, l1);
    mma8(c, alo[0], alo[1], alo[2], alo[3], h0, h1);
    mma8(c, a[0], a[1], a[2], a[3], l0, l1);
    mma8(c, a[0], a[1], a[2], a[3], h0, h1);
}

/* An A fragment as mma_any takes it: X3 splits a in place into a (hi) and
 * alo. */
template <bool X3> __device__ static inline void split_a(float a[4], float alo[4])
{
    if constexpr (X3) {
#pragma unroll
        for (int i = 0; i < 4; i++) split(a[i], a[i], alo[i]);
    }
}

__device__ static inline float quad_max(float v)
{
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
    return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}

__device__ static inline float quad_sum(float v)
{
    v += __shfl_xor_sync(0xffffffffu, v, 1);
    return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

/* Four consecutive values of storage S, widened (exact): 16-byte loads of
 * float32, 8-byte loads of bfloat16 (one value: att_ld1). */
__device__ static inline float4 ld4(const float *p, int64_t i) { return *reinterpret_cast<const float4 *>(p + i); }
__device__ static inline float4 ld4(const __nv_bfloat16 *p, int64_t i)
{
    const uint2 u = *reinterpret_cast<const uint2 *>(p + i);
    return make_float4(__uint_as_float(u.x << 16), __uint_as_float(u.x & 0xffff0000u), __uint_as_float(u.y << 16),
                       __uint_as_float(u.y & 0xffff0000u));
}

#define TF_BATCH 8 /* loads a thread has in flight before it stores them */

/* tf_load's rows for storage S. The storage is a template parameter, not a
 * branch per value: with gp_ld's branch inside the unrolled loop each load
 * waited for the previous one's store. Loads go out in batches of
 * TF_BATCH before any is stored. `vec`: runs of 4 columns (a thread keeps 4
 * columns and every (TF_THREADS / (DMAX / 4))-th row), else one column. */
template <int DMAX, int ROWS, bool X3, typename S>
__device__ static inline void tf_load_rows(float *s, int n, const S *t, int64_t base, int64_t stride, int64_t first,
                                           int64_t count, bool vec)
{
    const int LD = DMAX + 4;
    if (vec) {
        const int C4 = DMAX / 4, STEP = TF_THREADS / C4, PER = ROWS / STEP;
        const int B = PER < TF_BATCH ? PER : TF_BATCH;
        const int c = (threadIdx.x % C4) * 4, r0 = threadIdx.x / C4;
        const bool col = c < n;
#pragma unroll
        for (int b = 0; b < PER; b += B) {
            float4 v[B];
#pragma unroll
            for (int u = 0; u < B; u++) {
                const int r = r0 + (b + u) * STEP;
                v[u] = col && first + r < count ? ld4(t, base + (first + r) * stride + c) : make_float4(0, 0, 0, 0);
            }
#pragma unroll
            for (int u = 0; u < B; u++) {
                const int r = r0 + (b + u) * STEP;
                *reinterpret_cast<float4 *>(s + r * LD + c) =
                    make_float4(tf_keep<X3>(v[u].x), tf_keep<X3>(v[u].y), tf_keep<X3>(v[u].z), tf_keep<X3>(v[u].w));
            }
        }
        return;
    }
    const int STEP = TF_THREADS / DMAX, PER = ROWS / STEP, B = PER < TF_BATCH ? PER : TF_BATCH;
    const int d = threadIdx.x % DMAX, r0 = threadIdx.x / DMAX;
    const bool col = d < n;
#pragma unroll
    for (int b = 0; b < PER; b += B) {
        float v[B];
#pragma unroll
        for (int u = 0; u < B; u++) {
            const int r = r0 + (b + u) * STEP;
            v[u] = col && first + r < count ? att_ld1(t, base + (first + r) * stride + d) : 0.0f;
        }
#pragma unroll
        for (int u = 0; u < B; u++) s[(r0 + (b + u) * STEP) * LD + d] = tf_keep<X3>(v[u]);
    }
}

/* ROWS x DMAX values of tensor t (row stride `stride`, from row `first`,
 * `count` rows valid, n columns) into shared s[ROWS][DMAX + 4], rounded
 * to TF32; zeros past the valid rows and n. A warp reads consecutive
 * values of a row (128 bytes or more), so the addresses need no division;
 * runs of 4 where the columns, the strides and the pointer allow. */
template <int DMAX, int ROWS, bool X3>
__device__ static inline void tf_load(float *s, int n, gp_fptr t, int64_t base, int64_t stride, int64_t first,
                                      int64_t count)
{
    const uintptr_t align = t.bf16 ? 8 : 16;
    const bool vec = n % 4 == 0 && base % 4 == 0 && stride % 4 == 0 && (uintptr_t)t.p % align == 0;
    if (t.bf16)
        tf_load_rows<DMAX, ROWS, X3>(s, n, (const __nv_bfloat16 *)t.p, base, stride, first, count, vec);
    else
        tf_load_rows<DMAX, ROWS, X3>(s, n, (const float *)t.p, base, stride, first, count, vec);
}

/* acc[NT][4] += A B over k = 0 .. K - 1, a warp's 16 rows: A rows of `a`
 * (row-major, stride LD, from the warp's first row), B^T rows of `b`
 * (B[k][n] = b[n][k]: the product with another row set's transpose),
 * NT tiles of 8 columns. */
template <int K, int NT, int LD, bool X3>
__device__ static inline void mma_abt(float (*acc)[4], const float *a, const float *b, int g, int t)
{
#pragma unroll
    for (int k = 0; k < K; k += 8) {
        const float *ar = a + g * LD + k + t;
        float af[4] = {ar[0], ar[8 * LD], ar[4], ar[8 * LD + 4]}, alo[4];
        split_a<X3>(af, alo);
#pragma unroll
        for (int n = 0; n < NT; n++) {
            const float *br = b + (n * 8 + g) * LD + k + t;
            mma_any<X3>(acc[n], af, alo, br[0], br[4]);
        }
    }
}

/* acc[NT][4] += P B, P the warp's 16 x (8 KT) accumulator tiles p[KT][4]
 * (already TF32) as A through the slot order of the header (slot t: row
 * 2t of the group, slot t + 4: row 2t + 1), B rows of `b` (stride LD),
 * NT tiles of 8 columns. */
template <int KT, int NT, int LD, bool X3>
__device__ static inline void mma_pb(float (*acc)[4], const float (*p)[4], const float *b, int g, int t)
{
#pragma unroll
    for (int k = 0; k < KT; k++) {
        const float *br = b + (k * 8 + 2 * t) * LD + g;
        float af[4] = {p[k][0], p[k][2], p[k][1], p[k][3]}, alo[4];
        split_a<X3>(af, alo);
#pragma unroll
        for (int n = 0; n < NT; n++) mma_any<X3>(acc[n], af, alo, br[n * 8], br[LD + n * 8]);
    }
}

/* lse in base 2 for the backward's exp2: +INFINITY for a row that attends
 * to nothing (or lies past the length), so that every p of it is 0. */
__device__ static inline float lse2_of(const att_args &a, int64_t bh, int64_t i)
{
    if (i >= a.p.q_len) return INFINITY;
    float l = a.lse[bh * a.p.q_len + i];
    return l == -INFINITY ? INFINITY : l * TF_LOG2E;
}

/* How a tile's scores are masked, decided once per tile, so that the
 * branch sits outside the unrolled loops over a lane's scores: with the
 * test inside them, every score branched over its own inlined copy of the
 * mask's code, and the hot loops spread over 180 KB of mostly cold code
 * (instruction fetch was a fifth to a third of the warps' stalls). */
enum tile_kind {
    TILE_FULL,   /* no mask, within both lengths, below the diagonal */
    TILE_BOUNDS, /* only the causal triangle and the lengths: comparisons */
    TILE_MASK    /* a bool or additive mask too: mask_term */
};

__device__ static inline tile_kind kind_of(const struct gp_attention_plan &p, bool full)
{
    return full ? TILE_FULL : p.mask == GP_ATTN_MASK_NONE ? TILE_BOUNDS : TILE_MASK;
}

template <tile_kind K> struct kind_t { static constexpr tile_kind value = K; };

/* Runs f(kind_t<K>()) for the tile's kind K: the loop over a lane's scores
 * compiled once per kind, each straight-line. */
template <typename F> __device__ static inline void by_kind(tile_kind k, F &&f)
{
    if (k == TILE_FULL) f(kind_t<TILE_FULL>());
    else if (k == TILE_BOUNDS) f(kind_t<TILE_BOUNDS>());
    else f(kind_t<TILE_MASK>());
}

/* Which columns c (0 .. 63) of a tile row lie within both lengths and on
 * or below the diagonal: lo[r] <= c < hi[r] for the lane's rows r (its
 * accumulator rows g and g + 8), so that a TILE_BOUNDS score costs two
 * comparisons of small integers. KEYS: the rows are queries `fixed` and
 * the columns keys first + c (forward, dQ); else the rows are keys and the
 * columns queries (dK / dV). */
struct tile_bounds {
    int lo[2], hi[2];
};

__device__ static inline int clamp_col(int64_t v) { return v < -1 ? -1 : v > 1024 ? 1024 : (int)v; }

template <tile_kind K, bool KEYS>
__device__ static inline tile_bounds bounds_of(const struct gp_attention_plan &p, const int64_t fixed[2], int64_t first)
{
    tile_bounds b = {{0, 0}, {0, 0}}; /* read only by TILE_BOUNDS */
    if constexpr (K == TILE_BOUNDS) {
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const int64_t x = fixed[r];
            if (KEYS) { /* query x: keys j < kv_len, and j <= x when causal */
                int64_t end = p.causal && x + 1 < p.kv_len ? x + 1 : p.kv_len;
                b.hi[r] = x < p.q_len ? clamp_col(end - first) : 0;
            } else { /* key x: queries i < q_len, and i >= x when causal */
                b.lo[r] = p.causal ? clamp_col(x - first) : 0;
                b.hi[r] = x < p.kv_len ? clamp_col(p.q_len - first) : 0;
            }
        }
    }
    return b;
}

/* Score s at column c of the lane's row r (query i, key j) in base 2
 * (scaled by sl2) with a K tile's mask applied: -INFINITY where masked. */
template <tile_kind K>
__device__ static inline float score_at(float s, const att_args &a, int64_t mbase, const tile_bounds &b, int r, int c,
                                        int64_t i, int64_t j, float sl2)
{
    const float v = s * sl2;
    if constexpr (K == TILE_BOUNDS) return c >= b.lo[r] && c < b.hi[r] ? v : -INFINITY;
    if constexpr (K == TILE_MASK) {
        const float mt = mask_term(a, mbase, i, j);
        return mt == -INFINITY ? -INFINITY : v + mt * TF_LOG2E;
    }
    return v;
}

/* ---- forward ---- */

template <int DMAX, bool X3>
__global__ static void __launch_bounds__(TF_THREADS) att_tf32_forward_kernel(att_args a)
{
    const int LD = DMAX + 4, NT = DMAX / 8, KT = 64;
    extern __shared__ float4 tf_smem[];
    float *sQ = (float *)tf_smem, *sK = sQ + TF_ROWS * LD, *sV = sK + KT * LD;
    const struct gp_attention_plan &p = a.p;
    int64_t bh = blockIdx.y, i0 = (int64_t)blockIdx.x * TF_ROWS;
    att_base o = base_of(p, bh);
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    int D = (int)p.head_size, Dv = (int)p.v_head_size;
    int64_t row[2] = {i0 + w * 16 + g, i0 + w * 16 + g + 8}; /* the lane's rows: c0, c1 and c2, c3 */
    tf_load<DMAX, TF_ROWS, X3>(sQ, D, a.q, o.q, p.q_stride[2], i0, p.q_len);
    float acc[NT][4], m[2] = {-INFINITY, -INFINITY}, l[2] = {0, 0};
#pragma unroll
    for (int n = 0; n < NT; n++) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0;
    const float sl2 = p.scale * TF_LOG2E;
    int64_t kend = p.kv_len;
    if (p.causal && i0 + TF_ROWS < kend) kend = i0 + TF_ROWS; /* keys past the block's last row are masked */
    for (int64_t k0 = 0; k0 < kend; k0 += KT) {
        __syncthreads();
        tf_load<DMAX, KT, X3>(sK, D, a.k, o.k, p.k_stride[2], k0, p.kv_len);
        tf_load<DMAX, KT, X3>(sV, Dv, a.v, o.v, p.v_stride[2], k0, p.kv_len);
        __syncthreads();
        float s[KT / 8][4];
#pragma unroll
        for (int n = 0; n < KT / 8; n++) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0;
        mma_abt<DMAX, KT / 8, LD, X3>(s, sQ + w * 16 * LD, sK, g, t);
        bool full = p.mask == GP_ATTN_MASK_NONE && k0 + KT <= p.kv_len && (!p.causal || k0 + KT - 1 <= i0);
        float mx[2] = {m[0], m[1]};
        by_kind(kind_of(p, full), [&](auto kind) {
            constexpr tile_kind K = decltype(kind)::value;
            const tile_bounds tb = bounds_of<K, true>(p, row, k0);
#pragma unroll
            for (int n = 0; n < KT / 8; n++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int c = n * 8 + 2 * t + (e & 1);
                    s[n][e] = score_at<K>(s[n][e], a, o.m, tb, e >> 1, c, row[e >> 1], k0 + c, sl2);
                    mx[e >> 1] = fmaxf(mx[e >> 1], s[n][e]);
                }
        });
        float base[2];
#pragma unroll
        for (int r = 0; r < 2; r++) {
            mx[r] = quad_max(mx[r]);
            /* Nothing attended yet: exponents against 0 give 0 (and alpha 0
             * of an accumulator that is 0). */
            base[r] = mx[r] == -INFINITY ? 0.0f : mx[r];
            float alpha = tf_exp2(m[r] - base[r]);
            m[r] = mx[r];
            l[r] *= alpha;
#pragma unroll
            for (int n = 0; n < NT; n++) acc[n][2 * r] *= alpha, acc[n][2 * r + 1] *= alpha;
        }
#pragma unroll
        for (int n = 0; n < KT / 8; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                /* l sums the rounded weights that multiply V: Y is their
                 * weighted mean. */
                float pe = tf_score<X3>(tf_exp2(s[n][e] - base[e >> 1]));
                l[e >> 1] += pe;
                s[n][e] = pe;
            }
        mma_pb<KT / 8, NT, LD, X3>(acc, s, sV, g, t);
    }
    float inv[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        l[r] = quad_sum(l[r]);
        inv[r] = l[r] > 0 ? 1.0f / l[r] : 0.0f;
    }
#pragma unroll
    for (int n = 0; n < NT; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            int64_t i = row[e >> 1];
            int d = n * 8 + 2 * t + (e & 1);
            if (i < p.q_len && d < Dv) gp_st(a.y, o.y + i * p.y_stride[2] + d, acc[n][e] * inv[e >> 1]);
        }
    if (t == 0)
#pragma unroll
        for (int r = 0; r < 2; r++)
            if (row[r] < p.q_len) a.lse[bh * p.q_len + row[r]] = l[r] > 0 ? (m[r] + log2f(l[r])) * TF_LN2 : -INFINITY;
}

/* ---- backward ---- */

template <int DMAX, bool X3>
__global__ static void __launch_bounds__(TF_THREADS, DMAX > 64 ? 2 : 3) att_tf32_dq_kernel(att_args a)
{
    const int LD = DMAX + 4, NT = DMAX / 8, KT = tf_walk<DMAX>::n;
    extern __shared__ float4 tf_smem[];
    float *sQ = (float *)tf_smem, *sdY = sQ + TF_ROWS * LD, *sK = sdY + TF_ROWS * LD, *sV = sK + KT * LD;
    const struct gp_attention_plan &p = a.p;
    int64_t bh = blockIdx.y, i0 = (int64_t)blockIdx.x * TF_ROWS;
    att_base o = base_of(p, bh);
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    int D = (int)p.head_size, Dv = (int)p.v_head_size;
    int64_t row[2] = {i0 + w * 16 + g, i0 + w * 16 + g + 8};
    tf_load<DMAX, TF_ROWS, X3>(sQ, D, a.q, o.q, p.q_stride[2], i0, p.q_len);
    tf_load<DMAX, TF_ROWS, X3>(sdY, Dv, a.dy, o.y, p.y_stride[2], i0, p.q_len);
    float lse2[2], dsum[2], dq[NT][4];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        lse2[r] = lse2_of(a, bh, row[r]);
        dsum[r] = row[r] < p.q_len ? a.dsum[bh * p.q_len + row[r]] : 0.0f;
    }
#pragma unroll
    for (int n = 0; n < NT; n++) dq[n][0] = dq[n][1] = dq[n][2] = dq[n][3] = 0;
    const float sl2 = p.scale * TF_LOG2E;
    int64_t kend = p.kv_len;
    if (p.causal && i0 + TF_ROWS < kend) kend = i0 + TF_ROWS;
    for (int64_t k0 = 0; k0 < kend; k0 += KT) {
        __syncthreads();
        tf_load<DMAX, KT, X3>(sK, D, a.k, o.k, p.k_stride[2], k0, p.kv_len);
        tf_load<DMAX, KT, X3>(sV, Dv, a.v, o.v, p.v_stride[2], k0, p.kv_len);
        __syncthreads();
        float s[KT / 8][4], dp[KT / 8][4];
#pragma unroll
        for (int n = 0; n < KT / 8; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) s[n][e] = dp[n][e] = 0;
        mma_abt<DMAX, KT / 8, LD, X3>(s, sQ + w * 16 * LD, sK, g, t);
        mma_abt<DMAX, KT / 8, LD, X3>(dp, sdY + w * 16 * LD, sV, g, t);
        bool full = p.mask == GP_ATTN_MASK_NONE && k0 + KT <= p.kv_len && (!p.causal || k0 + KT - 1 <= i0);
        by_kind(kind_of(p, full), [&](auto kind) {
            constexpr tile_kind K = decltype(kind)::value;
            const tile_bounds tb = bounds_of<K, true>(p, row, k0);
#pragma unroll
            for (int n = 0; n < KT / 8; n++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int c = n * 8 + 2 * t + (e & 1);
                    float v = score_at<K>(s[n][e], a, o.m, tb, e >> 1, c, row[e >> 1], k0 + c, sl2);
                    float pe = tf_exp2(v - lse2[e >> 1]);
                    s[n][e] = tf_score<X3>(pe * (dp[n][e] - dsum[e >> 1])); /* dS */
                }
        });
        mma_pb<KT / 8, NT, LD, X3>(dq, s, sK, g, t);
    }
    if (!a.dq.p) return;
#pragma unroll
    for (int n = 0; n < NT; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            int64_t i = row[e >> 1];
            int d = n * 8 + 2 * t + (e & 1);
            if (i < p.q_len && d < D) put_grad(a.dq, o.q + i * p.q_stride[2] + d, dq[n][e] * p.scale, a.ow_q);
        }
}

template <int DMAX, bool X3>
__global__ static void __launch_bounds__(TF_THREADS, DMAX > 64 ? 2 : 3) att_tf32_dkv_kernel(att_args a)
{
    const int LD = DMAX + 4, NT = DMAX / 8, QT = tf_walk<DMAX>::n;
    extern __shared__ float4 tf_smem[];
    float *sK = (float *)tf_smem, *sV = sK + TF_ROWS * LD, *sQ = sV + TF_ROWS * LD, *sdY = sQ + QT * LD;
    float *sL = sdY + QT * LD, *sD = sL + QT;
    const struct gp_attention_plan &p = a.p;
    int64_t bh = blockIdx.y, j0 = (int64_t)blockIdx.x * TF_ROWS;
    att_base o = base_of(p, bh);
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    int D = (int)p.head_size, Dv = (int)p.v_head_size;
    int64_t key[2] = {j0 + w * 16 + g, j0 + w * 16 + g + 8}; /* the lane's keys: rows of S^T */
    tf_load<DMAX, TF_ROWS, X3>(sK, D, a.k, o.k, p.k_stride[2], j0, p.kv_len);
    tf_load<DMAX, TF_ROWS, X3>(sV, Dv, a.v, o.v, p.v_stride[2], j0, p.kv_len);
    float dk[NT][4], dv[NT][4];
#pragma unroll
    for (int n = 0; n < NT; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) dk[n][e] = dv[n][e] = 0;
    const float sl2 = p.scale * TF_LOG2E;
    /* Causal: queries before the block's first key attend to none of it. */
    int64_t qstart = p.causal ? j0 : 0;
    for (int64_t q0 = qstart; q0 < p.q_len; q0 += QT) {
        __syncthreads();
        tf_load<DMAX, QT, X3>(sQ, D, a.q, o.q, p.q_stride[2], q0, p.q_len);
        tf_load<DMAX, QT, X3>(sdY, Dv, a.dy, o.y, p.y_stride[2], q0, p.q_len);
        if (threadIdx.x < QT) {
            int64_t i = q0 + threadIdx.x;
            sL[threadIdx.x] = lse2_of(a, bh, i);
            sD[threadIdx.x] = i < p.q_len ? a.dsum[bh * p.q_len + i] : 0.0f;
        }
        __syncthreads();
        float st[QT / 8][4], dpt[QT / 8][4];
#pragma unroll
        for (int n = 0; n < QT / 8; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) st[n][e] = dpt[n][e] = 0;
        mma_abt<DMAX, QT / 8, LD, X3>(st, sK + w * 16 * LD, sQ, g, t);
        mma_abt<DMAX, QT / 8, LD, X3>(dpt, sV + w * 16 * LD, sdY, g, t);
        bool full = p.mask == GP_ATTN_MASK_NONE && j0 + TF_ROWS <= p.kv_len && q0 + QT <= p.q_len &&
                    (!p.causal || j0 + TF_ROWS - 1 <= q0);
        by_kind(kind_of(p, full), [&](auto kind) {
            constexpr tile_kind K = decltype(kind)::value;
            const tile_bounds tb = bounds_of<K, false>(p, key, q0);
#pragma unroll
            for (int n = 0; n < QT / 8; n++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    int c = n * 8 + 2 * t + (e & 1); /* the query within the tile */
                    float v = score_at<K>(st[n][e], a, o.m, tb, e >> 1, c, q0 + c, key[e >> 1], sl2);
                    float pe = tf_exp2(v - sL[c]);
                    st[n][e] = tf_score<X3>(pe);                        /* P^T */
                    dpt[n][e] = tf_score<X3>(pe * (dpt[n][e] - sD[c])); /* dS^T */
                }
        });
        mma_pb<QT / 8, NT, LD, X3>(dv, st, sdY, g, t);
        mma_pb<QT / 8, NT, LD, X3>(dk, dpt, sQ, g, t);
    }
#pragma unroll
    for (int n = 0; n < NT; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            int64_t j = key[e >> 1];
            int d = n * 8 + 2 * t + (e & 1);
            if (j >= p.kv_len) continue;
            if (a.dk.p && d < D) put_grad(a.dk, o.k + j * p.k_stride[2] + d, dk[n][e] * p.scale, a.ow_k);
            if (a.dv.p && d < Dv) put_grad(a.dv, o.v + j * p.v_stride[2] + d, dv[n][e], a.ow_v);
        }
}

/* ---- host side ---- */

/* Dynamic shared memory per block (over the 48 KB a launch gets without
 * asking): forward Q, K, V tiles; dQ Q, dY (64 rows) and K, V (walked);
 * dK / dV K, V (64 rows), Q, dY (walked), lse and D. */
template <int DMAX> static size_t fwd_smem() { return sizeof(float) * (DMAX + 4) * (TF_ROWS + 2 * 64); }
template <int DMAX> static size_t dq_smem()
{
    return sizeof(float) * (DMAX + 4) * (2 * TF_ROWS + 2 * tf_walk<DMAX>::n);
}
template <int DMAX> static size_t dkv_smem()
{
    return sizeof(float) * ((DMAX + 4) * (2 * TF_ROWS + 2 * tf_walk<DMAX>::n) + 2 * tf_walk<DMAX>::n);
}

/* The kernel may take `bytes` of shared memory: set per launch (cheap,
 * and per device, which a process-wide flag would not be). */
template <typename K> static cudaError_t allow_smem(K kernel, size_t bytes)
{
    return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes);
}

static unsigned blocks(int64_t n) { return (unsigned)((n + TF_ROWS - 1) / TF_ROWS); }

template <int DMAX, bool X3> static cudaError_t forward_launch(const att_args &a, cudaStream_t stream)
{
    size_t smem = fwd_smem<DMAX>();
    cudaError_t e = allow_smem(att_tf32_forward_kernel<DMAX, X3>, smem);
    if (e != cudaSuccess) return e;
    dim3 grid(blocks(a.p.q_len), (unsigned)(a.p.batch * a.p.heads));
    att_tf32_forward_kernel<DMAX, X3><<<grid, TF_THREADS, smem, stream>>>(a);
    return cudaSuccess;
}

template <int DMAX, bool X3> static cudaError_t backward_launch(const att_args &a, cudaStream_t stream)
{
    unsigned bh = (unsigned)(a.p.batch * a.p.heads);
    if (a.dq.p) {
        size_t smem = dq_smem<DMAX>();
        cudaError_t e = allow_smem(att_tf32_dq_kernel<DMAX, X3>, smem);
        if (e != cudaSuccess) return e;
        att_tf32_dq_kernel<DMAX, X3><<<dim3(blocks(a.p.q_len), bh), TF_THREADS, smem, stream>>>(a);
    }
    if ((a.dk.p || a.dv.p) && a.p.kv_len > 0) {
        size_t smem = dkv_smem<DMAX>();
        cudaError_t e = allow_smem(att_tf32_dkv_kernel<DMAX, X3>, smem);
        if (e != cudaSuccess) return e;
        att_tf32_dkv_kernel<DMAX, X3><<<dim3(blocks(a.p.kv_len), bh), TF_THREADS, smem, stream>>>(a);
    }
    return cudaSuccess;
}

cudaError_t att_tf32_forward(const att_args &a, int dmax, bool x3, cudaStream_t stream)
{
    if (x3) return dmax == 64 ? forward_launch<64, true>(a, stream) : forward_launch<128, true>(a, stream);
    return dmax == 64 ? forward_launch<64, false>(a, stream) : forward_launch<128, false>(a, stream);
}

cudaError_t att_tf32_backward(const att_args &a, int dmax, bool x3, cudaStream_t stream)
{
    if (x3) return dmax == 64 ? backward_launch<64, true>(a, stream) : backward_launch<128, true>(a, stream);
    return dmax == 64 ? backward_launch<64, false>(a, stream) : backward_launch<128, false>(a, stream);
}
