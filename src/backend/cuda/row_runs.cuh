/* The binary family's row-vector paths (binary.cu): an operand [N] (or
 * [1, N], any leading 1s) broadcast over every leading axis of a full,
 * contiguous [M, N] operand, as a bias added after a MatMul. The generic
 * engine (broadcast.cuh) moves one value per access with index arithmetic
 * per element, and its reduction walks one column per thread, so it stays
 * near a fifth of the bandwidth on these shapes; here each thread moves
 * runs of RUN_W values (one 16-byte access of bfloat16, two of float32).
 *
 * Preconditions the host checks (binary.cu): N a multiple of RUN_W; the
 * full tensors' pointers aligned to a run's bytes (then every run, starting
 * at a multiple of RUN_W elements, is aligned), the row's too; M * N / RUN_W
 * at most UINT32_MAX (the column of a run is a 32-bit remainder). Offsets
 * are int64 throughout ([16, 1024, 50304] bfloat16 passes 2^31 bytes).
 *
 * Arithmetic: the same float operations per value as fbin_op, and the
 * column sums in double in row order over the same chunks as
 * reduce_part_kernel (broadcast.cuh's reduce_chunks), whose fixed-order
 * fold (reduce_finish_kernel) then finishes them: the same bits as the
 * generic path, and no atomics. */
#ifndef GP_CUDA_ROW_RUNS_CUH
#define GP_CUDA_ROW_RUNS_CUH

#include "backend/cuda/bf16.cuh"
#include "backend/cuda/kernel_util.cuh"

#define RUN_W 8    /* values per run */

/* The binary ops these kernels compute (binary.cu's enum bop order). */
enum row_op { ROW_ADD, ROW_SUB, ROW_MUL, ROW_DIV };

/* Y [M, N] = X op b (b op X when row_a: the row is the first operand),
 * b [N]; F the storage of X and Y, R the row's. Two runs in flight per
 * thread. relu: an Add's fused Relu (NaN passes, as fbin_op). */
template <class F, class R>
__global__ static void row_forward_runs_kernel(int op, bool relu, bool row_a, const F *X, const R *b, F *Y,
                                               uint32_t row_runs, int64_t runs)
{
    const int64_t st = (int64_t)gridDim.x * blockDim.x;
    for (int64_t r0 = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; r0 < runs; r0 += 2 * st) {
        float x[2][RUN_W], v[2][RUN_W];
#pragma unroll
        for (int u = 0; u < 2; u++) {
            int64_t r = r0 + u * st;
            if (r >= runs) continue;
            gp_run<F, RUN_W>::load(X, r * RUN_W, x[u]);
            /* r < 2^32 (host): a 32-bit remainder; the row stays in L1/L2. */
            gp_run<R, RUN_W>::load(b, (int64_t)((uint32_t)r % row_runs) * RUN_W, v[u]);
        }
#pragma unroll
        for (int u = 0; u < 2; u++) {
            int64_t r = r0 + u * st;
            if (r >= runs) continue;
#pragma unroll
            for (int k = 0; k < RUN_W; k++) {
                float a = row_a ? v[u][k] : x[u][k], c = row_a ? x[u][k] : v[u][k];
                float t = op == ROW_ADD ? a + c : op == ROW_SUB ? a - c : op == ROW_MUL ? a * c : a / c;
                x[u][k] = !relu || t > 0 || t != t ? t : 0.0f;
            }
            gp_run<F, RUN_W>::store(Y, r * RUN_W, x[u]);
        }
    }
}

/* The row's gradient, stage 1: part[ch * N + n] = the sum over rows
 * [ch * chunk, min((ch + 1) * chunk, M)) of dY[m, n] (negated for Sub's
 * second input; 0 where Y <= 0 when Y is given: an Add's fused Relu), in
 * double, row after row: bin_term's value and sum_terms' order. A thread
 * per (run of GRAD_W columns, chunk), neighbouring threads on neighbouring
 * runs of one chunk (coalesced loads along the row); GRAD_UNROLL rows
 * loaded before any is added keeps enough bytes in flight. Runs of GRAD_W
 * = RUN_W / 2 columns, not RUN_W: the grid is (columns / run) x chunks, and
 * GPT-2's [16384, 768] has 342 chunks, so runs of 8 made 129 blocks of 256
 * threads for 132 SMs: 8 warps an SM (ncu: 12% occupancy, 29% of DRAM's
 * bandwidth, 1.7 TB/s over a step) at 128 registers. Half the run doubles
 * the warps, each column's sum keeps its order (so its bits). G: the
 * storage of dY and Y. */
#define GRAD_W (RUN_W / 2)
#define GRAD_UNROLL 16
template <class G>
__global__ static void row_grad_part_kernel(bool negate, const G *dY, const G *Y, int64_t M, int64_t N,
                                            int64_t chunk, int64_t n_chunks, double *part)
{
    const int64_t row_runs = N / GRAD_W;
    GP_GRID_STRIDE(w, row_runs * n_chunks)
    {
        int64_t col = (w % row_runs) * GRAD_W, ch = w / row_runs;
        int64_t m0 = ch * chunk, m1 = m0 + chunk < M ? m0 + chunk : M;
        double acc[GRAD_W];
#pragma unroll
        for (int k = 0; k < GRAD_W; k++) acc[k] = 0;
        for (int64_t m = m0; m < m1; m += GRAD_UNROLL) {
            float g[GRAD_UNROLL][GRAD_W];
#pragma unroll
            for (int u = 0; u < GRAD_UNROLL; u++) {
                if (m + u >= m1) continue;
                gp_run<G, GRAD_W>::load(dY, (m + u) * N + col, g[u]);
                if (Y) {
                    float y[GRAD_W];
                    gp_run<G, GRAD_W>::load(Y, (m + u) * N + col, y);
#pragma unroll
                    for (int k = 0; k < GRAD_W; k++) g[u][k] = y[k] > 0 ? g[u][k] : 0.0f;
                }
            }
#pragma unroll
            for (int u = 0; u < GRAD_UNROLL; u++) {
                if (m + u >= m1) continue;
#pragma unroll
                for (int k = 0; k < GRAD_W; k++) acc[k] += (double)(negate ? -g[u][k] : g[u][k]);
            }
        }
        double *out = part + ch * N + col;
#pragma unroll
        for (int k = 0; k < GRAD_W; k++) out[k] = acc[k];
    }
}

#endif
