/* The launcher's environment (dist/launch.h). */
#include "dist/launch.h"

#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>

/* A launcher's variables: rank and size are required once the rank is set;
 * the local rank and size are required too, except for Slurm's local size,
 * which comes from a list (NULL here). */
struct env_names {
    enum gp_launcher launcher;
    const char *marker; /* set: this launcher started the process */
    const char *rank, *size, *local_rank, *local_size;
};

static const struct env_names launchers[] = {
    {GP_LAUNCH_OPENMPI, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
     "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"},
    {GP_LAUNCH_PMI, "PMI_RANK", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"},
    /* SLURM_PROCID is set in batch scripts too: srun's step is the mark. */
    {GP_LAUNCH_SLURM, "SLURM_STEP_NUM_TASKS", "SLURM_PROCID", "SLURM_STEP_NUM_TASKS", "SLURM_LOCALID", NULL},
};

const char *gp_launcher_name(enum gp_launcher l)
{
    switch (l) {
    case GP_LAUNCH_NONE: return "none";
    case GP_LAUNCH_OPENMPI: return "Open MPI";
    case GP_LAUNCH_PMI: return "MPICH/PMI";
    case GP_LAUNCH_SLURM: return "Slurm";
    }
    return "unknown";
}

/* A decimal integer in [min, max], the whole text. */
static bool parse_int(const char *text, long min, long max, int *out)
{
    if (!text || !*text) return false;
    char *end = NULL;
    errno = 0;
    long v = strtol(text, &end, 10);
    if (errno || *end || end == text || v < min || v > max) return false;
    *out = (int)v;
    return true;
}

/* Reads variable `name` into *out, or fails naming it and its launcher. */
static gp_status read_var(gp_launch_getenv_fn get, void *user, enum gp_launcher l, const char *name, long min,
                          long max, int *out, struct gp_error *err)
{
    const char *text = get(user, name);
    if (!text)
        return gp_error_set(err, GP_ERR_INVALID, "launched by %s, but %s is not set", gp_launcher_name(l), name);
    if (!parse_int(text, min, max, out))
        return gp_error_set(err, GP_ERR_INVALID, "launched by %s, but %s is '%s', not an integer from %ld to %ld",
                            gp_launcher_name(l), name, text, min, max);
    return GP_OK;
}

int gp_launch_slurm_tasks_on_node(const char *list, int node)
{
    if (!list || node < 0) return -1;
    /* The whole list is read before answering: a garbled tail is not
     * taken for a count. */
    const char *p = list;
    long seen = 0;
    int found = -1;
    if (!*p) return -1;
    while (*p) {
        char *end = NULL;
        long count = strtol(p, &end, 10);
        if (end == p || count < 0) return -1;
        long repeat = 1;
        p = end;
        if (*p == '(') {
            if (p[1] != 'x') return -1;
            repeat = strtol(p + 2, &end, 10);
            if (end == p + 2 || repeat < 1 || *end != ')') return -1;
            p = end + 1;
        }
        if (count > 1 << 30) return -1;
        if (found < 0 && node < seen + repeat) found = (int)count;
        seen += repeat;
        if (*p == ',' && p[1]) p++;
        else if (*p) return -1;
    }
    return found;
}

gp_status gp_launch_detect(gp_launch_getenv_fn get, void *user, struct gp_launch *out, struct gp_error *err)
{
    *out = (struct gp_launch){.launcher = GP_LAUNCH_NONE, .rank = 0, .size = 1, .local_rank = 0, .local_size = 1};
    const long most = 1 << 24; /* more ranks than any machine has: a garbled value */
    for (size_t k = 0; k < sizeof launchers / sizeof launchers[0]; k++) {
        const struct env_names *n = &launchers[k];
        if (!get(user, n->marker)) continue;
        struct gp_launch l = {.launcher = n->launcher};
        GP_TRY(read_var(get, user, l.launcher, n->size, 1, most, &l.size, err));
        GP_TRY(read_var(get, user, l.launcher, n->rank, 0, l.size - 1, &l.rank, err));
        if (n->local_size) {
            GP_TRY(read_var(get, user, l.launcher, n->local_size, 1, l.size, &l.local_size, err));
        } else {
            /* Slurm: this node's entry of the step's tasks-per-node list. */
            int node = 0;
            GP_TRY(read_var(get, user, l.launcher, "SLURM_NODEID", 0, most, &node, err));
            const char *list = get(user, "SLURM_STEP_TASKS_PER_NODE");
            if (!list)
                return gp_error_set(err, GP_ERR_INVALID, "launched by Slurm, but SLURM_STEP_TASKS_PER_NODE is not set");
            l.local_size = gp_launch_slurm_tasks_on_node(list, node);
            if (l.local_size < 1 || l.local_size > l.size)
                return gp_error_set(err, GP_ERR_INVALID,
                                    "launched by Slurm, but SLURM_STEP_TASKS_PER_NODE '%s' has no count from 1 to "
                                    "%d for node %d (SLURM_NODEID)",
                                    list, l.size, node);
        }
        GP_TRY(read_var(get, user, l.launcher, n->local_rank, 0, l.local_size - 1, &l.local_rank, err));
        *out = l;
        return GP_OK;
    }
    return GP_OK;
}

static const char *environ_get(void *user, const char *name)
{
    (void)user;
    return getenv(name);
}

gp_status gp_launch_from_environ(struct gp_launch *out, struct gp_error *err)
{
    return gp_launch_detect(environ_get, NULL, out, err);
}
