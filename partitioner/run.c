#include "partitioner/run.h"

#include <string.h>

#include "backend/backends.h"
#include "onnx/load.h"
#include "util/cpu_cores.h"

/* What the pipeline gives each CPU device: the cores shared among them. */
static int cpu_threads_per_device(int devices)
{
    int cores = gp_cpu_cores();
    return cores / devices > 1 ? cores / devices : 1;
}

gp_status gp_balance_run(const struct gp_balance_run *run, struct gp_profile *prof, struct gp_balance_report *rep,
                         struct gp_error *err)
{
    const struct gp_balance_config *bc = run->cfg;
    const char *model = run->model, *profile_in = run->profile_in, *profile_out = run->profile_out;
    const bool *cuda = run->cuda;
    const int *device = run->device;
    enum gp_precision precision = run->precision;
    struct gp_compute_options compute = {.precision = precision, .fast_conv = run->fast_conv};
    int repeats = run->repeats;
    int gpu = -1, peer = -1;
    for (int k = 0; k < bc->n_stages; k++) {
        if (!cuda[k]) continue;
        if (gpu < 0) gpu = device[k];
        else if (peer < 0 && device[k] != gpu) peer = device[k];
    }
    const struct gp_device_ops *gpu_ops = gp_backend_find("cuda");
    if (gpu >= 0 && !gpu_ops)
        return gp_error_set(err, GP_ERR_UNSUPPORTED, "this build has no CUDA backend: cannot profile on cuda:%d",
                            gpu);
    struct gp_graph g;
    GP_TRY(gp_onnx_load(model, bc->batch / bc->n_micro, &g, err));
    /* Timed in the layout the stages will train in. */
    if (gp_layout_policy_on(run->layout, gpu >= 0)) gp_graph_channels_last(&g);
    gp_status st;
    if (profile_in) {
        st = gp_profile_load(profile_in, &g, prof, err);
        if (st == GP_OK && strcmp(prof->precision, gp_precision_name(precision)) != 0) {
            st = gp_error_set(err, GP_ERR_INVALID, "%s was profiled in %s, not %s: profile again with --precision %s",
                              profile_in, prof->precision, gp_precision_name(precision), gp_precision_name(precision));
            gp_profile_free(prof);
        } else if (st == GP_OK && gpu >= 0 && prof->fast_conv != run->fast_conv) {
            /* Only the GPU's convolutions differ; a CPU profile serves both. */
            st = gp_error_set(err, GP_ERR_INVALID, "%s was profiled %s --fast-conv: profile again %s it",
                              profile_in, prof->fast_conv ? "with" : "without", run->fast_conv ? "with" : "without");
            gp_profile_free(prof);
        }
    } else if (gpu >= 0) {
        st = gp_profile_device(&g, model, gpu_ops, gpu, peer, &compute, 3, repeats, run->progress, run->user,
                               prof, err);
    } else if (precision == GP_PRECISION_BF16) {
        /* The CPU's bf16 runs its kernels on staged float32 copies: timed as
         * a stage runs them, through the executor. */
        st = gp_profile_device(&g, model, &gp_cpu_device_ops, 0, bc->n_stages > 1 ? 1 : -1, &compute, 2, repeats,
                               run->progress, run->user, prof, err);
    } else {
        st = gp_profile_cpu(&g, model, cpu_threads_per_device(bc->n_stages), 2, repeats,
                            run->progress, run->user, prof, err);
    }
    if (st != GP_OK) {
        gp_graph_free(&g);
        return st;
    }
    /* The profile is saved as measured; remade outputs are the model's. */
    if (profile_out) st = gp_profile_save(prof, profile_out, err);
    if (st == GP_OK && run->remake_norm) {
        const struct gp_compute_ops *ops = gpu >= 0 ? gpu_ops->compute : &gp_cpu_compute_ops;
        gp_profile_remake(&g, ops->saved_bytes, ops->remakes, precision, prof);
    }
    gp_graph_free(&g);
    if (st == GP_OK) st = gp_balance(prof, bc, rep, err);
    if (st != GP_OK) gp_profile_free(prof); /* the caller gets a profile only with a report */
    return st;
}

