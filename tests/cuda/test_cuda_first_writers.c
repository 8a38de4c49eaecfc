/* First writers on the GPU (first_writers.h): every layer of every fixture
 * model whose CUDA kernel writes a gradient whole (the unary ops,
 * BatchNormalization, Conv's and ConvTranspose's dX, Add's and Sub's
 * inputs: residual adds and biases) gives the values of
 * adding into zeros, in fp32 and bf16. The CUDA kernels are asked to write
 * first unless GP_CUDA_FIRST_WRITERS=0 (src/backend/cuda/compute.cu); this
 * test sets it to 1, whatever the environment says.
 *
 * The convolutions run on cuDNN's legacy API alone, which adds with its
 * own beta on the plain call's algorithm. By default a result added into
 * its output is measured three ways (cuda/conv_algos.cu) and may run
 * another algorithm than the call that writes it whole, another order of
 * summation: on an H200, ResNet's stem's bf16 data gradient then differed
 * by one last place, a difference of the choices, not of the writes this
 * test checks.
 *
 * Without a CUDA device the test prints why and exits 77 (a skip). */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>

#include <cuda_runtime_api.h>

#include "backend/cuda/device.h"
#include "first_writers.h"

static void test_fixtures(void **state)
{
    (void)state;
    static const struct {
        const char *name;
        int64_t batch;
    } list[] = {
        {"mlp_op17", 16}, {"digits_cnn_op17", 16}, {"resnet_op17", 8}, {"unet_op17", 4}, {"gpt_op17", 8},
    };
    int total = 0;
    for (size_t f = 0; f < sizeof list / sizeof *list; f++)
        total += first_writers_check(&gp_cuda_device_ops, list[f].name, list[f].batch, false);
    if (total < 20) fail_msg("only %d layer calls wrote a gradient whole", total);
}

int main(void)
{
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0) {
        printf("skipped: no CUDA device (%s)\n", e != cudaSuccess ? cudaGetErrorString(e) : "none visible");
        return 77;
    }
    setenv("GP_CUDA_FIRST_WRITERS", "1", 1);
    setenv("GP_CONV_API", "legacy", 1);
    setenv("GP_CONV_ADD_API", "legacy", 1);
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_fixtures)};
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    printf("cuda_first_writers: %s\n", failed ? "FAILED" : "PASSED");
    return failed ? 1 : 0;
}
