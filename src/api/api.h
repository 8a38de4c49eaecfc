/* The public C API's context (include/gpipe_onnx.h) and what its files
 * share: the loaded graph and layer list, the last balance report, the
 * file holding the current weights, the last error. */
#ifndef GP_API_API_H
#define GP_API_API_H

#include <stdbool.h>

#include "gpipe_onnx.h"
#include "graph/graph.h"
#include "graph/layers.h"
#include "partitioner/balance.h"
#include "util/error.h"

struct gpo_model {
    struct gp_error err;        /* the last failure; err.msg "" when none */
    char *path;                 /* as opened */
    char *current;              /* the file with the current weights: path, tmp or saved */
    char *tmp;                  /* this context's trained model, removed at close; NULL: none */
    char *saved;                /* the trained model written to the caller's save_path; NULL: none */
    struct gpo_open_options opts;
    bool loaded;
    struct gp_graph g;          /* loaded from `current` at opts.batch */
    struct gp_layers layers;
    int *ids;                   /* scratch: value ids of one frontier */
    const char **frontier_names;
    int n_tied;
    struct gpo_tied *tied;
    int *tied_readers;
    char note[2048];            /* the exporter note of the loaded model, "" when none */

    bool has_report;
    struct gp_profile prof;
    struct gp_balance_report rep;
    struct gpo_balance_report report; /* rep in the public types */
    struct gpo_layer_profile *layer_profiles;
    struct gpo_stage stages[3][GPO_MAX_STAGES];
    int balance[3][GPO_MAX_STAGES];

    struct gpo_job *job;        /* gpo_job_join's (api/job.c); NULL: one process */
};

/* Records a failure on the context: the status, and the message formatted
 * (the first since the call began wins, as gp_error_set does). */
gpo_status gpo_fail(gpo_model *m, gpo_status st, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* A failure the internals reported in m->err. */
static inline gpo_status gpo_status_of(gp_status st) { return (gpo_status)st; }
/* Clears the error at the start of a call. */
void gpo_begin(gpo_model *m);

/* (Re)loads m->g and m->layers from m->current; frees what they held. */
gpo_status gpo_reload(gpo_model *m);

/* "cpu:0,cuda:1", "0,1": one device per stage into cuda[] and index[]
 * (GPO_MAX_STAGES at most). */
gpo_status gpo_parse_devices(gpo_model *m, const char *list, int *n, bool *cuda, int *index);
/* GPUs this build can use: 0 without CUDA or without a visible GPU. */
int gpo_gpu_count(void);

/* Public enums to the internal ones. */
enum gp_precision gpo_precision_of(enum gpo_precision p);
enum gp_layout_policy gpo_layout_of(enum gpo_layout l);
enum gp_checkpoint gpo_checkpoint_of(enum gpo_checkpoint c);
enum gp_pipe_schedule_kind gpo_schedule_of(enum gpo_pipeline_schedule s);

/* Drops the last balance report. */
void gpo_report_free(gpo_model *m);

/* "cuda:0,cpu:1" of the engine's stage arrays, through gpo_devices_format. */
const char *gpo_stage_devices(int n, const bool *cuda, const int *index, char *buf, size_t size);

/* The balance options a training run's automatic split ("time" or
 * "memory") profiles with: cfg's settings at `batch` and `devices`, the
 * progress through cb (may be NULL). */
void gpo_train_balance_options(const struct gpo_train_config *cfg, const struct gpo_train_callbacks *cb,
                               const char *devices, int64_t batch, const char *by, struct gpo_balance_options *bo);

/* ---- training (api/train.c), as api/job.c runs it per rank ---- */

struct gp_train_config;
/* The engine's configuration for c: options, devices (their defaults
 * applied) and the split as given; *auto_balance "time" / "memory" when
 * the split is still to be found, else NULL. Its strings point into c. */
gpo_status gpo_train_resolve(gpo_model *m, const struct gpo_train_config *c, struct gp_train_config *t,
                             const char **auto_balance);
/* Trains with t as given (adjusted after gpo_train_resolve): c's data are
 * found and loaded as gpo_train does; nothing else of c is read (no outputs
 * checked, no split searched, no weights kept). */
gpo_status gpo_train_resolved(gpo_model *m, const struct gpo_train_config *c, const struct gp_train_config *t,
                              const struct gpo_train_callbacks *cb, struct gpo_train_result *out);

/* ---- several processes (api/job.c) ---- */

/* gpo_train in a context that joined a job: this rank's part. */
gpo_status gpo_job_train(gpo_model *m, const struct gpo_train_config *c, const struct gpo_train_callbacks *cb,
                         struct gpo_train_result *out);
/* Whether the context's stages run in several processes (a job of more
 * than one rank). */
bool gpo_job_remote(const gpo_model *m);
/* Leaves the job at gpo_close: MPI_Finalize, or MPI_Abort when this rank
 * failed alone (then does not return). */
void gpo_job_end(gpo_model *m);

#endif
