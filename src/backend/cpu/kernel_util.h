/* Helpers shared by the CPU kernel family files (src/backend/cpu/<family>.c):
 * element access for tensors of any dtype, the op layer's plan helpers
 * called from a kernel, when a loop is worth threads, and the two-pass
 * moments of the normalizations.
 *
 * Buffers on the CPU hold `real` for every float dtype and the dtype's own
 * C type otherwise (bool as uint8), as runner.c lays them out. */
#ifndef GP_BACKEND_CPU_KERNEL_UTIL_H
#define GP_BACKEND_CPU_KERNEL_UTIL_H

#include <stdint.h>

#include "backend/cpu/kernel.h"

/* Loops over fewer elements than this run on one thread: below it the
 * fork/join costs more than it saves. Threads only ever split independent
 * output elements, so results do not depend on the thread count. */
#define GP_CPU_PAR_MIN 32768

/* Bytes per element of a buffer of this dtype on the CPU. */
static inline size_t gp_cpu_esize(enum gp_dtype dt)
{
    return gp_dtype_is_float(dt) ? sizeof(real) : gp_dtype_size(dt);
}

/* Element i of a buffer of dtype dt, as int64 (floats truncate toward zero
 * and saturate; uint64 wraps) or as double. */
static inline int64_t gp_cpu_load_i64(const void *p, enum gp_dtype dt, int64_t i)
{
    switch (dt) {
    case GP_DTYPE_UINT8: return ((const uint8_t *)p)[i];
    case GP_DTYPE_BOOL: return ((const uint8_t *)p)[i] != 0;
    case GP_DTYPE_INT8: return ((const int8_t *)p)[i];
    case GP_DTYPE_UINT16: return ((const uint16_t *)p)[i];
    case GP_DTYPE_INT16: return ((const int16_t *)p)[i];
    case GP_DTYPE_INT32: return ((const int32_t *)p)[i];
    case GP_DTYPE_UINT32: return ((const uint32_t *)p)[i];
    case GP_DTYPE_INT64: return ((const int64_t *)p)[i];
    case GP_DTYPE_UINT64: return (int64_t)((const uint64_t *)p)[i];
    default: {
        double v = (double)((const real *)p)[i];
        if (v != v) return 0;
        if (v >= 9.2233720368547758e18) return INT64_MAX;
        if (v <= -9.2233720368547758e18) return INT64_MIN;
        return (int64_t)v;
    }
    }
}

static inline double gp_cpu_load_f64(const void *p, enum gp_dtype dt, int64_t i)
{
    if (gp_dtype_is_float(dt)) return (double)((const real *)p)[i];
    if (dt == GP_DTYPE_UINT64) return (double)((const uint64_t *)p)[i];
    return (double)gp_cpu_load_i64(p, dt, i);
}

/* Stores v into element i; narrower integer types wrap as a C cast does,
 * bool stores v != 0. */
static inline void gp_cpu_store_i64(void *p, enum gp_dtype dt, int64_t i, int64_t v)
{
    switch (dt) {
    case GP_DTYPE_UINT8: ((uint8_t *)p)[i] = (uint8_t)v; return;
    case GP_DTYPE_BOOL: ((uint8_t *)p)[i] = v != 0; return;
    case GP_DTYPE_INT8: ((int8_t *)p)[i] = (int8_t)v; return;
    case GP_DTYPE_UINT16: ((uint16_t *)p)[i] = (uint16_t)v; return;
    case GP_DTYPE_INT16: ((int16_t *)p)[i] = (int16_t)v; return;
    case GP_DTYPE_INT32: ((int32_t *)p)[i] = (int32_t)v; return;
    case GP_DTYPE_UINT32: ((uint32_t *)p)[i] = (uint32_t)v; return;
    case GP_DTYPE_INT64: ((int64_t *)p)[i] = v; return;
    case GP_DTYPE_UINT64: ((uint64_t *)p)[i] = (uint64_t)v; return;
    default: ((real *)p)[i] = (real)v; return;
    }
}

/* Floats into integers truncate toward zero and saturate at int64's range
 * (NaN gives 0), since the plain C conversion is undefined out of range. */
static inline void gp_cpu_store_f64(void *p, enum gp_dtype dt, int64_t i, double v)
{
    if (gp_dtype_is_float(dt)) {
        ((real *)p)[i] = (real)v;
    } else if (dt == GP_DTYPE_BOOL) {
        ((uint8_t *)p)[i] = v != 0;
    } else if (dt == GP_DTYPE_UINT64 && v >= 9.2233720368547758e18) {
        ((uint64_t *)p)[i] = v >= 1.8446744073709552e19 ? UINT64_MAX : (uint64_t)v;
    } else {
        int64_t iv = v != v ? 0
                     : v >= 9.2233720368547758e18 ? INT64_MAX
                     : v <= -9.2233720368547758e18 ? INT64_MIN
                                                  : (int64_t)v;
        gp_cpu_store_i64(p, dt, i, iv);
    }
}

/* The op layer's view of the running node, so kernels reuse its plan
 * helpers (gp_slice_plan, gp_split_sizes, gp_transpose_perm, gp_norm_axis,
 * gp_const_ints) and their messages name the node the same way. Those
 * helpers only read the graph. */
static inline struct gp_infer_ctx gp_cpu_infer_ctx(const struct gp_cpu_ctx *c,
                                                   struct gp_error *err)
{
    return (struct gp_infer_ctx){.graph = (struct gp_graph *)c->graph,
                                 .node = (struct gp_node *)c->node,
                                 .err = err};
}

/* Shapes of the node's input / output i (the graph's static shapes). */
static inline const struct gp_shape *gp_cpu_in_shape(const struct gp_cpu_ctx *c, int i)
{
    return &gp_cpu_in_value(c, i)->shape;
}
static inline const struct gp_shape *gp_cpu_out_shape(const struct gp_cpu_ctx *c, int i)
{
    return &gp_cpu_out_value(c, i)->shape;
}

/* Bytes per element of the node's input i (shape, gather, pad). */
static inline size_t gp_cpu_in_esize(const struct gp_cpu_ctx *c, int i)
{
    return gp_cpu_esize(gp_cpu_in_value(c, i)->dtype);
}

/* Mean and biased variance of v [n], two passes in double (instance and
 * layer normalization). */
static inline void gp_cpu_moments(const real *v, int64_t n, double *mean, double *var)
{
    double s = 0, q = 0;
    for (int64_t i = 0; i < n; i++) s += v[i];
    double m = n > 0 ? s / (double)n : 0;
    for (int64_t i = 0; i < n; i++) {
        double d = v[i] - m;
        q += d * d;
    }
    *mean = m;
    *var = n > 0 ? q / (double)n : 0;
}

#endif
