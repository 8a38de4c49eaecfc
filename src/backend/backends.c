/* The backends this build has (backend/backends.h). */
#include "backend/backends.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef GP_HAVE_CUDA
#include "backend/cuda/device.h"
#endif

const struct gp_device_ops *gp_backend_find(const char *name)
{
    if (strcmp(name, "cpu") == 0) return &gp_cpu_device_ops;
#ifdef GP_HAVE_CUDA
    if (strcmp(name, "cuda") == 0) return &gp_cuda_device_ops;
#endif
    return NULL;
}

char *gp_backend_choices_export(void)
{
    /* Only the CUDA backend measures (cuDNN's algorithms). */
    const struct gp_device_ops *cuda = gp_backend_find("cuda");
    return cuda && cuda->choices_export ? cuda->choices_export() : NULL;
}

gp_status gp_backend_choices_import(const char *text, char *note, size_t note_size, struct gp_error *err)
{
    if (note_size) note[0] = '\0';
    if (!text || !*text) return GP_OK;
    size_t name = strcspn(text, " \n");
    char backend[16];
    snprintf(backend, sizeof backend, "%.*s", (int)(name < 15 ? name : 15), text);
    const struct gp_device_ops *ops = gp_backend_find(backend);
    if (!ops || !ops->choices_import) {
        snprintf(note, note_size,
                 "the state's %s kernel choices were left out (this build has no %s backend): the run "
                 "continues but not bit for bit",
                 backend, backend);
        return GP_OK;
    }
    return ops->choices_import(text, note, note_size, err);
}

void gp_backend_on_measure(gp_measure_fn fn, void *user)
{
#ifdef GP_HAVE_CUDA
    gp_cuda_on_measure(fn, user); /* only the CUDA backend measures */
#else
    (void)fn, (void)user;
#endif
}

void gp_backend_on_wait(gp_wait_fn fn, void *user)
{
#ifdef GP_HAVE_CUDA
    gp_cuda_on_wait(fn, user); /* a CPU device's transfers have deadlines of their own */
#else
    (void)fn, (void)user;
#endif
}

void gp_backend_peer_access(bool on)
{
#ifdef GP_HAVE_CUDA
    gp_cuda_peer_access(on);
#else
    (void)on;
#endif
}

static void measure_one(void *user, double seconds)
{
    struct gp_measure_count *m = user;
    m->problems++;
    m->seconds += seconds;
    m->report(m->user, m->problems, m->seconds, false);
}

void gp_measure_begin(struct gp_measure_count *m)
{
    m->problems = 0;
    m->seconds = 0;
    if (m->report) gp_backend_on_measure(measure_one, m);
}

void gp_measure_end(struct gp_measure_count *m)
{
    if (!m->report) return;
    gp_backend_on_measure(NULL, NULL);
    if (m->problems) m->report(m->user, m->problems, m->seconds, true);
}

gp_status gp_device_list_parse(const char *list, int max, int *n_out, bool *cuda, int *index, struct gp_error *err)
{
    if (!list || !*list)
        return gp_error_set(err, GP_ERR_INVALID, "no devices: give a list such as cuda:0,cuda:1 or cpu:0,cpu:1");
    int n = 0;
    const char *p = list;
    while (*p) {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        char item[64];
        if (len == 0 || len >= sizeof item || n >= max)
            return gp_error_set(err, GP_ERR_INVALID, "bad device list '%s'", list);
        memcpy(item, p, len);
        item[len] = '\0';
        bool gpu = false;
        const char *digits = NULL;
        if (!strncmp(item, "cpu", 3) && (item[3] == '\0' || item[3] == ':')) {
            digits = item[3] == ':' ? item + 4 : "0";
        } else if (!strncmp(item, "cuda", 4) && (item[4] == '\0' || item[4] == ':')) {
            gpu = true;
            digits = item[4] == ':' ? item + 5 : "0";
        } else if (item[0] >= '0' && item[0] <= '9') {
            gpu = true;
            digits = item;
        } else {
            return gp_error_set(err, GP_ERR_INVALID, "unknown device '%s' (cuda:N, N or cpu:N)", item);
        }
        char *num = NULL;
        long idx = strtol(digits, &num, 10);
        if (*num || num == digits || idx < 0 || idx > 1023)
            return gp_error_set(err, GP_ERR_INVALID, "bad device '%s'", item);
        cuda[n] = gpu;
        index[n++] = (int)idx;
        p += len;
        if (*p == ',') p++;
    }
    *n_out = n;
    return GP_OK;
}
