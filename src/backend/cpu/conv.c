/* CPU kernels: Conv and ConvTranspose, forward and backward, through
 * im2col / col2im and BLAS.
 *
 * Conv unfolds each sample's group of input channels into a column matrix
 * (one row per channel and kernel tap, one column per output position) and
 * multiplies it by the group's weights; ConvTranspose is the same linear map
 * transposed, so its forward is Conv's input gradient and its backward
 * reuses Conv's unfolding on the output gradient. The window geometry comes
 * from gp_window_resolve, as in shape inference. One column matrix (one
 * group of one sample) lives in the node's scratch buffer, so samples and
 * groups run one after another: threads share each product's tiles
 * (gp_cpu_gemm) and split unfolding by rows and folding by channels, so
 * results do not depend on the thread count. Up to 3 spatial axes. */
#include <limits.h>
#include <string.h>

#include "backend/cpu/gemm.h"
#include "backend/cpu/kernel.h"
#include "ops/window.h"

#define MAX_AXES 3
/* Below this many elements a parallel region costs more than it saves. */
#define PAR_MIN 32768

/* Window geometry over exactly 3 spatial axes: fewer are padded in front
 * with axes of size 1. The "image" is the large side (Conv's input,
 * ConvTranspose's output), the "columns" the window positions (Conv's
 * output, ConvTranspose's input): tap t of position o reads image cell
 * o * stride - pad + t * dilation. */
struct geom {
    int64_t img[MAX_AXES], col[MAX_AXES];
    int64_t k[MAX_AXES], s[MAX_AXES], d[MAX_AXES], p[MAX_AXES];
    int64_t img_size, col_size, k_size; /* products over the axes */
    bool pointwise; /* the column matrix is the image itself (1x1, stride 1, no pads) */
};

struct conv_plan {
    int64_t n, c, m, group;  /* batch, input channels, output channels, groups */
    int64_t cg, mg;          /* channels per group: input, output */
    struct geom g;
};

/* Resolves the node's window as shape inference did. `transpose` selects
 * ConvTranspose, whose image is the output. */
static gp_status conv_plan(const struct gp_graph *graph, const struct gp_node *node,
                           bool transpose, struct conv_plan *p, struct gp_error *err)
{
    const struct gp_value *x = gp_node_input(graph, node, 0), *w = gp_node_input(graph, node, 1);
    /* gp_window_resolve only reads the node's attributes; its context type
     * is the (mutable) inference one. */
    struct gp_infer_ctx ic = {(struct gp_graph *)graph, (struct gp_node *)node, err};
    struct gp_window win;
    GP_TRY(gp_window_resolve(&ic, transpose ? GP_WINDOW_CONV_TRANSPOSE : GP_WINDOW_CONV,
                             &x->shape, &w->shape.dims[2], &win));
    if (win.n_spatial > MAX_AXES)
        return gp_error_set(err, GP_ERR_UNSUPPORTED,
                            "node '%s' (%s): the CPU backend convolves up to %d spatial axes, "
                            "not %d",
                            node->name, node->op_type, MAX_AXES, win.n_spatial);
    p->n = x->shape.dims[0];
    p->c = x->shape.dims[1];
    p->group = gp_node_attr_int(node, "group", 1);
    p->cg = p->c / p->group;
    p->mg = transpose ? w->shape.dims[1] : w->shape.dims[0] / p->group;
    p->m = p->mg * p->group;
    struct geom *g = &p->g;
    int pad = MAX_AXES - win.n_spatial;
    g->img_size = g->col_size = g->k_size = 1;
    g->pointwise = true;
    for (int i = 0; i < MAX_AXES; i++) {
        int j = i - pad;
        bool real_axis = j >= 0;
        int64_t in = real_axis ? win.in[j] : 1, out = real_axis ? win.out[j] : 1;
        g->img[i] = transpose ? out : in;
        g->col[i] = transpose ? in : out;
        g->k[i] = real_axis ? win.kernel[j] : 1;
        g->s[i] = real_axis ? win.stride[j] : 1;
        g->d[i] = real_axis ? win.dilation[j] : 1;
        g->p[i] = real_axis ? win.pad_begin[j] : 0;
        g->img_size *= g->img[i];
        g->col_size *= g->col[i];
        g->k_size *= g->k[i];
        if (g->k[i] != 1 || g->s[i] != 1 || g->p[i] != 0 || g->img[i] != g->col[i])
            g->pointwise = false;
    }
    int64_t rows = (transpose ? p->mg : p->cg) * g->k_size;
    if (rows > INT_MAX || g->col_size > INT_MAX || p->m > INT_MAX || p->c > INT_MAX)
        return gp_error_set(err, GP_ERR_UNSUPPORTED,
                            "node '%s' (%s): the column matrix [%lld, %lld] exceeds BLAS's int "
                            "sizes",
                            node->name, node->op_type, (long long)rows, (long long)g->col_size);
    return GP_OK;
}

/* C [m, n] = A' [m, k] B' [k, n] + beta * C, row-major, A' = A^T when ta. */
static void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const real *a, int64_t lda,
                 const real *b, int64_t ldb, real beta, real *c, int64_t ldc)
{
    gp_cpu_gemm(ta, tb, m, n, k, 1, a, lda, b, ldb, beta, c, ldc);
}

/* Positions o in [0, n) whose tap o * s + off falls inside [0, size):
 * [*lo, *hi). */
static void valid_range(int64_t s, int64_t off, int64_t size, int64_t n, int64_t *lo, int64_t *hi)
{
    int64_t l = off >= 0 ? 0 : (-off + s - 1) / s;
    int64_t h = size - off <= 0 ? 0 : (size - off + s - 1) / s;
    if (h > n) h = n;
    if (l > h) l = h;
    *lo = l;
    *hi = h;
}

/* Image [ch, img...] -> columns [ch * k_size, col_size]; taps outside the
 * image (padding) are 0. */
static void im2col(const struct geom *g, int64_t ch, const real *img, real *col)
{
    int64_t rows = ch * g->k_size;
#pragma omp parallel for if (rows * g->col_size > PAR_MIN)
    for (int64_t r = 0; r < rows; r++) {
        int64_t cc = r / g->k_size, t = r % g->k_size;
        int64_t t2 = t % g->k[2], t1 = (t / g->k[2]) % g->k[1], t0 = t / (g->k[2] * g->k[1]);
        const real *src = img + cc * g->img_size;
        real *dst = col + r * g->col_size;
        int64_t off0 = t0 * g->d[0] - g->p[0], off1 = t1 * g->d[1] - g->p[1];
        int64_t off2 = t2 * g->d[2] - g->p[2];
        int64_t lo2, hi2;
        valid_range(g->s[2], off2, g->img[2], g->col[2], &lo2, &hi2);
        for (int64_t o0 = 0; o0 < g->col[0]; o0++) {
            int64_t i0 = o0 * g->s[0] + off0;
            for (int64_t o1 = 0; o1 < g->col[1]; o1++) {
                int64_t i1 = o1 * g->s[1] + off1;
                real *out = dst + (o0 * g->col[1] + o1) * g->col[2];
                if (i0 < 0 || i0 >= g->img[0] || i1 < 0 || i1 >= g->img[1]) {
                    memset(out, 0, sizeof(real) * (size_t)g->col[2]);
                    continue;
                }
                const real *row = src + (i0 * g->img[1] + i1) * g->img[2];
                for (int64_t o2 = 0; o2 < lo2; o2++) out[o2] = 0;
                if (g->s[2] == 1)
                    memcpy(out + lo2, row + lo2 + off2, sizeof(real) * (size_t)(hi2 - lo2));
                else
                    for (int64_t o2 = lo2; o2 < hi2; o2++) out[o2] = row[o2 * g->s[2] + off2];
                for (int64_t o2 = hi2; o2 < g->col[2]; o2++) out[o2] = 0;
            }
        }
    }
}

/* Columns [ch * k_size, col_size] -> image [ch, img...], ADDING each tap
 * into its cell and dropping taps in the padding. One thread per channel,
 * whose taps it adds in a fixed order. */
static void col2im(const struct geom *g, int64_t ch, const real *col, real *img)
{
#pragma omp parallel for if (ch * g->k_size * g->col_size > PAR_MIN)
    for (int64_t cc = 0; cc < ch; cc++) {
        real *dst = img + cc * g->img_size;
        for (int64_t t = 0; t < g->k_size; t++) {
            int64_t t2 = t % g->k[2], t1 = (t / g->k[2]) % g->k[1], t0 = t / (g->k[2] * g->k[1]);
            const real *src = col + (cc * g->k_size + t) * g->col_size;
            int64_t off0 = t0 * g->d[0] - g->p[0], off1 = t1 * g->d[1] - g->p[1];
            int64_t off2 = t2 * g->d[2] - g->p[2];
            int64_t lo2, hi2;
            valid_range(g->s[2], off2, g->img[2], g->col[2], &lo2, &hi2);
            for (int64_t o0 = 0; o0 < g->col[0]; o0++) {
                int64_t i0 = o0 * g->s[0] + off0;
                if (i0 < 0 || i0 >= g->img[0]) continue;
                for (int64_t o1 = 0; o1 < g->col[1]; o1++) {
                    int64_t i1 = o1 * g->s[1] + off1;
                    if (i1 < 0 || i1 >= g->img[1]) continue;
                    const real *in = src + (o0 * g->col[1] + o1) * g->col[2];
                    real *row = dst + (i0 * g->img[1] + i1) * g->img[2];
                    for (int64_t o2 = lo2; o2 < hi2; o2++) row[o2 * g->s[2] + off2] += in[o2];
                }
            }
        }
    }
}

/* Y [N, M, P] (P positions per channel): each channel filled with its
 * bias, or 0. */
static void fill_bias(real *y, const real *bias, int64_t n, int64_t m, int64_t p)
{
#pragma omp parallel for if (n * m * p > PAR_MIN)
    for (int64_t nm = 0; nm < n * m; nm++) {
        real v = bias ? bias[nm % m] : 0;
        for (int64_t i = 0; i < p; i++) y[nm * p + i] = v;
    }
}

/* dB [M] += dY [N, M, P] summed over N and P, per channel in a fixed order. */
static void bias_grad(real *db, const real *dy, int64_t n, int64_t m, int64_t p)
{
#pragma omp parallel for if (n * m * p > PAR_MIN)
    for (int64_t j = 0; j < m; j++) {
        double s = 0;
        for (int64_t i = 0; i < n; i++) {
            const real *row = dy + (i * m + j) * p;
            for (int64_t q = 0; q < p; q++) s += row[q];
        }
        db[j] += (real)s;
    }
}

/* ---- Conv ---- */

/* Column matrix of one group of one sample: [Cg * k_size, col_size]. */
static size_t conv_scratch(const struct gp_graph *graph, const struct gp_node *node)
{
    struct conv_plan p;
    struct gp_error err = {0};
    if (conv_plan(graph, node, false, &p, &err) != GP_OK || p.g.pointwise) return 0;
    return sizeof(real) * (size_t)(p.cg * p.g.k_size * p.g.col_size);
}

/* X [N, C, D...], W [M, C/group, k...], optional B [M] -> Y [N, M, O...]:
 * per sample and group, Y_g [Mg, P] = W_g [Mg, Cg*K] . cols(X_g) [Cg*K, P]. */
static gp_status conv_forward(struct gp_cpu_ctx *c, struct gp_error *err)
{
    struct conv_plan p;
    GP_TRY(conv_plan(c->graph, c->node, false, &p, err));
    const real *x = c->in[0], *w = c->in[1], *bias = c->in[2];
    real *y = c->out[0], *col = c->scratch;
    const struct geom *g = &p.g;
    int64_t kk = p.cg * g->k_size;
    /* Bias first and the products added to it, as PyTorch's unfolded conv. */
    fill_bias(y, bias, p.n, p.m, g->col_size);
    for (int64_t n = 0; n < p.n; n++)
        for (int64_t gi = 0; gi < p.group; gi++) {
            const real *xg = x + (n * p.c + gi * p.cg) * g->img_size;
            const real *cols = xg;
            if (!g->pointwise) {
                im2col(g, p.cg, xg, col);
                cols = col;
            }
            gemm(false, false, p.mg, g->col_size, kk, w + gi * p.mg * kk, kk, cols, g->col_size, 1,
                 y + (n * p.m + gi * p.mg) * g->col_size, g->col_size);
        }
    return GP_OK;
}

/* dY [N, M, O...] -> dW_g += dY_g . cols(X_g)^T summed over samples in
 * order; dX_g += col2im(W_g^T . dY_g); dB += dY summed over N and O. */
static gp_status conv_backward(struct gp_cpu_ctx *c, struct gp_error *err)
{
    struct conv_plan p;
    GP_TRY(conv_plan(c->graph, c->node, false, &p, err));
    const real *x = c->in[0], *w = c->in[1], *dy = c->dout[0];
    real *dx = c->din[0], *dw = c->din[1], *db = c->din[2], *col = c->scratch;
    if (!dy) return GP_OK;
    const struct geom *g = &p.g;
    int64_t kk = p.cg * g->k_size;
    for (int64_t n = 0; n < p.n; n++)
        for (int64_t gi = 0; gi < p.group; gi++) {
            const real *xg = x + (n * p.c + gi * p.cg) * g->img_size;
            const real *dyg = dy + (n * p.m + gi * p.mg) * g->col_size;
            const real *wg = w + gi * p.mg * kk;
            real *dxg = dx ? dx + (n * p.c + gi * p.cg) * g->img_size : NULL;
            if (dw) {
                const real *cols = xg;
                if (!g->pointwise) {
                    im2col(g, p.cg, xg, col);
                    cols = col;
                }
                gemm(false, true, p.mg, kk, g->col_size, dyg, g->col_size, cols, g->col_size, 1,
                     dw + gi * p.mg * kk, kk);
            }
            if (dxg) {
                if (g->pointwise) {
                    gemm(true, false, kk, g->col_size, p.mg, wg, kk, dyg, g->col_size, 1, dxg,
                         g->col_size);
                } else {
                    gemm(true, false, kk, g->col_size, p.mg, wg, kk, dyg, g->col_size, 0, col,
                         g->col_size);
                    col2im(g, p.cg, col, dxg);
                }
            }
        }
    if (db) bias_grad(db, dy, p.n, p.m, g->col_size);
    return GP_OK;
}

/* ---- ConvTranspose ---- */

/* Column matrix of one group of one sample: [Mg * k_size, input positions]. */
static size_t conv_transpose_scratch(const struct gp_graph *graph, const struct gp_node *node)
{
    struct conv_plan p;
    struct gp_error err = {0};
    if (conv_plan(graph, node, true, &p, &err) != GP_OK || p.g.pointwise) return 0;
    return sizeof(real) * (size_t)(p.mg * p.g.k_size * p.g.col_size);
}

/* X [N, C, D...], W [C, M/group, k...], optional B [M] -> Y [N, M, O...]:
 * per sample and group, Y_g = B + col2im(W_g^T [Mg*K, Cg] . X_g [Cg, P]).
 * Output cells no tap reaches (output_padding, a larger output_shape) keep
 * the bias. */
static gp_status conv_transpose_forward(struct gp_cpu_ctx *c, struct gp_error *err)
{
    struct conv_plan p;
    GP_TRY(conv_plan(c->graph, c->node, true, &p, err));
    const real *x = c->in[0], *w = c->in[1], *bias = c->in[2];
    real *y = c->out[0], *col = c->scratch;
    const struct geom *g = &p.g;
    int64_t kk = p.mg * g->k_size;
    fill_bias(y, bias, p.n, p.m, g->img_size);
    for (int64_t n = 0; n < p.n; n++)
        for (int64_t gi = 0; gi < p.group; gi++) {
            const real *xg = x + (n * p.c + gi * p.cg) * g->col_size;
            const real *wg = w + gi * p.cg * kk;
            real *yg = y + (n * p.m + gi * p.mg) * g->img_size;
            if (g->pointwise) {
                gemm(true, false, kk, g->col_size, p.cg, wg, kk, xg, g->col_size, 1, yg,
                     g->col_size);
            } else {
                gemm(true, false, kk, g->col_size, p.cg, wg, kk, xg, g->col_size, 0, col,
                     g->col_size);
                col2im(g, p.mg, col, yg);
            }
        }
    return GP_OK;
}

/* dY [N, M, O...] -> with C = cols(dY_g) [Mg*K, P]: dX_g += W_g . C,
 * dW_g += X_g . C^T summed over samples in order; dB += dY summed. */
static gp_status conv_transpose_backward(struct gp_cpu_ctx *c, struct gp_error *err)
{
    struct conv_plan p;
    GP_TRY(conv_plan(c->graph, c->node, true, &p, err));
    const real *x = c->in[0], *w = c->in[1], *dy = c->dout[0];
    real *dx = c->din[0], *dw = c->din[1], *db = c->din[2], *col = c->scratch;
    if (!dy) return GP_OK;
    const struct geom *g = &p.g;
    int64_t kk = p.mg * g->k_size;
    if (dx || dw)
        for (int64_t n = 0; n < p.n; n++)
            for (int64_t gi = 0; gi < p.group; gi++) {
                const real *dyg = dy + (n * p.m + gi * p.mg) * g->img_size;
                const real *cols = dyg;
                if (!g->pointwise) {
                    im2col(g, p.mg, dyg, col);
                    cols = col;
                }
                int64_t xo = (n * p.c + gi * p.cg) * g->col_size;
                if (dx)
                    gemm(false, false, p.cg, g->col_size, kk, w + gi * p.cg * kk, kk, cols,
                         g->col_size, 1, dx + xo, g->col_size);
                if (dw)
                    gemm(false, true, p.cg, kk, g->col_size, x + xo, g->col_size, cols,
                         g->col_size, 1, dw + gi * p.cg * kk, kk);
            }
    if (db) bias_grad(db, dy, p.n, p.m, g->img_size);
    return GP_OK;
}

const struct gp_cpu_kernel GP_CPU(gp_cpu_kernels_conv)[] = {
    {"Conv", NULL, conv_scratch, conv_forward, conv_backward},
    {"ConvTranspose", NULL, conv_transpose_scratch, conv_transpose_forward,
     conv_transpose_backward},
    {0},
};
