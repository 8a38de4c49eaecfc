/* Chrome trace JSON of the streams' spans (trace.h). The format:
 * "Trace Event Format", the X (complete) and M (metadata) phases. */
#include "pipeline/trace.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdbool.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "util/json_writer.h"
#include "util/atomic_file.h"

const char *gp_trace_kind_name(enum gp_task_kind kind)
{
    switch (kind) {
    case GP_TASK_FORWARD: return "forward";
    case GP_TASK_BACKWARD: return "backward";
    case GP_TASK_RECOMPUTE: return "recompute";
    case GP_TASK_COPY: return "copy";
    case GP_TASK_LOSS: return "loss";
    case GP_TASK_OPTIMIZER: return "optimizer";
    case GP_TASK_OTHER: return "other";
    }
    return "other";
}

/* Which way a copy goes: +1 to the next stage, -1 to the previous one, 0
 * when its name says neither (a load of inputs, say). */
static int copy_direction(const char *name)
{
    if (!name || !name[0] || strcmp(name, "copy") == 0 || strstr(name, "activ")) return 1;
    if (strstr(name, "grad")) return -1;
    return 0;
}

void gp_trace_span_name(const struct gp_task_tag *tag, char *buf, size_t size)
{
    if (size == 0) return;
    const char *head;
    switch (tag->kind) {
    case GP_TASK_FORWARD: head = "F"; break;
    case GP_TASK_BACKWARD: head = "B"; break;
    case GP_TASK_RECOMPUTE: head = "R"; break;
    case GP_TASK_LOSS: head = "loss"; break;
    case GP_TASK_OPTIMIZER: head = "optimizer"; break;
    default: head = tag->name && tag->name[0] ? tag->name : gp_trace_kind_name(tag->kind); break;
    }
    int dir = tag->kind == GP_TASK_COPY ? copy_direction(tag->name) : 0;
    int len;
    if (dir != 0 && tag->stage >= 0) {
        len = snprintf(buf, size, "copy s%d->s%d", tag->stage, tag->stage + dir);
    } else {
        len = snprintf(buf, size, "%s", head);
        if (len >= 0 && (size_t)len < size && tag->stage >= 0)
            len += snprintf(buf + len, size - (size_t)len, " s%d", tag->stage);
    }
    if (len >= 0 && (size_t)len < size && tag->microbatch >= 0)
        snprintf(buf + len, size - (size_t)len, " m%d", tag->microbatch);
}

/* Microseconds rounded to nanoseconds, so that the file does not carry
 * clock noise in 17 digits. */
static double round_ns(double us) { return round(us * 1e3) / 1e3; }

static void write_meta(struct gp_json *j, const char *what, int pid, int tid, const char *key,
                       const char *sval, int ival)
{
    gp_json_object_begin(j);
    gp_json_key(j, "name");
    gp_json_string(j, what);
    gp_json_key(j, "ph");
    gp_json_string(j, "M");
    gp_json_key(j, "pid");
    gp_json_int(j, pid);
    gp_json_key(j, "tid");
    gp_json_int(j, tid);
    gp_json_key(j, "args");
    gp_json_object_begin(j);
    gp_json_key(j, key);
    if (sval) gp_json_string(j, sval);
    else gp_json_int(j, ival);
    gp_json_object_end(j);
    gp_json_object_end(j);
}

static void write_trace(FILE *f, const struct gp_trace_stream *streams, int n, const struct gp_trace_info *info)
{
    double t0 = INFINITY;
    for (int i = 0; i < n; i++)
        for (int k = 0; k < streams[i].count; k++)
            if (streams[i].spans[k].start_us < t0) t0 = streams[i].spans[k].start_us;
    if (!isfinite(t0) || (info && info->rank_name)) t0 = 0;

    struct gp_json j;
    gp_json_init(&j, f, false);
    gp_json_object_begin(&j);
    gp_json_key(&j, "traceEvents");
    gp_json_array_begin(&j);
    bool ranked = info && info->rank_name;
    for (int i = 0; i < n; i++) {
        const struct gp_trace_stream *st = &streams[i];
        int pid = ranked ? info->rank : st->device;
        bool first_of_device = true;
        for (int p = 0; p < i; p++)
            if (ranked || streams[p].device == st->device) first_of_device = false;
        if (first_of_device) {
            /* "cpu" becomes "cpu:0"; a name that has its index already stays. */
            char dname[96], pname[256];
            const char *dn = st->device_name && st->device_name[0] ? st->device_name : "device";
            if (strchr(dn, ':')) snprintf(dname, sizeof dname, "%s", dn);
            else snprintf(dname, sizeof dname, "%s:%d", dn, st->device);
            if (ranked) snprintf(pname, sizeof pname, "%s %s", info->rank_name, dname);
            else snprintf(pname, sizeof pname, "%s", dname);
            write_meta(&j, "process_name", pid, 0, "name", pname, 0);
            write_meta(&j, "process_sort_index", pid, 0, "sort_index", NULL, pid);
        }
        /* Thread ids unique across the ranks' files, for merging them. */
        int tid = ranked ? info->rank * 64 + i : i;
        write_meta(&j, "thread_name", pid, tid, "name", st->stream_name ? st->stream_name : "stream", 0);
        write_meta(&j, "thread_sort_index", pid, tid, "sort_index", NULL, tid);
        for (int k = 0; k < st->count; k++) {
            const struct gp_trace_span *sp = &st->spans[k];
            char name[96];
            gp_trace_span_name(&sp->tag, name, sizeof name);
            double dur = sp->end_us - sp->start_us;
            gp_json_object_begin(&j);
            gp_json_key(&j, "name");
            gp_json_string(&j, name);
            gp_json_key(&j, "cat");
            gp_json_string(&j, gp_trace_kind_name(sp->tag.kind));
            gp_json_key(&j, "ph");
            gp_json_string(&j, "X");
            gp_json_key(&j, "ts");
            gp_json_double(&j, round_ns(sp->start_us - t0));
            gp_json_key(&j, "dur");
            gp_json_double(&j, round_ns(dur > 0 ? dur : 0));
            gp_json_key(&j, "pid");
            gp_json_int(&j, pid);
            gp_json_key(&j, "tid");
            gp_json_int(&j, tid);
            gp_json_key(&j, "args");
            gp_json_object_begin(&j);
            gp_json_key(&j, "stage");
            gp_json_int(&j, sp->tag.stage);
            gp_json_key(&j, "microbatch");
            gp_json_int(&j, sp->tag.microbatch);
            gp_json_object_end(&j);
            gp_json_object_end(&j);
        }
    }
    gp_json_array_end(&j);
    gp_json_key(&j, "displayTimeUnit");
    gp_json_string(&j, "ms");
    if (info) {
        gp_json_key(&j, "otherData");
        gp_json_object_begin(&j);
        gp_json_key(&j, "pipeline_schedule");
        gp_json_string(&j, info->pipeline_schedule ? info->pipeline_schedule : "");
        gp_json_key(&j, "checkpoint");
        gp_json_string(&j, info->checkpoint ? info->checkpoint : "");
        gp_json_key(&j, "stages");
        gp_json_int(&j, info->stages);
        gp_json_key(&j, "micro_batches");
        gp_json_int(&j, info->micro_batches);
        if (ranked) {
            gp_json_key(&j, "rank");
            gp_json_int(&j, info->rank);
        }
        gp_json_object_end(&j);
    }
    gp_json_object_end(&j);
    gp_json_finish(&j);
}

gp_status gp_trace_write(const char *path, const struct gp_trace_stream *streams, int n,
                         struct gp_error *err)
{
    return gp_trace_write_info(path, streams, n, NULL, err);
}

gp_status gp_trace_write_info(const char *path, const struct gp_trace_stream *streams, int n,
                              const struct gp_trace_info *info, struct gp_error *err)
{
    struct gp_atomic_file file;
    GP_TRY(gp_atomic_create(&file, path, err));
    FILE *f = gp_atomic_stream(&file);
    if (!f) {
        gp_atomic_abort(&file);
        return gp_error_set(err, GP_ERR_IO, "cannot write '%s'", path);
    }
    write_trace(f, streams, n, info);
    return gp_atomic_commit(&file, err);
}
