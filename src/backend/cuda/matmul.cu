/* CUDA kernels: the matmul family, twin of backend/cpu/matmul.c: Gemm and
 * MatMul, forward and backward, through cuBLAS.
 *
 * Row-major products go to column-major cuBLAS by swapping the operands:
 * C [m, n] = op(A) op(B), read column-major, is C^T = op(B)^T op(A)^T, so
 * one call computes it with B first. A float32 product is float32 in,
 * float32 out, with CUBLAS_COMPUTE_32F (CUBLAS_COMPUTE_32F_FAST_TF32 when
 * ctx->tf32). cuBLAS is deterministic run to run on one GPU model with the
 * handle's own workspace and atomics off (its default); the sums cuBLAS
 * forms are ordered differently from OpenBLAS's, so the two backends agree
 * to float rounding, not bit for bit.
 *
 * Gradients accumulate (beta = 1 into din). A MatMul operand broadcast over
 * batch axes gets the sum of the products of every batch entry that shares
 * it: when one operand is a single matrix shared by a whole batch of the
 * other (x [B, T, C] @ W [C, N]), the batch folds into the rows of one
 * product, as on the CPU; otherwise each entry's product goes to scratch and
 * a kernel adds them into the gradient in batch order (no atomics).
 *
 * bfloat16 storage (ctx->*_dt, the BF16 precision of backend/compute.h):
 * both operands of a product are bfloat16 (cuBLAS multiplies no mixed
 * pairs), C is bfloat16 (activations and their gradients) or float32 (a
 * parameter's gradient), always with CUBLAS_COMPUTE_32F: float32 products
 * and sums; a bfloat16 C that is accumulated into (beta 1) is read, added
 * to in float32 and rounded once, with reduced-precision split-K reductions
 * disallowed, so nothing else is rounded to bfloat16 on the way. Gemm's C
 * (bfloat16, or a float32 parameter) is copied into Y and cuBLAS adds
 * alpha A' B' to beta times it, as PyTorch's addmm does; per-entry products
 * of a broadcast MatMul operand stay float32 in scratch until their sum.
 * The bias kernels read either storage and compute in float32.
 *
 * A MatMul with a fused bias (graph/fuse.c: input 2, b [N]) whose B is one
 * matrix for all of A (a Linear layer) goes to cuBLASLt with
 * CUBLASLT_EPILOGUE_BIAS: b is added to the float32 accumulator and the
 * sum rounded once to Y's storage, and the product is not read and written
 * again by a second pass. cublasLt.h documents the bias vector as of D's
 * type apart from integer and fp8 kernels, and so does PyTorch's autocast:
 * it rounds a Linear's weight and bias to bfloat16, and cuBLASLt adds the
 * bfloat16 bias to the float32 accumulator. Here too, in bf16 b is read
 * through its bfloat16 copy as the weight is (pipeline/plan.c), so the
 * bias type is CUDA_R_16BF with a bfloat16 Y; in fp32 and TF32 b and Y are
 * float32. The CPU adds the same widened bfloat16 b to its float32 product
 * before the one rounding, so both agree. Where cuBLASLt's heuristic
 * offers no algorithm (a float32 Y from bfloat16 operands and a bfloat16
 * b, or a shape it refuses), or the pointers and leading dimensions are
 * not 16-byte aligned, or B is one matrix per batch entry, the product
 * goes through cublasGemmEx as before and b is added by a pass of its own
 * (row_runs.cuh's kernel), in float32 and rounded once more to Y's
 * storage; a line on stderr says so, once per process. The algorithm
 * query fixes what it may assume (16-byte alignment of every pointer,
 * cuBLAS's workspace of GP_CUDA_LIBS_WORKSPACE_BYTES, no split-K
 * reduction), so the choice depends on the shapes and types alone, not on
 * where a stage's buffers happen to lie: the same algorithm, so the same
 * bits, whatever the stage split. b's gradient is
 * the Add's: column sums of dY in chunks (row_grad_part_kernel) folded in
 * a fixed order (reduce_finish_kernel), over the Add's plan and chunks. */
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include <cublasLt.h>
#include <cublas_v2.h>

#include "backend/cuda/bf16.cuh"
#include "backend/cuda/broadcast.cuh"
#include "backend/cuda/kernel_util.cuh"
#include "backend/cuda/row_runs.cuh"

/* ---- cuBLAS, row-major ---- */

static gp_status blas_status(const struct gp_cuda_ctx *c, struct gp_error *err, cublasStatus_t s,
                             const char *call, const char *what)
{
    if (s == CUBLAS_STATUS_SUCCESS) return GP_OK;
    return gp_cuda_error(c, err, GP_ERR_DEVICE, "%s (%s): %s", call, what, cublasGetStatusString(s));
}

static bool fits_int(int64_t v) { return v >= 0 && v <= INT_MAX; }

/* The storage of a product: both operands one type (cuBLAS multiplies no
 * mixed pairs), C its own. CUDA_R_32F throughout, or bfloat16 operands
 * with a bfloat16 or float32 C. */
struct mm_types {
    cudaDataType_t ab, c;
};

static size_t type_size(cudaDataType_t t) { return t == CUDA_R_16BF ? 2 : 4; }

/* The types of a product of operands x and z into out (each stored as
 * bfloat16 or not), or an error for a combination cuBLAS lacks. */
static gp_status mm_types_of(const struct gp_cuda_ctx *c, struct gp_error *err, const char *what,
                             bool x_bf16, bool z_bf16, bool out_bf16, struct mm_types *t)
{
    if (x_bf16 != z_bf16 || (out_bf16 && !x_bf16))
        return gp_cuda_error(c, err, GP_ERR_UNSUPPORTED,
                             "%s: operands stored as %s and %s into %s: cuBLAS multiplies two "
                             "bfloat16 or two float32 operands (and float32 ones into float32)",
                             what, x_bf16 ? "bfloat16" : "float32", z_bf16 ? "bfloat16" : "float32",
                             out_bf16 ? "bfloat16" : "float32");
    t->ab = x_bf16 ? CUDA_R_16BF : CUDA_R_32F;
    t->c = out_bf16 ? CUDA_R_16BF : CUDA_R_32F;
    return GP_OK;
}

/* A batch of row-major products C_i [m, n] = alpha * op(A_i) op(B_i) +
 * beta * C_i, i < batch, each operand at base + i * its stride (elements;
 * a stride of 0 shares one matrix), stored as `t` says. op(A) [m, k] is A,
 * or A^T of A stored [k, m] when ta; likewise op(B) [k, n]. beta is 0
 * (overwrite) or 1 (accumulate), or any value with bfloat16 operands (Gemm's
 * beta * C); C must be contiguous ([batch, m, n], ldc = n) when k == 0,
 * which leaves beta * C (beta 0 or 1 then). */
static gp_status rm_gemm(const struct gp_cuda_ctx *c, struct gp_error *err, const char *what,
                         const struct mm_types *t, bool ta, bool tb, int64_t m, int64_t n, int64_t k,
                         float alpha, const void *a, int64_t lda, int64_t sa, const void *b, int64_t ldb,
                         int64_t sb, float beta, void *cm, int64_t ldc, int64_t sc, int64_t batch)
{
    if (m == 0 || n == 0 || batch == 0) return GP_OK;
    if (k == 0) {
        if (beta != 0) return GP_OK;
        if (ldc != n || (batch > 1 && sc != m * n))
            return gp_cuda_error(c, err, GP_ERR_UNSUPPORTED, "%s: an empty product into a strided output",
                                 what);
        cudaError_t e = cudaMemsetAsync(cm, 0, type_size(t->c) * (size_t)(batch * m * n), c->stream);
        if (e != cudaSuccess)
            return gp_cuda_error(c, err, GP_ERR_DEVICE, "%s: cudaMemsetAsync: %s", what,
                                 cudaGetErrorString(e));
        return GP_OK;
    }
    if (!fits_int(m) || !fits_int(n) || !fits_int(k) || !fits_int(lda) || !fits_int(ldb) ||
        !fits_int(ldc) || !fits_int(batch))
        return gp_cuda_error(c, err, GP_ERR_UNSUPPORTED,
                             "%s: a matrix product of [%lld, %lld] x [%lld, %lld] (batch %lld) "
                             "exceeds cuBLAS's int sizes",
                             what, (long long)m, (long long)k, (long long)k, (long long)n,
                             (long long)batch);
    cublasHandle_t h = (cublasHandle_t)c->cublas;
    cublasOperation_t opa = ta ? CUBLAS_OP_T : CUBLAS_OP_N, opb = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    bool bf16 = t->ab == CUDA_R_16BF;
    cublasComputeType_t ct = !bf16 && c->tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    /* A bfloat16 C: split-K partial sums stay float32 (the handle's mode
     * is restored after the call). */
    cublasMath_t mode = CUBLAS_DEFAULT_MATH;
    bool set_mode = t->c == CUDA_R_16BF;
    if (set_mode) {
        cublasStatus_t ms = cublasGetMathMode(h, &mode);
        if (ms == CUBLAS_STATUS_SUCCESS)
            ms = cublasSetMathMode(h, (cublasMath_t)(mode | CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION));
        if (ms != CUBLAS_STATUS_SUCCESS) return blas_status(c, err, ms, "cublasSetMathMode", what);
    }
    cublasStatus_t s;
    const char *call;
    if (batch == 1) {
        call = "cublasGemmEx";
        s = cublasGemmEx(h, opb, opa, (int)n, (int)m, (int)k, &alpha, b, t->ab, (int)ldb, a, t->ab,
                         (int)lda, &beta, cm, t->c, (int)ldc, ct, CUBLAS_GEMM_DEFAULT);
    } else {
        call = "cublasGemmStridedBatchedEx";
        s = cublasGemmStridedBatchedEx(h, opb, opa, (int)n, (int)m, (int)k, &alpha, b, t->ab, (int)ldb,
                                       (long long)sb, a, t->ab, (int)lda, (long long)sa, &beta, cm, t->c,
                                       (int)ldc, (long long)sc, (int)batch, ct, CUBLAS_GEMM_DEFAULT);
    }
    if (set_mode) {
        cublasStatus_t ms = cublasSetMathMode(h, mode);
        if (s == CUBLAS_STATUS_SUCCESS && ms != CUBLAS_STATUS_SUCCESS)
            return blas_status(c, err, ms, "cublasSetMathMode", what);
    }
    return blas_status(c, err, s, call, what);
}

static gp_status want_f32(const struct gp_cuda_ctx *c, struct gp_error *err)
{
    for (int i = 0; i < c->node->n_inputs; i++) {
        const struct gp_value *v = gp_cuda_in_value(c, i);
        if (v && v->dtype != GP_DTYPE_FLOAT32)
            return gp_cuda_error(c, err, GP_ERR_UNSUPPORTED,
                                 "the CUDA backend has no %s kernel for %s tensors (input %d)",
                                 c->node->op_type, gp_dtype_name(v->dtype), i);
    }
    return GP_OK;
}

/* ---- Gemm ---- */

/* Y [M, N] = alpha * A' B' + beta * C, as the CPU's gemm_plan reads it. */
struct gemm_plan {
    bool ta, tb;
    int64_t m, n, k;
    float alpha, beta;
    int64_t c_row, c_col; /* C's strides over Y's rows and columns (0: broadcast) */
};

static void gemm_plan(const struct gp_cuda_ctx *c, struct gemm_plan *p)
{
    const struct gp_shape *sa = &gp_cuda_in_value(c, 0)->shape;
    const struct gp_shape *sb = &gp_cuda_in_value(c, 1)->shape;
    p->ta = gp_node_attr_int(c->node, "transA", 0) != 0;
    p->tb = gp_node_attr_int(c->node, "transB", 0) != 0;
    p->m = sa->dims[p->ta];
    p->k = sa->dims[1 - p->ta];
    p->n = sb->dims[1 - p->tb];
    p->alpha = gp_node_attr_float(c->node, "alpha", 1.0f);
    p->beta = gp_node_attr_float(c->node, "beta", 1.0f);
    p->c_row = p->c_col = 0;
    const struct gp_value *cv = gp_cuda_in_value(c, 2);
    if (!cv) return;
    const struct gp_shape *sc = &cv->shape;
    if (sc->rank >= 1) p->c_col = sc->dims[sc->rank - 1] == 1 ? 0 : 1;
    if (sc->rank == 2) p->c_row = sc->dims[0] == 1 ? 0 : sc->dims[1];
}

/* Y [m, n] = beta * C broadcast (C's strides c_row, c_col): the float32
 * path, which then adds alpha * A' B' with beta 1. */
__global__ static void gemm_fill_c_kernel(float *y, const float *cm, float beta, int64_t m, int64_t n,
                                          int64_t c_row, int64_t c_col)
{
    GP_GRID_STRIDE(e, m * n)
    {
        int64_t i = e / n, j = e - i * n;
        y[e] = __fmul_rn(beta, cm[i * c_row + j * c_col]);
    }
}

/* Y [m, n] = scale * C broadcast, in Y's storage (rounded once when that
 * is bfloat16): the bfloat16 path, where cuBLAS then reads Y with Gemm's
 * beta, as PyTorch's addmm does (scale is 1, or beta when K is 0 and there
 * is no product to add). */
template <typename TY, typename TC>
__global__ static void gemm_copy_c_kernel(TY *y, const TC *cm, float scale, int64_t m, int64_t n,
                                          int64_t c_row, int64_t c_col)
{
    GP_GRID_STRIDE(e, m * n)
    {
        int64_t i = e / n, j = e - i * n;
        gp_store(y + e, __fmul_rn(scale, gp_load(cm + i * c_row + j * c_col)));
    }
}

/* dC [m, n] += beta * dY: C not broadcast. */
template <typename TC, typename TD>
__global__ static void gemm_dc_full_kernel(TC *dc, const TD *dy, double beta, int64_t count)
{
    GP_GRID_STRIDE(e, count) gp_store(dc + e, __fadd_rn(gp_load(dc + e), (float)(beta * (double)gp_load(dy + e))));
}

#define COL_TILE 32 /* columns per block (one warp wide) */
#define COL_ROWS 8  /* row groups per block */

/* dC [n] += beta * the column sums of dY [m, n]: a block of 32 x 8 threads
 * per 32 columns; thread (x, y) sums rows y, y + 8, ... in double, and the
 * 8 partial sums of a column are added in a fixed order. */
template <typename TC, typename TD>
__global__ static void gemm_dc_cols_kernel(TC *dc, const TD *dy, double beta, int64_t m, int64_t n)
{
    __shared__ double part[COL_ROWS][COL_TILE];
    int64_t j = (int64_t)blockIdx.x * COL_TILE + threadIdx.x;
    double s = 0;
    if (j < n)
        for (int64_t i = threadIdx.y; i < m; i += COL_ROWS) s += (double)gp_load(dy + i * n + j);
    part[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y == 0 && j < n) {
        double t = 0;
        for (int r = 0; r < COL_ROWS; r++) t += part[r][threadIdx.x];
        gp_store(dc + j, __fadd_rn(gp_load(dc + j), (float)(beta * t)));
    }
}

/* dC [rows or 1, cols or 1] += beta * dY summed over the axes C is
 * broadcast along: one block per entry of C, the threads striding over the
 * entry's region of dY, a tree sum in double (a fixed order). */
template <typename TC, typename TD>
__global__ static void gemm_dc_block_kernel(TC *dc, const TD *dy, double beta, int64_t m, int64_t n,
                                            int64_t c_row, int64_t c_col)
{
    __shared__ double part[GP_CUDA_THREADS];
    int64_t cols = c_col ? n : 1;
    int64_t e = blockIdx.x, ci = e / cols, cj = e - ci * cols;
    int64_t i0 = c_row ? ci : 0, h = c_row ? 1 : m;
    int64_t j0 = c_col ? cj : 0, w = c_col ? 1 : n;
    double s = 0;
    for (int64_t t = threadIdx.x; t < h * w; t += blockDim.x) {
        int64_t i = i0 + t / w, j = j0 + t % w;
        s += (double)gp_load(dy + i * n + j);
    }
    part[threadIdx.x] = s;
    __syncthreads();
    for (int half = blockDim.x / 2; half > 0; half /= 2) {
        if ((int)threadIdx.x < half) part[threadIdx.x] += part[threadIdx.x + half];
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        TC *at = dc + ci * c_row + cj * c_col;
        gp_store(at, __fadd_rn(gp_load(at), (float)(beta * part[0])));
    }
}

typedef __nv_bfloat16 bf16_t;

/* Y = scale * C broadcast, for each pair of storage types. */
template <typename TY, typename TC>
static void launch_copy_c(const struct gp_cuda_ctx *c, const struct gemm_plan *p, void *y, const void *cm,
                          float scale)
{
    gemm_copy_c_kernel<TY, TC><<<gp_cuda_blocks_for(p->m * p->n), GP_CUDA_THREADS, 0, c->stream>>>(
        (TY *)y, (const TC *)cm, scale, p->m, p->n, p->c_row, p->c_col);
}

static gp_status gemm_forward(struct gp_cuda_ctx *c, struct gp_error *err)
{
    GP_TRY(want_f32(c, err));
    struct gemm_plan p;
    gemm_plan(c, &p);
    const void *a = c->in[0], *b = c->in[1];
    const void *cm = c->node->n_inputs > 2 ? c->in[2] : NULL;
    void *y = c->out[0];
    if (p.m == 0 || p.n == 0) return GP_OK;
    struct mm_types t;
    GP_TRY(mm_types_of(c, err, "Gemm forward", gp_cuda_is_bf16(c->in_dt, 0), gp_cuda_is_bf16(c->in_dt, 1),
                       gp_cuda_is_bf16(c->out_dt, 0), &t));
    /* Like PyTorch's addmm (and the CPU kernel), beta == 0 ignores C. */
    bool use_c = cm && p.beta != 0;
    float beta = 0.0f;
    if (use_c && t.ab == CUDA_R_32F) {
        gemm_fill_c_kernel<<<gp_cuda_blocks_for(p.m * p.n), GP_CUDA_THREADS, 0, c->stream>>>(
            (float *)y, (const float *)cm, p.beta, p.m, p.n, p.c_row, p.c_col);
        GP_TRY(gp_cuda_check_launch(c, "Gemm: beta * C", err));
        beta = 1.0f;
    } else if (use_c) {
        /* C (a bfloat16 activation or shadow, or a float32 parameter) into
         * Y, which cuBLAS reads with beta: one rounding of the sum. */
        float scale = p.k == 0 ? p.beta : 1.0f;
        bool yb = t.c == CUDA_R_16BF, cb = gp_cuda_is_bf16(c->in_dt, 2);
        if (yb && cb) launch_copy_c<bf16_t, bf16_t>(c, &p, y, cm, scale);
        else if (yb) launch_copy_c<bf16_t, float>(c, &p, y, cm, scale);
        else if (cb) launch_copy_c<float, bf16_t>(c, &p, y, cm, scale);
        else launch_copy_c<float, float>(c, &p, y, cm, scale);
        GP_TRY(gp_cuda_check_launch(c, "Gemm: C", err));
        beta = p.k == 0 ? 1.0f : p.beta;
    }
    return rm_gemm(c, err, "Gemm forward", &t, p.ta, p.tb, p.m, p.n, p.k, p.alpha, a, p.ta ? p.m : p.k,
                   0, b, p.tb ? p.k : p.n, 0, beta, y, p.n, 0, 1);
}

/* dC += beta * dY summed over C's broadcast axes, dY and dC in the storage
 * types TD and TC. */
template <typename TC, typename TD>
static gp_status gemm_dc(const struct gp_cuda_ctx *c, const struct gemm_plan *p, TC *dc, const TD *dy,
                         struct gp_error *err)
{
    double beta = (double)p->beta;
    if (p->c_row && p->c_col) {
        gemm_dc_full_kernel<TC, TD><<<gp_cuda_blocks_for(p->m * p->n), GP_CUDA_THREADS, 0, c->stream>>>(
            dc, dy, beta, p->m * p->n);
    } else if (p->c_col) {
        int64_t blocks = (p->n + COL_TILE - 1) / COL_TILE;
        if (blocks > INT_MAX) return gp_cuda_error(c, err, GP_ERR_UNSUPPORTED, "Gemm: C has too many columns");
        gemm_dc_cols_kernel<TC, TD><<<(unsigned)blocks, dim3(COL_TILE, COL_ROWS), 0, c->stream>>>(
            dc, dy, beta, p->m, p->n);
    } else {
        int64_t entries = p->c_row ? p->m : 1;
        if (entries > INT_MAX) return gp_cuda_error(c, err, GP_ERR_UNSUPPORTED, "Gemm: C has too many rows");
        gemm_dc_block_kernel<TC, TD><<<(unsigned)entries, GP_CUDA_THREADS, 0, c->stream>>>(
            dc, dy, beta, p->m, p->n, p->c_row, p->c_col);
    }
    return gp_cuda_check_launch(c, "Gemm backward (C)", err);
}

/* dY [M, N] -> dA += alpha * dY B'^T (shaped like A), dB += alpha * A'^T dY
 * (shaped like B), dC += beta * dY summed over C's broadcast axes. */
static gp_status gemm_backward(struct gp_cuda_ctx *c, struct gp_error *err)
{
    GP_TRY(want_f32(c, err));
    struct gemm_plan p;
    gemm_plan(c, &p);
    const void *a = c->in[0], *b = c->in[1], *dy = c->dout[0];
    void *da = c->din[0], *db = c->din[1], *dc = c->node->n_inputs > 2 ? c->din[2] : NULL;
    if (!dy) return GP_OK;
    bool ab = gp_cuda_is_bf16(c->in_dt, 0), bb = gp_cuda_is_bf16(c->in_dt, 1);
    bool yb = gp_cuda_is_bf16(c->dout_dt, 0);
    int64_t lda = p.ta ? p.m : p.k, ldb = p.tb ? p.k : p.n;
    if (da) {
        struct mm_types t;
        GP_TRY(mm_types_of(c, err, "Gemm backward (A)", yb, bb, gp_cuda_is_bf16(c->din_dt, 0), &t));
        if (!p.ta) /* dA [M, K] = dY [M, N] . B'^T */
            GP_TRY(rm_gemm(c, err, "Gemm backward (A)", &t, false, !p.tb, p.m, p.k, p.n, p.alpha, dy,
                           p.n, 0, b, ldb, 0, 1.0f, da, p.k, 0, 1));
        else /* dA [K, M] = B' [K, N] . dY^T */
            GP_TRY(rm_gemm(c, err, "Gemm backward (A)", &t, p.tb, true, p.k, p.m, p.n, p.alpha, b, ldb,
                           0, dy, p.n, 0, 1.0f, da, p.m, 0, 1));
    }
    if (db) {
        struct mm_types t;
        GP_TRY(mm_types_of(c, err, "Gemm backward (B)", ab, yb, gp_cuda_is_bf16(c->din_dt, 1), &t));
        if (!p.tb) /* dB [K, N] = A'^T [K, M] . dY */
            GP_TRY(rm_gemm(c, err, "Gemm backward (B)", &t, !p.ta, false, p.k, p.n, p.m, p.alpha, a,
                           lda, 0, dy, p.n, 0, 1.0f, db, p.n, 0, 1));
        else /* dB [N, K] = dY^T [N, M] . A' */
            GP_TRY(rm_gemm(c, err, "Gemm backward (B)", &t, true, p.ta, p.n, p.k, p.m, p.alpha, dy, p.n,
                           0, a, lda, 0, 1.0f, db, p.k, 0, 1));
    }
    if (dc && p.beta != 0 && p.m > 0 && p.n > 0) {
        bool cb = gp_cuda_is_bf16(c->din_dt, 2);
        if (!cb && !yb) return gemm_dc(c, &p, (float *)dc, (const float *)dy, err);
        if (!cb) return gemm_dc(c, &p, (float *)dc, (const bf16_t *)dy, err);
        if (!yb) return gemm_dc(c, &p, (bf16_t *)dc, (const float *)dy, err);
        return gemm_dc(c, &p, (bf16_t *)dc, (const bf16_t *)dy, err);
    }
    return GP_OK;
}

/* ---- MatMul ---- */

/* A [..., M, K] x B [..., K, N] -> Y [..., M, N], the batch axes broadcast
 * numpy-style; a 1-D A is [1, K] and a 1-D B [K, 1] (the CPU's plan). */
struct matmul_plan {
    int64_t m, n, k;
    int nb;                    /* batch axes of Y */
    int64_t dims[GP_MAX_RANK]; /* Y's batch dims */
    /* Per batch axis, the stride in matrices of A, of B and of Y (0: A or B
     * broadcast along it). */
    int64_t sa[GP_MAX_RANK], sb[GP_MAX_RANK], sy[GP_MAX_RANK];
    int64_t batch, na, nbm; /* matrices in Y, A, B */
};

static void matmul_plan(const struct gp_cuda_ctx *c, struct matmul_plan *p)
{
    const struct gp_shape *sa = &gp_cuda_in_value(c, 0)->shape;
    const struct gp_shape *sb = &gp_cuda_in_value(c, 1)->shape;
    memset(p, 0, sizeof *p);
    p->m = sa->rank >= 2 ? sa->dims[sa->rank - 2] : 1;
    p->k = sa->dims[sa->rank - 1];
    /* trans_b: B is a 2-D weight stored [N, K] (graph/fuse.c). */
    p->n = c->node->trans_b ? sb->dims[0] : sb->rank >= 2 ? sb->dims[sb->rank - 1] : 1;
    int ba = sa->rank > 2 ? sa->rank - 2 : 0, bb = sb->rank > 2 ? sb->rank - 2 : 0;
    p->nb = ba > bb ? ba : bb;
    int64_t ma = 1, mb = 1;
    p->batch = 1;
    for (int i = p->nb - 1; i >= 0; i--) {
        int ia = i - (p->nb - ba), ib = i - (p->nb - bb);
        int64_t da = ia >= 0 ? sa->dims[ia] : 1, db = ib >= 0 ? sb->dims[ib] : 1;
        p->dims[i] = da == 1 ? db : da;
        p->sa[i] = da == 1 ? 0 : ma;
        p->sb[i] = db == 1 ? 0 : mb;
        p->sy[i] = p->batch;
        ma *= da;
        mb *= db;
        p->batch *= p->dims[i];
    }
    p->na = ma;
    p->nbm = mb;
}

/* The batch axes as launches: axes of size 1 dropped, neighbours merged
 * where all three operands are contiguous across them; the innermost axis
 * becomes one strided-batched call, the others a host loop. */
struct batch_axes {
    int n;
    int64_t dims[GP_MAX_RANK];
    int64_t s[3][GP_MAX_RANK]; /* strides in matrices of operand 0, 1 and the output */
};

static void batch_axes_init(struct batch_axes *ax, int nb, const int64_t *dims, const int64_t *s0,
                            const int64_t *s1, const int64_t *s2)
{
    const int64_t *src[3] = {s0, s1, s2};
    memset(ax, 0, sizeof *ax);
    for (int i = 0; i < nb; i++) {
        if (dims[i] == 1) continue;
        int r = ax->n - 1;
        bool merge = r >= 0;
        for (int t = 0; merge && t < 3; t++) merge = ax->s[t][r] == src[t][i] * dims[i];
        if (merge) {
            ax->dims[r] *= dims[i];
            for (int t = 0; t < 3; t++) ax->s[t][r] = src[t][i];
            continue;
        }
        ax->dims[ax->n] = dims[i];
        for (int t = 0; t < 3; t++) ax->s[t][ax->n] = src[t][i];
        ax->n++;
    }
}

/* out_i = op(X_i) op(Z_i) (+ out_i when beta is 1) for every batch entry i
 * along `ax`: X_i at x + (its matrix offset) * mx elements, likewise Z and
 * out, stored as `t` says. */
static gp_status batched_gemm(const struct gp_cuda_ctx *c, struct gp_error *err, const char *what,
                              const struct mm_types *t, const struct batch_axes *ax, bool tx, bool tz,
                              int64_t m, int64_t n, int64_t k, const void *x, int64_t ldx, int64_t mx,
                              const void *z, int64_t ldz, int64_t mz, float beta, void *out, int64_t mo)
{
    if (ax->n == 0)
        return rm_gemm(c, err, what, t, tx, tz, m, n, k, 1.0f, x, ldx, 0, z, ldz, 0, beta, out, n, 0, 1);
    size_t ex = type_size(t->ab), eo = type_size(t->c);
    int last = ax->n - 1;
    int64_t outer = 1;
    for (int i = 0; i < last; i++) outer *= ax->dims[i];
    for (int64_t e = 0; e < outer; e++) {
        int64_t off[3] = {0, 0, 0}, rem = e;
        for (int i = last - 1; i >= 0; i--) {
            int64_t idx = rem % ax->dims[i];
            rem /= ax->dims[i];
            for (int t = 0; t < 3; t++) off[t] += idx * ax->s[t][i];
        }
        GP_TRY(rm_gemm(c, err, what, t, tx, tz, m, n, k, 1.0f, (const char *)x + off[0] * mx * ex, ldx,
                       ax->s[0][last] * mx, (const char *)z + off[1] * mz * ex, ldz, ax->s[1][last] * mz,
                       beta, (char *)out + off[2] * mo * eo, n, ax->s[2][last] * mo, ax->dims[last]));
    }
    return GP_OK;
}

/* ---- the fused bias ---- */

static bool aligned16(const void *p) { return ((uintptr_t)p & 15) == 0; }

static const char *type_name(cudaDataType_t t) { return t == CUDA_R_16BF ? "bf16" : "fp32"; }

/* One line on stderr, once per process for each `which` (0: cuBLASLt has
 * no algorithm, 1: the call was not offered to it), when a fused bias is
 * added in a pass of its own: a benchmark shows why the epilogue is not
 * used. */
static void note_bias_pass(int which, const char *fmt, ...)
{
    static int noted[2];
    if (__atomic_exchange_n(&noted[which], 1, __ATOMIC_RELAXED)) return;
    char line[320];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    fprintf(stderr, "note: MatMul with bias: %s: the bias is added in a pass of its own\n", line);
}

/* Y [m, n] = A [m, k] op(B) + bias [n] in one cuBLASLt call with the bias
 * epilogue (op(B): B [k, n], or B^T of B stored [n, k] when tb), `t` the
 * operands' and Y's storage, bias float32 or bfloat16 (bias_bf16). *done
 * false, nothing launched: cuBLASLt offers no algorithm for this (the
 * caller adds the bias in a pass of its own). */
static gp_status lt_gemm_bias(const struct gp_cuda_ctx *c, struct gp_error *err, const struct mm_types *t,
                              bool tb, int64_t m, int64_t n, int64_t k, const void *a, const void *b,
                              const void *bias, bool bias_bf16, void *y, bool *done)
{
    *done = false;
    size_t es = type_size(t->ab), ey = type_size(t->c);
    /* The query assumes 16-byte alignment (below): pointers and leading
     * dimensions that give less take the other path. */
    bool bf16 = t->ab == CUDA_R_16BF;
    const char *mode = bf16 ? "bf16" : c->tf32 ? "tf32" : "fp32";
    if (m == 0 || n == 0 || k == 0) return GP_OK;
    if (!fits_int(m) || !fits_int(n) || !fits_int(k) || !aligned16(a) || !aligned16(b) || !aligned16(y) ||
        !aligned16(bias) || (k * es) % 16 || (n * es) % 16 || (n * ey) % 16) {
        note_bias_pass(1, "%lld x %lld x %lld (%s) not offered to cuBLASLt (a size past int, or a pointer or row "
                       "not 16-byte aligned)", (long long)m, (long long)n, (long long)k, mode);
        return GP_OK;
    }
    cublasLtHandle_t lt = (cublasLtHandle_t)c->cublas; /* a cuBLAS handle is a cuBLASLt one */
    cublasComputeType_t ct = !bf16 && c->tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    cudaDataType_t scale = CUDA_R_32F;
    cublasLtMatmulDesc_t desc = NULL;
    cublasLtMatrixLayout_t lb = NULL, la = NULL, ly = NULL;
    cublasLtMatmulPreference_t pref = NULL;
    cublasStatus_t s = cublasLtMatmulDescCreate(&desc, ct, scale);
    /* Column-major, as rm_gemm: Y^T [n, m] = op(B)^T A^T, B first. */
    cublasOperation_t opb = tb ? CUBLAS_OP_T : CUBLAS_OP_N, opa = CUBLAS_OP_N;
    cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
    int32_t bias_type = bias_bf16 ? CUDA_R_16BF : CUDA_R_32F;
    /* The algorithm query reads the bias pointer for its alignment only:
     * a stand-in aligned to exactly 16 bytes, so that the real pointer's
     * alignment (which depends on the stage's layout) cannot change the
     * choice. */
    const void *probe = (const void *)(uintptr_t)16;
    if (s == CUBLAS_STATUS_SUCCESS)
        s = cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &opb, sizeof opb);
    if (s == CUBLAS_STATUS_SUCCESS)
        s = cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &opa, sizeof opa);
    if (s == CUBLAS_STATUS_SUCCESS)
        s = cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi);
    if (s == CUBLAS_STATUS_SUCCESS)
        s = cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type, sizeof bias_type);
    if (s == CUBLAS_STATUS_SUCCESS)
        s = cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &probe, sizeof probe);
    if (s == CUBLAS_STATUS_SUCCESS)
        s = tb ? cublasLtMatrixLayoutCreate(&lb, t->ab, (uint64_t)k, (uint64_t)n, k)
               : cublasLtMatrixLayoutCreate(&lb, t->ab, (uint64_t)n, (uint64_t)k, n);
    if (s == CUBLAS_STATUS_SUCCESS) s = cublasLtMatrixLayoutCreate(&la, t->ab, (uint64_t)k, (uint64_t)m, k);
    if (s == CUBLAS_STATUS_SUCCESS) s = cublasLtMatrixLayoutCreate(&ly, t->c, (uint64_t)n, (uint64_t)m, n);
    if (s == CUBLAS_STATUS_SUCCESS) s = cublasLtMatmulPreferenceCreate(&pref);
    /* No split-K: nothing is summed outside the one accumulator, in the
     * output's type or any other order. The workspace is cuBLAS's, a fixed
     * size whatever the call: Hopper's TF32 kernels (TMA, sm90) need one,
     * and without it the heuristic offers sm80 kernels that take 1.7-1.9x
     * as long on GPT-2's forwards (bench/RESULTS.md, 2026-12-03 20:55 and
     * 21:45). */
    uint64_t ws = c->cublas_workspace ? GP_CUDA_LIBS_WORKSPACE_BYTES : 0;
    uint32_t red = CUBLASLT_REDUCTION_SCHEME_NONE, align = 16;
    if (s == CUBLAS_STATUS_SUCCESS)
        s = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
    if (s == CUBLAS_STATUS_SUCCESS)
        s = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &red, sizeof red);
    const cublasLtMatmulPreferenceAttributes_t aligns[] = {
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
    for (int i = 0; i < 4 && s == CUBLAS_STATUS_SUCCESS; i++)
        s = cublasLtMatmulPreferenceSetAttribute(pref, aligns[i], &align, sizeof align);
    gp_status st = GP_OK;
    if (s != CUBLAS_STATUS_SUCCESS) {
        st = blas_status(c, err, s, "cuBLASLt descriptors", "MatMul forward with bias");
    } else {
        cublasLtMatmulHeuristicResult_t res;
        int found = 0;
        memset(&res, 0, sizeof res);
        s = cublasLtMatmulAlgoGetHeuristic(lt, desc, lb, la, ly, ly, pref, 1, &res, &found);
        /* No algorithm (CUBLAS_STATUS_NOT_SUPPORTED among others): the
         * other path; an error comes from the call itself. */
        if (s == CUBLAS_STATUS_SUCCESS && found > 0 && res.state == CUBLAS_STATUS_SUCCESS) {
            float alpha = 1.0f, beta = 0.0f;
            s = cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias);
            if (s == CUBLAS_STATUS_SUCCESS)
                s = cublasLtMatmul(lt, desc, &alpha, b, lb, a, la, &beta, y, ly, y, ly, &res.algo,
                                   c->cublas_workspace, (size_t)ws, c->stream);
            st = blas_status(c, err, s, "cublasLtMatmul", "MatMul forward with bias");
            *done = st == GP_OK;
        } else {
            note_bias_pass(0,
                           "cuBLASLt has no bias-epilogue algorithm for %lld x %lld x %lld (%s; bias %s, Y %s; "
                           "status %d, %d found, state %d)",
                           (long long)m, (long long)n, (long long)k, mode, type_name((cudaDataType_t)bias_type),
                           type_name(t->c), (int)s, found, (int)res.state);
        }
    }
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (ly) cublasLtMatrixLayoutDestroy(ly);
    if (la) cublasLtMatrixLayoutDestroy(la);
    if (lb) cublasLtMatrixLayoutDestroy(lb);
    if (desc) cublasLtMatmulDescDestroy(desc);
    return st;
}

/* Y [rows, n] += bias [n] in place, each sum in float32 rounded once to
 * Y's storage F (R the bias's): the unfused Add's arithmetic. */
template <class F, class R>
__global__ static void add_bias_kernel(F *y, const R *bias, int64_t rows, int64_t n)
{
    GP_GRID_STRIDE(e, rows * n) gp_store(y + e, gp_load(y + e) + gp_load(bias + e % n));
}

template <class F, class R>
static gp_status add_bias_launch(const struct gp_cuda_ctx *c, void *y, const void *bias, int64_t rows, int64_t n,
                                 struct gp_error *err)
{
    int64_t numel = rows * n;
    if (numel == 0) return GP_OK;
    /* On runs where they fit (row_runs.cuh's preconditions), in place:
     * each thread reads its run before writing it. */
    if (n % RUN_W == 0 && numel / RUN_W <= (int64_t)UINT32_MAX && gp_runs_fit(numel, RUN_W, sizeof(F), {y}) &&
        gp_runs_fit(n, RUN_W, sizeof(R), {bias})) {
        int64_t runs = numel / RUN_W;
        row_forward_runs_kernel<F, R><<<gp_cuda_blocks_for((runs + 1) / 2), GP_CUDA_THREADS, 0, c->stream>>>(
            ROW_ADD, false, false, (const F *)y, (const R *)bias, (F *)y, (uint32_t)(n / RUN_W), runs);
    } else {
        add_bias_kernel<F, R><<<gp_cuda_blocks_for(numel), GP_CUDA_THREADS, 0, c->stream>>>((F *)y, (const R *)bias,
                                                                                            rows, n);
    }
    return gp_cuda_check_launch(c, "MatMul forward: bias", err);
}

static gp_status add_bias(const struct gp_cuda_ctx *c, void *y, bool y_bf16, const void *bias, bool bias_bf16,
                          int64_t rows, int64_t n, struct gp_error *err)
{
    if (y_bf16 && bias_bf16) return add_bias_launch<bf16_t, bf16_t>(c, y, bias, rows, n, err);
    if (y_bf16) return add_bias_launch<bf16_t, float>(c, y, bias, rows, n, err);
    if (bias_bf16) return add_bias_launch<float, bf16_t>(c, y, bias, rows, n, err);
    return add_bias_launch<float, float>(c, y, bias, rows, n, err);
}

/* The Add's plan of Y = P + bias (operands P, bias, Y): the plan, and so
 * the chunks, binary.cu's gradient of the bias takes. */
static void bias_plan(const struct gp_graph *g, const struct gp_node *node, struct bplan *p)
{
    const struct gp_shape *y = &gp_node_output(g, node, 0)->shape;
    const struct gp_shape *shapes[3] = {y, &gp_node_input(g, node, 2)->shape, y};
    bplan_init(p, y, 3, shapes);
}

/* dBias += the column sums of dY [rows, n] (G dY's storage, D dBias'): in
 * chunks on runs then folded in a fixed order (row_runs.cuh, the Add's
 * kernels) where they fit, else gemm_dc_cols_kernel's sums in double. */
template <class G, class D>
static gp_status bias_grad_launch(const struct gp_cuda_ctx *c, const void *dy, void *dbias, struct gp_error *err)
{
    struct bplan p;
    bias_plan(c->graph, c->node, &p);
    if (p.numel == 0) return GP_OK;
    const char *what = "MatMul backward (bias)";
    struct bsplit s;
    bsplit_init(&s, &p, 1);
    int64_t chunk, nch;
    reduce_chunks(s.ne, s.nred, &chunk, &nch);
    if (p.rank == 2 && p.st[1][0] == 0 && p.st[1][1] == 1 && nch > 1 && c->scratch &&
        p.dims[1] % RUN_W == 0 && p.numel / RUN_W <= (int64_t)UINT32_MAX &&
        gp_runs_fit(p.numel, RUN_W, sizeof(G), {dy})) {
        row_grad_part_kernel<G><<<gp_cuda_blocks_for(p.dims[1] / GRAD_W * nch), GP_CUDA_THREADS, 0, c->stream>>>(
            false, (const G *)dy, (const G *)NULL, p.dims[0], p.dims[1], chunk, nch, (double *)c->scratch);
        GP_TRY(gp_cuda_check_launch(c, what, err));
        reduce_finish_kernel<D *><<<gp_cuda_blocks_for(s.ne * 32), GP_CUDA_THREADS, 0, c->stream>>>(
            p, s, 1, nch, (const double *)c->scratch, (D *)dbias);
        return gp_cuda_check_launch(c, what, err);
    }
    int64_t n = s.ne, rows = p.numel / n;
    dim3 block(COL_TILE, COL_ROWS);
    gemm_dc_cols_kernel<D, G><<<(unsigned)((n + COL_TILE - 1) / COL_TILE), block, 0, c->stream>>>(
        (D *)dbias, (const G *)dy, 1.0, rows, n);
    return gp_cuda_check_launch(c, what, err);
}

static gp_status bias_grad(const struct gp_cuda_ctx *c, struct gp_error *err)
{
    bool g16 = gp_cuda_is_bf16(c->dout_dt, 0), d16 = gp_cuda_is_bf16(c->din_dt, 2);
    if (g16 && d16) return bias_grad_launch<bf16_t, bf16_t>(c, c->dout[0], c->din[2], err);
    if (g16) return bias_grad_launch<bf16_t, float>(c, c->dout[0], c->din[2], err);
    if (d16) return bias_grad_launch<float, bf16_t>(c, c->dout[0], c->din[2], err);
    return bias_grad_launch<float, float>(c, c->dout[0], c->din[2], err);
}

static gp_status matmul_forward(struct gp_cuda_ctx *c, struct gp_error *err)
{
    GP_TRY(want_f32(c, err));
    struct matmul_plan p;
    matmul_plan(c, &p);
    const void *a = c->in[0], *b = c->in[1];
    void *y = c->out[0];
    struct mm_types t;
    GP_TRY(mm_types_of(c, err, "MatMul forward", gp_cuda_is_bf16(c->in_dt, 0), gp_cuda_is_bf16(c->in_dt, 1),
                       gp_cuda_is_bf16(c->out_dt, 0), &t));
    bool tb = c->node->trans_b;
    bool bias = c->node->fused_bias, bias16 = bias && gp_cuda_is_bf16(c->in_dt, 2);
    if (p.nbm == 1 && p.na == p.batch) { /* one B for a whole batch of A: the batch folds into rows */
        if (bias) {
            bool done;
            GP_TRY(lt_gemm_bias(c, err, &t, tb, p.batch * p.m, p.n, p.k, a, b, c->in[2], bias16, y, &done));
            if (done) return GP_OK;
        }
        GP_TRY(rm_gemm(c, err, "MatMul forward", &t, false, tb, p.batch * p.m, p.n, p.k, 1.0f, a, p.k,
                       0, b, tb ? p.k : p.n, 0, 0.0f, y, p.n, 0, 1));
    } else {
        if (tb) return gp_cuda_error(c, err, GP_ERR_INVALID, "MatMul: a transposed B shared by a batch of A only");
        if (bias)
            note_bias_pass(1, "%lld x %lld x %lld (%s) not offered to cuBLASLt (B one matrix per batch entry)",
                           (long long)p.m, (long long)p.n, (long long)p.k,
                           t.ab == CUDA_R_16BF ? "bf16" : c->tf32 ? "tf32" : "fp32");
        struct batch_axes ax;
        batch_axes_init(&ax, p.nb, p.dims, p.sa, p.sb, p.sy);
        GP_TRY(batched_gemm(c, err, "MatMul forward", &t, &ax, false, false, p.m, p.n, p.k, a, p.k,
                            p.m * p.k, b, p.n, p.k * p.n, 0.0f, y, p.m * p.n));
    }
    if (!bias) return GP_OK;
    return add_bias(c, y, t.c == CUDA_R_16BF, c->in[2], bias16, p.batch * p.m, p.n, err);
}

/* The reduction of per-entry products P [batch, mat] into an operand's
 * gradient D [count, mat]: `kept` axes are the operand's own (stride in D's
 * matrices and in P's), `red` those it was broadcast along (stride in P's). */
struct red_plan {
    int nk, nr;
    int64_t kdims[GP_MAX_RANK], kd[GP_MAX_RANK], kp[GP_MAX_RANK];
    int64_t rdims[GP_MAX_RANK], rp[GP_MAX_RANK];
    int64_t count; /* D's matrices */
};

/* D [count, mat] += the sum of P's matrices that share each of D's, added
 * one after another in batch order (the CPU's order of accumulation); P
 * float32, D in storage TD (a bfloat16 D rounded once, at the end). */
template <typename TD>
__global__ static void reduce_batch_kernel(TD *D, const float *P, int64_t mat, struct red_plan rp)
{
    GP_GRID_STRIDE(e, rp.count * mat)
    {
        int64_t d = e / mat, r = e - d * mat, base = 0;
        for (int q = 0; q < rp.nk; q++) base += ((d / rp.kd[q]) % rp.kdims[q]) * rp.kp[q];
        int64_t idx[GP_MAX_RANK];
        for (int q = 0; q < rp.nr; q++) idx[q] = 0;
        float acc = gp_load(D + e);
        int64_t off = base;
        for (int q = 0; q >= 0;) {
            acc = __fadd_rn(acc, P[off * mat + r]);
            /* Odometer over the reduced axes, the last one fastest. */
            for (q = rp.nr - 1; q >= 0; q--) {
                off += rp.rp[q];
                if (++idx[q] < rp.rdims[q]) break;
                off -= rp.rp[q] * rp.rdims[q];
                idx[q] = 0;
            }
        }
        gp_store(D + e, acc);
    }
}

/* D += the batch sums of P (reduce_batch_kernel) in D's storage. */
static gp_status launch_reduce(const struct gp_cuda_ctx *c, void *D, bool d_bf16, const float *P, int64_t mat,
                               const struct red_plan *rp, const char *what, struct gp_error *err)
{
    if (rp->count * mat <= 0) return GP_OK;
    unsigned blocks = gp_cuda_blocks_for(rp->count * mat);
    if (d_bf16)
        reduce_batch_kernel<bf16_t><<<blocks, GP_CUDA_THREADS, 0, c->stream>>>((bf16_t *)D, P, mat, *rp);
    else
        reduce_batch_kernel<float><<<blocks, GP_CUDA_THREADS, 0, c->stream>>>((float *)D, P, mat, *rp);
    return gp_cuda_check_launch(c, what, err);
}

/* The reduction plan of an operand with batch strides `s` (0: broadcast). */
static void red_plan_init(struct red_plan *rp, const struct matmul_plan *p, const int64_t *s,
                          int64_t count)
{
    memset(rp, 0, sizeof *rp);
    rp->count = count;
    for (int i = 0; i < p->nb; i++) {
        if (p->dims[i] == 1) continue;
        if (s[i]) {
            rp->kdims[rp->nk] = p->dims[i];
            rp->kd[rp->nk] = s[i];
            rp->kp[rp->nk] = p->sy[i];
            rp->nk++;
        } else {
            rp->rdims[rp->nr] = p->dims[i];
            rp->rp[rp->nr] = p->sy[i];
            rp->nr++;
        }
    }
}

/* Scratch: the per-entry products of a broadcast operand's gradient
 * (float32 in either storage, so the batch sum rounds once). */
static size_t matmul_scratch(const struct gp_graph *g, const struct gp_node *node)
{
    struct gp_cuda_ctx c;
    memset(&c, 0, sizeof c);
    c.graph = g;
    c.node = node;
    struct matmul_plan p;
    matmul_plan(&c, &p);
    size_t bias = 0; /* the bias gradient's chunk sums */
    if (node->fused_bias) {
        struct bplan bp;
        bias_plan(g, node, &bp);
        bias = reduce_scratch(&bp, 1);
    }
    if (p.nbm == 1 && p.na == p.batch) return bias;
    int64_t need = 0;
    if (p.na < p.batch) need = p.batch * p.m * p.k;
    if (p.nbm < p.batch && p.batch * p.k * p.n > need) need = p.batch * p.k * p.n;
    size_t prod = sizeof(float) * (size_t)need;
    return prod > bias ? prod : bias;
}

/* dY [..., M, N] -> dA += dY B^T, dB += A^T dY, each summed over the batch
 * entries that share the operand's matrix. */
static gp_status matmul_backward(struct gp_cuda_ctx *c, struct gp_error *err)
{
    GP_TRY(want_f32(c, err));
    struct matmul_plan p;
    matmul_plan(c, &p);
    const void *a = c->in[0], *b = c->in[1], *dy = c->dout[0];
    void *da = c->din[0], *db = c->din[1];
    if (!dy) return GP_OK;
    /* The bias first: its chunk sums use the scratch, which the products
     * of a broadcast operand below may then reuse (one stream: in order). */
    if (c->node->fused_bias && c->din[2]) GP_TRY(bias_grad(c, err));
    bool ab = gp_cuda_is_bf16(c->in_dt, 0), bb = gp_cuda_is_bf16(c->in_dt, 1);
    bool yb = gp_cuda_is_bf16(c->dout_dt, 0);
    bool dab = gp_cuda_is_bf16(c->din_dt, 0), dbb = gp_cuda_is_bf16(c->din_dt, 1);
    struct mm_types ta, tb; /* dA's product (dY, B) and dB's (A, dY) */
    if (da) GP_TRY(mm_types_of(c, err, "MatMul backward (A)", yb, bb, dab, &ta));
    if (db) GP_TRY(mm_types_of(c, err, "MatMul backward (B)", ab, yb, dbb, &tb));
    int64_t ma = p.m * p.k, mb = p.k * p.n, my = p.m * p.n;
    bool trans_b = c->node->trans_b;
    if (p.nbm == 1 && p.na == p.batch) {
        int64_t rows = p.batch * p.m;
        /* dA = dY B^T; with B stored transposed, dY times the stored [N, K]. */
        if (da)
            GP_TRY(rm_gemm(c, err, "MatMul backward (A)", &ta, false, !trans_b, rows, p.k, p.n, 1.0f, dy, p.n,
                           0, b, trans_b ? p.k : p.n, 0, 1.0f, da, p.k, 0, 1));
        /* The batch sum of A_i^T dY_i is one product over the rows; the
         * stored transpose's gradient is its transpose, dY^T A. */
        if (db && trans_b)
            GP_TRY(rm_gemm(c, err, "MatMul backward (B)", &tb, true, false, p.n, p.k, rows, 1.0f, dy, p.n,
                           0, a, p.k, 0, 1.0f, db, p.k, 0, 1));
        else if (db)
            GP_TRY(rm_gemm(c, err, "MatMul backward (B)", &tb, true, false, p.k, p.n, rows, 1.0f, a, p.k,
                           0, dy, p.n, 0, 1.0f, db, p.n, 0, 1));
        return GP_OK;
    }
    if (trans_b)
        return gp_cuda_error(c, err, GP_ERR_INVALID, "MatMul: a transposed B shared by a batch of A only");
    float *scratch = (float *)c->scratch;
    if (da) {
        /* dA_i = dY_i [m, n] . B_i^T [n, k]. */
        if (p.na == p.batch) {
            struct batch_axes ax;
            batch_axes_init(&ax, p.nb, p.dims, p.sy, p.sb, p.sa);
            GP_TRY(batched_gemm(c, err, "MatMul backward (A)", &ta, &ax, false, true, p.m, p.k, p.n, dy,
                                p.n, my, b, p.n, mb, 1.0f, da, ma));
        } else {
            struct batch_axes ax;
            batch_axes_init(&ax, p.nb, p.dims, p.sy, p.sb, p.sy);
            struct mm_types ts = {ta.ab, CUDA_R_32F};
            GP_TRY(batched_gemm(c, err, "MatMul backward (A), per batch entry", &ts, &ax, false, true, p.m,
                                p.k, p.n, dy, p.n, my, b, p.n, mb, 0.0f, scratch, ma));
            struct red_plan rp;
            red_plan_init(&rp, &p, p.sa, p.na);
            GP_TRY(launch_reduce(c, da, dab, scratch, ma, &rp, "MatMul backward (A): batch sum", err));
        }
    }
    if (db) {
        /* dB_i = A_i^T [k, m] . dY_i [m, n]. */
        if (p.nbm == p.batch) {
            struct batch_axes ax;
            batch_axes_init(&ax, p.nb, p.dims, p.sa, p.sy, p.sb);
            GP_TRY(batched_gemm(c, err, "MatMul backward (B)", &tb, &ax, true, false, p.k, p.n, p.m, a,
                                p.k, ma, dy, p.n, my, 1.0f, db, mb));
        } else {
            struct batch_axes ax;
            batch_axes_init(&ax, p.nb, p.dims, p.sa, p.sy, p.sy);
            struct mm_types ts = {tb.ab, CUDA_R_32F};
            GP_TRY(batched_gemm(c, err, "MatMul backward (B), per batch entry", &ts, &ax, true, false, p.k,
                                p.n, p.m, a, p.k, ma, dy, p.n, my, 0.0f, scratch, mb));
            struct red_plan rp;
            red_plan_init(&rp, &p, p.sb, p.nbm);
            GP_TRY(launch_reduce(c, db, dbb, scratch, mb, &rp, "MatMul backward (B): batch sum", err));
        }
    }
    return GP_OK;
}

extern "C" const struct gp_cuda_kernel gp_cuda_kernels_matmul[] = {
    {"Gemm", NULL, NULL, gemm_forward, gemm_backward, true},
    {"MatMul", NULL, matmul_scratch, matmul_forward, matmul_backward, true},
    {NULL, NULL, NULL, NULL, NULL, false},
};
