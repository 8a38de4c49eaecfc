/* The timeline of the CUDA device backend (backend/device.h's trace_enable
 * and trace_spans; device_internal.h).
 *
 * While tracing is on, each task and copy is bracketed by two timing
 * events on its stream (reused from one trace start to the next).
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
 * one; streams keep the reference they started with until their next start. */
#include "backend/cuda/device_internal.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#define SPANS_INITIAL 256
#define REF_REFRESH_S 10.0

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec * 1e-3;
}

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

/* Arrays handed out by trace_spans; kept until the next trace start (the
 * interface promises they stay valid that long). */
struct span_out {
    struct span_out *prev;
    struct gp_trace_span *spans; /* points just past this header */
};

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
int gp_cuda_span_begin(struct gp_stream *s, const struct gp_task_tag *tag)
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

void gp_cuda_span_end(struct gp_stream *s, int idx)
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

void gp_cuda_trace_enable(struct gp_stream *s, int enabled)
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
const struct gp_trace_span *gp_cuda_trace_spans(struct gp_stream *s, int *count)
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

void gp_cuda_trace_release(struct gp_stream *s)
{
    pthread_mutex_lock(&ref_mu);
    ref_release_locked(s->ref);
    pthread_mutex_unlock(&ref_mu);
    free(s->recs);
    free_outs(s);
}
