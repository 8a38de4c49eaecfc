/* What the Attention kernels read (backend/cuda/attention.cu, the float32
 * ones on CUDA cores and cuDNN's SDPA; attention_tf32.cu, the TF32 tensor
 * core ones), shared so that both files address Q, K, V, Y, the mask and
 * the gradients the same way: the call's tensors, their storage types
 * (gp_fptr), the plan's strides and offsets, the first-writer flags. */
#ifndef GP_CUDA_ATTENTION_ARGS_CUH
#define GP_CUDA_ATTENTION_ARGS_CUH

#include <math.h>
#include <stdint.h>

#include "backend/cuda/bf16.cuh"

extern "C" {
#include "ops/attention.h"
}

/* A value of storage S, widened (exact). Tile loads take the storage as a
 * template parameter rather than gp_ld's branch per value, which kept
 * each load from going out before the previous one's store. */
__device__ static inline float att_ld1(const float *p, int64_t i) { return p[i]; }
__device__ static inline float att_ld1(const __nv_bfloat16 *p, int64_t i) { return __bfloat162float(p[i]); }

/* What the kernels read, by value. */
struct att_args {
    struct gp_attention_plan p;
    gp_fptr q, k, v, y, dy, dq, dk, dv;
    bool ow_q, ow_k, ow_v;     /* write dq, dk, dv whole (their first writer) instead of adding */
    gp_fptr mask_f;            /* additive mask */
    const uint8_t *mask_b;     /* bool mask */
    float *lse, *dsum;         /* [B * H * Tq] */
};

/* Offsets of batch-head bh in Q, K, V, Y and the mask. */
struct att_base {
    int64_t q, k, v, y, m;
};

__device__ static inline att_base base_of(const struct gp_attention_plan &p, int64_t bh)
{
    int64_t b = bh / p.heads, h = bh % p.heads;
    att_base r;
    r.q = p.q_offset + b * p.q_stride[0] + h * p.q_stride[1];
    r.k = p.k_offset + b * p.k_stride[0] + h * p.k_stride[1];
    r.v = p.v_offset + b * p.v_stride[0] + h * p.v_stride[1];
    r.y = b * p.y_stride[0] + h * p.y_stride[1];
    r.m = b * p.mask_stride[0] + h * p.mask_stride[1];
    return r;
}

/* The score's mask term for query i and key j: 0, the additive value, or
 * -INFINITY where the row does not attend to j (causal, bool mask, j out
 * of range). */
__device__ static inline float mask_term(const att_args &a, int64_t mbase, int64_t i, int64_t j)
{
    const struct gp_attention_plan &p = a.p;
    if (j >= p.kv_len || i >= p.q_len || (p.causal && j > i)) return -INFINITY;
    int64_t mo = mbase + i * p.mask_stride[2] + j * p.mask_stride[3];
    if (p.mask == GP_ATTN_MASK_BOOL) return a.mask_b[mo] ? 0.0f : -INFINITY;
    if (p.mask == GP_ATTN_MASK_ADD) return gp_ld(a.mask_f, mo);
    return 0.0f;
}

/* A gradient element: added once to the buffer, or (`ow`: the buffer is
 * not cleared, this layer writes it first) written as 0 + v, which rounds
 * as the add into zeros does (-0 becomes +0), so both give the same bits. */
__device__ static inline void put_grad(gp_fptr t, int64_t i, float v, bool ow)
{
    if (ow) gp_st(t, i, __fadd_rn(0.0f, v));
    else gp_acc(t, i, v);
}

#endif
