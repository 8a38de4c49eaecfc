/* The CUDA backend of the device interface (backend/device.h, cuda/device.h),
 * with its internals in device_internal.h and the timeline (tracing) in
 * device_trace.cu.
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
 * Memory: cudaMalloc (256-byte aligned, above the interface's 64), zeroed on
 * a stream of its own and waited for, so that the zeros are in place before
 * any non-blocking stream touches the memory. Allocation happens before the
 * step loop, so the wait costs nothing that matters.
 *
 * Host memory in copies: pageable host memory is read or written when copy
 * is called (CUDA stages it then); pinned memory moves in stream order. */
#include "backend/cuda/device_internal.h"

#include <cuda_runtime.h>
#include <nvtx3/nvToolsExt.h>
#include <nvtx3/nvToolsExtCudaRt.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static thread_local cudaStream_t tl_current_stream = NULL;

extern "C" cudaStream_t gp_cuda_current_stream(void) { return tl_current_stream; }

struct gp_event {
    pthread_mutex_t mu;
    int last;                      /* the device that recorded it last; -1: never */
    cudaEvent_t ev[MAX_DEVICES];   /* made on the first record on each device */
};

/* ---- devices and memory ---- */

static pthread_mutex_t peer_mu = PTHREAD_MUTEX_INITIALIZER;
static bool peer_enabled[MAX_DEVICES]; /* the device's peer access is set up */
static bool peers_wanted = true;        /* gp_cuda_peer_access */

extern "C" void gp_cuda_peer_access(bool on)
{
    pthread_mutex_lock(&peer_mu);
    peers_wanted = on;
    pthread_mutex_unlock(&peer_mu);
}

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
    if (e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver) {
        cudaGetLastError();
        return gp_error_set(err, GP_ERR_DEVICE,
                            "cuda:%d: no GPU is usable on this machine (%s); --devices cpu:0 trains on the CPU",
                            index, cudaGetErrorString(e));
    }
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
     * later opens of the device skip it. Not wanted (gp_cuda_peer_access)
     * where the process uses one GPU: enabling it makes a context on each
     * peer, memory taken on GPUs other processes compute on. */
    pthread_mutex_lock(&peer_mu);
    gp_status st = GP_OK;
    if (peers_wanted && !peer_enabled[index]) {
        st = enable_peers(index, n, err);
        if (st == GP_OK) peer_enabled[index] = true;
    }
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
    gp_cuda_trace_release(s);
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
    int span = gp_cuda_span_begin(s, &t);

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
        if (stream_check(s, cudaSetDevice(s->dev->index), "cudaSetDevice")) gp_cuda_span_end(s, span);
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
    int span = gp_cuda_span_begin(s, &t);
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
    gp_cuda_span_end(s, span);
}

/* The watch over host waits (backends.h, gp_backend_on_wait): set before
 * the streams run, read by every wait after. */
static gp_status (*volatile wait_watch)(void *user, double waited_s, struct gp_error *err);
static void *volatile wait_user;

extern "C" void gp_cuda_on_wait(gp_status (*fn)(void *user, double waited_s, struct gp_error *err), void *user)
{
    wait_user = user;
    wait_watch = fn;
}

static double wall_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The stream's work waited for by polling, the watch asked between polls
 * (spinning for the first millisecond, a step's end usually comes within
 * it, then napping 0.1 ms); the watch's error becomes the stream's. */
static void watched_synchronize(struct gp_stream *s,
                                gp_status (*watch)(void *user, double waited_s, struct gp_error *err), void *user)
{
    double start = wall_seconds();
    for (;;) {
        cudaError_t e = cudaStreamQuery(s->stream);
        if (e == cudaSuccess) return;
        if (e != cudaErrorNotReady) {
            stream_check(s, e, "cudaStreamQuery");
            return;
        }
        double waited = wall_seconds() - start;
        struct gp_error werr;
        gp_error_clear(&werr);
        if (watch(user, waited, &werr) != GP_OK) {
            /* What the stream waited on was aborted: its work ends now, in
             * errors of its own, which the watch's reason replaces. */
            if (cudaStreamSynchronize(s->stream) != cudaSuccess) (void)cudaGetLastError();
            if (werr.status == GP_OK) werr.status = GP_ERR_COMM;
            fail(s, &werr);
            return;
        }
        if (waited > 1e-3) {
            struct timespec nap = {0, 100000};
            nanosleep(&nap, NULL);
        }
    }
}

/* Blocks until the stream's work is done. An asynchronous fault of that work
 * surfaces here and becomes the stream's error unless a task failed first. */
static gp_status cuda_stream_synchronize(struct gp_stream *s, struct gp_error *err)
{
    gp_status (*watch)(void *, double, struct gp_error *) = wait_watch;
    void *user = wait_user;
    if (stream_check(s, cudaSetDevice(s->dev->index), "cudaSetDevice")) {
        if (watch)
            watched_synchronize(s, watch, user);
        else
            stream_check(s, cudaStreamSynchronize(s->stream), "cudaStreamSynchronize");
    }
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
    gp_cuda_trace_enable,
    gp_cuda_trace_spans,
    cuda_set_threads,
    cuda_mem_available,
    &gp_cuda_compute_ops,
    cuda_capture_begin,
    cuda_capture_end,
    cuda_graph_launch,
    cuda_graph_destroy,
    cuda_host_alloc,
    cuda_host_free,
    gp_cuda_choices_export,
    gp_cuda_choices_import,
};
