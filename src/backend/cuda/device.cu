/* The CUDA backend of the device interface (backend/device.h, cuda/device.h).
 *
 * A device is a GPU index; opening it enables peer access to every other
 * visible GPU that can take it, so that copies between stages go over
 * NVLink/PCIe directly. A stream is a CUDA stream created non-blocking: it
 * never synchronizes with the legacy default stream, which nothing here uses.
 *
 * Tasks: enqueue runs fn(arg) at once on the calling host thread, with the
 * stream's device current and the stream published in a thread-local that
 * gp_cuda_current_stream() reads; the task launches its work onto that stream
 * and returns. The GPU runs it in stream order later. After the task, CUDA's
 * last error is read, so a launch that failed and that the task did not
 * check is still reported, named after the task.
 *
 * Errors: the first failure of a stream (a task's error, or a CUDA call made
 * for the stream: a copy, an event, a synchronize that reports an earlier
 * asynchronous fault) is kept; later tasks and copies on the stream are
 * skipped, but event records and waits still happen, so no other stream
 * waits forever. stream_synchronize returns that error and clears it, after
 * which the stream runs work again (unless the fault was one CUDA keeps for
 * the life of the process, such as an illegal address in a kernel).
 *
 * Events: CUDA records an event only on a stream of the event's own device,
 * while the interface lets any stream record any event. An event therefore
 * holds one CUDA event per device, made on the first record there, and
 * remembers which device recorded it last; stream_wait waits for that one,
 * which is exactly "the latest record as of this call".
 *
 * The timeline: while tracing is on, each task and copy is bracketed by two
 * timing events on its stream (reused from one trace start to the next).
 * trace_spans waits for them and converts them to microseconds of the host's
 * CLOCK_MONOTONIC, the clock the CPU backend uses: each device has a
 * reference event, recorded on an idle stream and waited for, whose host
 * time is read at that moment; a span is that host time plus the GPU time
 * elapsed since the reference. Streams of one device that share a reference
 * line up exactly; across devices, and across references, they agree within
 * the few microseconds the host takes to see an event complete.
 * cudaEventElapsedTime returns float milliseconds, whose resolution decays
 * with the distance from the reference (6 us after 100 s), so a trace start
 * that finds its device's reference older than REF_REFRESH_S makes a new
 * one; streams keep the reference they started with until their next start.
 *
 * Memory: cudaMalloc (256-byte aligned, above the interface's 64), zeroed on
 * a stream of its own and waited for, so that the zeros are in place before
 * any non-blocking stream touches the memory. Allocation happens before the
 * step loop, so the wait costs nothing that matters.
 *
 * Host memory in copies: pageable host memory is read or written when copy
 * is called (CUDA stages it then); pinned memory moves in stream order. */
#include "backend/cuda/device.h"

#include <cuda_runtime.h>
#include <nvtx3/nvToolsExt.h>
#include <nvtx3/nvToolsExtCudaRt.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_DEVICES 64    /* an event's per-device slots; far above one host's GPUs */
#define SPANS_INITIAL 256
#define REF_REFRESH_S 10.0

static thread_local cudaStream_t tl_current_stream = NULL;

extern "C" cudaStream_t gp_cuda_current_stream(void) { return tl_current_stream; }

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec * 1e-3;
}

struct gp_device {
    int index;
};

/* A time reference of one device: a completed timing event and the host
 * time at which it completed. Streams that trace hold a reference to it. */
struct time_ref {
    cudaEvent_t event;
    double host_us;
    int users;     /* streams whose current trace uses it */
    bool current;  /* still the one new trace starts on its device take */
};

static pthread_mutex_t ref_mu = PTHREAD_MUTEX_INITIALIZER;
static struct time_ref *device_ref[MAX_DEVICES];

/* One traced task or copy: two timing events on its stream. */
struct span_rec {
    struct gp_task_tag tag;
    cudaEvent_t t0, t1;
    bool done; /* both events recorded */
};

/* Arrays handed out by trace_spans; kept until the next trace start (the
 * interface promises they stay valid that long). */
struct span_out {
    struct span_out *prev;
    struct gp_trace_span *spans; /* points just past this header */
};

struct gp_stream {
    struct gp_device *dev;
    char name[64];
    cudaStream_t stream;

    pthread_mutex_t mu;  /* guards everything below */
    bool failed;         /* skip tasks and copies until synchronize */
    struct gp_error err; /* the first failure, while failed */

    bool trace_on;
    struct time_ref *ref; /* the reference of the current trace; NULL before the first */
    struct span_rec *recs;
    int n_recs, cap_recs;
    int n_made;           /* recs[0..n_made) own created events, reused across trace starts */
    struct span_out *outs;
};

struct gp_event {
    pthread_mutex_t mu;
    int last;                      /* the device that recorded it last; -1: never */
    cudaEvent_t ev[MAX_DEVICES];   /* made on the first record on each device */
};

/* ---- errors ---- */

/* Fills err with "<where>: <call>: <CUDA's name> (<CUDA's text>)". CUDA
 * remembers a failed call as the thread's last error; it is cleared here,
 * where it was reported, so that the check after the next task does not
 * blame that task for it. */
static gp_status cuda_error(struct gp_error *err, cudaError_t e, const char *where, const char *call)
{
    (void)cudaGetLastError();
    return gp_error_set(err, GP_ERR_DEVICE, "%s: %s: %s (%s)", where, call, cudaGetErrorName(e),
                        cudaGetErrorString(e));
}

static gp_status dev_check(struct gp_error *err, cudaError_t e, int index, const char *call)
{
    if (e == cudaSuccess) return GP_OK;
    char where[32];
    snprintf(where, sizeof where, "cuda:%d", index);
    return cuda_error(err, e, where, call);
}

/* Caller holds s->mu. Keeps the first failure only. */
static void fail_locked(struct gp_stream *s, const struct gp_error *err)
{
    if (s->failed) return;
    s->failed = true;
    s->err = *err;
}

static void fail(struct gp_stream *s, const struct gp_error *err)
{
    pthread_mutex_lock(&s->mu);
    fail_locked(s, err);
    pthread_mutex_unlock(&s->mu);
}

/* Formats the failure of a CUDA call made for stream s; `call` may carry
 * what it was about ("cudaMemcpyAsync of 4096 bytes for 'send'"). */
static void stream_error(struct gp_error *out, struct gp_stream *s, cudaError_t e, const char *call)
{
    char where[128];
    snprintf(where, sizeof where, "stream '%s' of cuda:%d", s->name, s->dev->index);
    out->status = GP_OK;
    out->msg[0] = '\0';
    cuda_error(out, e, where, call);
}

/* Records a failed CUDA call on the stream; true when e is success. */
static bool stream_check(struct gp_stream *s, cudaError_t e, const char *call)
{
    if (e == cudaSuccess) return true;
    struct gp_error err;
    stream_error(&err, s, e, call);
    fail(s, &err);
    return false;
}

static bool stream_failed(struct gp_stream *s)
{
    pthread_mutex_lock(&s->mu);
    bool f = s->failed;
    pthread_mutex_unlock(&s->mu);
    return f;
}

/* ---- devices and memory ---- */

static pthread_mutex_t peer_mu = PTHREAD_MUTEX_INITIALIZER;
static bool peer_enabled[MAX_DEVICES]; /* the device's peer access is set up */

/* Enables access from device `index` (current) to every peer that can. */
static gp_status enable_peers(int index, int n, struct gp_error *err)
{
    cudaError_t e;
    for (int j = 0; j < n; j++) {
        if (j == index) continue;
        int can = 0;
        char call[64];
        snprintf(call, sizeof call, "cudaDeviceCanAccessPeer(cuda:%d)", j);
        GP_TRY(dev_check(err, cudaDeviceCanAccessPeer(&can, index, j), index, call));
        if (!can) continue;
        e = cudaDeviceEnablePeerAccess(j, 0);
        if (e == cudaErrorPeerAccessAlreadyEnabled) {
            (void)cudaGetLastError();
            continue;
        }
        snprintf(call, sizeof call, "cudaDeviceEnablePeerAccess(cuda:%d)", j);
        GP_TRY(dev_check(err, e, index, call));
    }
    return GP_OK;
}

static gp_status cuda_open(int index, struct gp_device **out, struct gp_error *err)
{
    *out = NULL;
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) return dev_check(err, e, index, "cudaGetDeviceCount");
    if (index < 0 || index >= n)
        return gp_error_set(err, GP_ERR_INVALID, "cuda:%d: no such device (%d visible)", index, n);
    if (index >= MAX_DEVICES)
        return gp_error_set(err, GP_ERR_UNSUPPORTED, "cuda:%d: this build handles %d devices at most",
                            index, MAX_DEVICES);
    GP_TRY(dev_check(err, cudaSetDevice(index), index, "cudaSetDevice"));
    /* Peer access is per direction: this enables index -> j. Copies work
     * without it too (CUDA stages them through the host), only slower, so a
     * pair that cannot is not an error. It lasts as long as the process, so
     * later opens of the device skip it. */
    pthread_mutex_lock(&peer_mu);
    gp_status st = peer_enabled[index] ? GP_OK : enable_peers(index, n, err);
    if (st == GP_OK) peer_enabled[index] = true;
    pthread_mutex_unlock(&peer_mu);
    if (st != GP_OK) return st;
    struct gp_device *dev = (struct gp_device *)calloc(1, sizeof *dev);
    if (!dev) return gp_error_set(err, GP_ERR_NOMEM, "cuda:%d: out of memory", index);
    dev->index = index;
    *out = dev;
    return GP_OK;
}

/* Streams, events and memory of the device must be gone first. Peer access
 * stays enabled: it belongs to the process's context, not to this handle. */
static void cuda_close(struct gp_device *dev) { free(dev); }

/* NULL on any failure, out of memory or other: the caller names the stage
 * and the bytes. The CUDA error is cleared, so that it is not reported again
 * against the next task. */
static void *cuda_alloc(struct gp_device *dev, size_t bytes)
{
    if (cudaSetDevice(dev->index) != cudaSuccess) {
        (void)cudaGetLastError();
        return NULL;
    }
    void *p = NULL;
    if (bytes == 0) bytes = 1; /* a distinct pointer, as the CPU backend gives */
    if (cudaMalloc(&p, bytes) != cudaSuccess) {
        (void)cudaGetLastError();
        return NULL;
    }
    if (cudaMemsetAsync(p, 0, bytes, cudaStreamPerThread) != cudaSuccess ||
        cudaStreamSynchronize(cudaStreamPerThread) != cudaSuccess) {
        (void)cudaGetLastError();
        (void)cudaFree(p);
        return NULL;
    }
    return p;
}

/* cudaFree waits for the device's work on the memory; an error it returns
 * (a fault of earlier work) has no caller to go to and is cleared. */
static void cuda_free(struct gp_device *dev, void *ptr)
{
    if (!ptr) return;
    if (cudaSetDevice(dev->index) != cudaSuccess || cudaFree(ptr) != cudaSuccess)
        (void)cudaGetLastError();
}

static void cuda_set_threads(struct gp_device *dev, int threads)
{
    (void)dev;
    (void)threads;
}

/* Free device memory as the driver reports it; 0 when it cannot. */
static size_t cuda_mem_available(struct gp_device *dev)
{
    size_t free_bytes = 0, total = 0;
    if (cudaSetDevice(dev->index) != cudaSuccess || cudaMemGetInfo(&free_bytes, &total) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return free_bytes;
}

extern "C" cudaStream_t gp_cuda_stream_of(struct gp_stream *s) { return s->stream; }
extern "C" int gp_cuda_device_index(struct gp_device *dev) { return dev->index; }

/* ---- the timeline: references ---- */

/* Caller holds ref_mu. */
static void ref_release_locked(struct time_ref *r)
{
    if (!r) return;
    r->users--;
    if (r->users == 0 && !r->current) {
        (void)cudaEventDestroy(r->event);
        free(r);
    }
}

/* The reference a trace start on stream s takes: the device's current one,
 * or a new one when there is none or it is older than REF_REFRESH_S. */
static struct time_ref *ref_acquire(struct gp_stream *s, struct gp_error *err)
{
    int d = s->dev->index;
    pthread_mutex_lock(&ref_mu);
    struct time_ref *r = device_ref[d];
    if (!r || now_us() - r->host_us > REF_REFRESH_S * 1e6) {
        struct time_ref *nr = (struct time_ref *)calloc(1, sizeof *nr);
        cudaStream_t idle = NULL;
        cudaError_t e = cudaSuccess;
        const char *call = "";
        if (!nr) {
            pthread_mutex_unlock(&ref_mu);
            gp_error_set(err, GP_ERR_NOMEM, "stream '%s' of cuda:%d: out of memory starting a trace",
                         s->name, d);
            return NULL;
        }
        /* On a stream of its own, the event completes as soon as it is
         * recorded; the host time read right after the wait is its time. */
        if ((e = cudaStreamCreateWithFlags(&idle, cudaStreamNonBlocking)) != cudaSuccess)
            call = "cudaStreamCreateWithFlags (trace reference)";
        else if ((e = cudaEventCreate(&nr->event)) != cudaSuccess)
            call = "cudaEventCreate (trace reference)";
        else if ((e = cudaEventRecord(nr->event, idle)) != cudaSuccess)
            call = "cudaEventRecord (trace reference)";
        else if ((e = cudaEventSynchronize(nr->event)) != cudaSuccess)
            call = "cudaEventSynchronize (trace reference)";
        nr->host_us = now_us();
        if (idle) (void)cudaStreamDestroy(idle);
        if (e != cudaSuccess) {
            if (nr->event) (void)cudaEventDestroy(nr->event);
            free(nr);
            pthread_mutex_unlock(&ref_mu);
            stream_error(err, s, e, call);
            return NULL;
        }
        if (r) {
            r->current = false;
            if (r->users == 0) {
                (void)cudaEventDestroy(r->event);
                free(r);
            }
        }
        nr->current = true;
        device_ref[d] = r = nr;
    }
    r->users++;
    pthread_mutex_unlock(&ref_mu);
    return r;
}

/* ---- the timeline: spans ---- */

static void free_outs(struct gp_stream *s)
{
    for (struct span_out *o = s->outs, *prev; o; o = prev) {
        prev = o->prev;
        free(o);
    }
    s->outs = NULL;
}

/* Opens a span: returns its index with its start event recorded, or -1 when
 * not tracing. The stream's device is current. A span that finds no host
 * memory is dropped (the timeline is a diagnostic); a CUDA failure fails the
 * stream, since the device is in trouble anyway. */
static int span_begin(struct gp_stream *s, const struct gp_task_tag *tag)
{
    pthread_mutex_lock(&s->mu);
    int idx = -1;
    if (!s->trace_on) goto out;
    if (s->n_recs == s->cap_recs) {
        int ncap = s->cap_recs ? s->cap_recs * 2 : SPANS_INITIAL;
        struct span_rec *r = (struct span_rec *)realloc(s->recs, (size_t)ncap * sizeof *r);
        if (!r) goto out;
        s->recs = r;
        s->cap_recs = ncap;
    }
    {
        struct span_rec *r = &s->recs[s->n_recs];
        struct gp_error err;
        if (s->n_recs == s->n_made) {
            cudaError_t e = cudaEventCreate(&r->t0);
            if (e == cudaSuccess) {
                e = cudaEventCreate(&r->t1);
                if (e != cudaSuccess) (void)cudaEventDestroy(r->t0);
            }
            if (e != cudaSuccess) {
                stream_error(&err, s, e, "cudaEventCreate (trace)");
                fail_locked(s, &err);
                goto out;
            }
            s->n_made++;
        }
        cudaError_t e = cudaEventRecord(r->t0, s->stream);
        if (e != cudaSuccess) {
            stream_error(&err, s, e, "cudaEventRecord (trace start)");
            fail_locked(s, &err);
            goto out;
        }
        r->tag = *tag;
        r->done = false;
        idx = s->n_recs++;
    }
out:
    pthread_mutex_unlock(&s->mu);
    return idx;
}

static void span_end(struct gp_stream *s, int idx)
{
    if (idx < 0) return;
    pthread_mutex_lock(&s->mu);
    /* A trace restarted by the task itself leaves nothing to close. */
    if (idx < s->n_recs) {
        cudaError_t e = cudaEventRecord(s->recs[idx].t1, s->stream);
        if (e == cudaSuccess) {
            s->recs[idx].done = true;
        } else {
            struct gp_error err;
            stream_error(&err, s, e, "cudaEventRecord (trace end)");
            fail_locked(s, &err);
        }
    }
    pthread_mutex_unlock(&s->mu);
}

static void cuda_trace_enable(struct gp_stream *s, int enabled)
{
    if (!enabled) {
        pthread_mutex_lock(&s->mu);
        s->trace_on = false;
        pthread_mutex_unlock(&s->mu);
        return;
    }
    if (!stream_check(s, cudaSetDevice(s->dev->index), "cudaSetDevice")) return;
    struct gp_error err;
    err.status = GP_OK;
    err.msg[0] = '\0';
    struct time_ref *r = ref_acquire(s, &err);
    if (!r) {
        fail(s, &err);
        return;
    }
    pthread_mutex_lock(&s->mu);
    pthread_mutex_lock(&ref_mu);
    ref_release_locked(s->ref);
    pthread_mutex_unlock(&ref_mu);
    s->ref = r;
    s->n_recs = 0;
    free_outs(s);
    s->trace_on = true;
    pthread_mutex_unlock(&s->mu);
}

/* Waits for the spans' end events (not for the rest of the stream). A CUDA
 * failure here fails the stream and returns the spans converted so far. */
static const struct gp_trace_span *cuda_trace_spans(struct gp_stream *s, int *count)
{
    *count = 0;
    pthread_mutex_lock(&s->mu);
    if (s->n_recs == 0 || !s->ref) {
        const struct gp_trace_span *p = s->outs ? s->outs->spans : NULL;
        pthread_mutex_unlock(&s->mu);
        return p;
    }
    struct span_out *o =
        (struct span_out *)malloc(sizeof *o + (size_t)s->n_recs * sizeof(struct gp_trace_span));
    if (!o) {
        pthread_mutex_unlock(&s->mu);
        return NULL;
    }
    o->spans = (struct gp_trace_span *)(o + 1);
    int n = 0;
    for (int i = 0; i < s->n_recs; i++) {
        const struct span_rec *r = &s->recs[i];
        if (!r->done) continue;
        float ms0 = 0, ms1 = 0;
        cudaError_t e = cudaEventSynchronize(r->t1);
        const char *call = "cudaEventSynchronize (trace)";
        if (e == cudaSuccess) {
            call = "cudaEventElapsedTime (trace)";
            e = cudaEventElapsedTime(&ms0, s->ref->event, r->t0);
            if (e == cudaSuccess) e = cudaEventElapsedTime(&ms1, s->ref->event, r->t1);
        }
        if (e != cudaSuccess) {
            struct gp_error err;
            stream_error(&err, s, e, call);
            fail_locked(s, &err);
            break;
        }
        o->spans[n].tag = r->tag;
        o->spans[n].start_us = s->ref->host_us + (double)ms0 * 1e3;
        o->spans[n].end_us = s->ref->host_us + (double)ms1 * 1e3;
        n++;
    }
    o->prev = s->outs;
    s->outs = o;
    *count = n;
    pthread_mutex_unlock(&s->mu);
    return o->spans;
}

/* ---- streams ---- */

static gp_status cuda_stream_create(struct gp_device *dev, const char *name, struct gp_stream **out,
                                    struct gp_error *err)
{
    *out = NULL;
    GP_TRY(dev_check(err, cudaSetDevice(dev->index), dev->index, "cudaSetDevice"));
    struct gp_stream *s = (struct gp_stream *)calloc(1, sizeof *s);
    if (!s)
        return gp_error_set(err, GP_ERR_NOMEM, "cuda:%d: out of memory creating stream '%s'", dev->index,
                            name ? name : "");
    s->dev = dev;
    snprintf(s->name, sizeof s->name, "%s", name ? name : "");
    cudaError_t e = cudaStreamCreateWithFlags(&s->stream, cudaStreamNonBlocking);
    if (e != cudaSuccess) {
        free(s);
        char call[128];
        snprintf(call, sizeof call, "cudaStreamCreateWithFlags (stream '%s')", name ? name : "");
        return dev_check(err, e, dev->index, call);
    }
    pthread_mutex_init(&s->mu, NULL);
    char label[96];
    snprintf(label, sizeof label, "cuda:%d %s", dev->index, s->name);
    nvtxNameCudaStreamA(s->stream, label);
    *out = s;
    return GP_OK;
}

/* Waits for what is queued, as the CPU backend does, so that memory the
 * stream used can be freed right after. An error not yet reported by
 * synchronize is dropped. */
static void cuda_stream_destroy(struct gp_stream *s)
{
    if (!s) return;
    if (cudaSetDevice(s->dev->index) != cudaSuccess || cudaStreamSynchronize(s->stream) != cudaSuccess)
        (void)cudaGetLastError();
    for (int i = 0; i < s->n_made; i++) {
        (void)cudaEventDestroy(s->recs[i].t0);
        (void)cudaEventDestroy(s->recs[i].t1);
    }
    if (cudaStreamDestroy(s->stream) != cudaSuccess) (void)cudaGetLastError();
    pthread_mutex_lock(&ref_mu);
    ref_release_locked(s->ref);
    pthread_mutex_unlock(&ref_mu);
    free(s->recs);
    free_outs(s);
    pthread_mutex_destroy(&s->mu);
    free(s);
}

/* An NVTX range per task and copy, named like the trace's spans ("forward
 * s1 mb3"), so Nsight Systems shows the schedule on the host timeline
 * beside the kernels it launched. NVTX costs nothing without a profiler. */
static void nvtx_push(const struct gp_task_tag *t)
{
    char label[96];
    if (t->stage >= 0 && t->microbatch >= 0)
        snprintf(label, sizeof label, "%s s%d mb%d", t->name ? t->name : "task", t->stage, t->microbatch);
    else if (t->stage >= 0)
        snprintf(label, sizeof label, "%s s%d", t->name ? t->name : "task", t->stage);
    else
        snprintf(label, sizeof label, "%s", t->name ? t->name : "task");
    nvtxRangePushA(label);
}

static void cuda_enqueue(struct gp_stream *s, gp_task_fn fn, void *arg, const struct gp_task_tag *tag)
{
    struct gp_task_tag t = tag ? *tag : gp_task_tag{GP_TASK_OTHER, -1, -1, "task"};
    if (stream_failed(s)) return;
    if (!stream_check(s, cudaSetDevice(s->dev->index), "cudaSetDevice")) return;
    int span = span_begin(s, &t);

    struct gp_error err;
    err.status = GP_OK;
    err.msg[0] = '\0';
    cudaStream_t outer = tl_current_stream; /* a task may enqueue onto other streams */
    tl_current_stream = s->stream;
    nvtx_push(&t);
    gp_status st = fn(arg, &err);
    nvtxRangePop();
    tl_current_stream = outer;

    const char *name = t.name ? t.name : "?";
    if (st == GP_OK) {
        cudaError_t e = cudaGetLastError();
        if (e != cudaSuccess)
            st = gp_error_set(&err, GP_ERR_DEVICE,
                              "task '%s' (stage %d, micro-batch %d) on stream '%s' of cuda:%d: "
                              "a launch failed unchecked: %s (%s)",
                              name, t.stage, t.microbatch, s->name, s->dev->index, cudaGetErrorName(e),
                              cudaGetErrorString(e));
    } else {
        (void)cudaGetLastError(); /* whatever the failed task left is its own */
    }
    if (st != GP_OK && err.msg[0] == '\0') {
        /* The task failed without saying why: name it at least. */
        err.status = GP_OK;
        gp_error_set(&err, st, "task '%s' (stage %d, micro-batch %d) on stream '%s' of cuda:%d failed: %s",
                     name, t.stage, t.microbatch, s->name, s->dev->index, gp_status_name(st));
    }
    if (span >= 0) {
        /* The task may have switched devices; the end event needs this one. */
        if (stream_check(s, cudaSetDevice(s->dev->index), "cudaSetDevice")) span_end(s, span);
    }
    if (st != GP_OK) {
        err.status = st;
        fail(s, &err);
    }
}

static void cuda_copy(struct gp_stream *s, void *dst, const void *src, size_t bytes,
                      const struct gp_task_tag *tag)
{
    struct gp_task_tag t = tag ? *tag : gp_task_tag{GP_TASK_COPY, -1, -1, "copy"};
    if (stream_failed(s)) return;
    if (!stream_check(s, cudaSetDevice(s->dev->index), "cudaSetDevice")) return;
    int span = span_begin(s, &t);
    nvtx_push(&t);
    if (bytes) {
        cudaError_t e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, s->stream);
        if (e != cudaSuccess) {
            char call[160];
            snprintf(call, sizeof call, "cudaMemcpyAsync of %zu bytes for '%s' (stage %d, micro-batch %d)",
                     bytes, t.name ? t.name : "?", t.stage, t.microbatch);
            stream_check(s, e, call);
        }
    }
    nvtxRangePop();
    span_end(s, span);
}

/* Blocks until the stream's work is done. An asynchronous fault of that work
 * surfaces here and becomes the stream's error unless a task failed first. */
static gp_status cuda_stream_synchronize(struct gp_stream *s, struct gp_error *err)
{
    if (stream_check(s, cudaSetDevice(s->dev->index), "cudaSetDevice"))
        stream_check(s, cudaStreamSynchronize(s->stream), "cudaStreamSynchronize");
    pthread_mutex_lock(&s->mu);
    gp_status st = GP_OK;
    if (s->failed) {
        st = s->err.status;
        gp_error_set(err, st, "%s", s->err.msg);
        s->failed = false;
        gp_error_clear(&s->err);
    }
    pthread_mutex_unlock(&s->mu);
    return st;
}

/* ---- events ---- */

static gp_status cuda_event_create(struct gp_device *dev, struct gp_event **out, struct gp_error *err)
{
    *out = NULL;
    GP_TRY(dev_check(err, cudaSetDevice(dev->index), dev->index, "cudaSetDevice"));
    struct gp_event *e = (struct gp_event *)calloc(1, sizeof *e);
    if (!e) return gp_error_set(err, GP_ERR_NOMEM, "cuda:%d: out of memory creating an event", dev->index);
    cudaError_t ce = cudaEventCreateWithFlags(&e->ev[dev->index], cudaEventDisableTiming);
    if (ce != cudaSuccess) {
        free(e);
        return dev_check(err, ce, dev->index, "cudaEventCreateWithFlags");
    }
    pthread_mutex_init(&e->mu, NULL);
    e->last = -1;
    *out = e;
    return GP_OK;
}

/* CUDA releases an event's resources once its pending records complete, so
 * this does not wait. Nothing is left to report an error to. */
static void cuda_event_destroy(struct gp_event *e)
{
    if (!e) return;
    for (int d = 0; d < MAX_DEVICES; d++)
        if (e->ev[d] && cudaEventDestroy(e->ev[d]) != cudaSuccess) (void)cudaGetLastError();
    pthread_mutex_destroy(&e->mu);
    free(e);
}

/* Runs on a failed stream too: streams waiting on e must not wait forever. */
static void cuda_event_record(struct gp_event *e, struct gp_stream *s)
{
    int d = s->dev->index;
    if (!stream_check(s, cudaSetDevice(d), "cudaSetDevice")) return;
    pthread_mutex_lock(&e->mu);
    cudaError_t ce = cudaSuccess;
    const char *call = "cudaEventRecord";
    if (!e->ev[d]) {
        ce = cudaEventCreateWithFlags(&e->ev[d], cudaEventDisableTiming);
        if (ce != cudaSuccess) {
            e->ev[d] = NULL;
            call = "cudaEventCreateWithFlags (an event of another device recorded here)";
        }
    }
    if (ce == cudaSuccess) ce = cudaEventRecord(e->ev[d], s->stream);
    if (ce == cudaSuccess) e->last = d;
    pthread_mutex_unlock(&e->mu);
    stream_check(s, ce, call);
}

static void cuda_stream_wait(struct gp_stream *s, struct gp_event *e)
{
    pthread_mutex_lock(&e->mu);
    int last = e->last;
    cudaEvent_t ev = last >= 0 ? e->ev[last] : NULL;
    pthread_mutex_unlock(&e->mu);
    if (!ev) return; /* never recorded: nothing to wait for, as in CUDA */
    if (!stream_check(s, cudaSetDevice(s->dev->index), "cudaSetDevice")) return;
    stream_check(s, cudaStreamWaitEvent(s->stream, ev, 0), "cudaStreamWaitEvent");
}

/* Positional: CUDA C++17 has no designated initializers. */
/* ---- graphs ---- */

struct gp_step_graph {
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    int device;
};

/* Thread-local capture: CUDA calls of other host threads are not affected,
 * and a task that tried something uncapturable (a synchronization, an
 * allocation) fails the capture rather than the process. */
static gp_status cuda_capture_begin(struct gp_stream *s, struct gp_error *err)
{
    GP_TRY(dev_check(err, cudaSetDevice(s->dev->index), s->dev->index, "cudaSetDevice"));
    return dev_check(err, cudaStreamBeginCapture(s->stream, cudaStreamCaptureModeThreadLocal), s->dev->index,
                     "cudaStreamBeginCapture");
}

/* Ends the capture whatever happened inside it (the stream must leave
 * capture mode to be usable again), then instantiates the graph. A task
 * that failed while capturing fails the capture, with its message. */
static gp_status cuda_capture_end(struct gp_stream *s, struct gp_step_graph **out, struct gp_error *err)
{
    *out = NULL;
    cudaGraph_t graph = NULL;
    cudaError_t e = cudaSetDevice(s->dev->index);
    cudaError_t end = cudaStreamEndCapture(s->stream, &graph);
    (void)cudaGetLastError();
    pthread_mutex_lock(&s->mu);
    bool failed = s->failed;
    if (failed) {
        gp_error_set(err, s->err.status, "while capturing: %s", s->err.msg);
        s->failed = false;
        gp_error_clear(&s->err);
    }
    pthread_mutex_unlock(&s->mu);
    if (failed || e != cudaSuccess || end != cudaSuccess) {
        if (graph) cudaGraphDestroy(graph);
        if (failed) return err->status;
        return dev_check(err, e != cudaSuccess ? e : end, s->dev->index, "cudaStreamEndCapture");
    }
    cudaGraphExec_t exec = NULL;
    e = cudaGraphInstantiate(&exec, graph, 0);
    if (e != cudaSuccess) {
        cudaGraphDestroy(graph);
        return dev_check(err, e, s->dev->index, "cudaGraphInstantiate");
    }
    struct gp_step_graph *g = (struct gp_step_graph *)calloc(1, sizeof *g);
    if (!g) {
        cudaGraphExecDestroy(exec);
        cudaGraphDestroy(graph);
        return gp_error_set(err, GP_ERR_NOMEM, "out of memory");
    }
    g->graph = graph;
    g->exec = exec;
    g->device = s->dev->index;
    *out = g;
    return GP_OK;
}

static void cuda_graph_launch(struct gp_step_graph *g, struct gp_stream *s)
{
    if (stream_failed(s)) return;
    if (!stream_check(s, cudaSetDevice(s->dev->index), "cudaSetDevice")) return;
    stream_check(s, cudaGraphLaunch(g->exec, s->stream), "cudaGraphLaunch");
}

static void cuda_graph_destroy(struct gp_step_graph *g)
{
    if (!g) return;
    if (cudaSetDevice(g->device) != cudaSuccess) (void)cudaGetLastError();
    if (cudaGraphExecDestroy(g->exec) != cudaSuccess) (void)cudaGetLastError();
    if (cudaGraphDestroy(g->graph) != cudaSuccess) (void)cudaGetLastError();
    free(g);
}

/* Pinned, portable (every device's copies see it as pinned); NULL on failure. */
static void *cuda_host_alloc(size_t bytes)
{
    void *p = NULL;
    if (cudaHostAlloc(&p, bytes ? bytes : 1, cudaHostAllocPortable) != cudaSuccess) {
        (void)cudaGetLastError();
        return NULL;
    }
    return p;
}

static void cuda_host_free(void *p)
{
    if (p && cudaFreeHost(p) != cudaSuccess) (void)cudaGetLastError();
}

extern "C" const struct gp_device_ops gp_cuda_device_ops = {
    "cuda",
    cuda_open,
    cuda_close,
    cuda_alloc,
    cuda_free,
    cuda_stream_create,
    cuda_stream_destroy,
    cuda_enqueue,
    cuda_copy,
    cuda_event_create,
    cuda_event_destroy,
    cuda_event_record,
    cuda_stream_wait,
    cuda_stream_synchronize,
    cuda_trace_enable,
    cuda_trace_spans,
    cuda_set_threads,
    cuda_mem_available,
    &gp_cuda_compute_ops,
    cuda_capture_begin,
    cuda_capture_end,
    cuda_graph_launch,
    cuda_graph_destroy,
    cuda_host_alloc,
    cuda_host_free,
};
