/* Which GPU each rank of a job computes on, by host and UUID. NCCL needs
 * every rank on a GPU of its own; a launcher that gives every process of a
 * host the same CUDA_VISIBLE_DEVICES puts them all on one, and NCCL's own
 * error then names neither the ranks nor the cause. */
#ifndef GP_DIST_RANK_GPUS_H
#define GP_DIST_RANK_GPUS_H

#include <stdbool.h>
#include <stddef.h>

struct gp_rank_gpu {
    char host[64];          /* gethostname's, terminated */
    unsigned char uuid[16]; /* the GPU's, the same in every process */
    int index;              /* the GPU's number as this rank's CUDA counts */
};

/* The first two ranks a < b (in rank order of b, then a) computing on one
 * GPU of one host; false when every rank has its own. */
bool gp_rank_gpus_shared(const struct gp_rank_gpu *all, int n, int *a, int *b);

/* The refusal for ranks a and b of `all`: who shares what, and the usual
 * cause and fix. */
void gp_rank_gpus_message(const struct gp_rank_gpu *all, int a, int b, char *msg, size_t size);

#endif
