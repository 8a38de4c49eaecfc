/* The first stage's float32 inputs inside its arena-and-gradients block
 * (pipeline/stage.c, inputs_in_block; GP_INPUTS_IN_BLOCK=0 keeps them in a
 * block of their own). In bf16 the step's first forward converts every
 * micro-batch's rows into its bfloat16 box, so the rows are dead before the
 * arena or the gradient set are written, and the stage allocates their
 * bytes less; training gives the bits of training with them apart (losses,
 * parameters, buffers, optimizer state), recomputing from the boxes
 * (checkpoint except_last, which under GPipe with several micro-batches
 * recomputes each), on one stage or two, with an evaluation between steps.
 * Where a box serves several micro-batches (1F1B over two stages), or the
 * stage keeps float32 (fp32), they stay apart. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pipeline_bench.h"

#define STEPS 3

struct result {
    double loss[STEPS];
    float *kept;
    size_t n;
    int64_t allocated; /* stage 0's, as reported (what it allocates) */
    float eval[64];
};

static void run(const struct pipe_bench_setup *su, bool inside, struct result *r)
{
    setenv("GP_INPUTS_IN_BLOCK", inside ? "1" : "0", 1);
    struct pipe_bench b;
    pipe_bench_open(su, &b);
    unsetenv("GP_INPUTS_IN_BLOCK");
    memset(r, 0, sizeof *r);
    for (int s = 0; s < STEPS; s++) {
        struct gp_error err = {0};
        const void *x = pipe_bench_x(&b, s), *y = pipe_bench_y(&b, s);
        struct gp_step_opts so = {.seed = 3, .step = (uint64_t)s, .dropout_ratio = -1};
        struct gp_step_outcome out = {0};
        if (gp_pipeline_train_step(b.p, x, y, &so, pipe_bench_denominator(&b, y), 0.05, 0, &out, &err) != GP_OK)
            fail_msg("%s, step %d: %s", su->fixture, s + 1, err.msg);
        r->loss[s] = out.loss_sum;
        /* Evaluation loads one micro-batch's rows the same way. */
        if (s == 0 && gp_pipeline_eval(b.p, x, false, r->eval, &err) != GP_OK) fail_msg("%s", err.msg);
    }
    struct gp_stage_report rep;
    gp_pipeline_report(b.p, 0, &rep);
    r->allocated = rep.planned_bytes;
    r->kept = pipe_bench_keep(&b, &r->n);
    pipe_bench_close(&b);
}

/* Trains su with the inputs inside and apart: the same bits; stage 0
 * allocates `less` bytes fewer inside. */
static void check(const struct pipe_bench_setup *su, const char *what, int64_t less)
{
    struct result in, apart;
    run(su, true, &in);
    run(su, false, &apart);
    for (int s = 0; s < STEPS; s++)
        if (memcmp(&in.loss[s], &apart.loss[s], sizeof(double)))
            fail_msg("%s: step %d loss %.17g with the inputs in the block, %.17g apart", what, s + 1, in.loss[s],
                     apart.loss[s]);
    if (memcmp(in.eval, apart.eval, sizeof in.eval)) fail_msg("%s: evaluation differs", what);
    assert_int_equal(in.n, apart.n);
    for (size_t e = 0; e < in.n; e++)
        if (memcmp(&in.kept[e], &apart.kept[e], sizeof(float)))
            fail_msg("%s: kept float %zu %.9g with the inputs in the block, %.9g apart", what, e,
                     (double)in.kept[e], (double)apart.kept[e]);
    if (apart.allocated - in.allocated != less)
        fail_msg("%s: stage 0 allocates %lld bytes with the inputs in the block, %lld apart (%lld less expected)",
                 what, (long long)in.allocated, (long long)apart.allocated, (long long)less);
    printf("%s: the same bits, %lld bytes less\n", what, (long long)less);
    free(in.kept);
    free(apart.kept);
}

/* A mini-batch's float32 rows of the fixture, as stage 0 allocates them. */
static int64_t input_block(const struct pipe_bench_setup *su)
{
    struct pipe_bench b;
    pipe_bench_open(su, &b);
    int64_t bytes = (int64_t)(b.x_row * (size_t)su->batch);
    pipe_bench_close(&b);
    return (bytes + 63) / 64 * 64;
}

static void test_inputs_in_block(void **state)
{
    (void)state;
    struct pipe_bench_setup su = {.fixture = "resnet_op17", .batch = 16, .batches = STEPS, .stages = 1, .chunks = 4,
                                  .ops = &gp_cpu_device_ops, .precision = GP_PRECISION_BF16};
    int64_t rows = input_block(&su);
    check(&su, "ResNet fixture, bf16, 1 stage x 4 micro-batches (GPipe)", rows);
    su.stages = 2;
    su.device[1] = 1;
    su.deferred_bn = true;
    check(&su, "ResNet fixture, bf16, 2 stages x 4 micro-batches (GPipe), deferred BatchNorm", rows);
    su.fixture = "digits_cnn_op17";
    su.deferred_bn = false;
    su.adamw = true;
    check(&su, "digits CNN, bf16, 2 stages x 4 micro-batches (GPipe), AdamW", input_block(&su));
    /* 1F1B over two stages: stage 0 holds two boxes for four micro-batches. */
    su.schedule = GP_PIPE_1F1B;
    check(&su, "digits CNN, bf16, 2 stages x 4 micro-batches (1F1B): apart", 0);
    /* fp32: the rows are the boxes' own type; nothing to convert. */
    su.schedule = GP_PIPE_GPIPE;
    su.precision = GP_PRECISION_FP32;
    check(&su, "digits CNN, fp32: apart", 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_inputs_in_block),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
