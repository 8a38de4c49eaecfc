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
 * exactly as optim.c computes them. With clip_coef below 1 (or NaN, which
 * gp_clip_coef can return) the gradient is first multiplied by it in float32,
 * gp_scale_grads' operation, and the clipped gradient is stored back, as
 * clip_grad_norm_ leaves it; clip_coef >= 1 leaves gradients untouched.
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

/* optim.c's sgd_scalars and adamw_scalars, and the clipping. */
struct optim_scalars {
    float coef;
    bool clip;
    /* SGD */
    float wd, mom, damp1, neg_lr;
    bool has_wd, has_mom, nesterov, first;
    /* AdamW */
    float decay, b1, a1, a1m1, b2, a2, bc2_sqrt, neg_step, eps;
    bool lerp, lerp_small;
};

static_assert(sizeof(struct mt_list) + sizeof(struct optim_scalars) <= 4000,
              "multi-tensor kernel arguments must fit CUDA's 4 KiB parameter space");

/* gp_scale_grads' g * coef, stored back as clip_grad_norm_ does. */
__device__ static inline float clipped(const optim_scalars &s, float &g)
{
    if (s.clip) g = __fmul_rn(g, s.coef);
    return g;
}

/* optim.c's sgd_kernel, one element. */
__device__ static inline float sgd_elem(const optim_scalars &s, float p, float &g, float &buf)
{
    float d = clipped(s, g);
    if (s.has_wd) d = __fmaf_rn(p, s.wd, d);
    if (s.has_mom) {
        const float b = s.first ? d : __fmaf_rn(d, s.damp1, __fmul_rn(buf, s.mom));
        buf = b;
        d = s.nesterov ? __fmaf_rn(b, s.mom, d) : b;
    }
    return __fmaf_rn(d, s.neg_lr, p);
}

/* optim.c's adamw_kernel, one element. */
__device__ static inline float adamw_elem(const optim_scalars &s, float p, float &g, float &m, float &v)
{
    const float pi = __fmul_rn(p, s.decay);
    const float gi = clipped(s, g);
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
__device__ static inline void optim_elem(const optim_scalars &s, float *p, float *g, float *s0, float *s1,
                                         int64_t i)
{
    float gi = g[i], pi = p[i];
    if (ADAMW) {
        float m = s0[i], v = s1[i];
        p[i] = adamw_elem(s, pi, gi, m, v);
        s0[i] = m;
        s1[i] = v;
    } else {
        float b = 0.0f;
        if (s.has_mom && !s.first) b = s0[i];
        p[i] = sgd_elem(s, pi, gi, b);
        if (s.has_mom) s0[i] = b;
    }
    if (s.clip) g[i] = gi;
}

template <bool ADAMW>
__global__ void __launch_bounds__(MT_THREADS) optim_kernel(const __grid_constant__ mt_list L,
                                                           const __grid_constant__ optim_scalars s)
{
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
                pv.x = adamw_elem(s, pv.x, gv.x, mv.x, vv.x);
                pv.y = adamw_elem(s, pv.y, gv.y, mv.y, vv.y);
                pv.z = adamw_elem(s, pv.z, gv.z, mv.z, vv.z);
                pv.w = adamw_elem(s, pv.w, gv.w, mv.w, vv.w);
                a4[j] = mv;
                b4[j] = vv;
            } else {
                float4 bv = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                if (s.has_mom && !s.first) bv = a4[j];
                pv.x = sgd_elem(s, pv.x, gv.x, bv.x);
                pv.y = sgd_elem(s, pv.y, gv.y, bv.y);
                pv.z = sgd_elem(s, pv.z, gv.z, bv.z);
                pv.w = sgd_elem(s, pv.w, gv.w, bv.w);
                if (s.has_mom) a4[j] = bv;
            }
            p4[j] = pv;
            if (s.clip) g4[j] = gv;
        }
        done = (int64_t)len4 << 2;
    }
    for (int64_t i = done + threadIdx.x; i < len; i += MT_THREADS) optim_elem<ADAMW>(s, p, g, s0, s1, i);
}

static gp_status launch_optim(cudaStream_t stream, bool adamw, const mt_list &L, unsigned blocks,
                              const optim_scalars &s, struct gp_error *err)
{
    if (adamw) {
        optim_kernel<true><<<blocks, MT_THREADS, 0, stream>>>(L, s);
        return gp_cuda_launched("gp_cuda_optim_step", "optim_kernel<adamw>", err);
    }
    optim_kernel<false><<<blocks, MT_THREADS, 0, stream>>>(L, s);
    return gp_cuda_launched("gp_cuda_optim_step", "optim_kernel<sgd>", err);
}

extern "C" gp_status gp_cuda_optim_step(cudaStream_t stream, struct gp_optim *opt, double lr, float clip_coef,
                                        struct gp_error *err)
{
    static const char fn[] = "gp_cuda_optim_step";
    const struct gp_optim_config *c = &opt->cfg;
    if (c->kind != GP_OPTIM_SGD && c->kind != GP_OPTIM_ADAMW)
        return gp_error_set(err, GP_ERR_INVALID, "%s: unknown optimizer kind %d", fn, (int)c->kind);
    const bool adamw = c->kind == GP_OPTIM_ADAMW;
    opt->steps++;

    optim_scalars s;
    memset(&s, 0, sizeof s);
    /* gp_scale_grads multiplies unless coef is exactly 1; gp_clip_coef gives
     * at most 1 (or NaN, which must poison the gradients as on the CPU) */
    s.clip = !(clip_coef >= 1.0f);
    s.coef = clip_coef;
    if (!adamw) {
        /* gp_sgd_update's */
        s.wd = (float)c->weight_decay;
        s.mom = (float)c->momentum;
        s.damp1 = (float)(1.0 - c->dampening);
        s.neg_lr = (float)(-lr);
        s.has_wd = c->weight_decay != 0.0;
        s.has_mom = c->momentum != 0.0;
        s.nesterov = c->nesterov;
        s.first = opt->steps == 1;
    } else {
        /* gp_adamw_update's, in the same double operations */
        const double stepf = (double)(float)opt->steps;
        const double bc1 = 1.0 - pow(c->beta1, stepf);
        const double bc2 = 1.0 - pow(c->beta2, stepf);
        const double step_size = lr / bc1;
        const double bc2_sqrt = c->arith == GP_TORCH_2 ? pow(bc2, 0.5) : sqrt(bc2);
        const double wd_lr = lr * c->weight_decay;
        s.decay = (float)(1.0 - wd_lr);
        s.b1 = (float)c->beta1;
        s.a1 = (float)(1.0 - c->beta1);
        s.a1m1 = s.a1 - 1.0f;
        s.b2 = (float)c->beta2;
        s.a2 = (float)(1.0 - c->beta2);
        s.bc2_sqrt = (float)bc2_sqrt;
        s.neg_step = (float)(-step_size);
        s.eps = (float)c->eps;
        s.lerp = c->arith == GP_TORCH_2;
        s.lerp_small = fabsf(s.a1) < 0.5f;
    }
    const bool need0 = adamw || s.has_mom, need1 = adamw;

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
            GP_TRY(launch_optim(stream, adamw, L, (unsigned)nb, s, err));
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
        GP_TRY(launch_optim(stream, adamw, L, (unsigned)nb, s, err));
    }
    return GP_OK;
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
