#include "data/dataset.h"

#include <math.h>
#include <stdio.h>

#include <stdlib.h>
#include <string.h>

static uint64_t splitmix(uint64_t x)
{
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

void gp_dataset_order(int64_t n, bool shuffle, uint64_t seed, int64_t epoch, int64_t *order)
{
    for (int64_t i = 0; i < n; i++) order[i] = i;
    if (!shuffle) return;
    uint64_t key = splitmix(seed ^ splitmix((uint64_t)epoch + 0x5851F42D4C957F2Dull));
    for (int64_t i = n - 1; i > 0; i--) {
        /* Multiply-shift maps 64 random bits onto [0, i] with negligible bias. */
        uint64_t r = splitmix(key + (uint64_t)i);
        int64_t j = (int64_t)(((unsigned __int128)r * (uint64_t)(i + 1)) >> 64);
        int64_t t = order[i];
        order[i] = order[j];
        order[j] = t;
    }
}

size_t gp_dataset_row_bytes(const struct gp_tensor *t)
{
    if (t->shape.rank < 1 || t->shape.dims[0] == 0) return 0;
    return t->nbytes / (size_t)t->shape.dims[0];
}

void gp_dataset_gather(const struct gp_tensor *t, const int64_t *order, int64_t n_order,
                       int64_t first, int64_t count, void *dst)
{
    size_t row = gp_dataset_row_bytes(t);
    for (int64_t i = 0; i < count; i++) {
        int64_t k = first + i < n_order ? first + i : n_order - 1;
        memcpy((char *)dst + (size_t)i * row, (const char *)t->data + (size_t)order[k] * row, row);
    }
}

void gp_dataset_free(struct gp_dataset *d)
{
    free(d->owned_x);
    free(d->owned_y);
    memset(d, 0, sizeof *d);
}

static gp_status check_finite(const struct gp_tensor *t, int64_t n, const char *name, struct gp_error *err)
{
    if (!gp_dtype_is_float(t->dtype)) return GP_OK;
    int64_t total = gp_shape_numel(&t->shape), per = n > 0 ? total / n : 0;
    for (int64_t e = 0; e < total; e++) {
        double v = gp_tensor_get_f64(t, e);
        if (isfinite(v)) continue;
        return gp_error_set(err, GP_ERR_INVALID,
                            "%s: sample %lld holds %s (element %lld of the sample): the data must be finite",
                            name, (long long)(per ? e / per : 0), isnan(v) ? "NaN" : v > 0 ? "inf" : "-inf",
                            (long long)(per ? e % per : e));
    }
    return GP_OK;
}

gp_status gp_dataset_check_finite(const struct gp_dataset *d, const char *what, struct gp_error *err)
{
    char x_name[256], y_name[256];
    snprintf(x_name, sizeof x_name, "%s%s", d->x_source ? d->x_source : what, d->x_source ? "" : " data");
    snprintf(y_name, sizeof y_name, "%s%s", d->y_source ? d->y_source : what, d->y_source ? "" : " targets");
    GP_TRY(check_finite(&d->x, d->n, x_name, err));
    if (d->y.dtype != GP_DTYPE_UNDEFINED) GP_TRY(check_finite(&d->y, d->n, y_name, err));
    return GP_OK;
}
