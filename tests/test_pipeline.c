/* The pipeline gives the result of one device whatever the stages,
 * micro-batches and checkpoint mode; checkpointing trades memory as
 * expected; stages really run at the same time; 1F1B gives GPipe's result
 * bit for bit in the memory its bound says; BatchNorm outputs remade in the
 * backward give the kept ones' bits in less memory. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fixtures.h"
#include "onnx/load.h"
#include "train/trainer.h"
#include "util/json_parse.h"

#define STEPS 3

static char tmp[256];

struct run_result {
    double loss[STEPS];
    double val_loss; /* when run with `validate` */
    struct gp_graph saved;
    int64_t peak[8], planned[8];
    struct gp_stage_memory_report memory[8];
    int stages;
};

static void on_step(void *user, const struct gp_step_report *r) { ((struct run_result *)user)->loss[r->step] = r->loss; }

static void on_epoch(void *user, const struct gp_epoch_report *r) { ((struct run_result *)user)->val_loss = r->val_loss; }

static void on_memory(void *user, const struct gp_stage_memory_report *m)
{
    struct run_result *res = user;
    res->peak[m->stage] = m->activation_peak;
    res->planned[m->stage] = m->activation_bytes;
    res->memory[m->stage] = *m;
    res->stages = m->stage + 1;
}

/* Trains `fixture` STEPS steps on synthetic data (the same for every call)
 * with K stages (an even split) and M micro-batches. */
static double lr = 0.05;
static bool deferred_bn = false;
static enum gp_precision precision = GP_PRECISION_FP32;
static enum gp_pipe_schedule_kind schedule = GP_PIPE_GPIPE;
static int64_t steps = STEPS;
static double clip_norm = 0, weight_decay = 0;
static bool validate = false; /* evaluate the training data after the epoch */
static bool remake_norm = false; /* BatchNorm outputs remade in the backward */

static void run(const char *fixture, int64_t batch, int K, int M, enum gp_checkpoint mode,
                const char *trace, struct run_result *res)
{
    char model[4096], name[256], saved[512];
    snprintf(name, sizeof name, "%s.onnx", fixture);
    fixture_path(name, model, sizeof model);
    struct gp_error err = {0};
    struct gp_dataset ds;
    if (gp_dataset_synthetic(model, batch * steps, 7, &ds, &err) != GP_OK) fail_msg("%s", err.msg);
    struct gp_train_config cfg;
    gp_train_config_defaults(&cfg);
    cfg.model_path = model;
    cfg.batch = batch;
    cfg.chunks = M;
    cfg.steps = steps;
    cfg.shuffle = false;
    cfg.lr = lr;
    cfg.deferred_batch_norm = deferred_bn;
    cfg.precision = precision;
    cfg.momentum = 0.9;
    cfg.clip_norm = clip_norm;
    cfg.weight_decay = weight_decay;
    cfg.n_stages = K;
    for (int k = 0; k < K; k++) cfg.stage_device[k] = k;
    cfg.checkpoint = mode;
    cfg.pipeline_schedule = schedule;
    cfg.trace_path = trace;
    cfg.remake_norm = remake_norm ? GP_REMAKE_ALWAYS : GP_REMAKE_NEVER;
    const char *base = strrchr(fixture, '/') ? strrchr(fixture, '/') + 1 : fixture;
    snprintf(saved, sizeof saved, "%s/%s_%d_%d_%d_%s_%s.onnx", tmp, base, K, M, (int)mode,
             gp_precision_name(precision), gp_pipe_schedule_name(schedule));
    cfg.save_path = saved;
    struct gp_train_callbacks cb = {.user = res, .on_step = on_step, .on_epoch = on_epoch, .on_memory = on_memory};
    if (gp_train(&cfg, &ds, validate ? &ds : NULL, &cb, &err) != GP_OK)
        fail_msg("%s K=%d M=%d %s %s: %s", fixture, K, M, gp_pipe_schedule_name(schedule), gp_checkpoint_name(mode),
                 err.msg);
    gp_dataset_free(&ds);
    if (gp_onnx_load(saved, 1, &res->saved, &err) != GP_OK) fail_msg("%s", err.msg);
}

/* Losses within relative 1e-4 and every parameter and buffer within
 * 1e-4 max(1, |w|): float32 rounding from summing gradients in another
 * order, nothing more. */
static void assert_same(const char *what, const struct run_result *a, const struct run_result *b)
{
    for (int s = 0; s < STEPS; s++)
        if (fabs(a->loss[s] - b->loss[s]) > 1e-4 * fabs(b->loss[s]))
            fail_msg("%s: step %d loss %.9g, one device %.9g", what, s + 1, a->loss[s], b->loss[s]);
    for (int v = 0; v < b->saved.n_values; v++) {
        const struct gp_value *w = &b->saved.values[v];
        if (!w->is_initializer || !gp_dtype_is_float(w->dtype)) continue;
        const struct gp_tensor *x = a->saved.values[gp_graph_find_value(&a->saved, w->name)].constant;
        for (int64_t i = 0; i < gp_shape_numel(&w->shape); i++) {
            double p = gp_tensor_get_f64(x, i), q = gp_tensor_get_f64(w->constant, i);
            if (fabs(p - q) > 1e-4 * fmax(1, fabs(q)))
                fail_msg("%s: '%s'[%lld] is %.9g, one device %.9g", what, w->name, (long long)i, p, q);
        }
    }
}

static void check_invariance(const char *fixture, int64_t batch, const int *Ms, int nM, bool batchnorm)
{
    static const enum gp_checkpoint modes[3] = {GP_CHECKPOINT_NEVER, GP_CHECKPOINT_EXCEPT_LAST,
                                                GP_CHECKPOINT_ALWAYS};
    struct run_result one;
    memset(&one, 0, sizeof one);
    run(fixture, batch, 1, 1, GP_CHECKPOINT_EXCEPT_LAST, NULL, &one);
    int runs = 0;
    for (int mi = 0; mi < nM; mi++) {
        int M = Ms[mi];
        /* BatchNorm normalizes each micro-batch by its own statistics: the
         * reference for M micro-batches is one stage with M micro-batches. */
        struct run_result ref;
        memset(&ref, 0, sizeof ref);
        if (batchnorm) run(fixture, batch, 1, M, GP_CHECKPOINT_NEVER, NULL, &ref);
        for (int K = 1; K <= 4; K++)
            for (int c = 0; c < 3; c++) {
                struct run_result r;
                memset(&r, 0, sizeof r);
                run(fixture, batch, K, M, modes[c], NULL, &r);
                char what[160];
                snprintf(what, sizeof what, "%s, %d stages x %d micro-batches, checkpoint %s", fixture,
                         K, M, gp_checkpoint_name(modes[c]));
                assert_same(what, &r, batchnorm ? &ref : &one);
                gp_graph_free(&r.saved);
                runs++;
            }
        if (batchnorm) gp_graph_free(&ref.saved);
    }
    printf("%s: %d pipeline runs match %s\n", fixture, runs,
           batchnorm ? "one stage with the same micro-batches" : "one device, one batch");
    gp_graph_free(&one.saved);
}

static void test_mlp(void **state)
{
    (void)state;
    const int Ms[] = {1, 2, 3, 4, 6, 8};
    check_invariance("mlp_op17", 24, Ms, 6, false);
}

/* Dropout stays on (ratio 0.1): masks are keyed by global element index,
 * so every split draws the same ones. */
/* Under the sanitizers (several times slower, 6 of CI's minutes in these
 * two tests): fewer micro-batch counts, still one, an odd one and more than
 * the stages, which are the cases that take different paths. */
static bool sanitized(void)
{
    const char *san = getenv("GP_SANITIZED");
    return san && !strcmp(san, "1");
}

static void test_gpt(void **state)
{
    (void)state;
    const int Ms[] = {1, 2, 3, 4, 6, 8}, few[] = {1, 3, 8};
    if (sanitized()) check_invariance("gpt_op17", 24, few, 3, false);
    else check_invariance("gpt_op17", 24, Ms, 6, false);
}

static void test_batchnorm_models(void **state)
{
    (void)state;
    const int Ms[] = {2, 4, 8}, few[] = {2, 8};
    const char *const models[] = {"digits_cnn_op17", "resnet_op17", "unet_op17"};
    for (int m = 0; m < 3; m++) check_invariance(models[m], 16, sanitized() ? few : Ms, sanitized() ? 2 : 3, true);
}

/* Bit for bit: the same losses and every weight identical to b's (`ref`
 * names it). */
static void assert_identical(const char *what, const struct run_result *a, const struct run_result *b, const char *ref)
{
    for (int s = 0; s < steps; s++)
        if (a->loss[s] != b->loss[s])
            fail_msg("%s: step %d loss %.9g, %s %.9g", what, s + 1, a->loss[s], ref, b->loss[s]);
    for (int v = 0; v < b->saved.n_values; v++) {
        const struct gp_value *w = &b->saved.values[v];
        if (!w->is_initializer || !gp_dtype_is_float(w->dtype)) continue;
        const struct gp_tensor *x = a->saved.values[gp_graph_find_value(&a->saved, w->name)].constant;
        if (x->nbytes != w->constant->nbytes || memcmp(x->data, w->constant->data, x->nbytes) != 0)
            fail_msg("%s: '%s' differs from %s's", what, w->name, ref);
    }
}

/* bf16: stages and checkpoint modes change nothing, bit for bit (the same
 * kernels on the same micro-batches in the same order: frontiers travel
 * in bfloat16 exactly as they are stored); the same holds for fp32. Micro-
 * batches change the order parameter gradients are summed in, in either
 * precision, so each M is compared with one stage at that M. */
static void test_bf16_invariance(void **state)
{
    (void)state;
    static const enum gp_checkpoint modes[3] = {GP_CHECKPOINT_NEVER, GP_CHECKPOINT_EXCEPT_LAST,
                                                GP_CHECKPOINT_ALWAYS};
    static const char *const fixtures[] = {"gpt_op17", "resnet_op17", "unet_op17"};
    /* Under the sanitizers (20x slower) one fixture: the others add no code path. */
    const char *san = getenv("GP_SANITIZED");
    size_t n_fixtures = san && !strcmp(san, "1") ? 1 : sizeof fixtures / sizeof *fixtures;
    precision = GP_PRECISION_BF16;
    int runs = 0;
    for (size_t f = 0; f < n_fixtures; f++) {
        const int Ms[] = {4};
        for (int mi = 0; mi < 1; mi++) {
            struct run_result ref;
            memset(&ref, 0, sizeof ref);
            run(fixtures[f], 16, 1, Ms[mi], GP_CHECKPOINT_NEVER, NULL, &ref);
            for (int K = 1; K <= 3; K++)
                for (int c = 0; c < 3; c++) {
                    if (K == 1 && c == 0) continue;
                    struct run_result r;
                    memset(&r, 0, sizeof r);
                    run(fixtures[f], 16, K, Ms[mi], modes[c], NULL, &r);
                    char what[160];
                    snprintf(what, sizeof what, "bf16 %s, %d stages x %d micro-batches, checkpoint %s",
                             fixtures[f], K, Ms[mi], gp_checkpoint_name(modes[c]));
                    assert_identical(what, &r, &ref, "one stage");
                    gp_graph_free(&r.saved);
                    runs++;
                }
            gp_graph_free(&ref.saved);
        }
    }
    precision = GP_PRECISION_FP32;
    printf("bf16: %d pipeline runs identical to one stage, bit for bit\n", runs);
}

/* bf16 halves what activations take: the planned activation memory
 * (frontier boxes, activation sets, arena, gradients, inboxes) of a bf16
 * run is at most 55% of the fp32 run's, stage by stage. */
static void test_bf16_memory(void **state)
{
    (void)state;
    static const char *const fixtures[] = {"gpt_op17", "resnet_op17", "unet_op17"};
    for (size_t f = 0; f < sizeof fixtures / sizeof *fixtures; f++) {
        struct run_result r[2];
        for (int b = 0; b < 2; b++) {
            memset(&r[b], 0, sizeof r[b]);
            precision = b ? GP_PRECISION_BF16 : GP_PRECISION_FP32;
            run(fixtures[f], 16, 2, 4, GP_CHECKPOINT_NEVER, NULL, &r[b]);
        }
        precision = GP_PRECISION_FP32;
        for (int k = 0; k < r[0].stages; k++) {
            printf("%s stage %d activations: fp32 %lld (peak %lld), bf16 %lld (peak %lld) bytes: %.1f%%\n",
                   fixtures[f], k, (long long)r[0].planned[k], (long long)r[0].peak[k], (long long)r[1].planned[k],
                   (long long)r[1].peak[k], 100.0 * (double)r[1].planned[k] / (double)r[0].planned[k]);
            assert_true((double)r[1].planned[k] <= 0.55 * (double)r[0].planned[k]);
            assert_true((double)r[1].peak[k] <= 0.55 * (double)r[0].peak[k]);
        }
        for (int b = 0; b < 2; b++) gp_graph_free(&r[b].saved);
    }
}

/* Validation in bf16: the last stage's bfloat16 output comes back to the
 * host as it is and is widened there, in place (gp_pipeline_eval). The
 * loss over it is fp32's within bfloat16's rounding, and the same, bit
 * for bit, whether the output's stage is the only one or the second. */
static void test_bf16_validation(void **state)
{
    (void)state;
    static const char *const fixtures[] = {"gpt_op17", "mlp_op17"};
    validate = true;
    for (size_t f = 0; f < sizeof fixtures / sizeof *fixtures; f++) {
        struct run_result r[3];
        for (int b = 0; b < 3; b++) {
            memset(&r[b], 0, sizeof r[b]);
            precision = b ? GP_PRECISION_BF16 : GP_PRECISION_FP32;
            run(fixtures[f], 16, b == 2 ? 2 : 1, 2, GP_CHECKPOINT_NEVER, NULL, &r[b]);
        }
        printf("%s validation loss: fp32 %.6f, bf16 %.6f (1 stage), %.6f (2 stages)\n", fixtures[f], r[0].val_loss,
               r[1].val_loss, r[2].val_loss);
        assert_true(isfinite(r[1].val_loss) && r[1].val_loss > 0);
        assert_true(fabs(r[1].val_loss - r[0].val_loss) <= 0.02 * fabs(r[0].val_loss));
        assert_true(r[1].val_loss == r[2].val_loss);
        for (int b = 0; b < 3; b++) gp_graph_free(&r[b].saved);
    }
    validate = false;
    precision = GP_PRECISION_FP32;
}

/* Peak activation memory by the executor's accounting: keeping every
 * micro-batch costs more than recomputing. (except_last keeps only a
 * micro-batch whose backward comes right after its forward, so its peak
 * equals always's: one activation set in use at a time. Under GPipe, whose
 * backward runs in micro-batch order, that is none of 8.) */
static void test_checkpoint_memory(void **state)
{
    (void)state;
    struct run_result r[3];
    static const enum gp_checkpoint modes[3] = {GP_CHECKPOINT_ALWAYS, GP_CHECKPOINT_EXCEPT_LAST,
                                                GP_CHECKPOINT_NEVER};
    for (int c = 0; c < 3; c++) {
        memset(&r[c], 0, sizeof r[c]);
        run("unet_op17", 16, 2, 8, modes[c], NULL, &r[c]);
    }
    for (int k = 0; k < 2; k++) {
        printf("stage %d peak activations: always %lld, except_last %lld, never %lld bytes\n", k,
               (long long)r[0].peak[k], (long long)r[1].peak[k], (long long)r[2].peak[k]);
        assert_true(r[0].peak[k] <= r[1].peak[k]);
        assert_true(r[1].peak[k] < r[2].peak[k]);
        /* never keeps 8 activation sets where the others keep 1. */
        assert_true(r[2].peak[k] > 2 * r[1].peak[k] - r[1].peak[k] / 2);
    }
    for (int c = 0; c < 3; c++) gp_graph_free(&r[c].saved);
}

/* The trace of a 4-stage, 8-micro-batch step: every stage runs 8 forwards
 * and 8 backwards, forwards on stage k start after stage k-1's for the same
 * micro-batch (the fill-drain diagonal), and stages overlap in time. */
static void test_trace_shows_pipelining(void **state)
{
    (void)state;
    char trace[512];
    snprintf(trace, sizeof trace, "%s/unet_trace.json", tmp);
    struct run_result r;
    memset(&r, 0, sizeof r);
    run("unet_op17", 16, 4, 8, GP_CHECKPOINT_EXCEPT_LAST, trace, &r);
    gp_graph_free(&r.saved);
    struct gp_json_doc doc;
    struct gp_error err = {0};
    if (gp_json_parse_file(trace, &doc, &err) != GP_OK) fail_msg("%s", err.msg);
    const struct gp_jvalue *ev = gp_jobject_get(doc.root, "traceEvents");
    assert_non_null(ev);
    double fwd_start[4][8], fwd_end[4][8];
    int forwards[4] = {0}, backwards[4] = {0};
    double busy_lo[4] = {1e300, 1e300, 1e300, 1e300}, busy_hi[4] = {0};
    for (size_t i = 0; i < ev->count; i++) {
        const struct gp_jvalue *e = &ev->items[i];
        if (strcmp(gp_jobject_get(e, "ph")->str, "X") != 0) continue;
        const char *cat = gp_jobject_get(e, "cat")->str;
        const struct gp_jvalue *args = gp_jobject_get(e, "args");
        int k = (int)gp_jobject_get(args, "stage")->i, j = (int)gp_jobject_get(args, "microbatch")->i;
        double ts = gp_jobject_get(e, "ts")->num, dur = gp_jobject_get(e, "dur")->num;
        if (strcmp(cat, "forward") == 0) {
            forwards[k]++;
            fwd_start[k][j] = ts;
            fwd_end[k][j] = ts + dur;
        } else if (strcmp(cat, "backward") == 0) {
            backwards[k]++;
        } else {
            continue;
        }
        if (ts < busy_lo[k]) busy_lo[k] = ts;
        if (ts + dur > busy_hi[k]) busy_hi[k] = ts + dur;
    }
    for (int k = 0; k < 4; k++) {
        assert_int_equal(forwards[k], 8);
        assert_int_equal(backwards[k], 8);
        for (int j = 0; j < 8 && k > 0; j++) assert_true(fwd_start[k][j] >= fwd_end[k - 1][j]);
    }
    /* Stage 0 starts its second micro-batch before the last stage finished
     * its first: the pipeline is full, not one stage at a time; and every
     * pair of neighbouring stages is busy over overlapping windows. Both
     * depend on how the stages' threads were scheduled, which a loaded
     * machine decides: printed, and enforced only with GP_CHECK_TIMINGS=1
     * (on a quiet machine), as the balance test's timings are. */
    bool full = fwd_start[0][1] < fwd_end[3][0], overlap = true;
    for (int k = 1; k < 4; k++) overlap = overlap && busy_lo[k] < busy_hi[k - 1];
    printf("trace: 4 stages x 8 micro-batches, fill-drain order verified; pipeline %s, neighbouring stages %s\n",
           full ? "full" : "NOT full (stage 0's second forward after the last stage's first)",
           overlap ? "overlap" : "do NOT all overlap");
    const char *strict = getenv("GP_CHECK_TIMINGS");
    if (strict && !strcmp(strict, "1")) {
        assert_true(full);
        assert_true(overlap);
    }
    gp_json_doc_free(&doc);
}

/* Tied parameters: the GPT fixture whose head is its token embedding
 * (tests/data/tied_gpt_op17.onnx, models/export_tied.py) split so that the
 * embedding's Gather and the head's Transpose are in different stages,
 * each holding a copy whose gradients are summed before the step, with
 * momentum, weight decay and clipping small enough to clip (the norm
 * counts the parameter once): bit for bit one stage with the same
 * micro-batches. The head reads the embedding through a Transpose run once
 * per step, so one stage adds (every micro-batch's Gather terms) + (the
 * head's), which is the holders' sum in stage order too. */
static void test_tied(void **state)
{
    (void)state;
    const char *fixture = "../tests/data/tied_gpt_op17";
    weight_decay = 0.01;
    const int Ms[] = {1, 3, 3};
    int runs = 0;
    for (int mi = 0; mi < 3; mi++) {
        /* Clipped, and once unclipped: clipped to 0.05 at this learning
         * rate, the updates are too small for a last-bit difference of the
         * gradients to reach the weights (a sum in another order, such as
         * the head's terms interleaved with the embedding's, passed). */
        clip_norm = mi < 2 ? 0.05 : 0;
        struct run_result one;
        memset(&one, 0, sizeof one);
        run(fixture, 12, 1, Ms[mi], GP_CHECKPOINT_EXCEPT_LAST, NULL, &one);
        for (int K = 2; K <= 3; K++) {
            struct run_result r;
            memset(&r, 0, sizeof r);
            run(fixture, 12, K, Ms[mi], K == 2 ? GP_CHECKPOINT_EXCEPT_LAST : GP_CHECKPOINT_ALWAYS, NULL, &r);
            char what[160];
            snprintf(what, sizeof what, "tied GPT, %d stages x %d micro-batches%s", K, Ms[mi],
                     clip_norm > 0 ? "" : ", unclipped");
            assert_identical(what, &r, &one, "one stage");
            gp_graph_free(&r.saved);
            runs++;
        }
        gp_graph_free(&one.saved);
    }
    /* Clipping changed the run: without it the weights differ. */
    clip_norm = 0.05;
    struct run_result clipped, free_;
    memset(&clipped, 0, sizeof clipped);
    memset(&free_, 0, sizeof free_);
    run(fixture, 12, 2, 1, GP_CHECKPOINT_EXCEPT_LAST, NULL, &clipped);
    clip_norm = 0;
    run(fixture, 12, 2, 1, GP_CHECKPOINT_NEVER, NULL, &free_);
    int w = gp_graph_find_value(&free_.saved, "wte.weight");
    assert_true(w >= 0);
    int cw = gp_graph_find_value(&clipped.saved, "wte.weight");
    assert_true(memcmp(free_.saved.values[w].constant->data, clipped.saved.values[cw].constant->data,
                       free_.saved.values[w].constant->nbytes) != 0);
    gp_graph_free(&clipped.saved);
    gp_graph_free(&free_.saved);
    weight_decay = 0;
    printf("tied GPT: %d pipeline runs equal one stage bit for bit (clipped and not, weight decay)\n", runs);
}

static int setup(void **state)
{
    (void)state;
    return temp_dir(tmp, sizeof tmp) ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
    return system(cmd) == 0 ? 0 : -1;
}

/* Deferred BatchNorm: with the weights held still (lr 0), the first
 * BatchNorm's running statistics after 3 steps of K stages x M micro-batches
 * are those of one device training on whole batches (deeper ones see inputs
 * that each micro-batch normalized by itself, so they only come closer);
 * without deferral they are not. */
static void test_deferred_batch_norm(void **state)
{
    (void)state;
    lr = 0;
    struct run_result one, split, plain;
    memset(&one, 0, sizeof one);
    memset(&split, 0, sizeof split);
    memset(&plain, 0, sizeof plain);
    run("resnet_op17", 16, 1, 1, GP_CHECKPOINT_NEVER, NULL, &one);
    deferred_bn = true;
    run("resnet_op17", 16, 3, 4, GP_CHECKPOINT_EXCEPT_LAST, NULL, &split);
    deferred_bn = false;
    run("resnet_op17", 16, 3, 4, GP_CHECKPOINT_EXCEPT_LAST, NULL, &plain);
    lr = 0.05;
    int buffers = 0;
    double plain_gap = 0, deferred_gap = 0, plain_all = 0;
    for (int v = 0; v < one.saved.n_values; v++) {
        const struct gp_value *w = &one.saved.values[v];
        if (!strstr(w->name, "running_")) continue;
        buffers++;
        const struct gp_tensor *a = split.saved.values[gp_graph_find_value(&split.saved, w->name)].constant;
        const struct gp_tensor *b = plain.saved.values[gp_graph_find_value(&plain.saved, w->name)].constant;
        bool first = strncmp(w->name, "stem.1.", 7) == 0;
        for (int64_t i = 0; i < gp_shape_numel(&w->shape); i++) {
            double want = gp_tensor_get_f64(w->constant, i), got = gp_tensor_get_f64(a, i);
            double gap = fabs(gp_tensor_get_f64(b, i) - want) / fmax(1, fabs(want));
            if (first && fabs(got - want) > 1e-6 * fmax(1, fabs(want)))
                fail_msg("deferred '%s'[%lld] is %.9g, one batch %.9g", w->name, (long long)i, got, want);
            if (first) plain_gap = fmax(plain_gap, gap);
            deferred_gap = fmax(deferred_gap, fabs(got - want) / fmax(1, fabs(want)));
            plain_all = fmax(plain_all, gap);
        }
    }
    assert_int_equal(buffers, 16);
    /* Per-micro-batch statistics differ (variance of 4-sample batches), and
     * more than the deferred ones anywhere in the network. */
    assert_true(plain_gap > 1e-3);
    assert_true(deferred_gap < plain_all / 10);
    printf("deferred BatchNorm: first layer matches one batch; deepest gap %.2g against %.2g without "
           "deferral\n", deferred_gap, plain_all);
    gp_graph_free(&one.saved);
    gp_graph_free(&split.saved);
    gp_graph_free(&plain.saved);
}

/* 1F1B trains exactly as GPipe does, bit for bit: both run every stage's
 * backwards in micro-batch order, so the parameter gradients are the same
 * sums in the same order, whatever moves in between. Every fixture the
 * tests above use, 1 to 4 stages, every checkpoint mode, each pair with
 * M = 2 or 5 micro-batches so that every mode meets M < K and M > K;
 * against GPipe with the same stages, micro-batches and mode. Two steps:
 * the second starts from weights (and momentum) the first updated. */
static void test_1f1b_identical(void **state)
{
    (void)state;
    static const char *const fixtures[] = {"mlp_op17", "gpt_op17", "digits_cnn_op17", "resnet_op17", "unet_op17"};
    /* Under the sanitizers (several times slower) the first two: the others add no path of the schedule. */
    const char *san = getenv("GP_SANITIZED");
    size_t n_fixtures = san && !strcmp(san, "1") ? 2 : sizeof fixtures / sizeof *fixtures;
    steps = 2;
    int runs = 0;
    for (size_t f = 0; f < n_fixtures; f++)
        for (int K = 1; K <= 4; K++)
            for (int c = 0; c < 3; c++) {
                enum gp_checkpoint mode = (enum gp_checkpoint)c;
                int M = (K + c) % 2 ? 5 : 2;
                struct run_result ref, r;
                memset(&ref, 0, sizeof ref);
                memset(&r, 0, sizeof r);
                schedule = GP_PIPE_GPIPE;
                run(fixtures[f], 10, K, M, mode, NULL, &ref);
                schedule = GP_PIPE_1F1B;
                run(fixtures[f], 10, K, M, mode, NULL, &r);
                schedule = GP_PIPE_GPIPE;
                char what[160];
                snprintf(what, sizeof what, "1f1b %s, %d stages x %d micro-batches, checkpoint %s", fixtures[f], K, M,
                         gp_checkpoint_name(mode));
                assert_identical(what, &r, &ref, "gpipe");
                gp_graph_free(&r.saved);
                gp_graph_free(&ref.saved);
                runs++;
            }
    steps = STEPS;
    printf("1f1b: %d runs identical to gpipe's, bit for bit\n", runs);
}

/* What 1F1B saves, as planned: on stage k of K it holds min(M, K-k)
 * micro-batches' input frontiers (and activation sets, without
 * checkpointing) where GPipe holds M, and one gradient inbox where GPipe
 * holds two (M on the last stage, whose loss gradients all wait for the
 * backward). Everything else (the arena, the gradient set, the units) is
 * the same plan, so stage k's planned activation bytes are GPipe's less
 * exactly (M - min(M, K-k)) boxes (and sets) and the inboxes' difference;
 * the executor's peak stays within the plan and below GPipe's. */
static void test_1f1b_memory(void **state)
{
    (void)state;
    const int K = 4, M = 8;
    static const enum gp_checkpoint modes[2] = {GP_CHECKPOINT_NEVER, GP_CHECKPOINT_ALWAYS};
    steps = 1;
    for (int c = 0; c < 2; c++) {
        struct run_result r[2];
        for (int q = 0; q < 2; q++) {
            memset(&r[q], 0, sizeof r[q]);
            schedule = q ? GP_PIPE_1F1B : GP_PIPE_GPIPE;
            run("unet_op17", 16, K, M, modes[c], NULL, &r[q]);
        }
        schedule = GP_PIPE_GPIPE;
        bool never = modes[c] == GP_CHECKPOINT_NEVER;
        for (int k = 0; k < K; k++) {
            const struct gp_stage_memory_report *g = &r[0].memory[k], *o = &r[1].memory[k];
            int bound = K - k < M ? K - k : M;
            assert_int_equal(g->frontier_boxes, M);
            assert_int_equal(g->activation_sets, never ? M : 1);
            assert_int_equal(g->gradient_inboxes, k == K - 1 ? M : 2);
            assert_int_equal(o->frontier_boxes, bound);
            assert_int_equal(o->activation_sets, never ? bound : 1);
            assert_int_equal(o->gradient_inboxes, 1);
            assert_true(g->box_bytes == o->box_bytes && g->set_bytes == o->set_bytes && g->inbox_bytes == o->inbox_bytes);
            int64_t saved = (int64_t)(M - bound) * (g->box_bytes + (never ? g->set_bytes : 0)) +
                            (int64_t)(g->gradient_inboxes - 1) * g->inbox_bytes;
            printf("unet, %d stages x %d micro-batches, checkpoint %s, stage %d: activations planned gpipe %lld, "
                   "1f1b %lld bytes (%d of %d micro-batches in flight); peak %lld, %lld\n",
                   K, M, gp_checkpoint_name(modes[c]), k, (long long)g->activation_bytes, (long long)o->activation_bytes,
                   bound, M, (long long)g->activation_peak, (long long)o->activation_peak);
            assert_true(o->activation_bytes == g->activation_bytes - saved);
            assert_true(o->activation_peak <= o->activation_bytes && g->activation_peak <= g->activation_bytes);
            assert_true(o->activation_peak <= g->activation_peak);
            if (bound < M) assert_true(o->activation_peak < g->activation_peak);
        }
        for (int q = 0; q < 2; q++) gp_graph_free(&r[q].saved);
    }
    steps = STEPS;
}

/* Stage 0's gradient set lives in its forward arena's block (plan.h):
 * its planned activations hold the larger of the two where a later stage
 * holds both, and the runs train as one stage does (the other tests'
 * comparisons run every stage 0 so). unet_op17 has both an arena (its
 * InstanceNorm outputs) and a gradient set on every stage. */
static void test_gradients_in_arena(void **state)
{
    (void)state;
    const int K = 3, M = 2;
    struct run_result r;
    memset(&r, 0, sizeof r);
    steps = 1;
    run("unet_op17", 8, K, M, GP_CHECKPOINT_NEVER, NULL, &r);
    steps = STEPS;
    assert_int_equal(r.stages, K);
    int shared_stages = 0;
    for (int k = 0; k < K; k++) {
        const struct gp_stage_memory_report *m = &r.memory[k];
        int64_t per_mb = m->box_bytes * m->frontier_boxes + m->set_bytes * m->activation_sets +
                         m->inbox_bytes * m->gradient_inboxes;
        int64_t both = m->gradients_in_arena
                           ? (m->arena_bytes > m->gradient_set_bytes ? m->arena_bytes : m->gradient_set_bytes)
                           : m->arena_bytes + m->gradient_set_bytes;
        printf("unet, stage %d of %d: arena %lld bytes, gradient set %lld, %s; activations planned %lld, peak %lld\n",
               k, K, (long long)m->arena_bytes, (long long)m->gradient_set_bytes,
               m->gradients_in_arena ? "one block" : "two blocks", (long long)m->activation_bytes,
               (long long)m->activation_peak);
        assert_true(m->gradients_in_arena == (k == 0));
        assert_true(m->arena_bytes > 0 && m->gradient_set_bytes > 0);
        assert_true(m->activation_bytes == per_mb + both);
        assert_true(m->activation_peak <= m->activation_bytes);
        shared_stages += m->gradients_in_arena;
    }
    assert_int_equal(shared_stages, 1);
    gp_graph_free(&r.saved);
}

/* --recompute-norm (plan.h, remade_off): BatchNorm outputs remade in the
 * backward train to the same bits as kept ones, in fp32 and bf16, on one
 * stage and several, with and without checkpointing and under 1F1B; no
 * stage plans more activation memory, one that remakes any plans less (by
 * what it reports), the whole model on one stage does, and the executor
 * stays within the plan. */
static void test_remade_norm(void **state)
{
    (void)state;
    static const char *const fixtures[] = {"resnet_op17", "digits_cnn_op17"};
    static const enum gp_checkpoint modes[2] = {GP_CHECKPOINT_NEVER, GP_CHECKPOINT_ALWAYS};
    const char *san = getenv("GP_SANITIZED");
    bool sanitized = san && !strcmp(san, "1");
    size_t n_fixtures = sanitized ? 1 : 2;
    steps = 2;
    int runs = 0, remaking = 0;
    /* Under the sanitizers one fixture, on 1 and 3 stages. */
    for (size_t f = 0; f < n_fixtures; f++)
        for (int pr = 0; pr < 2; pr++)
            for (int K = 1; K <= 3; K += sanitized ? 2 : 1)
                for (int c = 0; c < 2; c++) {
                    precision = pr ? GP_PRECISION_BF16 : GP_PRECISION_FP32;
                    schedule = K == 3 && c == 0 ? GP_PIPE_1F1B : GP_PIPE_GPIPE;
                    int M = K == 1 ? 1 : 4;
                    struct run_result kept, remade;
                    memset(&kept, 0, sizeof kept);
                    memset(&remade, 0, sizeof remade);
                    remake_norm = false;
                    run(fixtures[f], 8, K, M, modes[c], NULL, &kept);
                    remake_norm = true;
                    run(fixtures[f], 8, K, M, modes[c], NULL, &remade);
                    remake_norm = false;
                    char what[200];
                    snprintf(what, sizeof what, "%s %s remade BatchNorm outputs, %d stages x %d micro-batches (%s), "
                             "checkpoint %s", gp_precision_name(precision), fixtures[f], K, M,
                             gp_pipe_schedule_name(schedule), gp_checkpoint_name(modes[c]));
                    assert_identical(what, &remade, &kept, "kept outputs");
                    int smaller = 0;
                    for (int k = 0; k < K; k++) {
                        const struct gp_stage_memory_report *a = &kept.memory[k], *b = &remade.memory[k];
                        assert_true(b->activation_bytes <= a->activation_bytes);
                        assert_true(b->activation_peak <= b->activation_bytes);
                        assert_true((b->remade_values > 0) == (b->activation_bytes < a->activation_bytes));
                        assert_true(b->remade_saved_bytes == a->activation_bytes - b->activation_bytes);
                        smaller += b->activation_bytes < a->activation_bytes;
                    }
                    if (K == 1) assert_true(smaller == 1); /* the whole model: it pays */
                    remaking += smaller > 0;
                    if (pr == 0 && K == 1 && c == 0)
                        printf("%s: activation set %lld -> %lld bytes, gradient set %lld -> %lld\n", fixtures[f],
                               (long long)kept.memory[0].set_bytes, (long long)remade.memory[0].set_bytes,
                               (long long)kept.memory[0].gradient_set_bytes,
                               (long long)remade.memory[0].gradient_set_bytes);
                    gp_graph_free(&kept.saved);
                    gp_graph_free(&remade.saved);
                    runs++;
                }
    precision = GP_PRECISION_FP32;
    schedule = GP_PIPE_GPIPE;
    steps = STEPS;
    printf("remade BatchNorm outputs: %d runs (%d remaking on some stage) identical to kept ones, bit for bit\n", runs,
           remaking);
    assert_true(2 * remaking > runs);
}

/* A residual Add fused into the BatchNormalization before it (graph/fuse.c,
 * gp_node.fused_add) trains to the unfused nodes' bits (GP_FUSE_BN_ADD=0),
 * in fp32 and bf16 (where the normalized value is rounded to bfloat16
 * before the Add, as the unfused BatchNorm stored it), on one stage and
 * two, with every micro-batch recomputed, with its output remade in the
 * backward (--recompute-norm) too. */
static void test_fused_residual(void **state)
{
    (void)state;
    steps = 2;
    int runs = 0;
    for (int pr = 0; pr < 2; pr++)
        for (int v = 0; v < 3; v++) {
            precision = pr ? GP_PRECISION_BF16 : GP_PRECISION_FP32;
            int K = v ? 2 : 1, M = v ? 2 : 1;
            enum gp_checkpoint mode = v == 1 ? GP_CHECKPOINT_ALWAYS : GP_CHECKPOINT_NEVER;
            struct run_result fused, apart;
            memset(&fused, 0, sizeof fused);
            memset(&apart, 0, sizeof apart);
            remake_norm = v == 2;
            setenv("GP_FUSE_BN_ADD", "0", 1);
            run("resnet_op17", 8, K, M, mode, NULL, &apart);
            unsetenv("GP_FUSE_BN_ADD");
            run("resnet_op17", 8, K, M, mode, NULL, &fused);
            remake_norm = false;
            char what[200];
            snprintf(what, sizeof what, "%s resnet_op17 with the residual Adds fused, %d stage(s) x %d micro-batches, "
                     "checkpoint %s%s", gp_precision_name(precision), K, M, gp_checkpoint_name(mode),
                     v == 2 ? ", outputs remade" : "");
            assert_identical(what, &fused, &apart, "the unfused nodes");
            gp_graph_free(&fused.saved);
            gp_graph_free(&apart.saved);
            runs++;
        }
    precision = GP_PRECISION_FP32;
    steps = STEPS;
    printf("fused residual Adds: %d runs identical to the unfused nodes, bit for bit\n", runs);
}

/* A planning choice against its off switch (`env` set to 0; on: unset, or
 * set to `on_value`): the same bits on the fixtures, fp32 and bf16, 1 to
 * 3 stages, with and without checkpointing, under GPipe and 1F1B (with
 * `remade`, bf16's runs remake BatchNorm outputs too); check(off, on, K,
 * label) then compares the stages' memory. Under the sanitizers, the
 * first fixture alone (ResNet's, or the GPT's with `gpt_first`), on 1
 * and 3 stages. Returns the runs. */
static int against_switch(const char *env, const char *on_value, bool gpt_first, const char *what_on,
                          const char *what_off, bool remade,
                          void (*check)(const struct run_result *off, const struct run_result *on, int K,
                                        const char *label))
{
    const char *const fixtures[] = {gpt_first ? "gpt_op17" : "resnet_op17", "unet_op17",
                                    gpt_first ? "resnet_op17" : "gpt_op17"};
    const char *san = getenv("GP_SANITIZED");
    bool sanitized = san && !strcmp(san, "1");
    size_t n_fixtures = sanitized ? 1 : 3;
    steps = 2;
    int runs = 0;
    for (size_t f = 0; f < n_fixtures; f++)
        for (int pr = 0; pr < 2; pr++)
            for (int K = 1; K <= 3; K += sanitized ? 2 : 1) {
                precision = pr ? GP_PRECISION_BF16 : GP_PRECISION_FP32;
                enum gp_checkpoint mode = (K + pr) % 2 ? GP_CHECKPOINT_ALWAYS : GP_CHECKPOINT_NEVER;
                schedule = K == 3 ? GP_PIPE_1F1B : GP_PIPE_GPIPE;
                remake_norm = remade && pr == 1;
                int M = K == 1 ? 2 : 4;
                struct run_result off, on;
                memset(&off, 0, sizeof off);
                memset(&on, 0, sizeof on);
                setenv(env, "0", 1);
                run(fixtures[f], 8, K, M, mode, NULL, &off);
                if (on_value)
                    setenv(env, on_value, 1);
                else
                    unsetenv(env);
                run(fixtures[f], 8, K, M, mode, NULL, &on);
                unsetenv(env);
                char what[240];
                snprintf(what, sizeof what, "%s %s, %s, %d stage(s) x %d micro-batches (%s), checkpoint %s%s",
                         gp_precision_name(precision), fixtures[f], what_on, K, M, gp_pipe_schedule_name(schedule),
                         gp_checkpoint_name(mode), remake_norm ? ", remade norms" : "");
                assert_identical(what, &on, &off, what_off);
                char label[80];
                snprintf(label, sizeof label, "%s %s", gp_precision_name(precision), fixtures[f]);
                check(&off, &on, K, label);
                gp_graph_free(&off.saved);
                gp_graph_free(&on.saved);
                runs++;
            }
    precision = GP_PRECISION_FP32;
    schedule = GP_PIPE_GPIPE;
    remake_norm = false;
    steps = STEPS;
    return runs;
}

/* No stage plans more with gradients in the sets, the whole model on one
 * stage plans less, and the executor stays within the plan. */
static void check_gradients_in_sets(const struct run_result *apart, const struct run_result *in_sets, int K,
                                    const char *label)
{
    int64_t before = 0, after = 0;
    for (int k = 0; k < K; k++) {
        const struct gp_stage_memory_report *a = &apart->memory[k], *b = &in_sets->memory[k];
        assert_true(b->gradient_set_bytes <= a->gradient_set_bytes);
        assert_true(b->activation_bytes <= a->activation_bytes);
        assert_true(b->activation_peak <= b->activation_bytes);
        before += a->activation_bytes, after += b->activation_bytes;
    }
    if (K == 1) {
        assert_true(after < before);
        printf("%s, one stage: activations planned %lld -> %lld bytes (gradient set %lld -> %lld)\n", label,
               (long long)before, (long long)after, (long long)apart->memory[0].gradient_set_bytes,
               (long long)in_sets->memory[0].gradient_set_bytes);
    }
}

/* Gradients in the activation set's dead bytes (plan.h, grad_in_set) train
 * to the bits of a separate gradient set (GP_GRADIENTS_IN_SETS=0), with
 * remade BatchNorm outputs too. */
static void test_gradients_in_sets(void **state)
{
    (void)state;
    int runs = against_switch("GP_GRADIENTS_IN_SETS", NULL, false, "gradients in the sets' dead bytes",
                              "a separate gradient set", true, check_gradients_in_sets);
    printf("gradients in the activation sets: %d runs identical to a separate gradient set, bit for bit\n", runs);
}

/* No stage plans more with the workspaces in the timelines. */
static void check_workspaces_in_sets(const struct run_result *block, const struct run_result *in_sets, int K,
                                     const char *label)
{
    (void)label;
    for (int k = 0; k < K; k++) {
        const struct gp_stage_memory_report *a = &block->memory[k], *b = &in_sets->memory[k];
        assert_true(b->planned_bytes <= a->planned_bytes);
        assert_true(b->activation_bytes <= a->activation_bytes);
    }
}

/* Workspaces in the timelines (plan.h): backward ones in the activation
 * sets' dead bytes (bwd_scratch_off), forward ones in the arena
 * (fwd_scratch_off): the same bits as every workspace in the kernel
 * workspace block (GP_SCRATCH_IN_SETS=0), on the fixtures whose kernels
 * use workspaces (convolutions, GPT's matrix products). */
static void test_workspaces_in_sets(void **state)
{
    (void)state;
    int runs = against_switch("GP_SCRATCH_IN_SETS", NULL, false, "workspaces in the arena and the sets' dead bytes",
                              "every workspace in the block", false, check_workspaces_in_sets);
    printf("workspaces in the arena and the activation sets: %d runs identical to the block's, bit for bit\n", runs);
}

/* Whether the run's stages took gradients' last terms apart. */
static int addends_total;

static void check_grad_addends(const struct run_result *off, const struct run_result *on, int K, const char *label)
{
    int n = 0;
    for (int k = 0; k < K; k++) {
        assert_int_equal(off->memory[k].gradient_addends, 0);
        n += on->memory[k].gradient_addends;
    }
    /* The CPU takes float32 terms only; the GPT's residual stream has them
     * (a LayerNorm writes its input's gradient whole, the Add after it
     * adds into it first). */
    if (strcmp(label, "fp32 gpt_op17") == 0 && n == 0) fail_msg("%s, %d stage(s): no last term apart", label, K);
    if (strncmp(label, "bf16", 4) == 0) assert_int_equal(n, 0);
    addends_total += n;
}

/* Gradients' last terms apart, added by their producer's backward (plan.h,
 * addend_off; on the CPU only with GP_GRAD_ADDENDS=all, added before the
 * kernel): the bits of the terms added in place (GP_GRAD_ADDENDS=0). */
static void test_grad_addends(void **state)
{
    (void)state;
    addends_total = 0;
    int runs = against_switch("GP_GRAD_ADDENDS", "all", true, "gradients' last terms apart", "the terms added in place",
                              false, check_grad_addends);
    printf("gradients' last terms apart: %d runs (%d terms apart in all) identical to adding in place, bit for bit\n",
           runs, addends_total);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mlp),
        cmocka_unit_test(test_gradients_in_arena),
        cmocka_unit_test(test_remade_norm),
        cmocka_unit_test(test_workspaces_in_sets),
        cmocka_unit_test(test_fused_residual),
        cmocka_unit_test(test_gradients_in_sets),
        cmocka_unit_test(test_grad_addends),
        cmocka_unit_test(test_gpt),
        cmocka_unit_test(test_tied),
        cmocka_unit_test(test_batchnorm_models),
        cmocka_unit_test(test_checkpoint_memory),
        cmocka_unit_test(test_bf16_invariance),
        cmocka_unit_test(test_bf16_validation),
        cmocka_unit_test(test_bf16_memory),
        cmocka_unit_test(test_trace_shows_pipelining),
        cmocka_unit_test(test_deferred_batch_norm),
        cmocka_unit_test(test_1f1b_identical),
        cmocka_unit_test(test_1f1b_memory),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
