/* The next step's inputs uploaded during the step (gp_step_opts.next_inputs,
 * on by default, GP_INPUTS_AHEAD=0 turns it off; pipeline/inputs_ahead.c), on CPU devices, whose
 * streams run it as a GPU's do (a stream of its own, events between it and
 * the first stage's compute stream): training takes every step's inputs
 * but the first from the upload and gives the bits of training without it
 * (losses, parameters, buffers, optimizer state), in one stage and in a
 * pipeline of two with micro-batches; a step given other inputs than the
 * ones uploaded copies its own (none taken ahead, the same bits); without
 * the setting nothing is uploaded. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/device.h"
#include "pipeline_bench.h"

#define STEPS 4

enum next_kind {
    NEXT_NONE,  /* no next inputs given */
    NEXT_RIGHT, /* the next step's */
    NEXT_WRONG, /* another batch's: the next step copies its own */
};

struct result {
    double loss[STEPS];
    float *kept;
    size_t n;
    int64_t taken;
};

static void run(const char *fixture, int stages, int chunks, enum next_kind next, bool setting, struct result *r)
{
    struct pipe_bench_setup bs = {.fixture = fixture, .batch = 8, .batches = STEPS + 1, .stages = stages,
                                  .chunks = chunks, .ops = &gp_cpu_device_ops};
    for (int k = 0; k < stages; k++) bs.device[k] = k;
    struct pipe_bench b;
    /* Read as the pipeline is made; "0" said outright, so that the runs
     * without stay so whatever the default becomes. */
    setenv("GP_INPUTS_AHEAD", setting ? "1" : "0", 1);
    pipe_bench_open(&bs, &b);
    unsetenv("GP_INPUTS_AHEAD");
    memset(r, 0, sizeof *r);
    for (int s = 0; s < STEPS; s++) {
        struct gp_error err = {0};
        const void *x = pipe_bench_x(&b, s), *y = pipe_bench_y(&b, s);
        struct gp_step_opts so = {.seed = 3, .step = (uint64_t)s, .dropout_ratio = -1};
        if (next == NEXT_RIGHT && s + 1 < STEPS) so.next_inputs = pipe_bench_x(&b, s + 1);
        if (next == NEXT_WRONG && s + 1 < STEPS) so.next_inputs = pipe_bench_x(&b, s + 2);
        struct gp_step_outcome out;
        memset(&out, 0, sizeof out);
        if (gp_pipeline_train_step(b.p, x, y, &so, pipe_bench_denominator(&b, y), 0.05, 0, &out, &err) != GP_OK)
            fail_msg("%s, step %d: %s", fixture, s + 1, err.msg);
        r->loss[s] = out.loss_sum;
    }
    r->taken = gp_pipeline_inputs_taken_ahead(b.p);
    r->kept = pipe_bench_keep(&b, &r->n);
    pipe_bench_close(&b);
}

static void same_bits(const char *what, const struct result *a, const struct result *b)
{
    for (int s = 0; s < STEPS; s++)
        if (memcmp(&a->loss[s], &b->loss[s], sizeof(double)))
            fail_msg("%s: step %d loss %.17g, %.17g without", what, s + 1, b->loss[s], a->loss[s]);
    assert_int_equal(a->n, b->n);
    if (memcmp(a->kept, b->kept, sizeof(float) * a->n)) fail_msg("%s: the parameters or state differ", what);
}

static void check(const char *fixture, int stages, int chunks)
{
    struct result plain, ahead, wrong, off;
    run(fixture, stages, chunks, NEXT_NONE, true, &plain);
    run(fixture, stages, chunks, NEXT_RIGHT, true, &ahead);
    run(fixture, stages, chunks, NEXT_WRONG, true, &wrong);
    run(fixture, stages, chunks, NEXT_RIGHT, false, &off);
    char what[200];
    snprintf(what, sizeof what, "%s, %d stage%s x %d micro-batches", fixture, stages, stages > 1 ? "s" : "", chunks);
    assert_int_equal(plain.taken, 0);
    if (ahead.taken != STEPS - 1) fail_msg("%s: %lld steps took their inputs ahead, %d expected", what,
                                           (long long)ahead.taken, STEPS - 1);
    assert_int_equal(wrong.taken, 0);
    assert_int_equal(off.taken, 0);
    same_bits(what, &plain, &ahead);
    same_bits(what, &plain, &wrong);
    same_bits(what, &plain, &off);
    printf("%s: %lld of %d steps' inputs uploaded ahead, the same bits\n", what, (long long)ahead.taken, STEPS);
    free(plain.kept), free(ahead.kept), free(wrong.kept), free(off.kept);
}

static void test_same_bits(void **state)
{
    (void)state;
    check("digits_cnn_op17", 1, 1);
    check("resnet_op17", 2, 4);
    check("mlp_op17", 3, 2);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_same_bits)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
