/* How many cores this process may use for its CPU kernels. */
#ifndef GP_UTIL_CPU_CORES_H
#define GP_UTIL_CPU_CORES_H

/* The CPUs the process's affinity mask allows (a container's or a batch
 * scheduler's share, `taskset`, an MPI rank bound to its cores), at most
 * OMP_NUM_THREADS where that is a positive number; at least 1. Several
 * processes sharing a machine (a test suite's parallel jobs, ranks on one
 * host) each taking every online core would run several threads on each
 * core, and OpenMP's spinning threads slow down by far more than their
 * share when they do. */
int gp_cpu_cores(void);

#endif
