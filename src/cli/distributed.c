/* train --pipeline P: the part of the command that runs as one rank of a
 * job launched by mpirun or srun (dist/). It checks the launch, joins the
 * ranks and makes them agree on the run, and gives the trainer the link
 * between stage processes: rank = replica x P + stage runs that stage of
 * that data-parallel replica, on CPU devices (frontiers and sums over MPI)
 * or on the GPU of its local rank (over NCCL, dist/nccl.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "dist/agree.h"
#include "dist/nccl.h"
#include "pipeline/schedule.h"
#include "train/state.h"
#include "train/trainer.h"
#include "util/xxh64.h"

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

static void skipped_state(void *user, const char *message)
{
    if (*(const int *)user == 0) fprintf(stderr, "note: %s\n", message);
}

/* --resume: the newest whole state of what was given, as this rank sees
 * it, into run->resume_state, and its manifest's bytes (which hold every
 * tensor's digest) to agree on: every rank continues from the same state,
 * read from a file system they share or from copies of it. */
static void describe_resume(const struct gp_cli_train_run *run, int rank, struct gp_agree_record *r)
{
    const char *given = run->cfg->resume_path;
    if (!given) {
        gp_agree_add(r, "--resume", "(none)");
        return;
    }
    struct gp_state *s = NULL;
    struct gp_error err = {0};
    if (gp_state_open_latest(given, skipped_state, &rank, &s, &err) != GP_OK) {
        gp_agree_fail(r, "%s", err.msg);
        return;
    }
    char manifest[4200];
    snprintf(run->resume_state, run->resume_state_size, "%s", s->path);
    snprintf(manifest, sizeof manifest, "%s/%s", s->path, GP_STATE_MANIFEST);
    gp_state_close(s);
    add_file(r, "--resume", manifest);
}

/* What must be equal on every rank: everything that decides the arithmetic
 * or the shape of the job. Outputs (--save, --metrics) are rank 0's alone,
 * --trace each rank's own file, and --devices, --cuda-graph and --quiet
 * are each rank's. */
static void describe_run(const struct gp_cli_train_run *run, int pipeline, int replicas, int rank,
                         struct gp_agree_record *r)
{
    const struct gp_train_config *c = run->cfg;
    char a[64];
    add_file(r, "model", c->model_path);
    if (run->synthetic >= 0) {
        gp_agree_add(r, "--synthetic", "%lld", (long long)run->synthetic);
    } else {
        add_file(r, "--data", run->data);
        add_file(r, "--labels", run->labels);
        add_file(r, "--val-data", run->val_data);
        add_file(r, "--val-labels", run->val_labels);
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
    gp_agree_add(r, "--layout", "%s", gp_layout_policy_name(c->layout));
    gp_agree_add(r, "--deferred-batch-norm", "%s", c->deferred_batch_norm ? "on" : "off");
    gp_agree_add(r, "--pipeline-schedule", "%s", gp_pipe_schedule_name(c->pipeline_schedule));
    gp_agree_add(r, "--checkpoint", "%s", gp_checkpoint_name(c->checkpoint));
    char balance[64 * 12] = "";
    size_t len = 0;
    for (int k = 0; k < pipeline && c->balance[0] && len < sizeof balance; k++)
        len += (size_t)snprintf(balance + len, sizeof balance - len, "%s%d", k ? "," : "", c->balance[k]);
    gp_agree_add(r, "--balance", "%s", run->auto_balance ? run->auto_balance : balance[0] ? balance : "(even)");
    describe_resume(run, rank, r);
    /* Saving a state is collective (rank 0 gathers every stage's part). */
    gp_agree_add(r, "--save-state", "%s", c->state_dir ? "given" : "(none)");
    gp_agree_add(r, "--save-every", "%lld steps, %g s, keep %d", (long long)c->save_every, c->save_every_seconds,
                 c->keep);
    /* A stage's replicas must cut their gradient sums alike. */
    gp_agree_add(r, "--bucket-kib", "%lld", (long long)run->bucket_kib);
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
static int rank_of(const struct gp_cli_dist *d, int replica, int stage) { return replica * d->pipeline + stage; }

static gp_status stage_send(void *ctx, int to, int tag, const void *buf, size_t bytes, struct gp_error *err)
{
    struct gp_cli_dist *d = ctx;
    return gp_comm_send(d->comm, rank_of(d, d->remote.replica, to), tag, buf, bytes, err);
}

static gp_status stage_recv(void *ctx, int from, int tag, void *buf, size_t bytes, struct gp_error *err)
{
    struct gp_cli_dist *d = ctx;
    return gp_comm_recv(d->comm, rank_of(d, d->remote.replica, from), tag, buf, bytes, err);
}

/* Sums over this rank's stage in every replica, in replica order: comm.c
 * makes each element the serial sum in group order, so the replicas'
 * gradients are the same bits whatever the timing. The stages' groups are
 * disjoint: they sum at the same time without meeting. */
static gp_status replicas_sum(struct gp_cli_dist *d, void *data, size_t n, bool f64, struct gp_error *err)
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
    return gp_nccl_send(((struct gp_cli_dist *)ctx)->nccl, to, buf, bytes, err);
}

static gp_status gpu_recv(void *ctx, int from, void *buf, size_t bytes, struct gp_error *err)
{
    return gp_nccl_recv(((struct gp_cli_dist *)ctx)->nccl, from, buf, bytes, err);
}

static gp_status gpu_sum_f32(void *ctx, float *data, size_t n, struct gp_error *err)
{
    return gp_nccl_sum_f32(((struct gp_cli_dist *)ctx)->nccl, data, n, err);
}

static gp_status gpu_sum_f64(void *ctx, double *data, size_t n, struct gp_error *err)
{
    return gp_nccl_sum_f64(((struct gp_cli_dist *)ctx)->nccl, data, n, err);
}

/* The GPU of this rank: one per process of a host, by local rank; the only
 * one it sees when the launcher gave each process its own (srun
 * --gpus-per-task=1, or CUDA_VISIBLE_DEVICES set per rank). -1 with a
 * message in msg when there are too few. */
static int pick_gpu(const struct gp_launch *l, char *msg, size_t size)
{
    int gpus = gp_cli_gpu_count();
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

/* What several processes cannot do yet; NULL when the run is fine. */
static const char *not_yet(const struct gp_cli_train_run *run)
{
    const struct gp_train_config *c = run->cfg;
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

int gp_cli_dist_start(const struct gp_cli_train_run *run, int pipeline, double timeout_s, struct gp_cli_dist *out)
{
    *out = (struct gp_cli_dist){.pipeline = pipeline, .replicas = 1, .gpu = -1};
    struct gp_error err = {0};
    if (!gp_comm_available())
        return gp_cli_fail("--pipeline runs one process per stage and replica over MPI, and this gpipe-onnx was "
                           "built without MPI (scripts/bootstrap.sh installs Open MPI; then "
                           "meson setup --reconfigure build and rebuild)");
    if (gp_launch_from_environ(&out->launch, &err) != GP_OK) return gp_cli_fail("%s", err.msg);
    const struct gp_launch *l = &out->launch;
    if (l->launcher == GP_LAUNCH_NONE)
        return gp_cli_usage("train",
                            "--pipeline %d runs one process per stage of each data-parallel replica: start "
                            "N = %d x replicas of them with mpirun -np N or srun -n N (no launcher was found: "
                            "none of OMPI_COMM_WORLD_RANK, PMI_RANK, SLURM_STEP_NUM_TASKS is set)",
                            pipeline, pipeline);
    /* Every rank sees the same launch and options, so every rank refuses
     * these alike, before any waits on another; rank 0 says why. */
#define REFUSE(...) (l->rank == 0 ? gp_cli_usage(__VA_ARGS__) : GP_EXIT_USAGE)
    if (l->size % pipeline)
        return REFUSE("train", "%s started %d processes, not a multiple of --pipeline %d (stages x replicas)",
                            gp_launcher_name(l->launcher), l->size, pipeline);
    out->replicas = l->size / pipeline;
    const struct gp_train_config *c = run->cfg;
    if (c->batch % out->replicas || (c->batch / out->replicas) % c->chunks)
        return REFUSE("train",
                      "--batch %lld is the whole mini-batch, shared by %d replicas (%d processes / --pipeline "
                      "%d), and each share cut into --chunks %lld micro-batches: it must be a multiple of %lld "
                      "(%s)",
                      (long long)c->batch, out->replicas, l->size, pipeline, (long long)c->chunks,
                      (long long)(out->replicas * c->chunks),
                      c->batch % out->replicas ? "the replicas' shares would differ"
                                               : "a share would not cut into equal micro-batches");
    if (run->n_balance && run->n_balance != pipeline)
        return REFUSE("train", "--balance has %d stages but --pipeline %d", run->n_balance, pipeline);
#undef REFUSE

    if (gp_comm_init(l, timeout_s, &out->comm, &err) != GP_OK) {
        int status = gp_cli_fail("rank %d: %s", l->rank, err.msg);
        gp_comm_finalize(out->comm); /* aborts the job when the communicator broke */
        out->comm = NULL;
        return status;
    }
    int rank = gp_comm_rank(out->comm);
    struct gp_agree_record *mine = malloc(sizeof *mine);
    if (!mine) {
        gp_cli_fail("rank %d: out of memory", rank);
        gp_comm_abort(out->comm, GP_EXIT_FAIL);
    }
    gp_agree_init(mine);
    describe_run(run, pipeline, out->replicas, rank, mine);
    gp_status st = gp_agree_check(out->comm, mine, &err);
    free(mine);
    if (st == GP_ERR_COMM) {
        gp_cli_fail("%s", err.msg);
        gp_comm_abort(out->comm, GP_EXIT_FAIL);
    }
    if (st != GP_OK) {
        /* Every rank reached the same verdict: one says it, all end. */
        if (rank == 0) gp_cli_fail("%s", err.msg);
        gp_comm_finalize(out->comm);
        out->comm = NULL;
        return GP_EXIT_FAIL;
    }
    if (l->size > 1) {
        /* The same verdict on every rank: the settings agree. */
        const char *missing = not_yet(run);
        if (!missing && !gp_comm_concurrent(out->comm))
            missing = "stage processes over an MPI without MPI_THREAD_MULTIPLE";
        if (missing) {
            if (rank == 0)
                gp_cli_fail("not yet implemented: %s. Training across %d processes (%d stages x %d replicas) "
                            "runs stages and replicas on CPU devices, or on GPUs over NCCL",
                            missing, l->size, pipeline, out->replicas);
            gp_comm_finalize(out->comm);
            out->comm = NULL;
            return GP_EXIT_FAIL;
        }
        /* GPU stages: each rank on the GPU of its local rank, and NCCL
         * between them (collective: a rank that cannot ends the job). */
        if (c->stage_cuda[rank % pipeline]) {
            char msg[512];
            out->gpu = pick_gpu(l, msg, sizeof msg);
            if (out->gpu < 0) {
                gp_cli_fail("%s", msg);
                gp_comm_abort(out->comm, GP_EXIT_FAIL);
            }
            if (gp_nccl_init(out->comm, out->gpu, pipeline, out->replicas, timeout_s, &out->nccl, &err) != GP_OK) {
                gp_cli_fail("rank %d (cuda:%d): setting up NCCL: %s", rank, out->gpu, err.msg);
                gp_comm_abort(out->comm, GP_EXIT_FAIL);
            }
            if (!run->quiet)
                fprintf(stderr, "rank %d: stage %d of replica %d on cuda:%d (local rank %d), NCCL links up\n", rank,
                        rank % pipeline, rank / pipeline, out->gpu, l->local_rank);
        }
        out->remote = (struct gp_pipe_remote){.stage = rank % pipeline,
                                              .replica = rank / pipeline,
                                              .replicas = out->replicas,
                                              .ctx = out,
                                              .send = stage_send,
                                              .recv = stage_recv,
                                              .sum_f32 = replicas_sum_f32,
                                              .sum_f64 = replicas_sum_f64,
                                              .bucket_bytes = (size_t)run->bucket_kib << 10};
        if (out->nccl) {
            out->remote.device_send = gpu_send;
            out->remote.device_recv = gpu_recv;
            out->remote.device_sum_f32 = gpu_sum_f32;
            out->remote.device_sum_f64 = gpu_sum_f64;
        }
    }
    return GP_EXIT_OK;
}

void gp_cli_dist_end(struct gp_cli_dist *d)
{
    gp_nccl_free(d->nccl);
    d->nccl = NULL;
    gp_comm_finalize(d->comm);
    d->comm = NULL;
}

/* Rank 0's verdict and counts, as one message to each rank. */
struct balance_msg {
    int32_t ok, n;
    int32_t counts[GP_CLI_MAX_DEVICES];
};

#define TAG_BALANCE 100

int gp_cli_dist_share_balance(struct gp_cli_dist *d, bool ok, int *balance, int n)
{
    struct gp_error err = {0};
    struct balance_msg m = {.ok = ok, .n = n};
    int rank = gp_comm_rank(d->comm), size = gp_comm_size(d->comm);
    gp_status st = GP_OK;
    if (rank == 0) {
        for (int k = 0; k < n && ok; k++) m.counts[k] = balance[k];
        for (int to = 1; to < size && st == GP_OK; to++) st = gp_comm_send(d->comm, to, TAG_BALANCE, &m, sizeof m, &err);
    } else {
        st = gp_comm_recv(d->comm, 0, TAG_BALANCE, &m, sizeof m, &err);
        if (st == GP_OK && m.ok && m.n != n)
            st = gp_error_set(&err, GP_ERR_INVALID, "rank 0 split the model into %d stages, not %d", m.n, n);
        for (int k = 0; st == GP_OK && m.ok && k < n; k++) balance[k] = m.counts[k];
    }
    if (st != GP_OK) {
        gp_cli_fail("rank %d: agreeing on the balance: %s", rank, err.msg);
        gp_comm_abort(d->comm, GP_EXIT_FAIL);
    }
    return m.ok ? GP_EXIT_OK : GP_EXIT_FAIL; /* rank 0 said why */
}

void gp_cli_dist_trace_path(const struct gp_cli_dist *d, const char *path, char *out, size_t size)
{
    const char *slash = strrchr(path, '/'), *dot = strrchr(path, '.');
    if (dot && slash && dot < slash) dot = NULL;
    if (dot == path || (slash && dot == slash + 1)) dot = NULL; /* ".json" alone is a name */
    size_t stem = dot ? (size_t)(dot - path) : strlen(path);
    snprintf(out, size, "%.*s.rank%d%s", (int)stem, path, d->launch.rank, dot ? dot : "");
}
