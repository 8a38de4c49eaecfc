#include "backend/cpu/gemm.h"

#include <limits.h>
#include <omp.h>

/* Tile of C per BLAS call. Each call packs its A rows and B columns again:
 * at 128 x 128 that repacking is ~2% of the arithmetic, and a layer's
 * product still splits into enough tiles to keep the cores busy. */
#define TILE_M 128
#define TILE_N 128
/* OpenBLAS keeps a fixed table of per-thread buffers (2 x its MAX_THREADS
 * of 64 in Debian's build); more concurrent callers than that abort. */
#define MAX_CALLERS 32

bool GP_CPU(gp_cpu_gemm_fits)(int64_t m, int64_t n, int64_t k)
{
    return m <= INT_MAX && n <= INT_MAX && k <= INT_MAX;
}

void GP_CPU(gp_cpu_gemm)(bool ta, bool tb, int64_t m, int64_t n, int64_t k, real alpha,
                         const real *a, int64_t lda, const real *b, int64_t ldb, real beta,
                         real *c, int64_t ldc)
{
    if (m <= 0 || n <= 0) return;
    if (k <= 0) { /* BLAS would reject the leading dimensions of empty operands */
        for (int64_t i = 0; i < m; i++)
            for (int64_t j = 0; j < n; j++) c[i * ldc + j] = beta == 0 ? 0 : beta * c[i * ldc + j];
        return;
    }
    /* Single-threaded calls, so that only the fixed tiling below decides
     * the bits. Setting the same value again is cheap and race-free; it
     * also overrides an OPENBLAS_NUM_THREADS from the environment. */
    openblas_set_num_threads(1);
    int64_t tm = (m + TILE_M - 1) / TILE_M, tn = (n + TILE_N - 1) / TILE_N, tiles = tm * tn;
    int callers = omp_get_max_threads();
    if (callers > MAX_CALLERS) callers = MAX_CALLERS;
#pragma omp parallel for num_threads(callers) if (tiles > 1) schedule(dynamic)
    for (int64_t t = 0; t < tiles; t++) {
        int64_t i0 = (t / tn) * TILE_M, j0 = (t % tn) * TILE_N;
        int64_t mi = m - i0 < TILE_M ? m - i0 : TILE_M, nj = n - j0 < TILE_N ? n - j0 : TILE_N;
        const real *at = ta ? a + i0 : a + i0 * lda; /* rows i0.. of op(A) */
        const real *bt = tb ? b + j0 * ldb : b + j0; /* columns j0.. of op(B) */
        gp_cblas_gemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans,
                      tb ? CblasTrans : CblasNoTrans, (int)mi, (int)nj, (int)k, alpha, at,
                      (int)lda, bt, (int)ldb, beta, c + i0 * ldc + j0, (int)ldc);
    }
}
