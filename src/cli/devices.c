/* gpipe-onnx devices: what this build can train on. */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#ifdef GP_HAVE_CUDA
#include "backend/cuda/device_query.h"
#endif

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
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    printf("cpu      %ld cores\n", cores);
#ifdef GP_HAVE_CUDA
    struct gp_error err = {0};
    struct gp_cuda_versions ver;
    gp_cuda_versions(&ver, &err);
    printf("cuda     runtime %d, driver %d, cuBLAS %d, cuDNN %zu\n", ver.runtime, ver.driver,
           ver.cublas, ver.cudnn);
    struct gp_cuda_device devs[64];
    int count = 0;
    if (gp_cuda_devices(devs, 64, &count, &err) != GP_OK) return gp_cli_fail("%s", err.msg);
    if (!count) printf("cuda     no GPU visible\n");
    for (int i = 0; i < count && i < 64; i++) {
        char a[32], b[32];
        printf("cuda:%d   %s, sm_%d%d, %d SMs, %s free of %s\n", i, devs[i].name, devs[i].major,
               devs[i].minor, devs[i].multiprocessors,
               gp_cli_bytes((int64_t)devs[i].free_bytes, a, sizeof a),
               gp_cli_bytes((int64_t)devs[i].total_bytes, b, sizeof b));
    }
#else
    printf("cuda     not built (configure with -Dcuda=enabled on a machine with nvcc)\n");
#endif
    return GP_EXIT_OK;
}
