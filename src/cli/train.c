/* gpipe-onnx train: train a model on .npy data (or synthetic data) and save
 * the trained model back to ONNX. Built on the public API
 * (include/gpipe_onnx.h) alone; `--pipeline` across processes as one rank
 * of its jobs (gpo_job_join). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "cli/cli.h"
#include "gpipe_onnx.h"

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
        "                        run. Default: the fastest deterministic, precise ones.\n"
        "                        Also bf16 attention's backward by cuDNN's with\n"
        "                        atomics\n"
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
        "  --recompute-norm always|auto|never  whether BatchNormalization outputs are\n"
        "                        kept for the backward or written again there from the\n"
        "                        kept input and the batch's statistics, just before the\n"
        "                        first backward that reads them: the same bits, one more\n"
        "                        pass over each such output, a fifth less activation\n"
        "                        memory in a ResNet. auto (default): on a stage that would\n"
        "                        not fit on its device otherwise, the fewest that make it\n"
        "                        fit, the largest first (README: Memory)\n"
        "  --memory-limit SIZE   the memory each stage may plan on its device (5.4G,\n"
        "                        800M; K, M, G, T are powers of 1024), its free memory\n"
        "                        when less: with --recompute-norm auto, the fewest\n"
        "                        BatchNorm outputs remade that fit; else refused before\n"
        "                        training, with the stage's account\n"
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
        "                        --save-state: rank 0 gathers and writes each state;\n"
        "                        --resume: every rank reads the same state (a shared\n"
        "                        folder). --trace F: each rank writes F.rank<R>.json.\n"
        "                        --balance time|memory: rank 0 profiles and splits\n"
        "                        GPUs (--devices cuda:0,... or none given on a GPU\n"
        "                        host): each rank takes the GPU of its local rank;\n"
        "                        frontiers and replica sums go over NCCL\n"
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
        "                        --recompute-norm, --cuda-graph, validation data and the outputs. Moving\n"
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
        "                        samples_per_s), per epoch (val_loss, val_accuracy)\n"
        "                        and per stage after training (memory: bytes of\n"
        "                        parameters, optimizer, activations, planned)\n"
        "  --quiet               no progress output (validation results still print)\n"
        "  -h, --help            this help\n",
        f);
}

/* ---- progress and metrics ---- */

struct progress {
    bool tty, quiet;
    bool mute; /* a rank other than 0: not even the validation results */
    FILE *metrics;
    const char *model;
    int64_t total, per_epoch;
    struct gp_cli_measure measure; /* cuDNN's algorithms measured before the first step */
};

static void on_start(void *user, int64_t total, int64_t per_epoch, const char *summary)
{
    struct progress *p = user;
    p->total = total;
    p->per_epoch = per_epoch;
    if (!p->quiet) fprintf(stderr, "%s\n", summary);
}

static void on_step(void *user, const struct gpo_step_info *r)
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

static void on_epoch(void *user, const struct gpo_epoch_info *r)
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

static void on_memory(void *user, const struct gpo_stage_memory *r)
{
    struct progress *p = user;
    if (p->metrics) {
        fprintf(p->metrics,
                "{\"memory\": {\"stage\": %d, \"device\": \"%s:%d\", \"parameter_bytes\": %lld, "
                "\"optimizer_bytes\": %lld, \"activation_bytes\": %lld, \"activation_peak_bytes\": %lld, "
                "\"planned_bytes\": %lld}}\n",
                r->stage, r->backend ? r->backend : "cpu", r->device, (long long)r->param_bytes,
                (long long)r->optimizer_bytes, (long long)r->activation_bytes, (long long)r->activation_peak_bytes,
                (long long)r->planned_bytes);
        fflush(p->metrics);
    }
    if (p->quiet) return;
    char a[32], b[32], c[32], d[32], e[32];
    if (r->stage == 0)
        fprintf(stderr, "%-6s %-10s %-8s %12s %12s %12s %12s %12s\n", "stage", "layers", "device",
                "parameters", "optimizer", "activations", "act. peak", "planned");
    char layers[32];
    snprintf(layers, sizeof layers, "%d-%d", r->first_layer, r->last_layer);
    char device[32];
    snprintf(device, sizeof device, "%s:%d", r->backend ? r->backend : "cpu", r->device);
    fprintf(stderr, "%-6d %-10s %-8s %12s %12s %12s %12s %12s\n", r->stage, layers, device,
            gp_cli_bytes(r->param_bytes, a, sizeof a), gp_cli_bytes(r->optimizer_bytes, b, sizeof b),
            gp_cli_bytes(r->activation_bytes, c, sizeof c), gp_cli_bytes(r->activation_peak_bytes, d, sizeof d),
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

/* cuDNN's algorithms measured before the first step (gp_cli_measure_progress),
 * and a --metrics record of it. */
static void on_measure(void *user, int problems, double seconds, int done)
{
    struct progress *p = user;
    if (done && p->metrics) {
        fprintf(p->metrics, "{\"measured\": {\"problems\": %d, \"seconds\": %.3f}}\n", problems, seconds);
        fflush(p->metrics);
    }
    if (!p->quiet) gp_cli_measure_progress(&p->measure, problems, seconds, done);
}

static void on_balance(void *user, const struct gpo_balance_options *o, const struct gpo_balance_report *r)
{
    struct progress *p = user;
    if (!p->quiet) gp_cli_print_balance(p->model, o, r);
}

/* States --resume skipped, as the ranks of a job look for the newest
 * whole one: noted by rank 0 alone, --quiet or not. */
static void on_join_note(void *user, const char *message)
{
    (void)user;
    fprintf(stderr, "note: %s\n", message);
}

/* The exit status of a failed call, its message printed. In a job a
 * failure every rank reached alike has rank 0's message alone (the others'
 * is empty: they say nothing); joining, a launch or settings that do not
 * fit --pipeline are usage errors. */
static int failure(gpo_model *m, gpo_status st, bool joining)
{
    const char *msg = gpo_last_error(m);
    if (joining && st == GPO_ERR_ARGUMENT) return *msg ? gp_cli_usage("train", "%s", msg) : GP_EXIT_USAGE;
    return *msg ? gp_cli_fail("%s", msg) : GP_EXIT_FAIL;
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

/* "4,4,5": layers per stage; *count gets how many. */
static bool parse_balance(const char *list, int *count)
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
        n++;
        p = *end ? end + 1 : end;
    }
    if (!n) {
        gp_cli_usage("train", "--balance needs positive layer counts such as 4,4,5");
        return false;
    }
    *count = n;
    return true;
}

int gp_cmd_train(int argc, char **argv)
{
    struct gpo_train_config tc;
    gpo_train_config_init(&tc);
    const char *model = NULL, *metrics = NULL;
    int64_t synthetic = -1;
    int n_balance = 0, n_stages = 0;
    struct gpo_device dev[GPO_MAX_STAGES] = {{0}};
    const char *auto_balance = NULL;
    bool devices_set = false;
    bool quiet = false, mute = false, lr_set = false, batch_set = false, epochs_set = false, opt_set = false,
         keep_set = false;
    int pipeline = 0; /* --pipeline P: one rank of a job; 0: one process */
    struct gpo_job_options job;
    gpo_job_options_init(&job);

    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
#define TAKE() (i++, v)
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            help(stdout);
            return GP_EXIT_OK;
        } else if (!strcmp(a, "--data")) {
            tc.data = TAKE();
        } else if (!strcmp(a, "--labels")) {
            tc.labels = TAKE();
        } else if (!strcmp(a, "--val-data")) {
            tc.val_data = TAKE();
        } else if (!strcmp(a, "--val-labels")) {
            tc.val_labels = TAKE();
        } else if (!strcmp(a, "--synthetic")) {
            synthetic = 0;
            if (v && v[0] >= '0' && v[0] <= '9' &&
                !gp_cli_parse_int("train", "--synthetic", TAKE(), 1, (int64_t)1 << 40, &synthetic))
                return GP_EXIT_USAGE;
        } else if (!strcmp(a, "--batch")) {
            if (!gp_cli_parse_int("train", a, TAKE(), 1, (int64_t)1 << 31, &tc.batch)) return GP_EXIT_USAGE;
            batch_set = true;
        } else if (!strcmp(a, "--chunks")) {
            if (!gp_cli_parse_int("train", a, TAKE(), 1, (int64_t)1 << 20, &tc.chunks)) return GP_EXIT_USAGE;
        } else if (!strcmp(a, "--epochs")) {
            if (!gp_cli_parse_int("train", a, TAKE(), 1, (int64_t)1 << 31, &tc.epochs)) return GP_EXIT_USAGE;
            epochs_set = true;
        } else if (!strcmp(a, "--steps")) {
            if (!gp_cli_parse_int("train", a, TAKE(), 1, (int64_t)1 << 40, &tc.steps)) return GP_EXIT_USAGE;
        } else if (!strcmp(a, "--seed")) {
            int64_t s;
            if (!gp_cli_parse_int("train", a, TAKE(), 0, INT64_MAX, &s)) return GP_EXIT_USAGE;
            tc.seed = (uint64_t)s;
        } else if (!strcmp(a, "--no-shuffle")) {
            tc.no_shuffle = 1;
        } else if (!strcmp(a, "--optimizer")) {
            const char *o = TAKE();
            if (o && !strcmp(o, "sgd")) tc.optimizer = GPO_OPTIMIZER_SGD;
            else if (o && !strcmp(o, "adamw")) tc.optimizer = GPO_OPTIMIZER_ADAMW;
            else return gp_cli_usage("train", "--optimizer is sgd or adamw (got '%s')", o ? o : "");
            opt_set = true;
        } else if (!strcmp(a, "--lr")) {
            if (!parse_double(a, TAKE(), 0, &tc.lr)) return GP_EXIT_USAGE;
            lr_set = true;
        } else if (!strcmp(a, "--momentum")) {
            if (!parse_double(a, TAKE(), 0, &tc.momentum)) return GP_EXIT_USAGE;
        } else if (!strcmp(a, "--nesterov")) {
            tc.nesterov = 1;
        } else if (!strcmp(a, "--weight-decay")) {
            if (!parse_double(a, TAKE(), 0, &tc.weight_decay)) return GP_EXIT_USAGE;
        } else if (!strcmp(a, "--beta1")) {
            if (!parse_double(a, TAKE(), 0, &tc.beta1)) return GP_EXIT_USAGE;
        } else if (!strcmp(a, "--beta2")) {
            if (!parse_double(a, TAKE(), 0, &tc.beta2)) return GP_EXIT_USAGE;
        } else if (!strcmp(a, "--eps")) {
            if (!parse_double(a, TAKE(), 0, &tc.eps)) return GP_EXIT_USAGE;
        } else if (!strcmp(a, "--schedule")) {
            const char *s = TAKE();
            if (s && !strcmp(s, "constant")) tc.lr_schedule = GPO_LR_CONSTANT;
            else if (s && !strcmp(s, "step")) tc.lr_schedule = GPO_LR_STEP;
            else if (s && !strcmp(s, "cosine")) tc.lr_schedule = GPO_LR_COSINE;
            else return gp_cli_usage("train", "--schedule is constant, step or cosine (got '%s')", s ? s : "");
        } else if (!strcmp(a, "--warmup-steps")) {
            if (!gp_cli_parse_int("train", a, TAKE(), 0, (int64_t)1 << 40, &tc.warmup_steps)) return GP_EXIT_USAGE;
        } else if (!strcmp(a, "--step-size")) {
            if (!gp_cli_parse_int("train", a, TAKE(), 1, (int64_t)1 << 40, &tc.step_size)) return GP_EXIT_USAGE;
        } else if (!strcmp(a, "--gamma")) {
            if (!parse_double(a, TAKE(), 0, &tc.gamma)) return GP_EXIT_USAGE;
        } else if (!strcmp(a, "--min-lr")) {
            if (!parse_double(a, TAKE(), 0, &tc.min_lr)) return GP_EXIT_USAGE;
        } else if (!strcmp(a, "--torch-arithmetic")) {
            const char *t = TAKE();
            if (t && !strcmp(t, "1.13")) tc.torch_1_13 = 1;
            else if (t && !strcmp(t, "2")) tc.torch_1_13 = 0;
            else return gp_cli_usage("train", "--torch-arithmetic is 1.13 or 2 (got '%s')", t ? t : "");
        } else if (!strcmp(a, "--clip-norm")) {
            if (!parse_double(a, TAKE(), 0, &tc.clip_norm)) return GP_EXIT_USAGE;
        } else if (!strcmp(a, "--loss")) {
            const char *l = TAKE();
            if (l && !strcmp(l, "auto")) tc.loss = GPO_LOSS_AUTO;
            else if (l && !strcmp(l, "cross-entropy")) tc.loss = GPO_LOSS_CROSS_ENTROPY;
            else if (l && !strcmp(l, "mse")) tc.loss = GPO_LOSS_MSE;
            else if (l && !strcmp(l, "output")) tc.loss = GPO_LOSS_OUTPUT;
            else return gp_cli_usage("train", "--loss is auto, cross-entropy, mse or output (got '%s')", l ? l : "");
        } else if (!strcmp(a, "--class-axis")) {
            int64_t ax;
            if (!gp_cli_parse_int("train", a, TAKE(), -8, 7, &ax)) return GP_EXIT_USAGE;
            tc.class_axis = (int)ax;
        } else if (!strcmp(a, "--dropout")) {
            if (!parse_double(a, TAKE(), 0, &tc.dropout)) return GP_EXIT_USAGE;
            if (tc.dropout >= 1) return gp_cli_usage("train", "--dropout must be below 1");
        } else if (!strcmp(a, "--devices")) {
            const char *list = TAKE();
            if (!gp_cli_parse_devices("train", list, &n_stages, dev)) return GP_EXIT_USAGE;
            devices_set = true;
        } else if (!strcmp(a, "--balance")) {
            const char *list = TAKE();
            if (list && (!strcmp(list, "time") || !strcmp(list, "memory"))) auto_balance = list;
            else if (!parse_balance(list, &n_balance)) return GP_EXIT_USAGE;
            tc.balance = list;
        } else if (!strcmp(a, "--pipeline")) {
            int64_t p;
            if (!gp_cli_parse_int("train", a, TAKE(), 1, GPO_MAX_STAGES, &p)) return GP_EXIT_USAGE;
            pipeline = (int)p;
        } else if (!strcmp(a, "--bucket-kib")) {
            if (!gp_cli_parse_int("train", a, TAKE(), 1, (int64_t)1 << 30, &job.bucket_kib)) return GP_EXIT_USAGE;
        } else if (!strcmp(a, "--comm-timeout")) {
            if (!parse_double(a, TAKE(), 0.001, &job.comm_timeout)) return GP_EXIT_USAGE;
        } else if (!strcmp(a, "--pipeline-schedule")) {
            const char *name = TAKE();
            if (!gpo_pipeline_schedule_parse(name, &tc.pipeline_schedule))
                return gp_cli_usage("train", "--pipeline-schedule is gpipe or 1f1b (got '%s')", name ? name : "");
        } else if (!strcmp(a, "--checkpoint")) {
            const char *c = TAKE();
            if (!gpo_checkpoint_parse(c, &tc.checkpoint))
                return gp_cli_usage("train", "--checkpoint is always, except_last or never (got '%s')", c ? c : "");
        } else if (!strcmp(a, "--deferred-batch-norm")) {
            tc.deferred_batch_norm = 1;
        } else if (!strcmp(a, "--tf32")) {
            tc.precision = GPO_PRECISION_TF32;
        } else if (!strcmp(a, "--precision")) {
            const char *name = TAKE();
            if (!gpo_precision_parse(name, &tc.precision))
                return gp_cli_usage("train", "--precision takes fp32, tf32 or bf16, not '%s'", name ? name : "");
        } else if (!strcmp(a, "--fast-conv")) {
            tc.fast_conv = 1;
        } else if (!strcmp(a, "--recompute-norm")) {
            const char *c = TAKE();
            if (!c || !(!strcmp(c, "auto") || !strcmp(c, "always") || !strcmp(c, "never")))
                return gp_cli_usage("train", "--recompute-norm is always, auto or never (got '%s')", c ? c : "");
            tc.recompute_norm = !strcmp(c, "always") ? GPO_RECOMPUTE_ALWAYS
                                : !strcmp(c, "never") ? GPO_RECOMPUTE_NEVER
                                                      : GPO_RECOMPUTE_AUTO;
        } else if (!strcmp(a, "--memory-limit")) {
            const char *size = TAKE();
            if (!gp_cli_parse_size(size, &tc.memory_limit))
                return gp_cli_usage("train",
                                    "--memory-limit takes a size such as 5.4G, 800M or 1073741824 (K, M, G, T: "
                                    "powers of 1024), not '%s'",
                                    size ? size : "");
        } else if (!strcmp(a, "--layout")) {
            const char *name = TAKE();
            if (!gpo_layout_parse(name, &tc.layout))
                return gp_cli_usage("train", "--layout takes auto, nchw or nhwc, not '%s'", name ? name : "");
        } else if (!strcmp(a, "--cuda-graph")) {
            const char *mode = TAKE();
            if (!mode || (strcmp(mode, "on") && strcmp(mode, "off")))
                return gp_cli_usage("train", "--cuda-graph is on or off");
            tc.cuda_graph = !strcmp(mode, "on");
        } else if (!strcmp(a, "--trace")) {
            tc.trace_path = TAKE();
        } else if (!strcmp(a, "--save")) {
            tc.save_path = TAKE();
        } else if (!strcmp(a, "--save-state")) {
            tc.state_dir = TAKE();
        } else if (!strcmp(a, "--save-every")) {
            if (!parse_every(TAKE(), &tc.save_every, &tc.save_every_seconds)) return GP_EXIT_USAGE;
        } else if (!strcmp(a, "--keep")) {
            int64_t k;
            if (!gp_cli_parse_int("train", a, TAKE(), 1, 1 << 20, &k)) return GP_EXIT_USAGE;
            tc.keep = (int)k;
            keep_set = true;
        } else if (!strcmp(a, "--resume")) {
            tc.resume = TAKE();
        } else if (!strcmp(a, "--algorithms")) {
            tc.algorithms_path = TAKE();
        } else if (!strcmp(a, "--metrics")) {
            metrics = TAKE();
        } else if (!strcmp(a, "--quiet")) {
            quiet = true;
        } else if (a[0] == '-' && a[1]) {
            return gp_cli_usage("train", "unknown option '%s'", a);
        } else if (!model) {
            model = a;
        } else {
            return gp_cli_usage("train", "only one model can be trained (got '%s' and '%s')", model, a);
        }
        if (i >= argc) return gp_cli_usage("train", "%s needs a value", a);
#undef TAKE
    }
    if (!model) return gp_cli_usage("train", "no model given");
    if (!tc.state_dir && (tc.save_every || tc.save_every_seconds > 0 || keep_set))
        return gp_cli_usage("train", "--save-every and --keep need --save-state DIR");
    if (pipeline > 1) {
        /* --pipeline P: P stages, stage k run by rank k. --devices gives
         * every rank's device, or one per stage; none: as for one process,
         * the GPUs when there are any (not yet across processes: refused
         * then), else CPU devices. */
        if (devices_set && n_stages != 1 && n_stages != pipeline)
            return gp_cli_usage("train",
                                "--devices lists %d devices for --pipeline %d: give one (every rank's) or one "
                                "per stage",
                                n_stages, pipeline);
        if (n_balance && n_balance != pipeline)
            return gp_cli_usage("train", "--balance has %d stages but --pipeline %d", n_balance, pipeline);
        int gpus = devices_set ? 0 : gp_cli_gpu_count();
        for (int k = devices_set && n_stages == pipeline ? pipeline : 0; k < pipeline; k++)
            dev[k] = devices_set ? dev[0]
                                 : (struct gpo_device){.cuda = gpus > 0, .index = gpus > 0 ? k % gpus : k};
        n_stages = pipeline;
        devices_set = true;
    }
    /* Without --devices the library picks them as the program always did:
     * the GPUs when there are any, else CPU devices, one per stage. */
    char devices[GPO_MAX_STAGES * 16];
    if (devices_set) {
        tc.devices = gpo_devices_format(dev, n_stages, devices, sizeof devices);
    } else {
        n_stages = n_balance ? n_balance : 1;
    }
    if (n_balance && n_balance != n_stages)
        return gp_cli_usage("train", "--balance has %d stages but --devices has %d", n_balance, n_stages);
    if ((tc.labels && !tc.data) || (tc.val_labels && !tc.val_data))
        return gp_cli_usage("train", "labels given without their data");
    if (tc.val_data && !tc.data && synthetic < 0)
        return gp_cli_usage("train", "--val-data needs --data");

    int status = GP_EXIT_OK;
    gpo_model *m = NULL;
    if (gpo_open(model, NULL, &m) != GPO_OK) {
        status = gp_cli_fail("%s", gpo_last_error(m));
        gpo_close(m);
        return status;
    }
    struct gpo_model_info info;
    gpo_model_info(m, &info);
    if (info.export_note) fprintf(stderr, "note: %s\n", info.export_note);
    /* Defaults the model carries in its metadata (flags win): the data
     * files themselves the library finds. */
    if (!tc.data && synthetic < 0) {
        const char *s;
        if (!batch_set && (s = gpo_metadata(m, "gpipe-onnx.batch"))) tc.batch = atoll(s) > 0 ? atoll(s) : tc.batch;
        if (!epochs_set && (s = gpo_metadata(m, "gpipe-onnx.epochs"))) tc.epochs = atoll(s) > 0 ? atoll(s) : tc.epochs;
        if (!opt_set && (s = gpo_metadata(m, "gpipe-onnx.optimizer")))
            tc.optimizer = !strcmp(s, "adamw") ? GPO_OPTIMIZER_ADAMW : GPO_OPTIMIZER_SGD;
        if (!lr_set && (s = gpo_metadata(m, "gpipe-onnx.lr")) && atof(s) > 0) tc.lr = atof(s);
        if (!gpo_metadata(m, "gpipe-onnx.data")) {
            gpo_close(m);
            return gp_cli_usage("train", "no training data: give --data (and --labels) or --synthetic");
        }
    }
    if (synthetic >= 0) tc.synthetic = synthetic ? synthetic : 8 * tc.batch;
    if (auto_balance && tc.batch % tc.chunks) {
        gpo_close(m);
        return gp_cli_usage("train", "--chunks %lld does not divide --batch %lld", (long long)tc.chunks,
                            (long long)tc.batch);
    }
    struct progress prog = {.tty = isatty(STDERR_FILENO), .quiet = quiet, .mute = mute, .model = model};
    prog.measure = (struct gp_cli_measure){.tty = prog.tty,
                                           .hint = tc.algorithms_path ? "kept in the algorithms file for the next run"
                                                                      : "--algorithms FILE keeps them for the next run"};
    struct gpo_train_callbacks cb = {.user = &prog, .on_start = on_start, .on_step = on_step, .on_epoch = on_epoch,
                                     .on_note = on_note, .on_profile = quiet ? NULL : gp_cli_balance_progress,
                                     .on_memory = on_memory, .on_balance = on_balance, .on_state = on_state,
                                     .on_resume = on_resume, .on_measure = on_measure};
    /* The program keeps no trained weights in memory: --save has them. */
    tc.discard_weights = 1;
    /* --pipeline: this process is one rank of a job; the ranks meet and
     * agree on the run before any output is touched (only rank 0 writes
     * them). Rank 0 notes the states it skipped, whatever --quiet says. */
    if (pipeline) {
        job.pipeline = pipeline;
        struct gpo_train_callbacks notes = {.on_note = on_join_note};
        struct gpo_job_info rank;
        gpo_status st = gpo_job_join(m, &tc, &job, &notes, &rank);
        if (st != GPO_OK) {
            status = failure(m, st, true);
            goto done;
        }
        if (rank.gpu >= 0 && !quiet)
            fprintf(stderr, "rank %d: stage %d of replica %d on cuda:%d (local rank %d), NCCL links up\n", rank.rank,
                    rank.stage, rank.replica, rank.gpu, rank.local_rank);
        if (rank.size > 1 && rank.rank != 0) {
            /* This rank runs one stage; rank 0 reports and writes. */
            quiet = mute = true;
            metrics = NULL;
            prog.quiet = prog.mute = true;
        }
    }
    /* Outputs are checked before anything long (balancing, loading,
     * training); in a job the library checks those it writes. */
    const char *outputs[3] = {pipeline ? NULL : tc.save_path, pipeline ? NULL : tc.trace_path, metrics};
    for (int k = 0; k < 3; k++)
        if (outputs[k] && gpo_check_output(m, outputs[k]) != GPO_OK) {
            status = gp_cli_fail("%s", gpo_last_error(m));
            gpo_job_abort(m);
            goto done;
        }

    /* The metrics file appears only whole: written beside, renamed at the end. */
    gpo_file *metrics_file = NULL;
    if (metrics && gpo_file_open(m, metrics, &metrics_file, &prog.metrics) != GPO_OK) {
        status = gp_cli_fail("%s", gpo_last_error(m));
        gpo_job_abort(m);
        goto done;
    }
    gpo_status st = gpo_train(m, &tc, &cb, NULL);
    /* A failure of one stage's process leaves the others waiting on it:
     * gpo_close ends the whole job now, not at their timeouts. */
    if (st != GPO_OK) status = failure(m, st, false);
    if (metrics_file) {
        if (st != GPO_OK) gpo_file_abort(metrics_file);
        else if (gpo_file_commit(m, metrics_file) != GPO_OK) status = gp_cli_fail("%s", gpo_last_error(m));
    }
    /* Only what was written is reported saved. */
    if (st == GPO_OK && status == GP_EXIT_OK && tc.save_path && !quiet) fprintf(stderr, "saved %s\n", tc.save_path);
    /* The host's high-water mark over the whole run (loading, data, the
     * staging of weights for devices): what a machine must have free. */
    struct rusage ru;
    if (st == GPO_OK && !quiet && getrusage(RUSAGE_SELF, &ru) == 0) {
        char b[32];
        fprintf(stderr, "host peak resident memory %s\n",
                gp_cli_bytes((int64_t)ru.ru_maxrss * 1024, b, sizeof b)); /* Linux: KiB */
    }
done:
    gpo_close(m);
    return status;
}
