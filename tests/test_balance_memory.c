/* The balancer's first stage against the executor's: what the balancer
 * counts for the data the first stage holds (its boxes of the input
 * frontier, the mini-batch's rows, the next step's rows uploaded ahead)
 * is what the first stage allocates for them (gp_stage_report), in fp32
 * and in bf16 (where the rows may lie in the arena's block), on fixtures
 * of images, and of token ids (int64 rows). One stage, so the balancer's
 * split is the executor's whatever the costs. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fixtures.h"
#include "graph/layers.h"
#include "onnx/load.h"
#include "partitioner/balance.h"
#include "pipeline_bench.h"

#define CHUNKS 4

/* The balancer's memory figure of the one stage, with or without the data. */
static int64_t stage_figure(const struct gp_profile *prof, int64_t batch, bool data)
{
    struct gp_profile p = *prof;
    if (!data) p.input_bytes = p.input_frontier_bytes = 0;
    struct gp_balance_config bc = {.by = GP_BALANCE_MEMORY, .n_stages = 1, .batch = batch, .n_micro = CHUNKS,
                                   .checkpoint = GP_CHECKPOINT_EXCEPT_LAST, .optim_state_floats = 1,
                                   .inputs_ahead = data && gp_pipeline_inputs_ahead_on(false)};
    struct gp_balance_report rep;
    struct gp_error err = {0};
    if (gp_balance(&p, &bc, &rep, &err) != GP_OK) fail_msg("%s", err.msg);
    return rep.optimal.stages[0].memory_bytes;
}

static void compare(const char *fixture, int64_t batch, enum gp_precision pr)
{
    char model[4096], name[256];
    snprintf(name, sizeof name, "%s.onnx", fixture);
    fixture_path(name, model, sizeof model);
    struct gp_graph g;
    struct gp_layers l;
    struct gp_error err = {0};
    if (gp_onnx_load(model, batch / CHUNKS, &g, &err) != GP_OK) fail_msg("%s", err.msg);
    if (gp_layers_build(&g, &l, &err) != GP_OK) fail_msg("%s", err.msg);
    struct gp_profile prof;
    if (gp_profile_cpu(&g, model, 1, 0, 1, NULL, NULL, &prof, &err) != GP_OK) fail_msg("%s", err.msg);
    gp_profile_fill_bytes(&g, &l, gp_cpu_compute_ops.saved_bytes, pr, &prof);
    int64_t counted = stage_figure(&prof, batch, true) - stage_figure(&prof, batch, false);

    struct pipe_bench_setup su = {.fixture = fixture, .batch = batch, .batches = 1, .stages = 1, .chunks = CHUNKS,
                                  .ops = &gp_cpu_device_ops, .precision = pr};
    struct pipe_bench b;
    pipe_bench_open(&su, &b);
    struct gp_stage_report r;
    gp_pipeline_report(b.p, 0, &r);
    int64_t rows = (int64_t)(b.x_row * (size_t)batch);
    pipe_bench_close(&b);
    int64_t held = r.box_bytes * r.frontier_boxes + r.input_rows_bytes + r.inputs_ahead_bytes;
    printf("%-16s %s: the balancer counts %lld bytes of data, the stage holds %lld (boxes %lld x %d, rows %lld of "
           "%lld%s, ahead %lld)\n",
           fixture, gp_precision_name(pr), (long long)counted, (long long)held, (long long)r.box_bytes,
           r.frontier_boxes, (long long)r.input_rows_bytes, (long long)rows,
           r.input_rows_bytes ? "" : " in the arena's block", (long long)r.inputs_ahead_bytes);
    /* The next step's rows cross in the boxes' type where that is
     * narrower (bf16 boxes of float32 data: inputs_ahead.c). */
    bool on = gp_pipeline_inputs_ahead_on(false), narrower = r.box_bytes * CHUNKS < rows;
    assert_int_equal(r.inputs_ahead_bf16, on && narrower);
    assert_int_equal(r.inputs_ahead_bytes, on ? (narrower ? rows / 2 : rows) : 0);
    /* The executor rounds each box up to whole 64-byte regions. Rows in
     * the arena's block cost what they exceed it by: the balancer knows the
     * block as the stage's largest layer's peak, which the block is at
     * least (test_balance's memory model), so it may count up to the rows
     * more. */
    int64_t over = r.input_rows_bytes == 0 && pr == GP_PRECISION_BF16 ? rows : 0;
    if (counted > held + over || held > counted + 64 * r.frontier_boxes)
        fail_msg("%s, %s: the balancer counts %lld bytes for the first stage's data, the stage allocates %lld",
                 fixture, gp_precision_name(pr), (long long)counted, (long long)held);
    gp_profile_free(&prof);
    gp_layers_free(&l);
    gp_graph_free(&g);
}

static void test_first_stage_data(void **state)
{
    (void)state;
    static const char *const fixtures[] = {"resnet_op17", "unet_op17", "digits_cnn_op17", "mlp_op17", "gpt_op17"};
    for (size_t f = 0; f < sizeof fixtures / sizeof *fixtures; f++) {
        compare(fixtures[f], 16, GP_PRECISION_FP32);
        compare(fixtures[f], 16, GP_PRECISION_BF16);
    }
}

/* Without uploads ahead (GP_INPUTS_AHEAD=0) neither counts the next
 * step's rows. */
static void test_without_ahead(void **state)
{
    (void)state;
    setenv("GP_INPUTS_AHEAD", "0", 1);
    compare("resnet_op17", 16, GP_PRECISION_FP32);
    compare("resnet_op17", 16, GP_PRECISION_BF16);
    unsetenv("GP_INPUTS_AHEAD");
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_first_stage_data), cmocka_unit_test(test_without_ahead)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
