/* NumPy .npy files: the training data and labels users hand us, and arrays
 * we write back (predictions, dumps for tests).
 *
 * Reading accepts format versions 1.0, 2.0 and 3.0, C order only, at most
 * GP_MAX_RANK dimensions, and these dtypes (descr as numpy writes them):
 *
 *     <f4 float32   <f8 float64   <f2 float16
 *     <i8 int64     <i4 int32     <i2 int16     |i1 int8
 *     <u8 uint64    <u4 uint32    <u2 uint16    |u1 uint8    |b1 bool
 *
 * Big-endian ('>') arrays are byte-swapped on load; '=' and no prefix mean
 * this (little-endian) host. Every header field is checked, and the data must
 * be exactly as long as dtype and shape say: a truncated, padded or lying
 * file is an error that names the file, never a crash. */
#ifndef GP_DATA_NPY_H
#define GP_DATA_NPY_H

#include <stddef.h>
#include <stdint.h>

#include "graph/tensor.h"
#include "util/error.h"

/* Headers longer than this are refused (numpy itself refuses anything over
 * 10000 bytes by default; ours for 8 dimensions are under 200). */
#define GP_NPY_MAX_HEADER 65536

struct gp_npy {
    enum gp_dtype dtype;
    struct gp_shape shape;
    void *data;    /* nbytes, 64-byte aligned, little-endian; gp_npy_free */
    size_t nbytes;
};

/* Reads the whole array into memory with one read of the data. On failure
 * `out` is left empty (nothing to free) and err names `path`. */
gp_status gp_npy_read(const char *path, struct gp_npy *out, struct gp_error *err);

/* The same from bytes in memory; `name` names them in messages. */
gp_status gp_npy_read_buffer(const void *bytes, size_t size, const char *name, struct gp_npy *out,
                             struct gp_error *err);

void gp_npy_free(struct gp_npy *a);

int64_t gp_npy_numel(const struct gp_npy *a);

/* Element conversions into caller memory of gp_npy_numel(a) elements.
 * To float32: every numeric dtype (float64 rounds to nearest, large integers
 * round as C conversions do). To int64: integer and bool dtypes, and float
 * dtypes whose values are all integers (labels saved as floats); anything
 * else, or a value out of int64's range, is an error naming the element. */
gp_status gp_npy_to_f32(const struct gp_npy *a, float *out, struct gp_error *err);
gp_status gp_npy_to_i64(const struct gp_npy *a, int64_t *out, struct gp_error *err);

/* Converts `a` in place to GP_DTYPE_FLOAT32 or GP_DTYPE_INT64 (a no-op when
 * it already has that type). On failure `a` is unchanged. */
gp_status gp_npy_convert(struct gp_npy *a, enum gp_dtype to, struct gp_error *err);

/* The descr string numpy writes for `dtype` ("<f4"), or NULL when .npy files
 * cannot hold it here (bfloat16, strings). */
const char *gp_npy_descr(enum gp_dtype dtype);

/* Writes `data` (little-endian, C order, gp_shape_numel(shape) elements of
 * `dtype`) as format 1.0 with numpy's own header layout, so that the file
 * is byte-identical to np.save's. The write is atomic: a temporary file in
 * the destination folder, fsync, then rename over `path`; on any failure the
 * temporary file is removed and `path` is untouched. */
gp_status gp_npy_write(const char *path, enum gp_dtype dtype, const struct gp_shape *shape,
                       const void *data, struct gp_error *err);

#endif
