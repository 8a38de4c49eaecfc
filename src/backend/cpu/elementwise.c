/* CPU kernels: elementwise family (to be written). */
#include "backend/cpu/kernel.h"

const struct gp_cpu_kernel GP_CPU(gp_cpu_kernels_elementwise)[] = {
    {0},
};
