/* The CUDA device backend's internals, shared by its files: the device and
 * stream structures, a stream's error handling, and the timeline's
 * functions that streams call.
 *   device.cu        devices, memory, streams, events, graphs; the interface's table
 *   device_trace.cu  the timeline: timing events around tasks and copies
 * Included by those two files alone (CUDA C++). */
#ifndef GP_CUDA_DEVICE_INTERNAL_H
#define GP_CUDA_DEVICE_INTERNAL_H

#include <cuda_runtime.h>
#include <pthread.h>
#include <stdio.h>

#include "backend/cuda/device.h"

#define MAX_DEVICES 64    /* an event's per-device slots; far above one host's GPUs */

struct gp_device {
    int index;
};

struct time_ref;  /* device_trace.cu */
struct span_out;  /* device_trace.cu */

/* One traced task or copy: two timing events on its stream. */
struct span_rec {
    struct gp_task_tag tag;
    cudaEvent_t t0, t1;
    bool done; /* both events recorded */
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

/* ---- errors ---- */

/* Fills err with "<where>: <call>: <CUDA's name> (<CUDA's text>)". CUDA
 * remembers a failed call as the thread's last error; it is cleared here,
 * where it was reported, so that the check after the next task does not
 * blame that task for it. */
static inline gp_status cuda_error(struct gp_error *err, cudaError_t e, const char *where, const char *call)
{
    (void)cudaGetLastError();
    return gp_error_set(err, GP_ERR_DEVICE, "%s: %s: %s (%s)", where, call, cudaGetErrorName(e),
                        cudaGetErrorString(e));
}

static inline gp_status dev_check(struct gp_error *err, cudaError_t e, int index, const char *call)
{
    if (e == cudaSuccess) return GP_OK;
    char where[32];
    snprintf(where, sizeof where, "cuda:%d", index);
    return cuda_error(err, e, where, call);
}

/* Caller holds s->mu. Keeps the first failure only. */
static inline void fail_locked(struct gp_stream *s, const struct gp_error *err)
{
    if (s->failed) return;
    s->failed = true;
    s->err = *err;
}

static inline void fail(struct gp_stream *s, const struct gp_error *err)
{
    pthread_mutex_lock(&s->mu);
    fail_locked(s, err);
    pthread_mutex_unlock(&s->mu);
}

/* Formats the failure of a CUDA call made for stream s; `call` may carry
 * what it was about ("cudaMemcpyAsync of 4096 bytes for 'send'"). */
static inline void stream_error(struct gp_error *out, struct gp_stream *s, cudaError_t e, const char *call)
{
    char where[128];
    snprintf(where, sizeof where, "stream '%s' of cuda:%d", s->name, s->dev->index);
    out->status = GP_OK;
    out->msg[0] = '\0';
    cuda_error(out, e, where, call);
}

/* Records a failed CUDA call on the stream; true when e is success. */
static inline bool stream_check(struct gp_stream *s, cudaError_t e, const char *call)
{
    if (e == cudaSuccess) return true;
    struct gp_error err;
    stream_error(&err, s, e, call);
    fail(s, &err);
    return false;
}

static inline bool stream_failed(struct gp_stream *s)
{
    pthread_mutex_lock(&s->mu);
    bool f = s->failed;
    pthread_mutex_unlock(&s->mu);
    return f;
}

/* ---- the timeline (device_trace.cu) ---- */

/* Opens a span: returns its index with its start event recorded, or -1 when
 * not tracing; span_end closes it. The stream's device is current. */
int gp_cuda_span_begin(struct gp_stream *s, const struct gp_task_tag *tag);
void gp_cuda_span_end(struct gp_stream *s, int idx);

/* The interface's trace_enable and trace_spans. */
void gp_cuda_trace_enable(struct gp_stream *s, int enabled);
const struct gp_trace_span *gp_cuda_trace_spans(struct gp_stream *s, int *count);

/* Frees what the stream's timeline holds (its reference, its span records
 * and the arrays trace_spans handed out), when the stream is destroyed,
 * after its timing events. */
void gp_cuda_trace_release(struct gp_stream *s);

#endif
