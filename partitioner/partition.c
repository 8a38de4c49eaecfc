/* Contiguous partitions: the exact optimum, the even split, torchgpipe's
 * block partition heuristic. See partition.h for the cost model.
 *
 * Why the optimum is exact
 * ------------------------
 * Write c(i, j) for the cost of a stage holding layers [i, j):
 * (P[j] - P[i]) + b[i], computed in double exactly so everywhere (also in
 * gp_partition_eval). Weights are >= 0, so P is non-decreasing (rounding is
 * monotone), hence for a fixed i, c(i, j) is non-decreasing in j: the ends j
 * with c(i, j) <= T form an interval (i, reach_T(i)].
 *
 * Greedy packing (each stage as long as it fits under T) is NOT exact here,
 * because the boundary term depends on where a stage starts: weights
 * {1, 1, 1}, boundaries {0, 0, 5}, k = 2 has the optimum 2 (cut at 1: costs
 * 1 and 2), but greedy under T = 2 fills [0, 2) and is left with [2, 3) at
 * cost 6. For the same reason more stages are not always cheaper than fewer,
 * so feasibility has to be decided for exactly k stages:
 *
 *   R_0 = {0},  R_s = { j : some i in R_{s-1} has i < j <= reach_T(i) }.
 *
 * R_s is the set of prefixes [0, j) that split into s non-empty stages each
 * of cost <= T (induction on s: the last stage [i, j) fits iff
 * j <= reach_T(i)). T is feasible iff n is in R_k. One sweep per s keeps the
 * running maximum of reach_T(i) over i in R_{s-1}, i < j: O(n log n + k n).
 *
 * With B* the least bottleneck over all partitions, T is feasible iff
 * T >= B* (an optimal partition fits under any T >= B*; a partition under T
 * has bottleneck <= T). B* is a computed stage cost, hence a double, and so
 * the smallest feasible double. Costs are >= 0, and non-negative doubles
 * order as their bit patterns do, so a bisection on the bit patterns between
 * 0 and the even split's bottleneck (feasible by construction) finds B* in at
 * most 64 feasibility tests, with no tolerance anywhere. (This needs IEEE
 * double arithmetic as C specifies it: no -ffast-math, no x87 excess
 * precision.)
 *
 * Stage-dependent costs (stage_weight, stage_boundary) change nothing in
 * this: c_s(i, j) is non-decreasing in j for each stage s, the s-th stage
 * of a prefix uses reach_T(s - 1, i), and the suffix DP below the reach
 * and boundary terms of the stage it places.
 *
 * Ties: a suffix DP under T = B*. H_s[i] is the least key of a split of
 * [i, n) into s stages of cost <= B*, the key being the sum of the boundary
 * terms at its cuts added right to left: H_1[i] = 0 if c(i, n) <= B*, and
 * H_s[i] = min over i < j <= min(reach(i), n - 1) of b[j] + H_{s-1}[j].
 * Because rounded addition is monotone (x <= y implies b + x <= b + y), this
 * min is the least rounded key over all such splits, not an approximation.
 * Taking the leftmost j that reaches the min at every step yields the first
 * partition in the order of partition.h. The min over a window (i, r] with i
 * falling one by one is read off a stack of the strict prefix minima of
 * b[j] + H_{s-1}[j] seen from i + 1, by binary search: O(k n log n). */
#include "partitioner/partition.h"

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Above this the sums of a problem could overflow on the way; no real model
 * comes near it. */
#define COST_LIMIT 0x1p1000

struct costs {
    int n;
    double *prefix;         /* [n + 1], or [k][n + 1] with stage weights: stage s's at s * pstride */
    size_t pstride;         /* 0 or n + 1 */
    const double *boundary; /* [n], [k][n] with stage boundaries (at s * bstride), or NULL */
    size_t bstride;         /* 0 or n */
    bool by_stage;          /* some cost depends on the stage */
    /* The peaks' sparse table (NULL without peaks): level L at L * n holds
     * at i the max of peak[i .. i + 2^L), for the O(1) max over a stage. */
    double *peak_max;
};

static inline double bnd(const struct costs *c, int s, int i)
{
    return c->boundary ? c->boundary[(size_t)s * c->bstride + (size_t)i] : 0.0;
}

/* The largest peak of layers [i, j), i < j (0 without peaks): two
 * overlapping power-of-two windows of the table. */
static inline double peak_of(const struct costs *c, int i, int j)
{
    if (!c->peak_max || j <= i) return 0.0;
    int level = 0;
    while ((2 << level) <= j - i) level++;
    const double *row = c->peak_max + (size_t)level * (size_t)c->n;
    double a = row[i], b = row[j - (1 << level)];
    return a > b ? a : b;
}

/* The one definition of a stage's cost: stage s holding layers [i, j).
 * Each term is non-decreasing in j, and rounded addition is monotone, so
 * the cost is too (what the search below needs). */
static inline double stage_cost(const struct costs *c, int s, int i, int j)
{
    const double *prefix = c->prefix + (size_t)s * c->pstride;
    return ((prefix[j] - prefix[i]) + bnd(c, s, i)) + peak_of(c, i, j);
}

static void costs_free(struct costs *c)
{
    free(c->prefix);
    free(c->peak_max);
    c->prefix = NULL;
    c->peak_max = NULL;
}

gp_status gp_partition_validate(const struct gp_partition_problem *p, struct gp_error *err)
{
    if (!p) return gp_error_set(err, GP_ERR_INVALID, "partition: no problem given");
    if (p->n < 1) return gp_error_set(err, GP_ERR_INVALID, "partition: no layers to split (n = %d)", p->n);
    if (!p->weight) return gp_error_set(err, GP_ERR_INVALID, "partition: no layer weights given");
    if (p->k < 1) return gp_error_set(err, GP_ERR_INVALID, "partition: %d stages requested (at least 1)", p->k);
    if (p->k > p->n)
        return gp_error_set(err, GP_ERR_INVALID, "partition: cannot split %d layers into %d non-empty stages",
                            p->n, p->k);
    if (p->k > GP_MAX_STAGES)
        return gp_error_set(err, GP_ERR_UNSUPPORTED, "partition: %d stages requested, at most %d supported", p->k,
                            GP_MAX_STAGES);
    double total = 0;
    for (int i = 0; i < p->n; i++) {
        double w = p->weight[i];
        if (!isfinite(w) || w < 0)
            return gp_error_set(err, GP_ERR_INVALID, "partition: layer %d has weight %g (must be finite and >= 0)",
                                i, w);
        total += w;
    }
    if (p->peak)
        for (int i = 0; i < p->n; i++) {
            double v = p->peak[i];
            if (!isfinite(v) || v < 0)
                return gp_error_set(err, GP_ERR_INVALID, "partition: layer %d has peak %g (must be finite and >= 0)",
                                    i, v);
            total += v;
        }
    if (p->boundary)
        for (int c = 0; c < p->n; c++) {
            double b = p->boundary[c];
            if (!isfinite(b) || b < 0)
                return gp_error_set(err, GP_ERR_INVALID,
                                    "partition: boundary cost at cut %d is %g (must be finite and >= 0)", c, b);
            total += b;
        }
    /* Stage costs: each stage's sum is bounded, as the sums above. */
    for (int s = 0; s < p->k; s++) {
        double stage_total = 0;
        for (int i = 0; i < p->n; i++) {
            double w = p->stage_weight ? p->stage_weight[(size_t)s * p->n + i] : 0;
            double b = p->stage_boundary ? p->stage_boundary[(size_t)s * p->n + i] : 0;
            if (!isfinite(w) || w < 0 || !isfinite(b) || b < 0)
                return gp_error_set(err, GP_ERR_INVALID,
                                    "partition: stage %d's %s at layer %d is %g (must be finite and >= 0)", s,
                                    !isfinite(w) || w < 0 ? "weight" : "boundary cost", i,
                                    !isfinite(w) || w < 0 ? w : b);
            stage_total += w + b;
        }
        if (!(stage_total <= COST_LIMIT))
            return gp_error_set(err, GP_ERR_INVALID, "partition: stage %d's weights and boundary costs sum to %g, above %g",
                                s, stage_total, COST_LIMIT);
    }
    if (!(total <= COST_LIMIT))
        return gp_error_set(err, GP_ERR_INVALID, "partition: weights and boundary costs sum to %g, above %g", total,
                            COST_LIMIT);
    return GP_OK;
}

static gp_status costs_init(const struct gp_partition_problem *p, struct costs *c, struct gp_error *err)
{
    size_t n = (size_t)p->n, stages = p->stage_weight ? (size_t)p->k : 1;
    c->n = p->n;
    c->boundary = p->stage_boundary ? p->stage_boundary : p->boundary;
    c->bstride = p->stage_boundary ? n : 0;
    c->pstride = p->stage_weight ? n + 1 : 0;
    c->by_stage = p->stage_weight || p->stage_boundary;
    c->prefix = malloc(sizeof(double) * (n + 1) * stages);
    c->peak_max = NULL;
    if (!c->prefix) return gp_error_set(err, GP_ERR_NOMEM, "partition: out of memory for %d layers", p->n);
    if (p->peak) {
        size_t levels = 1;
        while (((size_t)2 << (levels - 1)) <= n) levels++;
        c->peak_max = malloc(sizeof(double) * n * levels);
        if (!c->peak_max) {
            costs_free(c);
            return gp_error_set(err, GP_ERR_NOMEM, "partition: out of memory for %d layers", p->n);
        }
        memcpy(c->peak_max, p->peak, sizeof(double) * n);
        for (size_t L = 1; L < levels; L++) {
            const double *below = c->peak_max + (L - 1) * n;
            double *row = c->peak_max + L * n;
            size_t half = (size_t)1 << (L - 1);
            for (size_t i = 0; i + 2 * half <= n; i++)
                row[i] = below[i] > below[i + half] ? below[i] : below[i + half];
        }
    }
    for (size_t s = 0; s < stages; s++) {
        double *prefix = c->prefix + s * (n + 1);
        const double *w = p->stage_weight ? p->stage_weight + s * n : p->weight;
        prefix[0] = 0;
        for (size_t i = 0; i < n; i++) prefix[i + 1] = prefix[i] + w[i];
    }
    return GP_OK;
}

static void fill_costs(const struct costs *c, struct gp_partition *part)
{
    part->bottleneck = 0;
    for (int s = 0; s < part->k; s++) {
        part->cost[s] = stage_cost(c, s, part->first[s], part->first[s + 1]);
        if (part->cost[s] > part->bottleneck) part->bottleneck = part->cost[s];
    }
}

static gp_status check_cuts(const struct gp_partition_problem *p, const struct gp_partition *part,
                            struct gp_error *err)
{
    if (part->k != p->k)
        return gp_error_set(err, GP_ERR_INVALID, "partition: %d stages given for a problem of %d", part->k, p->k);
    if (part->first[0] != 0 || part->first[part->k] != p->n)
        return gp_error_set(err, GP_ERR_INVALID, "partition: stages cover layers [%d, %d), not [0, %d)",
                            part->first[0], part->first[part->k], p->n);
    for (int s = 0; s < part->k; s++)
        if (part->first[s + 1] <= part->first[s])
            return gp_error_set(err, GP_ERR_INVALID, "partition: stage %d is empty or reversed (layers [%d, %d))", s,
                                part->first[s], part->first[s + 1]);
    return GP_OK;
}

gp_status gp_partition_eval(const struct gp_partition_problem *p, struct gp_partition *part, struct gp_error *err)
{
    GP_TRY(gp_partition_validate(p, err));
    GP_TRY(check_cuts(p, part, err));
    struct costs c;
    GP_TRY(costs_init(p, &c, err));
    fill_costs(&c, part);
    costs_free(&c);
    return GP_OK;
}

void gp_partition_counts(const struct gp_partition *part, int *counts)
{
    for (int s = 0; s < part->k; s++) counts[s] = part->first[s + 1] - part->first[s];
}

gp_status gp_partition_from_counts(const struct gp_partition_problem *p, const int *counts,
                                   struct gp_partition *out, struct gp_error *err)
{
    GP_TRY(gp_partition_validate(p, err));
    memset(out, 0, sizeof *out);
    out->k = p->k;
    for (int s = 0; s < p->k; s++) {
        if (counts[s] < 1 || counts[s] > p->n - out->first[s])
            return gp_error_set(err, GP_ERR_INVALID, "partition: stage %d cannot hold %d of the %d layers", s,
                                counts[s], p->n);
        out->first[s + 1] = out->first[s] + counts[s];
    }
    if (out->first[p->k] != p->n)
        return gp_error_set(err, GP_ERR_INVALID, "partition: the stages hold %d layers, the model has %d",
                            out->first[p->k], p->n);
    return gp_partition_eval(p, out, err);
}

static void even_cuts(int n, int k, int *first)
{
    for (int s = 0; s <= k; s++) first[s] = s * (n / k) + (s < n % k ? s : n % k);
}

gp_status gp_partition_even(const struct gp_partition_problem *p, struct gp_partition *out, struct gp_error *err)
{
    GP_TRY(gp_partition_validate(p, err));
    memset(out, 0, sizeof *out);
    out->k = p->k;
    even_cuts(p->n, p->k, out->first);
    return gp_partition_eval(p, out, err);
}

/* ---- the exact optimum ---- */

struct search {
    const struct costs *c;
    int k;
    int *reach;         /* [n], or [k][n] by stage: reach_T(s, i), i when not even layer i fits */
    size_t rstride;     /* 0 or n */
    unsigned char *in;  /* [n + 1]: R_{s-1} */
    unsigned char *out; /* [n + 1]: R_s */
};

/* Largest j in (i, n] with c_s(i, j) <= t, or i. */
static int reach_of(const struct costs *c, int s, int i, double t)
{
    int lo = i, hi = c->n; /* c(i, lo) fits (lo == i stands for "none"), find the last j that does */
    while (lo < hi) {
        int mid = lo + (hi - lo + 1) / 2;
        if (stage_cost(c, s, i, mid) <= t) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

/* reach_T for every stage (once when no cost depends on the stage). */
static void reach_all(const struct costs *c, int k, double t, int *reach)
{
    int stages = c->by_stage ? k : 1;
    for (int s = 0; s < stages; s++)
        for (int i = 0; i < c->n; i++) reach[(size_t)s * c->n + i] = reach_of(c, s, i, t);
}

/* Whether the layers split into exactly k non-empty stages of cost <= t. */
static int feasible(struct search *S, double t)
{
    const int n = S->c->n, k = S->k;
    reach_all(S->c, k, t, S->reach);
    memset(S->in, 0, (size_t)n + 1);
    S->in[0] = 1;
    for (int s = 1; s <= k; s++) {
        /* R_s lies in [s, n - (k - s)]: each stage holds a layer. */
        int hi_j = n - (k - s);
        int best = -1, any = 0;
        const int *reach = S->reach + (size_t)(s - 1) * S->rstride; /* the s-th stage is stage s - 1 */
        memset(S->out, 0, (size_t)n + 1);
        for (int j = s; j <= hi_j; j++) {
            if (S->in[j - 1] && reach[j - 1] > best) best = reach[j - 1];
            if (best >= j) S->out[j] = 1, any = 1;
        }
        if (!any) return 0;
        unsigned char *tmp = S->in;
        S->in = S->out;
        S->out = tmp;
    }
    return S->in[n];
}

static uint64_t bits_of(double x)
{
    uint64_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}

static double double_of(uint64_t u)
{
    double x;
    memcpy(&x, &u, sizeof x);
    return x;
}

/* The first partition in the tie order among those of bottleneck <= t
 * (t = B*), into first[]. reach[] holds reach_t (per stage at rstride).
 * Returns 0 if none. */
static int least_key_cuts(const struct costs *c, int k, const int *reach, size_t rstride, int *nxt, double *h_prev,
                          double *h_cur, double *v, int *stack, int *first)
{
    const int n = c->n;
    const int *last_reach = reach + (size_t)(k - 1) * rstride;
    for (int i = 0; i < n; i++) h_prev[i] = last_reach[i] == n ? 0.0 : INFINITY;
    for (int s = 2; s <= k; s++) {
        int *nx = nxt + (size_t)(s - 2) * n;
        /* s stages for [i, n): stages q = k - s .. k - 1, the next cut
         * starting stage q + 1. */
        int q = k - s;
        const int *rq = reach + (size_t)q * rstride;
        for (int j = 0; j < n; j++) v[j] = h_prev[j] < INFINITY ? bnd(c, q + 1, j) + h_prev[j] : INFINITY;
        /* stack[0..top): positions, decreasing; values v[], strictly
         * decreasing with the position: the strict prefix minima of v over
         * [i + 1, n - 1], leftmost first at the top. */
        int top = 0;
        for (int i = n - 1; i >= 0; i--) {
            int j = i + 1;
            if (j <= n - 1 && v[j] < INFINITY) {
                while (top > 0 && v[stack[top - 1]] >= v[j]) top--;
                stack[top++] = j;
            }
            h_cur[i] = INFINITY;
            nx[i] = -1;
            int r = rq[i] < n - 1 ? rq[i] : n - 1;
            if (r < i + 1) continue;
            int lo = 0, hi = top; /* smallest index whose position is <= r */
            while (lo < hi) {
                int mid = lo + (hi - lo) / 2;
                if (stack[mid] <= r) hi = mid;
                else lo = mid + 1;
            }
            if (lo == top) continue;
            h_cur[i] = v[stack[lo]];
            nx[i] = stack[lo];
        }
        double *tmp = h_prev;
        h_prev = h_cur;
        h_cur = tmp;
    }
    if (!(h_prev[0] < INFINITY)) return 0;
    first[0] = 0;
    for (int s = k, i = 0; s >= 2; s--) {
        i = nxt[(size_t)(s - 2) * n + i];
        first[k - s + 1] = i;
    }
    first[k] = n;
    return 1;
}

gp_status gp_partition_optimal(const struct gp_partition_problem *p, struct gp_partition *out,
                               struct gp_error *err)
{
    GP_TRY(gp_partition_validate(p, err));
    memset(out, 0, sizeof *out);
    out->k = p->k;
    const int n = p->n, k = p->k;
    struct costs c;
    GP_TRY(costs_init(p, &c, err));
    if (k == 1) {
        out->first[1] = n;
        fill_costs(&c, out);
        costs_free(&c);
        return GP_OK;
    }

    size_t nn = (size_t)n, rstride = c.by_stage ? nn : 0;
    int *reach = malloc(sizeof(int) * nn * (c.by_stage ? (size_t)k : 1));
    unsigned char *in = malloc(nn + 1), *outset = malloc(nn + 1);
    double *h = malloc(sizeof(double) * 3 * nn);
    int *stack = malloc(sizeof(int) * nn);
    int *nxt = malloc(sizeof(int) * (size_t)(k - 1) * nn);
    gp_status st = GP_OK;
    if (!reach || !in || !outset || !h || !stack || !nxt) {
        st = gp_error_set(err, GP_ERR_NOMEM, "partition: out of memory for %d layers in %d stages", n, k);
        goto done;
    }

    struct search S = {.c = &c, .k = k, .reach = reach, .rstride = rstride, .in = in, .out = outset};
    /* The even split is a partition, so its bottleneck is feasible. */
    struct gp_partition even = {.k = k};
    even_cuts(n, k, even.first);
    fill_costs(&c, &even);
    uint64_t hi = bits_of(even.bottleneck), lo = 0;
    if (feasible(&S, 0.0)) {
        hi = 0;
    } else {
        /* feasible(hi), not feasible(lo) */
        while (hi - lo > 1) {
            uint64_t mid = lo + (hi - lo) / 2;
            if (feasible(&S, double_of(mid))) hi = mid;
            else lo = mid;
        }
    }
    double best = double_of(hi);

    reach_all(&c, k, best, reach);
    if (!least_key_cuts(&c, k, reach, rstride, nxt, h, h + nn, h + 2 * nn, stack, out->first)) {
        st = gp_error_set(err, GP_ERR_INVALID, "partition: internal error, no split reaches the bottleneck %g", best);
        goto done;
    }
    fill_costs(&c, out);
    if (out->bottleneck != best)
        st = gp_error_set(err, GP_ERR_INVALID, "partition: internal error, bottleneck %g instead of %g",
                          out->bottleneck, best);
done:
    free(reach);
    free(in);
    free(outset);
    free(h);
    free(stack);
    free(nxt);
    costs_free(&c);
    return st;
}

/* ---- torchgpipe's block partition heuristic ----
 *
 * torchgpipe/balance/blockpartition.py, step for step:
 *   normalize the weights to [0, 1] ((x - min) / (max - min), all 0 when equal);
 *   start from splits[s] = (n / k) (s + 1), the remainder in the last block;
 *   (1) p = a largest block (Python's max over (size, index): the last one);
 *   (2) q = a smallest block (min over (size, index): the first one);
 *       stop if size(p) <= size(q) + 1, size(p) as of step (1);
 *   (3) move one layer into q from its neighbour h towards p; back to (1) if
 *       h == p, else to (2).
 * Block sizes are computed as Python computes them (see block_size), so the
 * same states and ties arise as in torchgpipe. */

/* Sum of the normalized weights of block i, left to right like Python's
 * sum(); the cuts are within [0, n] (the moves stop otherwise), and a block
 * whose start is not before its stop is empty, as a Python slice. */
static double block_size(const double *norm, const long *splits, int i)
{
    long start = i > 0 ? splits[i - 1] : 0, stop = splits[i];
    double sum = 0;
    for (long x = start; x < stop; x++) sum += norm[x];
    return sum;
}

gp_status gp_partition_heuristic(const struct gp_partition_problem *p, struct gp_partition *out,
                                 struct gp_error *err)
{
    GP_TRY(gp_partition_validate(p, err));
    memset(out, 0, sizeof *out);
    const int n = p->n, k = p->k;
    out->k = k;
    double *norm = malloc(sizeof(double) * (size_t)n);
    if (!norm) return gp_error_set(err, GP_ERR_NOMEM, "partition: out of memory for %d layers", n);
    double minimum = p->weight[0], maximum = p->weight[0];
    for (int i = 1; i < n; i++) {
        if (p->weight[i] < minimum) minimum = p->weight[i];
        if (p->weight[i] > maximum) maximum = p->weight[i];
    }
    maximum -= minimum;
    for (int i = 0; i < n; i++) norm[i] = maximum == 0 ? 0.0 : (p->weight[i] - minimum) / maximum;

    long splits[GP_MAX_STAGES];
    double size[GP_MAX_STAGES];
    for (int s = 0; s < k - 1; s++) splits[s] = (long)(n / k) * (s + 1);
    splits[k - 1] = n;
    for (int s = 0; s < k; s++) size[s] = block_size(norm, splits, s);

    /* torchgpipe's loop does not always end: a cut can run past the end of
     * the layer list and keep going (weights 0 0 0 0 2 1 0 in 5 blocks);
     * from there its blocks no longer partition the layers. The moves stop
     * there, or after max_moves (never seen: it ends within about n k / 2). */
    const long max_moves = 64L * (n + 1) * k;
    long moves = 0;
    int running = 1;
    while (running) {
        int pp = 0;
        for (int s = 1; s < k; s++)
            if (size[s] >= size[pp]) pp = s;
        double max_size = size[pp];
        for (;;) {
            int q = 0;
            for (int s = 1; s < k; s++)
                if (size[s] < size[q]) q = s;
            if (max_size <= size[q] + 1 || ++moves > max_moves) {
                running = 0;
                break;
            }
            int h, moved;
            if (pp < q) {
                h = q - 1; /* the last layer of block q - 1 goes to q */
                moved = h;
            } else {
                h = q + 1; /* the first layer of block q + 1 goes to q */
                moved = q;
            }
            splits[moved] += pp < q ? -1 : 1;
            if (splits[moved] < 0 || splits[moved] > n) {
                running = 0;
                break;
            }
            size[q] = block_size(norm, splits, q);
            size[h] = block_size(norm, splits, h);
            if (pp == h) break;
        }
    }
    free(norm);

    /* torchgpipe's blocks are sequence[splits[s-1]:splits[s]], which can be
     * empty or overlap. Make each non-empty with the least movement of the
     * cuts: forward so that first[s] > first[s-1], then backward so that
     * first[s] < first[s+1]. */
    out->first[0] = 0;
    for (int s = 1; s < k; s++)
        out->first[s] = splits[s - 1] < 0 ? 0 : splits[s - 1] > n ? n : (int)splits[s - 1];
    out->first[k] = n;
    for (int s = 1; s < k; s++)
        if (out->first[s] <= out->first[s - 1]) out->first[s] = out->first[s - 1] + 1;
    for (int s = k - 1; s >= 1; s--)
        if (out->first[s] >= out->first[s + 1]) out->first[s] = out->first[s + 1] - 1;
    return gp_partition_eval(p, out, err);
}
