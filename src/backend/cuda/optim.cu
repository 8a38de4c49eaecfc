/* Device-side optimizer updates of a training step, twins of train/optim.c,
 * and the buffer operations around them (accumulate, per-tensor norms for
 * gradient clipping). See cuda/train_kernels.h for the contracts.
 *
 * One fused kernel per optimizer kind over all parameter tensors
 * (multi-tensor: a list of up to MT_TENSORS tensors goes by value as the
 * kernel's argument, one block per chunk of MT_CHUNK elements, a block
 * finding its tensor by binary search; more tensors take more launches:
 * ResNet-50's 161 take three). Per element it does exactly the float32 operations of
 * gp_sgd_update / gp_adamw_update: the CPU's fmaf are __fmaf_rn here, every
 * other product, sum, quotient and square root is spelled __fmul_rn,
 * __fadd_rn, __fsub_rn, __fdiv_rn, __fsqrt_rn, which nvcc never contracts or
 * approximates, so parameters and state are bit-identical to the CPU build's
 * (gcc -std=c11 does not contract either; its fmaf is exact). The scalars
 * (bias corrections, decay factors) are computed on the host in double
 * exactly as optim.c computes them (gp_optim_scalars_for) and read by the
 * kernels from device memory (struct gp_optim_scalars), so a captured step
 * replays with each step's. With the clipping coefficient below 1 the
 * gradient is first multiplied by it in float32, gp_scale_grads' operation,
 * and the clipped gradient is stored back, as clip_grad_norm_ leaves it. A
 * step whose guard set `skip` (the loss or the norm is not finite) changes
 * nothing.
 *
 * The guard (gp_cuda_optim_guard): the clipping coefficient and the skip
 * flag computed on the device from the gathered norms and the losses, bit
 * for bit gp_optim_guard's, so no value of the step has to visit the host.
 *
 * Norms: `tensors` and `numels` are host arrays (of device pointers), `out`
 * device memory. One thread block cluster (Hopper) of NORM_CLUSTER blocks
 * per tensor, double sums in a fixed order, so large tensors are read by
 * several multiprocessors without scratch memory.
 *
 * No function synchronizes or allocates; every launch is checked and a
 * failure names the function and the kernel. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include "backend/cuda/kernel_util.cuh"
#include "backend/cuda/train_kernels.h"

namespace cg = cooperative_groups;

/* ---- optimizers ---- */

#define MT_TENSORS 64
#define MT_CHUNK 16384 /* elements per block; a multiple of 4 */
#define MT_THREADS 256

/* The tensors of one launch, passed by value (kernel parameters are limited
 * to 4 KiB): tensor t takes blocks [first_block[t], first_block[t + 1]), one
 * chunk of MT_CHUNK elements each. */
struct mt_list {
    float *p[MT_TENSORS], *g[MT_TENSORS], *s0[MT_TENSORS], *s1[MT_TENSORS];
    int64_t n[MT_TENSORS];
    int32_t first_block[MT_TENSORS + 1];
    int32_t count;
    uint8_t vec[MT_TENSORS]; /* every pointer of the tensor 16-byte aligned */
};

static_assert(sizeof(struct mt_list) + sizeof(void *) <= 4000,
              "multi-tensor kernel arguments must fit CUDA's 4 KiB parameter space");

/* gp_scale_grads' g * coef, stored back as clip_grad_norm_ does. */
__device__ static inline float clipped(bool clip, float coef, float &g)
{
    if (clip) g = __fmul_rn(g, coef);
    return g;
}

/* optim.c's sgd_kernel, one element. */
__device__ static inline float sgd_elem(const gp_optim_scalars &s, bool clip, float p, float &g, float &buf)
{
    float d = clipped(clip, s.coef, g);
    if (s.has_wd) d = __fmaf_rn(p, s.wd, d);
    if (s.has_mom) {
        const float b = s.first ? d : __fmaf_rn(d, s.damp1, __fmul_rn(buf, s.mom));
        buf = b;
        d = s.nesterov ? __fmaf_rn(b, s.mom, d) : b;
    }
    return __fmaf_rn(d, s.neg_lr, p);
}

/* optim.c's adamw_kernel, one element. */
__device__ static inline float adamw_elem(const gp_optim_scalars &s, bool clip, float p, float &g, float &m,
                                          float &v)
{
    const float pi = __fmul_rn(p, s.decay);
    const float gi = clipped(clip, s.coef, g);
    float mi;
    if (s.lerp) {
        const float diff = __fsub_rn(gi, m);
        mi = s.lerp_small ? __fmaf_rn(s.a1, diff, m) : __fmaf_rn(s.a1m1, diff, gi);
    } else {
        mi = __fmaf_rn(gi, s.a1, __fmul_rn(m, s.b1));
    }
    const float vi = __fmaf_rn(__fmul_rn(s.a2, gi), gi, __fmul_rn(v, s.b2));
    m = mi;
    v = vi;
    const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(vi), s.bc2_sqrt), s.eps);
    return __fadd_rn(pi, __fdiv_rn(__fmul_rn(s.neg_step, mi), denom));
}

template <bool ADAMW>
__device__ static inline void optim_elem(const gp_optim_scalars &s, bool clip, float *p, float *g, float *s0,
                                         float *s1, int64_t i)
{
    float gi = g[i], pi = p[i];
    if (ADAMW) {
        float m = s0[i], v = s1[i];
        p[i] = adamw_elem(s, clip, pi, gi, m, v);
        s0[i] = m;
        s1[i] = v;
    } else {
        float b = 0.0f;
        if (s.has_mom && !s.first) b = s0[i];
        p[i] = sgd_elem(s, clip, pi, gi, b);
        if (s.has_mom) s0[i] = b;
    }
    if (clip) g[i] = gi;
}

/* The step's scalars come from device memory (S), read when the kernel
 * runs: a replayed graph takes each step's learning rate, bias
 * corrections and clipping coefficient. A step the guard marked to skip
 * changes nothing. */
template <bool ADAMW>
__global__ void __launch_bounds__(MT_THREADS) optim_kernel(const __grid_constant__ mt_list L,
                                                           const gp_optim_scalars *__restrict__ S)
{
    const gp_optim_scalars s = *S;
    if (s.skip) return;
    /* gp_optim_apply's condition (the guard gives at most 1, and a NaN
     * only with a norm that is not finite: skipped above) */
    const bool clip = s.coef < 1.0f;
    /* the tensor of this block: the last t with first_block[t] <= block */
    const int32_t b = (int32_t)blockIdx.x;
    int lo = 0, hi = L.count - 1;
    while (lo < hi) {
        const int mid = (lo + hi + 1) >> 1;
        if (L.first_block[mid] <= b) lo = mid;
        else hi = mid - 1;
    }
    const int t = lo;
    const int64_t start = (int64_t)(b - L.first_block[t]) * MT_CHUNK;
    const int64_t rest = L.n[t] - start, len = rest < MT_CHUNK ? rest : MT_CHUNK;
    float *p = L.p[t] + start, *g = L.g[t] + start;
    float *s0 = L.s0[t] ? L.s0[t] + start : NULL, *s1 = L.s1[t] ? L.s1[t] + start : NULL;
    int64_t done = 0;
    if (L.vec[t]) {
        /* start is a multiple of 4: the chunk stays aligned */
        float4 *p4 = reinterpret_cast<float4 *>(p), *g4 = reinterpret_cast<float4 *>(g);
        float4 *a4 = reinterpret_cast<float4 *>(s0), *b4 = reinterpret_cast<float4 *>(s1);
        const int len4 = (int)(len >> 2);
#pragma unroll 4
        for (int j = threadIdx.x; j < len4; j += MT_THREADS) {
            float4 pv = p4[j], gv = g4[j];
            if (ADAMW) {
                float4 mv = a4[j], vv = b4[j];
                pv.x = adamw_elem(s, clip, pv.x, gv.x, mv.x, vv.x);
                pv.y = adamw_elem(s, clip, pv.y, gv.y, mv.y, vv.y);
                pv.z = adamw_elem(s, clip, pv.z, gv.z, mv.z, vv.z);
                pv.w = adamw_elem(s, clip, pv.w, gv.w, mv.w, vv.w);
                a4[j] = mv;
                b4[j] = vv;
            } else {
                float4 bv = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                if (s.has_mom && !s.first) bv = a4[j];
                pv.x = sgd_elem(s, clip, pv.x, gv.x, bv.x);
                pv.y = sgd_elem(s, clip, pv.y, gv.y, bv.y);
                pv.z = sgd_elem(s, clip, pv.z, gv.z, bv.z);
                pv.w = sgd_elem(s, clip, pv.w, gv.w, bv.w);
                if (s.has_mom) a4[j] = bv;
            }
            p4[j] = pv;
            if (clip) g4[j] = gv;
        }
        done = (int64_t)len4 << 2;
    }
    for (int64_t i = done + threadIdx.x; i < len; i += MT_THREADS) optim_elem<ADAMW>(s, clip, p, g, s0, s1, i);
}

static gp_status launch_optim(cudaStream_t stream, bool adamw, const mt_list &L, unsigned blocks,
                              const gp_optim_scalars *scalars, struct gp_error *err)
{
    if (adamw) {
        optim_kernel<true><<<blocks, MT_THREADS, 0, stream>>>(L, scalars);
        return gp_cuda_launched("gp_cuda_optim_step", "optim_kernel<adamw>", err);
    }
    optim_kernel<false><<<blocks, MT_THREADS, 0, stream>>>(L, scalars);
    return gp_cuda_launched("gp_cuda_optim_step", "optim_kernel<sgd>", err);
}

extern "C" gp_status gp_cuda_optim_step(cudaStream_t stream, const struct gp_optim *opt,
                                        const struct gp_optim_scalars *scalars, struct gp_error *err)
{
    static const char fn[] = "gp_cuda_optim_step";
    const struct gp_optim_config *c = &opt->cfg;
    if (c->kind != GP_OPTIM_SGD && c->kind != GP_OPTIM_ADAMW)
        return gp_error_set(err, GP_ERR_INVALID, "%s: unknown optimizer kind %d", fn, (int)c->kind);
    if (!scalars) return gp_error_set(err, GP_ERR_INVALID, "%s: no scalars", fn);
    const bool adamw = c->kind == GP_OPTIM_ADAMW;
    /* Which state tensors the kernels touch is the configuration's, known
     * here; every value that changes from step to step is in *scalars. */
    const bool need0 = adamw || c->momentum != 0.0, need1 = adamw;

    mt_list L;
    memset(&L, 0, sizeof L);
    int nt = 0;
    int64_t nb = 0;
    for (int i = 0; i < opt->n_params; i++) {
        const struct gp_param *q = &opt->params[i];
        const int64_t n = q->numel;
        if (n <= 0) continue;
        float *s0 = need0 ? opt->state[0][i] : NULL, *s1 = need1 ? opt->state[1][i] : NULL;
        if (!q->data || !q->grad || (need0 && !s0) || (need1 && !s1))
            return gp_error_set(err, GP_ERR_INVALID, "%s: parameter '%s' has no %s", fn,
                                q->name ? q->name : "?",
                                !q->data ? "data" : !q->grad ? "gradient" : "optimizer state");
        const int64_t chunks = (n + MT_CHUNK - 1) / MT_CHUNK;
        if (chunks > INT32_MAX / 2)
            return gp_error_set(err, GP_ERR_UNSUPPORTED, "%s: parameter '%s' has too many elements (%lld)", fn,
                                q->name ? q->name : "?", (long long)n);
        if (nt == MT_TENSORS || nb + chunks > INT32_MAX) {
            L.count = nt;
            L.first_block[nt] = (int32_t)nb;
            GP_TRY(launch_optim(stream, adamw, L, (unsigned)nb, scalars, err));
            nt = 0;
            nb = 0;
        }
        L.p[nt] = q->data;
        L.g[nt] = q->grad;
        L.s0[nt] = s0;
        L.s1[nt] = s1;
        L.n[nt] = n;
        L.vec[nt] = gp_cuda_aligned16(q->data) && gp_cuda_aligned16(q->grad) && (!s0 || gp_cuda_aligned16(s0)) &&
                    (!s1 || gp_cuda_aligned16(s1));
        L.first_block[nt] = (int32_t)nb;
        nt++;
        nb += chunks;
    }
    if (nt > 0) {
        L.count = nt;
        L.first_block[nt] = (int32_t)nb;
        GP_TRY(launch_optim(stream, adamw, L, (unsigned)nb, scalars, err));
    }
    return GP_OK;
}

/* ---- the step's guard ----
 * gp_optim_guard on one thread, operation for operation: the loss parts
 * added in order from 0 in double, divided by the denominator; gp_norm2_f32
 * of the gathered norms (8 lanes of fused multiply-adds, the lanes added
 * left to right, the tail's first four squares rounded before their adds
 * and the rest fused, a square root); gp_clip_coef's reciprocal times
 * max_norm, clamped to 1. Every operation is a correctly rounded one
 * spelled with its _rn intrinsic, so the bits are the host's. A few
 * hundred norms at most: one thread is microseconds, once per step. */
__global__ void optim_guard_kernel(const float *__restrict__ norms, const int32_t *__restrict__ order, int n,
                                   const double *__restrict__ loss_parts, int m, gp_optim_scalars *s)
{
    if (blockIdx.x != 0 || threadIdx.x != 0) return;
    double sum = 0.0;
    for (int j = 0; j < m; j++) sum = __dadd_rn(sum, loss_parts[j]);
    bool finite = isfinite(__ddiv_rn(sum, s->denominator));
    float total = 0.0f, coef = 1.0f;
    if (s->max_norm > 0.0) {
        float lane[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
        const int n8 = n - n % 8;
        for (int d = 0; d < n8; d += 8) {
#pragma unroll
            for (int j = 0; j < 8; j++) {
                const float v = norms[order[d + j]];
                lane[j] = __fmaf_rn(v, v, lane[j]);
            }
        }
        float acc = lane[0];
#pragma unroll
        for (int j = 1; j < 8; j++) acc = __fadd_rn(acc, lane[j]);
        const int t = n - n8;
        int k = 0;
        if (t >= 4)
            for (; k < 4; k++) {
                const float v = norms[order[n8 + k]];
                acc = __fadd_rn(acc, __fmul_rn(v, v));
            }
        for (; k < t; k++) {
            const float v = norms[order[n8 + k]];
            acc = __fmaf_rn(v, v, acc);
        }
        total = __fsqrt_rn(acc);
        const float shifted = __fadd_rn(total, (float)1e-6);
        coef = __fmul_rn(__fdiv_rn(1.0f, shifted), __double2float_rn(s->max_norm));
        if (coef > 1.0f) coef = 1.0f;
        finite = finite && isfinite(total);
    }
    s->total_norm = total;
    s->coef = coef;
    s->skip = !finite;
}

extern "C" gp_status gp_cuda_optim_guard(cudaStream_t stream, const float *norms, const int32_t *order, int n,
                                         const double *loss_parts, int m, struct gp_optim_scalars *scalars,
                                         struct gp_error *err)
{
    static const char fn[] = "gp_cuda_optim_guard";
    if (n < 0 || m < 0) return gp_error_set(err, GP_ERR_INVALID, "%s: negative count (%d norms, %d losses)", fn, n, m);
    if (!scalars) return gp_error_set(err, GP_ERR_INVALID, "%s: no scalars", fn);
    optim_guard_kernel<<<1, 1, 0, stream>>>(norms, order, n, loss_parts, m, scalars);
    return gp_cuda_launched(fn, "optim_guard_kernel", err);
}

/* ---- buffers ---- */

template <bool VEC>
__global__ void __launch_bounds__(GP_CUDA_THREADS) accumulate_kernel(float *dst, const float *src, int64_t n)
{
    int64_t done = 0;
    if (VEC) {
        float4 *d4 = reinterpret_cast<float4 *>(dst);
        const float4 *s4 = reinterpret_cast<const float4 *>(src);
        const int64_t n4 = n >> 2;
        GP_GRID_STRIDE(j, n4) {
            float4 d = d4[j];
            const float4 v = s4[j];
            d.x = __fadd_rn(d.x, v.x);
            d.y = __fadd_rn(d.y, v.y);
            d.z = __fadd_rn(d.z, v.z);
            d.w = __fadd_rn(d.w, v.w);
            d4[j] = d;
        }
        done = n4 << 2;
    }
    GP_GRID_STRIDE(k, n - done) dst[done + k] = __fadd_rn(dst[done + k], src[done + k]);
}

extern "C" gp_status gp_cuda_accumulate(cudaStream_t stream, float *dst, const float *src, int64_t n,
                                        struct gp_error *err)
{
    static const char fn[] = "gp_cuda_accumulate";
    if (n < 0) return gp_error_set(err, GP_ERR_INVALID, "%s: negative element count %lld", fn, (long long)n);
    if (n == 0) return GP_OK;
    if (gp_cuda_aligned16(dst) && gp_cuda_aligned16(src)) {
        accumulate_kernel<true><<<gp_cuda_blocks_for(n / 4), GP_CUDA_THREADS, 0, stream>>>(dst, src, n);
        return gp_cuda_launched(fn, "accumulate_kernel<vec>", err);
    }
    accumulate_kernel<false><<<gp_cuda_blocks_for(n), GP_CUDA_THREADS, 0, stream>>>(dst, src, n);
    return gp_cuda_launched(fn, "accumulate_kernel", err);
}

#define NORM_TENSORS 192 /* per launch: 192 * 16 bytes of arguments */
#define NORM_CLUSTER 8    /* blocks per tensor, one thread block cluster */
#define NORM_THREADS 512
#define NORM_U 4          /* float4 loads in flight per thread */

struct norm_list {
    const float *x[NORM_TENSORS];
    int64_t n[NORM_TENSORS];
};

static_assert(sizeof(struct norm_list) + sizeof(float *) <= 4000,
              "norm kernel arguments must fit CUDA's 4 KiB parameter space");

/* One cluster of NORM_CLUSTER blocks per tensor (Hopper's thread block
 * clusters: the blocks' sums meet in distributed shared memory, so a large
 * tensor is read by several multiprocessors without a scratch buffer).
 * Each thread sums x*x in double over a fixed set of elements, each block
 * in a fixed tree, and the cluster's first block adds the blocks' sums in
 * rank order. */
__global__ void __cluster_dims__(NORM_CLUSTER, 1, 1) __launch_bounds__(NORM_THREADS)
    norms_kernel(const __grid_constant__ norm_list L, float *out)
{
    __shared__ double sh[32];
    __shared__ double block_total;
    cg::cluster_group cluster = cg::this_cluster();
    const int64_t rank = cluster.block_rank();
    const int t = blockIdx.x / NORM_CLUSTER;
    const float *x = L.x[t];
    const int64_t n = L.n[t], stride = (int64_t)NORM_CLUSTER * NORM_THREADS;
    const int64_t first = rank * NORM_THREADS + threadIdx.x;
    double s = 0.0;
    int64_t done = 0;
    if (((uintptr_t)x & 15u) == 0) {
        const float4 *x4 = reinterpret_cast<const float4 *>(x);
        const int64_t n4 = n >> 2;
        for (int64_t j0 = first; j0 < n4; j0 += NORM_U * stride) {
            float4 q[NORM_U];
#pragma unroll
            for (int u = 0; u < NORM_U; u++)
                q[u] = j0 + u * stride < n4 ? x4[j0 + u * stride] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
            for (int u = 0; u < NORM_U; u++) {
                s = fma((double)q[u].x, (double)q[u].x, s);
                s = fma((double)q[u].y, (double)q[u].y, s);
                s = fma((double)q[u].z, (double)q[u].z, s);
                s = fma((double)q[u].w, (double)q[u].w, s);
            }
        }
        done = n4 << 2;
    }
    for (int64_t i = done + first; i < n; i += stride) s = fma((double)x[i], (double)x[i], s);
    s = gp_dev_block_sum0(s, sh);
    if (threadIdx.x == 0) block_total = s;
    cluster.sync();
    if (rank == 0 && threadIdx.x == 0) {
        double total = 0.0;
        for (unsigned k = 0; k < NORM_CLUSTER; k++) total += *cluster.map_shared_rank(&block_total, k);
        out[t] = (float)sqrt(total);
    }
    cluster.sync(); /* the other blocks' shared memory must outlive the reads */
}

extern "C" gp_status gp_cuda_norms(cudaStream_t stream, const float *const *tensors, const int64_t *numels,
                                   int count, float *out, struct gp_error *err)
{
    static const char fn[] = "gp_cuda_norms";
    if (count < 0) return gp_error_set(err, GP_ERR_INVALID, "%s: negative tensor count %d", fn, count);
    for (int base = 0; base < count; base += NORM_TENSORS) {
        const int m = count - base < NORM_TENSORS ? count - base : NORM_TENSORS;
        norm_list L;
        memset(&L, 0, sizeof L);
        for (int k = 0; k < m; k++) {
            const int64_t n = numels[base + k];
            if (n < 0 || (n > 0 && !tensors[base + k]))
                return gp_error_set(err, GP_ERR_INVALID, "%s: tensor %d has %s", fn, base + k,
                                    n < 0 ? "a negative element count" : "no data");
            L.x[k] = tensors[base + k];
            L.n[k] = n;
        }
        norms_kernel<<<m * NORM_CLUSTER, NORM_THREADS, 0, stream>>>(L, out + base);
        GP_TRY(gp_cuda_launched(fn, "norms_kernel", err));
    }
    return GP_OK;
}
