#include "util/error.h"

#include <stdio.h>
#include <string.h>

gp_status gp_error_set(struct gp_error *err, gp_status status, const char *fmt, ...)
{
    if (!err || err->status != GP_OK) return status;
    err->status = status;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    va_end(ap);
    return status;
}

void gp_error_prefix(struct gp_error *err, const char *fmt, ...)
{
    if (!err || err->status == GP_OK) return;
    char prefix[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    /* The message may lose its tail when prefix + message exceed the buffer. */
    char joined[GP_ERROR_MSG_MAX + sizeof prefix];
    snprintf(joined, sizeof joined, "%s%s", prefix, err->msg);
    memcpy(err->msg, joined, GP_ERROR_MSG_MAX - 1);
    err->msg[GP_ERROR_MSG_MAX - 1] = '\0';
}

void gp_error_clear(struct gp_error *err)
{
    if (!err) return;
    err->status = GP_OK;
    err->msg[0] = '\0';
}

const char *gp_status_name(gp_status status)
{
    switch (status) {
    case GP_OK: return "ok";
    case GP_ERR_IO: return "I/O error";
    case GP_ERR_PARSE: return "parse error";
    case GP_ERR_UNSUPPORTED: return "unsupported";
    case GP_ERR_SHAPE: return "shape error";
    case GP_ERR_INVALID: return "invalid model";
    case GP_ERR_NOMEM: return "out of memory";
    case GP_ERR_DEVICE: return "device error";
    case GP_ERR_COMM: return "communication error";
    }
    return "unknown error";
}
