/* The public API's files of the caller's own (gpo_file_*: a program's
 * metrics, say) written as the library writes its outputs: beside the
 * target, synced, renamed over it (util/atomic_file.h). */
#include <stdlib.h>

#include "api/api.h"
#include "util/atomic_file.h"

struct gpo_file {
    struct gp_atomic_file file;
};

gpo_status gpo_file_open(gpo_model *m, const char *path, gpo_file **out, FILE **stream)
{
    if (!m) return GPO_ERR_ARGUMENT;
    gpo_begin(m);
    if (!path || !out || !stream) return gpo_fail(m, GPO_ERR_ARGUMENT, "gpo_file_open: no path or no output");
    *out = NULL;
    *stream = NULL;
    gpo_file *o = calloc(1, sizeof *o);
    if (!o) return gpo_fail(m, GPO_ERR_NOMEM, "out of memory");
    if (gp_atomic_create(&o->file, path, &m->err) != GP_OK) {
        free(o);
        return gpo_status_of(m->err.status);
    }
    if (!(*stream = gp_atomic_stream(&o->file))) {
        gp_atomic_abort(&o->file);
        free(o);
        return gpo_fail(m, GPO_ERR_IO, "cannot write '%s'", path);
    }
    *out = o;
    return GPO_OK;
}

gpo_status gpo_file_commit(gpo_model *m, gpo_file *o)
{
    if (!m || !o) {
        gpo_file_abort(o);
        return m ? gpo_fail(m, GPO_ERR_ARGUMENT, "gpo_file_commit: no output") : GPO_ERR_ARGUMENT;
    }
    gpo_begin(m);
    gp_status st = gp_atomic_commit(&o->file, &m->err);
    free(o);
    return gpo_status_of(st);
}

void gpo_file_abort(gpo_file *o)
{
    if (!o) return;
    gp_atomic_abort(&o->file);
    free(o);
}
