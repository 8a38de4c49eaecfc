/* The broadcasting engine of the binary family (binary.cu): plans over up
 * to four operands, the forward kernels' launch, and the sums of a
 * broadcast input's gradient terms over the axes it was broadcast along.
 *
 * One plan (bplan, the CPU's in backend/cpu/binary.c: size-1 axes dropped,
 * axes merged where every operand is contiguous across them) serves every
 * broadcasting op; forward kernels take a functor (the op) and the plan.
 * The gradient of a broadcast input is the sum of its terms over the axes
 * it was broadcast along, in double in row-major order as on the CPU: an
 * input that is not broadcast gets its one term per element through the
 * forward kernels' indexing; one thread per input element sums when each
 * has few terms; otherwise (a bias of a large activation) the terms are
 * cut into fixed chunks, summed in double by one thread per (element,
 * chunk) into scratch, and a warp per element adds the chunks in a fixed
 * order: deterministic, and the CPU's sum to double rounding. Forward
 * kernels take a block per row of the last axis when it is long (no
 * per-element division), else grid-stride loops with 32-bit index
 * arithmetic where the tensor fits; nothing uses atomics.
 *
 * Storage (bfloat16 stages, backend/cuda/bf16.cuh): the functors read and
 * write float tensors through ldf / stf on a pointer of the launch's
 * storage (stor<S>::ptr: float32 throughout, bfloat16 throughout, or a mix
 * of both, each tensor a gp_fptr), and a gradient (dst) is any of the
 * three: every += into it widens the stored value, adds the float sum of
 * its terms and rounds once, as the float32 copy of a staged call did. */
#ifndef GP_CUDA_BROADCAST_CUH
#define GP_CUDA_BROADCAST_CUH

#include <initializer_list>
#include <string.h>

#include "backend/cuda/bf16.cuh"
#include "backend/cuda/elementwise_storage.cuh"
#include "backend/cuda/kernel_util.cuh"

extern "C" {
#include "ops/fold_util.h"
}

/* ---- broadcast plans ---- */

#define BP_MAX 4 /* operands: up to three inputs and the output */

/* The output shape with size-1 axes dropped and neighbouring axes merged
 * wherever every operand is contiguous across them (the CPU's bplan, so
 * both backends sum the same terms in the same order). st[k][d]: operand
 * k's stride along axis d in elements, 0 where it is broadcast; operands
 * past n have all strides 0. Passed to kernels by value. */
struct bplan {
    int rank, n;
    int64_t numel;
    int64_t dims[GP_MAX_RANK];
    int64_t st[BP_MAX][GP_MAX_RANK];
};

static void bplan_init(struct bplan *p, const struct gp_shape *out, int n, const struct gp_shape *const *in)
{
    int64_t st[BP_MAX][GP_MAX_RANK];
    memset(p, 0, sizeof *p);
    p->n = n;
    p->numel = gp_shape_numel(out);
    for (int k = 0; k < n; k++) gp_bcast_strides(in[k], out, st[k]);
    for (int d = 0; d < out->rank; d++) {
        if (out->dims[d] == 1) continue;
        int r = p->rank - 1;
        bool merge = r >= 0;
        for (int k = 0; merge && k < n; k++) merge = p->st[k][r] == st[k][d] * out->dims[d];
        if (merge) {
            p->dims[r] *= out->dims[d];
            for (int k = 0; k < n; k++) p->st[k][r] = st[k][d];
            continue;
        }
        p->dims[p->rank] = out->dims[d];
        for (int k = 0; k < n; k++) p->st[k][p->rank] = st[k][d];
        p->rank++;
    }
    if (p->rank == 0) p->rank = 1, p->dims[0] = 1; /* a scalar output */
}

/* A plan over the node's inputs [first, first + n) and its output 0 (the
 * output is operand n). */
static void plan_graph(const struct gp_graph *g, const struct gp_node *node, int first, int n,
                       struct bplan *p)
{
    const struct gp_shape *shapes[BP_MAX];
    for (int k = 0; k < n; k++) shapes[k] = &gp_node_input(g, node, first + k)->shape;
    shapes[n] = &gp_node_output(g, node, 0)->shape;
    bplan_init(p, shapes[n], n + 1, shapes);
}

static void plan_node(const struct gp_cuda_ctx *c, int first, int n, struct bplan *p)
{
    plan_graph(c->graph, c->node, first, n, p);
}

/* Every output element i with its operands' offsets o[0..3]: f(i, o).
 * MODE 0: one axis, offsets i * stride (0 or 1): no division; 1: rows of
 * the last axis, a block per row, the row's offsets decoded once (bias
 * adds); 2: index arithmetic per element in 32 bits; 3: in 64. */
template <class F, int MODE>
__global__ static void bcast_kernel(struct bplan p, F f, int64_t parts)
{
    if (MODE == 0) {
        GP_GRID_STRIDE(i, p.numel)
        {
            int64_t o[BP_MAX];
            for (int k = 0; k < BP_MAX; k++) o[k] = i * p.st[k][0];
            f(i, o);
        }
    } else if (MODE == 1) {
        /* `parts` blocks share a row (parts > 1 when there are few long
         * rows, e.g. attention scores [B*heads, T*T] against a mask). */
        int last = p.rank - 1;
        int64_t inner = p.dims[last], rows = p.numel / inner;
        for (int64_t rb = blockIdx.x; rb < rows * parts; rb += gridDim.x) {
            int64_t row = rb / parts, part = rb % parts;
            int64_t base[BP_MAX] = {0, 0, 0, 0}, rem = row;
            for (int d = last - 1; d >= 0; d--) {
                int64_t x = rem % p.dims[d];
                rem /= p.dims[d];
                for (int k = 0; k < BP_MAX; k++) base[k] += x * p.st[k][d];
            }
            for (int64_t j = part * blockDim.x + threadIdx.x; j < inner; j += parts * blockDim.x) {
                int64_t o[BP_MAX];
                for (int k = 0; k < BP_MAX; k++) o[k] = base[k] + j * p.st[k][last];
                f(row * inner + j, o);
            }
        }
    } else if (MODE == 2) {
        uint32_t n = (uint32_t)p.numel;
        for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
            int64_t o[BP_MAX] = {0, 0, 0, 0};
            uint32_t rem = i;
            for (int d = p.rank - 1; d >= 0; d--) {
                uint32_t x = rem % (uint32_t)p.dims[d];
                rem /= (uint32_t)p.dims[d];
                for (int k = 0; k < BP_MAX; k++) o[k] += (int64_t)x * p.st[k][d];
            }
            f((int64_t)i, o);
        }
    } else {
        GP_GRID_STRIDE(i, p.numel)
        {
            int64_t o[BP_MAX] = {0, 0, 0, 0}, rem = i;
            for (int d = p.rank - 1; d >= 0; d--) {
                int64_t x = rem % p.dims[d];
                rem /= p.dims[d];
                for (int k = 0; k < BP_MAX; k++) o[k] += x * p.st[k][d];
            }
            f(i, o);
        }
    }
}

#define ROW_MIN 128     /* a last axis at least this long runs blocks along rows */
#define ROW_BLOCKS 2048 /* blocks that fill an H200 (132 SMs) several times over */

template <class F>
static gp_status launch_bcast(const struct gp_cuda_ctx *c, const struct bplan *p, F f, const char *what,
                              struct gp_error *err)
{
    if (p->numel == 0) return GP_OK;
    unsigned b = gp_cuda_blocks_for(p->numel);
    int64_t inner = p->dims[p->rank - 1];
    if (p->rank == 1) {
        bcast_kernel<F, 0><<<b, GP_CUDA_THREADS, 0, c->stream>>>(*p, f, 1);
    } else if (inner >= ROW_MIN) {
        /* At least ROW_BLOCKS blocks: long rows are split between blocks
         * (each block at least a full pass of its threads). */
        int64_t rows = p->numel / inner, parts = 1;
        if (rows < ROW_BLOCKS) {
            parts = (ROW_BLOCKS + rows - 1) / rows;
            int64_t most = (inner + GP_CUDA_THREADS - 1) / GP_CUDA_THREADS;
            if (parts > most) parts = most;
        }
        int64_t work = rows * parts;
        unsigned grid = (unsigned)(work < 32768 ? work : 32768);
        bcast_kernel<F, 1><<<grid, GP_CUDA_THREADS, 0, c->stream>>>(*p, f, parts);
    } else if (p->numel <= INT32_MAX) {
        bcast_kernel<F, 2><<<b, GP_CUDA_THREADS, 0, c->stream>>>(*p, f, 1);
    } else {
        bcast_kernel<F, 3><<<b, GP_CUDA_THREADS, 0, c->stream>>>(*p, f, 1);
    }
    return gp_cuda_check_launch(c, what, err);
}

/* ---- reductions over broadcast axes (the CPU's BCAST_REDUCE) ---- */

/* Axes of the plan split for operand t: `kept` where t has a stride (its
 * elements), `red` where it was broadcast (summed over). */
struct bsplit {
    int nk, nr;
    int kept[GP_MAX_RANK], red[GP_MAX_RANK];
    int64_t ne, nred; /* elements of operand t; terms each sums */
};

static void bsplit_init(struct bsplit *s, const struct bplan *p, int t)
{
    memset(s, 0, sizeof *s);
    s->ne = s->nred = 1;
    for (int d = 0; d < p->rank; d++) {
        if (p->st[t][d]) s->kept[s->nk++] = d, s->ne *= p->dims[d];
        else s->red[s->nr++] = d, s->nred *= p->dims[d];
    }
}

/* Two-stage sums when each element has many terms: chunks of `chunk`
 * terms, n_chunks of them, so that ne * n_chunks threads fill the GPU. */
#define REDUCE_TARGET (256 * 1024)
#define REDUCE_MIN_TERMS 32

static void reduce_chunks(int64_t ne, int64_t nred, int64_t *chunk, int64_t *n_chunks)
{
    *chunk = nred;
    *n_chunks = 1;
    if (nred < 2 * REDUCE_MIN_TERMS || ne >= REDUCE_TARGET) return;
    int64_t want = (REDUCE_TARGET + ne - 1) / ne, most = nred / REDUCE_MIN_TERMS;
    int64_t s = want < most ? want : most;
    if (s <= 1) return;
    *chunk = (nred + s - 1) / s;
    *n_chunks = (nred + *chunk - 1) / *chunk;
}

/* Scratch for reducing onto operand t of the plan: doubles. */
static size_t reduce_scratch(const struct bplan *p, int t)
{
    if (p->numel == 0) return 0;
    struct bsplit s;
    bsplit_init(&s, p, t);
    int64_t chunk, nch;
    reduce_chunks(s.ne, s.nred, &chunk, &nch);
    return nch > 1 ? (size_t)(s.ne * nch) * sizeof(double) : 0;
}

/* Offsets of element e of operand t (decoded over the kept axes). */
__device__ static inline void kept_offsets(const struct bplan &p, const struct bsplit &s, int64_t e,
                                           int64_t *off)
{
    for (int k = 0; k < BP_MAX; k++) off[k] = 0;
    int64_t rem = e;
    for (int q = s.nk - 1; q >= 0; q--) {
        int d = s.kept[q];
        int64_t x = rem % p.dims[d];
        rem /= p.dims[d];
#pragma unroll
        for (int k = 0; k < BP_MAX; k++) off[k] += x * p.st[k][d];
    }
}

/* off[t] with t known only at run time, without forcing off[] into local
 * memory. */
__device__ static inline int64_t pick(const int64_t *off, int t)
{
    return t == 0 ? off[0] : t == 1 ? off[1] : t == 2 ? off[2] : off[3];
}

/* Sum of term(off) over reduced positions [m0, m1) in row-major order. */
template <class Term>
__device__ static inline double sum_terms(const struct bplan &p, const struct bsplit &s, const Term &term,
                                          int64_t *off, int64_t m0, int64_t m1)
{
    if (s.nr == 1) { /* one reduced axis (after merging): a constant step */
        int d = s.red[0];
        int64_t step[BP_MAX];
#pragma unroll
        for (int k = 0; k < BP_MAX; k++) {
            step[k] = p.st[k][d];
            off[k] += m0 * step[k];
        }
        double acc = 0;
        for (int64_t m = m0; m < m1; m++) {
            acc += (double)term(off);
#pragma unroll
            for (int k = 0; k < BP_MAX; k++) off[k] += step[k];
        }
        return acc;
    }
    int64_t idx[GP_MAX_RANK], rem = m0;
    for (int q = s.nr - 1; q >= 0; q--) {
        int d = s.red[q];
        idx[q] = rem % p.dims[d];
        rem /= p.dims[d];
        for (int k = 0; k < BP_MAX; k++) off[k] += idx[q] * p.st[k][d];
    }
    double acc = 0;
    for (int64_t m = m0; m < m1; m++) {
        acc += (double)term(off);
        /* Odometer over the reduced axes, the last one fastest. */
        for (int q = s.nr - 1; q >= 0; q--) {
            int d = s.red[q];
            for (int k = 0; k < BP_MAX; k++) off[k] += p.st[k][d];
            if (++idx[q] < p.dims[d]) break;
            for (int k = 0; k < BP_MAX; k++) off[k] -= p.st[k][d] * p.dims[d];
            idx[q] = 0;
        }
    }
    return acc;
}

/* dst[e] += the sum over the broadcast axes, one thread per element. */
template <class Term, class D>
__global__ static void reduce_kernel(struct bplan p, struct bsplit s, int t, Term term, D dst)
{
    GP_GRID_STRIDE(e, s.ne)
    {
        int64_t off[BP_MAX];
        kept_offsets(p, s, e, off);
        int64_t at = pick(off, t);
        double acc = sum_terms(p, s, term, off, 0, s.nred);
        stf(dst, at, __fadd_rn(ldf(dst, at), (float)acc));
    }
}

/* No broadcasting: every operand is contiguous at offset e (a residual
 * add's gradient). The CPU's sum of one term in double rounds back to it. */
template <class Term, class D>
__global__ static void reduce_same_kernel(int64_t n, Term term, D dst)
{
    GP_GRID_STRIDE_ILP(e0, st, n)
    {
        float v[GP_ILP], d[GP_ILP];
#pragma unroll
        for (int u = 0; u < GP_ILP; u++) {
            int64_t e = e0 + u * st;
            int64_t off[BP_MAX] = {e, e, e, e};
            v[u] = e < n ? term(off) : 0.0f;
            d[u] = e < n ? ldf(dst, e) : 0.0f;
        }
#pragma unroll
        for (int u = 0; u < GP_ILP; u++)
            if (e0 + u * st < n) stf(dst, e0 + u * st, __fadd_rn(d[u], v[u]));
    }
}

/* Stage 1: part[ch * ne + e] = the sum of chunk ch of element e's terms. */
template <class Term>
__global__ static void reduce_part_kernel(struct bplan p, struct bsplit s, Term term, int64_t chunk,
                                          int64_t n_chunks, double *part)
{
    GP_GRID_STRIDE(t, s.ne * n_chunks)
    {
        int64_t e = t % s.ne, ch = t / s.ne;
        int64_t off[BP_MAX];
        kept_offsets(p, s, e, off);
        int64_t m0 = ch * chunk, m1 = m0 + chunk < s.nred ? m0 + chunk : s.nred;
        part[t] = sum_terms(p, s, term, off, m0, m1);
    }
}

/* Stage 2: dst[e] += the chunks' sums, a warp per element: lane l sums
 * chunks l, l + 32, ... in order, then a fixed shuffle tree adds the
 * lanes (deterministic). */
template <class D>
__global__ static void reduce_finish_kernel(struct bplan p, struct bsplit s, int t, int64_t n_chunks,
                                            const double *part, D dst)
{
    int lane = threadIdx.x & 31;
    int64_t w0 = (blockIdx.x * (int64_t)blockDim.x + threadIdx.x) >> 5;
    int64_t nw = ((int64_t)gridDim.x * blockDim.x) >> 5;
    for (int64_t e = w0; e < s.ne; e += nw) {
        double acc = 0;
        for (int64_t ch = lane; ch < n_chunks; ch += 32) acc += part[ch * s.ne + e];
        for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
        if (lane == 0) {
            int64_t off[BP_MAX];
            kept_offsets(p, s, e, off);
            int64_t at = pick(off, t);
            stf(dst, at, __fadd_rn(ldf(dst, at), (float)acc));
        }
    }
}

/* Operand t not broadcast at all: each of its elements gets one term
 * (the CPU's sum of one term in double rounds back to it), computed over
 * the output with the forward kernels' index arithmetic. */
template <class Term, class D>
struct add_term_op {
    Term term;
    int t;
    D dst;
    __device__ void operator()(int64_t i, const int64_t *o) const
    {
        (void)i;
        int64_t at = pick(o, t);
        stf(dst, at, __fadd_rn(ldf(dst, at), term(o)));
    }
};

/* dst (operand t's gradient: float *, or stor<S>::ptr) += term summed
 * over the axes t was broadcast along; `part` is reduce_scratch(p, t)
 * bytes of scratch. */
template <class Term, class D>
static gp_status reduce_into(const struct gp_cuda_ctx *c, const struct bplan *p, int t, Term term,
                             D dst, void *part, const char *what, struct gp_error *err)
{
    if (p->numel == 0) return GP_OK;
    struct bsplit s;
    bsplit_init(&s, p, t);
    int64_t chunk, nch;
    bool same = p->rank == 1;
    for (int k = 0; same && k < p->n; k++) same = p->st[k][0] == 1;
    if (same) {
        reduce_same_kernel<Term, D><<<gp_cuda_blocks_ilp(p->numel), GP_CUDA_THREADS, 0, c->stream>>>(
            p->numel, term, dst);
        return gp_cuda_check_launch(c, what, err);
    }
    if (s.nred == 1) {
        add_term_op<Term, D> f;
        f.term = term;
        f.t = t;
        f.dst = dst;
        return launch_bcast(c, p, f, what, err);
    }
    reduce_chunks(s.ne, s.nred, &chunk, &nch);
    if (nch <= 1) {
        reduce_kernel<Term, D><<<gp_cuda_blocks_for(s.ne), GP_CUDA_THREADS, 0, c->stream>>>(*p, s, t, term,
                                                                                            dst);
        return gp_cuda_check_launch(c, what, err);
    }
    if (!part) return gp_cuda_error(c, err, GP_ERR_INVALID, "%s: no scratch memory", what);
    reduce_part_kernel<Term><<<gp_cuda_blocks_for(s.ne * nch), GP_CUDA_THREADS, 0, c->stream>>>(
        *p, s, term, chunk, nch, (double *)part);
    GP_TRY(gp_cuda_check_launch(c, what, err));
    reduce_finish_kernel<D><<<gp_cuda_blocks_for(s.ne * 32), GP_CUDA_THREADS, 0, c->stream>>>(
        *p, s, t, nch, (const double *)part, dst);
    return gp_cuda_check_launch(c, what, err);
}

#endif
