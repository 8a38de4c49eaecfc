/* The next step's inputs uploaded during the step (gp_step_opts.next_inputs,
 * on by default, GP_INPUTS_AHEAD=0 turns it off; pipeline/inputs_ahead.c), on CPU devices, whose
 * streams run it as a GPU's do (a stream of its own, events between it and
 * the first stage's compute stream): training takes every step's inputs
 * but the first from the upload and gives the bits of training without it
 * (losses, parameters, buffers, optimizer state), in one stage and in a
 * pipeline of two with micro-batches; a step given other inputs than the
 * ones uploaded copies its own (none taken ahead, the same bits); without
 * the setting nothing is uploaded. In bf16, where the first stage keeps
 * float32 data in bfloat16 boxes, the rows cross as bfloat16, rounded on
 * the host (half the first stage's buffer), with the bits of float32 rows
 * (GP_INPUTS_AHEAD_BF16=0) and of no upload. */
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
    bool bf16_rows;        /* the upload crossed as bfloat16 */
    int64_t ahead_bytes;   /* the first stage's buffer for it */
};

/* GP_INPUTS_AHEAD: `setting`; GP_INPUTS_AHEAD_BF16: `bf16_rows`. */
static void run(const char *fixture, enum gp_precision pr, int stages, int chunks, enum next_kind next, bool setting,
                bool bf16_rows, struct result *r)
{
    struct pipe_bench_setup bs = {.fixture = fixture, .batch = 8, .batches = STEPS + 1, .stages = stages,
                                  .chunks = chunks, .ops = &gp_cpu_device_ops, .precision = pr};
    for (int k = 0; k < stages; k++) bs.device[k] = k;
    struct pipe_bench b;
    /* Read as the pipeline is made; "0" said outright, so that the runs
     * without stay so whatever the default becomes. */
    setenv("GP_INPUTS_AHEAD", setting ? "1" : "0", 1);
    setenv("GP_INPUTS_AHEAD_BF16", bf16_rows ? "1" : "0", 1);
    pipe_bench_open(&bs, &b);
    unsetenv("GP_INPUTS_AHEAD");
    unsetenv("GP_INPUTS_AHEAD_BF16");
    memset(r, 0, sizeof *r);
    struct gp_stage_report rep;
    gp_pipeline_report(b.p, 0, &rep);
    r->bf16_rows = rep.inputs_ahead_bf16;
    r->ahead_bytes = rep.inputs_ahead_bytes;
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

/* bf16_rows: whether bf16 uploads ahead must cross as bfloat16. */
static void check(const char *fixture, enum gp_precision pr, int stages, int chunks, bool bf16_rows)
{
    struct result plain, ahead, wrong, off, wide;
    run(fixture, pr, stages, chunks, NEXT_NONE, true, true, &plain);
    run(fixture, pr, stages, chunks, NEXT_RIGHT, true, true, &ahead);
    run(fixture, pr, stages, chunks, NEXT_WRONG, true, true, &wrong);
    run(fixture, pr, stages, chunks, NEXT_RIGHT, false, true, &off);
    run(fixture, pr, stages, chunks, NEXT_RIGHT, true, false, &wide);
    char what[200];
    snprintf(what, sizeof what, "%s %s, %d stage%s x %d micro-batches", fixture, gp_precision_name(pr), stages,
             stages > 1 ? "s" : "", chunks);
    assert_int_equal(plain.taken, 0);
    if (ahead.taken != STEPS - 1) fail_msg("%s: %lld steps took their inputs ahead, %d expected", what,
                                           (long long)ahead.taken, STEPS - 1);
    assert_int_equal(wrong.taken, 0);
    assert_int_equal(off.taken, 0);
    assert_int_equal(wide.taken, STEPS - 1);
    if (ahead.bf16_rows != bf16_rows)
        fail_msg("%s: the upload crossed as %s", what, ahead.bf16_rows ? "bfloat16" : "the data's type");
    assert_false(wide.bf16_rows);
    assert_false(off.bf16_rows);
    assert_int_equal(off.ahead_bytes, 0);
    assert_int_equal(ahead.ahead_bytes, bf16_rows ? wide.ahead_bytes / 2 : wide.ahead_bytes);
    same_bits(what, &plain, &ahead);
    same_bits(what, &plain, &wrong);
    same_bits(what, &plain, &off);
    same_bits(what, &plain, &wide);
    printf("%s: %lld of %d steps' inputs uploaded ahead%s (%lld bytes), the same bits\n", what,
           (long long)ahead.taken, STEPS, ahead.bf16_rows ? " as bfloat16" : "", (long long)ahead.ahead_bytes);
    free(plain.kept), free(ahead.kept), free(wrong.kept), free(off.kept), free(wide.kept);
}

static void test_same_bits(void **state)
{
    (void)state;
    check("digits_cnn_op17", GP_PRECISION_FP32, 1, 1, false);
    check("resnet_op17", GP_PRECISION_FP32, 2, 4, false);
    check("mlp_op17", GP_PRECISION_FP32, 3, 2, false);
}

/* bf16: float32 images into a bfloat16 first convolution cross as
 * bfloat16; a GPT's token ids as they are. */
static void test_bf16_rows(void **state)
{
    (void)state;
    check("digits_cnn_op17", GP_PRECISION_BF16, 1, 1, true);
    check("resnet_op17", GP_PRECISION_BF16, 2, 4, true);
    check("gpt_op17", GP_PRECISION_BF16, 1, 2, false);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_same_bits), cmocka_unit_test(test_bf16_rows)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
