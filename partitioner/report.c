#include "partitioner/report.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "util/atomic_file.h"
#include "util/json_writer.h"

/* ---- JSON ---- */

static void json_split(struct gp_json *j, const struct gp_split_report *r)
{
    gp_json_key(j, "stages");
    gp_json_array_begin(j);
    for (int s = 0; s < r->k; s++) {
        const struct gp_stage_figures *f = &r->stages[s];
        gp_json_object_begin(j);
        gp_json_key(j, "first_layer");
        gp_json_int(j, f->first_layer);
        gp_json_key(j, "last_layer");
        gp_json_int(j, f->last_layer - 1);
        gp_json_key(j, "time_ms");
        gp_json_double(j, f->time_ms);
        gp_json_key(j, "memory_bytes");
        gp_json_int(j, f->memory_bytes);
        gp_json_key(j, "frontier_in_bytes");
        gp_json_int(j, f->frontier_in_bytes);
        gp_json_key(j, "frontier_out_bytes");
        gp_json_int(j, f->frontier_out_bytes);
        gp_json_object_end(j);
    }
    gp_json_array_end(j);
    gp_json_key(j, "balance");
    gp_json_array_begin(j);
    for (int s = 0; s < r->k; s++) gp_json_int(j, r->stages[s].last_layer - r->stages[s].first_layer);
    gp_json_array_end(j);
    gp_json_key(j, "imbalance");
    gp_json_double(j, r->imbalance);
    gp_json_key(j, "predicted_step_ms");
    gp_json_double(j, r->predicted_step_ms);
    gp_json_key(j, "throughput");
    gp_json_double(j, r->throughput);
}

void gp_balance_json(FILE *f, const struct gp_profile *p, const struct gp_balance_report *r)
{
    struct gp_json j;
    gp_json_init(&j, f, true);
    gp_json_object_begin(&j);
    gp_json_key(&j, "model");
    gp_json_string(&j, p->model);
    gp_json_key(&j, "device");
    gp_json_string(&j, p->device);
    gp_json_key(&j, "by");
    gp_json_string(&j, r->cfg.by == GP_BALANCE_TIME ? "time" : "memory");
    gp_json_key(&j, "batch");
    gp_json_int(&j, r->cfg.batch);
    gp_json_key(&j, "chunks");
    gp_json_int(&j, r->cfg.n_micro);
    gp_json_key(&j, "pipeline_schedule");
    gp_json_string(&j, gp_pipe_schedule_name(r->cfg.schedule));
    gp_json_key(&j, "checkpoint");
    gp_json_string(&j, gp_checkpoint_name(r->cfg.checkpoint));
    json_split(&j, &r->optimal);
    gp_json_key(&j, "bubble");
    gp_json_double(&j, r->bubble);
    gp_json_key(&j, "suggested_chunks");
    gp_json_int(&j, r->suggested_chunks);
    gp_json_key(&j, "even");
    gp_json_object_begin(&j);
    json_split(&j, &r->even);
    gp_json_object_end(&j);
    gp_json_key(&j, "heuristic");
    gp_json_object_begin(&j);
    json_split(&j, &r->heuristic);
    gp_json_object_end(&j);
    gp_json_object_end(&j);
    gp_json_finish(&j);
}

typedef void (*report_fn)(FILE *f, const struct gp_profile *p, const struct gp_balance_report *r,
                          const char *const *names);

static gp_status write_atomic(const char *path, report_fn fn, const struct gp_profile *p,
                              const struct gp_balance_report *r, const char *const *names, struct gp_error *err)
{
    struct gp_atomic_file file;
    GP_TRY(gp_atomic_create(&file, path, err));
    FILE *f = gp_atomic_stream(&file);
    if (!f) {
        gp_atomic_abort(&file);
        return gp_error_set(err, GP_ERR_IO, "cannot write '%s'", path);
    }
    fn(f, p, r, names);
    return gp_atomic_commit(&file, err);
}

static void json_fn(FILE *f, const struct gp_profile *p, const struct gp_balance_report *r, const char *const *names)
{
    (void)names;
    gp_balance_json(f, p, r);
}

gp_status gp_balance_json_write(const char *path, const struct gp_profile *p, const struct gp_balance_report *r,
                                struct gp_error *err)
{
    return write_atomic(path, json_fn, p, r, NULL, err);
}

/* ---- SVG ---- */

/* Text for XML: the five characters markup gives meaning to, escaped;
 * control characters (not allowed in XML 1.0) dropped. */
static void xml_text(FILE *f, const char *s)
{
    for (; s && *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '&') fputs("&amp;", f);
        else if (c == '<') fputs("&lt;", f);
        else if (c == '>') fputs("&gt;", f);
        else if (c == '"') fputs("&quot;", f);
        else if (c == '\'') fputs("&apos;", f);
        else if (c >= 0x20 || c == '\t') fputc(c, f);
    }
}

/* An axis step of 1, 2 or 5 times a power of ten giving about `ticks` ticks. */
static double nice_step(double max, int ticks)
{
    if (!(max > 0)) return 1;
    double raw = max / ticks, mag = pow(10, floor(log10(raw))), r = raw / mag;
    return (r <= 1 ? 1 : r <= 2 ? 2 : r <= 5 ? 5 : 10) * mag;
}

static void bytes_text(int64_t b, char *buf, size_t size)
{
    const char *unit[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double v = (double)b;
    int u = 0;
    while (v >= 1024 && u < 4) v /= 1024, u++;
    if (u == 0) snprintf(buf, size, "%lld B", (long long)b);
    else snprintf(buf, size, "%.1f %s", v, unit[u]);
}

/* Geometry, in SVG user units (pixels at 100%). */
#define SVG_W 1000.0
#define PLOT_L 72.0  /* left of the plot: room for the ms axis */
#define PLOT_R 24.0
#define PLOT_T 76.0
#define PLOT_H 260.0
#define ROW_H 26.0   /* one stage of the load panel */

static const char *band_fill[2] = {"#eef3fa", "#fbf3e9"};

static void svg_fn(FILE *f, const struct gp_profile *p, const struct gp_balance_report *r, const char *const *names)
{
    const struct gp_split_report *opt = &r->optimal;
    bool by_time = r->cfg.by == GP_BALANCE_TIME;
    int n = p->n_layers;
    double plot_w = SVG_W - PLOT_L - PLOT_R, bottom = PLOT_T + PLOT_H;
    double panel_t = bottom + 64, height = panel_t + 22 + ROW_H * opt->k + 16;
    double max_layer = 0, total_f = 0, total_b = 0;
    for (int i = 0; i < n; i++) {
        double t = p->layers[i].forward_ms + p->layers[i].backward_ms;
        if (t > max_layer) max_layer = t;
        total_f += p->layers[i].forward_ms;
        total_b += p->layers[i].backward_ms;
    }
    double step = nice_step(max_layer, 5), top = step * ceil(max_layer / step);
    if (!(top > 0)) top = 1;
    double slot = n > 0 ? plot_w / n : plot_w;
    double gap = slot > 4 ? 1 : slot > 2 ? 0.5 : 0;
#define X(i) (PLOT_L + (i) * slot)
#define Y(ms) (bottom - (ms) / top * PLOT_H)

    fprintf(f,
            "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" viewBox=\"0 0 %.0f %.0f\" "
            "font-family=\"sans-serif\" font-size=\"12\">\n",
            SVG_W, height, SVG_W, height);
    fputs("<style>.layer:hover rect{opacity:.6} .cut{stroke:#c0392b;stroke-width:1.5;stroke-dasharray:5 3}"
          " .axis{stroke:#555} .grid{stroke:#ddd} text{fill:#222}</style>\n",
          f);
    fprintf(f, "<rect width=\"%.0f\" height=\"%.0f\" fill=\"#fff\"/>\n", SVG_W, height);

    /* Title: what was measured and what the split predicts. */
    const char *base = strrchr(p->model, '/');
    base = base ? base + 1 : p->model;
    fputs("<text x=\"16\" y=\"24\" font-size=\"16\" font-weight=\"bold\">", f);
    xml_text(f, base);
    fprintf(f, ": %d layers in %d stages, balanced by %s</text>\n", n, opt->k, by_time ? "time" : "memory");
    fputs("<text x=\"16\" y=\"44\">", f);
    fprintf(f, "profiled on ");
    xml_text(f, p->device);
    fprintf(f,
            " (%s), micro-batch %lld (batch %lld in %d), %s schedule, checkpoint %s: forward %.3f ms, backward "
            "%.3f ms per micro-batch</text>\n",
            p->precision, (long long)p->micro_batch, (long long)r->cfg.batch, r->cfg.n_micro,
            gp_pipe_schedule_name(r->cfg.schedule), gp_checkpoint_name(r->cfg.checkpoint), total_f, total_b);
    fprintf(f,
            "<text x=\"16\" y=\"62\">predicted step %.2f ms, %.0f samples/s, imbalance %.3f (max/mean), bubble "
            "%.1f%%</text>\n",
            opt->predicted_step_ms, opt->throughput, opt->imbalance, 100 * r->bubble);

    /* Stage bands behind the bars, each labelled. */
    for (int s = 0; s < opt->k; s++) {
        const struct gp_stage_figures *sf = &opt->stages[s];
        double x0 = X(sf->first_layer), x1 = X(sf->last_layer);
        fprintf(f, "<rect class=\"band\" x=\"%.2f\" y=\"%.0f\" width=\"%.2f\" height=\"%.0f\" fill=\"%s\"/>\n", x0,
                PLOT_T, x1 - x0, PLOT_H, band_fill[s % 2]);
        if (x1 - x0 >= 44)
            fprintf(f, "<text x=\"%.2f\" y=\"%.0f\" text-anchor=\"middle\" fill=\"#555\">stage %d</text>\n",
                    (x0 + x1) / 2, PLOT_T + 14, s);
    }
    /* The ms axis with its grid. */
    for (double v = 0; v <= top + step / 2; v += step) {
        double y = Y(v);
        fprintf(f, "<line class=\"grid\" x1=\"%.0f\" y1=\"%.2f\" x2=\"%.0f\" y2=\"%.2f\"/>\n", PLOT_L, y,
                PLOT_L + plot_w, y);
        fprintf(f, "<text x=\"%.0f\" y=\"%.2f\" text-anchor=\"end\">%g</text>\n", PLOT_L - 6, y + 4, v);
    }
    fprintf(f,
            "<text transform=\"translate(18 %.0f) rotate(-90)\" text-anchor=\"middle\">ms per micro-batch "
            "(forward + backward)</text>\n",
            PLOT_T + PLOT_H / 2);
    /* One bar per layer: forward at the bottom, backward stacked on it. */
    for (int i = 0; i < n; i++) {
        const struct gp_layer_profile *l = &p->layers[i];
        const char *name = names && names[i] ? names[i] : NULL;
        double x = X(i) + gap / 2, w = slot - gap;
        fprintf(f, "<g class=\"layer\" data-layer=\"%d\" data-forward-ms=\"%.6g\" data-backward-ms=\"%.6g\"><title>layer %d",
                i, l->forward_ms, l->backward_ms, i);
        if (name) {
            fputs(" ", f);
            xml_text(f, name);
        }
        fputs(" (", f);
        xml_text(f, l->op);
        fprintf(f, "): forward %.3f ms, backward %.3f ms", l->forward_ms, l->backward_ms);
        char a[32];
        bytes_text(l->frontier_bytes, a, sizeof a);
        fprintf(f, "; frontier after it %s</title>", a);
        fprintf(f, "<rect x=\"%.2f\" y=\"%.2f\" width=\"%.2f\" height=\"%.2f\" fill=\"#4e79a7\"/>", x,
                Y(l->forward_ms), w, bottom - Y(l->forward_ms));
        fprintf(f, "<rect x=\"%.2f\" y=\"%.2f\" width=\"%.2f\" height=\"%.2f\" fill=\"#f28e2b\"/></g>\n", x,
                Y(l->forward_ms + l->backward_ms), w, Y(l->forward_ms) - Y(l->forward_ms + l->backward_ms));
    }
    /* The cuts, at the first layer of every stage but the first. */
    for (int s = 1; s < opt->k; s++) {
        int c = opt->stages[s].first_layer;
        fprintf(f, "<line class=\"cut\" data-cut=\"%d\" x1=\"%.2f\" y1=\"%.0f\" x2=\"%.2f\" y2=\"%.0f\"><title>cut "
                "before layer %d</title></line>\n",
                c, X(c), PLOT_T - 4, X(c), bottom + 4, c);
    }
    /* The layer axis: ticks at round indices. */
    fprintf(f, "<line class=\"axis\" x1=\"%.0f\" y1=\"%.0f\" x2=\"%.0f\" y2=\"%.0f\"/>\n", PLOT_L, bottom,
            PLOT_L + plot_w, bottom);
    int every = (int)nice_step(n, 10);
    if (every < 1) every = 1;
    for (int i = 0; i < n; i += every)
        fprintf(f, "<text x=\"%.2f\" y=\"%.0f\" text-anchor=\"middle\">%d</text>\n", X(i) + slot / 2, bottom + 16,
                i);
    fprintf(f,
            "<text x=\"%.0f\" y=\"%.0f\" text-anchor=\"middle\">layer (as 'gpipe-onnx inspect' numbers them; hover "
            "a bar for its name and op)</text>\n",
            PLOT_L + plot_w / 2, bottom + 34);
    /* Legend. */
    fprintf(f,
            "<rect x=\"%.0f\" y=\"52\" width=\"10\" height=\"10\" fill=\"#4e79a7\"/><text x=\"%.0f\" "
            "y=\"61\">forward</text>"
            "<rect x=\"%.0f\" y=\"52\" width=\"10\" height=\"10\" fill=\"#f28e2b\"/><text x=\"%.0f\" "
            "y=\"61\">backward</text>"
            "<line class=\"cut\" x1=\"%.0f\" y1=\"57\" x2=\"%.0f\" y2=\"57\"/><text x=\"%.0f\" y=\"61\">cut</text>\n",
            SVG_W - 250, SVG_W - 236, SVG_W - 165, SVG_W - 151, SVG_W - 80, SVG_W - 60, SVG_W - 54);

    /* Stage loads: the objective per stage against the slowest (largest). */
    double max_load = 0;
    for (int s = 0; s < opt->k; s++) {
        double v = by_time ? opt->stages[s].time_ms : (double)opt->stages[s].memory_bytes;
        if (v > max_load) max_load = v;
    }
    fprintf(f,
            "<text x=\"16\" y=\"%.0f\" font-weight=\"bold\">load per stage (%s), against the %s</text>\n",
            panel_t, by_time ? "time per micro-batch: forward, backward, recomputation, frontier received" : "memory",
            by_time ? "slowest" : "largest");
    double bar_l = 200, bar_w = SVG_W - bar_l - 250;
    for (int s = 0; s < opt->k; s++) {
        const struct gp_stage_figures *sf = &opt->stages[s];
        double v = by_time ? sf->time_ms : (double)sf->memory_bytes;
        double share = max_load > 0 ? v / max_load : 0, y = panel_t + 12 + ROW_H * s;
        double layer_sum = 0;
        for (int i = sf->first_layer; i < sf->last_layer; i++)
            layer_sum += p->layers[i].forward_ms + p->layers[i].backward_ms;
        char mem[32];
        bytes_text(sf->memory_bytes, mem, sizeof mem);
        fprintf(f,
                "<g class=\"stage\" data-stage=\"%d\" data-first-layer=\"%d\" data-last-layer=\"%d\" "
                "data-time-ms=\"%.6f\" data-memory-bytes=\"%lld\" data-share=\"%.6f\">",
                s, sf->first_layer, sf->last_layer - 1, sf->time_ms, (long long)sf->memory_bytes, share);
        fprintf(f,
                "<title>stage %d: layers %d-%d (%s .. %s), %.3f ms per micro-batch (its layers' forward + backward "
                "%.3f ms), %s</title>",
                s, sf->first_layer, sf->last_layer - 1, p->layers[sf->first_layer].op, p->layers[sf->last_layer - 1].op,
                sf->time_ms, layer_sum, mem);
        fprintf(f, "<text x=\"16\" y=\"%.2f\">stage %d: layers %d-%d</text>", y + 15, s, sf->first_layer,
                sf->last_layer - 1);
        fprintf(f, "<rect x=\"%.0f\" y=\"%.2f\" width=\"%.2f\" height=\"18\" fill=\"%s\" stroke=\"#999\"/>", bar_l,
                y + 2, bar_w, band_fill[s % 2]);
        fprintf(f, "<rect x=\"%.0f\" y=\"%.2f\" width=\"%.2f\" height=\"18\" fill=\"%s\"/>", bar_l, y + 2,
                bar_w * share, share >= 0.9999995 ? "#c0392b" : "#76a35a");
        if (by_time)
            fprintf(f, "<text x=\"%.0f\" y=\"%.2f\">%.3f ms, %.1f%%  (%s)</text></g>\n", bar_l + bar_w + 8, y + 15,
                    sf->time_ms, 100 * share, mem);
        else
            fprintf(f, "<text x=\"%.0f\" y=\"%.2f\">%s, %.1f%%  (%.3f ms)</text></g>\n", bar_l + bar_w + 8, y + 15,
                    mem, 100 * share, sf->time_ms);
    }
    fputs("</svg>\n", f);
#undef X
#undef Y
}

gp_status gp_balance_svg_write(const char *path, const struct gp_profile *p, const struct gp_balance_report *r,
                               const char *const *names, struct gp_error *err)
{
    return write_atomic(path, svg_fn, p, r, names, err);
}

void gp_balance_svg(FILE *f, const struct gp_profile *p, const struct gp_balance_report *r,
                    const char *const *names)
{
    svg_fn(f, p, r, names);
}
