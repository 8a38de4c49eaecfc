/* NCCL between GPU stage ranks (dist/nccl.h). */
#include "dist/nccl.h"

#include <stdlib.h>

#ifndef GP_HAVE_NCCL

bool gp_nccl_available(void) { return false; }

gp_status gp_nccl_init(struct gp_comm *c, int device, int pipeline, int replicas, double timeout_s,
                       struct gp_nccl **out, struct gp_error *err)
{
    (void)c, (void)device, (void)pipeline, (void)replicas, (void)timeout_s;
    *out = NULL;
    return gp_error_set(err, GP_ERR_UNSUPPORTED,
                        "stages on GPUs in several processes need NCCL, and this gpipe-onnx was built without it "
                        "(build with CUDA, whose toolkit brings NCCL, or install libnccl-dev; then meson setup "
                        "--reconfigure and rebuild)");
}

void gp_nccl_free(struct gp_nccl *n) { (void)n; }

gp_status gp_nccl_send(struct gp_nccl *n, int to_stage, const void *buf, size_t bytes, struct gp_error *err)
{
    (void)n, (void)to_stage, (void)buf, (void)bytes;
    return gp_error_set(err, GP_ERR_UNSUPPORTED, "built without NCCL");
}

gp_status gp_nccl_recv(struct gp_nccl *n, int from_stage, void *buf, size_t bytes, struct gp_error *err)
{
    (void)n, (void)from_stage, (void)buf, (void)bytes;
    return gp_error_set(err, GP_ERR_UNSUPPORTED, "built without NCCL");
}

gp_status gp_nccl_sum_f32(struct gp_nccl *n, float *data, size_t count, struct gp_error *err)
{
    (void)n, (void)data, (void)count;
    return gp_error_set(err, GP_ERR_UNSUPPORTED, "built without NCCL");
}

gp_status gp_nccl_sum_f64(struct gp_nccl *n, double *data, size_t count, struct gp_error *err)
{
    (void)n, (void)data, (void)count;
    return gp_error_set(err, GP_ERR_UNSUPPORTED, "built without NCCL");
}

gp_status gp_nccl_watch(struct gp_nccl *n, double waited_s, struct gp_error *err)
{
    (void)n, (void)waited_s, (void)err;
    return GP_OK;
}

#else

#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include <cuda_runtime_api.h>
#include <nccl.h>

#include "backend/cuda/device.h"

/* A tag of comm.c's point-to-point range for the unique id. */
#define TAG_NCCL_ID 101

struct gp_nccl {
    int rank, stage, replica, pipeline, replicas, device;
    double timeout_s;
    ncclComm_t world;
    /* Links with the neighbours of this rank's replica (NULL at the ends):
     * activations to the next stage and from the previous one, gradients
     * to the previous stage and from the next one. */
    ncclComm_t act_next, act_prev, grad_prev, grad_next;
    ncclComm_t replicas_comm; /* this stage over its replicas; NULL with one */
    cudaStream_t sum_stream;
    bool broken;
    pthread_mutex_t watch_mu; /* gp_nccl_watch: one abort of the links */
};

static gp_status nccl_fail(struct gp_nccl *n, ncclComm_t comm, ncclResult_t r, const char *what,
                           struct gp_error *err)
{
    const char *last = comm ? ncclGetLastError(comm) : NULL;
    if (n) n->broken = true;
    return gp_error_set(err, GP_ERR_COMM, "rank %d: NCCL %s failed: %s%s%s", n ? n->rank : -1, what,
                        ncclGetErrorString(r), last && last[0] ? ": " : "", last ? last : "");
}

#define NCCL_TRY(n, comm, call, what)                                                                          \
    do {                                                                                                       \
        ncclResult_t r_ = (call);                                                                              \
        if (r_ != ncclSuccess) return nccl_fail((n), (comm), r_, (what), err);                                 \
    } while (0)

static gp_status cuda_fail(struct gp_nccl *n, cudaError_t e, const char *what, struct gp_error *err)
{
    return gp_error_set(err, GP_ERR_DEVICE, "rank %d: %s on cuda:%d failed: %s", n->rank, what, n->device,
                        cudaGetErrorString(e));
}

bool gp_nccl_available(void) { return true; }

/* One split round: every rank calls it; members give a color and key. */
static gp_status split(struct gp_nccl *n, int color, int key, ncclComm_t *out, struct gp_error *err)
{
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    *out = NULL;
    NCCL_TRY(n, n->world, ncclCommSplit(n->world, color, key, out, &config), "ncclCommSplit");
    return GP_OK;
}

/* The links of one direction: links (k, k+1) with k even, then odd, so
 * that a rank is in at most one link of each round. `lower` gets the link
 * with the next stage, `upper` the one with the previous stage. */
static gp_status split_links(struct gp_nccl *n, ncclComm_t *lower, ncclComm_t *upper, struct gp_error *err)
{
    int s = n->stage, P = n->pipeline;
    for (int parity = 0; parity < 2; parity++) {
        int color = NCCL_SPLIT_NOCOLOR, key = 0;
        ncclComm_t *into = NULL;
        if (s % 2 == parity && s + 1 < P) {
            color = n->replica * P + s; /* link (s, s+1): this rank its rank 0 */
            into = lower;
        } else if (s >= 1 && (s - 1) % 2 == parity) {
            color = n->replica * P + s - 1; /* link (s-1, s): its rank 1 */
            key = 1;
            into = upper;
        }
        ncclComm_t c = NULL;
        GP_TRY(split(n, color, key, &c, err));
        if (into) *into = c;
    }
    return GP_OK;
}

gp_status gp_nccl_init(struct gp_comm *c, int device, int pipeline, int replicas, double timeout_s,
                       struct gp_nccl **out, struct gp_error *err)
{
    *out = NULL;
    /* NVLink multicast (NVLS) is off by policy on the machines this runs on;
     * a user who sets the variable decides. */
    setenv("NCCL_NVLS_ENABLE", "0", 0);
    struct gp_nccl *n = calloc(1, sizeof *n);
    if (!n) return gp_error_set(err, GP_ERR_NOMEM, "out of memory");
    n->rank = gp_comm_rank(c);
    n->pipeline = pipeline;
    n->replicas = replicas;
    n->stage = n->rank % pipeline;
    n->replica = n->rank / pipeline;
    n->device = device;
    n->timeout_s = timeout_s;
    pthread_mutex_init(&n->watch_mu, NULL);
    *out = n;
    cudaError_t e = cudaSetDevice(device);
    if (e != cudaSuccess) return cuda_fail(n, e, "cudaSetDevice", err);
    if ((e = cudaStreamCreateWithFlags(&n->sum_stream, cudaStreamNonBlocking)) != cudaSuccess)
        return cuda_fail(n, e, "cudaStreamCreate", err);
    ncclUniqueId id;
    memset(&id, 0, sizeof id);
    int size = gp_comm_size(c);
    if (n->rank == 0) {
        NCCL_TRY(n, NULL, ncclGetUniqueId(&id), "ncclGetUniqueId");
        for (int to = 1; to < size; to++) GP_TRY(gp_comm_send(c, to, TAG_NCCL_ID, &id, sizeof id, err));
    } else {
        GP_TRY(gp_comm_recv(c, 0, TAG_NCCL_ID, &id, sizeof id, err));
    }
    NCCL_TRY(n, NULL, ncclCommInitRank(&n->world, size, id, n->rank), "ncclCommInitRank");
    GP_TRY(split_links(n, &n->act_next, &n->act_prev, err));
    /* Gradients go from stage s+1 to s: on the link (s, s+1) this rank
     * receives them from its next stage, on (s-1, s) it sends them. */
    GP_TRY(split_links(n, &n->grad_next, &n->grad_prev, err));
    if (replicas > 1) GP_TRY(split(n, n->stage, n->replica, &n->replicas_comm, err));
    return GP_OK;
}

void gp_nccl_free(struct gp_nccl *n)
{
    if (!n) return;
    ncclComm_t *all[6] = {&n->act_next, &n->act_prev, &n->grad_prev, &n->grad_next, &n->replicas_comm, &n->world};
    for (int i = 0; i < 6; i++)
        if (*all[i]) {
            if (n->broken) ncclCommAbort(*all[i]);
            else ncclCommDestroy(*all[i]);
        }
    if (n->sum_stream) cudaStreamDestroy(n->sum_stream);
    pthread_mutex_destroy(&n->watch_mu);
    free(n);
}

/* On a link of two ranks: the lower stage is rank 0, the upper rank 1. */
gp_status gp_nccl_send(struct gp_nccl *n, int to_stage, const void *buf, size_t bytes, struct gp_error *err)
{
    ncclComm_t comm = to_stage == n->stage + 1 ? n->act_next : to_stage == n->stage - 1 ? n->grad_prev : NULL;
    if (!comm)
        return gp_error_set(err, GP_ERR_INVALID, "rank %d (stage %d): no NCCL link to stage %d", n->rank, n->stage,
                            to_stage);
    int peer = to_stage > n->stage ? 1 : 0;
    NCCL_TRY(n, comm, ncclSend(buf, bytes, ncclChar, peer, comm, gp_cuda_current_stream()), "ncclSend");
    return GP_OK;
}

gp_status gp_nccl_recv(struct gp_nccl *n, int from_stage, void *buf, size_t bytes, struct gp_error *err)
{
    ncclComm_t comm = from_stage == n->stage - 1 ? n->act_prev : from_stage == n->stage + 1 ? n->grad_next : NULL;
    if (!comm)
        return gp_error_set(err, GP_ERR_INVALID, "rank %d (stage %d): no NCCL link from stage %d", n->rank,
                            n->stage, from_stage);
    int peer = from_stage > n->stage ? 1 : 0;
    NCCL_TRY(n, comm, ncclRecv(buf, bytes, ncclChar, peer, comm, gp_cuda_current_stream()), "ncclRecv");
    return GP_OK;
}

static double seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Waits for the sum within the timeout, watching NCCL's asynchronous
 * errors (a peer that died), rather than blocking in the driver. */
static gp_status wait_sum(struct gp_nccl *n, struct gp_error *err)
{
    double start = seconds();
    for (;;) {
        cudaError_t e = cudaStreamQuery(n->sum_stream);
        if (e == cudaSuccess) return GP_OK;
        if (e != cudaErrorNotReady) return cuda_fail(n, e, "summing over the replicas", err);
        ncclResult_t async = ncclSuccess;
        ncclCommGetAsyncError(n->replicas_comm, &async);
        if (async != ncclSuccess && async != ncclInProgress)
            return nccl_fail(n, n->replicas_comm, async, "ncclAllReduce over the replicas", err);
        if (seconds() - start > n->timeout_s) {
            n->broken = true;
            return gp_error_set(err, GP_ERR_COMM,
                                "rank %d (stage %d, replica %d): the sum over %d replicas did not end within %g s "
                                "(a replica of this stage died or hangs)",
                                n->rank, n->stage, n->replica, n->replicas, n->timeout_s);
        }
        struct timespec nap = {0, 200000};
        nanosleep(&nap, NULL);
    }
}

static gp_status sum(struct gp_nccl *n, void *data, size_t count, ncclDataType_t type, struct gp_error *err)
{
    if (!n->replicas_comm) return GP_OK;
    NCCL_TRY(n, n->replicas_comm, ncclAllReduce(data, data, count, type, ncclSum, n->replicas_comm, n->sum_stream),
             "ncclAllReduce");
    return wait_sum(n, err);
}

gp_status gp_nccl_sum_f32(struct gp_nccl *n, float *data, size_t count, struct gp_error *err)
{
    return sum(n, data, count, ncclFloat32, err);
}

gp_status gp_nccl_sum_f64(struct gp_nccl *n, double *data, size_t count, struct gp_error *err)
{
    return sum(n, data, count, ncclFloat64, err);
}

/* The links aborted (under watch_mu): their operations end, the stuck
 * ones included; gp_nccl_free then has them no more. */
static void abort_links(struct gp_nccl *n)
{
    n->broken = true;
    ncclComm_t *links[4] = {&n->act_next, &n->act_prev, &n->grad_prev, &n->grad_next};
    for (int i = 0; i < 4; i++)
        if (*links[i]) {
            ncclCommAbort(*links[i]);
            *links[i] = NULL;
        }
}

gp_status gp_nccl_watch(struct gp_nccl *n, double waited_s, struct gp_error *err)
{
    if (!n) return GP_OK;
    pthread_mutex_lock(&n->watch_mu);
    gp_status st = GP_OK;
    ncclComm_t links[4] = {n->act_next, n->act_prev, n->grad_prev, n->grad_next};
    const char *names[4] = {"activations to the next stage", "activations from the previous stage",
                            "gradients to the previous stage", "gradients from the next stage"};
    for (int i = 0; i < 4 && st == GP_OK; i++) {
        if (!links[i]) continue;
        ncclResult_t async = ncclSuccess;
        ncclCommGetAsyncError(links[i], &async);
        if (async != ncclSuccess && async != ncclInProgress) {
            char what[96];
            snprintf(what, sizeof what, "sending or receiving %s", names[i]);
            st = nccl_fail(n, links[i], async, what, err);
        }
    }
    if (st == GP_OK && waited_s > n->timeout_s)
        st = gp_error_set(err, GP_ERR_COMM,
                          "rank %d (stage %d, replica %d): its stage's work, with transfers to and from the "
                          "neighbouring stages, did not end within %g s (--comm-timeout): a neighbour died or hangs",
                          n->rank, n->stage, n->replica, n->timeout_s);
    if (st != GP_OK) abort_links(n);
    pthread_mutex_unlock(&n->watch_mu);
    return st;
}

#endif
