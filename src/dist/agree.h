/* Every rank of a job must run the same model with the same settings: a
 * rank started with another --lr, or reading another copy of the model,
 * would train something else silently. Each rank describes its run as a
 * list of (label, value) settings; the ranks exchange the lists and each
 * refuses a mismatch with the same message, naming the ranks and settings
 * that differ ("rank 2's --lr 0.02 differs from rank 0's 0.01").
 *
 * The record is of fixed size and zero-filled, so that equal settings give
 * equal bytes: the ranks first exchange only its digest, and the whole
 * records only when the digests differ. */
#ifndef GP_DIST_AGREE_H
#define GP_DIST_AGREE_H

#include <stdint.h>

#include "dist/comm.h"
#include "util/error.h"

#define GP_AGREE_MAX_ITEMS 48

struct gp_agree_item {
    char label[40];  /* how messages name the setting: "--lr", "the model" */
    char value[208]; /* shown in messages (cut to fit), with the detail */
    uint64_t digest; /* XXH64 of the whole value without the detail: what is compared */
};

struct gp_agree_record {
    char error[256]; /* non-empty: this rank could not describe its run (a file it cannot read) */
    int32_t n;
    int32_t dropped; /* settings past GP_AGREE_MAX_ITEMS */
    struct gp_agree_item items[GP_AGREE_MAX_ITEMS];
};

/* Zero-fills r. */
void gp_agree_init(struct gp_agree_record *r);
/* Adds a setting (labels are unique; a repeated label replaces the value). */
void gp_agree_add(struct gp_agree_record *r, const char *label, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* The same with a detail shown after the value but not compared: a file's
 * path beside its size and digest (ranks on other machines may read the
 * same bytes from another path). */
void gp_agree_add_detail(struct gp_agree_record *r, const char *label, const char *detail, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* Records that this rank cannot take part, and why: every rank refuses. */
void gp_agree_fail(struct gp_agree_record *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* GP_OK when records[0..n) all hold the same settings and no error; else
 * GP_ERR_INVALID naming each rank's error and each difference from rank
 * 0's settings (the first few, and how many more). */
gp_status gp_agree_compare(const struct gp_agree_record *records, int n, struct gp_error *err);

/* Exchanges `mine` with every rank of c and compares (the same verdict and
 * message on every rank). Errors of communication are GP_ERR_COMM. */
gp_status gp_agree_check(struct gp_comm *c, const struct gp_agree_record *mine, struct gp_error *err);

#endif
