/* exp in double for the cross-entropy kernels (loss.cu), in about half
 * CUDA's exp() instructions: the losses take two exponentials per logit,
 * and with exp() those, not the memory traffic, were the kernels' time.
 *   gp_fast_exp(d, tab) reduces d = k ln2/16 + r (|r| <= ln2/32, r exact
 * but for the rounding of ln2/16's second part, far below an ulp), takes
 * exp(r) - 1 from its Taylor polynomial of degree 7 (the first term left
 * out is below 2^-59 relative), multiplies by tab[k mod 16] = 2^((k mod
 * 16)/16) rounded to double, and puts 2^(k div 16) into the exponent bits.
 * Error: the table's half ulp, the last fma's half ulp, a few hundredths
 * from the rest: at most ~1.04 ulp (CUDA documents 1 ulp for exp()).
 *   The shortcut covers |d| <= 708, where the result and the table value
 * times it are normal doubles; anything else (-inf, NaN, +inf, underflow
 * to subnormals or 0, overflow) is exp(d) itself (-inf: its +0), so those
 * results are exp()'s bits. The table lives in shared memory (16 doubles, one 128-byte
 * row of the banks, so a warp's loads never conflict): a constant-memory
 * table serializes a warp's different indices. */
#ifndef GP_CUDA_FAST_EXP_CUH
#define GP_CUDA_FAST_EXP_CUH

#include <math.h>

#define GP_FAST_EXP_TABLE 16

/* 2^(j/16) rounded to nearest double, j = 0 .. 15 */
static __constant__ double gp_fast_exp_tab_c[GP_FAST_EXP_TABLE] = {
    0x1.0000000000000p+0, 0x1.0b5586cf9890fp+0, 0x1.172b83c7d517bp+0, 0x1.2387a6e756238p+0,
    0x1.306fe0a31b715p+0, 0x1.3dea64c123422p+0, 0x1.4bfdad5362a27p+0, 0x1.5ab07dd485429p+0,
    0x1.6a09e667f3bcdp+0, 0x1.7a11473eb0187p+0, 0x1.8ace5422aa0dbp+0, 0x1.9c49182a3f090p+0,
    0x1.ae89f995ad3adp+0, 0x1.c199bdd85529cp+0, 0x1.d5818dcfba487p+0, 0x1.ea4afa2a490dap+0,
};

/* Fills the block's table; a barrier must follow before any use. */
__device__ static inline void gp_fast_exp_load(double *tab)
{
    for (int j = threadIdx.x; j < GP_FAST_EXP_TABLE; j += blockDim.x) tab[j] = gp_fast_exp_tab_c[j];
}

__device__ static inline double gp_fast_exp(double d, const double *tab)
{
    /* k = d * 16/ln2 rounded to an integer, in kd's low bits: adding
     * 1.5 * 2^52 leaves units in the last place (|k| <= 16344) */
    const double kd = fma(d, 0x1.71547652b82fep+4, 0x1.8p52);
    const int k = __double2loint(kd);
    const double kf = kd - 0x1.8p52;
    /* ln2/16 = hi + lo: d - kf * hi is exact (a multiple of d's or hi's
     * ulp, >= 2^-58 when k != 0, below 2^-5 in size: 53 bits) */
    double r = fma(kf, -0x1.62e42fefa39efp-5, d);
    r = fma(kf, -0x1.abc9e3b39803fp-60, r);
    double q = fma(0x1.a01a01a01a01ap-13, r, 0x1.6c16c16c16c17p-10); /* 1/7!, 1/6! */
    q = fma(q, r, 0x1.1111111111111p-7);                            /* 1/5! */
    q = fma(q, r, 0x1.5555555555555p-5);                            /* 1/4! */
    q = fma(q, r, 0x1.5555555555555p-3);                            /* 1/3! */
    q = fma(q, r, 0.5);
    const double p = fma(q, r * r, r); /* exp(r) - 1 */
    const int j = k & (GP_FAST_EXP_TABLE - 1);
    const double t = tab[j];
    const double v = fma(t, p, t); /* in [2^(-1/32), 2^(31/32)] */
    /* times 2^((k - j) / 16): (k - j) << 16 is that power's exponent bits,
     * and the exponent field stays in [1, 2046] for |d| <= 708 (unsigned:
     * outside, where k is anything, the discarded value merely wraps) */
    const unsigned hi = (unsigned)__double2hiint(v) + ((unsigned)(k - j) << 16);
    const double fast = __hiloint2double((int)hi, __double2loint(v));
    /* Computed whatever d (any k indexes the table: j is in [0, 16)) and
     * chosen afterwards, so that no branch surrounds the shortcut and the
     * compiler keeps its constants out of the kernels' loops. NaN fails the
     * test too; -inf (the padding of the losses' last groups) skips exp()'s
     * instructions, for the same +0. */
    double slow = 0.0;
    if (!(fabs(d) <= 708.0) && d != -INFINITY) slow = exp(d);
    return fabs(d) <= 708.0 ? fast : slow;
}

#endif
