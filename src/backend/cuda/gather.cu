/* CUDA kernels: Gather, twin of backend/cpu/gather.c. Forward moves rows
 * in the widest units (16, 8, 4, 2 or 1 bytes) their size and alignment
 * allow, so every dtype works.
 *
 * bfloat16 (gp_cuda_kernel.bf16_any): data, output and both gradients
 * are float32 or bfloat16 as ctx->*_dt says, any mix (GPT-2's embedding:
 * a float32 table, a bfloat16 output and incoming gradient, a float32
 * table gradient). Same types: the bits move as above; a float32 table
 * into a bfloat16 output converts, rounding each element once. Backward
 * sums in float32 (or double) exactly as below and rounds once where the
 * table's gradient is bfloat16: the float32 copy the executor would
 * otherwise stage, bit for bit.
 *
 * Backward is deterministic without float atomics: the indices are sorted
 * stably by value (an LSD radix sort in 8-bit digits, positions as
 * payload), each value's run of positions is cut into pieces of
 * GATHER_PIECE; a run of one piece (nearly every row of an embedding) is
 * added into its table row in position order starting from the row's
 * value, exactly the CPU's sequence of float additions; a longer run sums
 * its pieces in double, then adds the pieces in order.
 *
 * Differences from the CPU kernels: the CPU fails on an index out of range;
 * here indices are device data that the host cannot read without a
 * synchronize, so an out-of-range index gathers zeros and gets no
 * gradient. */
#include <string.h>

#include <cuda_runtime.h>

#include "backend/cuda/bf16.cuh"
#include "backend/cuda/kernel.h"
#include "backend/cuda/kernel_util.cuh"

extern "C" {
#include "ops/fold_util.h"
}

/* ---- Gather ---- */

/* data [pre, dim, post] (axis in the middle), indices [q] (any shape,
 * int64 or int32, negative counting from the end) -> [pre, q, post]. */
struct gather_plan {
    int axis;
    int64_t pre, dim, post, q;
    enum gp_dtype idx_type;
};

static gp_status gather_plan_of(const struct gp_graph *g, const struct gp_node *node,
                                struct gp_error *err, struct gather_plan *p)
{
    struct gp_infer_ctx ic;
    ic.graph = (struct gp_graph *)g;
    ic.node = (struct gp_node *)node;
    ic.err = err;
    const struct gp_shape *xs = &gp_node_input(g, node, 0)->shape;
    GP_TRY(gp_norm_axis(&ic, gp_node_attr_int(node, "axis", 0), xs->rank, &p->axis));
    p->pre = p->post = 1;
    for (int d = 0; d < p->axis; d++) p->pre *= xs->dims[d];
    for (int d = p->axis + 1; d < xs->rank; d++) p->post *= xs->dims[d];
    p->dim = xs->dims[p->axis];
    const struct gp_value *iv = gp_node_input(g, node, 1);
    p->q = gp_shape_numel(&iv->shape);
    p->idx_type = iv->dtype;
    if (p->idx_type != GP_DTYPE_INT64 && p->idx_type != GP_DTYPE_INT32)
        return gp_error_set(err, GP_ERR_UNSUPPORTED, "node '%s' (%s): %s indices", node->name,
                            node->op_type, gp_dtype_name(p->idx_type));
    return GP_OK;
}

template <typename I>
__device__ static inline int64_t gather_index(const I *idx, int64_t j, int64_t dim)
{
    int64_t k = (int64_t)idx[j];
    return k < 0 ? k + dim : k;
}

/* Y [pre, q, post units] = X [pre, k(j), post units]; zeros where an index
 * is out of range. */
template <typename T, typename I>
__global__ static void gather_kernel(const T *x, const I *idx, T *y, int64_t dim, int64_t q,
                                     int64_t post, int64_t n)
{
    GP_GRID_STRIDE(t, n)
    {
        int64_t col = t % post, rest = t / post, j = rest % q, r = rest / q;
        int64_t k = gather_index(idx, j, dim);
        T z{};
        y[t] = k >= 0 && k < dim ? x[(r * dim + k) * post + col] : z;
    }
}

template <typename T>
static void launch_gather(const struct gather_plan *p, int64_t post_units, const void *x,
                          const void *idx, void *y, cudaStream_t s)
{
    int64_t n = p->pre * p->q * post_units;
    if (p->idx_type == GP_DTYPE_INT64)
        gather_kernel<T, int64_t><<<gp_cuda_blocks_for(n), GP_CUDA_THREADS, 0, s>>>(
            (const T *)x, (const int64_t *)idx, (T *)y, p->dim, p->q, post_units, n);
    else
        gather_kernel<T, int32_t><<<gp_cuda_blocks_for(n), GP_CUDA_THREADS, 0, s>>>(
            (const T *)x, (const int32_t *)idx, (T *)y, p->dim, p->q, post_units, n);
}

/* N elements of T, moved as one load or store (at most 16 bytes). */
template <typename T, int N> struct __align__(sizeof(T) * N) grp {
    T v[N];
};

/* Gather between float storage types (float32 <-> bfloat16), N columns a
 * thread: Y [pre, q, post / N groups] = X [pre, k(j), post / N groups],
 * each element converted (rounded once into bfloat16); zeros where an
 * index is out of range. */
template <typename TD, typename TS, typename I, int N>
__global__ static void gather_cvt_kernel(const grp<TS, N> *x, const I *idx, grp<TD, N> *y, int64_t dim,
                                         int64_t q, int64_t post, int64_t n)
{
    GP_GRID_STRIDE(t, n)
    {
        int64_t col = t % post, rest = t / post, j = rest % q, r = rest / q;
        int64_t k = gather_index(idx, j, dim);
        grp<TD, N> o;
        if (k >= 0 && k < dim) {
            grp<TS, N> a = x[(r * dim + k) * post + col];
#pragma unroll
            for (int u = 0; u < N; u++) gp_store(&o.v[u], gp_load(&a.v[u]));
        } else {
#pragma unroll
            for (int u = 0; u < N; u++) gp_store(&o.v[u], 0.0f);
        }
        y[t] = o;
    }
}

template <typename TD, typename TS, int N>
static void launch_gather_cvt(const struct gather_plan *p, const void *x, const void *idx, void *y,
                              cudaStream_t s)
{
    int64_t post = p->post / N, n = p->pre * p->q * post;
    unsigned b = gp_cuda_blocks_for(n);
    if (p->idx_type == GP_DTYPE_INT64)
        gather_cvt_kernel<TD, TS, int64_t, N><<<b, GP_CUDA_THREADS, 0, s>>>(
            (const grp<TS, N> *)x, (const int64_t *)idx, (grp<TD, N> *)y, p->dim, p->q, post, n);
    else
        gather_cvt_kernel<TD, TS, int32_t, N><<<b, GP_CUDA_THREADS, 0, s>>>(
            (const grp<TS, N> *)x, (const int32_t *)idx, (grp<TD, N> *)y, p->dim, p->q, post, n);
}

/* Rows of N elements where the row length and both pointers allow. */
template <typename TD, typename TS>
static void gather_cvt(const struct gather_plan *p, const void *x, const void *idx, void *y, cudaStream_t s)
{
    uintptr_t xa = (uintptr_t)x, ya = (uintptr_t)y;
    if (p->post % 4 == 0 && xa % (4 * sizeof(TS)) == 0 && ya % (4 * sizeof(TD)) == 0)
        launch_gather_cvt<TD, TS, 4>(p, x, idx, y, s);
    else if (p->post % 2 == 0 && xa % (2 * sizeof(TS)) == 0 && ya % (2 * sizeof(TD)) == 0)
        launch_gather_cvt<TD, TS, 2>(p, x, idx, y, s);
    else
        launch_gather_cvt<TD, TS, 1>(p, x, idx, y, s);
}

static gp_status gather_forward(struct gp_cuda_ctx *c, struct gp_error *err)
{
    struct gather_plan p;
    GP_TRY(gather_plan_of(c->graph, c->node, err, &p));
    enum gp_dtype dt = gp_cuda_in_value(c, 0)->dtype;
    bool fl = gp_dtype_is_float(dt);
    bool x16 = fl && gp_cuda_is_bf16(c->in_dt, 0), y16 = fl && gp_cuda_is_bf16(c->out_dt, 0);
    size_t es = x16 ? sizeof(__nv_bfloat16) : gp_cuda_esize(dt);
    GP_TRY(gp_cuda_check_esize(c, es, err));
    if (p.pre * p.q * p.post == 0) return GP_OK;
    if (x16 != y16) {
        if (y16) gather_cvt<__nv_bfloat16, float>(&p, c->in[0], c->in[1], c->out[0], c->stream);
        else gather_cvt<float, __nv_bfloat16>(&p, c->in[0], c->in[1], c->out[0], c->stream);
        return gp_cuda_check_launch(c, "Gather forward", err);
    }
    size_t row = (size_t)p.post * es;
    bool al16 = (uintptr_t)c->in[0] % 16 == 0 && (uintptr_t)c->out[0] % 16 == 0;
    bool al8 = (uintptr_t)c->in[0] % 8 == 0 && (uintptr_t)c->out[0] % 8 == 0;
    if (row % 16 == 0 && al16) launch_gather<uint4>(&p, (int64_t)(row / 16), c->in[0], c->in[1], c->out[0], c->stream);
    else if (row % 8 == 0 && al8) launch_gather<unsigned long long>(&p, (int64_t)(row / 8), c->in[0], c->in[1], c->out[0], c->stream);
    else if (row % 4 == 0) launch_gather<uint32_t>(&p, (int64_t)(row / 4), c->in[0], c->in[1], c->out[0], c->stream);
    else if (row % 2 == 0) launch_gather<uint16_t>(&p, (int64_t)(row / 2), c->in[0], c->in[1], c->out[0], c->stream);
    else launch_gather<uint8_t>(&p, (int64_t)row, c->in[0], c->in[1], c->out[0], c->stream);
    return gp_cuda_check_launch(c, "Gather forward", err);
}

/* Backward: dData[r, k(j), :] += dY[r, j, :], deterministic.
 *
 * 1. keys[j] = k(j) (out of range: dim, sorted last and skipped), vals[j] = j;
 *    sorted stably by key in 8-bit LSD radix passes (per pass: a histogram
 *    per tile of GATHER_TILE positions, one exclusive scan of the
 *    digit-major histograms, a stable scatter).
 * 2. seg_lo[v], seg_hi[v]: the run of key v in the sorted order.
 * 3. pieces: each run cut into ceil(len / GATHER_PIECE) pieces; exclusive
 *    scans give each key's first piece, its first partial (keys of more
 *    than one piece only) and its index among multi-piece keys.
 * 4. a warp per (r, piece), lanes over columns: a single-piece key adds
 *    its positions into dData in position order (the CPU's float
 *    additions); a piece of a longer run sums in double into its partial.
 * 5. a warp per (r, multi-piece key): dData += the partials, in order, in
 *    double.
 * Every step is a fixed function of the indices: the result is the same
 * from run to run. */
#define GATHER_PIECE 32
#define GATHER_ITEMS 2
#define GATHER_TILE (GP_CUDA_THREADS * GATHER_ITEMS)
#define SCAN_BLOCK 1024   /* threads of a scan block, elements per block */
#define SCAN_SMALL 16384  /* up to this many: a single-block scan */

struct gather_layout {
    int64_t q, dim, ntiles, npc_max, mk_max, mp_max;
    int passes;
    size_t keys[2], vals[2], hist, bsum, seg_lo, seg_hi, piece_start, mp_start, mk_start, piece_key,
        mkey, partial, total;
};

static void gather_layout_of(const struct gather_plan *p, struct gather_layout *l)
{
    memset(l, 0, sizeof *l);
    int64_t q = p->q, dim = p->dim;
    l->q = q;
    l->dim = dim;
    l->ntiles = (q + GATHER_TILE - 1) / GATHER_TILE;
    int bits = 0;
    while (bits < 62 && ((int64_t)1 << bits) <= dim) bits++; /* keys 0..dim (dim: out of range) */
    l->passes = (bits + 7) / 8;
    if (l->passes < 1) l->passes = 1;
    l->npc_max = (q < dim ? q : dim) + q / GATHER_PIECE + 1;
    l->mk_max = q / (GATHER_PIECE + 1) + 1;
    l->mp_max = 2 * (q / GATHER_PIECE) + 1;
    size_t at = 0, qi = (size_t)q * sizeof(int32_t), di = (size_t)(dim + 1) * sizeof(int32_t);
#define TAKE(field, bytes) (l->field = at, at = gp_cuda_align256(at + (bytes)))
    TAKE(keys[0], qi);
    TAKE(keys[1], qi);
    TAKE(vals[0], qi);
    TAKE(vals[1], qi);
    TAKE(hist, (size_t)(256 * l->ntiles + 1) * sizeof(int32_t));
    int64_t most = 256 * l->ntiles > dim ? 256 * l->ntiles : dim;
    TAKE(bsum, (size_t)(3 * ((most + SCAN_BLOCK - 1) / SCAN_BLOCK + 1)) * sizeof(int32_t));
    TAKE(seg_lo, di);
    TAKE(seg_hi, di);
    TAKE(piece_start, di);
    TAKE(mp_start, di);
    TAKE(mk_start, di);
    TAKE(piece_key, (size_t)l->npc_max * sizeof(int32_t));
    TAKE(mkey, (size_t)l->mk_max * sizeof(int32_t));
    TAKE(partial, (size_t)(p->pre * l->mp_max * p->post) * sizeof(double));
#undef TAKE
    l->total = at;
}

static size_t gather_scratch(const struct gp_graph *g, const struct gp_node *node)
{
    struct gather_plan p;
    struct gp_error err;
    memset(&err, 0, sizeof err);
    if (gather_plan_of(g, node, &err, &p) != GP_OK) return 0;
    struct gather_layout l;
    gather_layout_of(&p, &l);
    return l.total;
}

template <typename I>
__global__ static void gather_keys_kernel(const I *idx, int64_t q, int64_t dim, uint32_t *keys,
                                          int32_t *vals)
{
    GP_GRID_STRIDE(j, q)
    {
        int64_t k = gather_index(idx, j, dim);
        keys[j] = (uint32_t)(k >= 0 && k < dim ? k : dim);
        vals[j] = (int32_t)j;
    }
}

/* hist[digit * ntiles + tile]: how many keys of the tile have the digit. */
__global__ static void radix_hist_kernel(const uint32_t *keys, int64_t q, int shift, int64_t ntiles,
                                         int32_t *hist)
{
    __shared__ int32_t cnt[256];
    for (int64_t tile = blockIdx.x; tile < ntiles; tile += gridDim.x) {
        cnt[threadIdx.x] = 0;
        __syncthreads();
        for (int it = 0; it < GATHER_ITEMS; it++) {
            int64_t i = tile * GATHER_TILE + (int64_t)it * GP_CUDA_THREADS + threadIdx.x;
            if (i < q) atomicAdd(&cnt[(keys[i] >> shift) & 255], 1); /* integer: exact */
        }
        __syncthreads();
        hist[(int64_t)threadIdx.x * ntiles + tile] = cnt[threadIdx.x];
        __syncthreads();
    }
}

/* Exclusive prefix sum of v over the block (blockDim.x a multiple of 32, at
 * most 1024); *total gets the block's sum. */
__device__ static int32_t block_exclusive_sum(int32_t v, int32_t *total)
{
    __shared__ int32_t warp_sums[32];
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    int32_t x = v;
    for (int o = 1; o < 32; o <<= 1) {
        int32_t y = __shfl_up_sync(0xffffffffu, x, o);
        if (lane >= o) x += y;
    }
    if (lane == 31) warp_sums[w] = x;
    __syncthreads();
    if (w == 0) {
        int32_t s = lane < nw ? warp_sums[lane] : 0;
        for (int o = 1; o < 32; o <<= 1) {
            int32_t y = __shfl_up_sync(0xffffffffu, s, o);
            if (lane >= o) s += y;
        }
        warp_sums[lane] = s;
    }
    __syncthreads();
    int32_t excl = x - v + (w > 0 ? warp_sums[w - 1] : 0);
    *total = warp_sums[nw - 1];
    __syncthreads();
    return excl;
}

/* Exclusive prefix sums of K int32 arrays a[k] [n + 1], in place, with
 * the totals in a[k][n]. Up to SCAN_SMALL elements: one block, each
 * thread a contiguous chunk. More: per block of SCAN_BLOCK elements its
 * sums (coalesced), one block scans those, each block rescans its own. */

template <int K> struct scan_arrays {
    int32_t *a[K];
};

template <int K>
__global__ static void scan_small_kernel(struct scan_arrays<K> s, int64_t n)
{
    int64_t chunk = (n + blockDim.x - 1) / blockDim.x, lo = threadIdx.x * chunk;
    int64_t hi = lo + chunk < n ? lo + chunk : n;
    for (int k = 0; k < K; k++) {
        int32_t *a = s.a[k], sum = 0, total;
        for (int64_t i = lo; i < hi; i++) sum += a[i];
        int32_t run = block_exclusive_sum(sum, &total);
        for (int64_t i = lo; i < hi; i++) {
            int32_t t = a[i];
            a[i] = run;
            run += t;
        }
        if (threadIdx.x == 0) a[n] = total;
    }
}

template <int K>
__global__ static void scan_up_kernel(struct scan_arrays<K> s, int64_t n, int64_t nb, int32_t *bsum)
{
    for (int64_t b = blockIdx.x; b < nb; b += gridDim.x) {
        int64_t i = b * SCAN_BLOCK + threadIdx.x;
        for (int k = 0; k < K; k++) {
            int32_t total;
            block_exclusive_sum(i < n ? s.a[k][i] : 0, &total);
            if (threadIdx.x == 0) bsum[k * nb + b] = total;
        }
    }
}

template <int K>
__global__ static void scan_mid_kernel(struct scan_arrays<K> s, int64_t n, int64_t nb, int32_t *bsum)
{
    int64_t chunk = (nb + blockDim.x - 1) / blockDim.x, lo = threadIdx.x * chunk;
    int64_t hi = lo + chunk < nb ? lo + chunk : nb;
    for (int k = 0; k < K; k++) {
        int32_t *a = bsum + k * nb, sum = 0, total;
        for (int64_t i = lo; i < hi; i++) sum += a[i];
        int32_t run = block_exclusive_sum(sum, &total);
        for (int64_t i = lo; i < hi; i++) {
            int32_t t = a[i];
            a[i] = run;
            run += t;
        }
        if (threadIdx.x == 0) s.a[k][n] = total;
    }
}

template <int K>
__global__ static void scan_down_kernel(struct scan_arrays<K> s, int64_t n, int64_t nb, const int32_t *bsum)
{
    for (int64_t b = blockIdx.x; b < nb; b += gridDim.x) {
        int64_t i = b * SCAN_BLOCK + threadIdx.x;
        for (int k = 0; k < K; k++) {
            int32_t total, v = i < n ? s.a[k][i] : 0;
            int32_t excl = block_exclusive_sum(v, &total);
            if (i < n) s.a[k][i] = excl + bsum[k * nb + b];
        }
    }
}

template <int K>
static gp_status scan_run(const struct gp_cuda_ctx *c, struct scan_arrays<K> a, int64_t n, int32_t *bsum,
                          const char *what, struct gp_error *err)
{
    if (n <= SCAN_SMALL) {
        scan_small_kernel<K><<<1, SCAN_BLOCK, 0, c->stream>>>(a, n);
        return gp_cuda_check_launch(c, what, err);
    }
    int64_t nb = (n + SCAN_BLOCK - 1) / SCAN_BLOCK;
    unsigned grid = (unsigned)(nb < 65535 ? nb : 65535);
    scan_up_kernel<K><<<grid, SCAN_BLOCK, 0, c->stream>>>(a, n, nb, bsum);
    GP_TRY(gp_cuda_check_launch(c, what, err));
    scan_mid_kernel<K><<<1, SCAN_BLOCK, 0, c->stream>>>(a, n, nb, bsum);
    GP_TRY(gp_cuda_check_launch(c, what, err));
    scan_down_kernel<K><<<grid, SCAN_BLOCK, 0, c->stream>>>(a, n, nb, bsum);
    return gp_cuda_check_launch(c, what, err);
}

/* Stable scatter of one pass: a tile's keys go, in position order, to
 * hist (scanned) [digit, tile] onwards. Each round of 256 keys ranks them
 * within their warp (__match_any_sync) and across warps (per-warp counts). */
__global__ static void radix_scatter_kernel(const uint32_t *keys_in, const int32_t *vals_in, int64_t q,
                                            int shift, int64_t ntiles, const int32_t *hist,
                                            uint32_t *keys_out, int32_t *vals_out)
{
    __shared__ int32_t base[256];
    __shared__ int32_t wcnt[GP_CUDA_THREADS / 32][256];
    int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    for (int64_t tile = blockIdx.x; tile < ntiles; tile += gridDim.x) {
        base[tid] = hist[(int64_t)tid * ntiles + tile];
        for (int it = 0; it < GATHER_ITEMS; it++) {
            for (int w = 0; w < GP_CUDA_THREADS / 32; w++) wcnt[w][tid] = 0;
            __syncthreads();
            int64_t i = tile * GATHER_TILE + (int64_t)it * GP_CUDA_THREADS + tid;
            bool valid = i < q;
            uint32_t key = valid ? keys_in[i] : 0;
            int32_t val = valid ? vals_in[i] : 0;
            int digit = valid ? (int)((key >> shift) & 255) : 256;
            unsigned peers = __match_any_sync(0xffffffffu, digit);
            int rank = __popc(peers & ((1u << lane) - 1));
            if (valid && lane == __ffs(peers) - 1) wcnt[warp][digit] = __popc(peers);
            __syncthreads();
            int32_t run = base[tid];
            for (int w = 0; w < GP_CUDA_THREADS / 32; w++) {
                int32_t t = wcnt[w][tid];
                wcnt[w][tid] = run;
                run += t;
            }
            base[tid] = run;
            __syncthreads();
            if (valid) {
                int32_t dst = wcnt[warp][digit] + rank;
                keys_out[dst] = key;
                vals_out[dst] = val;
            }
            __syncthreads();
        }
    }
}

/* The run [seg_lo[v], seg_hi[v]) of each key v < dim in the sorted keys. */
__global__ static void gather_bounds_kernel(const uint32_t *sk, int64_t q, int64_t dim, int32_t *seg_lo,
                                            int32_t *seg_hi)
{
    GP_GRID_STRIDE(i, q)
    {
        uint32_t v = sk[i];
        if ((int64_t)v >= dim) continue;
        if (i == 0 || sk[i - 1] != v) seg_lo[v] = (int32_t)i;
        if (i == q - 1 || sk[i + 1] != v) seg_hi[v] = (int32_t)(i + 1);
    }
}

__device__ static inline int32_t pieces_of(int32_t len)
{
    return (len + GATHER_PIECE - 1) / GATHER_PIECE;
}

/* Per key: its pieces, its partials (pieces of a key of more than one)
 * and whether it has several pieces; scanned next into first piece,
 * first partial and index among multi-piece keys. */
__global__ static void gather_piece_counts_kernel(const int32_t *seg_lo, const int32_t *seg_hi, int64_t dim,
                                                  int32_t *piece_start, int32_t *mp_start, int32_t *mk_start)
{
    GP_GRID_STRIDE(v, dim)
    {
        int32_t pc = pieces_of(seg_hi[v] - seg_lo[v]);
        piece_start[v] = pc;
        mp_start[v] = pc > 1 ? pc : 0;
        mk_start[v] = pc > 1;
    }
}

/* piece_key[piece] = its key; mkey[m] = the m-th multi-piece key. */
__global__ static void gather_piece_keys_kernel(const int32_t *seg_lo, const int32_t *seg_hi, int64_t dim,
                                                const int32_t *piece_start, const int32_t *mk_start,
                                                int32_t *piece_key, int32_t *mkey)
{
    GP_GRID_STRIDE(v, dim)
    {
        int32_t pc = pieces_of(seg_hi[v] - seg_lo[v]), ps = piece_start[v];
        for (int32_t k = 0; k < pc; k++) piece_key[ps + k] = (int32_t)v;
        if (pc > 1) mkey[mk_start[v]] = (int32_t)v;
    }
}

struct gather_bwd {
    const void *dy; /* float or __nv_bfloat16: the kernels' TS */
    void *dx;       /* TD */
    const int32_t *pos, *seg_lo, *seg_hi, *piece_start, *mp_start, *mk_start, *piece_key, *mkey;
    double *partial;
    int64_t pre, dim, q, post, mp_max;
};

/* A warp per (r, piece, 32 * GATHER_COLS columns): each lane takes
 * GATHER_COLS columns, so that that many loads are in flight. dData is
 * stored as TD, dY as TS (float or __nv_bfloat16); the sums are the same
 * float32 (double) ones either way, rounded once into a bfloat16 dData. */
#define GATHER_COLS 4

template <typename TD, typename TS>
__global__ static void gather_piece_kernel(struct gather_bwd b)
{
    int lane = threadIdx.x & 31;
    int64_t w0 = (blockIdx.x * (int64_t)blockDim.x + threadIdx.x) >> 5;
    int64_t nw = ((int64_t)gridDim.x * blockDim.x) >> 5;
    int64_t nch = (b.post + 32 * GATHER_COLS - 1) / (32 * GATHER_COLS);
    int64_t npc = b.piece_start[b.dim], rows = b.pre * npc * nch;
    for (int64_t w = w0; w < rows; w += nw) {
        int64_t chunk = w % nch, rest = w / nch, piece = rest % npc, r = rest / npc;
        int32_t v = b.piece_key[piece];
        int32_t ps = b.piece_start[v], pc = b.piece_start[v + 1] - ps, k = (int32_t)piece - ps;
        int64_t lo = (int64_t)b.seg_lo[v] + (int64_t)k * GATHER_PIECE;
        int64_t hi = lo + GATHER_PIECE < b.seg_hi[v] ? lo + GATHER_PIECE : b.seg_hi[v];
        const TS *dy = (const TS *)b.dy + r * b.q * b.post;
        TD *dx = (TD *)b.dx + (r * b.dim + v) * b.post;
        double *part = b.partial + (r * b.mp_max + b.mp_start[v] + k) * b.post;
        int64_t c0 = chunk * 32 * GATHER_COLS + lane;
        {
            if (pc == 1) { /* the CPU's float additions, in position order */
                float acc[GATHER_COLS];
#pragma unroll
                for (int u = 0; u < GATHER_COLS; u++) {
                    int64_t col = c0 + 32 * u;
                    acc[u] = col < b.post ? gp_load(&dx[col]) : 0.0f;
                }
#pragma unroll 4
                for (int64_t i = lo; i < hi; i++) {
                    const TS *row = dy + (int64_t)b.pos[i] * b.post;
#pragma unroll
                    for (int u = 0; u < GATHER_COLS; u++) {
                        int64_t col = c0 + 32 * u;
                        if (col < b.post) acc[u] = __fadd_rn(acc[u], gp_load(&row[col]));
                    }
                }
#pragma unroll
                for (int u = 0; u < GATHER_COLS; u++) {
                    int64_t col = c0 + 32 * u;
                    if (col < b.post) gp_store(&dx[col], acc[u]);
                }
            } else {
                double acc[GATHER_COLS] = {0, 0, 0, 0};
#pragma unroll 4
                for (int64_t i = lo; i < hi; i++) {
                    const TS *row = dy + (int64_t)b.pos[i] * b.post;
#pragma unroll
                    for (int u = 0; u < GATHER_COLS; u++) {
                        int64_t col = c0 + 32 * u;
                        if (col < b.post) acc[u] += (double)gp_load(&row[col]);
                    }
                }
#pragma unroll
                for (int u = 0; u < GATHER_COLS; u++) {
                    int64_t col = c0 + 32 * u;
                    if (col < b.post) part[col] = acc[u];
                }
            }
        }
    }
}

/* A warp per (r, multi-piece key, 32 columns): dData (TD) += its
 * partials, in order; the double sum is rounded to float32, then (a
 * bfloat16 dData) to bfloat16, as the float32 copy would be. */
template <typename TD>
__global__ static void gather_reduce_kernel(struct gather_bwd b)
{
    int lane = threadIdx.x & 31;
    int64_t w0 = (blockIdx.x * (int64_t)blockDim.x + threadIdx.x) >> 5;
    int64_t nw = ((int64_t)gridDim.x * blockDim.x) >> 5;
    int64_t nch = (b.post + 31) / 32;
    int64_t nmk = b.mk_start[b.dim], rows = b.pre * nmk * nch;
    for (int64_t w = w0; w < rows; w += nw) {
        int64_t chunk = w % nch, rest = w / nch, m = rest % nmk, r = rest / nmk;
        int32_t v = b.mkey[m];
        int32_t pc = b.piece_start[v + 1] - b.piece_start[v];
        const double *part = b.partial + (r * b.mp_max + b.mp_start[v]) * b.post;
        TD *dx = (TD *)b.dx + (r * b.dim + v) * b.post;
        int64_t col = chunk * 32 + lane;
        if (col < b.post) {
            double acc = (double)gp_load(&dx[col]);
#pragma unroll 4
            for (int32_t k = 0; k < pc; k++) acc += part[(int64_t)k * b.post + col];
            gp_store(&dx[col], (float)acc);
        }
    }
}

/* Blocks for one warp per row, rows at most `rows`. */
static unsigned warp_blocks(int64_t rows)
{
    int64_t b = (rows * 32 + GP_CUDA_THREADS - 1) / GP_CUDA_THREADS;
    return (unsigned)(b < 1 ? 1 : b > 16384 ? 16384 : b);
}

/* Steps 4 and 5 for dData stored as TD and dY as TS. */
template <typename TD, typename TS>
static gp_status gather_sums(const struct gp_cuda_ctx *c, const struct gather_bwd *b, unsigned piece_blocks,
                             unsigned reduce_blocks, struct gp_error *err)
{
    gather_piece_kernel<TD, TS><<<piece_blocks, GP_CUDA_THREADS, 0, c->stream>>>(*b);
    GP_TRY(gp_cuda_check_launch(c, "Gather backward: pieces", err));
    gather_reduce_kernel<TD><<<reduce_blocks, GP_CUDA_THREADS, 0, c->stream>>>(*b);
    return gp_cuda_check_launch(c, "Gather backward: long runs", err);
}

static gp_status gather_backward(struct gp_cuda_ctx *c, struct gp_error *err)
{
    if (!c->din[0] || !c->dout[0]) return GP_OK;
    struct gather_plan p;
    GP_TRY(gather_plan_of(c->graph, c->node, err, &p));
    if (p.q == 0 || p.pre * p.post == 0) return GP_OK;
    if (p.q >= INT32_MAX || p.dim >= INT32_MAX)
        return gp_cuda_error(c, err, GP_ERR_UNSUPPORTED,
                             "backward over %lld indices into an axis of %lld: at most 2^31 - 1 each",
                             (long long)p.q, (long long)p.dim);
    struct gather_layout l;
    gather_layout_of(&p, &l);
    char *s = (char *)c->scratch;
    uint32_t *keys[2] = {(uint32_t *)(s + l.keys[0]), (uint32_t *)(s + l.keys[1])};
    int32_t *vals[2] = {(int32_t *)(s + l.vals[0]), (int32_t *)(s + l.vals[1])};
    int32_t *hist = (int32_t *)(s + l.hist), *bsum = (int32_t *)(s + l.bsum);
    cudaStream_t st = c->stream;

    unsigned qb = gp_cuda_blocks_for(p.q);
    if (p.idx_type == GP_DTYPE_INT64)
        gather_keys_kernel<int64_t><<<qb, GP_CUDA_THREADS, 0, st>>>((const int64_t *)c->in[1], p.q, p.dim,
                                                                     keys[0], vals[0]);
    else
        gather_keys_kernel<int32_t><<<qb, GP_CUDA_THREADS, 0, st>>>((const int32_t *)c->in[1], p.q, p.dim,
                                                                     keys[0], vals[0]);
    GP_TRY(gp_cuda_check_launch(c, "Gather backward: keys", err));
    unsigned tb = (unsigned)(l.ntiles < 65535 ? l.ntiles : 65535);
    int cur = 0;
    for (int pass = 0; pass < l.passes; pass++, cur ^= 1) {
        radix_hist_kernel<<<tb, GP_CUDA_THREADS, 0, st>>>(keys[cur], p.q, 8 * pass, l.ntiles, hist);
        GP_TRY(gp_cuda_check_launch(c, "Gather backward: radix histogram", err));
        struct scan_arrays<1> ha;
        ha.a[0] = hist;
        GP_TRY(scan_run(c, ha, 256 * l.ntiles, bsum, "Gather backward: radix scan", err));
        radix_scatter_kernel<<<tb, GP_CUDA_THREADS, 0, st>>>(keys[cur], vals[cur], p.q, 8 * pass,
                                                             l.ntiles, hist, keys[cur ^ 1], vals[cur ^ 1]);
        GP_TRY(gp_cuda_check_launch(c, "Gather backward: radix scatter", err));
    }

    struct gather_bwd b;
    b.dy = c->dout[0];
    b.dx = c->din[0];
    b.pos = vals[cur];
    b.seg_lo = (int32_t *)(s + l.seg_lo);
    b.seg_hi = (int32_t *)(s + l.seg_hi);
    b.piece_start = (int32_t *)(s + l.piece_start);
    b.mp_start = (int32_t *)(s + l.mp_start);
    b.mk_start = (int32_t *)(s + l.mk_start);
    b.piece_key = (int32_t *)(s + l.piece_key);
    b.mkey = (int32_t *)(s + l.mkey);
    b.partial = (double *)(s + l.partial);
    b.pre = p.pre;
    b.dim = p.dim;
    b.q = p.q;
    b.post = p.post;
    b.mp_max = l.mp_max;

    size_t di = (size_t)p.dim * sizeof(int32_t);
    GP_TRY(gp_cuda_call(c, cudaMemsetAsync((void *)b.seg_lo, 0, di, st), "Gather backward: cudaMemsetAsync", err));
    GP_TRY(gp_cuda_call(c, cudaMemsetAsync((void *)b.seg_hi, 0, di, st), "Gather backward: cudaMemsetAsync", err));
    gather_bounds_kernel<<<qb, GP_CUDA_THREADS, 0, st>>>(keys[cur], p.q, p.dim, (int32_t *)b.seg_lo,
                                                         (int32_t *)b.seg_hi);
    GP_TRY(gp_cuda_check_launch(c, "Gather backward: runs", err));
    gather_piece_counts_kernel<<<gp_cuda_blocks_for(p.dim), GP_CUDA_THREADS, 0, st>>>(
        b.seg_lo, b.seg_hi, p.dim, (int32_t *)b.piece_start, (int32_t *)b.mp_start, (int32_t *)b.mk_start);
    GP_TRY(gp_cuda_check_launch(c, "Gather backward: piece counts", err));
    struct scan_arrays<3> pa;
    pa.a[0] = (int32_t *)b.piece_start;
    pa.a[1] = (int32_t *)b.mp_start;
    pa.a[2] = (int32_t *)b.mk_start;
    GP_TRY(scan_run(c, pa, p.dim, bsum, "Gather backward: piece scan", err));
    gather_piece_keys_kernel<<<gp_cuda_blocks_for(p.dim), GP_CUDA_THREADS, 0, st>>>(
        b.seg_lo, b.seg_hi, p.dim, b.piece_start, b.mk_start, (int32_t *)b.piece_key, (int32_t *)b.mkey);
    GP_TRY(gp_cuda_check_launch(c, "Gather backward: piece keys", err));
    int64_t wide = (p.post + 32 * GATHER_COLS - 1) / (32 * GATHER_COLS), narrow = (p.post + 31) / 32;
    unsigned pb = warp_blocks(p.pre * l.npc_max * wide), rb = warp_blocks(p.pre * l.mk_max * narrow);
    bool dx16 = gp_cuda_is_bf16(c->din_dt, 0), dy16 = gp_cuda_is_bf16(c->dout_dt, 0);
    typedef __nv_bfloat16 bf16;
    if (dx16 && dy16) return gather_sums<bf16, bf16>(c, &b, pb, rb, err);
    if (dx16) return gather_sums<bf16, float>(c, &b, pb, rb, err);
    if (dy16) return gather_sums<float, bf16>(c, &b, pb, rb, err);
    return gather_sums<float, float>(c, &b, pb, rb, err);
}

/* ---- the table ---- */

extern "C" const struct gp_cuda_kernel gp_cuda_kernels_gather[] = {
    {"Gather", NULL, gather_scratch, gather_forward, gather_backward, false, true},
    {NULL, NULL, NULL, NULL, NULL},
};
