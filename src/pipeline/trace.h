/* The timeline of a training step as a Chrome trace (JSON), which Perfetto
 * and chrome://tracing open: one process per device, one thread per stream,
 * one complete ("X") event per executed task or copy.
 *
 * Event names read as the schedule does: "F s0 m3" (forward of stage 0 on
 * micro-batch 3), "B s1 m0" (backward), "R s1 m0" (recompute), "loss s1 m0",
 * "optimizer s0", "copy s0->s1 m2". A copy's tag names the stage that sends:
 * it goes to the previous stage when the tag's name mentions "grad" (as in
 * "send gradients"), to the next one when the name mentions "activ", is
 * "copy" or is unset, and otherwise reads as its name ("load inputs s0 m2").
 * Other tasks show their tag's name with the stage and micro-batch that are
 * set (>= 0). The category ("cat") is the task kind. */
#ifndef GP_PIPELINE_TRACE_H
#define GP_PIPELINE_TRACE_H

#include <stddef.h>

#include "backend/device.h"
#include "util/error.h"

/* One stream's spans, as gp_device_ops.trace_spans hands them back. */
struct gp_trace_stream {
    int device;              /* the trace's pid */
    const char *device_name; /* the process's name: "cpu:0", or "cpu" (":<device>" is added) */
    const char *stream_name; /* the thread's name, "compute", "copy s0->s1" */
    const struct gp_trace_span *spans;
    int count;
};

/* "forward", "backward", "recompute", "copy", "loss", "optimizer", "other":
 * the events' category. */
const char *gp_trace_kind_name(enum gp_task_kind kind);

/* The event name of a tag (see above), truncated to fit size bytes. */
void gp_trace_span_name(const struct gp_task_tag *tag, char *buf, size_t size);

/* Writes streams[0..n) to path as {"traceEvents": [...], "displayTimeUnit":
 * "ms"}; the thread id of streams[i] is i. Times are microseconds from the
 * earliest span of all streams. The file appears whole or not at all: it is
 * written beside path and renamed over it. */
gp_status gp_trace_write(const char *path, const struct gp_trace_stream *streams, int n,
                         struct gp_error *err);

/* What the timeline is of, written as the trace's "otherData" (the
 * format's metadata dictionary): {"pipeline_schedule": "1f1b", "checkpoint":
 * "except_last", "stages": 4, "micro_batches": 8}. */
struct gp_trace_info {
    const char *pipeline_schedule, *checkpoint;
    int stages, micro_batches;
    /* One rank of a job of several processes (rank_name set, "rank 1 (stage
     * 1, replica 0)"): every stream is in one trace process, pid `rank`,
     * named rank_name and the device, and times are the host clock's
     * microseconds (CLOCK_MONOTONIC, as the spans carry them), not shifted
     * to the trace's first span: the files of ranks on one host then line
     * up when their events are put in one file; "rank" is in otherData. */
    const char *rank_name;
    int rank;
};

/* gp_trace_write with the info (NULL: none). */
gp_status gp_trace_write_info(const char *path, const struct gp_trace_stream *streams, int n,
                              const struct gp_trace_info *info, struct gp_error *err);

#endif
