/* Element types, static shapes and constant tensors of the graph IR. */
#ifndef GP_GRAPH_TENSOR_H
#define GP_GRAPH_TENSOR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* The numeric codes are ONNX's TensorProto.DataType, so they convert 1:1. */
enum gp_dtype {
    GP_DTYPE_UNDEFINED = 0,
    GP_DTYPE_FLOAT32 = 1,
    GP_DTYPE_UINT8 = 2,
    GP_DTYPE_INT8 = 3,
    GP_DTYPE_UINT16 = 4,
    GP_DTYPE_INT16 = 5,
    GP_DTYPE_INT32 = 6,
    GP_DTYPE_INT64 = 7,
    GP_DTYPE_STRING = 8,
    GP_DTYPE_BOOL = 9,
    GP_DTYPE_FLOAT16 = 10,
    GP_DTYPE_FLOAT64 = 11,
    GP_DTYPE_UINT32 = 12,
    GP_DTYPE_UINT64 = 13,
    GP_DTYPE_BFLOAT16 = 16,
};

/* Bytes per element, or 0 for types without a fixed-size numeric layout
 * (string, complex, undefined): those are refused by the loader. */
size_t gp_dtype_size(enum gp_dtype dtype);
const char *gp_dtype_name(enum gp_dtype dtype);
bool gp_dtype_is_float(enum gp_dtype dtype);
bool gp_dtype_is_integer(enum gp_dtype dtype); /* signed/unsigned ints, not bool */

#define GP_MAX_RANK 8

struct gp_shape {
    int rank;
    int64_t dims[GP_MAX_RANK];
};

/* Element count; 0 if any dimension is 0. Shapes in the IR are validated so
 * that the count and its byte size fit in int64 (gp_shape_check). */
int64_t gp_shape_numel(const struct gp_shape *shape);
bool gp_shape_equal(const struct gp_shape *a, const struct gp_shape *b);
/* Fails when a dimension is negative or the element count times `elem_size`
 * overflows int64 (the guard against hostile files). */
bool gp_shape_check(const struct gp_shape *shape, size_t elem_size);
/* "[3, 16, 8, 8]" into buf; returns buf. */
char *gp_shape_format(const struct gp_shape *shape, char *buf, size_t size);

/* A tensor whose value is known at load time: an initializer or the result of
 * constant folding. `data` is either arena memory or, when `view` is set, a
 * window into the memory-mapped model file or an external data file; either
 * way the graph owns it. A view is read-only and may be unaligned (raw_data
 * lies wherever protobuf put it): read it through the accessors below or
 * memcpy, and copy it into owned memory before writing to it. */
struct gp_tensor {
    enum gp_dtype dtype;
    struct gp_shape shape;
    void *data;
    size_t nbytes;
    bool view;
};

/* For a view: gives its whole pages back to the kernel (the file's
 * unmodified pages, read again from the file if touched later); nothing for
 * owned data. For weights already copied to where they are used. */
void gp_tensor_drop_view_pages(const struct gp_tensor *t);

/* Element i converted to double / int64 (for folding and reports); safe on
 * unaligned data. The setters need owned (not view) data. */
double gp_tensor_get_f64(const struct gp_tensor *t, int64_t i);
int64_t gp_tensor_get_i64(const struct gp_tensor *t, int64_t i);
void gp_tensor_set_f64(struct gp_tensor *t, int64_t i, double v);
void gp_tensor_set_i64(struct gp_tensor *t, int64_t i, int64_t v);

/* IEEE half and bfloat16 conversions (round to nearest even; a NaN stays
 * a NaN). gp_float_to_bf16 is inline so that loops over many values
 * (pipeline/inputs_ahead.c) vectorize. */
float gp_half_to_float(uint16_t h);
uint16_t gp_float_to_half(float f);
float gp_bf16_to_float(uint16_t b);
static inline uint16_t gp_float_to_bf16(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    if ((x & 0x7fffffff) > 0x7f800000) return (uint16_t)((x >> 16) | 0x40);
    x += 0x7fff + ((x >> 16) & 1);
    return (uint16_t)(x >> 16);
}

#endif
