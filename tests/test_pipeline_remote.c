/* Stages as separate pipelines (gp_pipeline_config.remote), without MPI:
 * K threads each train one stage of the same model, linked by in-memory
 * mailboxes, and must give the bits of one pipeline of K stages (losses
 * and saved weights), under GPipe and 1F1B; a failed message ends every
 * stage's training with an error, not a hang. D replicas of them (K x D
 * threads, each stage's replicas summing in replica order) compute one
 * pipeline's micro-batches: bit for bit where each replica has one
 * micro-batch of the MLP, within rounding otherwise, their gradient sums
 * in small buckets overlapped with the backward. A tied parameter's
 * holders sum their gradients through the mailboxes too. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fixtures.h"
#include "pipeline/pipeline.h"
#include "onnx/load.h"
#include "pipeline_bench.h"
#include "train/trainer.h"

#define STEPS 3
#define MAX_K 4
#define MAX_D 2

/* ---- mailboxes: messages kept in order, taken by (from, to, tag) ---- */

struct message {
    int from, to, tag;
    size_t bytes;
    struct message *next;
    unsigned char data[];
};

static struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct message *head, *tail;
    bool closed;          /* a stage failed: every wait ends */
    int fail_after;       /* > 0: stage 1's sends fail from this one on */
    int sends_of_1;
} box = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, NULL, NULL, false, 0, 0};

/* A thread's place: messages go between ranks replica x stages + stage. */
struct link {
    int stage, replica, stages;
};

static int rank_of(const struct link *l, int stage) { return l->replica * l->stages + stage; }

static gp_status box_send(void *ctx, int to, int tag, const void *buf, size_t bytes, struct gp_error *err)
{
    const struct link *l = ctx;
    to = rank_of(l, to);
    pthread_mutex_lock(&box.mu);
    if (l->stage == 1 && box.fail_after > 0 && ++box.sends_of_1 >= box.fail_after) {
        box.closed = true;
        pthread_cond_broadcast(&box.cv);
        pthread_mutex_unlock(&box.mu);
        return gp_error_set(err, GP_ERR_COMM, "injected: stage 1 cannot send");
    }
    struct message *m = malloc(sizeof *m + bytes + 1);
    assert_non_null(m);
    *m = (struct message){.from = rank_of(l, l->stage), .to = to, .tag = tag, .bytes = bytes};
    memcpy(m->data, buf, bytes);
    if (box.tail) box.tail->next = m;
    else box.head = m;
    box.tail = m;
    pthread_cond_broadcast(&box.cv);
    pthread_mutex_unlock(&box.mu);
    return GP_OK;
}

static gp_status box_recv(void *ctx, int from, int tag, void *buf, size_t bytes, struct gp_error *err)
{
    const struct link *l = ctx;
    int me = rank_of(l, l->stage);
    from = rank_of(l, from);
    struct timespec deadline;
    clock_gettime(CLOCK_REALTIME, &deadline);
    deadline.tv_sec += 60;
    pthread_mutex_lock(&box.mu);
    for (;;) {
        struct message *prev = NULL, *m = box.head;
        while (m && !(m->from == from && m->to == me && m->tag == tag)) prev = m, m = m->next;
        if (m) {
            if (prev) prev->next = m->next;
            else box.head = m->next;
            if (box.tail == m) box.tail = prev;
            pthread_mutex_unlock(&box.mu);
            gp_status st = GP_OK;
            if (m->bytes != bytes)
                st = gp_error_set(err, GP_ERR_COMM, "stage %d sent %zu bytes where %zu were expected", from, m->bytes,
                                  bytes);
            else
                memcpy(buf, m->data, bytes);
            free(m);
            return st;
        }
        if (box.closed || pthread_cond_timedwait(&box.cv, &box.mu, &deadline) != 0) {
            pthread_mutex_unlock(&box.mu);
            return gp_error_set(err, GP_ERR_COMM, "stage %d heard nothing from stage %d", l->stage, from);
        }
    }
}

/* Sums over a stage's replicas: each deposits a copy of its data, and once
 * all have, each adds the copies up in replica order into its own; the
 * last to finish frees them. Generations keep consecutive sums apart. */
static struct {
    int arrived, finished;
    unsigned gen;
    void *copies[MAX_D];
} sums[MAX_K];

static gp_status replica_sum(const struct link *l, void *data, size_t n, size_t elem, struct gp_error *err)
{
    int D = MAX_D;
    void *mine = malloc(n * elem + 1);
    assert_non_null(mine);
    memcpy(mine, data, n * elem);
    pthread_mutex_lock(&box.mu);
    /* A sum of the previous generation still being read: wait for it to end. */
    while (sums[l->stage].finished > 0 && !box.closed) pthread_cond_wait(&box.cv, &box.mu);
    sums[l->stage].copies[l->replica] = mine;
    unsigned gen = sums[l->stage].gen;
    if (++sums[l->stage].arrived == D) {
        sums[l->stage].gen++;
        pthread_cond_broadcast(&box.cv);
    }
    while (sums[l->stage].gen == gen && !box.closed) pthread_cond_wait(&box.cv, &box.mu);
    if (sums[l->stage].gen == gen) {
        pthread_mutex_unlock(&box.mu);
        return gp_error_set(err, GP_ERR_COMM, "stage %d, replica %d: a sum's other replicas never came", l->stage,
                            l->replica);
    }
    pthread_mutex_unlock(&box.mu);
    for (size_t i = 0; i < n; i++) {
        if (elem == sizeof(float)) {
            float acc = ((const float *)sums[l->stage].copies[0])[i];
            for (int r = 1; r < D; r++) acc += ((const float *)sums[l->stage].copies[r])[i];
            ((float *)data)[i] = acc;
        } else {
            double acc = ((const double *)sums[l->stage].copies[0])[i];
            for (int r = 1; r < D; r++) acc += ((const double *)sums[l->stage].copies[r])[i];
            ((double *)data)[i] = acc;
        }
    }
    pthread_mutex_lock(&box.mu);
    if (++sums[l->stage].finished == D) {
        for (int r = 0; r < D; r++) free(sums[l->stage].copies[r]);
        sums[l->stage].arrived = sums[l->stage].finished = 0;
        pthread_cond_broadcast(&box.cv);
    }
    pthread_mutex_unlock(&box.mu);
    return GP_OK;
}

static gp_status sum_f32(void *ctx, float *data, size_t n, struct gp_error *err)
{
    return replica_sum(ctx, data, n, sizeof(float), err);
}

static gp_status sum_f64(void *ctx, double *data, size_t n, struct gp_error *err)
{
    return replica_sum(ctx, data, n, sizeof(double), err);
}

static void box_reset(int fail_after)
{
    pthread_mutex_lock(&box.mu);
    while (box.head) {
        struct message *m = box.head;
        box.head = m->next;
        free(m);
    }
    box.tail = NULL;
    box.closed = false;
    box.fail_after = fail_after;
    box.sends_of_1 = 0;
    memset(sums, 0, sizeof sums);
    pthread_mutex_unlock(&box.mu);
}

/* ---- training ---- */

static char tmp[256];

struct result {
    double loss[STEPS];
};

static void on_step(void *user, const struct gp_step_report *r) { ((struct result *)user)->loss[r->step] = r->loss; }

struct job {
    struct gp_train_config cfg;
    const struct gp_dataset *ds;
    struct link link;
    struct gp_pipe_remote remote;
    struct result res;
    gp_status st;
    struct gp_error err;
};

static void *train_stage(void *arg)
{
    struct job *j = arg;
    struct gp_train_callbacks cb = {.user = &j->res, .on_step = on_step};
    j->st = gp_train(&j->cfg, j->ds, NULL, &cb, &j->err);
    if (j->st != GP_OK) {
        /* As a rank's failure ends the job: the other stages stop waiting. */
        pthread_mutex_lock(&box.mu);
        box.closed = true;
        pthread_cond_broadcast(&box.cv);
        pthread_mutex_unlock(&box.mu);
    }
    return NULL;
}

static double clip_norm = 0;

static void config(struct gp_train_config *cfg, const char *model, int K, const int *balance,
                   enum gp_pipe_schedule_kind schedule, const char *saved)
{
    gp_train_config_defaults(cfg);
    cfg->model_path = model;
    cfg->batch = 16;
    cfg->chunks = 4;
    cfg->steps = STEPS;
    cfg->shuffle = false;
    cfg->lr = 0.05;
    cfg->momentum = 0.9;
    cfg->clip_norm = clip_norm;
    cfg->n_stages = K;
    for (int k = 0; k < K; k++) {
        cfg->stage_device[k] = k;
        cfg->balance[k] = balance[k];
    }
    cfg->pipeline_schedule = schedule;
    cfg->save_path = saved;
}

/* One pipeline of K stages with D x chunks micro-batches against D
 * replicas of K stage pipelines in threads with `chunks` each; with
 * fail_after > 0, stage 1's sends fail from that one on and every stage
 * must end with an error. `exact`: losses and saved model bit for bit;
 * otherwise the first step's loss and the later ones within 1e-6. */
static void compare_replicas(const char *fixture, int K, int D, int chunks, const int *balance,
                             enum gp_pipe_schedule_kind schedule, int fail_after, bool exact)
{
    char model[4096], name[256], one[512], many[512];
    snprintf(name, sizeof name, "%s.onnx", fixture);
    fixture_path(name, model, sizeof model);
    snprintf(one, sizeof one, "%s/one.onnx", tmp);
    snprintf(many, sizeof many, "%s/many.onnx", tmp);
    struct gp_error err = {0};
    struct gp_dataset ds;
    if (gp_dataset_synthetic(model, 16 * STEPS, 7, &ds, &err) != GP_OK) fail_msg("%s", err.msg);

    struct job ref = {0};
    config(&ref.cfg, model, K, balance, schedule, one);
    ref.cfg.chunks = D * chunks;
    ref.ds = &ds;
    train_stage(&ref);
    if (ref.st != GP_OK) fail_msg("%s, one pipeline: %s", fixture, ref.err.msg);

    box_reset(fail_after);
    struct job jobs[MAX_K * MAX_D];
    pthread_t threads[MAX_K * MAX_D];
    memset(jobs, 0, sizeof jobs);
    int N = K * D;
    for (int k = 0; k < N; k++) {
        config(&jobs[k].cfg, model, K, balance, schedule, many);
        jobs[k].cfg.chunks = chunks;
        jobs[k].ds = &ds;
        jobs[k].link = (struct link){.stage = k % K, .replica = k / K, .stages = K};
        jobs[k].remote = (struct gp_pipe_remote){.stage = k % K, .replica = k / K, .replicas = D,
                                                 .ctx = &jobs[k].link, .send = box_send, .recv = box_recv,
                                                 .sum_f32 = sum_f32, .sum_f64 = sum_f64,
                                                 /* Small buckets: many sums, each started as soon
                                                  * as the backward made it final, while the
                                                  * backward goes on; the same bits. */
                                                 .bucket_bytes = 256};
        jobs[k].cfg.remote = &jobs[k].remote;
    }
    for (int k = 0; k < N; k++) assert_int_equal(pthread_create(&threads[k], NULL, train_stage, &jobs[k]), 0);
    for (int k = 0; k < N; k++) pthread_join(threads[k], NULL);
    gp_dataset_free(&ds);

    if (fail_after > 0) {
        for (int k = 0; k < K; k++)
            if (jobs[k].st == GP_OK) fail_msg("%s: stage %d trained although stage 1 could not send", fixture, k);
        if (box.sends_of_1 < fail_after) fail_msg("%s: the failure was never injected", fixture);
        /* Stage 1 reports its failed send, or the receive its own failure
         * ended (the mailbox closes at once): which one its streams report
         * first is a race, either says why. */
        if (!strstr(jobs[1].err.msg, "injected") && !strstr(jobs[1].err.msg, "heard nothing"))
            fail_msg("stage 1's error does not say why: %s", jobs[1].err.msg);
        box_reset(0);
        return;
    }
    for (int k = 0; k < N; k++) {
        if (jobs[k].st != GP_OK) fail_msg("%s, stage %d of %d: %s", fixture, k, K, jobs[k].err.msg);
        /* Every stage's process sees the loss (the last stages'), the
         * same bits on every one; one pipeline's where exact. */
        for (int s = 0; s < STEPS; s++) {
            double a = jobs[k].res.loss[s], b = ref.res.loss[s];
            if (a != jobs[0].res.loss[s])
                fail_msg("%s: rank %d's step %d loss %.17g differs from rank 0's %.17g", fixture, k, s + 1, a,
                         jobs[0].res.loss[s]);
            if ((exact || s == 0) ? a != b : fabs(a - b) > 1e-6 * fabs(b))
                fail_msg("%s %s, %d stages x %d replicas, rank %d: step %d loss %.17g, one pipeline %.17g", fixture,
                         gp_pipe_schedule_name(schedule), K, D, k, s + 1, a, b);
        }
    }
    if (!exact) {
        box_reset(0);
        return;
    }
    size_t a_len = 0, b_len = 0;
    unsigned char *a = read_whole(one, &a_len), *b = read_whole(many, &b_len);
    assert_non_null(a);
    assert_non_null(b);
    if (a_len != b_len || memcmp(a, b, a_len) != 0)
        fail_msg("%s %s: the stages' saved model differs from one pipeline's", fixture, gp_pipe_schedule_name(schedule));
    free(a);
    free(b);
    box_reset(0);
}

static void compare(const char *fixture, int K, const int *balance, enum gp_pipe_schedule_kind schedule, int fail_after)
{
    compare_replicas(fixture, K, 1, 4, balance, schedule, fail_after, true);
}

static void test_mlp_two_stages(void **state)
{
    (void)state;
    compare("mlp_op17", 2, (const int[]){2, 3}, GP_PIPE_GPIPE, 0);
    compare("mlp_op17", 2, (const int[]){3, 2}, GP_PIPE_1F1B, 0);
}

static void test_digits_four_stages(void **state)
{
    (void)state;
    compare("digits_cnn_op17", 4, (const int[]){2, 3, 3, 2}, GP_PIPE_GPIPE, 0);
    compare("digits_cnn_op17", 4, (const int[]){1, 4, 4, 1}, GP_PIPE_1F1B, 0);
}

/* Replicas: the MLP with one micro-batch per replica (each of its layers
 * adds a micro-batch's gradient once) is one pipeline's, bit for bit; the
 * digits CNN (Dropout, BatchNorm; Conv adds each sample's gradient in
 * turn) within rounding. */
static void test_replicas(void **state)
{
    (void)state;
    compare_replicas("mlp_op17", 2, 2, 1, (const int[]){2, 3}, GP_PIPE_GPIPE, 0, true);
    compare_replicas("mlp_op17", 1, 2, 1, (const int[]){5}, GP_PIPE_1F1B, 0, true);
    compare_replicas("digits_cnn_op17", 2, 2, 2, (const int[]){5, 5}, GP_PIPE_1F1B, 0, false);
}

/* Tied parameters (the GPT whose head reads its token embedding; the
 * embedding's first and last readers in the first and last stage), clipped
 * by the whole model's norm: the holders' gradients summed through
 * messages give one pipeline's bits, with replicas too (one micro-batch
 * each: every layer of this model adds a micro-batch's gradient once). */
static void test_tied(void **state)
{
    (void)state;
    const char *tied = "../tests/data/tied_gpt_op17";
    clip_norm = 0.05;
    compare_replicas(tied, 2, 1, 4, (const int[]){17, 16}, GP_PIPE_GPIPE, 0, true);
    compare_replicas(tied, 3, 1, 4, (const int[]){11, 11, 11}, GP_PIPE_1F1B, 0, true);
    compare_replicas(tied, 2, 2, 1, (const int[]){17, 16}, GP_PIPE_1F1B, 0, true);
    clip_norm = 0;
}

static void test_failed_send_ends_every_stage(void **state)
{
    (void)state;
    compare("digits_cnn_op17", 3, (const int[]){3, 3, 4}, GP_PIPE_GPIPE, 5);
}

/* A stage that is not one of the pipeline's is refused before any work. */
static void test_refusals(void **state)
{
    (void)state;
    char model[4096];
    fixture_path("mlp_op17.onnx", model, sizeof model);
    struct link l = {.stage = 5};
    struct gp_pipe_remote r = {.stage = 5, .ctx = &l, .send = box_send, .recv = box_recv};
    struct gp_train_config cfg;
    config(&cfg, model, 2, (const int[]){2, 3}, GP_PIPE_GPIPE, NULL);
    cfg.remote = &r;
    struct gp_dataset ds;
    struct gp_error err = {0};
    if (gp_dataset_synthetic(model, 16, 7, &ds, &err) != GP_OK) fail_msg("%s", err.msg);
    assert_int_not_equal(gp_train(&cfg, &ds, NULL, NULL, &err), GP_OK);
    if (!strstr(err.msg, "stage 5 of 2 stages")) fail_msg("not said: %s", err.msg);
    gp_dataset_free(&ds);
}

/* ---- stages in device memory: the device links ---- */

/* A CPU device that says its memory is a device's: it has pinned host
 * memory, as CUDA has, so a stage on it takes the GPU stages' paths across
 * processes: frontiers through the remote's device links (NCCL's place),
 * replica sums through device_sum, no buckets. */
static struct gp_device_ops device_like;

static void *standin_host_alloc(size_t bytes) { return malloc(bytes ? bytes : 1); }
static void standin_host_free(void *ptr) { free(ptr); }

/* A device link carries no tag: like NCCL's send and receive on one
 * communicator, messages are taken in the order they were sent, so the
 * stages must issue their transfers in the same order on both ends. */
enum { LINK_TAG = 1 << 20 };
static int link_sends, link_recvs; /* under box.mu */

static gp_status link_send(void *ctx, int to, const void *buf, size_t bytes, struct gp_error *err)
{
    pthread_mutex_lock(&box.mu);
    link_sends++;
    pthread_mutex_unlock(&box.mu);
    return box_send(ctx, to, LINK_TAG, buf, bytes, err);
}

static gp_status link_recv(void *ctx, int from, void *buf, size_t bytes, struct gp_error *err)
{
    pthread_mutex_lock(&box.mu);
    link_recvs++;
    pthread_mutex_unlock(&box.mu);
    return box_recv(ctx, from, LINK_TAG, buf, bytes, err);
}

struct device_stage {
    int stage;
    struct pipe_bench b;
    double loss[STEPS];
    char *gathered;       /* gp_pipeline_gather_texts after training */
    gp_status st;
    struct gp_error err;
};

static double device_lr(int s) { return 0.05 / (1 + s); }

/* Trains one stage's pipeline (made on the main thread); no cmocka calls
 * here: a failure is kept, and ends the other stages' waits. */
static void *train_device_stage(void *arg)
{
    struct device_stage *d = arg;
    for (int s = 0; s < STEPS && d->st == GP_OK; s++) {
        const void *x = pipe_bench_x(&d->b, s), *y = pipe_bench_y(&d->b, s);
        struct gp_step_opts so = {.seed = 3, .step = (uint64_t)s, .dropout_ratio = -1};
        struct gp_step_outcome out = {0};
        d->st = gp_pipeline_train_step(d->b.p, x, y, &so, pipe_bench_denominator(&d->b, y), device_lr(s), 0, &out,
                                       &d->err);
        d->loss[s] = out.loss_sum;
    }
    /* Each stage's text at stage 0 (the trainer's kernel choices): stage
     * 1 has none. */
    char mine[64];
    snprintf(mine, sizeof mine, "text of stage %d\n", d->stage);
    if (d->st == GP_OK) d->st = gp_pipeline_gather_texts(d->b.p, d->stage == 1 ? NULL : mine, &d->gathered, &d->err);
    if (d->st != GP_OK) {
        pthread_mutex_lock(&box.mu);
        box.closed = true;
        pthread_cond_broadcast(&box.cv);
        pthread_mutex_unlock(&box.mu);
    }
    return NULL;
}

/* K stages of `fixture` on device-like memory, one thread each, linked by
 * the device links only, give the losses of one pipeline of K stages on
 * CPU devices, bit for bit; then stage 0 gathers the stages' texts. */
static void device_links(const char *fixture, int K, const int *balance, int chunks)
{
    box_reset(0);
    struct pipe_bench_setup su = {.fixture = fixture, .batch = 16, .batches = STEPS, .stages = K,
                                  .chunks = chunks, .balance = balance, .ops = &gp_cpu_device_ops};
    for (int k = 0; k < K; k++) su.device[k] = k;
    struct pipe_bench one;
    pipe_bench_open(&su, &one);
    double expect[STEPS];
    for (int s = 0; s < STEPS; s++) {
        const void *x = pipe_bench_x(&one, s), *y = pipe_bench_y(&one, s);
        struct gp_step_opts so = {.seed = 3, .step = (uint64_t)s, .dropout_ratio = -1};
        struct gp_step_outcome out = {0};
        struct gp_error err = {0};
        if (gp_pipeline_train_step(one.p, x, y, &so, pipe_bench_denominator(&one, y), device_lr(s), 0, &out, &err) !=
            GP_OK)
            fail_msg("%s: %s", fixture, err.msg);
        expect[s] = out.loss_sum;
    }
    pipe_bench_close(&one);

    struct link links[MAX_K];
    struct gp_pipe_remote remotes[MAX_K];
    struct device_stage stages[MAX_K];
    pthread_t threads[MAX_K];
    memset(stages, 0, sizeof stages);
    for (int k = 0; k < K; k++) {
        links[k] = (struct link){.stage = k, .replica = 0, .stages = K};
        remotes[k] = (struct gp_pipe_remote){.stage = k, .replicas = 1, .ctx = &links[k], .send = box_send,
                                             .recv = box_recv, .device_send = link_send, .device_recv = link_recv};
        struct pipe_bench_setup mine = su;
        mine.ops = &device_like;
        mine.remote = &remotes[k];
        stages[k].stage = k;
        pipe_bench_open(&mine, &stages[k].b);
    }
    link_sends = link_recvs = 0;
    for (int k = 0; k < K; k++) assert_int_equal(pthread_create(&threads[k], NULL, train_device_stage, &stages[k]), 0);
    for (int k = 0; k < K; k++) pthread_join(threads[k], NULL);
    for (int k = 0; k < K; k++) {
        if (stages[k].st != GP_OK) fail_msg("%s, stage %d of %d: %s", fixture, k, K, stages[k].err.msg);
        for (int s = 0; s < STEPS; s++)
            if (memcmp(&stages[k].loss[s], &expect[s], sizeof(double)))
                fail_msg("%s, stage %d of %d: step %d loss %.17g through the device links, %.17g in one pipeline",
                         fixture, k, K, s + 1, stages[k].loss[s], expect[s]);
        if (k == 0) {
            char want[256] = "text of stage 0\n";
            for (int q = 2; q < K; q++)
                snprintf(want + strlen(want), sizeof want - strlen(want), "text of stage %d\n", q);
            assert_non_null(stages[0].gathered);
            assert_string_equal(stages[0].gathered, want);
        } else {
            assert_null(stages[k].gathered);
        }
        free(stages[k].gathered);
        pipe_bench_close(&stages[k].b);
    }
    /* Every frontier crossed a link: each micro-batch's activations forward
     * and gradients back at each of the K - 1 cuts, every step (at least:
     * a cut may carry several values). */
    if (link_sends != link_recvs || link_sends < 2 * (K - 1) * chunks * STEPS)
        fail_msg("%s: %d sends and %d receives over the device links, at least %d expected", fixture, link_sends,
                 link_recvs, 2 * (K - 1) * chunks * STEPS);
    printf("%s on %d stages in device-like memory: the losses of one pipeline, bit for bit, through the device "
           "links (%d transfers)\n", fixture, K, link_sends);
}

static void test_device_links(void **state)
{
    (void)state;
    device_like = gp_cpu_device_ops;
    device_like.host_alloc = standin_host_alloc;
    device_like.host_free = standin_host_free;
    device_links("mlp_op17", 2, (const int[]){2, 3}, 4);
    device_links("digits_cnn_op17", 3, (const int[]){3, 3, 4}, 2);
}

/* A stage in device memory without device links is refused with the
 * reason, not run through host messages it cannot send from. */
static void test_device_without_links(void **state)
{
    (void)state;
    device_like = gp_cpu_device_ops;
    device_like.host_alloc = standin_host_alloc;
    device_like.host_free = standin_host_free;
    char model[4096];
    fixture_path("mlp_op17.onnx", model, sizeof model);
    struct gp_graph g;
    struct gp_error err = {0};
    if (gp_onnx_load(model, 4, &g, &err) != GP_OK) fail_msg("%s", err.msg);
    struct link l = {.stage = 1, .stages = 2};
    struct gp_pipe_remote r = {.stage = 1, .replicas = 1, .ctx = &l, .send = box_send, .recv = box_recv};
    const struct gp_device_ops *ops[2] = {&device_like, &device_like};
    struct gp_pipeline_config pc = {.graph = &g, .n_stages = 2, .device_ops = ops, .device_index = (const int[]){0, 1},
                                    .n_micro = 4, .optim = gp_sgd_defaults(0.05), .remote = &r,
                                    .loss = {.kind = GP_LOSS_MSE}};
    struct gp_pipeline *p = NULL;
    assert_int_not_equal(gp_pipeline_create(&pc, &p, &err), GP_OK);
    assert_null(p);
    if (!strstr(err.msg, "needs device links")) fail_msg("not said: %s", err.msg);
    printf("refused: %s\n", err.msg);
    gp_graph_free(&g);
}

static int setup(void **state)
{
    (void)state;
    return temp_dir(tmp, sizeof tmp) ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    remove_tree(tmp);
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mlp_two_stages),
        cmocka_unit_test(test_digits_four_stages),
        cmocka_unit_test(test_replicas),
        cmocka_unit_test(test_tied),
        cmocka_unit_test(test_failed_send_ends_every_stage),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_device_links),
        cmocka_unit_test(test_device_without_links),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
