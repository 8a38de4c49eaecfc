/* Balance reports written for programs and for people: the JSON report
 * (`balance --json`) and the SVG picture of the profile and the split
 * (`balance --svg`). Both go through util/atomic_file.h: a file appears
 * whole or not at all. */
#ifndef GP_PARTITIONER_REPORT_H
#define GP_PARTITIONER_REPORT_H

#include <stdio.h>

#include "partitioner/balance.h"

/* The report as JSON: model, device, the configuration, the optimal split's
 * 'stages' (first_layer and last_layer inclusive, time_ms, memory_bytes,
 * frontier bytes), 'balance' (layers per stage), imbalance, predicted step
 * and throughput, bubble, suggested chunks, and the even and heuristic
 * splits as objects of the same fields. */
void gp_balance_json(FILE *f, const struct gp_profile *p, const struct gp_balance_report *r);
gp_status gp_balance_json_write(const char *path, const struct gp_profile *p, const struct gp_balance_report *r,
                                struct gp_error *err);

/* The picture: one bar per layer (forward below, backward stacked on it,
 * in ms per micro-batch, on a labelled axis), the stages as shaded bands
 * with a dashed line at each cut, and below them one bar per stage with its
 * load (the objective: time per micro-batch or memory) and its share of the
 * slowest (largest). Hovering a bar shows the layer's index, name, op and
 * times (SVG <title>). `names[i]` names layer i (NULL, or a NULL entry:
 * the op alone).
 *
 * Programs find the figures in attributes: each layer is a
 * <g class="layer" data-layer="i" data-forward-ms data-backward-ms>, each
 * cut a <line class="cut" data-cut="c"> (c: the first layer after it), each
 * stage a <g class="stage" data-stage data-first-layer data-last-layer
 * (inclusive) data-time-ms data-memory-bytes data-share> whose figures are
 * the JSON report's. */
void gp_balance_svg(FILE *f, const struct gp_profile *p, const struct gp_balance_report *r,
                    const char *const *names);
gp_status gp_balance_svg_write(const char *path, const struct gp_profile *p, const struct gp_balance_report *r,
                               const char *const *names, struct gp_error *err);

#endif
