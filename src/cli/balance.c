/* gpipe-onnx balance: profile each layer, split the layer list across
 * devices by time or memory, and explain the split. Also the report that
 * `train --balance time|memory` prints. Built on the public API
 * (include/gpipe_onnx.h) alone. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "gpipe_onnx.h"

static void help(FILE *f)
{
    fputs("usage: gpipe-onnx balance MODEL.onnx --devices LIST [--by time|memory]\n"
          "                          [--batch N] [--chunks M] [--checkpoint MODE]\n"
          "                          [--pipeline-schedule gpipe|1f1b]\n"
          "                          [--optimizer sgd|adamw] [--momentum M] [--json FILE]\n"
          "                          [--profile-out FILE | --profile-in FILE] [--repeats R]\n"
          "                          [--precision fp32|tf32|bf16] [--fast-conv] [--svg FILE]\n"
          "                          [--recompute-norm always|never]\n"
          "\n"
          "Profiles every layer (forward and backward, median of R timed runs after a\n"
          "warm-up, with its real inputs at the micro-batch size N/M) on the devices' type,\n"
          "then finds the contiguous split into one stage per device that minimizes the\n"
          "slowest stage's time per micro-batch (forward, backward, recomputation when\n"
          "checkpointed, and the frontier it receives) or the largest stage's memory\n"
          "(parameters, gradients, optimizer state, activations in flight, the first\n"
          "stage's inputs). The split is exact. The report shows each stage's layers,\n"
          "time, memory and frontiers, the imbalance, the predicted step time, throughput\n"
          "and bubble (K-1)/(M+K-1), a suggested --chunks, and the even split and\n"
          "torchgpipe's heuristic beside it.\n"
          "\n"
          "options:\n"
          "  --devices LIST      one device per stage, e.g. cuda:0,cuda:1 (or 0,1) or\n"
          "                      cpu:0,cpu:1. With GPUs the layers are timed on the first\n"
          "                      one, inside training steps of the model as one stage\n"
          "                      (which must fit on it), and copies between the first two\n"
          "                      GPUs; on the CPU, with each device's share of the cores\n"
          "  --by time|memory    objective (default time)\n"
          "  --batch N           mini-batch (default 32); --chunks M micro-batches (default 1)\n"
          "  --checkpoint MODE   always | except_last (default) | never\n"
          "  --pipeline-schedule gpipe|1f1b   the schedule training will use (default\n"
          "                      gpipe): what each stage holds at once and recomputes.\n"
          "                      With 1f1b stage k of K holds min(M, K-k) micro-batches,\n"
          "                      so later stages may take more layers by memory\n"
          "  --optimizer sgd|adamw, --momentum M   optimizer state in the memory figures\n"
          "  --precision P       fp32 (default), tf32, bf16: layers timed, activations and\n"
          "                      frontiers counted as training in P runs and stores them\n"
          "  --fast-conv         GPU convolutions timed on cuDNN's fastest algorithms, as\n"
          "                      train --fast-conv runs them (a saved profile records it)\n"
          "  --recompute-norm always|never   as train --recompute-norm always: BatchNorm\n"
          "                      outputs remade in the backward, so not counted as kept,\n"
          "                      and their layers' backward runs their forward again\n"
          "                      (default never; train's auto remakes only on a stage\n"
          "                      that does not fit, so it balances as never)\n"
          "  --layout L          auto (default), nchw or nhwc: layers timed in the layout\n"
          "                      training will use (as train --layout)\n"
          "  --json FILE         the report as JSON: 'stages' with first_layer, last_layer\n"
          "                      (inclusive indices of the layer list 'inspect' prints),\n"
          "                      time_ms, memory_bytes; 'predicted_step_ms'; 'balance'\n"
          "  --svg FILE          the picture: a bar per layer (forward and backward ms per\n"
          "                      micro-batch; hover for its name and op), the cuts, and\n"
          "                      each stage's load with its share of the slowest\n"
          "  --profile-out FILE  save the profile; --profile-in FILE reuse one (no timing)\n"
          "  --repeats R         timed runs per layer (default 5)\n"
          "  -h, --help          this help\n",
          f);
}

void gp_cli_balance_progress(void *user, int done, int total)
{
    (void)user;
    if (!isatty(STDERR_FILENO)) return;
    fprintf(stderr, "\rprofiling: pass %d/%d over the model", done, total);
    if (done == total) fputc('\n', stderr);
}

/* cuDNN's algorithms measured before the first profiling pass (user: the
 * command's struct gp_cli_measure). */
static void balance_measure(void *user, int problems, double seconds, int done)
{
    gp_cli_measure_progress(user, problems, seconds, done);
}

static void print_split(const char *name, const struct gpo_balance_report *p, const struct gpo_split *r,
                        bool by_time)
{
    char a[32], b[32], c[32];
    for (int s = 0; s < r->n_stages; s++) {
        const struct gpo_stage *f = &r->stages[s];
        char range[32], ops[96];
        snprintf(range, sizeof range, "%d-%d", f->first_layer, f->last_layer);
        snprintf(ops, sizeof ops, "%s .. %s", p->layers[f->first_layer].op, p->layers[f->last_layer].op);
        printf("%-10s %5d  %-9s %-38s %9.3f ms %10s %10s %10s\n", s ? "" : name, s, range, ops, f->time_ms,
               gp_cli_bytes(f->memory_bytes, a, sizeof a), gp_cli_bytes(f->frontier_in_bytes, b, sizeof b),
               gp_cli_bytes(f->frontier_out_bytes, c, sizeof c));
    }
    printf("%-10s imbalance %.3f (max/mean %s), predicted step %.2f ms, %.0f samples/s\n\n", "",
           r->imbalance, by_time ? "time" : "memory", r->predicted_step_ms, r->throughput);
}

/* Bars of the optimal split's per-stage load: a picture of the balance. */
static void print_bars(const struct gpo_split *r, bool by_time)
{
    double max = 0;
    for (int s = 0; s < r->n_stages; s++) {
        double v = by_time ? r->stages[s].time_ms : (double)r->stages[s].memory_bytes;
        if (v > max) max = v;
    }
    printf("load per stage (%s):\n", by_time ? "time per micro-batch" : "memory");
    for (int s = 0; s < r->n_stages; s++) {
        double v = by_time ? r->stages[s].time_ms : (double)r->stages[s].memory_bytes;
        int width = max > 0 ? (int)(48.0 * v / max + 0.5) : 0;
        printf("  stage %-3d |", s);
        for (int i = 0; i < width; i++) fputs("#", stdout);
        for (int i = width; i < 48; i++) fputs(" ", stdout);
        if (by_time) printf("| %.3f ms\n", v);
        else {
            char a[32];
            printf("| %s\n", gp_cli_bytes((int64_t)v, a, sizeof a));
        }
    }
    printf("\n");
}

/* Where the time goes: forward + backward time summed per op type, the
 * largest shares first (the first thing to read before optimizing). */
static void print_time_by_op(const struct gpo_balance_report *p, double total)
{
    if (!(total > 0) || p->n_layers == 0) return;
    struct op_time {
        const char *op;
        double fwd, bwd;
        int n;
    } *ops = calloc((size_t)p->n_layers, sizeof *ops);
    if (!ops) return;
    int n_ops = 0;
    for (int i = 0; i < p->n_layers; i++) {
        int k = 0;
        while (k < n_ops && strcmp(ops[k].op, p->layers[i].op) != 0) k++;
        if (k == n_ops) ops[n_ops++].op = p->layers[i].op;
        ops[k].fwd += p->layers[i].forward_ms;
        ops[k].bwd += p->layers[i].backward_ms;
        ops[k].n++;
    }
    /* Largest share first (insertion sort: a model has few op types). */
    for (int a = 1; a < n_ops; a++)
        for (int b = a; b > 0 && ops[b].fwd + ops[b].bwd > ops[b - 1].fwd + ops[b - 1].bwd; b--) {
            struct op_time t = ops[b];
            ops[b] = ops[b - 1];
            ops[b - 1] = t;
        }
    printf("time by op:");
    for (int k = 0; k < n_ops && k < 6; k++)
        printf("%s %s x%d %.1f%% (%.3f + %.3f ms)", k ? "," : "", ops[k].op, ops[k].n,
               100 * (ops[k].fwd + ops[k].bwd) / total, ops[k].fwd, ops[k].bwd);
    if (n_ops > 6) printf(", %d other op%s", n_ops - 6, n_ops - 6 > 1 ? "s" : "");
    printf("\n");
    free(ops);
}

void gp_cli_print_balance(const char *model, const struct gpo_balance_options *o, const struct gpo_balance_report *p)
{
    bool by_time = o->by == GPO_BALANCE_TIME;
    double total_f = 0, total_b = 0;
    for (int i = 0; i < p->n_layers; i++) {
        total_f += p->layers[i].forward_ms;
        total_b += p->layers[i].backward_ms;
    }
    printf("profile: %s on %s, micro-batch %lld, %d layers: forward %.3f ms, backward %.3f ms per "
           "micro-batch; frontier copies at %.1f GB/s\n",
           model, p->device, (long long)p->micro_batch, p->n_layers, total_f, total_b, p->copy_gbps);
    /* The heaviest layers, which decide where the cuts can go. */
    int top[5] = {-1, -1, -1, -1, -1};
    for (int i = 0; i < p->n_layers; i++) {
        double t = p->layers[i].forward_ms + p->layers[i].backward_ms;
        for (int q = 0; q < 5; q++) {
            if (top[q] < 0 || t > p->layers[top[q]].forward_ms + p->layers[top[q]].backward_ms) {
                memmove(&top[q + 1], &top[q], sizeof(int) * (size_t)(4 - q));
                top[q] = i;
                break;
            }
        }
    }
    printf("heaviest layers:");
    for (int q = 0; q < 5 && top[q] >= 0; q++)
        printf(" %d %s (%.3f ms)%s", top[q], p->layers[top[q]].op,
               p->layers[top[q]].forward_ms + p->layers[top[q]].backward_ms, q < 4 && top[q + 1] >= 0 ? "," : "");
    printf("\n");
    print_time_by_op(p, total_f + total_b);
    printf("\nbalance by %s: %d stages, batch %lld in %d micro-batches, %s schedule, checkpoint %s%s\n\n",
           by_time ? "time" : "memory", p->optimal.n_stages, (long long)o->batch, o->chunks,
           gpo_pipeline_schedule_name(o->schedule), gpo_checkpoint_name(o->checkpoint),
           o->recompute_norm ? ", BatchNorm outputs remade" : "");
    printf("%-10s %5s  %-9s %-38s %12s %10s %10s %10s\n", "split", "stage", "layers", "first .. last op",
           "time/micro", "memory", "in", "out");
    print_split("optimal", p, &p->optimal, by_time);
    print_split("even", p, &p->even, by_time);
    print_split("heuristic", p, &p->heuristic, by_time);
    /* What the memory column leaves out: train plans those on top. */
    printf("memory: parameters, their gradients and optimizer state, the activations each stage keeps for\n"
           "the backward, the frontiers it holds (the first stage: its inputs, and the next step's uploaded\n"
           "ahead) and its largest layer's forward-only values; train also plans the activation gradients\n"
           "its sets cannot hold, kernel workspaces and the last stage's targets\n"
           "(GP_MEMORY_VERBOSE=1 itemizes a stage's plan)\n\n");
    print_bars(&p->optimal, by_time);
    printf("bubble %.1f%% with %d micro-batches; suggested --chunks %d\n", 100 * p->bubble, o->chunks,
           p->suggested_chunks);
}

int gp_cmd_balance(int argc, char **argv)
{
    const char *model = NULL, *json = NULL, *svg = NULL, *layout = NULL;
    struct gpo_balance_options bo;
    gpo_balance_options_init(&bo);
    int n_devices = 0;
    struct gpo_device devices[GPO_MAX_STAGES];
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            help(stdout);
            return GP_EXIT_OK;
        }
        bool takes = !strcmp(a, "--devices") || !strcmp(a, "--by") || !strcmp(a, "--batch") ||
                     !strcmp(a, "--chunks") || !strcmp(a, "--checkpoint") || !strcmp(a, "--json") || !strcmp(a, "--svg") ||
                     !strcmp(a, "--profile-in") || !strcmp(a, "--profile-out") || !strcmp(a, "--repeats") ||
                     !strcmp(a, "--optimizer") || !strcmp(a, "--momentum") || !strcmp(a, "--precision") ||
                     !strcmp(a, "--pipeline-schedule") || !strcmp(a, "--layout") || !strcmp(a, "--recompute-norm");
        if (takes && !v) return gp_cli_usage("balance", "%s needs a value", a);
        if (takes) i++;
        if (!strcmp(a, "--devices")) {
            bo.devices = v;
            if (!gp_cli_parse_devices("balance", v, &n_devices, devices)) return GP_EXIT_USAGE;
        } else if (!strcmp(a, "--by")) {
            if (!strcmp(v, "time")) bo.by = GPO_BALANCE_TIME;
            else if (!strcmp(v, "memory")) bo.by = GPO_BALANCE_MEMORY;
            else return gp_cli_usage("balance", "--by is time or memory (got '%s')", v);
        } else if (!strcmp(a, "--batch")) {
            if (!gp_cli_parse_int("balance", a, v, 1, (int64_t)1 << 31, &bo.batch)) return GP_EXIT_USAGE;
        } else if (!strcmp(a, "--chunks")) {
            int64_t m;
            if (!gp_cli_parse_int("balance", a, v, 1, 1 << 20, &m)) return GP_EXIT_USAGE;
            bo.chunks = (int)m;
        } else if (!strcmp(a, "--checkpoint")) {
            if (!gpo_checkpoint_parse(v, &bo.checkpoint))
                return gp_cli_usage("balance", "--checkpoint is always, except_last or never");
        } else if (!strcmp(a, "--pipeline-schedule")) {
            if (!gpo_pipeline_schedule_parse(v, &bo.schedule))
                return gp_cli_usage("balance", "--pipeline-schedule is gpipe or 1f1b (got '%s')", v);
        } else if (!strcmp(a, "--json")) {
            json = v;
        } else if (!strcmp(a, "--svg")) {
            svg = v;
        } else if (!strcmp(a, "--profile-in")) {
            bo.profile_in = v;
        } else if (!strcmp(a, "--profile-out")) {
            bo.profile_out = v;
        } else if (!strcmp(a, "--repeats")) {
            int64_t r;
            if (!gp_cli_parse_int("balance", a, v, 1, 1000, &r)) return GP_EXIT_USAGE;
            bo.repeats = (int)r;
        } else if (!strcmp(a, "--optimizer")) {
            if (strcmp(v, "sgd") && strcmp(v, "adamw")) return gp_cli_usage("balance", "--optimizer is sgd or adamw");
            bo.optimizer = !strcmp(v, "adamw") ? GPO_OPTIMIZER_ADAMW : GPO_OPTIMIZER_SGD;
        } else if (!strcmp(a, "--precision")) {
            if (!gpo_precision_parse(v, &bo.precision))
                return gp_cli_usage("balance", "--precision takes fp32, tf32 or bf16, not '%s'", v);
        } else if (!strcmp(a, "--layout")) {
            if (!gpo_layout_parse(v, &bo.layout))
                return gp_cli_usage("balance", "--layout takes auto, nchw or nhwc, not '%s'", v);
            layout = bo.layout == GPO_LAYOUT_NCHW ? "nchw" : bo.layout == GPO_LAYOUT_NHWC ? "nhwc" : NULL;
        } else if (!strcmp(a, "--fast-conv")) {
            bo.fast_conv = 1;
        } else if (!strcmp(a, "--recompute-norm")) {
            if (strcmp(v, "always") && strcmp(v, "never"))
                return gp_cli_usage("balance", "--recompute-norm is always or never, not '%s'", v);
            bo.recompute_norm = !strcmp(v, "always");
        } else if (!strcmp(a, "--momentum")) {
            bo.momentum = atof(v);
        } else if (a[0] == '-' && a[1]) {
            return gp_cli_usage("balance", "unknown option '%s'", a);
        } else if (!model) {
            model = a;
        } else {
            return gp_cli_usage("balance", "only one model (got '%s' and '%s')", model, a);
        }
    }
    if (!model) return gp_cli_usage("balance", "no model given");
    if (n_devices < 1) return gp_cli_usage("balance", "--devices is required (one device per stage)");
    if (bo.batch % bo.chunks)
        return gp_cli_usage("balance", "--chunks %d does not divide --batch %lld", bo.chunks, (long long)bo.batch);
    if (bo.profile_in && bo.profile_out)
        return gp_cli_usage("balance", "--profile-in and --profile-out exclude each other");
    bo.progress = gp_cli_balance_progress;
    struct gp_cli_measure measure = {.tty = isatty(STDERR_FILENO)};
    bo.measure = balance_measure;
    bo.user = &measure;

    gpo_model *m = NULL;
    const struct gpo_balance_report *rep = NULL;
    /* The outputs are checked before the profiling, which takes a while. */
    const char *outputs[3] = {json, svg, bo.profile_out};
    int status = GP_EXIT_OK;
    gpo_status st = gpo_open(model, NULL, &m);
    for (int k = 0; k < 3 && st == GPO_OK; k++)
        if (outputs[k]) st = gpo_check_output(m, outputs[k]);
    if (st == GPO_OK) st = gpo_balance(m, &bo, &rep);
    if (st != GPO_OK) {
        status = gp_cli_fail("%s", gpo_last_error(m));
        gpo_close(m);
        return status;
    }
    gp_cli_print_balance(model, &bo, rep);
    printf("train with: gpipe-onnx train %s --batch %lld --chunks %d --devices %s%s%s%s%s%s --balance ", model,
           (long long)bo.batch, bo.chunks, bo.devices, bo.schedule == GPO_PIPELINE_1F1B ? " --pipeline-schedule 1f1b" : "",
           layout ? " --layout " : "", layout ? layout : "", bo.fast_conv ? " --fast-conv" : "",
           bo.recompute_norm ? " --recompute-norm always" : "");
    for (int s = 0; s < rep->optimal.n_stages; s++) printf("%s%d", s ? "," : "", rep->optimal.balance[s]);
    printf("\n");
    if (json && gpo_balance_write_json(m, json) != GPO_OK) status = gp_cli_fail("%s", gpo_last_error(m));
    if (status == GP_EXIT_OK && svg && gpo_balance_write_svg(m, svg) != GPO_OK)
        status = gp_cli_fail("%s", gpo_last_error(m));
    gpo_close(m);
    return status;
}
