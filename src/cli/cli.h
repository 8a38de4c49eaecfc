/* The command-line front end: one file per command, built on the public
 * API (include/gpipe_onnx.h) alone. Each command returns the process exit
 * status: 0 success, 1 a failure with a one-line reason on stderr, 2 a
 * usage error. */
#ifndef GP_CLI_CLI_H
#define GP_CLI_CLI_H

#include <stdbool.h>
#include <stdint.h>

#include "gpipe_onnx.h"

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
/* cuDNN's algorithms measured before the first step or profiling pass
 * (gpo_train_callbacks.on_measure, gpo_balance_options.measure), on
 * stderr: a line rewritten on a terminal (tty), else one every 15 s; then
 * what they took, and `hint` (NULL: none). */
struct gp_cli_measure {
    bool tty;
    const char *hint;
    double said; /* seconds at the last line written (not a terminal) */
};
void gp_cli_measure_progress(struct gp_cli_measure *m, int problems, double seconds, int done);

/* "gpipe-onnx: error: ..." on stderr; returns GP_EXIT_FAIL. */
int gp_cli_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Usage error naming the command; returns GP_EXIT_USAGE. */
int gp_cli_usage(const char *command, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Parses a positive integer option value; false with a usage message. */
bool gp_cli_parse_int(const char *command, const char *option, const char *text, int64_t min,
                      int64_t max, int64_t *out);
/* A size: bytes, or a number with K, M, G or T (powers of 1024; KiB, MiB...
 * too), such as 5.4G; positive, whole bytes. False when it is not one. */
bool gp_cli_parse_size(const char *text, int64_t *out);
/* "1.5 KiB", "12.0 MiB"... into buf. */
const char *gp_cli_bytes(int64_t bytes, char *buf, int size);
/* "cuda:0,cuda:1" (or "0,1", "cuda"), "cpu:0,cpu:1" (or "cpu,cpu"): one
 * device per stage into d[] (GPO_MAX_STAGES at most); false with a usage
 * message naming `command`. */
bool gp_cli_parse_devices(const char *command, const char *list, int *n, struct gpo_device *d);
/* GPUs this build can train on: 0 without CUDA or without a visible GPU. */
int gp_cli_gpu_count(void);
/* "30,592" into buf. */
const char *gp_cli_count(int64_t n, char *buf, int size);

#endif
