/* Small helpers the CUDA op tests share: name lists for node inputs and
 * outputs, a seeded random source for the integer and bool data a test
 * gives op_compare, and the tolerance of long sums computed by cuBLAS and
 * cuDNN (whose summation order differs from the CPU's). */
#ifndef GP_TESTS_CUDA_TEST_UTIL_H
#define GP_TESTS_CUDA_TEST_UTIL_H

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "op_compare.h"

#define N_OF(a) ((int)(sizeof(a) / sizeof((a)[0])))
/* A literal list of names: S("x", "w", "b"). */
#define S(...) ((const char *const[]){__VA_ARGS__})

/* One generator per test program (a PCG-style LCG, fixed seed): failures
 * reproduce; every case draws fresh values. */
static uint64_t cuda_test_lcg = 0x853c49e6748fea9bull;

static inline uint64_t next_u64(void)
{
    cuda_test_lcg = cuda_test_lcg * 6364136223846793005ull + 1442695040888963407ull;
    return cuda_test_lcg >> 11;
}

/* Uniform in [0, 1). */
static inline double next_unit(void) { return (double)next_u64() * (1.0 / 9007199254740992.0); }

/* A float's bits and back (bit-for-bit comparisons). */
static inline uint32_t bits_of(float x)
{
    uint32_t b;
    memcpy(&b, &x, sizeof b);
    return b;
}

static inline float float_of(uint32_t b)
{
    float x;
    memcpy(&x, &b, sizeof x);
    return x;
}

static inline int64_t *ints64(int64_t n, int64_t lo, int64_t hi)
{
    int64_t *v = malloc(sizeof(int64_t) * (size_t)(n ? n : 1));
    assert_non_null(v);
    for (int64_t i = 0; i < n; i++) v[i] = lo + (int64_t)(next_u64() % (uint64_t)(hi - lo + 1));
    return v;
}

static inline int32_t *ints32(int64_t n, int32_t lo, int32_t hi)
{
    int32_t *v = malloc(sizeof(int32_t) * (size_t)(n ? n : 1));
    assert_non_null(v);
    for (int64_t i = 0; i < n; i++) v[i] = lo + (int32_t)(next_u64() % (uint64_t)(hi - lo + 1));
    return v;
}

/* Bools, true with probability 1 / one_in. */
static inline uint8_t *bools(int64_t n, unsigned one_in)
{
    uint8_t *v = malloc((size_t)(n ? n : 1));
    assert_non_null(v);
    for (int64_t i = 0; i < n; i++) v[i] = (uint8_t)(next_u64() % one_in == 0);
    return v;
}

/* The absolute tolerance of sums of `len` products of inputs in [-2, 2)
 * and gradients in [-1, 1): rounding grows about linearly with the length
 * of a sequential float sum. */
static inline double sum_tol(int64_t len) { return 1e-6 + 4e-7 * (double)len; }

/* Options for a case whose outputs are sums of `len` terms. With TF32
 * (10 mantissa bits) errors grow like the square root of the length times
 * 2^-11 of the terms. */
static inline struct op_compare sum_compare(const char *label, int64_t len, bool tf32)
{
    if (tf32)
        return (struct op_compare){.label = label, .tf32 = true, .rel_tol = 1e-2,
                                   .abs_tol = 5e-3 * sqrt((double)len)};
    return (struct op_compare){.label = label, .abs_tol = sum_tol(len), .rel_tol = 2e-5};
}

#endif
