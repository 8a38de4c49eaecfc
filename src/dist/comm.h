/* A small communicator over MPI between the ranks of one job: what stage
 * ranks and data-parallel replicas need of each other (frontiers, gradient
 * sums, agreeing on the configuration), with no operation that can wait
 * forever.
 *
 * Every blocking operation is made of MPI's non-blocking calls, polled
 * against a deadline (the communicator's timeout from the operation's
 * start). A rank that died or hangs thus makes its peers fail within the
 * timeout with GP_ERR_COMM and a message naming the rank(s) not heard from,
 * instead of waiting forever. After such a failure the communicator is
 * broken (requests are left pending in MPI): the caller reports the message
 * and ends the job with gp_comm_abort; gp_comm_finalize does the same on a
 * broken communicator, since MPI_Finalize could wait on the lost rank.
 *
 * Collectives take a group: the world ranks that take part, in the order
 * that fixes the arithmetic (NULL: every rank, 0..size-1). Every member
 * must call the same collectives on the same groups in the same order, as
 * with MPI. Sums are reproducible: the same inputs give the same bits run
 * after run, whatever the timing, and equal the serial sum in group order
 * ((x0 + x1) + x2) + ..., in the element type's own arithmetic.
 *
 * Built without MPI (GP_HAVE_MPI unset), gp_comm_init fails with
 * GP_ERR_UNSUPPORTED and a message saying so; nothing else can be called. */
#ifndef GP_DIST_COMM_H
#define GP_DIST_COMM_H

#include <stdbool.h>
#include <stddef.h>

#include "dist/launch.h"
#include "util/error.h"

/* Tags of point-to-point messages: 0 .. GP_COMM_MAX_TAG (collectives use
 * tags above it). */
#define GP_COMM_MAX_TAG 16383

struct gp_comm;

struct gp_comm_group {
    int size;
    const int *ranks; /* world ranks, no repeats */
};

/* Whether this build has MPI. */
bool gp_comm_available(void);

/* Initializes MPI (once per process) and checks that MPI sees the rank and
 * size the launcher announced (a launcher whose processes MPI cannot join
 * gives each a world of one). timeout_s > 0: the longest any operation
 * waits on its peers. */
gp_status gp_comm_init(const struct gp_launch *launch, double timeout_s, struct gp_comm **out, struct gp_error *err);

/* Finalizes MPI, or aborts the job when c is broken. NULL is fine. */
void gp_comm_finalize(struct gp_comm *c);

/* Ends every rank of the job with exit status `code` (MPI_Abort): what a
 * rank does after a failure its peers cannot know of. Does not return. */
_Noreturn void gp_comm_abort(struct gp_comm *c, int code);

/* Changes the timeout of the operations to come (seconds, > 0): a job may
 * allow its first step, which measures and plans, longer than the rest. */
void gp_comm_set_timeout(struct gp_comm *c, double timeout_s);

int gp_comm_rank(const struct gp_comm *c);
int gp_comm_size(const struct gp_comm *c);
/* After a timeout or an MPI error: only gp_comm_abort is left. */
bool gp_comm_broken(const struct gp_comm *c);
/* Whether several threads may send and receive at once
 * (MPI_THREAD_MULTIPLE); otherwise one thread at a time. */
bool gp_comm_concurrent(const struct gp_comm *c);

/* Point to point: `bytes` bytes to world rank `to` under `tag`, and from
 * `from`: a message of another size is an error naming both sizes. */
gp_status gp_comm_send(struct gp_comm *c, int to, int tag, const void *buf, size_t bytes, struct gp_error *err);
gp_status gp_comm_recv(struct gp_comm *c, int from, int tag, void *buf, size_t bytes, struct gp_error *err);

/* Returns once every member has called it (naming the members that did not,
 * on timeout). */
gp_status gp_comm_barrier(struct gp_comm *c, const struct gp_comm_group *g, struct gp_error *err);

/* data[n] becomes the sum over the group's members of their data[n], the
 * same bits on every member: element i is the float (double) sum in group
 * order. Each member adds up one segment of the elements from everyone's
 * copies, then the segments are exchanged, so no member holds more than
 * one extra copy of data. */
gp_status gp_comm_allreduce_sum_f32(struct gp_comm *c, const struct gp_comm_group *g, float *data, size_t n,
                                    struct gp_error *err);
gp_status gp_comm_allreduce_sum_f64(struct gp_comm *c, const struct gp_comm_group *g, double *data, size_t n,
                                    struct gp_error *err);

/* all[k * bytes ...] gets member k's record (`mine` on every member). */
gp_status gp_comm_allgather(struct gp_comm *c, const struct gp_comm_group *g, const void *mine, size_t bytes,
                            void *all, struct gp_error *err);

#endif
