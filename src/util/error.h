/* Status codes and error messages shared by the whole library.
 *
 * Every function that can fail returns a gp_status and, on failure, fills a
 * struct gp_error with one line that names the file, node or value at fault.
 * Library code never prints and never exits: the CLI decides what to do. */
#ifndef GP_UTIL_ERROR_H
#define GP_UTIL_ERROR_H

#include <stdarg.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum gp_status {
    GP_OK = 0,
    GP_ERR_IO,          /* a file could not be read or written */
    GP_ERR_PARSE,       /* malformed input (protobuf, npy, JSON, command line) */
    GP_ERR_UNSUPPORTED, /* valid input that this program does not handle */
    GP_ERR_SHAPE,       /* inconsistent or unknowable shapes */
    GP_ERR_INVALID,     /* a structural error: cycle, dangling value, bad attribute */
    GP_ERR_NOMEM,       /* an allocation failed */
    GP_ERR_DEVICE,      /* a device (CUDA, cuBLAS, cuDNN) call failed */
    GP_ERR_COMM,        /* another rank of the job could not be reached in time, or MPI failed */
} gp_status;

#define GP_ERROR_MSG_MAX 2048

struct gp_error {
    gp_status status;
    char msg[GP_ERROR_MSG_MAX];
};

/* Records the first error only: later calls keep the original message, which
 * is the one closest to the cause. Returns `status` so callers can write
 * `return gp_error_set(err, GP_ERR_PARSE, "...")`. `err` may be NULL. */
gp_status gp_error_set(struct gp_error *err, gp_status status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Prepends context ("loading model.onnx: ") to an error already set. */
void gp_error_prefix(struct gp_error *err, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

void gp_error_clear(struct gp_error *err);

const char *gp_status_name(gp_status status);

#define GP_TRY(expr)                                 \
    do {                                             \
        gp_status gp_try_status_ = (expr);           \
        if (gp_try_status_ != GP_OK) return gp_try_status_; \
    } while (0)

#ifdef __cplusplus
}
#endif

#endif
