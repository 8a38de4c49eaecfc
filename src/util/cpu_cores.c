/* How many cores this process may use (cpu_cores.h). */
#include "util/cpu_cores.h"

#include <sched.h>
#include <stdlib.h>
#include <unistd.h>

int gp_cpu_cores(void)
{
    long cores = 0;
#ifdef CPU_COUNT
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0) cores = CPU_COUNT(&set);
#endif
    if (cores <= 0) cores = sysconf(_SC_NPROCESSORS_ONLN);
    const char *omp = getenv("OMP_NUM_THREADS");
    if (omp && *omp) {
        /* OpenMP's form may be a list ("4,2": per nesting level): the
         * first level's. */
        char *end = NULL;
        long n = strtol(omp, &end, 10);
        if (end != omp && n > 0 && (cores <= 0 || n < cores)) cores = n;
    }
    return cores > 0 ? (cores > 1 << 20 ? 1 << 20 : (int)cores) : 1;
}
