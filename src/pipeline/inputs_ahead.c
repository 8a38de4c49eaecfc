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
 * CPU device's streams copy from any memory in their order). */
#include "pipeline/internal.h"

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
        ops->copy(fs->compute, fs->inputs, fs->inputs_ahead, bytes, &t);
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
     * from any memory in their order). */
    bool async = !ops->host_alloc || gp_pipe_pinned(p, next, bytes);
    if (!next || p->cfg.remote || !async || !ahead_ready(p, bytes)) return;
    struct gp_task_tag tag = tag_of(GP_TASK_COPY, 0, -1, "upload the next step's inputs");
    ops->stream_wait(p->ahead_stream, p->ahead_free);
    ops->copy(p->ahead_stream, fs->inputs_ahead, next, bytes, &tag);
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
}

int64_t gp_pipeline_inputs_taken_ahead(const struct gp_pipeline *p) { return p->ahead_taken; }

size_t gp_pipeline_inputs_ahead_given_up(const struct gp_pipeline *p) { return p->ahead_given_up; }
