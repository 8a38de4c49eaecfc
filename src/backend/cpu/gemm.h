/* The CPU backend's matrix product: BLAS, made bit-reproducible.
 *
 * A multi-threaded OpenBLAS call does not give the same bits for different
 * thread counts (0.3.21's sgemm differs even at 256 x 256 x 256), and
 * results here must not depend on how many threads run. So the output is
 * cut into tiles of a fixed size, whatever the thread count; OpenMP threads
 * share the tiles and each tile is one single-threaded BLAS call, whose
 * result depends only on its own operands. */
#ifndef GP_BACKEND_CPU_GEMM_H
#define GP_BACKEND_CPU_GEMM_H

#include <stdbool.h>
#include <stdint.h>

#include "backend/cpu/real.h"

/* C [m, n] = alpha * op(A) op(B) + beta * C, all row-major with leading
 * dimensions lda, ldb, ldc: op(A) [m, k] is A, or A^T of A stored [k, m]
 * when ta; op(B) [k, n] is B, or B^T of B stored [n, k] when tb. beta == 0
 * overwrites C (NaNs in it included); k == 0 leaves beta * C. Dimensions
 * must fit BLAS's int (callers check with gp_cpu_gemm_fits). Pins
 * OpenBLAS to one thread for the whole process: call it outside any
 * parallel region of your own. */
void GP_CPU(gp_cpu_gemm)(bool ta, bool tb, int64_t m, int64_t n, int64_t k, real alpha,
                         const real *a, int64_t lda, const real *b, int64_t ldb, real beta,
                         real *c, int64_t ldc);

/* Whether a product of these dimensions fits BLAS's int arguments. */
bool GP_CPU(gp_cpu_gemm_fits)(int64_t m, int64_t n, int64_t k);

#define gp_cpu_gemm GP_CPU(gp_cpu_gemm)
#define gp_cpu_gemm_fits GP_CPU(gp_cpu_gemm_fits)

#endif
