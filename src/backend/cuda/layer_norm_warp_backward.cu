/* LayerNormalization's warp-path backward dX (layer_norm.cuh): a warp
 * per row of at most LN_WARP_COLS values. */
#include "backend/cuda/layer_norm.cuh"

/* Backward dX (ln_bwd_dx_kernel's terms in its order; the parameter
 * gradients are ln_bwd_colsum_kernel's): x and dy of the row in registers
 * (2 NPL floats; the old dX is read value by value as it is written), the
 * sums of g and g xhat through two shuffle trees. ow (the executor's
 * first writer): dX written as 0 + its gradient, the old values not read.
 * FP64 per value: 7 conversions (float to double: dy, scale, xhat, x -
 * mean, and dy, scale again rather than 2 more registers each; v to
 * float) and 12 adds / multiplies. */
template <class IO, int VEC, int NPL>
__global__ static void __launch_bounds__(LN_WARP_BLOCK, NPL <= 24 ? 3 : 2)
    ln_bwd_dx_warp_kernel(struct ln_plan p, gp_fptr x, gp_fptr scale, gp_fptr dy, const float *mean,
                          const float *invstd, gp_fptr d_mean, gp_fptr d_inv, gp_fptr dx, bool ow, bool pvec)
{
    const int lane = threadIdx.x & 31;
    const int64_t step = (int64_t)gridDim.x * (LN_WARP_BLOCK / 32);
    for (int64_t r = (int64_t)blockIdx.x * (LN_WARP_BLOCK / 32) + (threadIdx.x >> 5); r < p.rows; r += step) {
        float xv[NPL], gv[NPL];
        ln_warp_load<IO, VEC, NPL>(x, p, r, lane, xv);
        if (dy.p) ln_warp_load<IO, VEC, NPL>(dy, p, r, lane, gv);
        const float m = mean[r], is = invstd[r];
        double sg = 0, sgx = 0;
        if (dy.p) {
#pragma unroll
            for (int i = 0; i < NPL / VEC; i++) {
                const int64_t j = (int64_t)(32 * i + lane) * VEC;
                if (j >= p.cols) break;
                float sc[VEC];
                ln_par_run<IO, VEC>(scale, p, p.sstride, p.sfull, pvec, j, sc);
#pragma unroll
                for (int k = 0; k < VEC; k++) {
                    double g = DMUL((double)gv[VEC * i + k], (double)sc[k]);
                    sg = DADD(sg, g);
                    sgx = DADD(sgx, DMUL(g, (double)FMUL(FSUB(xv[VEC * i + k], m), is)));
                }
            }
            sg = ln_warp_sum(sg);
            sgx = ln_warp_sum(sgx);
        }
        const double n = (double)p.cols, mg = sg / n, mgx = sgx / n;
        const double cm = d_mean.p ? (double)gp_ld(d_mean, r) / n : 0.0;
        const double cv =
            d_inv.p ? DMUL(DMUL(DMUL(-(double)gp_ld(d_inv, r), (double)is), (double)is), (double)is) / n : 0.0;
#pragma unroll
        for (int i = 0; i < NPL / VEC; i++) {
            const int64_t j = (int64_t)(32 * i + lane) * VEC;
            if (j >= p.cols) break;
            float sc[VEC], o[VEC];
            if (dy.p) ln_par_run<IO, VEC>(scale, p, p.sstride, p.sfull, pvec, j, sc);
            if (ow) {
#pragma unroll
                for (int k = 0; k < VEC; k++) o[k] = 0.0f;
            } else {
                IO::template acts<VEC>(dx, r * p.cols + j, o);
            }
#pragma unroll
            for (int k = 0; k < VEC; k++) {
                double xc = (double)FSUB(xv[VEC * i + k], m), xhat = DMUL(xc, (double)is);
                double v = DADD(cm, DMUL(cv, xc));
                if (dy.p) {
                    double g = DMUL((double)gv[VEC * i + k], (double)sc[k]);
                    v = DADD(v, DMUL((double)is, DSUB(DSUB(g, mg), DMUL(xhat, mgx))));
                }
                o[k] = FADD(o[k], (float)v); /* the old value (or 0), widened, plus v: one rounding */
            }
            IO::template set_acts<VEC>(dx, r * p.cols + j, o);
        }
    }
}

void ln_warp_backward_dx(const struct ln_plan &p, enum io_kind kind, int vec, bool pvec, unsigned grid,
                         cudaStream_t stream, gp_fptr x, gp_fptr scale, gp_fptr dy, const float *mean,
                         const float *invstd, gp_fptr d_mean, gp_fptr d_inv, gp_fptr dx, bool ow)
{
    LN_WARP_DISPATCH(kind, vec, p.npl,
                     ln_bwd_dx_warp_kernel<IO, VEC, NPL><<<grid, LN_WARP_BLOCK, 0, stream>>>(
                         p, x, scale, dy, mean, invstd, d_mean, d_inv, dx, ow, pvec));
}
