/* libFuzzer target past the loader: a model that loads (micro-batch 1) and
 * is small is run a training step's forward and backward on the CPU's
 * reference executor, its inputs zero (token ids 0, always in range). Any
 * bytes end in GP_OK or an error with a message, never a crash, a hang or
 * a sanitizer report: a kernel must refuse what its shapes and attributes
 * cannot do, at load (shape inference) or when it runs. Models whose values
 * take more than RUN_BYTES are only loaded, to keep each input fast. */
#include <stddef.h>
#include <stdint.h>

#include "backend/cpu/runner.h"
#include "small_model.h"

#define RUN_BYTES (4 << 20)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct gp_graph g;
    if (!fuzz_load(data, size, &g)) return 0;
    if (fuzz_small_model(&g, RUN_BYTES)) {
        struct gp_error err = {0};
        struct gp_cpu_runner *r = NULL;
        gp_status st = gp_cpu_runner_create_f32(&g, false, &r, &err);
        struct gp_run_opts o = {.training = true, .update_state = true, .seed = 1, .dropout_ratio = -1};
        if (st == GP_OK) st = gp_cpu_runner_forward_f32(r, &o, 0, g.n_nodes, &err);
        if (st == GP_OK) {
            gp_cpu_runner_zero_activation_grads_f32(r);
            st = gp_cpu_runner_backward_f32(r, &o, 0, g.n_nodes, &err);
        }
        if (st != GP_OK && err.msg[0] == '\0') __builtin_trap();
        gp_cpu_runner_free_f32(r);
    }
    gp_graph_free(&g);
    return 0;
}
