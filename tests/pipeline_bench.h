/* Test helper: a pipeline over a fixture model with synthetic data, for
 * tests that drive gp_pipeline_* directly (step by step, comparing ways of
 * taking a step), and everything training keeps, read back as one array. */
#ifndef GP_TESTS_PIPELINE_BENCH_H
#define GP_TESTS_PIPELINE_BENCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backend/device.h"
#include "data/dataset.h"
#include "graph/graph.h"
#include "pipeline/pipeline.h"
#include "train/loss.h"

struct pipe_bench_setup {
    const char *fixture;   /* under models/, without .onnx */
    int64_t batch;
    int batches;           /* of synthetic data (step s takes batch s % batches) */
    int stages, chunks;
    const int *balance;    /* NULL: an even split */
    const struct gp_device_ops *ops; /* every stage's */
    int device[8];         /* each stage's device index */
    bool adamw;            /* AdamW (defaults, lr 2e-3); else SGD, momentum 0.9, weight decay 1e-3 */
    bool deferred_bn, graph;
    enum gp_precision precision; /* default (0): fp32 */
    const struct gp_pipe_remote *remote; /* NULL: every stage here */
    enum gp_pipe_schedule_kind schedule; /* default (0): GPipe */
};

struct pipe_bench {
    struct pipe_bench_setup su;
    struct gp_graph g;
    struct gp_dataset ds;
    struct gp_pipeline *p;
    size_t x_row, y_row;
    enum gp_loss_kind loss; /* cross-entropy for class labels, MSE for float targets */
};

/* Fails the test (cmocka) on any error. */
void pipe_bench_open(const struct pipe_bench_setup *su, struct pipe_bench *b);
void pipe_bench_close(struct pipe_bench *b);

/* Step s's batch and targets, and the loss's denominator for them. */
const void *pipe_bench_x(const struct pipe_bench *b, int s);
const void *pipe_bench_y(const struct pipe_bench *b, int s);
double pipe_bench_denominator(const struct pipe_bench *b, const void *y);

/* Every float parameter and buffer and every optimizer slot of every
 * parameter, in value order (malloc'd; *count floats). */
float *pipe_bench_keep(struct pipe_bench *b, size_t *count);

#endif
