#include "graph/tensor.h"

#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

size_t gp_dtype_size(enum gp_dtype dtype)
{
    switch (dtype) {
    case GP_DTYPE_FLOAT32: case GP_DTYPE_INT32: case GP_DTYPE_UINT32: return 4;
    case GP_DTYPE_UINT8: case GP_DTYPE_INT8: case GP_DTYPE_BOOL: return 1;
    case GP_DTYPE_UINT16: case GP_DTYPE_INT16: case GP_DTYPE_FLOAT16:
    case GP_DTYPE_BFLOAT16: return 2;
    case GP_DTYPE_INT64: case GP_DTYPE_FLOAT64: case GP_DTYPE_UINT64: return 8;
    default: return 0;
    }
}

const char *gp_dtype_name(enum gp_dtype dtype)
{
    switch (dtype) {
    case GP_DTYPE_FLOAT32: return "float32";
    case GP_DTYPE_UINT8: return "uint8";
    case GP_DTYPE_INT8: return "int8";
    case GP_DTYPE_UINT16: return "uint16";
    case GP_DTYPE_INT16: return "int16";
    case GP_DTYPE_INT32: return "int32";
    case GP_DTYPE_INT64: return "int64";
    case GP_DTYPE_STRING: return "string";
    case GP_DTYPE_BOOL: return "bool";
    case GP_DTYPE_FLOAT16: return "float16";
    case GP_DTYPE_FLOAT64: return "float64";
    case GP_DTYPE_UINT32: return "uint32";
    case GP_DTYPE_UINT64: return "uint64";
    case GP_DTYPE_BFLOAT16: return "bfloat16";
    default: return "undefined";
    }
}

bool gp_dtype_is_float(enum gp_dtype dtype)
{
    return dtype == GP_DTYPE_FLOAT32 || dtype == GP_DTYPE_FLOAT16 ||
           dtype == GP_DTYPE_BFLOAT16 || dtype == GP_DTYPE_FLOAT64;
}

bool gp_dtype_is_integer(enum gp_dtype dtype)
{
    switch (dtype) {
    case GP_DTYPE_UINT8: case GP_DTYPE_INT8: case GP_DTYPE_UINT16: case GP_DTYPE_INT16:
    case GP_DTYPE_INT32: case GP_DTYPE_INT64: case GP_DTYPE_UINT32: case GP_DTYPE_UINT64:
        return true;
    default:
        return false;
    }
}

int64_t gp_shape_numel(const struct gp_shape *shape)
{
    int64_t n = 1;
    for (int i = 0; i < shape->rank; i++) n *= shape->dims[i];
    return n;
}

bool gp_shape_equal(const struct gp_shape *a, const struct gp_shape *b)
{
    if (a->rank != b->rank) return false;
    for (int i = 0; i < a->rank; i++)
        if (a->dims[i] != b->dims[i]) return false;
    return true;
}

bool gp_shape_check(const struct gp_shape *shape, size_t elem_size)
{
    if (shape->rank < 0 || shape->rank > GP_MAX_RANK) return false;
    int64_t limit = INT64_MAX / (int64_t)(elem_size ? elem_size : 1);
    int64_t n = 1;
    for (int i = 0; i < shape->rank; i++) {
        int64_t d = shape->dims[i];
        if (d < 0) return false;
        if (d != 0 && n > limit / d) return false;
        n *= d;
    }
    return true;
}

char *gp_shape_format(const struct gp_shape *shape, char *buf, size_t size)
{
    size_t used = 0;
    used += (size_t)snprintf(buf, size, "[");
    for (int i = 0; i < shape->rank && used < size; i++)
        used += (size_t)snprintf(buf + used, size - used, "%s%lld", i ? ", " : "",
                                 (long long)shape->dims[i]);
    if (used < size) snprintf(buf + used, size - used, "]");
    return buf;
}

float gp_half_to_float(uint16_t h)
{
    uint32_t sign = (uint32_t)(h >> 15) << 31;
    int exp = (h >> 10) & 0x1f;
    uint32_t mant = h & 0x3ff;
    float f;
    if (exp == 0) {
        f = ldexpf((float)mant, -24); /* zero and subnormals */
    } else if (exp == 31) {
        f = mant ? NAN : INFINITY;
    } else {
        f = ldexpf((float)(mant | 0x400), exp - 25);
    }
    uint32_t bits;
    memcpy(&bits, &f, 4);
    bits |= sign;
    memcpy(&f, &bits, 4);
    return f;
}

uint16_t gp_float_to_half(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
    uint32_t absx = x & 0x7fffffff;
    if (absx >= 0x7f800000) return sign | (absx > 0x7f800000 ? 0x7e00 : 0x7c00);
    if (absx >= 0x477ff000) return sign | 0x7c00; /* rounds to infinity */
    if (absx < 0x38800000) {                      /* subnormal half */
        float a;
        memcpy(&a, &absx, 4);
        return sign | (uint16_t)lrintf(a * 16777216.0f); /* 2^24, ties to even */
    }
    uint32_t mant = absx & 0x7fffff;
    int exp = (int)(absx >> 23) - 127 + 15;
    uint32_t half = ((uint32_t)exp << 10) | (mant >> 13);
    uint32_t rest = mant & 0x1fff;
    if (rest > 0x1000 || (rest == 0x1000 && (half & 1))) half++;
    return sign | (uint16_t)half;
}

float gp_bf16_to_float(uint16_t b)
{
    uint32_t x = (uint32_t)b << 16;
    float f;
    memcpy(&f, &x, 4);
    return f;
}

/* Loads through memcpy: initializers that are views of the model file may
 * sit at any address, and a misaligned typed load is undefined behaviour
 * (and faults once the compiler vectorizes it). */
#define DEFINE_LOAD(name, type)                                            \
    static type name(const void *d, int64_t i)                             \
    {                                                                      \
        type v;                                                            \
        memcpy(&v, (const unsigned char *)d + (size_t)i * sizeof v, sizeof v); \
        return v;                                                          \
    }
DEFINE_LOAD(load_f32, float)
DEFINE_LOAD(load_f64, double)
DEFINE_LOAD(load_u16, uint16_t)
DEFINE_LOAD(load_i16, int16_t)
DEFINE_LOAD(load_i32, int32_t)
DEFINE_LOAD(load_u32, uint32_t)
DEFINE_LOAD(load_i64, int64_t)
DEFINE_LOAD(load_u64, uint64_t)

double gp_tensor_get_f64(const struct gp_tensor *t, int64_t i)
{
    const void *d = t->data;
    switch (t->dtype) {
    case GP_DTYPE_FLOAT32: return load_f32(d, i);
    case GP_DTYPE_FLOAT64: return load_f64(d, i);
    case GP_DTYPE_FLOAT16: return gp_half_to_float(load_u16(d, i));
    case GP_DTYPE_BFLOAT16: return gp_bf16_to_float(load_u16(d, i));
    case GP_DTYPE_UINT64: return (double)load_u64(d, i);
    default: return (double)gp_tensor_get_i64(t, i);
    }
}

int64_t gp_tensor_get_i64(const struct gp_tensor *t, int64_t i)
{
    const void *d = t->data;
    switch (t->dtype) {
    case GP_DTYPE_UINT8: return ((const uint8_t *)d)[i];
    case GP_DTYPE_INT8: return ((const int8_t *)d)[i];
    case GP_DTYPE_UINT16: return load_u16(d, i);
    case GP_DTYPE_INT16: return load_i16(d, i);
    case GP_DTYPE_INT32: return load_i32(d, i);
    case GP_DTYPE_INT64: return load_i64(d, i);
    case GP_DTYPE_UINT32: return load_u32(d, i);
    case GP_DTYPE_UINT64: return (int64_t)load_u64(d, i);
    case GP_DTYPE_BOOL: return ((const uint8_t *)d)[i] != 0;
    default: {
        double v = gp_tensor_get_f64(t, i);
        /* Float to int conversion out of range is undefined in C: saturate. */
        if (v != v) return 0;
        if (v >= 9.2233720368547758e18) return INT64_MAX;
        if (v <= -9.2233720368547758e18) return INT64_MIN;
        return (int64_t)v;
    }
    }
}

void gp_tensor_set_f64(struct gp_tensor *t, int64_t i, double v)
{
    void *d = t->data;
    switch (t->dtype) {
    case GP_DTYPE_FLOAT32: ((float *)d)[i] = (float)v; return;
    case GP_DTYPE_FLOAT64: ((double *)d)[i] = v; return;
    case GP_DTYPE_FLOAT16: ((uint16_t *)d)[i] = gp_float_to_half((float)v); return;
    case GP_DTYPE_BFLOAT16: ((uint16_t *)d)[i] = gp_float_to_bf16((float)v); return;
    case GP_DTYPE_BOOL: ((uint8_t *)d)[i] = v != 0; return;
    default: {
        int64_t iv;
        if (v != v) iv = 0;
        else if (v >= 9.2233720368547758e18) iv = INT64_MAX;
        else if (v <= -9.2233720368547758e18) iv = INT64_MIN;
        else iv = (int64_t)v;
        gp_tensor_set_i64(t, i, iv);
    }
    }
}

void gp_tensor_set_i64(struct gp_tensor *t, int64_t i, int64_t v)
{
    void *d = t->data;
    switch (t->dtype) {
    case GP_DTYPE_UINT8: ((uint8_t *)d)[i] = (uint8_t)v; return;
    case GP_DTYPE_INT8: ((int8_t *)d)[i] = (int8_t)v; return;
    case GP_DTYPE_UINT16: ((uint16_t *)d)[i] = (uint16_t)v; return;
    case GP_DTYPE_INT16: ((int16_t *)d)[i] = (int16_t)v; return;
    case GP_DTYPE_INT32: ((int32_t *)d)[i] = (int32_t)v; return;
    case GP_DTYPE_INT64: ((int64_t *)d)[i] = v; return;
    case GP_DTYPE_UINT32: ((uint32_t *)d)[i] = (uint32_t)v; return;
    case GP_DTYPE_UINT64: ((uint64_t *)d)[i] = (uint64_t)v; return;
    case GP_DTYPE_BOOL: ((uint8_t *)d)[i] = v != 0; return;
    default: gp_tensor_set_f64(t, i, (double)v); return;
    }
}

void gp_tensor_drop_view_pages(const struct gp_tensor *t)
{
    if (!t || !t->view || !t->nbytes) return;
    /* Only pages wholly inside the view: the ones at its ends may hold a
     * neighbour's bytes. Views are read-only private mappings of files, so
     * dropping their pages loses nothing. */
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t lo = ((uintptr_t)t->data + page - 1) / page * page;
    uintptr_t hi = ((uintptr_t)t->data + t->nbytes) / page * page;
    if (hi > lo) madvise((void *)lo, hi - lo, MADV_DONTNEED);
}
