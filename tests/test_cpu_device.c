/* The CPU device backend (backend/device.h): streams run their work in order
 * on their own threads, streams of different devices run at once, events
 * order work across streams with CUDA's semantics (generations captured at
 * wait time), a failed task poisons its stream until synchronize without
 * deadlocking the streams that wait for it, copies, memory, the timeline and
 * its Chrome trace file.
 *
 * Nothing here asserts on a duration. Where a broken implementation would
 * hang (a deadlock, or two streams that should meet but run one after the
 * other), the waits have a deadline and the test fails with a message. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "backend/device.h"
#include "pipeline/trace.h"
#include "util/cpu_cores.h"
#include "util/json_parse.h"

static const struct gp_device_ops *ops = &gp_cpu_device_ops;

#define DEADLINE_S 30 /* far above any honest run, sanitizers included */

/* ---- helpers ---- */

static struct gp_device *open_dev(int index)
{
    struct gp_device *dev = NULL;
    struct gp_error err = {0};
    if (ops->open(index, &dev, &err) != GP_OK) fail_msg("open cpu:%d: %s", index, err.msg);
    return dev;
}

static struct gp_stream *new_stream(struct gp_device *dev, const char *name)
{
    struct gp_stream *s = NULL;
    struct gp_error err = {0};
    if (ops->stream_create(dev, name, &s, &err) != GP_OK) fail_msg("stream %s: %s", name, err.msg);
    return s;
}

static struct gp_event *new_event(struct gp_device *dev)
{
    struct gp_event *e = NULL;
    struct gp_error err = {0};
    if (ops->event_create(dev, &e, &err) != GP_OK) fail_msg("event: %s", err.msg);
    return e;
}

static struct timespec deadline_in(int seconds)
{
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    t.tv_sec += seconds;
    return t;
}

/* stream_synchronize on a helper thread, so that a deadlock fails the test
 * instead of hanging it. On a timeout the job is left to the stuck thread. */
struct sync_job {
    struct gp_stream *s;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool done;
    gp_status st;
    struct gp_error err;
};

static void *sync_main(void *p)
{
    struct sync_job *j = p;
    gp_status st = ops->stream_synchronize(j->s, &j->err);
    pthread_mutex_lock(&j->mu);
    j->st = st;
    j->done = true;
    pthread_cond_signal(&j->cv);
    pthread_mutex_unlock(&j->mu);
    return NULL;
}

static gp_status sync_within(struct gp_stream *s, struct gp_error *err)
{
    struct sync_job *j = calloc(1, sizeof *j);
    assert_non_null(j);
    j->s = s;
    pthread_mutex_init(&j->mu, NULL);
    pthread_cond_init(&j->cv, NULL);
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, sync_main, j), 0);
    struct timespec dl = deadline_in(DEADLINE_S);
    pthread_mutex_lock(&j->mu);
    while (!j->done)
        if (pthread_cond_timedwait(&j->cv, &j->mu, &dl) == ETIMEDOUT) break;
    bool done = j->done;
    pthread_mutex_unlock(&j->mu);
    if (!done) fail_msg("stream_synchronize did not return within %d s: a deadlock", DEADLINE_S);
    pthread_join(t, NULL);
    gp_status st = j->st;
    if (err) *err = j->err;
    pthread_cond_destroy(&j->cv);
    pthread_mutex_destroy(&j->mu);
    free(j);
    return st;
}

static void sync_ok(struct gp_stream *s)
{
    struct gp_error err = {0};
    if (sync_within(s, &err) != GP_OK) fail_msg("synchronize: %s", err.msg);
}

static struct gp_task_tag tag(enum gp_task_kind kind, int stage, int micro, const char *name)
{
    return (struct gp_task_tag){.kind = kind, .stage = stage, .microbatch = micro, .name = name};
}

static const struct gp_task_tag other_tag = {GP_TASK_OTHER, -1, -1, "test"};

/* A gate the host opens; a task blocked on it fails after the deadline.
 * `entered` tells the host that a worker is blocked on it. */
struct gate {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool open, entered;
};

static void gate_init(struct gate *g)
{
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->cv, NULL);
    g->open = g->entered = false;
}

static bool gate_wait_entered(struct gate *g)
{
    struct timespec dl = deadline_in(DEADLINE_S);
    pthread_mutex_lock(&g->mu);
    while (!g->entered)
        if (pthread_cond_timedwait(&g->cv, &g->mu, &dl) == ETIMEDOUT) break;
    bool entered = g->entered;
    pthread_mutex_unlock(&g->mu);
    return entered;
}

static void gate_open(struct gate *g)
{
    pthread_mutex_lock(&g->mu);
    g->open = true;
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
}

static void gate_destroy(struct gate *g)
{
    pthread_cond_destroy(&g->cv);
    pthread_mutex_destroy(&g->mu);
}

static gp_status gate_task(void *arg, struct gp_error *err)
{
    struct gate *g = arg;
    struct timespec dl = deadline_in(DEADLINE_S);
    pthread_mutex_lock(&g->mu);
    g->entered = true;
    pthread_cond_broadcast(&g->cv);
    while (!g->open) {
        if (pthread_cond_timedwait(&g->cv, &g->mu, &dl) == ETIMEDOUT) {
            pthread_mutex_unlock(&g->mu);
            return gp_error_set(err, GP_ERR_DEVICE, "the gate never opened");
        }
    }
    pthread_mutex_unlock(&g->mu);
    return GP_OK;
}

/* A flag a task raises and the host waits for, with a deadline. */
struct flag {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool up;
};

static void flag_init(struct flag *f)
{
    pthread_mutex_init(&f->mu, NULL);
    pthread_cond_init(&f->cv, NULL);
    f->up = false;
}

static void flag_destroy(struct flag *f)
{
    pthread_cond_destroy(&f->cv);
    pthread_mutex_destroy(&f->mu);
}

static gp_status raise_task(void *arg, struct gp_error *err)
{
    (void)err;
    struct flag *f = arg;
    pthread_mutex_lock(&f->mu);
    f->up = true;
    pthread_cond_broadcast(&f->cv);
    pthread_mutex_unlock(&f->mu);
    return GP_OK;
}

static bool flag_wait(struct flag *f, int seconds)
{
    struct timespec dl = deadline_in(seconds);
    pthread_mutex_lock(&f->mu);
    while (!f->up)
        if (pthread_cond_timedwait(&f->cv, &f->mu, &dl) == ETIMEDOUT) break;
    bool up = f->up;
    pthread_mutex_unlock(&f->mu);
    return up;
}

static gp_status inc_task(void *arg, struct gp_error *err)
{
    (void)err;
    (*(int *)arg)++;
    return GP_OK;
}

static gp_status atomic_inc_task(void *arg, struct gp_error *err)
{
    (void)err;
    atomic_fetch_add((atomic_int *)arg, 1);
    return GP_OK;
}

/* Writes 1 into the int it points at. */
static gp_status set_one_task(void *arg, struct gp_error *err)
{
    (void)err;
    *(int *)arg = 1;
    return GP_OK;
}

/* Copies one int into another: {src, dst}. */
struct read_arg {
    const int *src;
    int *dst;
};

static gp_status read_task(void *arg, struct gp_error *err)
{
    (void)err;
    struct read_arg *r = arg;
    *r->dst = *r->src;
    return GP_OK;
}

static void sleep_us(unsigned us)
{
    if (us == 0) return;
    struct timespec t = {.tv_sec = us / 1000000, .tv_nsec = (long)(us % 1000000) * 1000};
    nanosleep(&t, NULL);
}

static uint32_t xorshift(uint32_t *state)
{
    uint32_t x = *state;
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    return *state = x;
}

/* ---- order on one stream ---- */

#define ORDER_N 5000 /* more than the ring's first capacity, queued at once */

struct order_log {
    int values[ORDER_N];
    int n;
    pthread_t threads[ORDER_N];
};

struct order_arg {
    struct order_log *log;
    int value;
};

static gp_status order_task(void *arg, struct gp_error *err)
{
    (void)err;
    struct order_arg *a = arg;
    a->log->threads[a->log->n] = pthread_self();
    a->log->values[a->log->n++] = a->value;
    return GP_OK;
}

/* Tasks run in the order they were enqueued, on one thread that is not the
 * host's, also when the ring has to grow while its worker is blocked. */
static void test_tasks_in_order(void **state)
{
    (void)state;
    struct gp_device *dev = open_dev(0);
    struct gp_stream *s = new_stream(dev, "compute");
    struct order_log *log = calloc(1, sizeof *log);
    struct order_arg *args = calloc(ORDER_N, sizeof *args);
    assert_non_null(log);
    assert_non_null(args);
    struct gate g;
    gate_init(&g);
    ops->enqueue(s, gate_task, &g, &other_tag);
    /* The worker has taken the gate off the ring, so the ring is not at its
     * start when it grows. */
    assert_true(gate_wait_entered(&g));
    for (int i = 0; i < ORDER_N; i++) {
        args[i] = (struct order_arg){log, i};
        struct gp_task_tag t = tag(GP_TASK_FORWARD, 0, i, "forward");
        ops->enqueue(s, order_task, &args[i], &t);
    }
    gate_open(&g);
    sync_ok(s);
    assert_int_equal(log->n, ORDER_N);
    for (int i = 0; i < ORDER_N; i++) {
        assert_int_equal(log->values[i], i);
        assert_true(pthread_equal(log->threads[i], log->threads[0]));
    }
    assert_false(pthread_equal(log->threads[0], pthread_self()));

    /* Synchronizing an idle or empty stream returns at once. */
    sync_ok(s);
    ops->stream_destroy(s);
    s = new_stream(dev, "empty");
    sync_ok(s);
    ops->stream_destroy(s);
    gate_destroy(&g);
    free(args);
    free(log);
    ops->close(dev);
}

/* ---- concurrency across devices ---- */

/* Two tasks that return only when both have started: if the streams ran
 * one after the other, the first would time out and fail. */
struct rendezvous {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int arrived;
};

static gp_status meet_task(void *arg, struct gp_error *err)
{
    struct rendezvous *r = arg;
    struct timespec dl = deadline_in(10);
    pthread_mutex_lock(&r->mu);
    r->arrived++;
    pthread_cond_broadcast(&r->cv);
    while (r->arrived < 2) {
        if (pthread_cond_timedwait(&r->cv, &r->mu, &dl) == ETIMEDOUT) {
            pthread_mutex_unlock(&r->mu);
            return gp_error_set(err, GP_ERR_DEVICE, "rendezvous timed out: the streams did not run at once");
        }
    }
    pthread_mutex_unlock(&r->mu);
    return GP_OK;
}

static void test_devices_run_concurrently(void **state)
{
    (void)state;
    struct gp_device *d0 = open_dev(0), *d1 = open_dev(1);
    struct gp_stream *s0 = new_stream(d0, "compute"), *s1 = new_stream(d1, "compute");
    ops->trace_enable(s0, 1);
    ops->trace_enable(s1, 1);
    for (int round = 0; round < 20; round++) {
        struct rendezvous r = {.arrived = 0};
        pthread_mutex_init(&r.mu, NULL);
        pthread_cond_init(&r.cv, NULL);
        struct gp_task_tag t0 = tag(GP_TASK_FORWARD, 0, round, "forward");
        struct gp_task_tag t1 = tag(GP_TASK_FORWARD, 1, round, "forward");
        ops->enqueue(s0, meet_task, &r, &t0);
        ops->enqueue(s1, meet_task, &r, &t1);
        struct gp_error e0 = {0}, e1 = {0};
        gp_status st0 = sync_within(s0, &e0);
        gp_status st1 = sync_within(s1, &e1);
        if (st0 != GP_OK) fail_msg("cpu:0: %s", e0.msg);
        if (st1 != GP_OK) fail_msg("cpu:1: %s", e1.msg);
        pthread_cond_destroy(&r.cv);
        pthread_mutex_destroy(&r.mu);
    }
    /* The timeline shows it too: each round's two spans overlap. */
    int n0 = 0, n1 = 0;
    const struct gp_trace_span *a = ops->trace_spans(s0, &n0);
    const struct gp_trace_span *b = ops->trace_spans(s1, &n1);
    assert_int_equal(n0, 20);
    assert_int_equal(n1, 20);
    for (int k = 0; k < 20; k++) {
        assert_int_equal(a[k].tag.microbatch, k);
        assert_int_equal(b[k].tag.stage, 1);
        assert_true(a[k].start_us < b[k].end_us && b[k].start_us < a[k].end_us);
    }
    ops->stream_destroy(s0);
    ops->stream_destroy(s1);
    ops->close(d0);
    ops->close(d1);
}

/* ---- events ---- */

#define CHAIN_N 1000

/* a -> b -> c across three streams of three devices, one slot per round so
 * that only the events order the rounds' readers after their writers. The
 * sleeps vary who is ahead; -1 marks a slot not yet written. */
struct chain {
    int a[CHAIN_N], b[CHAIN_N], c[CHAIN_N];
    unsigned sleep_a[CHAIN_N], sleep_b[CHAIN_N], sleep_c[CHAIN_N];
};

struct chain_arg {
    struct chain *ch;
    int i;
};

static gp_status produce_task(void *arg, struct gp_error *err)
{
    (void)err;
    struct chain_arg *x = arg;
    sleep_us(x->ch->sleep_a[x->i]);
    x->ch->a[x->i] = 3 * x->i + 1;
    return GP_OK;
}

static gp_status transform_task(void *arg, struct gp_error *err)
{
    (void)err;
    struct chain_arg *x = arg;
    sleep_us(x->ch->sleep_b[x->i]);
    int v = x->ch->a[x->i];
    x->ch->b[x->i] = v < 0 ? -2 : 2 * v;
    return GP_OK;
}

static gp_status consume_task(void *arg, struct gp_error *err)
{
    (void)err;
    struct chain_arg *x = arg;
    sleep_us(x->ch->sleep_c[x->i]);
    int v = x->ch->b[x->i];
    x->ch->c[x->i] = v < 0 ? v : v + 1;
    return GP_OK;
}

static void test_stream_wait_chain(void **state)
{
    (void)state;
    struct gp_device *d[3] = {open_dev(0), open_dev(1), open_dev(2)};
    struct gp_stream *s[3];
    for (int k = 0; k < 3; k++) s[k] = new_stream(d[k], "compute");
    /* Two events, recorded again every round: CHAIN_N generations each. */
    struct gp_event *ab = new_event(d[0]), *bc = new_event(d[1]);
    struct chain *ch = malloc(sizeof *ch);
    struct chain_arg *args = malloc(CHAIN_N * sizeof *args);
    assert_non_null(ch);
    assert_non_null(args);
    uint32_t rng = 12345;
    for (int i = 0; i < CHAIN_N; i++) {
        ch->a[i] = ch->b[i] = ch->c[i] = -1;
        /* The producer sleeps most, so that its readers would be ahead. */
        ch->sleep_a[i] = xorshift(&rng) % 200;
        ch->sleep_b[i] = xorshift(&rng) % 60;
        ch->sleep_c[i] = xorshift(&rng) % 20;
        args[i] = (struct chain_arg){ch, i};
    }
    for (int i = 0; i < CHAIN_N; i++) {
        struct gp_task_tag t = tag(GP_TASK_FORWARD, 0, i, "forward");
        ops->enqueue(s[0], produce_task, &args[i], &t);
        ops->event_record(ab, s[0]);
        ops->stream_wait(s[1], ab);
        t.stage = 1;
        ops->enqueue(s[1], transform_task, &args[i], &t);
        ops->event_record(bc, s[1]);
        ops->stream_wait(s[2], bc);
        t.stage = 2;
        ops->enqueue(s[2], consume_task, &args[i], &t);
    }
    /* Only the last stream is synchronized: the others finish before it. */
    sync_ok(s[2]);
    int bad = 0, first_bad = -1;
    for (int i = 0; i < CHAIN_N; i++)
        if (ch->c[i] != 2 * (3 * i + 1) + 1) {
            if (first_bad < 0) first_bad = i;
            bad++;
        }
    if (bad) fail_msg("%d of %d rounds read before their producer wrote (first: round %d, c = %d)", bad,
                      CHAIN_N, first_bad, ch->c[first_bad]);
    for (int k = 0; k < 3; k++) {
        sync_ok(s[k]);
        ops->stream_destroy(s[k]);
    }
    ops->event_destroy(ab);
    ops->event_destroy(bc);
    for (int k = 0; k < 3; k++) ops->close(d[k]);
    free(args);
    free(ch);
}

/* A wait captures the generation recorded when it is issued: not an older
 * one, and not a newer one recorded later. */
static void test_event_generations(void **state)
{
    (void)state;
    struct gp_device *dev = open_dev(0);
    struct gp_stream *s0 = new_stream(dev, "s0"), *s1 = new_stream(dev, "s1");
    struct gp_event *e = new_event(dev);
    struct gate g, g1;
    gate_init(&g);
    gate_init(&g1);
    struct flag reached;
    flag_init(&reached);
    int x = 0, y = 0, seen_x = -1, seen_y = -1;
    struct read_arg rx = {&x, &seen_x}, ry = {&y, &seen_y};

    ops->enqueue(s0, set_one_task, &x, &other_tag);
    ops->event_record(e, s0);                   /* generation 1 */
    ops->enqueue(s1, gate_task, &g1, &other_tag);
    ops->stream_wait(s1, e);                    /* waits for 1 only */
    ops->enqueue(s1, read_task, &rx, &other_tag);
    ops->enqueue(s1, raise_task, &reached, &other_tag);
    ops->enqueue(s0, gate_task, &g, &other_tag);
    ops->enqueue(s0, set_one_task, &y, &other_tag);
    ops->event_record(e, s0);                   /* generation 2, behind the gate */
    /* s1 reaches its wait only now, and gets past it although generation 2
     * is blocked. */
    gate_open(&g1);
    if (!flag_wait(&reached, DEADLINE_S)) {
        gate_open(&g);
        fail_msg("a wait issued before the second record waited for it");
    }
    ops->stream_wait(s1, e);                    /* waits for 2 */
    ops->enqueue(s1, read_task, &ry, &other_tag);
    sleep_us(20000); /* room for a wrong implementation to run the read early */
    gate_open(&g);
    sync_ok(s1);
    sync_ok(s0);
    assert_int_equal(seen_x, 1);
    assert_int_equal(seen_y, 1);
    ops->stream_destroy(s0);
    ops->stream_destroy(s1);
    ops->event_destroy(e);
    flag_destroy(&reached);
    gate_destroy(&g);
    gate_destroy(&g1);
    ops->close(dev);
}

/* Recorded again on another stream while the first record is pending: a
 * wait for the first generation is not released by the second. */
static void test_event_rerecorded_elsewhere(void **state)
{
    (void)state;
    struct gp_device *dev = open_dev(0);
    struct gp_stream *s0 = new_stream(dev, "s0"), *s1 = new_stream(dev, "s1"),
                     *s2 = new_stream(dev, "s2");
    struct gp_event *e = new_event(dev);
    struct gate g;
    gate_init(&g);
    int x = 0, seen = -1;
    struct read_arg rx = {&x, &seen};
    ops->enqueue(s0, gate_task, &g, &other_tag);
    ops->enqueue(s0, set_one_task, &x, &other_tag);
    ops->event_record(e, s0); /* generation 1, behind the gate */
    ops->stream_wait(s2, e);
    ops->enqueue(s2, read_task, &rx, &other_tag);
    ops->event_record(e, s1); /* generation 2, reachable at once */
    sleep_us(20000);
    gate_open(&g);
    sync_ok(s2);
    sync_ok(s1);
    sync_ok(s0);
    assert_int_equal(seen, 1);
    ops->stream_destroy(s0);
    ops->stream_destroy(s1);
    ops->stream_destroy(s2);
    ops->event_destroy(e);
    gate_destroy(&g);
    ops->close(dev);
}

/* A wait on an event never recorded, or on one already reached, is a no-op. */
static void test_wait_never_recorded(void **state)
{
    (void)state;
    struct gp_device *dev = open_dev(0);
    struct gp_stream *s = new_stream(dev, "compute"), *t = new_stream(dev, "other");
    struct gp_event *never = new_event(dev), *done = new_event(dev);
    int ran = 0;
    ops->stream_wait(s, never);
    ops->enqueue(s, inc_task, &ran, &other_tag);
    sync_ok(s);
    assert_int_equal(ran, 1);

    ops->event_record(done, t);
    sync_ok(t);
    ops->stream_wait(s, done);
    ops->stream_wait(s, never);
    ops->enqueue(s, inc_task, &ran, &other_tag);
    sync_ok(s);
    assert_int_equal(ran, 2);
    ops->stream_destroy(s);
    ops->stream_destroy(t);
    ops->event_destroy(never);
    ops->event_destroy(done);
    ops->close(dev);
}

/* ---- errors ---- */

static gp_status fail_task(void *arg, struct gp_error *err)
{
    (void)arg;
    return gp_error_set(err, GP_ERR_SHAPE, "stage 1: node 'conv3': boom");
}

static gp_status mute_fail_task(void *arg, struct gp_error *err)
{
    (void)arg;
    (void)err;
    return GP_ERR_IO;
}

static void test_error_propagation(void **state)
{
    (void)state;
    struct gp_device *d0 = open_dev(0), *d1 = open_dev(1);
    struct gp_stream *s0 = new_stream(d0, "compute"), *s1 = new_stream(d1, "compute");
    struct gp_event *e = new_event(d0);
    int before = 0, after = 0, waiter = 0;
    unsigned char src[16], dst[16] = {0};
    memset(src, 0xab, sizeof src);
    ops->trace_enable(s0, 1);

    ops->enqueue(s0, inc_task, &before, &other_tag);
    struct gp_task_tag ft = tag(GP_TASK_FORWARD, 1, 0, "forward");
    ops->enqueue(s0, fail_task, NULL, &ft);
    ops->enqueue(s0, inc_task, &after, &other_tag);
    ops->copy(s0, dst, src, sizeof dst, NULL);
    ops->event_record(e, s0);
    ops->stream_wait(s1, e);
    ops->enqueue(s1, inc_task, &waiter, &other_tag);

    /* The waiting stream is released although s0 failed before its record. */
    sync_ok(s1);
    assert_int_equal(waiter, 1);

    struct gp_error err = {0};
    gp_status st = sync_within(s0, &err);
    assert_int_equal(st, GP_ERR_SHAPE);
    assert_int_equal(err.status, GP_ERR_SHAPE);
    assert_non_null(strstr(err.msg, "boom"));
    assert_int_equal(before, 1);
    assert_int_equal(after, 0); /* skipped */
    for (size_t i = 0; i < sizeof dst; i++) assert_int_equal(dst[i], 0);
    int n = 0;
    const struct gp_trace_span *sp = ops->trace_spans(s0, &n);
    assert_int_equal(n, 2); /* the task before and the failed one; nothing skipped */
    assert_int_equal(sp[1].tag.kind, GP_TASK_FORWARD);

    /* Reported once, then the stream works again. */
    ops->enqueue(s0, inc_task, &after, &other_tag);
    ops->copy(s0, dst, src, sizeof dst, NULL);
    sync_ok(s0);
    assert_int_equal(after, 1);
    assert_memory_equal(dst, src, sizeof dst);
    sync_ok(s0);

    /* A task that fails without a message is still named. */
    struct gp_task_tag mt = tag(GP_TASK_BACKWARD, 4, 7, "mystery");
    ops->enqueue(s0, mute_fail_task, NULL, &mt);
    ops->enqueue(s0, mute_fail_task, NULL, &other_tag); /* skipped: only the first is reported */
    gp_error_clear(&err);
    st = sync_within(s0, &err);
    assert_int_equal(st, GP_ERR_IO);
    assert_non_null(strstr(err.msg, "mystery"));
    assert_non_null(strstr(err.msg, "stage 4"));
    sync_ok(s0);

    ops->stream_destroy(s0);
    ops->stream_destroy(s1);
    ops->event_destroy(e);
    ops->close(d0);
    ops->close(d1);
}

/* ---- memory and copies ---- */

struct pattern {
    unsigned char *p;
    size_t n;
};

static gp_status fill_task(void *arg, struct gp_error *err)
{
    (void)err;
    struct pattern *x = arg;
    for (size_t i = 0; i < x->n; i++) x->p[i] = (unsigned char)(i * 7 + 3);
    return GP_OK;
}

static gp_status check_task(void *arg, struct gp_error *err)
{
    struct pattern *x = arg;
    for (size_t i = 0; i < x->n; i++)
        if (x->p[i] != (unsigned char)(i * 7 + 3))
            return gp_error_set(err, GP_ERR_DEVICE, "byte %zu is %d", i, x->p[i]);
    return GP_OK;
}

static void test_alloc_and_copy(void **state)
{
    (void)state;
    struct gp_device *d0 = open_dev(0), *d1 = open_dev(1);
    const size_t bytes = ((size_t)1 << 20) + 13;
    unsigned char *a = ops->alloc(d0, bytes), *b = ops->alloc(d1, bytes);
    assert_non_null(a);
    assert_non_null(b);
    assert_int_equal((uintptr_t)a % 64, 0);
    assert_int_equal((uintptr_t)b % 64, 0);
    for (size_t i = 0; i < bytes; i++) assert_true(a[i] == 0 && b[i] == 0);
    void *z = ops->alloc(d0, 0);
    assert_non_null(z);
    assert_int_equal((uintptr_t)z % 64, 0);
    ops->free(d0, z);
    ops->free(d0, NULL);

    /* compute on cpu:0 -> a copy stream -> compute on cpu:1 */
    struct gp_stream *c0 = new_stream(d0, "compute"), *cp = new_stream(d0, "copy s0->s1"),
                     *c1 = new_stream(d1, "compute");
    struct gp_event *filled = new_event(d0), *copied = new_event(d0);
    struct pattern pa = {a, bytes}, pb = {b, bytes};
    ops->trace_enable(cp, 1);
    ops->enqueue(c0, fill_task, &pa, &other_tag);
    ops->event_record(filled, c0);
    ops->stream_wait(cp, filled);
    struct gp_task_tag ct = tag(GP_TASK_COPY, 0, 2, "send activations");
    ops->copy(cp, b, a, bytes, &ct);
    ops->copy(cp, NULL, NULL, 0, NULL); /* nothing to copy is fine */
    ops->event_record(copied, cp);
    ops->stream_wait(c1, copied);
    ops->enqueue(c1, check_task, &pb, &other_tag);
    sync_ok(c1);
    sync_ok(cp);
    sync_ok(c0);
    int n = 0;
    const struct gp_trace_span *sp = ops->trace_spans(cp, &n);
    assert_int_equal(n, 2);
    assert_int_equal(sp[0].tag.kind, GP_TASK_COPY);
    assert_int_equal(sp[0].tag.microbatch, 2);
    assert_string_equal(sp[0].tag.name, "send activations");
    assert_int_equal(sp[1].tag.kind, GP_TASK_COPY); /* the default tag of a copy */

    ops->stream_destroy(c0);
    ops->stream_destroy(cp);
    ops->stream_destroy(c1);
    ops->event_destroy(filled);
    ops->event_destroy(copied);
    ops->free(d0, a);
    ops->free(d1, b);
    ops->close(d0);
    ops->close(d1);
}

/* ---- threads for kernels ---- */

#ifdef _OPENMP
static gp_status omp_threads_task(void *arg, struct gp_error *err)
{
    (void)err;
    *(int *)arg = omp_get_max_threads();
    return GP_OK;
}
#endif

static void test_set_threads(void **state)
{
    (void)state;
#ifdef _OPENMP
    struct gp_device *d0 = open_dev(0), *d1 = open_dev(1);
    struct gp_stream *s0 = new_stream(d0, "compute"), *s1 = new_stream(d1, "compute");
    int t0 = 0, t1 = 0;
    ops->enqueue(s0, omp_threads_task, &t0, &other_tag);
    sync_ok(s0);
    assert_int_equal(t0, 1); /* the default */
    ops->set_threads(d0, 3);
    ops->set_threads(d1, 2);
    ops->enqueue(s0, omp_threads_task, &t0, &other_tag);
    ops->enqueue(s1, omp_threads_task, &t1, &other_tag);
    sync_ok(s0);
    sync_ok(s1);
    assert_int_equal(t0, 3);
    assert_int_equal(t1, 2);
    ops->set_threads(d0, 0); /* at least one */
    ops->enqueue(s0, omp_threads_task, &t0, &other_tag);
    sync_ok(s0);
    assert_int_equal(t0, 1);
    ops->stream_destroy(s0);
    ops->stream_destroy(s1);
    ops->close(d0);
    ops->close(d1);
#else
    skip();
#endif
}

/* ---- the timeline ---- */

static void test_trace_spans(void **state)
{
    (void)state;
    struct gp_device *dev = open_dev(0);
    struct gp_stream *s = new_stream(dev, "compute");
    int count = 0, n = -1;

    /* Off by default. */
    ops->enqueue(s, inc_task, &count, &other_tag);
    sync_ok(s);
    ops->trace_spans(s, &n);
    assert_int_equal(n, 0);

    ops->trace_enable(s, 1);
    for (int i = 0; i < 10; i++) {
        struct gp_task_tag t = tag(GP_TASK_FORWARD, 0, i, "forward");
        ops->enqueue(s, inc_task, &count, &t);
    }
    sync_ok(s);
    const struct gp_trace_span *early = ops->trace_spans(s, &n);
    assert_int_equal(n, 10);
    /* Enough more to make the array grow: the early one stays readable. */
    const int more = 1000;
    for (int i = 0; i < more; i++) {
        struct gp_task_tag t = tag(i % 2 ? GP_TASK_BACKWARD : GP_TASK_RECOMPUTE, 1, i, "x");
        ops->enqueue(s, inc_task, &count, &t);
    }
    static const unsigned char buf[8];
    unsigned char out[8];
    struct gp_task_tag ct = tag(GP_TASK_COPY, 1, 0, "send gradients");
    ops->copy(s, out, buf, sizeof out, &ct);
    sync_ok(s);
    for (int i = 0; i < 10; i++) assert_int_equal(early[i].tag.microbatch, i);
    const struct gp_trace_span *sp = ops->trace_spans(s, &n);
    assert_int_equal(n, 10 + more + 1);
    for (int i = 0; i < n; i++) {
        assert_true(sp[i].start_us <= sp[i].end_us);
        if (i > 0) assert_true(sp[i - 1].end_us <= sp[i].start_us); /* one at a time */
        if (i < 10) {
            assert_int_equal(sp[i].tag.kind, GP_TASK_FORWARD);
            assert_int_equal(sp[i].tag.microbatch, i);
        } else if (i < 10 + more) {
            assert_int_equal(sp[i].tag.kind, (i - 10) % 2 ? GP_TASK_BACKWARD : GP_TASK_RECOMPUTE);
            assert_int_equal(sp[i].tag.microbatch, i - 10);
            assert_int_equal(sp[i].tag.stage, 1);
        }
    }
    assert_int_equal(sp[n - 1].tag.kind, GP_TASK_COPY);
    assert_string_equal(sp[n - 1].tag.name, "send gradients");

    /* Stopped: nothing more recorded, and what was stays. */
    ops->trace_enable(s, 0);
    ops->enqueue(s, inc_task, &count, &other_tag);
    sync_ok(s);
    ops->trace_spans(s, &n);
    assert_int_equal(n, 10 + more + 1);
    /* Started again: cleared. */
    ops->trace_enable(s, 1);
    ops->trace_spans(s, &n);
    assert_int_equal(n, 0);
    ops->enqueue(s, inc_task, &count, &other_tag);
    sync_ok(s);
    ops->trace_spans(s, &n);
    assert_int_equal(n, 1);
    assert_int_equal(count, 1 + 10 + more + 1 + 1);
    ops->stream_destroy(s);
    ops->close(dev);
}

static char *make_temp_dir(void)
{
    const char *base = getenv("TMPDIR");
    char *dir = malloc(4096);
    assert_non_null(dir);
    snprintf(dir, 4096, "%s/gp_trace_XXXXXX", base && base[0] ? base : "/tmp");
    assert_non_null(mkdtemp(dir));
    return dir;
}

/* The names in dir, sorted, joined by spaces. */
static void list_dir(const char *dir, char *out, size_t size)
{
    char names[16][256];
    int n = 0;
    DIR *d = opendir(dir);
    assert_non_null(d);
    for (struct dirent *de; (de = readdir(d));) {
        if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0) continue;
        assert_true(n < 16);
        snprintf(names[n++], sizeof names[0], "%s", de->d_name);
    }
    closedir(d);
    qsort(names, (size_t)n, sizeof names[0], (int (*)(const void *, const void *))strcmp);
    out[0] = '\0';
    for (int i = 0; i < n; i++) {
        if (i) strncat(out, " ", size - strlen(out) - 1);
        strncat(out, names[i], size - strlen(out) - 1);
    }
}

static const struct gp_jvalue *find_event(const struct gp_jvalue *events, const char *ph, const char *name,
                                          int pid, int tid)
{
    for (size_t i = 0; i < events->count; i++) {
        const struct gp_jvalue *ev = &events->items[i];
        const struct gp_jvalue *p = gp_jobject_get(ev, "ph"), *nm = gp_jobject_get(ev, "name");
        const struct gp_jvalue *pd = gp_jobject_get(ev, "pid"), *td = gp_jobject_get(ev, "tid");
        if (!p || !nm || !pd || !td || strcmp(p->str, ph) != 0 || strcmp(nm->str, name) != 0) continue;
        if (pd->i == pid && (tid < 0 || td->i == tid)) return ev;
    }
    fail_msg("no %s event '%s' with pid %d, tid %d", ph, name, pid, tid);
    return NULL;
}

static double num(const struct gp_jvalue *obj, const char *key)
{
    const struct gp_jvalue *v = gp_jobject_get(obj, key);
    if (!v || v->type != GP_JNUMBER) fail_msg("'%s' is missing or not a number", key);
    return v->num;
}

static const char *str(const struct gp_jvalue *obj, const char *key)
{
    const struct gp_jvalue *v = gp_jobject_get(obj, key);
    if (!v || v->type != GP_JSTRING) fail_msg("'%s' is missing or not a string", key);
    return v->str;
}

static void check_x(const struct gp_jvalue *events, const char *name, int pid, int tid, const char *cat,
                    double ts, double dur, int stage, int micro)
{
    const struct gp_jvalue *ev = find_event(events, "X", name, pid, tid);
    assert_string_equal(str(ev, "cat"), cat);
    assert_true(fabs(num(ev, "ts") - ts) < 1e-6);
    assert_true(fabs(num(ev, "dur") - dur) < 1e-6);
    const struct gp_jvalue *args = gp_jobject_get(ev, "args");
    assert_non_null(args);
    assert_int_equal((int)num(args, "stage"), stage);
    assert_int_equal((int)num(args, "microbatch"), micro);
}

static void test_trace_json(void **state)
{
    (void)state;
    const struct gp_trace_span compute0[] = {
        {tag(GP_TASK_FORWARD, 0, 3, "forward"), 1000.5, 1010.0},
        {tag(GP_TASK_COPY, 0, 2, "load inputs"), 1010.0, 1010.25},
        {tag(GP_TASK_OPTIMIZER, 0, -1, "optimizer"), 1020.0, 1030.0},
    };
    const struct gp_trace_span copy01[] = {
        {tag(GP_TASK_COPY, 0, 2, "send activations"), 1011.0, 1012.0},
    };
    const struct gp_trace_span compute1[] = {
        {tag(GP_TASK_BACKWARD, 1, 0, "backward"), 1005.0, 1009.0},
        {tag(GP_TASK_RECOMPUTE, 1, 0, "recompute"), 1003.0, 1004.0},
        {tag(GP_TASK_LOSS, 1, 0, "loss"), 1002.0, 1003.0},
        {tag(GP_TASK_OTHER, -1, -1, "zero grads"), 1001.0, 1001.5},
    };
    const struct gp_trace_span copy10[] = {
        {tag(GP_TASK_COPY, 1, 0, "send gradients"), 1009.0, 1010.0},
    };
    const struct gp_trace_stream streams[] = {
        {0, "cpu", "compute", compute0, 3},
        {0, "cpu", "copy s0->s1", copy01, 1},
        {1, "cpu:1", "compute", compute1, 4},
        {1, "cpu:1", "copy s1->s0", copy10, 1},
        {1, "cpu:1", "idle", NULL, 0},
    };
    char *dir = make_temp_dir();
    char path[4200], listing[1024];
    snprintf(path, sizeof path, "%s/trace.json", dir);
    struct gp_error err = {0};
    if (gp_trace_write(path, streams, 5, &err) != GP_OK) fail_msg("%s", err.msg);

    struct gp_json_doc doc = {0};
    if (gp_json_parse_file(path, &doc, &err) != GP_OK) fail_msg("%s", err.msg);
    assert_string_equal(str(doc.root, "displayTimeUnit"), "ms");
    const struct gp_jvalue *events = gp_jobject_get(doc.root, "traceEvents");
    assert_non_null(events);
    assert_int_equal(events->type, GP_JARRAY);
    int xs = 0, procs = 0, threads = 0;
    for (size_t i = 0; i < events->count; i++) {
        const char *ph = str(&events->items[i], "ph");
        if (strcmp(ph, "X") == 0) xs++;
        if (strcmp(ph, "M") == 0 && strcmp(str(&events->items[i], "name"), "process_name") == 0) procs++;
        if (strcmp(ph, "M") == 0 && strcmp(str(&events->items[i], "name"), "thread_name") == 0) threads++;
    }
    assert_int_equal(xs, 3 + 1 + 4 + 1);
    assert_int_equal(procs, 2);   /* one per device */
    assert_int_equal(threads, 5); /* one per stream */
    /* ts from the earliest span (1000.5), in microseconds. */
    check_x(events, "F s0 m3", 0, 0, "forward", 0, 9.5, 0, 3);
    check_x(events, "load inputs s0 m2", 0, 0, "copy", 9.5, 0.25, 0, 2);
    check_x(events, "optimizer s0", 0, 0, "optimizer", 19.5, 10, 0, -1);
    check_x(events, "copy s0->s1 m2", 0, 1, "copy", 10.5, 1, 0, 2);
    check_x(events, "B s1 m0", 1, 2, "backward", 4.5, 4, 1, 0);
    check_x(events, "R s1 m0", 1, 2, "recompute", 2.5, 1, 1, 0);
    check_x(events, "loss s1 m0", 1, 2, "loss", 1.5, 1, 1, 0);
    check_x(events, "zero grads", 1, 2, "other", 0.5, 0.5, -1, -1);
    check_x(events, "copy s1->s0 m0", 1, 3, "copy", 8.5, 1, 1, 0);
    const struct gp_jvalue *m = find_event(events, "M", "process_name", 0, -1);
    assert_string_equal(str(gp_jobject_get(m, "args"), "name"), "cpu:0");
    m = find_event(events, "M", "process_name", 1, -1);
    assert_string_equal(str(gp_jobject_get(m, "args"), "name"), "cpu:1");
    m = find_event(events, "M", "thread_name", 0, 1);
    assert_string_equal(str(gp_jobject_get(m, "args"), "name"), "copy s0->s1");
    m = find_event(events, "M", "thread_name", 1, 4);
    assert_string_equal(str(gp_jobject_get(m, "args"), "name"), "idle");
    gp_json_doc_free(&doc);
    list_dir(dir, listing, sizeof listing);
    assert_string_equal(listing, "trace.json"); /* no temporary file left */

    /* Failures leave no file behind: a missing folder, and a folder where
     * the file should go (the rename fails after the data was written). */
    char bad[4300];
    snprintf(bad, sizeof bad, "%s/missing/trace.json", dir);
    gp_error_clear(&err);
    assert_int_equal(gp_trace_write(bad, streams, 5, &err), GP_ERR_IO);
    assert_non_null(strstr(err.msg, "missing/trace.json"));
    snprintf(bad, sizeof bad, "%s/taken", dir);
    assert_int_equal(mkdir(bad, 0755), 0);
    char inner[4400];
    snprintf(inner, sizeof inner, "%s/x", bad);
    assert_int_equal(mkdir(inner, 0755), 0);
    gp_error_clear(&err);
    assert_int_equal(gp_trace_write(bad, streams, 5, &err), GP_ERR_IO);
    assert_non_null(strstr(err.msg, "rename"));
    list_dir(dir, listing, sizeof listing);
    assert_string_equal(listing, "taken trace.json");
    rmdir(inner);
    rmdir(bad);

    /* An empty timeline is a valid file too. */
    gp_error_clear(&err);
    assert_int_equal(gp_trace_write(path, NULL, 0, &err), GP_OK);
    assert_int_equal(gp_json_parse_file(path, &doc, &err), GP_OK);
    assert_int_equal(gp_jobject_get(doc.root, "traceEvents")->count, 0);
    gp_json_doc_free(&doc);

    unlink(path);
    rmdir(dir);
    free(dir);
}

/* Spans from real streams through the writer. */
static void test_trace_from_streams(void **state)
{
    (void)state;
    struct gp_device *d0 = open_dev(0), *d1 = open_dev(1);
    struct gp_stream *s0 = new_stream(d0, "compute"), *s1 = new_stream(d1, "compute");
    struct gp_event *e = new_event(d0);
    ops->trace_enable(s0, 1);
    ops->trace_enable(s1, 1);
    int c0 = 0, c1 = 0;
    for (int j = 0; j < 4; j++) {
        struct gp_task_tag t = tag(GP_TASK_FORWARD, 0, j, "forward");
        ops->enqueue(s0, inc_task, &c0, &t);
        ops->event_record(e, s0);
        ops->stream_wait(s1, e);
        t.stage = 1;
        ops->enqueue(s1, inc_task, &c1, &t);
    }
    sync_ok(s1);
    sync_ok(s0);
    struct gp_trace_stream st[2] = {{0, "cpu", "compute", NULL, 0}, {1, "cpu", "compute", NULL, 0}};
    st[0].spans = ops->trace_spans(s0, &st[0].count);
    st[1].spans = ops->trace_spans(s1, &st[1].count);
    char *dir = make_temp_dir();
    char path[4200];
    snprintf(path, sizeof path, "%s/t.json", dir);
    struct gp_error err = {0};
    if (gp_trace_write(path, st, 2, &err) != GP_OK) fail_msg("%s", err.msg);
    struct gp_json_doc doc = {0};
    if (gp_json_parse_file(path, &doc, &err) != GP_OK) fail_msg("%s", err.msg);
    const struct gp_jvalue *events = gp_jobject_get(doc.root, "traceEvents");
    double min_ts = 1e300;
    for (int j = 0; j < 4; j++) {
        char name[32];
        snprintf(name, sizeof name, "F s0 m%d", j);
        const struct gp_jvalue *f0 = find_event(events, "X", name, 0, 0);
        snprintf(name, sizeof name, "F s1 m%d", j);
        const struct gp_jvalue *f1 = find_event(events, "X", name, 1, 1);
        /* The wait orders stage 1 after stage 0, on the shared clock. */
        assert_true(num(f1, "ts") >= num(f0, "ts") + num(f0, "dur") - 1e-3);
        if (num(f0, "ts") < min_ts) min_ts = num(f0, "ts");
        assert_true(num(f0, "dur") >= 0);
    }
    assert_true(fabs(min_ts) < 1e-9);
    gp_json_doc_free(&doc);
    unlink(path);
    rmdir(dir);
    free(dir);
    ops->stream_destroy(s0);
    ops->stream_destroy(s1);
    ops->event_destroy(e);
    ops->close(d0);
    ops->close(d1);
}

static void test_span_names(void **state)
{
    (void)state;
    char buf[64];
    struct gp_task_tag t = tag(GP_TASK_COPY, 3, -1, "send gradients");
    gp_trace_span_name(&t, buf, sizeof buf);
    assert_string_equal(buf, "copy s3->s2");
    t = tag(GP_TASK_COPY, 3, 1, NULL);
    gp_trace_span_name(&t, buf, sizeof buf);
    assert_string_equal(buf, "copy s3->s4 m1");
    t = tag(GP_TASK_FORWARD, 12, 345, "forward");
    gp_trace_span_name(&t, buf, 6); /* truncated, terminated */
    assert_string_equal(buf, "F s12");
    t = tag(GP_TASK_OTHER, -1, -1, NULL);
    gp_trace_span_name(&t, buf, sizeof buf);
    assert_string_equal(buf, "other");
}

/* ---- destruction ---- */

static gp_status slow_inc_task(void *arg, struct gp_error *err)
{
    (void)err;
    sleep_us(100);
    atomic_fetch_add((atomic_int *)arg, 1);
    return GP_OK;
}

/* Destroying a stream runs what it has queued; an event destroyed while a
 * wait on it is pending is released only after the wait. */
static void test_destroy_with_queued_work(void **state)
{
    (void)state;
    struct gp_device *dev = open_dev(0);
    struct gp_stream *s = new_stream(dev, "compute"), *t = new_stream(dev, "waiter");
    struct gp_event *e = new_event(dev);
    atomic_int done = 0, after = 0;
    static unsigned char src[4096], dst[4096];
    memset(src, 0x5a, sizeof src);
    ops->trace_enable(s, 1);
    for (int i = 0; i < 200; i++) ops->enqueue(s, slow_inc_task, &done, &other_tag);
    ops->copy(s, dst, src, sizeof dst, NULL);
    ops->event_record(e, s);
    ops->stream_wait(t, e);
    ops->enqueue(t, atomic_inc_task, &after, &other_tag);
    ops->stream_destroy(s);
    assert_int_equal(atomic_load(&done), 200);
    assert_memory_equal(dst, src, sizeof dst);
    int n = 0;
    (void)ops->trace_spans(t, &n); /* t is still usable */
    ops->stream_destroy(t);
    assert_int_equal(atomic_load(&after), 1);
    ops->event_destroy(e);

    /* An event destroyed while its record and a wait on it are queued
     * waits for them, not for the host. */
    s = new_stream(dev, "compute");
    t = new_stream(dev, "waiter");
    e = new_event(dev);
    for (int i = 0; i < 50; i++) ops->enqueue(s, slow_inc_task, &done, &other_tag);
    ops->event_record(e, s);
    ops->stream_wait(t, e);
    ops->enqueue(t, atomic_inc_task, &after, &other_tag);
    ops->event_destroy(e);
    assert_int_equal(atomic_load(&done), 250); /* its record ran */
    sync_ok(t);
    assert_int_equal(atomic_load(&after), 2);
    ops->stream_destroy(s);
    ops->stream_destroy(t);

    /* A failure never synchronized is dropped with the stream. */
    s = new_stream(dev, "failing");
    ops->enqueue(s, fail_task, NULL, &other_tag);
    ops->enqueue(s, atomic_inc_task, &after, &other_tag);
    ops->stream_destroy(s);
    assert_int_equal(atomic_load(&after), 2);
    ops->close(dev);
}

/* ---- many streams, many rounds ---- */

/* Every stream of several devices hands a token to the next in a ring, each
 * round, through events only; the host synchronizes once. */
#define RING_STREAMS 6
#define RING_ROUNDS 300

struct token_arg {
    int *slots; /* [RING_ROUNDS * RING_STREAMS] */
    int round, k;
};

static gp_status token_task(void *arg, struct gp_error *err)
{
    struct token_arg *a = arg;
    int idx = a->round * RING_STREAMS + a->k;
    int prev = idx > 0 ? a->slots[idx - 1] : 0;
    if (prev != idx) return gp_error_set(err, GP_ERR_DEVICE, "slot %d saw %d", idx, prev);
    a->slots[idx] = idx + 1;
    return GP_OK;
}

static void test_token_ring(void **state)
{
    (void)state;
    struct gp_device *d[3] = {open_dev(0), open_dev(1), open_dev(2)};
    struct gp_stream *s[RING_STREAMS];
    struct gp_event *ev[RING_STREAMS];
    for (int k = 0; k < RING_STREAMS; k++) {
        s[k] = new_stream(d[k % 3], k < 3 ? "compute" : "copy");
        ev[k] = new_event(d[k % 3]);
    }
    int *slots = calloc(RING_ROUNDS * RING_STREAMS, sizeof *slots);
    struct token_arg *args = calloc(RING_ROUNDS * RING_STREAMS, sizeof *args);
    assert_non_null(slots);
    assert_non_null(args);
    for (int r = 0; r < RING_ROUNDS; r++)
        for (int k = 0; k < RING_STREAMS; k++) {
            int prev = (k + RING_STREAMS - 1) % RING_STREAMS;
            if (r > 0 || k > 0) ops->stream_wait(s[k], ev[prev]);
            struct token_arg *a = &args[r * RING_STREAMS + k];
            *a = (struct token_arg){slots, r, k};
            ops->enqueue(s[k], token_task, a, &other_tag);
            ops->event_record(ev[k], s[k]);
        }
    struct gp_error err = {0};
    for (int k = 0; k < RING_STREAMS; k++)
        if (sync_within(s[k], &err) != GP_OK) fail_msg("stream %d: %s", k, err.msg);
    assert_int_equal(slots[RING_ROUNDS * RING_STREAMS - 1], RING_ROUNDS * RING_STREAMS);
    for (int k = 0; k < RING_STREAMS; k++) {
        ops->stream_destroy(s[k]);
        ops->event_destroy(ev[k]);
    }
    for (int k = 0; k < 3; k++) ops->close(d[k]);
    free(args);
    free(slots);
}

/* The cores a process takes (util/cpu_cores.h): its affinity mask's CPUs,
 * at most OMP_NUM_THREADS (its first level, where it lists several) when
 * that is a positive number; nonsense in it is ignored. */
static void test_cpu_cores(void **state)
{
    (void)state;
    const char *had = getenv("OMP_NUM_THREADS");
    char *saved = had ? strdup(had) : NULL;
    unsetenv("OMP_NUM_THREADS");
    int all = gp_cpu_cores();
    assert_true(all >= 1);
    assert_true(all <= sysconf(_SC_NPROCESSORS_ONLN));
#ifdef CPU_COUNT
    cpu_set_t set;
    assert_int_equal(sched_getaffinity(0, sizeof set, &set), 0);
    assert_int_equal(all, CPU_COUNT(&set));
#endif
    setenv("OMP_NUM_THREADS", "1", 1);
    assert_int_equal(gp_cpu_cores(), 1);
    setenv("OMP_NUM_THREADS", "1,4", 1);
    assert_int_equal(gp_cpu_cores(), 1);
    setenv("OMP_NUM_THREADS", "100000", 1); /* more than there are: the mask's */
    assert_int_equal(gp_cpu_cores(), all);
    const char *ignored[] = {"0", "-3", "many", ""};
    for (size_t i = 0; i < sizeof ignored / sizeof *ignored; i++) {
        setenv("OMP_NUM_THREADS", ignored[i], 1);
        assert_int_equal(gp_cpu_cores(), all);
    }
    if (saved) setenv("OMP_NUM_THREADS", saved, 1);
    else unsetenv("OMP_NUM_THREADS");
    free(saved);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tasks_in_order),
        cmocka_unit_test(test_devices_run_concurrently),
        cmocka_unit_test(test_stream_wait_chain),
        cmocka_unit_test(test_event_generations),
        cmocka_unit_test(test_event_rerecorded_elsewhere),
        cmocka_unit_test(test_wait_never_recorded),
        cmocka_unit_test(test_error_propagation),
        cmocka_unit_test(test_alloc_and_copy),
        cmocka_unit_test(test_set_threads),
        cmocka_unit_test(test_trace_spans),
        cmocka_unit_test(test_trace_json),
        cmocka_unit_test(test_trace_from_streams),
        cmocka_unit_test(test_span_names),
        cmocka_unit_test(test_destroy_with_queued_work),
        cmocka_unit_test(test_token_ring),
        cmocka_unit_test(test_cpu_cores),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
