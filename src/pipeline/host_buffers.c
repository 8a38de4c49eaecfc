/* Host buffers for a step's batch and targets (gp_pipeline_host_alloc):
 * pinned where the first stage's backend has page-locked memory. A batch
 * in pageable memory reaches a GPU at a fraction of the link's speed
 * (ResNet-50's float32 batch of 128, 77 MB: 11.7 ms on an H200 host), and
 * the CUDA graph path first staged it through its own pinned buffer (one
 * more host copy of the batch per step); a batch already pinned is copied
 * as it lies. */
#include <stdlib.h>

#include "pipeline/internal.h"

void *gp_pipeline_host_alloc(struct gp_pipeline *p, size_t bytes)
{
    int slot = -1;
    for (int i = 0; i < GP_PIPE_MAX_HOST_BUFS && slot < 0; i++)
        if (!p->host_bufs[i].ptr) slot = i;
    if (slot < 0) return NULL;
    const struct gp_device_ops *ops = p->stages[0].ops;
    bool pinned = ops->host_alloc && ops->host_free;
    void *ptr = pinned ? ops->host_alloc(bytes ? bytes : 1) : NULL;
    /* Page-locked memory is a limited resource: without it the batch is
     * copied from plain memory, slower but the same. */
    if (!ptr) pinned = false, ptr = malloc(bytes ? bytes : 1);
    if (!ptr) return NULL;
    p->host_bufs[slot].ptr = ptr;
    p->host_bufs[slot].bytes = bytes;
    p->host_bufs[slot].pinned = pinned;
    return ptr;
}

void gp_pipeline_host_free(struct gp_pipeline *p, void *ptr)
{
    if (!p || !ptr) return;
    /* An upload of the next step's inputs may still read it (inputs_ahead.c);
     * one that failed makes no more. */
    if (p->ahead_stream) {
        struct gp_error err = {0};
        if (p->stages[0].ops->stream_synchronize(p->ahead_stream, &err) != GP_OK) {
            gp_pipe_inputs_ahead_free(p);
            p->ahead_bytes = 0;
        }
    }
    for (int i = 0; i < GP_PIPE_MAX_HOST_BUFS; i++) {
        if (p->host_bufs[i].ptr != ptr) continue;
        /* The upload from it is not the next step's inputs, whatever a
         * later buffer at the same address holds. */
        const char *a = p->ahead_x, *b = ptr;
        if (a && a >= b && a < b + p->host_bufs[i].bytes) p->ahead_x = NULL;
        if (p->host_bufs[i].pinned)
            p->stages[0].ops->host_free(ptr);
        else
            free(ptr);
        p->host_bufs[i].ptr = NULL;
        return;
    }
}

bool gp_pipe_pinned(const struct gp_pipeline *p, const void *ptr, size_t bytes)
{
    const char *c = ptr;
    for (int i = 0; c && i < GP_PIPE_MAX_HOST_BUFS; i++) {
        const char *b = p->host_bufs[i].ptr;
        if (b && p->host_bufs[i].pinned && c >= b && c + bytes <= b + p->host_bufs[i].bytes) return true;
    }
    return false;
}

/* Every buffer still held, with the pipeline (before its stages go). */
void gp_pipe_free_host_bufs(struct gp_pipeline *p)
{
    if (!p->stages || p->K < 1 || !p->stages[0].ops) return;
    for (int i = 0; i < GP_PIPE_MAX_HOST_BUFS; i++) gp_pipeline_host_free(p, p->host_bufs[i].ptr);
}
