/* The backends this build has (backend/backends.h). */
#include "backend/backends.h"

#include <stdio.h>
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
