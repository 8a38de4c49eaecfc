/* libFuzzer target: any bytes given to the loader end in GP_OK or an error
 * with a message, never a crash, a hang or a sanitizer report. External data
 * is refused (dir NULL) so the fuzzer cannot reach the file system. */
#include <stddef.h>
#include <stdint.h>

#include "onnx/load.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct gp_graph g;
    struct gp_error err = {0};
    if (gp_onnx_load_buffer(data, size, NULL, 2, &g, &err) == GP_OK) gp_graph_free(&g);
    else if (err.msg[0] == '\0') __builtin_trap(); /* every failure must explain itself */
    return 0;
}
