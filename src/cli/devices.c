/* gpipe-onnx devices: what this build can train on. Built on the public
 * API (include/gpipe_onnx.h) alone. */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "gpipe_onnx.h"

static void help(FILE *f)
{
    fputs("usage: gpipe-onnx devices\n"
          "\n"
          "Lists the devices this build can use: the CPU (always) and, when built with\n"
          "CUDA, every GPU with its memory and the CUDA, cuBLAS and cuDNN versions.\n",
          f);
}

int gp_cmd_devices(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
            help(stdout);
            return GP_EXIT_OK;
        }
        return gp_cli_usage("devices", "unknown argument '%s'", argv[i]);
    }
    struct gpo_system sys;
    gpo_system_info(&sys);
    printf("cpu      %d core%s\n", sys.cpu_cores, sys.cpu_cores == 1 ? "" : "s");
    if (!sys.cuda) {
        printf("cuda     not built (configure with -Dcuda=enabled on a machine with nvcc)\n");
        return GP_EXIT_OK;
    }
    printf("cuda     runtime %d, driver %d, cuBLAS %d, cuDNN %lld\n", sys.cuda_runtime, sys.cuda_driver, sys.cublas,
           (long long)sys.cudnn);
    struct gpo_gpu gpus[64];
    char why[1024];
    int count = gpo_gpus(gpus, 64, why, sizeof why);
    if (count < 0) return gp_cli_fail("%s", why);
    if (!count) printf("cuda     no GPU visible\n");
    for (int i = 0; i < count && i < 64; i++) {
        char a[32], b[32];
        printf("cuda:%d   %s, sm_%d%d, %d SMs, %s free of %s\n", i, gpus[i].name, gpus[i].major, gpus[i].minor,
               gpus[i].multiprocessors, gp_cli_bytes(gpus[i].free_bytes, a, sizeof a),
               gp_cli_bytes(gpus[i].total_bytes, b, sizeof b));
    }
    return GP_EXIT_OK;
}
