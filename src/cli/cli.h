/* The command-line front end: one file per command. Each command returns
 * the process exit status: 0 success, 1 a failure with a one-line reason on
 * stderr, 2 a usage error. */
#ifndef GP_CLI_CLI_H
#define GP_CLI_CLI_H

#include <stdbool.h>
#include <stdint.h>

#include "backend/compute.h"
#include "graph/layout.h"
#include "dist/comm.h"
#include "pipeline/pipeline.h"
#include "util/error.h"

#define GP_EXIT_OK 0
#define GP_EXIT_FAIL 1
#define GP_EXIT_USAGE 2

int gp_cmd_inspect(int argc, char **argv);
int gp_cmd_devices(int argc, char **argv);
int gp_cmd_train(int argc, char **argv);
int gp_cmd_predict(int argc, char **argv);
int gp_cmd_balance(int argc, char **argv);

struct gpo_balance_options;
struct gpo_balance_report;
/* The balance report for people (balance, and train --balance time|memory). */
void gp_cli_print_balance(const char *model, const struct gpo_balance_options *o,
                          const struct gpo_balance_report *r);
/* Profiling passes on stderr when it is a terminal. */
void gp_cli_balance_progress(void *user, int done, int total);

/* "gpipe-onnx: error: ..." on stderr; returns GP_EXIT_FAIL. */
int gp_cli_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Usage error naming the command; returns GP_EXIT_USAGE. */
int gp_cli_usage(const char *command, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Parses a positive integer option value; false with a usage message. */
bool gp_cli_parse_int(const char *command, const char *option, const char *text, int64_t min,
                      int64_t max, int64_t *out);
/* "1.5 KiB", "12.0 MiB"... into buf. */
const char *gp_cli_bytes(int64_t bytes, char *buf, int size);
/* "cuda:0,cuda:1" (or "0,1", "cuda"), "cpu:0,cpu:1" (or "cpu,cpu"): one
 * device per stage into cuda[] and index[] (GP_CLI_MAX_DEVICES at most);
 * false with a usage message naming `command`. */
#define GP_CLI_MAX_DEVICES 64
bool gp_cli_parse_devices(const char *command, const char *list, int *n, bool *cuda, int *index);
/* GPUs this build can train on: 0 without CUDA or without a visible GPU. */
int gp_cli_gpu_count(void);
/* "30,592" into buf. */
const char *gp_cli_count(int64_t n, char *buf, int size);

/* ---- train --pipeline: one rank of a job (cli/distributed.c) ---- */

struct gp_train_config;
struct gp_nccl;
/* The run as the command line resolved it (model defaults applied). */
struct gp_cli_train_run {
    const struct gp_train_config *cfg;
    const char *data, *labels, *val_data, *val_labels;
    int64_t synthetic;        /* samples of --synthetic; < 0: real data */
    const char *auto_balance; /* "time", "memory" or NULL */
    int n_balance;            /* stages --balance listed; 0: none */
    int64_t bucket_kib;       /* --bucket-kib: replicas' gradient sums in buckets of this many KiB */
    /* --resume: the state folder every rank resolved it to (the newest
     * whole state of the folder given, as this rank reads it), filled by
     * gp_cli_dist_start; every rank must see the same state's bytes. */
    char *resume_state;
    size_t resume_state_size;
    bool quiet;               /* --quiet: no line per rank */
};

struct gp_cli_dist {
    struct gp_launch launch;
    struct gp_comm *comm;     /* NULL once ended */
    int pipeline, replicas;   /* stages and data-parallel replicas: launch.size = their product */
    struct gp_pipe_remote remote; /* several processes: this rank's stage and its link to the others */
    /* Stages on GPUs: this rank's GPU (by its local rank) and the NCCL
     * links between the ranks' GPUs; -1 and NULL on CPU devices. */
    int gpu;
    struct gp_nccl *nccl;
};

/* Joins the job this process was launched into (mpirun, srun) as one of
 * pipeline x replicas ranks and checks that every rank runs the same model
 * and settings. GP_EXIT_OK: go on (d->comm is up; end it with
 * gp_cli_dist_end); otherwise the exit status, its message printed. A
 * failure only this rank knows of ends the whole job (MPI_Abort). */
int gp_cli_dist_start(const struct gp_cli_train_run *run, int pipeline, double timeout_s, struct gp_cli_dist *d);
void gp_cli_dist_end(struct gp_cli_dist *d);
/* --balance time|memory across processes: rank 0 profiled and split the
 * model (`ok`: it could; its counts in balance[0..n)); the others get its
 * counts. GP_EXIT_OK, or the exit status (rank 0 said why; a broken link
 * ends the job). */
int gp_cli_dist_share_balance(struct gp_cli_dist *d, bool ok, int *balance, int n);
/* --trace FILE across processes: each rank's own file, FILE with
 * ".rank<R>" before its extension (out.json: out.rank1.json). */
void gp_cli_dist_trace_path(const struct gp_cli_dist *d, const char *path, char *out, size_t size);

#endif
