/* The next step's inputs uploaded while this step computes
 * (gp_step_opts.next_inputs; on by default, GP_INPUTS_AHEAD=0 turns it off).
 *
 * Why: a step's batch crosses the host link before any of its work can
 * start (ResNet-50's float32 batch of 128 images, 77 MB from pinned
 * memory: 1.4 ms on an H200, bench/RESULTS.md 2026-12-02), and nothing
 * else runs meanwhile. The trainer has the next step's batch gathered
 * while this step runs (train/prefetch.h, two steps ahead), so its copy can
 * run on a stream of its own, beside this step's kernels, into a buffer of
 * the first stage (planned with its blocks when the setting is on at the
 * pipeline's creation); the next step then takes it with a device
 * copy (77 MB read and written at the memory's speed: about 0.05 ms by
 * that count, not measured) into its inputs block,
 * which this step's recomputations may still read while the upload runs,
 * so the upload cannot go there directly.
 *
 * Order: the upload waits for the event recorded after the last device
 * copy out of the buffer (ahead_free); the next step's compute stream
 * waits for the upload's (ahead_done) before its device copy. A step given
 * other inputs than the ones uploaded copies its own from the host, as
 * without this; the upload is then dropped. Only a local first stage
 * (not across processes) uploads ahead, and on a GPU only from pinned
 * memory: a copy from pageable memory does not run beside the kernels (a
 * CPU device's streams copy from any memory in their order).
 *
 * In bfloat16, where the first stage's box of the inputs is bfloat16 and
 * the data float32 (a bf16 first convolution reads them rounded), the
 * upload crosses as bfloat16: the host rounds the rows into a pinned
 * buffer of its own, after this step's work is issued (so the rounding
 * runs beside it, threaded: ResNet-50's 38.5 M values a step), and the
 * first stage's buffer is half the size (ResNet-50 at batch 128: 36.75
 * MiB, not 73.5). The next step widens them into its float32 rows
 * (exact), which its first forward rounds into the box as before: a
 * bfloat16 value rounds to itself, so the box holds the bits it held
 * when the float32 rows crossed (a NaN stays a NaN; its payload bits may
 * differ). GP_INPUTS_AHEAD_BF16=0 uploads float32 rows as before. */
#include <stdint.h>
#include <stdlib.h>

#include "graph/tensor.h"
#include "pipeline/internal.h"
#include "util/env.h"

bool gp_pipe_ahead_bf16_wanted(const struct gp_pipeline *p, const struct stage *s)
{
    return p->ahead_bytes && p->g->values[p->input].dtype == GP_DTYPE_FLOAT32 &&
           s->plan.dt[p->input] == GP_DTYPE_BFLOAT16 && gp_env_flag("GP_INPUTS_AHEAD_BF16", true);
}

size_t gp_pipe_ahead_device_bytes(const struct gp_pipeline *p)
{
    return p->ahead_bf16 ? p->ahead_bytes / 2 : p->ahead_bytes;
}

/* The float32 rows rounded to bfloat16 on the host's threads. */
static void round_rows(uint16_t *dst, const float *src, int64_t n)
{
#pragma omp parallel for schedule(static) if (n >= (1 << 20))
    for (int64_t i = 0; i < n; i++) dst[i] = gp_float_to_bf16(src[i]);
}

/* Task on the first stage's compute stream: the rows uploaded as
 * bfloat16 widened into its float32 inputs. */
static gp_status widen_rows(void *arg, struct gp_error *err)
{
    struct gp_pipeline *p = arg;
    struct stage *fs = &p->stages[0];
    return fs->cops->convert(fs->cctx, fs->inputs, GP_DTYPE_FLOAT32, fs->inputs_ahead, GP_DTYPE_BFLOAT16,
                             (int64_t)(p->ahead_bytes / sizeof(float)), false, err);
}

void gp_pipe_inputs_load(struct gp_pipeline *p, const void *x, const void *xs, size_t bytes,
                         const struct gp_task_tag *tag)
{
    struct stage *fs = &p->stages[0];
    const struct gp_device_ops *ops = fs->ops;
    /* The upload's stream reports a failed copy only when synchronized (it
     * is not among the step's streams): an upload that failed is not
     * taken, and no more are made; the step copies its own from the host.
     * The upload was issued a whole step ago, so this wait is for a copy
     * already done. */
    if (p->ahead_x && p->ahead_stream) {
        struct gp_error uerr = {0};
        if (ops->stream_synchronize(p->ahead_stream, &uerr) != GP_OK) {
            gp_pipe_inputs_ahead_free(p);
            p->ahead_bytes = 0; /* not again */
        }
    }
    if (p->ahead_x && p->ahead_x == x && bytes == p->ahead_bytes) {
        struct gp_task_tag t = *tag;
        t.name = "load inputs (uploaded ahead)";
        ops->stream_wait(fs->compute, p->ahead_done);
        if (p->ahead_bf16) {
            t.name = "widen inputs (uploaded ahead as bfloat16)";
            ops->enqueue(fs->compute, widen_rows, p, &t);
        } else {
            ops->copy(fs->compute, fs->inputs, fs->inputs_ahead, bytes, &t);
        }
        ops->event_record(p->ahead_free, fs->compute);
        p->ahead_x = NULL;
        p->ahead_taken++;
        return;
    }
    p->ahead_x = NULL;
    ops->copy(fs->compute, fs->inputs, xs, bytes, tag);
}

/* The upload's stream and events, made at its first use (the buffer is
 * the first stage's, planned with its blocks); false when they could not
 * be made (the steps then copy from the host, as without). */
static bool ahead_ready(struct gp_pipeline *p, size_t bytes)
{
    struct stage *fs = &p->stages[0];
    const struct gp_device_ops *ops = fs->ops;
    if (!p->ahead_bytes || bytes != p->ahead_bytes || !fs->inputs_ahead) return false;
    if (p->ahead_bf16 && !p->ahead_host) {
        p->ahead_host = ops->host_alloc ? ops->host_alloc(bytes / 2) : malloc(bytes / 2);
        if (!p->ahead_host) {
            gp_pipe_inputs_ahead_free(p);
            p->ahead_bytes = 0; /* not again */
            return false;
        }
    }
    if (p->ahead_stream) return true;
    struct gp_error err = {0};
    if (ops->stream_create(fs->dev, "inputs ahead", &p->ahead_stream, &err) != GP_OK ||
        ops->event_create(fs->dev, &p->ahead_done, &err) != GP_OK ||
        ops->event_create(fs->dev, &p->ahead_free, &err) != GP_OK) {
        gp_pipe_inputs_ahead_free(p);
        p->ahead_bytes = 0; /* not again */
        return false;
    }
    return true;
}

void gp_pipe_inputs_ahead(struct gp_pipeline *p, size_t bytes)
{
    const void *next = p->opts.next_inputs;
    struct stage *fs = &p->stages[0];
    const struct gp_device_ops *ops = fs->ops;
    /* Pinned memory where the backend has it (a CPU device's streams copy
     * from any memory in their order); the bfloat16 rows are in pinned
     * memory of their own. */
    bool async = !ops->host_alloc || p->ahead_bf16 || gp_pipe_pinned(p, next, bytes);
    if (!next || p->cfg.remote || !async || !ahead_ready(p, bytes)) return;
    struct gp_task_tag tag = tag_of(GP_TASK_COPY, 0, -1, "upload the next step's inputs");
    const void *src = next;
    size_t up = bytes;
    if (p->ahead_bf16) {
        /* The last upload read ahead_host; the step's start waited for it
         * (gp_pipe_inputs_load), unless that step took no upload. */
        struct gp_error uerr = {0};
        if (ops->stream_synchronize(p->ahead_stream, &uerr) != GP_OK) {
            gp_pipe_inputs_ahead_free(p);
            p->ahead_bytes = 0; /* not again */
            return;
        }
        round_rows(p->ahead_host, next, (int64_t)(bytes / sizeof(float)));
        src = p->ahead_host;
        up = bytes / 2;
        tag.name = "upload the next step's inputs (bfloat16)";
    }
    ops->stream_wait(p->ahead_stream, p->ahead_free);
    ops->copy(p->ahead_stream, fs->inputs_ahead, src, up, &tag);
    ops->event_record(p->ahead_done, p->ahead_stream);
    p->ahead_x = next;
}

void gp_pipe_inputs_ahead_free(struct gp_pipeline *p)
{
    if (!p->stages || p->K < 1 || !p->stages[0].ops) return;
    struct stage *fs = &p->stages[0];
    const struct gp_device_ops *ops = fs->ops;
    if (p->ahead_stream) {
        struct gp_error err = {0};
        (void)ops->stream_synchronize(p->ahead_stream, &err); /* its copy done before the buffer goes */
        ops->stream_destroy(p->ahead_stream);
    }
    if (p->ahead_done) ops->event_destroy(p->ahead_done);
    if (p->ahead_free) ops->event_destroy(p->ahead_free);
    p->ahead_stream = NULL;
    p->ahead_done = p->ahead_free = NULL;
    p->ahead_x = NULL;
    if (ops->host_alloc) ops->host_free(p->ahead_host);
    else free(p->ahead_host);
    p->ahead_host = NULL;
}

int64_t gp_pipeline_inputs_taken_ahead(const struct gp_pipeline *p) { return p->ahead_taken; }

size_t gp_pipeline_inputs_ahead_given_up(const struct gp_pipeline *p) { return p->ahead_given_up; }
