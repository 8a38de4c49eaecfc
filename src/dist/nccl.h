/* NCCL between the GPU stage ranks of a job (train --pipeline with stages on
 * GPUs): the frontier copies between neighbouring stages and the sums of a
 * stage's gradients over its data-parallel replicas, on the GPUs, where
 * comm.c moves host memory over MPI.
 *
 * Bootstrap: as nccl-tests do, rank 0 makes the ncclUniqueId and sends it to
 * every rank over the MPI communicator; every rank, on its own GPU, joins
 * the world communicator, then splits it (ncclCommSplit) into:
 *
 *   one communicator per link between stages k and k+1 of a replica and
 *   per direction (activations k -> k+1, gradients k+1 -> k): on each, one
 *   rank only sends and the other only receives, each in micro-batch order
 *   on one stream, so the two ranks issue them in the same order whatever
 *   the interleaving of the stage's other streams (NCCL matches the n-th
 *   send with the n-th receive of a communicator, and operations of one
 *   communicator on several streams may otherwise wait on each other);
 *   one communicator per stage over its replicas (ranks in replica order),
 *   for the gradient sums.
 *
 * Sends and receives are enqueued on the stream of the task that calls
 * them (the CUDA backend's gp_cuda_current_stream: a stage's copy stream
 * for sends, its receive stream from that neighbour for receives in
 * training, its compute stream in evaluation), so they overlap compute as
 * the in-process copies do. Sums run on a stream of their own and are
 * waited for, within the communicator's timeout (the frontiers, within
 * the same timeout, by gp_nccl_watch): ncclAllReduce with a
 * fixed communicator and size gives the same bits run after run, but not
 * the serial sum in replica order that comm.c's sums (the CPU reference)
 * give, since NCCL's ring or tree adds in its own order.
 *
 * NVLink multicast (NVLS) stays off: NCCL_NVLS_ENABLE=0 is set when the
 * environment does not set it.
 *
 * Built without NCCL (GP_HAVE_NCCL unset), gp_nccl_available() is false and
 * gp_nccl_init fails saying so; nothing else may be called. */
#ifndef GP_DIST_NCCL_H
#define GP_DIST_NCCL_H

#include <stdbool.h>
#include <stddef.h>

#include "dist/comm.h"
#include "util/error.h"

struct gp_nccl;

bool gp_nccl_available(void);

/* Collective over every rank of c: rank = replica x pipeline + stage, on
 * GPU `device` of this host (made current). timeout_s: the longest a sum
 * waits. */
gp_status gp_nccl_init(struct gp_comm *c, int device, int pipeline, int replicas, double timeout_s,
                       struct gp_nccl **out, struct gp_error *err);
/* Destroys the communicators (aborts them after a failure). NULL is fine. */
void gp_nccl_free(struct gp_nccl *n);

/* Frontiers, from inside a task of the CUDA backend (enqueued on its
 * stream): bytes of device memory to the next stage (activations) or the
 * previous one (gradients), and from them. `to` and `from` are stages of
 * this rank's replica, its neighbours. */
gp_status gp_nccl_send(struct gp_nccl *n, int to_stage, const void *buf, size_t bytes, struct gp_error *err);
gp_status gp_nccl_recv(struct gp_nccl *n, int from_stage, void *buf, size_t bytes, struct gp_error *err);

/* data[count] (device memory) becomes the sum over this stage's replicas,
 * the same bits on each; returns once it is done. */
gp_status gp_nccl_sum_f32(struct gp_nccl *n, float *data, size_t count, struct gp_error *err);
gp_status gp_nccl_sum_f64(struct gp_nccl *n, double *data, size_t count, struct gp_error *err);

/* The watch over a wait for this rank's GPU streams (backends.h,
 * gp_backend_on_wait), whose frontier transfers only the neighbours
 * complete: an asynchronous error on a link (a peer that died), or a wait
 * past the timeout (a peer that hangs), aborts the links, which ends their
 * stuck transfers, and fails with the reason. Thread-safe. */
gp_status gp_nccl_watch(struct gp_nccl *n, double waited_s, struct gp_error *err);

#endif
