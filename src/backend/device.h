/* The device interface the pipeline executor drives: memory, streams,
 * events and copies, as CUDA has them. A backend is a table of functions.
 *
 * Streams run their work in order; an event marks a point in a stream, and
 * another stream can wait for it without the host waiting. The executor
 * issues a whole training step this way and synchronizes once at its end.
 *
 * On the CPU backend a stream is a worker thread with a queue, so stages on
 * different CPU "devices" really run at once; enqueue hands the task to that
 * thread. On CUDA, enqueue runs the task on the calling (host) thread, where
 * it launches kernels onto the stream. The executor does not know which. */
#ifndef GP_BACKEND_DEVICE_H
#define GP_BACKEND_DEVICE_H

#include <stddef.h>
#include <stdint.h>

#include "util/error.h"

struct gp_device;
struct gp_stream;
struct gp_event;
struct gp_compute_ops; /* backend/compute.h */
struct gp_step_graph;  /* a captured, instantiated graph of work */

/* What a task is, for the timeline (Chrome trace) and messages. */
enum gp_task_kind {
    GP_TASK_FORWARD,
    GP_TASK_BACKWARD,
    GP_TASK_RECOMPUTE,
    GP_TASK_COPY,
    GP_TASK_LOSS,
    GP_TASK_OPTIMIZER,
    GP_TASK_OTHER,
};

struct gp_task_tag {
    enum gp_task_kind kind;
    int stage;       /* -1 when not about one stage */
    int microbatch;  /* -1 when not about one micro-batch */
    const char *name; /* static string, e.g. "forward" */
};

/* A task returns GP_OK or an error (with its message in err). After the
 * first failure a stream skips its remaining tasks (still signalling its
 * events, so no other stream waits forever); stream_synchronize returns it. */
typedef gp_status (*gp_task_fn)(void *arg, struct gp_error *err);

/* One executed task, for the timeline: start and end in microseconds on a
 * clock shared by all streams of the process. */
struct gp_trace_span {
    struct gp_task_tag tag;
    double start_us, end_us;
};

struct gp_device_ops {
    const char *name; /* "cpu", "cuda" */
    gp_status (*open)(int index, struct gp_device **out, struct gp_error *err);
    void (*close)(struct gp_device *dev);
    /* Memory the device's tasks can use: aligned to 64 bytes, zeroed. NULL
     * when exhausted (the caller names the stage and the bytes). */
    void *(*alloc)(struct gp_device *dev, size_t bytes);
    void (*free)(struct gp_device *dev, void *ptr);

    gp_status (*stream_create)(struct gp_device *dev, const char *name, struct gp_stream **out,
                               struct gp_error *err);
    void (*stream_destroy)(struct gp_stream *s);
    /* Runs fn(arg) in stream order. `tag` is copied. */
    void (*enqueue)(struct gp_stream *s, gp_task_fn fn, void *arg, const struct gp_task_tag *tag);
    /* Copies bytes in stream order (between any two devices of this backend). */
    void (*copy)(struct gp_stream *s, void *dst, const void *src, size_t bytes,
                 const struct gp_task_tag *tag);

    gp_status (*event_create)(struct gp_device *dev, struct gp_event **out, struct gp_error *err);
    void (*event_destroy)(struct gp_event *e);
    /* Marks the current end of stream s. */
    void (*event_record)(struct gp_event *e, struct gp_stream *s);
    /* Work enqueued on s after this waits until the event's latest record
     * (as of this call) has been reached. */
    void (*stream_wait)(struct gp_stream *s, struct gp_event *e);
    /* Blocks the host until everything enqueued on s so far has run;
     * returns the first error of a failed task (and clears it). */
    gp_status (*stream_synchronize)(struct gp_stream *s, struct gp_error *err);

    /* The timeline: starts (clearing) or stops recording spans on a stream,
     * and hands back the spans recorded since the start. The array stays
     * valid until the next start or the stream's destruction. */
    void (*trace_enable)(struct gp_stream *s, int enabled);
    const struct gp_trace_span *(*trace_spans)(struct gp_stream *s, int *count);
    /* Threads a CPU device's kernels may use (OpenMP); no-op elsewhere. */
    void (*set_threads)(struct gp_device *dev, int threads);
    /* Bytes the device could still allocate, for planning messages. */
    size_t (*mem_available)(struct gp_device *dev);
    /* The kernels and step operations that run on this backend's devices. */
    const struct gp_compute_ops *compute;

    /* Graphs (CUDA graphs; NULL where the backend has none): between
     * capture_begin and capture_end, what is enqueued on `origin`, and on
     * every stream made to wait for an event recorded there, is recorded
     * rather than run (every such stream must be joined back to origin
     * before the end); graph_launch replays it on a stream. Tasks run their
     * host code once, at capture: only what they enqueue is replayed. */
    gp_status (*capture_begin)(struct gp_stream *origin, struct gp_error *err);
    gp_status (*capture_end)(struct gp_stream *origin, struct gp_step_graph **out, struct gp_error *err);
    void (*graph_launch)(struct gp_step_graph *graph, struct gp_stream *s);
    void (*graph_destroy)(struct gp_step_graph *graph);
    /* Page-locked host memory: copies from and to it run in stream order
     * (and can be captured). NULL where the backend has none. */
    void *(*host_alloc)(size_t bytes);
    void (*host_free)(void *ptr);
    /* Kernel choices the backend measured in this process (cuDNN's
     * algorithms), which decide a result's last bits: as text (malloc'd;
     * NULL when none), and imported before any are measured so that a
     * resumed run computes with the saving run's. Import leaves out, with a
     * note, choices measured on other hardware or libraries. NULL where the
     * backend measures nothing. */
    char *(*choices_export)(void);
    gp_status (*choices_import)(const char *text, char *note, size_t note_size, struct gp_error *err);
};

extern const struct gp_device_ops gp_cpu_device_ops;

#endif
