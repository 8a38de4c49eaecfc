#include "util/atomic_file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

gp_status gp_atomic_create(struct gp_atomic_file *a, const char *path, struct gp_error *err)
{
    static atomic_uint counter;
    memset(a, 0, sizeof *a);
    a->fd = -1;
    a->path = path;
    size_t plen = strlen(path);
    a->tmp = malloc(plen + 64);
    if (!a->tmp) return gp_error_set(err, GP_ERR_NOMEM, "out of memory writing '%s'", path);
    for (int attempt = 0; attempt < 100 && a->fd < 0; attempt++) {
        snprintf(a->tmp, plen + 64, "%s.tmp.%ld.%u", path, (long)getpid(), atomic_fetch_add(&counter, 1u));
        a->fd = open(a->tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
        if (a->fd < 0 && errno != EEXIST) break;
    }
    if (a->fd < 0) {
        gp_status st = gp_error_set(err, GP_ERR_IO, "cannot create a file next to '%s': %s", path,
                                    strerror(errno));
        free(a->tmp);
        a->tmp = NULL;
        return st;
    }
    return GP_OK;
}

void gp_atomic_write(struct gp_atomic_file *a, const void *data, size_t n)
{
    const unsigned char *p = data;
    while (n > 0 && !a->write_errno) {
        ssize_t w = write(a->fd, p, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            a->write_errno = w < 0 ? errno : EIO;
            break;
        }
        p += w;
        n -= (size_t)w;
    }
}

FILE *gp_atomic_stream(struct gp_atomic_file *a)
{
    if (!a->stream) a->stream = fdopen(a->fd, "w");
    return a->stream;
}

/* Closes the descriptor (through the stream when there is one). */
static int close_file(struct gp_atomic_file *a)
{
    int rc = a->stream ? fclose(a->stream) : close(a->fd);
    a->stream = NULL;
    a->fd = -1;
    return rc;
}

void gp_atomic_abort(struct gp_atomic_file *a)
{
    if (!a->tmp) return;
    if (a->fd >= 0) close_file(a);
    unlink(a->tmp);
    free(a->tmp);
    a->tmp = NULL;
}

gp_status gp_atomic_commit(struct gp_atomic_file *a, struct gp_error *err)
{
    const char *what = NULL;
    int saved = a->write_errno;
    if (saved) what = "write";
    else if (a->stream && (fflush(a->stream) != 0 || ferror(a->stream))) {
        what = "write";
        saved = errno ? errno : EIO;
    } else if (fsync(a->fd) != 0) {
        what = "fsync";
        saved = errno;
    }
    if (close_file(a) != 0 && !what) {
        what = "close";
        saved = errno;
    }
    if (!what && rename(a->tmp, a->path) != 0) {
        what = "rename";
        saved = errno;
    }
    if (what) {
        gp_atomic_abort(a);
        return gp_error_set(err, GP_ERR_IO, "cannot write '%s': %s failed: %s", a->path, what,
                            strerror(saved ? saved : EIO));
    }
    free(a->tmp);
    a->tmp = NULL;
    /* Make the rename itself durable (best effort: some file systems refuse
     * to fsync a directory, and the data is already safe). */
    char *dir = strdup(a->path);
    if (dir) {
        char *slash = strrchr(dir, '/');
        if (slash) *(slash == dir ? slash + 1 : slash) = '\0';
        int dfd = open(slash ? dir : ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (dfd >= 0) {
            (void)fsync(dfd);
            close(dfd);
        }
        free(dir);
    }
    return GP_OK;
}

gp_status gp_atomic_check(const char *path, struct gp_error *err)
{
    struct stat st;
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode))
        return gp_error_set(err, GP_ERR_IO, "cannot write '%s': it is a folder", path);
    struct gp_atomic_file a;
    GP_TRY(gp_atomic_create(&a, path, err));
    gp_atomic_abort(&a);
    return GP_OK;
}
