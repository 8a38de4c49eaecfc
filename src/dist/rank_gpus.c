#include "dist/rank_gpus.h"

#include <stdio.h>
#include <string.h>

static bool same_gpu(const struct gp_rank_gpu *x, const struct gp_rank_gpu *y)
{
    return strncmp(x->host, y->host, sizeof x->host) == 0 && memcmp(x->uuid, y->uuid, sizeof x->uuid) == 0;
}

bool gp_rank_gpus_shared(const struct gp_rank_gpu *all, int n, int *a, int *b)
{
    /* Jobs have a few ranks per host: pairs are cheap. */
    for (int j = 1; j < n; j++)
        for (int i = 0; i < j; i++)
            if (same_gpu(&all[i], &all[j])) {
                *a = i;
                *b = j;
                return true;
            }
    return false;
}

void gp_rank_gpus_message(const struct gp_rank_gpu *all, int a, int b, char *msg, size_t size)
{
    char uuid[33];
    for (int k = 0; k < 16; k++) snprintf(uuid + 2 * k, 3, "%02x", all[a].uuid[k]);
    snprintf(msg, size,
             "ranks %d and %d would both compute on GPU %s of host %.64s (their cuda:%d and cuda:%d): NCCL "
             "needs a GPU per process. Give each process of a host its own GPU (srun --gpus-per-task=1, or "
             "CUDA_VISIBLE_DEVICES per rank), or leave CUDA_VISIBLE_DEVICES unset, and each local rank takes "
             "the GPU of its number; one CUDA_VISIBLE_DEVICES for every process shows them all the same GPU",
             a, b, uuid, all[a].host, all[a].index, all[b].index);
}
