/* CPU kernels: Gemm and MatMul, forward and backward, through BLAS.
 *
 * Every product goes through gp_cpu_gemm, whose bits do not depend on the
 * thread count. Gradients that reduce over a batch (a broadcast MatMul
 * operand) either fold the batch into the inner dimension of one product or
 * accumulate the products one batch entry after another, in order.
 *
 * A MatMul with a fused bias (graph/fuse.c: input 2, b [N] or [1, ..., N])
 * adds b to every row of the product after BLAS has written it: the same
 * float add of the same two values as the Add it replaces, so the same
 * bits. b's gradient is the column sums of dY, each in double, row after
 * row, rounded once and added: the Add's sums (binary.c's BCAST_REDUCE
 * over its [rows, N] plan), so the same bits too. In bf16, b is read
 * through its bfloat16 copy as the weight is (pipeline/plan.c), as
 * PyTorch's autocast rounds a Linear's bias: the kernel, on float32 copies
 * (backend/mixed_call.h), adds the widened bfloat16 b to the float32
 * product, and the sum is rounded once to Y's bfloat16 storage, as
 * cuBLASLt's bias epilogue does on CUDA. b's gradient stays float32. */
#include <string.h>

#include "backend/cpu/gemm.h"
#include "backend/cpu/kernel.h"

/* BLAS takes int sizes: refuse products whose dimensions do not fit. */
static gp_status check_blas(const struct gp_cpu_ctx *c, struct gp_error *err, int64_t m,
                            int64_t n, int64_t k)
{
    if (gp_cpu_gemm_fits(m, n, k)) return GP_OK;
    return gp_cpu_error(c, err, GP_ERR_UNSUPPORTED,
                        "a matrix product of [%lld, %lld] x [%lld, %lld] exceeds BLAS's int sizes",
                        (long long)m, (long long)k, (long long)k, (long long)n);
}

/* Gemm, MatMul: the kernels below are written for float tensors only. */
static gp_status want_float(const struct gp_cpu_ctx *c, struct gp_error *err)
{
    const struct gp_value *a = gp_cpu_in_value(c, 0);
    if (gp_dtype_is_float(a->dtype)) return GP_OK;
    return gp_cpu_error(c, err, GP_ERR_UNSUPPORTED, "the CPU backend has no %s kernel for %s "
                        "tensors", c->node->op_type, gp_dtype_name(a->dtype));
}

/* ---- Gemm ---- */

/* Y [M, N] = alpha * A' B' + beta * C: A' is A [M, K] or, with transA, the
 * transpose of A [K, M]; B' is B [K, N] or, with transB, of B [N, K]; C
 * (optional) broadcasts to [M, N]. */
struct gemm_plan {
    bool ta, tb;
    int64_t m, n, k;
    real alpha, beta;
    int64_t c_row, c_col; /* C's strides over Y's rows and columns (0: broadcast) */
};

static void gemm_plan(const struct gp_cpu_ctx *c, struct gemm_plan *p)
{
    const struct gp_shape *sa = &gp_cpu_in_value(c, 0)->shape, *sb = &gp_cpu_in_value(c, 1)->shape;
    p->ta = gp_node_attr_int(c->node, "transA", 0) != 0;
    p->tb = gp_node_attr_int(c->node, "transB", 0) != 0;
    p->m = sa->dims[p->ta];
    p->k = sa->dims[1 - p->ta];
    p->n = sb->dims[1 - p->tb];
    p->alpha = (real)gp_node_attr_float(c->node, "alpha", 1.0f);
    p->beta = (real)gp_node_attr_float(c->node, "beta", 1.0f);
    p->c_row = p->c_col = 0;
    const struct gp_value *cv = gp_cpu_in_value(c, 2);
    if (!cv) return;
    const struct gp_shape *sc = &cv->shape;
    if (sc->rank >= 1) p->c_col = sc->dims[sc->rank - 1] == 1 ? 0 : 1;
    if (sc->rank == 2) p->c_row = sc->dims[0] == 1 ? 0 : sc->dims[1];
}

static gp_status gemm_forward(struct gp_cpu_ctx *c, struct gp_error *err)
{
    GP_TRY(want_float(c, err));
    struct gemm_plan p;
    gemm_plan(c, &p);
    GP_TRY(check_blas(c, err, p.m, p.n, p.k));
    const real *a = c->in[0], *b = c->in[1], *cm = c->in[2];
    real *y = c->out[0];
    /* Like PyTorch's addmm, beta == 0 ignores C (its NaNs included). */
    bool use_c = cm && p.beta != 0;
    if (use_c)
        for (int64_t i = 0; i < p.m; i++)
            for (int64_t j = 0; j < p.n; j++)
                y[i * p.n + j] = p.beta * cm[i * p.c_row + j * p.c_col];
    gp_cpu_gemm(p.ta, p.tb, p.m, p.n, p.k, p.alpha, a, p.ta ? p.m : p.k, b, p.tb ? p.k : p.n,
         use_c ? 1 : 0, y, p.n);
    return GP_OK;
}

/* dY [M, N] -> dA += alpha * dY B'^T (shaped like A), dB += alpha * A'^T dY
 * (shaped like B), dC += beta * dY summed over C's broadcast axes. */
static gp_status gemm_backward(struct gp_cpu_ctx *c, struct gp_error *err)
{
    (void)err;
    struct gemm_plan p;
    gemm_plan(c, &p);
    const real *a = c->in[0], *b = c->in[1], *dy = c->dout[0];
    real *da = c->din[0], *db = c->din[1], *dc = c->din[2];
    if (!dy) return GP_OK;
    int64_t lda = p.ta ? p.m : p.k, ldb = p.tb ? p.k : p.n;
    if (da) {
        if (!p.ta) /* dA [M, K] = dY [M, N] . B'^T */
            gp_cpu_gemm(false, !p.tb, p.m, p.k, p.n, p.alpha, dy, p.n, b, ldb, 1, da, p.k);
        else /* dA [K, M] = B' [K, N] . dY^T */
            gp_cpu_gemm(p.tb, true, p.k, p.m, p.n, p.alpha, b, ldb, dy, p.n, 1, da, p.m);
    }
    if (db) {
        if (!p.tb) /* dB [K, N] = A'^T [K, M] . dY */
            gp_cpu_gemm(!p.ta, false, p.k, p.n, p.m, p.alpha, a, lda, dy, p.n, 1, db, p.n);
        else /* dB [N, K] = dY^T [N, M] . A' */
            gp_cpu_gemm(true, p.ta, p.n, p.k, p.m, p.alpha, dy, p.n, a, lda, 1, db, p.k);
    }
    if (dc && p.beta != 0) {
        /* Each entry of C sums the rows and columns it was broadcast to, in
         * double, in order, and is added to once. */
        int64_t rows = p.c_row ? p.m : 1, cols = p.c_col ? p.n : 1;
#pragma omp parallel for if (p.m * p.n > 32768)
        for (int64_t e = 0; e < rows * cols; e++) {
            int64_t ci = e / cols, cj = e % cols;
            int64_t i0 = p.c_row ? ci : 0, i1 = p.c_row ? ci + 1 : p.m;
            int64_t j0 = p.c_col ? cj : 0, j1 = p.c_col ? cj + 1 : p.n;
            double sum = 0;
            for (int64_t i = i0; i < i1; i++)
                for (int64_t j = j0; j < j1; j++) sum += dy[i * p.n + j];
            dc[ci * p.c_row + cj * p.c_col] += (real)(p.beta * sum);
        }
    }
    return GP_OK;
}

/* ---- MatMul ---- */

/* A [..., M, K] x B [..., K, N] -> Y [..., M, N], the batch axes broadcast
 * numpy-style; a 1-D A is [1, K] and a 1-D B [K, 1], whose axis of size 1
 * Y drops (which leaves Y's memory layout unchanged). A trans_b node's B
 * is a 2-D weight stored [N, K] (graph/fuse.c), always the folded case. */
struct matmul_plan {
    int64_t m, n, k;
    int nb;                        /* batch axes of Y */
    int64_t dims[GP_MAX_RANK];     /* Y's batch dims */
    /* Per batch axis, the stride in matrices of A and of B (0: broadcast). */
    int64_t sa[GP_MAX_RANK], sb[GP_MAX_RANK];
    int64_t batch, na, nbm;        /* matrices in Y, A, B */
};

static void matmul_plan(const struct gp_cpu_ctx *c, struct matmul_plan *p)
{
    const struct gp_shape *sa = &gp_cpu_in_value(c, 0)->shape, *sb = &gp_cpu_in_value(c, 1)->shape;
    p->m = sa->rank >= 2 ? sa->dims[sa->rank - 2] : 1;
    p->k = sa->dims[sa->rank - 1];
    p->n = c->node->trans_b ? sb->dims[0] : sb->rank >= 2 ? sb->dims[sb->rank - 1] : 1;
    int ba = sa->rank > 2 ? sa->rank - 2 : 0, bb = sb->rank > 2 ? sb->rank - 2 : 0;
    p->nb = ba > bb ? ba : bb;
    int64_t ma = 1, mb = 1; /* running products of batch dims, from the right */
    p->batch = 1;
    for (int i = p->nb - 1; i >= 0; i--) {
        int ia = i - (p->nb - ba), ib = i - (p->nb - bb);
        int64_t da = ia >= 0 ? sa->dims[ia] : 1, db = ib >= 0 ? sb->dims[ib] : 1;
        p->dims[i] = da == 1 ? db : da;
        p->sa[i] = da == 1 ? 0 : ma;
        p->sb[i] = db == 1 ? 0 : mb;
        ma *= da;
        mb *= db;
        p->batch *= p->dims[i];
    }
    p->na = ma;
    p->nbm = mb;
}

/* y [rows, n] += b [n] on each row: a fused bias (in[2]). */
static void add_bias(const struct gp_cpu_ctx *c, const struct matmul_plan *p, real *y)
{
    const real *b = c->in[2];
    int64_t rows = p->batch * p->m, n = p->n;
#pragma omp parallel for if (rows * n > 32768) schedule(static)
    for (int64_t r = 0; r < rows; r++)
        for (int64_t j = 0; j < n; j++) y[r * n + j] = y[r * n + j] + b[j];
}

/* db [n] += the column sums of dy [rows, n], each in double in row order. */
static void bias_grad(const struct matmul_plan *p, const real *dy, real *db)
{
    int64_t rows = p->batch * p->m, n = p->n;
#pragma omp parallel for if (rows * n > 32768) schedule(static)
    for (int64_t j = 0; j < n; j++) {
        double acc = 0;
        for (int64_t r = 0; r < rows; r++) acc += (double)dy[r * n + j];
        db[j] = db[j] + (real)acc;
    }
}

/* Matrix offsets into A and B of Y's batch entry `b`. */
static void matmul_offsets(const struct matmul_plan *p, int64_t b, int64_t *oa, int64_t *ob)
{
    *oa = *ob = 0;
    for (int i = p->nb - 1; i >= 0; i--) {
        int64_t idx = b % p->dims[i];
        b /= p->dims[i];
        *oa += idx * p->sa[i];
        *ob += idx * p->sb[i];
    }
}

static gp_status matmul_forward(struct gp_cpu_ctx *c, struct gp_error *err)
{
    GP_TRY(want_float(c, err));
    struct matmul_plan p;
    matmul_plan(c, &p);
    const real *a = c->in[0], *b = c->in[1];
    real *y = c->out[0];
    int64_t sa = p.m * p.k, sb = p.k * p.n, sy = p.m * p.n;
    bool tb = c->node->trans_b;
    if (p.nbm == 1 && p.na == p.batch) {
        /* One B for a whole batch of A (x [B, T, C] @ W [C, N]): one product
         * with the batch folded into the rows. */
        GP_TRY(check_blas(c, err, p.batch * p.m, p.n, p.k));
        gp_cpu_gemm(false, tb, p.batch * p.m, p.n, p.k, 1, a, p.k, b, tb ? p.k : p.n, 0, y, p.n);
        if (c->node->fused_bias) add_bias(c, &p, y);
        return GP_OK;
    }
    if (tb) return gp_error_set(err, GP_ERR_INVALID, "MatMul: a transposed B shared by a batch of A only");
    GP_TRY(check_blas(c, err, p.m, p.n, p.k));
    for (int64_t i = 0; i < p.batch; i++) {
        int64_t oa, ob;
        matmul_offsets(&p, i, &oa, &ob);
        gp_cpu_gemm(false, false, p.m, p.n, p.k, 1, a + oa * sa, p.k, b + ob * sb, p.n, 0,
                    y + i * sy, p.n);
    }
    if (c->node->fused_bias) add_bias(c, &p, y);
    return GP_OK;
}

/* dY [..., M, N] -> dA += dY B^T, dB += A^T dY, each summed over the batch
 * entries that share the operand's matrix, in batch order. */
static gp_status matmul_backward(struct gp_cpu_ctx *c, struct gp_error *err)
{
    (void)err;
    struct matmul_plan p;
    matmul_plan(c, &p);
    const real *a = c->in[0], *b = c->in[1], *dy = c->dout[0];
    real *da = c->din[0], *db = c->din[1];
    if (!dy) return GP_OK;
    if (c->node->fused_bias && c->din[2]) bias_grad(&p, dy, c->din[2]);
    int64_t sa = p.m * p.k, sb = p.k * p.n, sy = p.m * p.n;
    bool tb = c->node->trans_b;
    if (p.nbm == 1 && p.na == p.batch) {
        int64_t rows = p.batch * p.m;
        /* dA = dY B^T; with B stored transposed, dY times the stored [N, K]. */
        if (da) gp_cpu_gemm(false, !tb, rows, p.k, p.n, 1, dy, p.n, b, tb ? p.k : p.n, 1, da, p.k);
        /* The batch sum of A_i^T dY_i is one product over rows; the stored
         * transpose's gradient is its transpose, dY^T A. */
        if (db && tb) gp_cpu_gemm(true, false, p.n, p.k, rows, 1, dy, p.n, a, p.k, 1, db, p.k);
        else if (db) gp_cpu_gemm(true, false, p.k, p.n, rows, 1, a, p.k, dy, p.n, 1, db, p.n);
        return GP_OK;
    }
    if (tb) return gp_error_set(err, GP_ERR_INVALID, "MatMul: a transposed B shared by a batch of A only");
    for (int64_t i = 0; i < p.batch; i++) {
        int64_t oa, ob;
        matmul_offsets(&p, i, &oa, &ob);
        if (da) gp_cpu_gemm(false, true, p.m, p.k, p.n, 1, dy + i * sy, p.n, b + ob * sb, p.n, 1,
                     da + oa * sa, p.k);
        if (db) gp_cpu_gemm(true, false, p.k, p.n, p.m, 1, a + oa * sa, p.k, dy + i * sy, p.n, 1,
                     db + ob * sb, p.n);
    }
    return GP_OK;
}

const struct gp_cpu_kernel GP_CPU(gp_cpu_kernels_matmul)[] = {
    {"Gemm", NULL, NULL, gemm_forward, gemm_backward},
    {"MatMul", NULL, NULL, matmul_forward, matmul_backward},
    {0},
};
