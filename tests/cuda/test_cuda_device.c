/* The CUDA device backend (cuda/device.h): memory, copies host<->device and
 * device<->device, streams ordered by events (a copy chain and kernels that
 * would race without the waits), tasks that launch onto the current stream,
 * a failed task poisoning its stream until synchronize, the timeline, and
 * copies between two GPUs when there are two.
 *
 * The kernels spin for a while before they write, so that a missing or
 * misplaced event wait shows up as wrong data rather than passing by luck.
 * Nothing here asserts on a duration.
 *
 * Without a CUDA device the test prints why and exits 77 (a skip). */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda_runtime_api.h>

#include "backend/device.h"
#include "backend/cuda/device.h"

/* test_kernels.cu */
cudaError_t gp_test_add_one(float *x, size_t n, long long spin, cudaStream_t s);
cudaError_t gp_test_fill(float *x, size_t n, float value, long long spin, cudaStream_t s);
void gp_test_bad_launch(cudaStream_t s);

static const struct gp_device_ops *ops = &gp_cuda_device_ops;
static int n_devices;
static bool peer_tested;

#define SPIN 200000LL /* GPU cycles a kernel waits before writing: ~0.1 ms */

/* ---- helpers ---- */

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec * 1e-3;
}

static struct gp_device *open_dev(int index)
{
    struct gp_device *dev = NULL;
    struct gp_error err = {0};
    if (ops->open(index, &dev, &err) != GP_OK) fail_msg("open cuda:%d: %s", index, err.msg);
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

static void *dev_alloc(struct gp_device *dev, size_t bytes)
{
    void *p = ops->alloc(dev, bytes);
    if (!p) fail_msg("alloc of %zu bytes failed", bytes);
    return p;
}

static void sync_ok(struct gp_stream *s)
{
    struct gp_error err = {0};
    if (ops->stream_synchronize(s, &err) != GP_OK) fail_msg("synchronize: %s", err.msg);
}

static struct gp_task_tag tag(enum gp_task_kind kind, int stage, int micro, const char *name)
{
    return (struct gp_task_tag){.kind = kind, .stage = stage, .microbatch = micro, .name = name};
}

static const struct gp_task_tag other_tag = {GP_TASK_OTHER, -1, -1, "test"};

/* ---- tasks ---- */

struct kernel_arg {
    float *x;
    size_t n;
    float value;
    cudaStream_t seen; /* the stream the task was given */
};

static gp_status add_one_task(void *p, struct gp_error *err)
{
    struct kernel_arg *a = p;
    a->seen = gp_cuda_current_stream();
    cudaError_t e = gp_test_add_one(a->x, a->n, SPIN, a->seen);
    if (e != cudaSuccess) return gp_error_set(err, GP_ERR_DEVICE, "add_one: %s", cudaGetErrorString(e));
    return GP_OK;
}

static gp_status fill_task(void *p, struct gp_error *err)
{
    struct kernel_arg *a = p;
    a->seen = gp_cuda_current_stream();
    cudaError_t e = gp_test_fill(a->x, a->n, a->value, SPIN, a->seen);
    if (e != cudaSuccess) return gp_error_set(err, GP_ERR_DEVICE, "fill: %s", cudaGetErrorString(e));
    return GP_OK;
}

static gp_status inc_task(void *p, struct gp_error *err)
{
    (void)err;
    (*(int *)p)++;
    return GP_OK;
}

static gp_status fail_task(void *p, struct gp_error *err)
{
    (void)p;
    return gp_error_set(err, GP_ERR_SHAPE, "boom");
}

static gp_status mute_fail_task(void *p, struct gp_error *err)
{
    (void)p;
    (void)err;
    return GP_ERR_IO;
}

static gp_status bad_launch_task(void *p, struct gp_error *err)
{
    (void)p;
    (void)err;
    gp_test_bad_launch(gp_cuda_current_stream());
    return GP_OK;
}

/* ---- devices and memory ---- */

static void test_open_and_alloc(void **state)
{
    (void)state;
    struct gp_device *dev = NULL;
    struct gp_error err = {0};
    assert_int_equal(ops->open(-1, &dev, &err), GP_ERR_INVALID);
    assert_null(dev);
    assert_non_null(strstr(err.msg, "cuda:-1"));
    gp_error_clear(&err);
    assert_int_equal(ops->open(n_devices, &dev, &err), GP_ERR_INVALID);
    char name[32];
    snprintf(name, sizeof name, "cuda:%d", n_devices);
    assert_non_null(strstr(err.msg, name));

    dev = open_dev(0);
    struct gp_stream *s = new_stream(dev, "memory");
    const size_t sizes[] = {0, 1, 7, 4096, (1u << 20) + 3};
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        size_t bytes = sizes[k];
        unsigned char *p = dev_alloc(dev, bytes);
        assert_int_equal((uintptr_t)p % 64, 0);
        if (bytes) {
            unsigned char *h = malloc(bytes);
            assert_non_null(h);
            memset(h, 0xff, bytes);
            ops->copy(s, h, p, bytes, NULL);
            sync_ok(s);
            for (size_t i = 0; i < bytes; i++)
                if (h[i] != 0) fail_msg("alloc of %zu bytes: byte %zu is %d, not zero", bytes, i, h[i]);
            free(h);
        }
        ops->free(dev, p);
    }

    /* Exhaustion is NULL, not an abort, and leaves no error behind for the
     * next task to be blamed for. */
    assert_null(ops->alloc(dev, SIZE_MAX / 2));
    int ran = 0;
    ops->enqueue(s, inc_task, &ran, &other_tag);
    sync_ok(s);
    assert_int_equal(ran, 1);

    ops->set_threads(dev, 4); /* a no-op on CUDA */
    ops->stream_destroy(s);
    ops->close(dev);
}

/* host -> device -> device -> host, several sizes, checked byte for byte. */
static void test_copy_round_trip(void **state)
{
    (void)state;
    struct gp_device *dev = open_dev(0);
    struct gp_stream *s = new_stream(dev, "copies");
    const size_t sizes[] = {1, 3, 64, 1000, (1u << 22) + 5};
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        size_t bytes = sizes[k];
        unsigned char *src = malloc(bytes), *dst = malloc(bytes);
        assert_non_null(src);
        assert_non_null(dst);
        for (size_t i = 0; i < bytes; i++) src[i] = (unsigned char)(i * 131 + k * 7 + 1);
        memset(dst, 0, bytes);
        void *a = dev_alloc(dev, bytes), *b = dev_alloc(dev, bytes);
        struct gp_task_tag t = tag(GP_TASK_COPY, 0, (int)k, "send");
        ops->copy(s, a, src, bytes, &t);
        ops->copy(s, b, a, bytes, &t);
        ops->copy(s, dst, b, bytes, NULL);
        ops->copy(s, dst, b, 0, NULL); /* nothing to move: a no-op */
        sync_ok(s);
        assert_memory_equal(dst, src, bytes);
        ops->free(dev, a);
        ops->free(dev, b);
        free(src);
        free(dst);
    }
    ops->stream_destroy(s);
    ops->close(dev);
}

/* ---- streams ordered by events ---- */

/* Stream A fills x with the round's value (a kernel that spins first) and
 * copies x to y; stream B waits for A's event and copies y into row r of z.
 * Before overwriting y again, A waits for B's event. The host synchronizes
 * once; every row of z must hold its round's value. */
#define CHAIN_ROUNDS 64
#define CHAIN_N 4096

static void test_copy_chain_two_streams(void **state)
{
    (void)state;
    struct gp_device *dev = open_dev(0);
    struct gp_stream *a = new_stream(dev, "A"), *b = new_stream(dev, "B");
    struct gp_event *ea = new_event(dev), *eb = new_event(dev);
    size_t row = CHAIN_N * sizeof(float);
    float *x = dev_alloc(dev, row), *y = dev_alloc(dev, row);
    float *z = dev_alloc(dev, row * CHAIN_ROUNDS);
    struct kernel_arg args[CHAIN_ROUNDS];
    for (int r = 0; r < CHAIN_ROUNDS; r++) {
        args[r] = (struct kernel_arg){x, CHAIN_N, (float)(r + 1), NULL};
        ops->enqueue(a, fill_task, &args[r], &other_tag);
        ops->stream_wait(a, eb); /* B has read y of the round before */
        ops->copy(a, y, x, row, NULL);
        ops->event_record(ea, a);
        ops->stream_wait(b, ea);
        ops->copy(b, z + (size_t)r * CHAIN_N, y, row, NULL);
        ops->event_record(eb, b);
    }
    float *h = malloc(row * CHAIN_ROUNDS);
    assert_non_null(h);
    ops->copy(b, h, z, row * CHAIN_ROUNDS, NULL);
    sync_ok(b);
    sync_ok(a);
    for (int r = 0; r < CHAIN_ROUNDS; r++)
        for (int i = 0; i < CHAIN_N; i++)
            if (h[(size_t)r * CHAIN_N + i] != (float)(r + 1))
                fail_msg("round %d, element %d: %g, expected %d", r, i, h[(size_t)r * CHAIN_N + i], r + 1);
    assert_non_null(args[0].seen);
    free(h);
    ops->free(dev, x);
    ops->free(dev, y);
    ops->free(dev, z);
    ops->event_destroy(ea);
    ops->event_destroy(eb);
    ops->stream_destroy(a);
    ops->stream_destroy(b);
    ops->close(dev);
}

/* Two streams take turns adding one to the same buffer, each turn waiting
 * for the other's event: the increments are serialized, none is lost. */
#define TURNS 100
#define TURN_N (1u << 18)

static void test_kernels_ordered_by_events(void **state)
{
    (void)state;
    struct gp_device *dev = open_dev(0);
    struct gp_stream *s[2] = {new_stream(dev, "even"), new_stream(dev, "odd")};
    struct gp_event *ev[2] = {new_event(dev), new_event(dev)};
    float *x = dev_alloc(dev, TURN_N * sizeof(float));
    assert_null(gp_cuda_current_stream()); /* outside a task */
    struct kernel_arg args[TURNS];
    for (int r = 0; r < TURNS; r++) {
        int k = r % 2;
        if (r > 0) ops->stream_wait(s[k], ev[1 - k]);
        args[r] = (struct kernel_arg){x, TURN_N, 0, NULL};
        struct gp_task_tag t = tag(GP_TASK_FORWARD, k, r, "add one");
        ops->enqueue(s[k], add_one_task, &args[r], &t);
        ops->event_record(ev[k], s[k]);
    }
    assert_null(gp_cuda_current_stream());
    float *h = malloc(TURN_N * sizeof(float));
    assert_non_null(h);
    ops->stream_wait(s[0], ev[1]);
    ops->copy(s[0], h, x, TURN_N * sizeof(float), NULL);
    sync_ok(s[0]);
    sync_ok(s[1]);
    for (size_t i = 0; i < TURN_N; i++)
        if (h[i] != (float)TURNS) fail_msg("element %zu: %g, expected %d", i, h[i], TURNS);
    /* Each task saw its own stream: one handle per gp_stream, none NULL. */
    assert_non_null(args[0].seen);
    assert_non_null(args[1].seen);
    assert_true(args[0].seen != args[1].seen);
    for (int r = 2; r < TURNS; r++) assert_true(args[r].seen == args[r % 2].seen);
    free(h);
    ops->free(dev, x);
    for (int k = 0; k < 2; k++) {
        ops->event_destroy(ev[k]);
        ops->stream_destroy(s[k]);
    }
    ops->close(dev);
}

/* A wait on an event never recorded is a no-op, as in CUDA. */
static void test_wait_never_recorded(void **state)
{
    (void)state;
    struct gp_device *dev = open_dev(0);
    struct gp_stream *s = new_stream(dev, "s");
    struct gp_event *e = new_event(dev);
    int ran = 0;
    ops->stream_wait(s, e);
    ops->enqueue(s, inc_task, &ran, &other_tag);
    sync_ok(s);
    assert_int_equal(ran, 1);
    ops->event_destroy(e);
    ops->stream_destroy(s);
    ops->close(dev);
}

/* ---- errors ---- */

static void test_error_propagation(void **state)
{
    (void)state;
    struct gp_device *dev = open_dev(0);
    struct gp_stream *s0 = new_stream(dev, "compute"), *s1 = new_stream(dev, "waiter");
    struct gp_event *e = new_event(dev);
    int before = 0, after = 0, waiter = 0;
    unsigned char src[16], dst[16];
    memset(src, 0xab, sizeof src);
    unsigned char *d = dev_alloc(dev, sizeof src);
    ops->trace_enable(s0, 1);

    ops->enqueue(s0, inc_task, &before, &other_tag);
    struct gp_task_tag ft = tag(GP_TASK_FORWARD, 1, 0, "forward");
    ops->enqueue(s0, fail_task, NULL, &ft);
    ops->enqueue(s0, inc_task, &after, &other_tag);
    ops->copy(s0, d, src, sizeof src, NULL);
    ops->event_record(e, s0);
    ops->stream_wait(s1, e);
    ops->enqueue(s1, inc_task, &waiter, &other_tag);

    /* The waiting stream goes on although s0 failed before its record. */
    sync_ok(s1);
    assert_int_equal(waiter, 1);

    struct gp_error err = {0};
    gp_status st = ops->stream_synchronize(s0, &err);
    assert_int_equal(st, GP_ERR_SHAPE);
    assert_int_equal(err.status, GP_ERR_SHAPE);
    assert_non_null(strstr(err.msg, "boom"));
    assert_int_equal(before, 1);
    assert_int_equal(after, 0); /* skipped */
    memset(dst, 0x55, sizeof dst);
    ops->copy(s1, dst, d, sizeof dst, NULL);
    sync_ok(s1);
    for (size_t i = 0; i < sizeof dst; i++) assert_int_equal(dst[i], 0); /* the copy was skipped */
    int n = 0;
    const struct gp_trace_span *sp = ops->trace_spans(s0, &n);
    assert_int_equal(n, 2); /* the task before and the failed one; nothing skipped */
    assert_int_equal(sp[1].tag.kind, GP_TASK_FORWARD);

    /* Reported once, then the stream works again. */
    ops->enqueue(s0, inc_task, &after, &other_tag);
    ops->copy(s0, d, src, sizeof src, NULL);
    ops->copy(s0, dst, d, sizeof dst, NULL);
    sync_ok(s0);
    assert_int_equal(after, 1);
    assert_memory_equal(dst, src, sizeof dst);
    sync_ok(s0);

    /* A task that fails without a message is still named. */
    struct gp_task_tag mt = tag(GP_TASK_BACKWARD, 4, 7, "mystery");
    ops->enqueue(s0, mute_fail_task, NULL, &mt);
    ops->enqueue(s0, mute_fail_task, NULL, &other_tag); /* skipped: only the first is reported */
    gp_error_clear(&err);
    st = ops->stream_synchronize(s0, &err);
    assert_int_equal(st, GP_ERR_IO);
    assert_non_null(strstr(err.msg, "mystery"));
    assert_non_null(strstr(err.msg, "stage 4"));
    assert_non_null(strstr(err.msg, "cuda:0"));
    sync_ok(s0);

    /* A launch that failed and that the task did not check is caught after
     * the task, named after it, and skips what follows. */
    struct gp_task_tag bt = tag(GP_TASK_FORWARD, 2, 3, "careless");
    ops->enqueue(s0, bad_launch_task, NULL, &bt);
    ops->enqueue(s0, inc_task, &after, &other_tag);
    gp_error_clear(&err);
    st = ops->stream_synchronize(s0, &err);
    assert_int_equal(st, GP_ERR_DEVICE);
    assert_non_null(strstr(err.msg, "careless"));
    assert_non_null(strstr(err.msg, "compute"));
    assert_int_equal(after, 1);
    ops->enqueue(s0, inc_task, &after, &other_tag);
    sync_ok(s0);
    assert_int_equal(after, 2);

    /* A failure never synchronized is dropped with the stream. */
    struct gp_stream *s2 = new_stream(dev, "failing");
    ops->enqueue(s2, fail_task, NULL, &other_tag);
    ops->stream_destroy(s2);

    ops->free(dev, d);
    ops->event_destroy(e);
    ops->stream_destroy(s0);
    ops->stream_destroy(s1);
    ops->close(dev);
}

/* ---- the timeline ---- */

static void check_span(const struct gp_trace_span *sp, double lo, double hi)
{
    if (!(sp->end_us >= sp->start_us)) fail_msg("span '%s' ends before it starts", sp->tag.name);
    /* The spans are on the host clock: inside the window the host saw, with
     * a millisecond for the distance between the two clocks. */
    if (sp->start_us < lo - 1000 || sp->end_us > hi + 1000)
        fail_msg("span '%s' [%.1f, %.1f] us lies outside the host's window [%.1f, %.1f]", sp->tag.name,
                 sp->start_us, sp->end_us, lo, hi);
}

static void test_trace_spans(void **state)
{
    (void)state;
    struct gp_device *dev = open_dev(0);
    struct gp_stream *s = new_stream(dev, "compute"), *t = new_stream(dev, "other");
    struct gp_event *e = new_event(dev);
    float *x = dev_alloc(dev, 1024 * sizeof(float)), *y = dev_alloc(dev, 1024 * sizeof(float));
    struct kernel_arg ka = {x, 1024, 0, NULL};

    /* Off by default: nothing recorded. */
    ops->enqueue(s, add_one_task, &ka, &other_tag);
    ops->copy(s, y, x, 1024 * sizeof(float), NULL);
    sync_ok(s);
    int n = -1;
    (void)ops->trace_spans(s, &n);
    assert_int_equal(n, 0);

    ops->trace_enable(s, 1);
    ops->trace_enable(t, 1);
    double lo = now_us();
    struct gp_task_tag fwd = tag(GP_TASK_FORWARD, 0, 0, "forward");
    struct gp_task_tag cp = tag(GP_TASK_COPY, 0, 0, "send");
    struct gp_task_tag bwd = tag(GP_TASK_BACKWARD, 0, 1, "backward");
    struct gp_task_tag oth = tag(GP_TASK_OPTIMIZER, 1, -1, "after");
    ops->enqueue(s, add_one_task, &ka, &fwd);
    ops->copy(s, y, x, 1024 * sizeof(float), &cp);
    ops->enqueue(s, add_one_task, &ka, &bwd);
    ops->event_record(e, s);
    ops->stream_wait(t, e);
    ops->enqueue(t, add_one_task, &ka, &oth);
    sync_ok(s);
    sync_ok(t);
    double hi = now_us();

    const struct gp_trace_span *sp = ops->trace_spans(s, &n);
    assert_int_equal(n, 3);
    assert_int_equal(sp[0].tag.kind, GP_TASK_FORWARD);
    assert_string_equal(sp[0].tag.name, "forward");
    assert_int_equal(sp[1].tag.kind, GP_TASK_COPY);
    assert_int_equal(sp[2].tag.kind, GP_TASK_BACKWARD);
    assert_int_equal(sp[2].tag.microbatch, 1);
    for (int i = 0; i < n; i++) check_span(&sp[i], lo, hi);
    /* A spinning kernel takes some time; a copy may take none. */
    assert_true(sp[0].end_us > sp[0].start_us);
    assert_true(sp[2].end_us > sp[2].start_us);
    /* In stream order: each starts no earlier than the one before ends
     * (the events' resolution is about half a microsecond). */
    for (int i = 1; i < n; i++)
        if (sp[i].start_us < sp[i - 1].end_us - 1.0)
            fail_msg("span %d starts at %.2f, before span %d ends at %.2f", i, sp[i].start_us, i - 1,
                     sp[i - 1].end_us);

    int nt = 0;
    const struct gp_trace_span *spt = ops->trace_spans(t, &nt);
    assert_int_equal(nt, 1);
    assert_int_equal(spt[0].tag.stage, 1);
    check_span(&spt[0], lo, hi);
    /* The waiting stream's task starts after what it waited for, on the
     * shared clock. */
    if (spt[0].start_us < sp[2].end_us - 1.0)
        fail_msg("the waiting stream's span starts at %.2f, before the awaited one ends at %.2f",
                 spt[0].start_us, sp[2].end_us);

    /* Stopped: no new spans, and the array handed out stays valid across
     * another call. */
    double first_end = sp[2].end_us;
    ops->trace_enable(s, 0);
    ops->enqueue(s, add_one_task, &ka, &fwd);
    sync_ok(s);
    int n2 = 0;
    const struct gp_trace_span *sp2 = ops->trace_spans(s, &n2);
    assert_int_equal(n2, 3);
    assert_true(sp[2].end_us == first_end);
    assert_true(sp2[2].end_us == first_end);

    /* A new start clears. */
    ops->trace_enable(s, 1);
    (void)ops->trace_spans(s, &n2);
    assert_int_equal(n2, 0);
    ops->enqueue(s, inc_task, &(int){0}, &other_tag);
    sync_ok(s);
    (void)ops->trace_spans(s, &n2);
    assert_int_equal(n2, 1);

    /* Many spans: the record array grows. */
    for (int i = 0; i < 600; i++) ops->copy(s, y, x, sizeof(float), &cp);
    sync_ok(s);
    sp = ops->trace_spans(s, &n2);
    assert_int_equal(n2, 601);
    for (int i = 1; i < n2; i++) assert_true(sp[i].start_us >= sp[i - 1].end_us - 1.0);

    ops->free(dev, x);
    ops->free(dev, y);
    ops->event_destroy(e);
    ops->stream_destroy(s);
    ops->stream_destroy(t);
    ops->close(dev);
}

/* ---- two GPUs ---- */

/* The chain of test_copy_chain_two_streams across GPUs: a stream of cuda:0
 * fills a0 and copies it into b1 on cuda:1; a stream of cuda:1 waits and
 * copies b1 into row r of z1. The events live on cuda:1 and are recorded on
 * streams of both devices. Then everything comes back to the host. */
static void test_peer_copies(void **state)
{
    (void)state;
    if (n_devices < 2) {
        print_message("peer copies: one device only, skipped\n");
        skip();
    }
    struct gp_device *d0 = open_dev(0), *d1 = open_dev(1);
    struct gp_stream *s0 = new_stream(d0, "copy 0->1"), *s1 = new_stream(d1, "compute 1");
    struct gp_event *e0 = new_event(d1), *e1 = new_event(d1);
    size_t row = CHAIN_N * sizeof(float);
    float *a0 = dev_alloc(d0, row), *b1 = dev_alloc(d1, row), *z1 = dev_alloc(d1, row * CHAIN_ROUNDS);
    struct kernel_arg args[CHAIN_ROUNDS];
    for (int r = 0; r < CHAIN_ROUNDS; r++) {
        args[r] = (struct kernel_arg){a0, CHAIN_N, (float)(3 * r + 2), NULL};
        ops->enqueue(s0, fill_task, &args[r], &other_tag);
        ops->stream_wait(s0, e1);
        ops->copy(s0, b1, a0, row, NULL);
        ops->event_record(e0, s0);
        ops->stream_wait(s1, e0);
        ops->copy(s1, z1 + (size_t)r * CHAIN_N, b1, row, NULL);
        ops->event_record(e1, s1);
    }
    float *h = malloc(row * CHAIN_ROUNDS);
    assert_non_null(h);
    ops->copy(s1, h, z1, row * CHAIN_ROUNDS, NULL);
    sync_ok(s1);
    sync_ok(s0);
    for (int r = 0; r < CHAIN_ROUNDS; r++)
        for (int i = 0; i < CHAIN_N; i++)
            if (h[(size_t)r * CHAIN_N + i] != (float)(3 * r + 2))
                fail_msg("round %d, element %d: %g, expected %d", r, i, h[(size_t)r * CHAIN_N + i], 3 * r + 2);

    /* And back: cuda:1 -> cuda:0 on a stream of cuda:1. */
    ops->stream_wait(s1, e0);
    ops->copy(s1, a0, z1 + (size_t)5 * CHAIN_N, row, NULL);
    ops->event_record(e1, s1);
    ops->stream_wait(s0, e1);
    ops->copy(s0, h, a0, row, NULL);
    sync_ok(s0);
    sync_ok(s1);
    for (int i = 0; i < CHAIN_N; i++) assert_true(h[i] == (float)(3 * 5 + 2));
    peer_tested = true;

    free(h);
    ops->free(d0, a0);
    ops->free(d1, b1);
    ops->free(d1, z1);
    ops->event_destroy(e0);
    ops->event_destroy(e1);
    ops->stream_destroy(s0);
    ops->stream_destroy(s1);
    ops->close(d0);
    ops->close(d1);
}

int main(void)
{
    cudaError_t e = cudaGetDeviceCount(&n_devices);
    if (e != cudaSuccess || n_devices == 0) {
        printf("skipped: no CUDA device (%s)\n", e != cudaSuccess ? cudaGetErrorString(e) : "none visible");
        return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_open_and_alloc),
        cmocka_unit_test(test_copy_round_trip),
        cmocka_unit_test(test_copy_chain_two_streams),
        cmocka_unit_test(test_kernels_ordered_by_events),
        cmocka_unit_test(test_wait_never_recorded),
        cmocka_unit_test(test_error_propagation),
        cmocka_unit_test(test_trace_spans),
        cmocka_unit_test(test_peer_copies),
    };
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    int total = (int)(sizeof tests / sizeof tests[0]);
    if (failed == 0)
        printf("cuda_device: PASSED, %d of %d tests on %d device(s); peer copies %s\n",
               peer_tested ? total : total - 1, total, n_devices,
               peer_tested ? "tested between cuda:0 and cuda:1" : "skipped (one device)");
    else
        printf("cuda_device: %d of %d tests FAILED on %d device(s)\n", failed, total, n_devices);
    return failed ? 1 : 0;
}
