/* The public API's jobs of several processes (gpo_job_join, and gpo_train
 * in a context that joined one): one rank of a job launched by mpirun or
 * srun (src/dist/). It checks the launch, joins the ranks and makes them
 * agree on the run, and gives the trainer the link between stage
 * processes: rank = replica x P + stage runs that stage of that
 * data-parallel replica, on CPU devices (frontiers and sums over MPI) or on
 * the GPU of its local rank (over NCCL, dist/nccl.h). Rank 0 reports and
 * writes; the others train their stages beside it. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "api/api.h"
#include "backend/backends.h"
#include "dist/agree.h"
#include "dist/comm.h"
#include "dist/launch.h"
#include "dist/nccl.h"
#include "dist/rank_gpus.h"
#include "pipeline/pipeline.h"
#include "pipeline/schedule.h"
#include "train/state.h"
#include "train/trainer.h"
#include "util/atomic_file.h"
#include "util/xxh64.h"
#ifdef GP_HAVE_CUDA
#include "backend/cuda/device_query.h"
#endif

struct gpo_job {
    struct gp_launch launch;
    struct gp_comm *comm;     /* NULL once ended */
    int pipeline, replicas;   /* stages and data-parallel replicas: launch.size = their product */
    int64_t bucket_kib;
    struct gp_pipe_remote remote; /* several processes: this rank's stage and its link to the others */
    /* Stages on GPUs: this rank's GPU (by its local rank) and the NCCL
     * links between the ranks' GPUs; -1 and NULL on CPU devices. */
    int gpu;
    struct gp_nccl *nccl;
    /* The state every rank agreed to continue from: the newest whole one
     * of the folder given, as this rank found it. */
    char resume_state[4352];
    /* This rank failed where the others cannot know: gpo_close aborts. */
    bool failed_alone;
};

bool gpo_job_remote(const gpo_model *m) { return m->job && m->job->launch.size > 1; }

/* The message of a failure every rank reached alike: rank 0's to say, the
 * others' "" (gpo_job_join's contract). */
#define FAIL_ALIKE(m, rank, st, ...) ((rank) == 0 ? gpo_fail(m, st, __VA_ARGS__) : fail_quietly(m, st))

/* How long a rank other than 0 waits before it returns such a failure:
 * launchers end the whole job at the first non-zero exit, which killed
 * rank 0 before its message was out when another rank got there first
 * (the mpi test saw it now and then). Rank 0 exits at once and the
 * launcher ends the waiting ones. */
#define QUIET_RANK_WAIT_MS 3000

static gpo_status fail_quietly(gpo_model *m, gpo_status st)
{
    struct timespec t = {QUIET_RANK_WAIT_MS / 1000, (QUIET_RANK_WAIT_MS % 1000) * 1000000L};
    while (nanosleep(&t, &t) != 0 && errno == EINTR) {
    }
    return gpo_fail(m, st, "%s", "");
}

void gpo_job_options_init(struct gpo_job_options *o)
{
    memset(o, 0, sizeof *o);
    o->bucket_kib = 1024;
    o->comm_timeout = 300;
}

/* The shortest of 15 or 17 significant digits that reads back exactly: two
 * ranks agree on a setting when they agree on its bits. */
static const char *fmt_double(double v, char *buf, size_t size)
{
    snprintf(buf, size, "%.15g", v);
    if (strtod(buf, NULL) != v) snprintf(buf, size, "%.17g", v);
    return buf;
}

/* "N bytes, xxh64 H" of the file each rank reads, shown after its path:
 * ranks on several machines read their own copies, maybe from other paths,
 * and agree when the bytes are the same. */
static void add_file(struct gp_agree_record *r, const char *label, const char *path)
{
    if (!path) {
        gp_agree_add(r, label, "(none)");
        return;
    }
    FILE *f = fopen(path, "rb");
    unsigned char *buf = malloc(1 << 20);
    if (!f || !buf) {
        if (f) fclose(f);
        free(buf);
        gp_agree_fail(r, "cannot read %s '%s'", label, path);
        return;
    }
    struct gp_xxh64 h;
    gp_xxh64_init(&h, 0);
    size_t n;
    long long bytes = 0;
    while ((n = fread(buf, 1, 1 << 20, f)) > 0) {
        gp_xxh64_update(&h, buf, n);
        bytes += (long long)n;
    }
    bool bad = ferror(f);
    fclose(f);
    free(buf);
    if (bad) {
        gp_agree_fail(r, "cannot read %s '%s'", label, path);
        return;
    }
    char hex[17];
    gp_xxh64_hex(gp_xxh64_digest(&h), hex);
    gp_agree_add_detail(r, label, path, "%lld bytes, xxh64 %s", bytes, hex);
}

/* What a rank is describing its run for: the caller's notes (rank 0's
 * alone) and where the state to resume from goes. */
struct describing {
    int rank;
    const struct gpo_train_callbacks *cb;
    struct gpo_job *job;
};

static void skipped_state(void *user, const char *message)
{
    const struct describing *d = user;
    if (d->rank == 0 && d->cb && d->cb->on_note) d->cb->on_note(d->cb->user, message);
}

/* --resume: the newest whole state of what was given, as this rank sees
 * it, into job->resume_state, and its manifest's bytes (which hold every
 * tensor's digest) to agree on: every rank continues from the same state,
 * read from a file system they share or from copies of it. */
static void describe_resume(const struct gp_train_config *c, struct describing *d, struct gp_agree_record *r)
{
    const char *given = c->resume_path;
    if (!given) {
        gp_agree_add(r, "--resume", "(none)");
        return;
    }
    struct gp_state *s = NULL;
    struct gp_error err = {0};
    if (gp_state_open_latest(given, skipped_state, d, &s, &err) != GP_OK) {
        gp_agree_fail(r, "%s", err.msg);
        return;
    }
    char manifest[4200];
    snprintf(d->job->resume_state, sizeof d->job->resume_state, "%s", s->path);
    snprintf(manifest, sizeof manifest, "%s/%s", s->path, GP_STATE_MANIFEST);
    gp_state_close(s);
    add_file(r, "--resume", manifest);
}

/* What must be equal on every rank: everything that decides the arithmetic
 * or the shape of the job. Outputs (--save, --metrics) are rank 0's alone,
 * --trace each rank's own file, and --devices, --cuda-graph and --quiet
 * are each rank's. */
static void describe_run(const struct gpo_train_config *given, const struct gp_train_config *c,
                         const char *auto_balance, int pipeline, int replicas, struct describing *d,
                         struct gp_agree_record *r)
{
    char a[64];
    add_file(r, "model", c->model_path);
    if (given->synthetic > 0) {
        gp_agree_add(r, "--synthetic", "%lld", (long long)given->synthetic);
    } else {
        add_file(r, "--data", given->data);
        add_file(r, "--labels", given->labels);
        add_file(r, "--val-data", given->val_data);
        add_file(r, "--val-labels", given->val_labels);
    }
    gp_agree_add(r, "--pipeline", "%d (x %d replicas)", pipeline, replicas);
    /* Every stage on GPUs (NCCL) or every one on CPUs (MPI): the ranks'
     * links must be of one kind. */
    bool cuda = false;
    for (int k = 0; k < c->n_stages; k++) cuda |= c->stage_cuda[k];
    gp_agree_add(r, "the stages' devices", "%s", cuda ? "GPUs" : "CPUs");
    gp_agree_add(r, "--batch", "%lld", (long long)c->batch);
    gp_agree_add(r, "--chunks", "%lld", (long long)c->chunks);
    gp_agree_add(r, "--epochs", "%lld", (long long)c->epochs);
    gp_agree_add(r, "--steps", "%lld", (long long)c->steps);
    gp_agree_add(r, "--no-shuffle", "%s", c->shuffle ? "off" : "on");
    gp_agree_add(r, "--seed", "%llu", (unsigned long long)c->seed);
    gp_agree_add(r, "--loss", "%s", c->loss_auto ? "auto" : c->loss == GP_LOSS_CROSS_ENTROPY ? "cross-entropy"
                                                       : c->loss == GP_LOSS_MSE             ? "mse"
                                                                                            : "output");
    gp_agree_add(r, "--class-axis", "%d", c->class_axis);
    gp_agree_add(r, "--dropout", "%s", c->dropout_ratio < 0 ? "(the model's)" : fmt_double(c->dropout_ratio, a, sizeof a));
    gp_agree_add(r, "--optimizer", "%s", c->optimizer == GP_OPT_ADAMW ? "adamw" : "sgd");
    gp_agree_add(r, "--lr", "%s", fmt_double(c->lr, a, sizeof a));
    gp_agree_add(r, "--momentum", "%s", fmt_double(c->momentum, a, sizeof a));
    gp_agree_add(r, "--nesterov", "%s", c->nesterov ? "on" : "off");
    gp_agree_add(r, "--weight-decay", "%s", fmt_double(c->weight_decay, a, sizeof a));
    gp_agree_add(r, "--beta1", "%s", fmt_double(c->beta1, a, sizeof a));
    gp_agree_add(r, "--beta2", "%s", fmt_double(c->beta2, a, sizeof a));
    gp_agree_add(r, "--eps", "%s", fmt_double(c->eps, a, sizeof a));
    gp_agree_add(r, "--torch-arithmetic", "%s", c->torch_1_13 ? "1.13" : "2");
    static const char *const schedules[] = {"constant", "step", "cosine"};
    gp_agree_add(r, "--schedule", "%s", schedules[c->schedule]);
    gp_agree_add(r, "--warmup-steps", "%lld", (long long)c->warmup_steps);
    gp_agree_add(r, "--step-size", "%lld", (long long)c->step_size);
    gp_agree_add(r, "--gamma", "%s", fmt_double(c->gamma, a, sizeof a));
    gp_agree_add(r, "--min-lr", "%s", fmt_double(c->min_lr, a, sizeof a));
    gp_agree_add(r, "--clip-norm", "%s", c->clip_norm > 0 ? fmt_double(c->clip_norm, a, sizeof a) : "(none)");
    gp_agree_add(r, "--precision", "%s", gp_precision_name(c->precision));
    gp_agree_add(r, "--fast-conv", "%s", c->fast_conv ? "on" : "off");
    static const char *const remakes[] = {"auto", "always", "never"};
    gp_agree_add(r, "--recompute-norm", "%s", remakes[c->remake_norm]);
    gp_agree_add(r, "--memory-limit", "%lld", (long long)c->memory_limit);
    gp_agree_add(r, "--layout", "%s", gp_layout_policy_name(c->layout));
    gp_agree_add(r, "--deferred-batch-norm", "%s", c->deferred_batch_norm ? "on" : "off");
    gp_agree_add(r, "--pipeline-schedule", "%s", gp_pipe_schedule_name(c->pipeline_schedule));
    gp_agree_add(r, "--checkpoint", "%s", gp_checkpoint_name(c->checkpoint));
    char balance[64 * 12] = "";
    size_t len = 0;
    for (int k = 0; k < pipeline && c->balance[0] && len < sizeof balance; k++)
        len += (size_t)snprintf(balance + len, sizeof balance - len, "%s%d", k ? "," : "", c->balance[k]);
    gp_agree_add(r, "--balance", "%s", auto_balance ? auto_balance : balance[0] ? balance : "(even)");
    describe_resume(c, d, r);
    /* Saving a state is collective (rank 0 gathers every stage's part). */
    gp_agree_add(r, "--save-state", "%s", c->state_dir ? "given" : "(none)");
    gp_agree_add(r, "--save-every", "%lld steps, %g s, keep %d", (long long)c->save_every, c->save_every_seconds,
                 c->keep);
    /* A stage's replicas must cut their gradient sums alike. */
    gp_agree_add(r, "--bucket-kib", "%lld", (long long)d->job->bucket_kib);
    gp_agree_add(r, "--algorithms", "%s", c->choices_path ? c->choices_path : "(none)");
    /* Rank 0 writes --save, but every stage's process sends it its weights. */
    gp_agree_add(r, "--save", "%s", c->save_path ? "given" : "(none)");
}

/* The ranks' layout: rank = replica x P + stage. Replica 0 is ranks
 * 0 .. P-1, so rank 0 (which reports and writes) is its stage 0, and a
 * job of P ranks is one replica as before; a replica's stages are
 * neighbours, which mpirun's default placement (by slot) keeps on one
 * host, where the frontiers travel every micro-batch, while the gradient
 * sums, once per step, cross hosts. */
static int rank_of(const struct gpo_job *d, int replica, int stage) { return replica * d->pipeline + stage; }

static gp_status stage_send(void *ctx, int to, int tag, const void *buf, size_t bytes, struct gp_error *err)
{
    struct gpo_job *d = ctx;
    return gp_comm_send(d->comm, rank_of(d, d->remote.replica, to), tag, buf, bytes, err);
}

static gp_status stage_recv(void *ctx, int from, int tag, void *buf, size_t bytes, struct gp_error *err)
{
    struct gpo_job *d = ctx;
    return gp_comm_recv(d->comm, rank_of(d, d->remote.replica, from), tag, buf, bytes, err);
}

/* Sums over this rank's stage in every replica, in replica order: comm.c
 * makes each element the serial sum in group order, so the replicas'
 * gradients are the same bits whatever the timing. The stages' groups are
 * disjoint: they sum at the same time without meeting. */
static gp_status replicas_sum(struct gpo_job *d, void *data, size_t n, bool f64, struct gp_error *err)
{
    int *ranks = malloc(sizeof(int) * (size_t)d->replicas);
    if (!ranks) return gp_error_set(err, GP_ERR_NOMEM, "out of memory");
    for (int r = 0; r < d->replicas; r++) ranks[r] = rank_of(d, r, d->remote.stage);
    struct gp_comm_group g = {.size = d->replicas, .ranks = ranks};
    gp_status st = f64 ? gp_comm_allreduce_sum_f64(d->comm, &g, data, n, err)
                       : gp_comm_allreduce_sum_f32(d->comm, &g, data, n, err);
    free(ranks);
    return st;
}

static gp_status replicas_sum_f32(void *ctx, float *data, size_t n, struct gp_error *err)
{
    return replicas_sum(ctx, data, n, false, err);
}

static gp_status replicas_sum_f64(void *ctx, double *data, size_t n, struct gp_error *err)
{
    return replicas_sum(ctx, data, n, true, err);
}

static gp_status gpu_send(void *ctx, int to, const void *buf, size_t bytes, struct gp_error *err)
{
    return gp_nccl_send(((struct gpo_job *)ctx)->nccl, to, buf, bytes, err);
}

static gp_status gpu_recv(void *ctx, int from, void *buf, size_t bytes, struct gp_error *err)
{
    return gp_nccl_recv(((struct gpo_job *)ctx)->nccl, from, buf, bytes, err);
}

static gp_status gpu_sum_f32(void *ctx, float *data, size_t n, struct gp_error *err)
{
    return gp_nccl_sum_f32(((struct gpo_job *)ctx)->nccl, data, n, err);
}

static gp_status gpu_sum_f64(void *ctx, double *data, size_t n, struct gp_error *err)
{
    return gp_nccl_sum_f64(((struct gpo_job *)ctx)->nccl, data, n, err);
}

/* The GPU streams' waits, watched: their frontier transfers end only with
 * the neighbours' (gp_nccl_watch). */
static gp_status gpu_watch(void *user, double waited_s, struct gp_error *err)
{
    return gp_nccl_watch(user, waited_s, err);
}

/* The GPU of this rank: one per process of a host, by local rank; the only
 * one it sees when the launcher gave each process its own (srun
 * --gpus-per-task=1, or CUDA_VISIBLE_DEVICES set per rank). -1 with a
 * message in msg when there are too few. */
static int pick_gpu(const struct gp_launch *l, char *msg, size_t size)
{
    int gpus = gpo_gpu_count();
    if (gpus <= 0) {
        snprintf(msg, size, "rank %d: --devices asks for GPUs and this host shows none to it%s", l->rank,
                 gp_nccl_available() ? "" : " (and this build has no CUDA)");
        return -1;
    }
    if (gpus == 1 && (l->local_size == 1 || getenv("CUDA_VISIBLE_DEVICES"))) return 0;
    if (l->local_rank < gpus) return l->local_rank;
    snprintf(msg, size,
             "rank %d is local rank %d of %d processes on its host, which shows it %d GPU%s: NCCL needs one "
             "GPU per process (start at most %d processes per host, e.g. mpirun --map-by ppr:%d:node, or srun "
             "--ntasks-per-node=%d --gpus-per-task=1)",
             l->rank, l->local_rank, l->local_size, gpus, gpus == 1 ? "" : "s", gpus, gpus, gpus);
    return -1;
}

/* Whether two ranks would compute on one GPU (NCCL needs a GPU per
 * process): every rank's host and GPU UUID gathered, so that every rank
 * reaches the same verdict and rank 0 names the two ranks, before NCCL
 * fails with its own "duplicate GPU" error. Collective. */
static gp_status gpus_shared(struct gpo_job *d, int gpu, bool *shared, char *msg, size_t size, struct gp_error *err)
{
    *shared = false;
#ifndef GP_HAVE_CUDA
    /* No GPU stages without CUDA (not_yet): every rank returns here. */
    (void)d, (void)gpu, (void)msg, (void)size, (void)err;
    return GP_OK;
#else
    struct gp_rank_gpu mine = {.index = gpu};
    if (gethostname(mine.host, sizeof mine.host - 1) != 0) snprintf(mine.host, sizeof mine.host, "?");
    mine.host[sizeof mine.host - 1] = '\0';
    GP_TRY(gp_cuda_device_uuid(gpu, mine.uuid, err));
    int n = d->launch.size;
    struct gp_rank_gpu *all = calloc((size_t)n, sizeof *all);
    if (!all) return gp_error_set(err, GP_ERR_NOMEM, "out of memory gathering the ranks' GPUs");
    gp_status st = gp_comm_allgather(d->comm, NULL, &mine, sizeof mine, all, err);
    int a, b;
    if (st == GP_OK && gp_rank_gpus_shared(all, n, &a, &b)) {
        *shared = true;
        gp_rank_gpus_message(all, a, b, msg, size);
    }
    free(all);
    return st;
#endif
}

/* What several processes cannot do yet; NULL when the run is fine. */
static const char *not_yet(const struct gp_train_config *c)
{
    bool cuda = false, cpu = false;
    for (int k = 0; k < c->n_stages; k++) {
        cuda |= c->stage_cuda[k];
        cpu |= !c->stage_cuda[k];
    }
    if (cuda && cpu) return "stages on GPUs and CPUs in one job (give every stage GPUs, or every stage cpu:N)";
    if (cuda && !gp_nccl_available())
        return "stages on GPUs in several processes without NCCL: this gpipe-onnx was built without it (build "
               "with CUDA and MPI, whose toolkit brings NCCL; -Dnccl=enabled says what is missing), or use "
               "--devices cpu:N";
    if (c->state_dir && c->save_every_seconds > 0)
        return "--save-every in seconds across processes (each would decide by its own clock; give a number of "
               "steps)";
    return NULL;
}

/* Leaves the job: the links closed, MPI finalized (or the job aborted when
 * the communicator broke); the context back to one process. */
static void leave(gpo_model *m)
{
    struct gpo_job *d = m->job;
    if (d->nccl) gp_backend_on_wait(NULL, NULL);
    gp_backend_peer_access(true);
    gp_nccl_free(d->nccl);
    gp_comm_finalize(d->comm);
    free(d);
    m->job = NULL;
}

/* A failure only this rank knows of: gpo_close ends the whole job. */
static gpo_status failed_alone(gpo_model *m, gpo_status st)
{
    if (m->job && m->job->launch.size > 1) m->job->failed_alone = true;
    return st;
}

static gpo_status join(gpo_model *m, const struct gpo_train_config *cfg, const struct gpo_job_options *o,
                       const struct gpo_train_callbacks *cb, struct gpo_job *d)
{
    struct gp_error err = {0};
    int pipeline = o->pipeline;
    if (!gp_comm_available())
        return gpo_fail(m, GPO_ERR_UNSUPPORTED,
                        "--pipeline runs one process per stage and replica over MPI, and this gpipe-onnx was "
                        "built without MPI (scripts/bootstrap.sh installs Open MPI; then "
                        "meson setup --reconfigure build and rebuild)");
    if (gp_launch_from_environ(&d->launch, &err) != GP_OK) return gpo_fail(m, gpo_status_of(err.status), "%s", err.msg);
    const struct gp_launch *l = &d->launch;
    if (l->launcher == GP_LAUNCH_NONE)
        return gpo_fail(m, GPO_ERR_ARGUMENT,
                        "--pipeline %d runs one process per stage of each data-parallel replica: start "
                        "N = %d x replicas of them with mpirun -np N or srun -n N (no launcher was found: "
                        "none of OMPI_COMM_WORLD_RANK, PMI_RANK, SLURM_STEP_NUM_TASKS is set)",
                        pipeline, pipeline);
    /* Every rank sees the same launch and options, so every rank refuses
     * these alike, before any waits on another; rank 0 says why. */
    struct gp_train_config c;
    const char *auto_balance;
    gpo_status st = gpo_train_resolve(m, cfg, &c, &auto_balance);
    if (st != GPO_OK) return st;
    if (l->size % pipeline)
        return FAIL_ALIKE(m, l->rank, GPO_ERR_ARGUMENT,
                          "%s started %d processes, not a multiple of --pipeline %d (stages x replicas)",
                          gp_launcher_name(l->launcher), l->size, pipeline);
    d->replicas = l->size / pipeline;
    if (c.batch % d->replicas || (c.batch / d->replicas) % c.chunks)
        return FAIL_ALIKE(m, l->rank, GPO_ERR_ARGUMENT,
                          "--batch %lld is the whole mini-batch, shared by %d replicas (%d processes / --pipeline "
                          "%d), and each share cut into --chunks %lld micro-batches: it must be a multiple of %lld "
                          "(%s)",
                          (long long)c.batch, d->replicas, l->size, pipeline, (long long)c.chunks,
                          (long long)(d->replicas * c.chunks),
                          c.batch % d->replicas ? "the replicas' shares would differ"
                                                : "a share would not cut into equal micro-batches");
    if (c.n_stages != pipeline)
        return FAIL_ALIKE(m, l->rank, GPO_ERR_ARGUMENT, "%s has %d stages but --pipeline %d",
                          c.balance[0] ? "--balance" : "--devices", c.n_stages, pipeline);

    /* NCCL's setting, before MPI starts threads that may read the
     * environment (gp_nccl_init sets it too, then finding it set). */
    for (int k = 0; k < c.n_stages; k++)
        if (c.stage_cuda[k]) setenv("NCCL_NVLS_ENABLE", "0", 0);
    if (gp_comm_init(l, o->comm_timeout, &d->comm, &err) != GP_OK) {
        /* (finalized, or the job aborted when the communicator broke, by
         * gpo_job_join's leave) */
        return gpo_fail(m, gpo_status_of(err.status), "rank %d: %s", l->rank, err.msg);
    }
    int rank = gp_comm_rank(d->comm);
    struct gp_agree_record *mine = malloc(sizeof *mine);
    if (!mine) {
        d->failed_alone = true;
        return gpo_fail(m, GPO_ERR_NOMEM, "rank %d: out of memory", rank);
    }
    gp_agree_init(mine);
    struct describing what = {.rank = rank, .cb = cb, .job = d};
    describe_run(cfg, &c, auto_balance, pipeline, d->replicas, &what, mine);
    gp_status gst = gp_agree_check(d->comm, mine, &err);
    free(mine);
    if (gst == GP_ERR_COMM) {
        d->failed_alone = true;
        return gpo_fail(m, GPO_ERR_COMM, "%s", err.msg);
    }
    /* Every rank reached the same verdict: one says it, all end. */
    if (gst != GP_OK) return FAIL_ALIKE(m, rank, gpo_status_of(gst), "%s", err.msg);
    if (l->size > 1) {
        /* The same verdict on every rank: the settings agree. */
        const char *missing = not_yet(&c);
        if (!missing && !gp_comm_concurrent(d->comm)) missing = "stage processes over an MPI without MPI_THREAD_MULTIPLE";
        if (missing)
            return FAIL_ALIKE(m, rank, GPO_ERR_UNSUPPORTED,
                              "not yet implemented: %s. Training across %d processes (%d stages x %d replicas) "
                              "runs stages and replicas on CPU devices, or on GPUs over NCCL",
                              missing, l->size, pipeline, d->replicas);
        /* GPU stages: each rank on the GPU of its local rank, and NCCL
         * between them (collective: a rank that cannot ends the job). */
        if (c.stage_cuda[rank % pipeline]) {
            char msg[512];
            gp_backend_peer_access(false); /* one GPU here: no contexts on the others' */
            d->gpu = pick_gpu(l, msg, sizeof msg);
            if (d->gpu < 0) {
                d->failed_alone = true;
                return gpo_fail(m, GPO_ERR_UNSUPPORTED, "%s", msg);
            }
            bool shared;
            if (gpus_shared(d, d->gpu, &shared, msg, sizeof msg, &err) != GP_OK) {
                d->failed_alone = true;
                return gpo_fail(m, gpo_status_of(err.status), "rank %d (cuda:%d): %s", rank, d->gpu, err.msg);
            }
            if (shared) return FAIL_ALIKE(m, rank, GPO_ERR_UNSUPPORTED, "%s", msg);
            if (gp_nccl_init(d->comm, d->gpu, pipeline, d->replicas, o->comm_timeout, &d->nccl, &err) != GP_OK) {
                d->failed_alone = true;
                return gpo_fail(m, gpo_status_of(err.status), "rank %d (cuda:%d): setting up NCCL: %s", rank, d->gpu,
                                err.msg);
            }
        }
        d->remote = (struct gp_pipe_remote){.stage = rank % pipeline,
                                            .replica = rank / pipeline,
                                            .replicas = d->replicas,
                                            .ctx = d,
                                            .send = stage_send,
                                            .recv = stage_recv,
                                            .sum_f32 = replicas_sum_f32,
                                            .sum_f64 = replicas_sum_f64,
                                            .bucket_bytes = (size_t)d->bucket_kib << 10};
        if (d->nccl) {
            d->remote.device_send = gpu_send;
            d->remote.device_recv = gpu_recv;
            d->remote.device_sum_f32 = gpu_sum_f32;
            d->remote.device_sum_f64 = gpu_sum_f64;
            gp_backend_on_wait(gpu_watch, d->nccl);
        }
    }
    return GPO_OK;
}

gpo_status gpo_job_join(gpo_model *m, const struct gpo_train_config *cfg, const struct gpo_job_options *opts,
                        const struct gpo_train_callbacks *cb, struct gpo_job_info *out)
{
    if (!m) return GPO_ERR_ARGUMENT;
    gpo_begin(m);
    if (out) memset(out, 0, sizeof *out);
    if (!cfg || !opts || !m->loaded) return gpo_fail(m, GPO_ERR_ARGUMENT, "gpo_job_join: no configuration or model");
    if (m->job) return gpo_fail(m, GPO_ERR_ARGUMENT, "gpo_job_join: this context is in a job already");
    if (opts->pipeline < 1 || opts->pipeline > GPO_MAX_STAGES || opts->bucket_kib < 1 || !(opts->comm_timeout > 0))
        return gpo_fail(m, GPO_ERR_ARGUMENT,
                        "gpo_job_join: pipeline %d (1 to %d), bucket_kib %lld and comm_timeout %g (positive)",
                        opts->pipeline, GPO_MAX_STAGES, (long long)opts->bucket_kib, opts->comm_timeout);
    struct gpo_job *d = calloc(1, sizeof *d);
    if (!d) return gpo_fail(m, GPO_ERR_NOMEM, "out of memory");
    *d = (struct gpo_job){.pipeline = opts->pipeline, .replicas = 1, .bucket_kib = opts->bucket_kib, .gpu = -1};
    m->job = d;
    gpo_status st = join(m, cfg, opts, cb, d);
    if (st != GPO_OK) {
        /* A failure every rank reached alike ends the job now; one of this
         * rank's alone at gpo_close, once the caller has said why. */
        if (!d->failed_alone) leave(m);
        return st;
    }
    if (out) {
        const struct gp_launch *l = &d->launch;
        *out = (struct gpo_job_info){.launcher = gp_launcher_name(l->launcher), .rank = l->rank, .size = l->size,
                                     .local_rank = l->local_rank, .local_size = l->local_size,
                                     .pipeline = d->pipeline, .replicas = d->replicas,
                                     .stage = l->rank % d->pipeline, .replica = l->rank / d->pipeline, .gpu = d->gpu};
    }
    return GPO_OK;
}

void gpo_job_abort(gpo_model *m)
{
    if (m && m->job && m->job->comm && m->job->launch.size > 1) gp_comm_abort(m->job->comm, 1);
}

void gpo_job_end(gpo_model *m)
{
    if (!m || !m->job) return;
    if (m->job->failed_alone && m->job->comm) gp_comm_abort(m->job->comm, 1);
    leave(m);
}

/* ---- training: this rank's part ---- */

/* Rank 0's verdict and counts, as one message to each rank. */
struct balance_msg {
    int32_t ok, n;
    int32_t counts[GPO_MAX_STAGES];
};

#define TAG_BALANCE 100

/* balance "time" / "memory" across processes: rank 0 profiled and split the
 * model (`ok`: it could; its counts in balance[0..n)); the others get its
 * counts. GPO_OK, or GPO_ERR_COMM: rank 0 could not (it said why), or a
 * broken link (this rank's to say, and the job ends). */
static gpo_status share_balance(gpo_model *m, bool ok, int *balance, int n)
{
    struct gpo_job *d = m->job;
    struct gp_error err = {0};
    struct balance_msg msg = {.ok = ok, .n = n};
    int rank = gp_comm_rank(d->comm), size = gp_comm_size(d->comm);
    gp_status st = GP_OK;
    if (rank == 0) {
        for (int k = 0; k < n && ok; k++) msg.counts[k] = balance[k];
        for (int to = 1; to < size && st == GP_OK; to++) st = gp_comm_send(d->comm, to, TAG_BALANCE, &msg, sizeof msg, &err);
    } else {
        st = gp_comm_recv(d->comm, 0, TAG_BALANCE, &msg, sizeof msg, &err);
        if (st == GP_OK && msg.ok && msg.n != n)
            st = gp_error_set(&err, GP_ERR_INVALID, "rank 0 split the model into %d stages, not %d", msg.n, n);
        for (int k = 0; st == GP_OK && msg.ok && k < n; k++) balance[k] = msg.counts[k];
    }
    if (st != GP_OK)
        return failed_alone(m, gpo_fail(m, gpo_status_of(st), "rank %d: agreeing on the balance: %s", rank, err.msg));
    return msg.ok ? GPO_OK : gpo_fail(m, GPO_ERR_COMM, "%s", ""); /* rank 0 said why */
}

/* Profiles and splits as gpo_balance does, on rank 0 (across processes: on
 * its own device, the ranks' devices taken to be alike, at the micro-batch
 * each replica runs, while the others wait within the timeout), and shares
 * the split. */
static gpo_status balance(gpo_model *m, const struct gpo_train_config *c, struct gp_train_config *t,
                          const char *auto_balance, const struct gpo_train_callbacks *cb)
{
    struct gpo_job *d = m->job;
    bool remote = d->launch.size > 1;
    if (remote && d->launch.rank != 0) return share_balance(m, true, t->balance, t->n_stages);
    bool cuda[GPO_MAX_STAGES];
    int index[GPO_MAX_STAGES];
    for (int k = 0; k < t->n_stages; k++) {
        int at = remote ? d->remote.stage : k;
        cuda[k] = t->stage_cuda[at];
        index[k] = t->stage_device[at];
    }
    char own[GPO_MAX_STAGES * 16];
    struct gpo_balance_options bo;
    gpo_train_balance_options(c, cb, gpo_stage_devices(t->n_stages, cuda, index, own, sizeof own),
                              c->batch / d->replicas, auto_balance, &bo);
    const struct gpo_balance_report *rep = NULL;
    gpo_status st = gpo_balance(m, &bo, &rep);
    if (st != GPO_OK) {
        if (remote) share_balance(m, false, t->balance, t->n_stages);
        return st;
    }
    if (cb && cb->on_balance) cb->on_balance(cb->user, &bo, rep);
    for (int s = 0; s < rep->optimal.n_stages; s++) t->balance[s] = rep->optimal.balance[s];
    return remote ? share_balance(m, true, t->balance, t->n_stages) : GPO_OK;
}

/* trace_path with ".rank<R>" before its extension (out.json:
 * out.rank1.json): each rank's own file. */
static void rank_trace_path(int rank, const char *path, char *out, size_t size)
{
    const char *slash = strrchr(path, '/'), *dot = strrchr(path, '.');
    if (dot && slash && dot < slash) dot = NULL;
    if (dot == path || (slash && dot == slash + 1)) dot = NULL; /* ".json" alone is a name */
    size_t stem = dot ? (size_t)(dot - path) : strlen(path);
    snprintf(out, size, "%.*s.rank%d%s", (int)stem, path, rank, dot ? dot : "");
}

gpo_status gpo_job_train(gpo_model *m, const struct gpo_train_config *c, const struct gpo_train_callbacks *cb,
                         struct gpo_train_result *out)
{
    struct gpo_job *d = m->job;
    struct gp_train_config t;
    const char *auto_balance;
    gpo_status st = gpo_train_resolve(m, c, &t, &auto_balance);
    if (st != GPO_OK) return st;
    /* The state every rank agreed to continue from. */
    if (t.resume_path) t.resume_path = d->resume_state;
    bool remote = d->launch.size > 1, writer = !remote || d->launch.rank == 0;
    char rank_trace[4352];
    if (remote) {
        /* This rank runs one stage; rank 0 reports and writes, and every
         * rank writes its own timeline. */
        t.remote = &d->remote;
        /* A GPU stage runs on the GPU of this rank's local rank. */
        if (d->gpu >= 0) t.stage_device[d->remote.stage] = d->gpu;
        if (t.trace_path) {
            rank_trace_path(d->launch.rank, t.trace_path, rank_trace, sizeof rank_trace);
            t.trace_path = rank_trace;
        }
    }
    /* Outputs are checked before anything long (balancing, loading, training). */
    const char *outputs[2] = {writer ? t.save_path : NULL, t.trace_path};
    for (int k = 0; k < 2; k++)
        if (outputs[k] && gp_atomic_check(outputs[k], &m->err) != GP_OK)
            return failed_alone(m, gpo_status_of(m->err.status));
    if (t.state_dir && writer && gp_state_check_dir(t.state_dir, &m->err) != GP_OK)
        return failed_alone(m, gpo_status_of(m->err.status));
    if (auto_balance && (st = balance(m, c, &t, auto_balance, cb)) != GPO_OK) return st;
    /* A failure of one stage's process leaves the others waiting on it:
     * the whole job ends (at gpo_close), not at their timeouts. */
    st = gpo_train_resolved(m, c, &t, cb, out);
    return st == GPO_OK ? st : failed_alone(m, st);
}
