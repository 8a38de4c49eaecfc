/* Where this process stands in a job started by a launcher (mpirun, srun):
 * its rank and the job's size, its local rank among the processes of its
 * machine and their number, read from the environment the launcher sets.
 *
 * Read before MPI is initialized (and without MPI at all), so that the
 * command line can tell "not launched by mpirun or srun" from a launch that
 * MPI then fails to join, and pick a GPU by local rank before any CUDA call.
 *
 * Launchers, in the order they are recognized (the first whose rank
 * variable is set decides; mpirun inside a Slurm allocation sets both its
 * own and Slurm's, and its own are the ones that describe this process):
 *
 *   Open MPI     OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK, _LOCAL_SIZE
 *   MPICH / PMI  PMI_RANK, PMI_SIZE, MPI_LOCALRANKID, MPI_LOCALNRANKS
 *                (Hydra's mpiexec, Intel MPI)
 *   Slurm srun   SLURM_PROCID, SLURM_STEP_NUM_TASKS, SLURM_LOCALID, and the
 *                local size from SLURM_STEP_TASKS_PER_NODE ("2(x3),1") at
 *                SLURM_NODEID. SLURM_STEP_NUM_TASKS is set by srun only: a
 *                batch script, which has SLURM_PROCID=0 and SLURM_NTASKS of
 *                the whole allocation, is not taken for a launched rank. */
#ifndef GP_DIST_LAUNCH_H
#define GP_DIST_LAUNCH_H

#include "util/error.h"

enum gp_launcher {
    GP_LAUNCH_NONE,    /* not launched: a job of one process */
    GP_LAUNCH_OPENMPI,
    GP_LAUNCH_PMI,
    GP_LAUNCH_SLURM,
};

struct gp_launch {
    enum gp_launcher launcher;
    int rank, size;             /* 0 <= rank < size */
    int local_rank, local_size; /* 0 <= local_rank < local_size */
};

/* Looks up an environment variable: NULL when unset. Tests pass their own. */
typedef const char *(*gp_launch_getenv_fn)(void *user, const char *name);

/* Reads the launch through get(user, name). Unset variables of every
 * launcher give GP_LAUNCH_NONE, rank 0 of 1. A launcher recognized with a
 * variable missing, not a number, or out of range (rank >= size) is an
 * error naming the variable and its value. */
gp_status gp_launch_detect(gp_launch_getenv_fn get, void *user, struct gp_launch *out, struct gp_error *err);

/* The same from this process's environment. */
gp_status gp_launch_from_environ(struct gp_launch *out, struct gp_error *err);

/* "Open MPI", "MPICH/PMI", "Slurm", "none". */
const char *gp_launcher_name(enum gp_launcher l);

/* Slurm's compressed tasks-per-node list ("2(x3),1": 2, 2, 2, 1): the count
 * of node `node`; -1 when the text is malformed or has fewer nodes. */
int gp_launch_slurm_tasks_on_node(const char *list, int node);

#endif
