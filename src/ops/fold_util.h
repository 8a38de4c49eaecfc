/* Helpers shared by op infer and fold functions: required inputs, constant
 * integer lists (axes, shapes, pads), and index arithmetic over row-major
 * tensors (broadcast iteration, strided copies) so that each fold function
 * can move elements of any dtype by their byte size. */
#ifndef GP_OPS_FOLD_UTIL_H
#define GP_OPS_FOLD_UTIL_H

#include <stddef.h>
#include <stdint.h>

#include "ops/registry.h"

/* Input i, failing with "input i is required" when the node omits it (an
 * empty name passes the arity check but is no value) or when its shape is
 * not known. */
gp_status gp_req_in(struct gp_infer_ctx *ctx, int i, struct gp_value **out);

/* Reads constant input i, an integer tensor of rank 0 or 1, into out[0..*n).
 * `what` names the input in messages ("shape", "axes"); more than `max`
 * entries is an error. Fails through gp_need_const when not constant. */
gp_status gp_const_ints(struct gp_infer_ctx *ctx, int i, const char *what, int64_t *out, int max,
                        int *n);

/* Input i's dtype must be floating point / float or integer / bool / int32
 * or int64; otherwise fails naming the input and its dtype. An omitted
 * input passes (gp_req_in is the check for presence). */
gp_status gp_want_float(struct gp_infer_ctx *ctx, int i);
gp_status gp_want_numeric(struct gp_infer_ctx *ctx, int i);
gp_status gp_want_bool(struct gp_infer_ctx *ctx, int i);
gp_status gp_want_int_index(struct gp_infer_ctx *ctx, int i);

/* "[1, -1, 4]" into buf; returns buf. For lists that are not shapes yet. */
char *gp_ints_format(const int64_t *v, int n, char *buf, size_t size);

/* Row-major element strides of a contiguous tensor of this shape. */
void gp_shape_strides(const struct gp_shape *shape, int64_t *strides);

/* Strides of a tensor of shape `in`, broadcast into `out` (numpy rules,
 * aligned at the trailing axis): out->rank entries, 0 where `in` has a
 * size-1 or missing axis. Assumes the shapes broadcast. */
void gp_bcast_strides(const struct gp_shape *in, const struct gp_shape *out, int64_t *strides);

/* Walks every index of `shape` in row-major order and keeps, for up to
 * GP_ITER_MAX operands, the element offset base + sum(idx[d] * strides[d]).
 * Incremental, so a fold costs O(1) per element instead of a division per
 * axis. */
#define GP_ITER_MAX 4

struct gp_iter {
    int rank, n;
    int64_t dims[GP_MAX_RANK], idx[GP_MAX_RANK];
    int64_t strides[GP_ITER_MAX][GP_MAX_RANK];
    int64_t off[GP_ITER_MAX];
};

void gp_iter_init(struct gp_iter *it, const struct gp_shape *shape);
/* Adds an operand (at most GP_ITER_MAX); returns its index into it->off. */
int gp_iter_add(struct gp_iter *it, const int64_t *strides, int64_t base);
void gp_iter_next(struct gp_iter *it);

/* Copies numel(shape) elements of `esize` bytes into contiguous dst, reading
 * src at base + sum(idx[d] * strides[d]) (elements). Covers Transpose,
 * Slice, Split and Expand. */
void gp_copy_strided(void *dst, const void *src, size_t esize, const struct gp_shape *shape,
                     const int64_t *strides, int64_t base);

/* ---- plans shared by shape ops' infer, fold and kernels ---- */

/* Transpose's permutation (attribute perm, default reversed axes), checked
 * to be a permutation of `rank` axes. */
gp_status gp_transpose_perm(struct gp_infer_ctx *ctx, int rank, int *perm);

/* Split: sizes[k] of each output (node->n_outputs entries, allocated by the
 * caller) along an axis of size `dim`, from the split input (13+) or
 * attribute (2), else num_outputs (18: ceil(dim / n)-sized chunks, the last
 * one smaller), else an even split. */
gp_status gp_split_sizes(struct gp_infer_ctx *ctx, int64_t dim, int64_t *sizes);

/* Slice on an input of shape `in`: output axis d reads input positions
 * start[d], start[d] + step[d], ... (out.dims[d] of them). Starts/ends are
 * clamped as ONNX specifies, so INT64_MAX / INT64_MIN ends and negative
 * steps work. Reads inputs 1..4 (Slice-10+, which must be constant) or the
 * attributes (Slice-1). */
struct gp_slice_plan {
    struct gp_shape out;
    int64_t start[GP_MAX_RANK], step[GP_MAX_RANK];
};

gp_status gp_slice_plan(struct gp_infer_ctx *ctx, const struct gp_shape *in,
                        struct gp_slice_plan *p);

/* The strided views that Transpose and Slice read their input through,
 * shared by the backends' kernels and folding: output position i on axis d
 * reads input offset base + sum_d i_d * x_st[d] (strides may be negative).
 * Transpose's base is 0. */
gp_status gp_transpose_view(struct gp_infer_ctx *ctx, const struct gp_shape *in, int64_t *x_st);
gp_status gp_slice_view(struct gp_infer_ctx *ctx, const struct gp_shape *in, int64_t *x_st, int64_t *base);

#endif
