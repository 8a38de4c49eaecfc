/* LayerNormalization's warp-path forward (layer_norm.cuh): a warp per
 * row of at most LN_WARP_COLS values. */
#include "backend/cuda/layer_norm.cuh"

/* Forward: the generic kernel's statistics (sum, mean, squared deviations
 * from it, in double), each lane's values in run order, then the warp's
 * tree. FP64 per value: 2 conversions from float, 4 adds / multiplies. */
template <class IO, int VEC, int NPL>
__global__ static void __launch_bounds__(LN_WARP_BLOCK, 3)
    ln_forward_warp_kernel(struct ln_plan p, gp_fptr x, gp_fptr scale, gp_fptr bias, gp_fptr y, float *mean,
                           float *invstd, gp_fptr out_mean, gp_fptr out_inv, bool pvec)
{
    const int lane = threadIdx.x & 31;
    const int64_t step = (int64_t)gridDim.x * (LN_WARP_BLOCK / 32);
    for (int64_t r = (int64_t)blockIdx.x * (LN_WARP_BLOCK / 32) + (threadIdx.x >> 5); r < p.rows; r += step) {
        float v[NPL];
        ln_warp_load<IO, VEC, NPL>(x, p, r, lane, v);
        double s = 0;
#pragma unroll
        for (int i = 0; i < NPL / VEC; i++)
            if ((int64_t)(32 * i + lane) * VEC < p.cols)
#pragma unroll
                for (int k = 0; k < VEC; k++) s = DADD(s, (double)v[VEC * i + k]);
        s = ln_warp_sum(s);
        const double m = s / (double)p.cols;
        double q = 0;
#pragma unroll
        for (int i = 0; i < NPL / VEC; i++)
            if ((int64_t)(32 * i + lane) * VEC < p.cols)
#pragma unroll
                for (int k = 0; k < VEC; k++) {
                    double d = DSUB((double)v[VEC * i + k], m);
                    q = DADD(q, DMUL(d, d));
                }
        q = ln_warp_sum(q);
        const double var = q / (double)p.cols;
        const float mr = (float)m, is = (float)(1.0 / sqrt(DADD(var, p.eps)));
        if (lane == 0) {
            mean[r] = mr;
            invstd[r] = is;
            if (out_mean.p) gp_st(out_mean, r, mr);
            if (out_inv.p) gp_st(out_inv, r, is);
        }
#pragma unroll
        for (int i = 0; i < NPL / VEC; i++) {
            const int64_t j = (int64_t)(32 * i + lane) * VEC;
            if (j >= p.cols) break; /* runs grow with i */
            float sc[VEC], bi[VEC], o[VEC];
            ln_par_run<IO, VEC>(scale, p, p.sstride, p.sfull, pvec, j, sc);
            if (bias.p) ln_par_run<IO, VEC>(bias, p, p.bstride, p.bfull, pvec, j, bi);
#pragma unroll
            for (int k = 0; k < VEC; k++) {
                o[k] = FMUL(FMUL(FSUB(v[VEC * i + k], mr), is), sc[k]);
                if (bias.p) o[k] = FADD(o[k], bi[k]);
            }
            IO::template set_acts<VEC>(y, r * p.cols + j, o);
        }
    }
}

void ln_warp_forward(const struct ln_plan &p, enum io_kind kind, int vec, bool pvec, unsigned grid,
                     cudaStream_t stream, gp_fptr x, gp_fptr scale, gp_fptr bias, gp_fptr y, float *mean,
                     float *invstd, gp_fptr out_mean, gp_fptr out_inv)
{
    LN_WARP_DISPATCH(kind, vec, p.npl,
                     ln_forward_warp_kernel<IO, VEC, NPL><<<grid, LN_WARP_BLOCK, 0, stream>>>(
                         p, x, scale, bias, y, mean, invstd, out_mean, out_inv, pvec));
}
