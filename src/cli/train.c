/* gpipe-onnx train: train a model on .npy data (or synthetic data) and save
 * the trained model back to ONNX. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "cli/cli.h"
#include "gpipe_onnx.h"
#include "data/npy.h"
#include "graph/exporter.h"
#include "graph/graph.h"
#include "onnx/load.h"
#include "partitioner/balance.h"
#include "train/state.h"
#include "train/trainer.h"
#include "util/atomic_file.h"

static void help(FILE *f)
{
    fputs(
        "usage: gpipe-onnx train MODEL.onnx [options]\n"
        "\n"
        "Trains the model and prints the loss as it goes (and validation loss and accuracy\n"
        "after each epoch when validation data is given).\n"
        "\n"
        "data:\n"
        "  --data X.npy          inputs, one sample per row of axis 0 (converted to the\n"
        "                        model input's type)\n"
        "  --labels Y.npy        integer class labels (cross-entropy) or float targets (MSE)\n"
        "  --val-data X.npy, --val-labels Y.npy\n"
        "                        validation set, evaluated after every epoch\n"
        "  --synthetic [N]       random inputs and labels shaped for the model, N samples\n"
        "                        (default: 8 batches), for benchmarks\n"
        "  Without --data, the model's metadata may name its default data: the keys\n"
        "  gpipe-onnx.data, .labels, .val_data, .val_labels (files in the model's folder)\n"
        "  and gpipe-onnx.epochs, .lr, .batch, .optimizer set defaults that flags override.\n"
        "\n"
        "schedule of work:\n"
        "  --batch N             mini-batch size (default 32). The samples are split into\n"
        "                        floor(samples / N) batches per epoch: the last incomplete\n"
        "                        batch is DROPPED (never padded). Validation uses every sample.\n"
        "  --chunks M            micro-batches per mini-batch (default 1; must divide N);\n"
        "                        gradients accumulate over them, one optimizer step per batch\n"
        "  --epochs E            passes over the data (default 1)\n"
        "  --steps S             optimizer steps instead of epochs (wraps over epochs)\n"
        "  --no-shuffle          visit samples in file order (to reproduce another\n"
        "                        framework's run); default: shuffled per epoch by --seed\n"
        "  --seed S              shuffling and dropout seed (default 0)\n"
        "\n"
        "optimization:\n"
        "  --optimizer sgd|adamw (default sgd)\n"
        "  --lr LR               learning rate (default 0.01 for sgd, 0.001 for adamw)\n"
        "  --momentum M          SGD momentum (default 0)\n"
        "  --nesterov            Nesterov momentum\n"
        "  --weight-decay WD     L2 for sgd, decoupled for adamw (default 0 / 0.01)\n"
        "  --beta1 B, --beta2 B, --eps E   AdamW (defaults 0.9, 0.999, 1e-8)\n"
        "  --schedule constant|step|cosine   learning-rate schedule (default constant)\n"
        "  --warmup-steps N      linear warm-up steps (cosine)\n"
        "  --step-size N, --gamma G   step schedule: lr *= G every N steps (default 30, 0.1)\n"
        "  --min-lr LR           cosine floor (default 0)\n"
        "  --clip-norm C         clip gradients to global norm C\n"
        "  --torch-arithmetic 1.13|2   AdamW's float32 operation order: PyTorch 1.13's or\n"
        "                        2.x's (default 2), to reproduce a run to the last bit\n"
        "\n"
        "model:\n"
        "  --loss auto|cross-entropy|mse|output   (default auto: integer labels give\n"
        "                        cross-entropy, float labels MSE, no labels: the model's\n"
        "                        output is the loss)\n"
        "  --class-axis A        class axis of the logits for cross-entropy (default:\n"
        "                        inferred: 1 for [N,C] and [N,C,H,W], last for [N,T,C])\n"
        "  --dropout R           override every Dropout ratio (0 turns dropout off)\n"
        "\n"
        "pipeline:\n"
        "  --devices LIST        one device per stage, e.g. cuda:0,cuda:1 (or 0,1) or\n"
        "                        cpu:0,cpu:1,cpu:2 (a CPU device is a worker thread);\n"
        "                        stages may share a device. Default: cuda:0 when a GPU\n"
        "                        is visible, else cpu:0\n"
        "  --cuda-graph on|off   capture each training step (every stage, micro-batch and\n"
        "                        copy) as one CUDA graph and replay it; default: on when\n"
        "                        every stage is on a GPU and --trace is not given\n"
        "  --precision P         fp32 (default: float32 arithmetic, the CPU's results),\n"
        "                        tf32 (GPU matrix products and convolutions on TF32\n"
        "                        tensor cores, ~1e-3 relative error) or bf16 (as\n"
        "                        PyTorch's autocast: float32 weights, gradients and\n"
        "                        optimizer state; bfloat16 activations, activation\n"
        "                        gradients and frontiers; README: Precision)\n"
        "  --tf32                the same as --precision tf32\n"
        "  --fast-conv           GPU convolutions by cuDNN's fastest algorithms, as\n"
        "                        PyTorch's cudnn.benchmark (non-deterministic ones,\n"
        "                        Winograd, FFT too): faster, the last bits vary run to\n"
        "                        run. Default: the fastest deterministic, precise ones\n"
        "  --layout auto|nchw|nhwc  how activations lie in memory. nhwc: channels-last\n"
        "                        ([N, H, W, C]) from each 2-D convolution through the ops\n"
        "                        that follow it (BatchNorm, MaxPool, activations, the\n"
        "                        residual Add), as PyTorch's channels_last, for cuDNN's\n"
        "                        fast kernels; nchw: as the model says. auto (default):\n"
        "                        nhwc when every stage is on a GPU. Results equal to\n"
        "                        rounding; the CPU computes nhwc on [N, C, H, W] copies\n"
        "  --balance LIST        layers per stage, e.g. 4,4,5 (the indices 'inspect'\n"
        "                        prints); default: an even split by layer count\n"
        "  --balance time|memory profile every layer, split by the exact optimum of that\n"
        "                        objective (as 'gpipe-onnx balance'), print the report\n"
        "  --pipeline-schedule gpipe|1f1b   the order of a step's work (default gpipe).\n"
        "                        gpipe: every forward, then every backward; 1f1b\n"
        "                        (PipeDream-flush): after a warm-up each stage alternates\n"
        "                        one forward and one backward, so stage k of K holds at\n"
        "                        most min(M, K-k) micro-batches' activations instead of\n"
        "                        M. Both give the same trained weights, bit for bit\n"
        "                        (backwards run in micro-batch order in both). (Not\n"
        "                        --schedule: that is the learning-rate schedule)\n"
        "  --checkpoint MODE     always | except_last (default) | never: which\n"
        "                        micro-batches drop their activations after forward and\n"
        "                        recompute them before backward. except_last keeps only\n"
        "                        a micro-batch whose backward is its stage's next action\n"
        "                        after its forward (which costs no memory): with 1f1b\n"
        "                        every micro-batch of the last stage, with gpipe none\n"
        "                        when M > 1 (it then recomputes as always does)\n"
        "  --deferred-batch-norm update BatchNorm running statistics once per mini-batch\n"
        "                        from all its micro-batches (as single-batch training\n"
        "                        would); each micro-batch is still normalized by its own\n"
        "  --trace FILE.json     the last step's timeline as Chrome trace events\n"
        "                        (open in Perfetto or chrome://tracing)\n"
        "\n"
        "several processes (started by mpirun or srun; needs a build with MPI):\n"
        "  --pipeline P          P stages, each a process: N = P x D processes train D\n"
        "                        data-parallel replicas, each rank one stage of one\n"
        "                        replica. --batch is the whole mini-batch (shared by the\n"
        "                        replicas, each share cut into --chunks). Every rank\n"
        "                        checks that all run the same model and settings.\n"
        "                        Today on CPU devices: rank r x P + k runs stage k (of\n"
        "                        --balance) of replica r (--devices one device or one\n"
        "                        per stage); rank 0 reports and saves. A parameter read\n"
        "                        by several stages (tied) is held by each, gradients\n"
        "                        summed; --clip-norm takes the whole model's norm.\n"
        "                        --val-data: each replica evaluates the whole set.\n"
        "                        Not yet: GPUs, states, --trace\n"
        "  --bucket-kib K        replicas sum a stage's gradients in buckets of about K KiB\n"
        "                        (default 1024), each while the backward of earlier\n"
        "                        layers goes on; the same result for any K\n"
        "  --comm-timeout S      the longest a rank waits on another (default 300):\n"
        "                        then every rank ends, naming the one not heard from\n"
        "\n"
        "stopping and resuming:\n"
        "  --save-state DIR      write the training state into DIR/state-NNNNNNNN (N: the\n"
        "                        steps done) every --save-every and at the end: weights,\n"
        "                        optimizer state, BatchNorm statistics, the position in\n"
        "                        the data order and the run's settings, with checksums.\n"
        "                        A state appears only complete (written beside, synced,\n"
        "                        renamed): a killed run loses only the steps since the\n"
        "                        last state\n"
        "  --save-every N|T      every N optimizer steps, or at the first step's end after\n"
        "                        T of wall time since the last state (30s, 10m, 2h);\n"
        "                        default: once per epoch\n"
        "  --keep K              keep the newest K states (default 2); older ones are\n"
        "                        removed once the new one is complete\n"
        "  --resume DIR          continue from the newest whole state in DIR (a corrupt\n"
        "                        or cut-short one is skipped with a note), or from the\n"
        "                        state folder DIR/state-NNNNNNNN. Give the run's options\n"
        "                        again: the trained weights are then bit for bit those of\n"
        "                        an uninterrupted run. May change: --steps and --epochs\n"
        "                        (to train longer; not with --schedule cosine), --devices,\n"
        "                        --balance, --pipeline-schedule, --checkpoint,\n"
        "                        --cuda-graph, validation data and the outputs. Moving\n"
        "                        between CPU and GPU, or --fast-conv, continues with a\n"
        "                        note (not bit for bit). Anything else\n"
        "                        (model, data, --batch, --chunks, --seed, optimizer,\n"
        "                        schedule, --precision...) differing is refused, naming it\n"
        "  --algorithms FILE     cuDNN's convolution algorithms, which are chosen by\n"
        "                        measuring them and decide a result's last bits: taken\n"
        "                        from FILE when it exists, else measured and written into\n"
        "                        FILE once the stages are planned. Runs sharing FILE on\n"
        "                        one kind of GPU compute alike (a resumed run takes its\n"
        "                        state's, which keeps them too)\n"
        "\n"
        "output:\n"
        "  --save OUT.onnx       write the trained model (the input model with updated\n"
        "                        weights and BatchNorm statistics), atomically\n"
        "  --metrics FILE.jsonl  one JSON object per step (step, epoch, loss, lr,\n"
        "                        samples_per_s) and per epoch (val_loss, val_accuracy)\n"
        "  --quiet               no progress output (validation results still print)\n"
        "  -h, --help            this help\n",
        f);
}

/* ---- progress and metrics ---- */

struct progress {
    bool tty, quiet;
    bool mute; /* a rank other than 0: not even the validation results */
    FILE *metrics;
    int64_t total, per_epoch;
    int64_t last_printed;
};

static void on_start(void *user, int64_t total, int64_t per_epoch, const char *summary)
{
    struct progress *p = user;
    p->total = total;
    p->per_epoch = per_epoch;
    if (!p->quiet) fprintf(stderr, "%s\n", summary);
}

static void on_step(void *user, const struct gp_step_report *r)
{
    struct progress *p = user;
    double rate = r->seconds > 0 ? (double)r->samples / r->seconds : 0;
    if (p->metrics) {
        fprintf(p->metrics,
                "{\"step\": %lld, \"epoch\": %lld, \"loss\": %.9g, \"lr\": %.9g, \"samples_per_s\": %.6g}\n",
                (long long)r->step + 1, (long long)r->epoch + 1, r->loss, r->lr, rate);
        fflush(p->metrics);
    }
    if (p->quiet) return;
    double left = r->step + 1 < r->total_steps
                      ? r->elapsed / (double)(r->step + 1 - r->first_step) * (double)(r->total_steps - r->step - 1)
                      : 0;
    if (p->tty) {
        fprintf(stderr, "\rstep %lld/%lld  epoch %lld  loss %.4f  %.0f samples/s  %.0fs left   ",
                (long long)r->step + 1, (long long)r->total_steps, (long long)r->epoch + 1, r->loss,
                rate, left);
        if (r->step + 1 == r->total_steps) fputc('\n', stderr);
    } else if ((r->step + 1) % 10 == 0 || r->step == 0 || r->step + 1 == r->total_steps) {
        fprintf(stderr, "step %lld/%lld epoch %lld loss %.6f samples/s %.0f left %.0fs\n",
                (long long)r->step + 1, (long long)r->total_steps, (long long)r->epoch + 1, r->loss,
                rate, left);
    }
}

static void on_epoch(void *user, const struct gp_epoch_report *r)
{
    struct progress *p = user;
    if (p->metrics && r->has_val) {
        fprintf(p->metrics, "{\"epoch\": %lld, \"step\": %lld, \"train_loss\": %.9g, \"val_loss\": %.9g",
                (long long)r->epoch + 1, (long long)r->step, r->train_loss, r->val_loss);
        if (r->val_accuracy >= 0) fprintf(p->metrics, ", \"val_accuracy\": %.9g", r->val_accuracy);
        fputs("}\n", p->metrics);
        fflush(p->metrics);
    }
    if (!r->has_val || p->mute) return;
    if (p->tty && !p->quiet) fputc('\n', stderr);
    /* Validation results go to stdout: they are the command's result. */
    printf("epoch %lld: train loss %.4f  val loss %.4f", (long long)r->epoch + 1, r->train_loss,
           r->val_loss);
    if (r->val_accuracy >= 0) printf("  val accuracy %.2f%%", 100.0 * r->val_accuracy);
    printf("\n");
    fflush(stdout);
}

static void on_memory(void *user, const struct gp_stage_memory_report *r)
{
    struct progress *p = user;
    if (p->quiet) return;
    char a[32], b[32], c[32], d[32], e[32];
    if (r->stage == 0)
        fprintf(stderr, "%-6s %-10s %-8s %12s %12s %12s %12s %12s\n", "stage", "layers", "device",
                "parameters", "optimizer", "activations", "act. peak", "planned");
    char layers[32];
    snprintf(layers, sizeof layers, "%d-%d", r->first_layer, r->last_layer - 1);
    char device[32];
    snprintf(device, sizeof device, "%s:%d", r->backend ? r->backend : "cpu", r->device);
    fprintf(stderr, "%-6d %-10s %-8s %12s %12s %12s %12s %12s\n", r->stage, layers, device,
            gp_cli_bytes(r->param_bytes, a, sizeof a), gp_cli_bytes(r->optim_bytes, b, sizeof b),
            gp_cli_bytes(r->activation_bytes, c, sizeof c), gp_cli_bytes(r->activation_peak, d, sizeof d),
            gp_cli_bytes(r->planned_bytes, e, sizeof e));
}

static void on_note(void *user, const char *message)
{
    struct progress *p = user;
    if (!p->quiet) fprintf(stderr, "%snote: %s\n", p->tty ? "\n" : "", message);
}

static void on_state(void *user, const char *path, int64_t step)
{
    struct progress *p = user;
    if (!p->quiet) fprintf(stderr, "%ssaved state %s (step %lld)\n", p->tty ? "\n" : "", path, (long long)step);
}

static void on_resume(void *user, const char *path, int64_t step, int64_t total)
{
    struct progress *p = user;
    if (!p->quiet)
        fprintf(stderr, "resumed from %s (step %lld of %lld)\n", path, (long long)step, (long long)total);
}

/* ---- options ---- */

/* --save-every: "40" (steps) or "30s", "10m", "2h" (wall time). */
static bool parse_every(const char *text, int64_t *steps, double *seconds)
{
    char *end = NULL;
    double v = text ? strtod(text, &end) : NAN;
    if (text && end != text && isfinite(v) && v > 0) {
        if (!*end && v == floor(v) && v < 1e15) {
            *steps = (int64_t)v;
            return true;
        }
        double unit = !strcmp(end, "s") ? 1 : !strcmp(end, "m") ? 60 : !strcmp(end, "h") ? 3600 : 0;
        if (unit > 0) {
            *seconds = v * unit;
            return true;
        }
    }
    gp_cli_usage("train", "--save-every takes a number of steps (40) or a time (30s, 10m, 2h), not '%s'",
                 text ? text : "");
    return false;
}

static bool parse_double(const char *opt, const char *text, double min, double *out)
{
    char *end = NULL;
    double v = text ? strtod(text, &end) : NAN;
    if (!text || end == text || *end || !isfinite(v) || v < min) {
        gp_cli_usage("train", "%s needs a number >= %g (got '%s')", opt, min, text ? text : "");
        return false;
    }
    *out = v;
    return true;
}

/* "4,4,5": layers per stage. */
static bool parse_balance(const char *list, struct gp_train_config *cfg, int *count)
{
    int n = 0;
    const char *p = list ? list : "";
    while (*p) {
        char *end = NULL;
        long v = strtol(p, &end, 10);
        if (end == p || v < 1 || v > 1000000 || n >= 64 || (*end && *end != ',')) {
            gp_cli_usage("train", "--balance needs positive layer counts such as 4,4,5 (got '%s')",
                         list ? list : "");
            return false;
        }
        cfg->balance[n++] = (int)v;
        p = *end ? end + 1 : end;
    }
    if (!n) {
        gp_cli_usage("train", "--balance needs positive layer counts such as 4,4,5");
        return false;
    }
    *count = n;
    return true;
}

/* A path from the model's metadata, resolved in the model's folder; refuses
 * absolute paths and '..' so metadata cannot point outside that folder. */
static char *metadata_path(const struct gp_graph *g, const char *model, const char *key)
{
    const char *rel = gp_graph_metadata(g, key);
    if (!rel || !*rel) return NULL;
    if (rel[0] == '/' || strstr(rel, "..")) return NULL;
    const char *slash = strrchr(model, '/');
    size_t dir = slash ? (size_t)(slash - model + 1) : 0;
    char *p = malloc(dir + strlen(rel) + 1);
    if (!p) return NULL;
    memcpy(p, model, dir);
    strcpy(p + dir, rel);
    return p;
}

static gp_status load_array(const char *path, const char *what, struct gp_npy *a, struct gp_error *err)
{
    gp_status st = gp_npy_read(path, a, err);
    if (st != GP_OK) gp_error_prefix(err, "%s: ", what);
    return st;
}

int gp_cmd_train(int argc, char **argv)
{
    struct gp_train_config cfg;
    gp_train_config_defaults(&cfg);
    const char *data = NULL, *labels = NULL, *val_data = NULL, *val_labels = NULL;
    const char *metrics = NULL;
    int64_t synthetic = -1;
    int n_balance = 0;
    const char *auto_balance = NULL;
    bool devices_set = false;
    bool quiet = false, mute = false, lr_set = false, wd_set = false, batch_set = false, epochs_set = false,
         opt_set = false, keep_set = false;
    int pipeline = 0; /* --pipeline P: one rank of a job; 0: one process */
    double comm_timeout = 300;
    int64_t bucket_kib = 1024;
    struct gp_cli_dist dist = {0};

    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
#define TAKE() (i++, v)
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            help(stdout);
            return GP_EXIT_OK;
        } else if (!strcmp(a, "--data")) {
            data = TAKE();
        } else if (!strcmp(a, "--labels")) {
            labels = TAKE();
        } else if (!strcmp(a, "--val-data")) {
            val_data = TAKE();
        } else if (!strcmp(a, "--val-labels")) {
            val_labels = TAKE();
        } else if (!strcmp(a, "--synthetic")) {
            synthetic = 0;
            if (v && v[0] >= '0' && v[0] <= '9' &&
                !gp_cli_parse_int("train", "--synthetic", TAKE(), 1, (int64_t)1 << 40, &synthetic))
                return GP_EXIT_USAGE;
        } else if (!strcmp(a, "--batch")) {
            if (!gp_cli_parse_int("train", a, TAKE(), 1, (int64_t)1 << 31, &cfg.batch)) return GP_EXIT_USAGE;
            batch_set = true;
        } else if (!strcmp(a, "--chunks")) {
            if (!gp_cli_parse_int("train", a, TAKE(), 1, (int64_t)1 << 20, &cfg.chunks)) return GP_EXIT_USAGE;
        } else if (!strcmp(a, "--epochs")) {
            if (!gp_cli_parse_int("train", a, TAKE(), 1, (int64_t)1 << 31, &cfg.epochs)) return GP_EXIT_USAGE;
            epochs_set = true;
        } else if (!strcmp(a, "--steps")) {
            if (!gp_cli_parse_int("train", a, TAKE(), 1, (int64_t)1 << 40, &cfg.steps)) return GP_EXIT_USAGE;
        } else if (!strcmp(a, "--seed")) {
            int64_t s;
            if (!gp_cli_parse_int("train", a, TAKE(), 0, INT64_MAX, &s)) return GP_EXIT_USAGE;
            cfg.seed = (uint64_t)s;
        } else if (!strcmp(a, "--no-shuffle")) {
            cfg.shuffle = false;
        } else if (!strcmp(a, "--optimizer")) {
            const char *o = TAKE();
            if (o && !strcmp(o, "sgd")) cfg.optimizer = GP_OPT_SGD;
            else if (o && !strcmp(o, "adamw")) cfg.optimizer = GP_OPT_ADAMW;
            else return gp_cli_usage("train", "--optimizer is sgd or adamw (got '%s')", o ? o : "");
            opt_set = true;
        } else if (!strcmp(a, "--lr")) {
            if (!parse_double(a, TAKE(), 0, &cfg.lr)) return GP_EXIT_USAGE;
            lr_set = true;
        } else if (!strcmp(a, "--momentum")) {
            if (!parse_double(a, TAKE(), 0, &cfg.momentum)) return GP_EXIT_USAGE;
        } else if (!strcmp(a, "--nesterov")) {
            cfg.nesterov = true;
        } else if (!strcmp(a, "--weight-decay")) {
            if (!parse_double(a, TAKE(), 0, &cfg.weight_decay)) return GP_EXIT_USAGE;
            wd_set = true;
        } else if (!strcmp(a, "--beta1")) {
            if (!parse_double(a, TAKE(), 0, &cfg.beta1)) return GP_EXIT_USAGE;
        } else if (!strcmp(a, "--beta2")) {
            if (!parse_double(a, TAKE(), 0, &cfg.beta2)) return GP_EXIT_USAGE;
        } else if (!strcmp(a, "--eps")) {
            if (!parse_double(a, TAKE(), 0, &cfg.eps)) return GP_EXIT_USAGE;
        } else if (!strcmp(a, "--schedule")) {
            const char *s = TAKE();
            if (s && !strcmp(s, "constant")) cfg.schedule = GP_SCHED_CONSTANT;
            else if (s && !strcmp(s, "step")) cfg.schedule = GP_SCHED_STEP;
            else if (s && !strcmp(s, "cosine")) cfg.schedule = GP_SCHED_COSINE;
            else return gp_cli_usage("train", "--schedule is constant, step or cosine (got '%s')", s ? s : "");
        } else if (!strcmp(a, "--warmup-steps")) {
            if (!gp_cli_parse_int("train", a, TAKE(), 0, (int64_t)1 << 40, &cfg.warmup_steps)) return GP_EXIT_USAGE;
        } else if (!strcmp(a, "--step-size")) {
            if (!gp_cli_parse_int("train", a, TAKE(), 1, (int64_t)1 << 40, &cfg.step_size)) return GP_EXIT_USAGE;
        } else if (!strcmp(a, "--gamma")) {
            if (!parse_double(a, TAKE(), 0, &cfg.gamma)) return GP_EXIT_USAGE;
        } else if (!strcmp(a, "--min-lr")) {
            if (!parse_double(a, TAKE(), 0, &cfg.min_lr)) return GP_EXIT_USAGE;
        } else if (!strcmp(a, "--torch-arithmetic")) {
            const char *t = TAKE();
            if (t && !strcmp(t, "1.13")) cfg.torch_1_13 = true;
            else if (t && !strcmp(t, "2")) cfg.torch_1_13 = false;
            else return gp_cli_usage("train", "--torch-arithmetic is 1.13 or 2 (got '%s')", t ? t : "");
        } else if (!strcmp(a, "--clip-norm")) {
            if (!parse_double(a, TAKE(), 0, &cfg.clip_norm)) return GP_EXIT_USAGE;
        } else if (!strcmp(a, "--loss")) {
            const char *l = TAKE();
            cfg.loss_auto = false;
            if (l && !strcmp(l, "auto")) cfg.loss_auto = true;
            else if (l && !strcmp(l, "cross-entropy")) cfg.loss = GP_LOSS_CROSS_ENTROPY;
            else if (l && !strcmp(l, "mse")) cfg.loss = GP_LOSS_MSE;
            else if (l && !strcmp(l, "output")) cfg.loss = GP_LOSS_OUTPUT;
            else return gp_cli_usage("train", "--loss is auto, cross-entropy, mse or output (got '%s')", l ? l : "");
        } else if (!strcmp(a, "--class-axis")) {
            int64_t ax;
            if (!gp_cli_parse_int("train", a, TAKE(), -8, 7, &ax)) return GP_EXIT_USAGE;
            cfg.class_axis = (int)ax;
        } else if (!strcmp(a, "--dropout")) {
            if (!parse_double(a, TAKE(), 0, &cfg.dropout_ratio)) return GP_EXIT_USAGE;
            if (cfg.dropout_ratio >= 1) return gp_cli_usage("train", "--dropout must be below 1");
        } else if (!strcmp(a, "--devices")) {
            const char *list = TAKE();
            if (!gp_cli_parse_devices("train", list, &cfg.n_stages, cfg.stage_cuda, cfg.stage_device))
                return GP_EXIT_USAGE;
            devices_set = true;
        } else if (!strcmp(a, "--balance")) {
            const char *list = TAKE();
            if (list && (!strcmp(list, "time") || !strcmp(list, "memory"))) auto_balance = list;
            else if (!parse_balance(list, &cfg, &n_balance)) return GP_EXIT_USAGE;
        } else if (!strcmp(a, "--pipeline")) {
            int64_t p;
            if (!gp_cli_parse_int("train", a, TAKE(), 1, GP_CLI_MAX_DEVICES, &p)) return GP_EXIT_USAGE;
            pipeline = (int)p;
        } else if (!strcmp(a, "--bucket-kib")) {
            if (!gp_cli_parse_int("train", a, TAKE(), 1, (int64_t)1 << 30, &bucket_kib)) return GP_EXIT_USAGE;
        } else if (!strcmp(a, "--comm-timeout")) {
            if (!parse_double(a, TAKE(), 0.001, &comm_timeout)) return GP_EXIT_USAGE;
        } else if (!strcmp(a, "--pipeline-schedule")) {
            const char *name = TAKE();
            if (!gp_pipe_schedule_parse(name, &cfg.pipeline_schedule))
                return gp_cli_usage("train", "--pipeline-schedule is gpipe or 1f1b (got '%s')", name ? name : "");
        } else if (!strcmp(a, "--checkpoint")) {
            const char *c = TAKE();
            if (c && !strcmp(c, "always")) cfg.checkpoint = GP_CHECKPOINT_ALWAYS;
            else if (c && !strcmp(c, "except_last")) cfg.checkpoint = GP_CHECKPOINT_EXCEPT_LAST;
            else if (c && !strcmp(c, "never")) cfg.checkpoint = GP_CHECKPOINT_NEVER;
            else return gp_cli_usage("train", "--checkpoint is always, except_last or never (got '%s')", c ? c : "");
        } else if (!strcmp(a, "--deferred-batch-norm")) {
            cfg.deferred_batch_norm = true;
        } else if (!strcmp(a, "--tf32")) {
            cfg.precision = GP_PRECISION_TF32;
        } else if (!strcmp(a, "--precision")) {
            const char *name = TAKE();
            if (!name || !gp_precision_parse(name, &cfg.precision))
                return gp_cli_usage("train", "--precision takes fp32, tf32 or bf16, not '%s'", name ? name : "");
        } else if (!strcmp(a, "--fast-conv")) {
            cfg.fast_conv = true;
        } else if (!strcmp(a, "--layout")) {
            const char *name = TAKE();
            if (!name || !gp_layout_policy_parse(name, &cfg.layout))
                return gp_cli_usage("train", "--layout takes auto, nchw or nhwc, not '%s'", name ? name : "");
        } else if (!strcmp(a, "--cuda-graph")) {
            const char *mode = TAKE();
            if (!mode || (strcmp(mode, "on") && strcmp(mode, "off")))
                return gp_cli_usage("train", "--cuda-graph is on or off");
            cfg.cuda_graph = !strcmp(mode, "on") ? GP_CUDA_GRAPH_ON : GP_CUDA_GRAPH_OFF;
        } else if (!strcmp(a, "--trace")) {
            cfg.trace_path = TAKE();
        } else if (!strcmp(a, "--save")) {
            cfg.save_path = TAKE();
        } else if (!strcmp(a, "--save-state")) {
            cfg.state_dir = TAKE();
        } else if (!strcmp(a, "--save-every")) {
            if (!parse_every(TAKE(), &cfg.save_every, &cfg.save_every_seconds)) return GP_EXIT_USAGE;
        } else if (!strcmp(a, "--keep")) {
            int64_t k;
            if (!gp_cli_parse_int("train", a, TAKE(), 1, 1 << 20, &k)) return GP_EXIT_USAGE;
            cfg.keep = (int)k;
            keep_set = true;
        } else if (!strcmp(a, "--resume")) {
            cfg.resume_path = TAKE();
        } else if (!strcmp(a, "--algorithms")) {
            cfg.choices_path = TAKE();
        } else if (!strcmp(a, "--metrics")) {
            metrics = TAKE();
        } else if (!strcmp(a, "--quiet")) {
            quiet = true;
        } else if (a[0] == '-' && a[1]) {
            return gp_cli_usage("train", "unknown option '%s'", a);
        } else if (!cfg.model_path) {
            cfg.model_path = a;
        } else {
            return gp_cli_usage("train", "only one model can be trained (got '%s' and '%s')",
                                cfg.model_path, a);
        }
        if (i >= argc) return gp_cli_usage("train", "%s needs a value", a);
#undef TAKE
    }
    if (!cfg.model_path) return gp_cli_usage("train", "no model given");
    if (!cfg.state_dir && (cfg.save_every || cfg.save_every_seconds > 0 || keep_set))
        return gp_cli_usage("train", "--save-every and --keep need --save-state DIR");
    if (pipeline > 1) {
        /* --pipeline P: P stages, stage k run by rank k. --devices gives
         * every rank's device, or one per stage; none: as for one process,
         * the GPUs when there are any (not yet across processes: refused
         * then), else CPU devices. */
        if (devices_set && cfg.n_stages != 1 && cfg.n_stages != pipeline)
            return gp_cli_usage("train",
                                "--devices lists %d devices for --pipeline %d: give one (every rank's) or one "
                                "per stage",
                                cfg.n_stages, pipeline);
        if (n_balance && n_balance != pipeline)
            return gp_cli_usage("train", "--balance has %d stages but --pipeline %d", n_balance, pipeline);
        int gpus = devices_set ? 0 : gp_cli_gpu_count();
        for (int k = devices_set && cfg.n_stages == pipeline ? pipeline : 0; k < pipeline; k++) {
            cfg.stage_cuda[k] = devices_set ? cfg.stage_cuda[0] : gpus > 0;
            cfg.stage_device[k] = devices_set ? cfg.stage_device[0] : gpus > 0 ? k % gpus : k;
        }
        cfg.n_stages = pipeline;
        devices_set = true;
    }
    if (!devices_set) {
        /* The GPUs when there are any (stage k on GPU k modulo their number),
         * else CPU devices: a balance alone runs each stage on a CPU device
         * of its own (a worker thread with its share of the cores). */
        int gpus = gp_cli_gpu_count();
        cfg.n_stages = n_balance ? n_balance : 1;
        for (int k = 0; k < cfg.n_stages; k++) {
            cfg.stage_cuda[k] = gpus > 0;
            cfg.stage_device[k] = gpus > 0 ? k % gpus : k;
        }
    }
    if (n_balance && n_balance != cfg.n_stages)
        return gp_cli_usage("train", "--balance has %d stages but --devices has %d", n_balance, cfg.n_stages);
    if ((labels && !data) || (val_labels && !val_data))
        return gp_cli_usage("train", "labels given without their data");
    if (val_data && !data && synthetic < 0)
        return gp_cli_usage("train", "--val-data needs --data");

    struct gp_error err = {0};
    int status = GP_EXIT_OK;
    char *owned[4] = {0};
    struct gp_dataset train = {0}, val = {0};
    struct gp_npy arrays[4] = {0};

    /* Defaults the model carries in its metadata (flags win). */
    struct gp_graph meta;
    if (gp_onnx_load(cfg.model_path, 1, &meta, &err) != GP_OK) return gp_cli_fail("%s", err.msg);
    char export_note[2048];
    if (gp_graph_exporter_note(&meta, export_note, sizeof export_note))
        fprintf(stderr, "note: %s\n", export_note);
    if (!data && synthetic < 0) {
        data = owned[0] = metadata_path(&meta, cfg.model_path, "gpipe-onnx.data");
        labels = owned[1] = metadata_path(&meta, cfg.model_path, "gpipe-onnx.labels");
        val_data = owned[2] = metadata_path(&meta, cfg.model_path, "gpipe-onnx.val_data");
        val_labels = owned[3] = metadata_path(&meta, cfg.model_path, "gpipe-onnx.val_labels");
        const char *s;
        if (!batch_set && (s = gp_graph_metadata(&meta, "gpipe-onnx.batch"))) cfg.batch = atoll(s) > 0 ? atoll(s) : cfg.batch;
        if (!epochs_set && (s = gp_graph_metadata(&meta, "gpipe-onnx.epochs"))) cfg.epochs = atoll(s) > 0 ? atoll(s) : cfg.epochs;
        if (!opt_set && (s = gp_graph_metadata(&meta, "gpipe-onnx.optimizer")))
            cfg.optimizer = !strcmp(s, "adamw") ? GP_OPT_ADAMW : GP_OPT_SGD;
        if (!lr_set && (s = gp_graph_metadata(&meta, "gpipe-onnx.lr")) && atof(s) > 0) {
            cfg.lr = atof(s);
            lr_set = true;
        }
    }
    gp_graph_free(&meta);
    if (!data && synthetic < 0) {
        status = gp_cli_usage("train", "no training data: give --data (and --labels) or --synthetic");
        goto done;
    }
    if (!lr_set) cfg.lr = cfg.optimizer == GP_OPT_ADAMW ? 1e-3 : 0.01;
    if (!wd_set) cfg.weight_decay = cfg.optimizer == GP_OPT_ADAMW ? 0.01 : 0.0;
    if (pipeline) {
        /* Before any output is touched: only rank 0 writes them. */
        struct gp_cli_train_run run = {.cfg = &cfg, .data = data, .labels = labels, .val_data = val_data,
                                       .val_labels = val_labels, .synthetic = synthetic,
                                       .auto_balance = auto_balance, .n_balance = n_balance,
                                       .bucket_kib = bucket_kib};
        status = gp_cli_dist_start(&run, pipeline, comm_timeout, &dist);
        if (status != GP_EXIT_OK) goto done;
        if (dist.launch.size > 1) {
            /* This rank runs one stage; rank 0 reports and writes. */
            cfg.remote = &dist.remote;
            if (dist.launch.rank != 0) {
                quiet = mute = true;
                metrics = NULL;
            }
        }
    }
    /* Outputs are checked before anything long (balancing, loading, training). */
    const char *outputs[3] = {cfg.save_path, cfg.trace_path, metrics};
    for (int k = 0; k < 3 && (!cfg.remote || dist.launch.rank == 0); k++)
        if (outputs[k] && gp_atomic_check(outputs[k], &err) != GP_OK) {
            status = gp_cli_fail("%s", err.msg);
            goto done;
        }
    if (cfg.state_dir && gp_state_check_dir(cfg.state_dir, &err) != GP_OK) {
        status = gp_cli_fail("%s", err.msg);
        goto done;
    }

    if (synthetic >= 0) {
        if (gp_dataset_synthetic(cfg.model_path, synthetic ? synthetic : 8 * cfg.batch, cfg.seed,
                                 &train, &err) != GP_OK) {
            status = gp_cli_fail("%s", err.msg);
            goto done;
        }
    } else {
        const char *paths[4] = {data, labels, val_data, val_labels};
        const char *what[4] = {"--data", "--labels", "--val-data", "--val-labels"};
        for (int k = 0; k < 4; k++)
            if (paths[k] && load_array(paths[k], what[k], &arrays[k], &err) != GP_OK) {
                status = gp_cli_fail("%s", err.msg);
                goto done;
            }
        if (gp_dataset_from_arrays(cfg.model_path, &arrays[0], labels ? &arrays[1] : NULL, &train, &err) != GP_OK ||
            (val_data && gp_dataset_from_arrays(cfg.model_path, &arrays[2], val_labels ? &arrays[3] : NULL,
                                                &val, &err) != GP_OK)) {
            status = gp_cli_fail("%s", err.msg);
            goto done;
        }
        /* The files name the data in messages (the trainer checks them finite). */
        train.x_source = data;
        train.y_source = labels;
        val.x_source = val_data;
        val.y_source = val_labels;
    }

    if (auto_balance) {
        /* Profiled and balanced through the public API, as `balance` does. */
        if (cfg.batch % cfg.chunks) {
            status = gp_cli_usage("train", "--chunks %lld does not divide --batch %lld",
                                  (long long)cfg.chunks, (long long)cfg.batch);
            goto done;
        }
        char devices[GP_CLI_MAX_DEVICES * 16] = "";
        for (int k = 0; k < cfg.n_stages; k++)
            snprintf(devices + strlen(devices), sizeof devices - strlen(devices), "%s%s:%d", k ? "," : "",
                     cfg.stage_cuda[k] ? "cuda" : "cpu", cfg.stage_device[k]);
        struct gpo_balance_options bo;
        gpo_balance_options_init(&bo);
        bo.devices = devices;
        bo.by = !strcmp(auto_balance, "time") ? GPO_BALANCE_TIME : GPO_BALANCE_MEMORY;
        bo.batch = cfg.batch;
        bo.chunks = (int)cfg.chunks;
        bo.schedule = cfg.pipeline_schedule == GP_PIPE_1F1B ? GPO_PIPELINE_1F1B : GPO_PIPELINE_GPIPE;
        bo.checkpoint = cfg.checkpoint == GP_CHECKPOINT_ALWAYS  ? GPO_CHECKPOINT_ALWAYS
                        : cfg.checkpoint == GP_CHECKPOINT_NEVER ? GPO_CHECKPOINT_NEVER
                                                                : GPO_CHECKPOINT_EXCEPT_LAST;
        bo.optimizer = cfg.optimizer == GP_OPT_ADAMW ? GPO_OPTIMIZER_ADAMW : GPO_OPTIMIZER_SGD;
        bo.momentum = cfg.momentum;
        bo.precision = cfg.precision == GP_PRECISION_BF16   ? GPO_PRECISION_BF16
                       : cfg.precision == GP_PRECISION_TF32 ? GPO_PRECISION_TF32
                                                            : GPO_PRECISION_FP32;
        bo.layout = cfg.layout == GP_LAYOUT_NCHW ? GPO_LAYOUT_NCHW
                    : cfg.layout == GP_LAYOUT_NHWC ? GPO_LAYOUT_NHWC
                                                   : GPO_LAYOUT_AUTO;
        bo.progress = quiet ? NULL : gp_cli_balance_progress;
        gpo_model *bm = NULL;
        const struct gpo_balance_report *rep = NULL;
        if (gpo_open(cfg.model_path, NULL, &bm) != GPO_OK || gpo_balance(bm, &bo, &rep) != GPO_OK) {
            status = gp_cli_fail("%s", gpo_last_error(bm));
            gpo_close(bm);
            goto done;
        }
        if (!quiet) gp_cli_print_balance(cfg.model_path, &bo, rep);
        for (int s = 0; s < rep->optimal.n_stages; s++) cfg.balance[s] = rep->optimal.balance[s];
        gpo_close(bm);
    }

    struct progress prog = {.tty = isatty(STDERR_FILENO), .quiet = quiet, .mute = mute};
    /* The metrics file appears only whole: written beside, renamed at the end. */
    struct gp_atomic_file metrics_file = {0};
    if (metrics) {
        if (gp_atomic_create(&metrics_file, metrics, &err) != GP_OK) {
            status = gp_cli_fail("%s", err.msg);
            goto done;
        }
        prog.metrics = gp_atomic_stream(&metrics_file);
        if (!prog.metrics) {
            gp_atomic_abort(&metrics_file);
            status = gp_cli_fail("cannot write '%s'", metrics);
            goto done;
        }
    }
    struct gp_train_callbacks cb = {.user = &prog, .on_start = on_start, .on_step = on_step,
                                    .on_epoch = on_epoch, .on_memory = on_memory, .on_note = on_note,
                                    .on_state = on_state, .on_resume = on_resume};
    gp_status st = gp_train(&cfg, &train, val_data ? &val : NULL, &cb, &err);
    if (st != GP_OK) status = gp_cli_fail("%s", err.msg);
    /* A failure of one stage's process leaves the others waiting on it:
     * the whole job ends now, not at their timeouts. */
    if (st != GP_OK && cfg.remote) gp_comm_abort(dist.comm, GP_EXIT_FAIL);
    if (prog.metrics) {
        struct gp_error merr = {0};
        if (st != GP_OK) gp_atomic_abort(&metrics_file);
        else if (gp_atomic_commit(&metrics_file, &merr) != GP_OK) status = gp_cli_fail("%s", merr.msg);
    }
    /* Only what was written is reported saved. */
    if (st == GP_OK && status == GP_EXIT_OK && cfg.save_path && !quiet) fprintf(stderr, "saved %s\n", cfg.save_path);
    /* The host's high-water mark over the whole run (loading, data, the
     * staging of weights for devices): what a machine must have free. */
    struct rusage ru;
    if (st == GP_OK && !quiet && getrusage(RUSAGE_SELF, &ru) == 0) {
        char b[32];
        fprintf(stderr, "host peak resident memory %s\n",
                gp_cli_bytes((int64_t)ru.ru_maxrss * 1024, b, sizeof b)); /* Linux: KiB */
    }
done:
    gp_cli_dist_end(&dist);
    for (int k = 0; k < 4; k++) {
        gp_npy_free(&arrays[k]);
        free(owned[k]);
    }
    gp_dataset_free(&train);
    gp_dataset_free(&val);
    return status;
}
