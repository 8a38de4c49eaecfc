#include "onnx/external_data.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util/mapped.h"

struct gp_mapping {
    void *addr;
    size_t len;
    struct gp_mapping *next;
};

/* True when `path` is `dir` itself or lies below it (both already resolved). */
static int inside(const char *dir, const char *path)
{
    size_t n = strlen(dir);
    if (strncmp(dir, path, n) != 0) return 0;
    return path[n] == '/' || (n > 0 && dir[n - 1] == '/');
}

gp_status gp_external_data_map(const char *model_dir, const char *location, int64_t offset,
                               int64_t length, int64_t expected, const char *tensor,
                               struct gp_mapping **list, void **data, struct gp_error *err)
{
    if (!location || !*location)
        return gp_error_set(err, GP_ERR_INVALID,
                            "tensor '%s': external data without a 'location'", tensor);
    if (location[0] == '/')
        return gp_error_set(err, GP_ERR_INVALID,
                            "tensor '%s': external data location '%s' is an absolute path; "
                            "only paths inside the model's folder are allowed",
                            tensor, location);
    if (offset < 0 || length < -1)
        return gp_error_set(err, GP_ERR_INVALID,
                            "tensor '%s': external data has a negative offset or length", tensor);

    char joined[PATH_MAX], real_dir[PATH_MAX], real_file[PATH_MAX];
    if (snprintf(joined, sizeof joined, "%s/%s", model_dir, location) >= (int)sizeof joined)
        return gp_error_set(err, GP_ERR_INVALID, "tensor '%s': external data path is too long",
                            tensor);
    if (!realpath(model_dir, real_dir))
        return gp_error_set(err, GP_ERR_IO, "cannot resolve the model folder '%s': %s", model_dir,
                            strerror(errno));
    if (!realpath(joined, real_file))
        return gp_error_set(err, GP_ERR_IO, "tensor '%s': cannot open external data '%s': %s",
                            tensor, joined, strerror(errno));
    if (!inside(real_dir, real_file))
        return gp_error_set(err, GP_ERR_INVALID,
                            "tensor '%s': external data '%s' lies outside the model's folder '%s'; "
                            "refusing to read it",
                            tensor, location, model_dir);

    int fd = open(real_file, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return gp_error_set(err, GP_ERR_IO, "tensor '%s': cannot open external data '%s': %s",
                            tensor, joined, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return gp_error_set(err, GP_ERR_IO, "tensor '%s': external data '%s' is not a regular file",
                            tensor, joined);
    }
    int64_t size = (int64_t)st.st_size;
    if (length < 0) length = expected >= 0 ? expected : size - offset;
    if (offset > size || length > size - offset) {
        close(fd);
        return gp_error_set(err, GP_ERR_INVALID,
                            "tensor '%s': external data range [%lld, %lld) exceeds '%s' (%lld bytes)",
                            tensor, (long long)offset, (long long)(offset + length), location,
                            (long long)size);
    }
    if (expected >= 0 && length != expected) {
        close(fd);
        return gp_error_set(err, GP_ERR_INVALID,
                            "tensor '%s': external data holds %lld bytes but its shape needs %lld",
                            tensor, (long long)length, (long long)expected);
    }
    struct gp_mapping *m = calloc(1, sizeof *m);
    if (!m) {
        close(fd);
        return gp_error_set(err, GP_ERR_NOMEM, "out of memory mapping '%s'", location);
    }
    long page = sysconf(_SC_PAGESIZE);
    int64_t start = offset - offset % page;
    size_t len = (size_t)(offset - start + length);
    void *addr = len ? mmap(NULL, len, PROT_READ, MAP_PRIVATE, fd, start) : NULL;
    close(fd);
    if (len && addr == MAP_FAILED) {
        free(m);
        return gp_error_set(err, GP_ERR_IO, "tensor '%s': cannot map '%s': %s", tensor, location,
                            strerror(errno));
    }
    m->addr = addr;
    m->len = len;
    m->next = *list;
    *list = m;
    if (len) gp_mapped_register(addr, len, real_file);
    *data = len ? (char *)addr + (offset - start) : NULL;
    return GP_OK;
}

bool gp_mapping_adopt(struct gp_mapping **list, void *addr, size_t len)
{
    struct gp_mapping *m = calloc(1, sizeof *m);
    if (!m) return false;
    m->addr = addr;
    m->len = len;
    m->next = *list;
    *list = m;
    return true;
}

void gp_external_data_release(struct gp_mapping *list)
{
    while (list) {
        struct gp_mapping *next = list->next;
        if (list->len) {
            gp_mapped_unregister(list->addr);
            munmap(list->addr, list->len);
        }
        free(list);
        list = next;
    }
}
