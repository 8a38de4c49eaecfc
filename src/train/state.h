/* Saved training states: what `train --save-state DIR` writes every N steps
 * and `train --resume DIR` continues from, on disk.
 *
 * Layout. DIR holds one folder per state, named by the optimizer steps done:
 *
 *     DIR/state-00000040/manifest.json   what the state is (JSON, below)
 *     DIR/state-00000040/tensors.bin     every tensor's float32 values, raw
 *                                        little-endian, back to back
 *
 * A state is written into a hidden folder beside them (DIR/.state-N.tmp-...),
 * each file fsynced, the folder fsynced, then renamed to state-N and DIR
 * fsynced: a folder named state-N is complete. Only then are older states
 * beyond the last K removed (each renamed away before its files go, so no
 * half-removed state keeps a state- name), and so are states past step N:
 * a run resumed from an older state rewrites its future.
 *
 * manifest.json (format "gpipe-onnx training state", version 1) has
 *   "step"             optimizer steps done (the next step's index, from 0)
 *   "epoch", "next_sample"   the next step's epoch and the position of its
 *                      first sample in that epoch's order; the order itself
 *                      is regenerated from the data-order seed and the epoch
 *                      (data/dataset.h), as dropout masks are from (seed,
 *                      step): no generator state exists beyond these numbers
 *   "steps_per_epoch", "total_steps", "optimizer_steps", "next_lr",
 *   "epoch_loss_sum", "epoch_steps"  (the epoch so far, for its mean loss)
 *   "data_order"       {"shuffle", "seed"} (the seed as a decimal string)
 *   "kernel_choices"   optional: the kernel choices the backends measured
 *                      (cuDNN's algorithms, as text), which resuming takes
 *                      back before measuring any, so that it computes with
 *                      the same ones
 *   "config"           the run's settings: key -> {"label", "value",
 *                      "detail", "rule"}; rule "match" must be equal to
 *                      resume, "note" may differ with a note (the result is
 *                      then not bit for bit), "free" may differ
 *   "tensors"          [{"name", "role", "dtype": "float32", "shape",
 *                      "offset", "bytes", "xxh64"}] in tensors.bin; role is
 *                      "parameter", "buffer" (BatchNorm running statistics),
 *                      or an optimizer state of the parameter named:
 *                      "momentum_buffer", "exp_avg", "exp_avg_sq"
 *   "tensors_file", "tensors_bytes", "tensors_xxh64"
 *   "manifest_xxh64"   the last member: XXH64 (util/xxh64.h, seed 0) of the
 *                      file's bytes before the comma that precedes it
 * Every digest is 16 lowercase hex digits, as `xxhsum -H1` prints. Reading a
 * state checks the manifest's digest, the blob's size and every tensor's
 * digest: a truncated or altered state is refused with what is wrong, and
 * resuming from DIR then takes the newest state that is whole. */
#ifndef GP_TRAIN_STATE_H
#define GP_TRAIN_STATE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "graph/tensor.h"
#include "util/error.h"

#define GP_STATE_FORMAT "gpipe-onnx training state"
#define GP_STATE_VERSION 1
#define GP_STATE_MANIFEST "manifest.json"
#define GP_STATE_TENSORS "tensors.bin"
#define GP_STATE_DIGEST_KEY "manifest_xxh64"
#define GP_STATE_MAX_SETTINGS 64

/* How a setting may change between the saving run and the resuming one. */
enum gp_state_rule {
    GP_STATE_MATCH, /* must be equal: it changes the arithmetic */
    GP_STATE_NOTE,  /* may differ, with a note: training continues, not bit for bit */
    GP_STATE_FREE,  /* may differ: it does not change the result */
};

struct gp_state_setting {
    char key[32];      /* "batch" */
    char label[48];    /* how messages name it: "--batch" */
    char value[192];   /* what is compared */
    char detail[256];  /* shown before the value, not compared (a file name); may be empty */
    enum gp_state_rule rule;
};

struct gp_state_meta {
    int64_t step;            /* optimizer steps done */
    int64_t epoch;           /* the next step's epoch */
    int64_t next_sample;     /* its first sample's position in that epoch's order */
    int64_t steps_per_epoch, total_steps, optimizer_steps;
    double next_lr;
    double epoch_loss_sum;   /* sum of this epoch's step losses so far */
    int64_t epoch_steps;     /* and their number */
    bool shuffle;
    uint64_t seed;
    /* The backends' measured kernel choices (backend/backends.h), which
     * decide results' last bits; NULL: none. Not owned: the writer's caller
     * keeps it, a read state's manifest holds it. */
    const char *kernel_choices;
    int n_settings;
    struct gp_state_setting settings[GP_STATE_MAX_SETTINGS];
};

/* Adds (or replaces) a setting; silently ignored past GP_STATE_MAX_SETTINGS. */
void gp_state_set(struct gp_state_meta *m, const char *key, const char *label, enum gp_state_rule rule,
                  const char *detail, const char *value_fmt, ...) __attribute__((format(printf, 6, 7)));
const struct gp_state_setting *gp_state_get(const struct gp_state_meta *m, const char *key);
const char *gp_state_rule_name(enum gp_state_rule r); /* "match", "note", "free" */

/* ---- writing ---- */

/* Makes DIR (and its parents) when missing and checks a state can be
 * written in it, before any long work. Errors name DIR and the reason. */
gp_status gp_state_check_dir(const char *dir, struct gp_error *err);

struct gp_state_writer;
/* Starts state `step` in DIR (its hidden temporary folder). */
gp_status gp_state_begin(const char *dir, int64_t step, struct gp_state_writer **out, struct gp_error *err);
/* Appends one tensor: data [numel(shape)] float32. */
gp_status gp_state_add(struct gp_state_writer *w, const char *name, const char *role, const struct gp_shape *shape,
                       const float *data, struct gp_error *err);
/* Writes the manifest, makes the state DIR/state-<step> and prunes DIR
 * to the newest `keep` states (keep >= 1). Frees w, on failure too (nothing
 * is left then but the states there were). *path gets the state's folder. */
gp_status gp_state_commit(struct gp_state_writer *w, const struct gp_state_meta *meta, int keep, char *path,
                          size_t path_size, struct gp_error *err);
void gp_state_abort(struct gp_state_writer *w); /* NULL is fine */

/* ---- reading ---- */

struct gp_state_tensor {
    const char *name, *role;
    struct gp_shape shape;
    uint64_t offset, bytes, xxh64;
};

struct gp_state {
    char path[4096];         /* the state's folder */
    struct gp_state_meta meta;
    int n_tensors;
    struct gp_state_tensor *tensors;
    int fd;                  /* tensors.bin */
    void *doc;               /* the parsed manifest, which owns the names */
};

/* Opens one state (its folder) and checks it whole: the manifest's digest,
 * format and fields, the blob's size and every tensor's digest. */
gp_status gp_state_open(const char *path, struct gp_state **out, struct gp_error *err);
/* A state folder, or DIR holding states: the newest that opens whole, each
 * newer one skipped reported through skipped(user, message). */
gp_status gp_state_open_latest(const char *path, void (*skipped)(void *user, const char *message), void *user,
                               struct gp_state **out, struct gp_error *err);
void gp_state_close(struct gp_state *s); /* NULL is fine */

/* The tensor of that name and role; NULL when the state has none. */
const struct gp_state_tensor *gp_state_find(const struct gp_state *s, const char *name, const char *role);
/* Its values (checked against its digest again) into out[numel]. */
gp_status gp_state_read(struct gp_state *s, const struct gp_state_tensor *t, float *out, struct gp_error *err);

/* Whether a run with settings `now` may continue from `saved`: every
 * "match" setting that differs is named in the error ("the state was saved
 * with --batch 32, this run has --batch 64"); each "note" one that differs
 * is reported through note(user, message). */
gp_status gp_state_compare(const struct gp_state_meta *saved, const struct gp_state_meta *now,
                           void (*note)(void *user, const char *message), void *user, struct gp_error *err);

#endif
