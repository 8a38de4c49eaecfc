/* Writing a file atomically: into a fresh temporary file beside the target
 * (same file system), then fsync and rename over it. Readers see the old
 * file or the whole new one, never a half-written one; any failure removes
 * the temporary file. Every output the program writes goes through here. */
#ifndef GP_UTIL_ATOMIC_FILE_H
#define GP_UTIL_ATOMIC_FILE_H

#include <stddef.h>
#include <stdio.h>

#include "util/error.h"

struct gp_atomic_file {
    const char *path;
    char *tmp;
    int fd;
    FILE *stream;   /* when opened through gp_atomic_stream */
    int write_errno; /* first write error seen, 0 when none */
};

/* Creates the temporary file (mode 0666 before the umask, like any file
 * the user writes). Errors name the target. */
gp_status gp_atomic_create(struct gp_atomic_file *a, const char *path, struct gp_error *err);
/* Raw writes (all or an error remembered for commit). */
void gp_atomic_write(struct gp_atomic_file *a, const void *data, size_t n);
/* A stdio stream on the file, for text writers; NULL on failure. */
FILE *gp_atomic_stream(struct gp_atomic_file *a);
/* Flushes, fsyncs, closes and renames over the target; makes the rename
 * durable (best effort). On failure names the step and removes the
 * temporary file. */
gp_status gp_atomic_commit(struct gp_atomic_file *a, struct gp_error *err);
/* Gives up: closes and removes the temporary file. */
void gp_atomic_abort(struct gp_atomic_file *a);

/* Whether `path` can be written this way, checked before long work starts:
 * not a folder, and a temporary file can be made beside it (and is removed
 * again). Errors name the path and the reason. */
gp_status gp_atomic_check(const char *path, struct gp_error *err);

#endif
