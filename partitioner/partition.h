/* Contiguous partitions of a layer list into pipeline stages.
 *
 * One cost model serves both objectives. Layers 0..n-1 are cut into k
 * contiguous, non-empty stages; stage s holds layers [first[s], first[s+1])
 * and costs
 *
 *     cost(s) = (P[first[s+1]] - P[first[s]]) + boundary[first[s]]
 *               + max(peak[first[s]], ..., peak[first[s+1] - 1])
 *
 * where P[j] = weight[0] + ... + weight[j-1] (prefix sums added left to right
 * in double) and boundary[c] is what a stage pays for starting at layer c.
 *
 *   time:   weight[i] = forward + backward + recompute ms of layer i per
 *           micro-batch; boundary[c] = ms to receive the frontier at cut c
 *           (plus any fixed per-boundary cost), boundary[0] = 0.
 *   memory: weight[i] = bytes layer i costs its stage (parameters, gradients,
 *           optimizer state, activations in flight); boundary[c] = the
 *           frontier bytes at c times the boxes kept in flight; peak[i] =
 *           what lives only while layer i runs (the max term, 0 without peak).
 *
 * A stage may also cost differently by its position: with stage_weight
 * and stage_boundary (1F1B keeps fewer micro-batches in flight on later
 * stages, so a layer's activations cost less there) stage s costs
 * (P_s[first[s+1]] - P_s[first[s]]) + boundary_s[first[s]], P_s the prefix
 * sums of stage s's weights.
 *
 * The bottleneck of a partition is its largest stage cost; gp_partition_eval
 * computes costs with exactly the arithmetic the optimizer minimizes, so the
 * numbers of different partitions compare exactly. Integer-valued weights
 * (bytes) are exact while the sums stay below 2^53. */
#ifndef GP_PARTITIONER_PARTITION_H
#define GP_PARTITIONER_PARTITION_H

#include "util/error.h"

#ifdef __cplusplus
extern "C" {
#endif

#define GP_MAX_STAGES 256

struct gp_partition_problem {
    int n;                  /* layers, >= 1 */
    const double *weight;   /* [n], finite, >= 0 */
    const double *boundary; /* [n], finite, >= 0: boundary[c] is added to the stage that starts
                               at layer c (boundary[0] to stage 0); NULL means all zero */
    int k;                  /* stages, 1 <= k <= min(n, GP_MAX_STAGES) */
    /* Optional, [k * n] each: the weight of layer i and the boundary cost
     * at cut c when they belong to stage s, at [s * n + i] and [s * n + c],
     * in place of weight[] and boundary[] (NULL: those, for every stage).
     * weight[] still feeds the heuristic, which knows no stages. */
    const double *stage_weight;
    const double *stage_boundary;
    /* Optional, [n], finite, >= 0: a cost a stage pays once, for the
     * largest of its layers' peak[] (NULL: none). Memory lives so: the one
     * block a stage plans for what is alive only while one layer runs (the
     * forward-only values, the activation gradients, a kernel's workspace)
     * is as large as its largest layer needs, not the sum over its layers. */
    const double *peak;
};

struct gp_partition {
    int k;
    int first[GP_MAX_STAGES + 1]; /* stage s = layers [first[s], first[s+1]); first[0] = 0,
                                     first[k] = n */
    double cost[GP_MAX_STAGES];   /* per stage, as above */
    double bottleneck;            /* max of cost[] */
};

/* Checks a problem: the message names the layer or cut at fault. */
gp_status gp_partition_validate(const struct gp_partition_problem *p, struct gp_error *err);

/* The exact minimum bottleneck. Among the partitions that reach it, the one
 * with the least sum of stage costs (in time: the least communication; in
 * memory: the least total; with stage weights: the least sum of boundary
 * costs), and among those the lexicographically smallest
 * cut positions. Precisely, with rounding: partitions are ordered by
 * (bottleneck, key[1], first[1], key[2], first[2], ..., key[k-1], first[k-1])
 * where key[s] = boundary[first[s]] + (boundary[first[s+1]] + (... +
 * boundary[first[k-1]])) summed right to left in double (each cut's term
 * that of the stage starting there); in exact arithmetic, without stage
 * weights, that is the order (bottleneck, sum of stage costs, cut positions).
 * O(64 (n log n + k n) + k n log n) time, O(k n) memory. */
gp_status gp_partition_optimal(const struct gp_partition_problem *p, struct gp_partition *out,
                               struct gp_error *err);

/* Equal layer counts, the remainder spread over the first stages (10 layers
 * in 4 stages: 3, 3, 2, 2). */
gp_status gp_partition_even(const struct gp_partition_problem *p, struct gp_partition *out,
                            struct gp_error *err);

/* torchgpipe's balance_by_time / balance_by_size split: the block partition
 * heuristic of torchgpipe/balance/blockpartition.py ("Block Partitions of
 * Sequences", Bárány and Grinberg), move for move, on the weights alone (it
 * knows no boundary costs; the result is evaluated with them). Two
 * departures, where torchgpipe has no usable answer: its loop can run a cut
 * past the end of the layer list and never stop (weights 0 0 0 0 2 1 0 in 5
 * stages), so the moves stop when a cut leaves [0, n] (or after 64 (n + 1) k
 * moves, never seen); and where its blocks come out empty or overlapping,
 * which GPipe rejects, the cuts are moved the least to make every stage
 * non-empty. */
gp_status gp_partition_heuristic(const struct gp_partition_problem *p, struct gp_partition *out,
                                 struct gp_error *err);

/* Fills part->cost and part->bottleneck for the cuts part->first[0..k] with
 * part->k == p->k; fails when the cuts do not make k non-empty stages
 * covering the n layers. */
gp_status gp_partition_eval(const struct gp_partition_problem *p, struct gp_partition *part,
                            struct gp_error *err);

/* A partition from layers per stage (the --balance list: counts[0..p->k-1]),
 * evaluated. */
gp_status gp_partition_from_counts(const struct gp_partition_problem *p, const int *counts,
                                   struct gp_partition *out, struct gp_error *err);

/* Layers per stage: counts[s] = first[s+1] - first[s], s < part->k. */
void gp_partition_counts(const struct gp_partition *part, int *counts);

#ifdef __cplusplus
}
#endif

#endif
