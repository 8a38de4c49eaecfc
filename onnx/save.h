/* Writing a trained model: the original .onnx file with new initializer
 * values, everything else (nodes, names, opsets, metadata) as it was. */
#ifndef GP_ONNX_SAVE_H
#define GP_ONNX_SAVE_H

#include "graph/tensor.h"
#include "util/error.h"

/* New values for the initializer called `name`. */
struct gp_saved_tensor {
    const char *name;
    enum gp_dtype dtype;   /* of `data`; GP_DTYPE_UNDEFINED (0) means float32 */
    const void *data;      /* gp_shape_numel(&shape) elements, C order */
    struct gp_shape shape; /* must equal the initializer's dims */
};

/* Re-reads `model_path`, replaces the data of the named initializers and
 * writes the result to `out_path`.
 *
 * Each initializer keeps its element type: float32 values are converted to
 * float16 / bfloat16 (round to nearest even) or float64 when the file had
 * that type; values already of the initializer's type are copied. Replaced
 * data is stored as raw_data, whatever field (typed or external) held it
 * before. Initializers kept as they were but stored as external data are
 * read in, so the output is one self-contained file (its folder need not be
 * the model's).
 *
 * The write is atomic: a temporary file in the destination folder, fsync,
 * rename over `out_path`; on any failure the temporary file is removed and
 * `out_path` is untouched. A name that is no initializer, a repeated name,
 * a shape that differs or a conversion that is not one of the above is an
 * error naming the tensor, found before anything is written. Outputs over
 * 2 GiB (protobuf's limit for one message) are refused: saving does not
 * write external data. */
gp_status gp_onnx_save(const char *model_path, const char *out_path,
                       const struct gp_saved_tensor *tensors, int n_tensors, struct gp_error *err);

#endif
