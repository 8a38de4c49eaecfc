/* The partitioner: the optimum against brute force, the baselines against
 * the optimum, torchgpipe's heuristic against its own outputs, edge cases,
 * a large instance, and bad input.
 *
 * The brute force enumerates every split of n layers into k stages and
 * orders them as partition.h documents: (bottleneck, key[1], first[1], ...,
 * key[k-1], first[k-1]), key[s] the boundary terms of cuts s..k-1 summed
 * right to left. Stage costs are computed here on their own, by the formula
 * of partition.h, so a wrong gp_partition_eval cannot hide a wrong optimum. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "partitioner/partition.h"

/* ---- helpers ---- */

static uint64_t rng_state;

static uint64_t rng_next(void)
{
    /* xorshift64*: fixed seeds, the same instances on every run */
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return rng_state * 0x2545F4914F6CDD1DULL;
}

static double rng_unit(void) { return (double)(rng_next() >> 11) * 0x1p-53; }

static int rng_int(int lo, int hi) { return lo + (int)(rng_next() % (uint64_t)(hi - lo + 1)); }

/* The cost of stage [i, j) as partition.h defines it. */
static double ref_cost(const double *prefix, const double *boundary, int i, int j)
{
    return (prefix[j] - prefix[i]) + (boundary ? boundary[i] : 0.0);
}

static void ref_prefix(int n, const double *w, double *prefix)
{
    prefix[0] = 0;
    for (int i = 0; i < n; i++) prefix[i + 1] = prefix[i] + w[i];
}

struct brute {
    int first[GP_MAX_STAGES + 1];
    double bottleneck;
    long n_bottleneck_ties; /* partitions reaching the least bottleneck */
    long n_key_ties;        /* of those, the ones that also reach the least key[1] */
    int lex_first[GP_MAX_STAGES + 1]; /* lexicographically first among the bottleneck ties */
};

/* -1, 0, 1 as partition a comes before, equals, after b in the tie order. */
static int tie_order(int k, const int *fa, const int *fb, const double *boundary)
{
    double ka[GP_MAX_STAGES + 1], kb[GP_MAX_STAGES + 1];
    ka[k] = kb[k] = 0;
    for (int s = k - 1; s >= 1; s--) {
        ka[s] = (boundary ? boundary[fa[s]] : 0.0) + ka[s + 1];
        kb[s] = (boundary ? boundary[fb[s]] : 0.0) + kb[s + 1];
    }
    for (int s = 1; s < k; s++) {
        if (ka[s] != kb[s]) return ka[s] < kb[s] ? -1 : 1;
        if (fa[s] != fb[s]) return fa[s] < fb[s] ? -1 : 1;
    }
    return 0;
}

static void brute_force(int n, const double *w, const double *boundary, int k, struct brute *out)
{
    double prefix[64];
    ref_prefix(n, w, prefix);
    int f[GP_MAX_STAGES + 1];
    /* cuts f[1] < ... < f[k-1] in [1, n-1], lexicographic enumeration */
    for (int s = 0; s < k; s++) f[s] = s;
    f[k] = n;
    out->bottleneck = INFINITY;
    out->n_bottleneck_ties = 0;
    out->n_key_ties = 0;
    for (;;) {
        double b = 0;
        for (int s = 0; s < k; s++) {
            double c = ref_cost(prefix, boundary, f[s], f[s + 1]);
            if (c > b) b = c;
        }
        if (b < out->bottleneck) {
            out->bottleneck = b;
            memcpy(out->first, f, sizeof(int) * (size_t)(k + 1));
            memcpy(out->lex_first, f, sizeof(int) * (size_t)(k + 1));
            out->n_bottleneck_ties = 1;
        } else if (b == out->bottleneck) {
            out->n_bottleneck_ties++;
            if (tie_order(k, f, out->first, boundary) < 0) memcpy(out->first, f, sizeof(int) * (size_t)(k + 1));
        }
        /* next combination */
        int s = k - 1;
        while (s >= 1 && f[s] == n - (k - s)) s--;
        if (s < 1) break;
        f[s]++;
        for (int t = s + 1; t < k; t++) f[t] = f[t - 1] + 1;
    }
    /* second pass: how many optimal partitions share the least key[1] */
    double best_key = INFINITY;
    for (int pass = 0; pass < 2; pass++) {
        for (int s = 0; s < k; s++) f[s] = s;
        f[k] = n;
        for (;;) {
            double b = 0;
            for (int s = 0; s < k; s++) {
                double c = ref_cost(prefix, boundary, f[s], f[s + 1]);
                if (c > b) b = c;
            }
            if (b == out->bottleneck) {
                double key = 0;
                for (int s = k - 1; s >= 1; s--) key = (boundary ? boundary[f[s]] : 0.0) + key;
                if (pass == 0 && key < best_key) best_key = key;
                if (pass == 1 && key == best_key) out->n_key_ties++;
            }
            int s = k - 1;
            while (s >= 1 && f[s] == n - (k - s)) s--;
            if (s < 1) break;
            f[s]++;
            for (int t = s + 1; t < k; t++) f[t] = f[t - 1] + 1;
        }
    }
}

static void assert_valid(const struct gp_partition *part, int n, int k)
{
    assert_int_equal(part->k, k);
    assert_int_equal(part->first[0], 0);
    assert_int_equal(part->first[k], n);
    for (int s = 0; s < k; s++) assert_true(part->first[s] < part->first[s + 1]);
}

/* The costs a partition reports are the ones the formula gives. */
static void assert_costs(const struct gp_partition *part, int n, const double *w, const double *boundary)
{
    double prefix[20001];
    assert_true(n <= 20000);
    ref_prefix(n, w, prefix);
    double b = 0;
    for (int s = 0; s < part->k; s++) {
        double c = ref_cost(prefix, boundary, part->first[s], part->first[s + 1]);
        assert_true(part->cost[s] == c);
        if (c > b) b = c;
    }
    assert_true(part->bottleneck == b);
}

/* ---- the optimum against brute force ---- */

enum flavour { TIME_LIKE, MEMORY_LIKE, TIE_HEAVY };

static void make_instance(enum flavour fl, int n, double *w, double *boundary, int *has_boundary)
{
    for (int i = 0; i < n; i++) {
        double r = rng_unit();
        if (fl == TIME_LIKE) {
            w[i] = r < 0.15 ? 0.0 : r < 0.25 ? 100 + 1e4 * rng_unit() : 10 * rng_unit();
        } else if (fl == MEMORY_LIKE) {
            /* bytes: parameters and activations, with a few huge layers */
            w[i] = r < 0.15 ? 0.0 : r < 0.25 ? (double)(rng_next() % (1ULL << 40)) : (double)(rng_next() % (1u << 20));
        } else {
            w[i] = (double)rng_int(0, 2);
        }
    }
    *has_boundary = rng_unit() >= 0.2;
    for (int c = 0; c < n; c++) {
        double r = rng_unit();
        if (fl == TIME_LIKE) {
            boundary[c] = r < 0.3 ? 0.0 : r < 0.4 ? 50 + 500 * rng_unit() : 3 * rng_unit();
            if (c == 0 && rng_unit() < 0.5) boundary[c] = 0.0; /* usually no cost to receive the input */
        } else if (fl == MEMORY_LIKE) {
            /* workspace + frontier bytes x micro-batches in flight */
            int64_t frontier = r < 0.1 ? (int64_t)(rng_next() % (1ULL << 30)) : (int64_t)(rng_next() % 4096);
            boundary[c] = (double)(4096 + frontier * rng_int(1, 8));
        } else {
            boundary[c] = (double)rng_int(0, 1);
        }
    }
}

struct tally {
    long instances, bottleneck_ties, key_ties, key_matters, beats_even, beats_heuristic;
};

static void check_against_brute(enum flavour fl, int instances, struct tally *t)
{
    double w[12], boundary[12];
    for (int it = 0; it < instances; it++) {
        int n = rng_int(1, 12);
        int k = rng_int(1, n < 5 ? n : 5);
        int has_boundary;
        make_instance(fl, n, w, boundary, &has_boundary);
        const double *bp = has_boundary ? boundary : NULL;
        struct gp_partition_problem p = {.n = n, .weight = w, .boundary = bp, .k = k};
        struct gp_partition opt, even, heur;
        struct gp_error err = {0};
        assert_int_equal(gp_partition_optimal(&p, &opt, &err), GP_OK);
        assert_int_equal(gp_partition_even(&p, &even, &err), GP_OK);
        assert_int_equal(gp_partition_heuristic(&p, &heur, &err), GP_OK);
        assert_valid(&opt, n, k);
        assert_valid(&even, n, k);
        assert_valid(&heur, n, k);
        assert_costs(&opt, n, w, bp);
        assert_costs(&even, n, w, bp);
        assert_costs(&heur, n, w, bp);

        struct brute bf;
        brute_force(n, w, bp, k, &bf);
        if (opt.bottleneck != bf.bottleneck || memcmp(opt.first, bf.first, sizeof(int) * (size_t)(k + 1))) {
            fprintf(stderr, "instance %d (flavour %d): n=%d k=%d\n  w:", it, (int)fl, n, k);
            for (int i = 0; i < n; i++) fprintf(stderr, " %.17g", w[i]);
            fprintf(stderr, "\n  boundary:");
            for (int i = 0; i < n; i++) fprintf(stderr, " %.17g", bp ? bp[i] : 0.0);
            fprintf(stderr, "\n  optimal %.17g cuts", opt.bottleneck);
            for (int s = 0; s <= k; s++) fprintf(stderr, " %d", opt.first[s]);
            fprintf(stderr, "\n  brute   %.17g cuts", bf.bottleneck);
            for (int s = 0; s <= k; s++) fprintf(stderr, " %d", bf.first[s]);
            fprintf(stderr, "\n");
            fail_msg("optimum differs from brute force");
        }
        assert_true(opt.bottleneck <= even.bottleneck);
        assert_true(opt.bottleneck <= heur.bottleneck);
        t->instances++;
        t->bottleneck_ties += bf.n_bottleneck_ties > 1;
        t->key_ties += bf.n_key_ties > 1;
        t->key_matters += memcmp(bf.first, bf.lex_first, sizeof(int) * (size_t)(k + 1)) != 0;
        t->beats_even += opt.bottleneck < even.bottleneck;
        t->beats_heuristic += opt.bottleneck < heur.bottleneck;
    }
}

static void print_tally(const char *name, const struct tally *t)
{
    printf("%s: %ld instances; optimal ties %ld, least-key ties %ld, key decides %ld; "
           "strictly better than even %ld, than the heuristic %ld\n",
           name, t->instances, t->bottleneck_ties, t->key_ties, t->key_matters, t->beats_even, t->beats_heuristic);
}

static void test_brute_force_time_like(void **state)
{
    (void)state;
    rng_state = 0x9E3779B97F4A7C15ULL;
    struct tally t = {0};
    check_against_brute(TIME_LIKE, 4000, &t);
    print_tally("time-like", &t);
    /* the instances exercise what they claim to */
    assert_true(t.bottleneck_ties > 200);
    assert_true(t.beats_even > 1000);
    assert_true(t.beats_heuristic > 500);
}

static void test_brute_force_memory_like(void **state)
{
    (void)state;
    rng_state = 0xD1B54A32D192ED03ULL;
    struct tally t = {0};
    check_against_brute(MEMORY_LIKE, 4000, &t);
    print_tally("memory-like", &t);
    assert_true(t.bottleneck_ties > 200);
    assert_true(t.beats_even > 1000);
    assert_true(t.beats_heuristic > 500);
}

/* Small integers: many partitions share the optimum, so the tie rules
 * (least key, then the first cuts) decide most answers. */
static void test_brute_force_ties(void **state)
{
    (void)state;
    rng_state = 0x94D049BB133111EBULL;
    struct tally t = {0};
    check_against_brute(TIE_HEAVY, 4000, &t);
    print_tally("tie-heavy", &t);
    assert_true(t.bottleneck_ties > 1500);
    assert_true(t.key_ties > 1000);
    assert_true(t.key_matters > 200);
}

/* ---- an independent O(k n^2) DP on instances too large to enumerate ---- */

static double dp_bottleneck(int n, const double *w, const double *boundary, int k)
{
    double *prefix = malloc(sizeof(double) * (size_t)(n + 1));
    double *f = malloc(sizeof(double) * (size_t)(n + 1)), *g = malloc(sizeof(double) * (size_t)(n + 1));
    ref_prefix(n, w, prefix);
    /* f[j]: least bottleneck of [0, j) in s stages */
    for (int j = 0; j <= n; j++) f[j] = j >= 1 ? ref_cost(prefix, boundary, 0, j) : INFINITY;
    for (int s = 2; s <= k; s++) {
        for (int j = 0; j <= n; j++) {
            g[j] = INFINITY;
            for (int i = s - 1; i < j; i++) {
                double c = ref_cost(prefix, boundary, i, j);
                double b = f[i] > c ? f[i] : c;
                if (b < g[j]) g[j] = b;
            }
        }
        double *tmp = f;
        f = g;
        g = tmp;
    }
    double r = f[n];
    free(prefix);
    free(f);
    free(g);
    return r;
}

static void test_medium_against_dp(void **state)
{
    (void)state;
    rng_state = 0xBF58476D1CE4E5B9ULL;
    static double w[800], boundary[800];
    for (int it = 0; it < 12; it++) {
        int n = rng_int(100, 800), k = rng_int(2, 12);
        int has_boundary;
        make_instance(it % 2 ? MEMORY_LIKE : TIME_LIKE, n, w, boundary, &has_boundary);
        struct gp_partition_problem p = {.n = n, .weight = w, .boundary = boundary, .k = k};
        struct gp_partition opt;
        struct gp_error err = {0};
        assert_int_equal(gp_partition_optimal(&p, &opt, &err), GP_OK);
        assert_valid(&opt, n, k);
        assert_costs(&opt, n, w, boundary);
        assert_true(opt.bottleneck == dp_bottleneck(n, w, boundary, k));
    }
}

/* The same with peaks, against a quadratic DP whose stage maximum is taken
 * layer by layer: sizes up to 800 exercise every level of the optimizer's
 * table of maxima, at lengths that are no power of two. */
static void test_medium_peaks_against_dp(void **state)
{
    (void)state;
    rng_state = 0x2545F4914F6CDD1DULL;
    static double w[800], boundary[800], peak[800], prefix[801], best[13][801];
    for (int it = 0; it < 8; it++) {
        int n = rng_int(100, 800), k = rng_int(2, 12);
        int has_boundary;
        make_instance(MEMORY_LIKE, n, w, boundary, &has_boundary);
        for (int i = 0; i < n; i++) peak[i] = (double)(rng_next() % (1u << 24));
        prefix[0] = 0;
        for (int i = 0; i < n; i++) prefix[i + 1] = prefix[i] + w[i];
        for (int j = 0; j <= n; j++) best[0][j] = j == 0 ? 0 : INFINITY;
        for (int s = 1; s <= k; s++)
            for (int j = 0; j <= n; j++) {
                best[s][j] = INFINITY;
                double most = 0;
                for (int i = j - 1; i >= 0; i--) {
                    if (peak[i] > most) most = peak[i];
                    double c = ((prefix[j] - prefix[i]) + boundary[i]) + most;
                    double b = best[s - 1][i] > c ? best[s - 1][i] : c;
                    if (b < best[s][j]) best[s][j] = b;
                }
            }
        struct gp_partition_problem p = {.n = n, .weight = w, .boundary = boundary, .k = k, .peak = peak};
        struct gp_partition opt;
        struct gp_error err = {0};
        assert_int_equal(gp_partition_optimal(&p, &opt, &err), GP_OK);
        assert_valid(&opt, n, k);
        if (opt.bottleneck != best[k][n])
            fail_msg("instance %d (n=%d k=%d): optimum %.17g, DP %.17g", it, n, k, opt.bottleneck, best[k][n]);
    }
}

/* ---- edge cases ---- */

static void expect_cuts(const struct gp_partition_problem *p, const int *want, double want_bottleneck)
{
    struct gp_partition opt;
    struct gp_error err = {0};
    assert_int_equal(gp_partition_optimal(p, &opt, &err), GP_OK);
    for (int s = 0; s <= p->k; s++) assert_int_equal(opt.first[s], want[s]);
    assert_true(opt.bottleneck == want_bottleneck);
}

static void test_edge_cases(void **state)
{
    (void)state;
    double w[7] = {3, 1, 4, 1, 5, 9, 2}, b[7] = {0.5, 1, 2, 3, 4, 5, 6};
    /* k = 1: everything in one stage, which pays boundary[0] */
    struct gp_partition_problem p = {.n = 7, .weight = w, .boundary = b, .k = 1};
    expect_cuts(&p, (int[]){0, 7}, 25.5);
    /* k = n: one layer each */
    p.k = 7;
    expect_cuts(&p, (int[]){0, 1, 2, 3, 4, 5, 6, 7}, 14);

    /* all-zero weights, no boundary costs: every split ties at 0, the first cuts win */
    double zero[6] = {0};
    struct gp_partition_problem z = {.n = 6, .weight = zero, .boundary = NULL, .k = 3};
    expect_cuts(&z, (int[]){0, 1, 2, 6}, 0);
    /* all-zero weights with boundaries: the cheapest cuts */
    double zb[6] = {0, 5, 1, 4, 1, 9};
    z.boundary = zb;
    expect_cuts(&z, (int[]){0, 2, 4, 6}, 1);

    /* one huge layer: it is the bottleneck, alone in its stage */
    double huge[7] = {1, 1, 1, 1000, 1, 1, 1};
    struct gp_partition_problem hp = {.n = 7, .weight = huge, .boundary = NULL, .k = 3};
    expect_cuts(&hp, (int[]){0, 3, 4, 7}, 1000);
    hp.k = 2;
    expect_cuts(&hp, (int[]){0, 3, 7}, 1003);

    /* greedy packing fails here: [0, 2) fits under 2 but leaves a stage of 6 */
    double gw[3] = {1, 1, 1}, gb[3] = {0, 0, 5};
    struct gp_partition_problem g = {.n = 3, .weight = gw, .boundary = gb, .k = 2};
    expect_cuts(&g, (int[]){0, 1, 3}, 2);

    /* three optimal splits (bottleneck 3); the least boundary cost wins over the first cut */
    double tw[4] = {3, 0, 0, 1}, tb[4] = {0, 0.5, 0.25, 0};
    struct gp_partition_problem t = {.n = 4, .weight = tw, .boundary = tb, .k = 2};
    expect_cuts(&t, (int[]){0, 3, 4}, 3);
    /* the same without boundary costs: the first cut */
    t.boundary = NULL;
    expect_cuts(&t, (int[]){0, 1, 4}, 3);

    /* one layer */
    double one[1] = {7};
    struct gp_partition_problem o = {.n = 1, .weight = one, .boundary = NULL, .k = 1};
    expect_cuts(&o, (int[]){0, 1}, 7);
}

/* ---- the even split ---- */

static void test_even(void **state)
{
    (void)state;
    double w[10] = {0};
    struct gp_partition_problem p = {.n = 10, .weight = w, .boundary = NULL, .k = 4};
    struct gp_partition part;
    struct gp_error err = {0};
    int counts[GP_MAX_STAGES];
    assert_int_equal(gp_partition_even(&p, &part, &err), GP_OK);
    gp_partition_counts(&part, counts);
    assert_int_equal(counts[0], 3);
    assert_int_equal(counts[1], 3);
    assert_int_equal(counts[2], 2);
    assert_int_equal(counts[3], 2);
    p.k = 10;
    assert_int_equal(gp_partition_even(&p, &part, &err), GP_OK);
    for (int s = 0; s <= 10; s++) assert_int_equal(part.first[s], s);
    p.k = 3;
    p.n = 9;
    assert_int_equal(gp_partition_even(&p, &part, &err), GP_OK);
    gp_partition_counts(&part, counts);
    for (int s = 0; s < 3; s++) assert_int_equal(counts[s], 3);
}

/* ---- torchgpipe's heuristic ---- */

struct heuristic_case {
    int n, k;
    double w[60];
    int first[8];
};

/* Outputs of torchgpipe/balance/blockpartition.py solve() (its own unit tests
 * first, then random inputs), as cuts; the last eight are inputs where solve()
 * returns an empty block or blocks that overlap, with the repair of
 * partition.h applied to its splits (noted beside them), and the last one
 * where it never returns. */
static const struct heuristic_case heuristic_cases[] = {
    {6, 2, {1, 2, 3, 4, 5, 6}, {0, 4, 6}},
    {2, 2, {0, 0}, {0, 1, 2}},
    {8, 3, {0, 0, 5, 8, 138, 1, 614, 9}, {0, 4, 5, 8}},
    {4, 2, {9, 9, 0, 0}, {0, 1, 4}},
    {11, 3, {2, 9, 10, 645, 3, 8, 9, 0, 746, 5, 7}, {0, 3, 6, 11}},
    {8, 4, {234, 3, 0, 7, 7, 1, 0, 5}, {0, 2, 4, 6, 8}},
    /* equal largest blocks: Python's max over (size, index) takes the last */
    {6, 3, {3, 9, 2, 0, 6, 6}, {0, 2, 5, 6}},
    {7, 3, {11, 9, 4, 4, 9, 11, 0}, {0, 2, 5, 7}},
    /* sizes 0 and 1 after normalizing: max <= min + 1 already holds */
    {3, 2, {0, 0, 2}, {0, 1, 3}},
    {50, 7, {43.75, 6.75, 95.875, 3.5, 0.125, 80.25, 52.375, 46.5, 85.25, 11.75, 51.0, 48.0, 56.875,
             69.125, 48.25, 58.0, 56.5, 28.375, 66.25, 2.25, 73.25, 21.5, 70.625, 25.875, 36.25, 62.75,
             62.375, 79.25, 17.375, 47.625, 23.375, 61.625, 17.625, 0.625, 76.625, 37.0, 93.875, 2.375,
             22.0, 53.625, 29.875, 72.625, 63.5, 89.125, 78.375, 13.625, 76.5, 100.0, 0.625, 26.0},
     {0, 7, 14, 21, 28, 37, 44, 50}},
    {57, 5, {0.625, 53.625, 60.75, 46.25, 28.125, 35.125, 96.625, 38.5, 65.25, 57.5, 88.75, 33.375, 94.25,
             37.125, 9.875, 84.625, 84.75, 96.75, 41.375, 2.875, 87.75, 32.25, 41.875, 33.375, 24.75, 19.375,
             75.5, 7.375, 96.75, 5.75, 36.625, 73.0, 56.625, 13.625, 93.75, 98.5, 3.5, 5.5, 10.875, 96.5,
             6.875, 80.0, 26.125, 5.0, 89.0, 25.875, 13.375, 72.75, 77.5, 27.25, 18.625, 72.5, 54.75, 51.75,
             24.75, 13.875, 76.0},
     {0, 11, 21, 33, 45, 57}},
    {48, 3, {47.25, 8.625, 90.5, 37.75, 24.5, 84.625, 49.625, 6.125, 62.0, 41.625, 0.0, 68.5, 16.25, 81.25,
             61.875, 68.875, 31.125, 85.25, 70.875, 53.625, 32.0, 53.75, 10.0, 14.0, 59.75, 71.625, 21.875,
             51.125, 72.75, 77.5, 83.625, 23.125, 62.25, 48.625, 67.625, 8.75, 48.5, 80.5, 25.375, 37.5,
             15.375, 26.25, 35.5, 1.75, 62.875, 45.0, 80.75, 81.625},
     {0, 16, 32, 48}},
    {6, 5, {7, 4, 0, 0, 7, 7}, {0, 1, 2, 4, 5, 6}},          /* splits 1 2 5 5 6 */
    {6, 4, {2, 8, 2, 131, 9, 4}, {0, 2, 4, 5, 6}},           /* splits 2 4 4 6 */
    {5, 4, {5, 2, 2, 5, 3}, {0, 1, 3, 4, 5}},                /* splits 1 4 4 5 */
    {7, 5, {0, 1, 4, 0, 2, 6, 0}, {0, 2, 3, 5, 6, 7}},       /* splits 2 3 5 5 7 */
    {7, 5, {10, 0, 0, 0, 10, 0, 1}, {0, 1, 4, 5, 6, 7}},     /* splits 1 5 7 5 7 */
    {7, 4, {0, 0, 0, 591, 2, 2, 7}, {0, 4, 5, 6, 7}},        /* splits 4 5 4 7 */
    {7, 5, {0, 0, 0, 0, 8, 4, 2}, {0, 3, 4, 5, 6, 7}},       /* splits 5 6 7 5 7 */
    {7, 5, {2, 0, 0, 0, 8, 5, 0}, {0, 1, 4, 5, 6, 7}},       /* splits 1 5 6 5 7 */
    /* solve() never returns: splits 5 6 7 4 7, then splits[2] grows for ever */
    {7, 5, {0, 0, 0, 0, 2, 1, 0}, {0, 3, 4, 5, 6, 7}},
};

static void test_heuristic_matches_torchgpipe(void **state)
{
    (void)state;
    for (size_t c = 0; c < sizeof heuristic_cases / sizeof heuristic_cases[0]; c++) {
        const struct heuristic_case *hc = &heuristic_cases[c];
        struct gp_partition_problem p = {.n = hc->n, .weight = hc->w, .boundary = NULL, .k = hc->k};
        struct gp_partition part;
        struct gp_error err = {0};
        assert_int_equal(gp_partition_heuristic(&p, &part, &err), GP_OK);
        for (int s = 0; s <= hc->k; s++) {
            if (part.first[s] != hc->first[s]) fprintf(stderr, "heuristic case %zu, cut %d\n", c, s);
            assert_int_equal(part.first[s], hc->first[s]);
        }
    }
}

/* ---- large instances ---- */

static double seconds_now(void)
{
    struct timespec ts;
    timespec_get(&ts, TIME_UTC); /* C11; only printed, never asserted on */
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void run_large(int n, int k, uint64_t seed)
{
    rng_state = seed;
    double *w = malloc(sizeof(double) * (size_t)n), *b = malloc(sizeof(double) * (size_t)n);
    int has_boundary;
    make_instance(TIME_LIKE, n, w, b, &has_boundary);
    struct gp_partition_problem p = {.n = n, .weight = w, .boundary = b, .k = k};
    struct gp_partition opt, again, even, heur;
    struct gp_error err = {0};
    double t0 = seconds_now();
    assert_int_equal(gp_partition_optimal(&p, &opt, &err), GP_OK);
    double t1 = seconds_now();
    assert_int_equal(gp_partition_heuristic(&p, &heur, &err), GP_OK);
    double t2 = seconds_now();
    assert_int_equal(gp_partition_even(&p, &even, &err), GP_OK);
    assert_int_equal(gp_partition_optimal(&p, &again, &err), GP_OK);
    printf("%d layers, %d stages: optimal %.6g in %.3f s, heuristic %.6g in %.3f s, even %.6g\n", n, k,
           opt.bottleneck, t1 - t0, heur.bottleneck, t2 - t1, even.bottleneck);
    assert_valid(&opt, n, k);
    assert_costs(&opt, n, w, b);
    assert_true(memcmp(&opt, &again, sizeof opt) == 0);
    assert_true(opt.bottleneck <= even.bottleneck);
    assert_true(opt.bottleneck <= heur.bottleneck);
    /* no stage beats the heaviest layer, no split beats the average */
    double total = 0, heaviest = 0;
    for (int i = 0; i < n; i++) {
        total += w[i];
        if (w[i] > heaviest) heaviest = w[i];
    }
    assert_true(opt.bottleneck >= heaviest);
    assert_true(opt.bottleneck >= total / k * (1 - 1e-12));
    free(w);
    free(b);
}

static void test_large(void **state)
{
    (void)state;
    run_large(10000, 8, 0x123456789ABCDEFULL);
    run_large(10000, 64, 0xFEDCBA987654321ULL);
    run_large(2000, GP_MAX_STAGES, 0x0F0F0F0F0F0F0F0FULL);
}

/* ---- bad input ---- */

static void expect_error(const struct gp_partition_problem *p, gp_status want, const char *in_msg)
{
    gp_status (*fns[3])(const struct gp_partition_problem *, struct gp_partition *, struct gp_error *) = {
        gp_partition_optimal, gp_partition_even, gp_partition_heuristic};
    for (int f = 0; f < 3; f++) {
        struct gp_partition part;
        struct gp_error err = {0};
        assert_int_equal(fns[f](p, &part, &err), want);
        assert_int_equal(err.status, want);
        if (!strstr(err.msg, in_msg)) fail_msg("message '%s' lacks '%s'", err.msg, in_msg);
    }
}

static void test_invalid(void **state)
{
    (void)state;
    double w[4] = {1, 2, 3, 4}, b[4] = {0, 1, 1, 1};
    struct gp_partition_problem p = {.n = 4, .weight = w, .boundary = b, .k = 2};
    expect_error(NULL, GP_ERR_INVALID, "no problem");
    p.k = 5;
    expect_error(&p, GP_ERR_INVALID, "4 layers into 5");
    p.k = 0;
    expect_error(&p, GP_ERR_INVALID, "0 stages");
    p.k = 2;
    p.n = 0;
    expect_error(&p, GP_ERR_INVALID, "no layers");
    p.n = 4;
    p.weight = NULL;
    expect_error(&p, GP_ERR_INVALID, "no layer weights");
    p.weight = w;
    double pk[4] = {0, 0, 0, -1};
    p.peak = pk;
    expect_error(&p, GP_ERR_INVALID, "layer 3 has peak -1");
    p.peak = NULL;
    w[2] = NAN;
    expect_error(&p, GP_ERR_INVALID, "layer 2");
    w[2] = -1;
    expect_error(&p, GP_ERR_INVALID, "layer 2");
    w[2] = INFINITY;
    expect_error(&p, GP_ERR_INVALID, "layer 2");
    w[2] = 3;
    b[3] = -0.5;
    expect_error(&p, GP_ERR_INVALID, "cut 3");
    b[3] = NAN;
    expect_error(&p, GP_ERR_INVALID, "cut 3");
    b[3] = 1;
    w[0] = w[1] = 1e308;
    expect_error(&p, GP_ERR_INVALID, "sum to");
    w[0] = 1;
    w[1] = 2;
    /* Stage costs: each checked, naming the stage and the layer. */
    double sw[8] = {1, 2, 3, 4, 1, 2, 3, 4}, sb[8] = {0};
    p.stage_weight = sw;
    p.stage_boundary = sb;
    sw[6] = NAN;
    expect_error(&p, GP_ERR_INVALID, "stage 1's weight at layer 2");
    sw[6] = 3;
    sb[5] = -1;
    expect_error(&p, GP_ERR_INVALID, "stage 1's boundary cost at layer 1");
    sb[5] = 0;
    p.stage_weight = p.stage_boundary = NULL;

    static double many[300];
    struct gp_partition_problem big = {.n = 300, .weight = many, .boundary = NULL, .k = GP_MAX_STAGES + 1};
    expect_error(&big, GP_ERR_UNSUPPORTED, "at most");

    /* cuts that do not make k non-empty stages */
    struct gp_partition part = {.k = 2, .first = {0, 0, 4}};
    struct gp_error err = {0};
    assert_int_equal(gp_partition_eval(&p, &part, &err), GP_ERR_INVALID);
    assert_non_null(strstr(err.msg, "stage 0"));
    struct gp_partition bad_end = {.k = 2, .first = {0, 2, 3}};
    gp_error_clear(&err);
    assert_int_equal(gp_partition_eval(&p, &bad_end, &err), GP_ERR_INVALID);
    struct gp_partition bad_k = {.k = 3, .first = {0, 1, 2, 4}};
    gp_error_clear(&err);
    assert_int_equal(gp_partition_eval(&p, &bad_k, &err), GP_ERR_INVALID);
    struct gp_partition good = {.k = 2, .first = {0, 3, 4}};
    gp_error_clear(&err);
    assert_int_equal(gp_partition_eval(&p, &good, &err), GP_OK);
    assert_true(good.cost[0] == 6 && good.cost[1] == 5 && good.bottleneck == 6);

    /* --balance lists */
    struct gp_partition fc;
    gp_error_clear(&err);
    assert_int_equal(gp_partition_from_counts(&p, (int[]){1, 3}, &fc, &err), GP_OK);
    assert_true(fc.first[1] == 1 && fc.cost[0] == 1 && fc.cost[1] == 10 && fc.bottleneck == 10);
    gp_error_clear(&err);
    assert_int_equal(gp_partition_from_counts(&p, (int[]){1, 2}, &fc, &err), GP_ERR_INVALID);
    gp_error_clear(&err);
    assert_int_equal(gp_partition_from_counts(&p, (int[]){0, 4}, &fc, &err), GP_ERR_INVALID);
    gp_error_clear(&err);
    assert_int_equal(gp_partition_from_counts(&p, (int[]){3, 3}, &fc, &err), GP_ERR_INVALID);
}

/* ---- stage-dependent costs against brute force ----
 * Stage s costs (P_s[j] - P_s[i]) + b_s[i] (1F1B's memory: activations
 * count once per micro-batch the stage holds, fewer on later stages); the
 * tie order's keys are the boundary terms of the stages at their cuts. */

static double stage_ref_cost(int n, const double *sw, const double *sb, const double *peak, int s, int i, int j)
{
    double prefix_i = 0, prefix_j = 0, most = 0;
    for (int x = 0; x < j; x++) {
        if (x == i) prefix_i = prefix_j;
        prefix_j += sw[s * n + x];
        if (peak && x >= i && peak[x] > most) most = peak[x];
    }
    if (i == j) prefix_i = prefix_j;
    return ((prefix_j - prefix_i) + sb[s * n + i]) + most;
}

static void brute_force_by_stage(int n, const double *sw, const double *sb, const double *peak, int k, int *best,
                                 double *bottleneck)
{
    int f[GP_MAX_STAGES + 1];
    for (int s = 0; s < k; s++) f[s] = s;
    f[k] = n;
    *bottleneck = INFINITY;
    double best_key[GP_MAX_STAGES + 1];
    for (;;) {
        double b = 0, key[GP_MAX_STAGES + 1];
        for (int s = 0; s < k; s++) {
            double c = stage_ref_cost(n, sw, sb, peak, s, f[s], f[s + 1]);
            if (c > b) b = c;
        }
        key[k] = 0;
        for (int s = k - 1; s >= 1; s--) key[s] = sb[s * n + f[s]] + key[s + 1];
        int order = b < *bottleneck ? -1 : b > *bottleneck ? 1 : 0;
        for (int s = 1; s < k && order == 0; s++) {
            if (key[s] != best_key[s]) order = key[s] < best_key[s] ? -1 : 1;
            else if (f[s] != best[s]) order = f[s] < best[s] ? -1 : 1;
        }
        if (order < 0) {
            *bottleneck = b;
            memcpy(best, f, sizeof(int) * (size_t)(k + 1));
            memcpy(best_key, key, sizeof(double) * (size_t)(k + 1));
        }
        int s = k - 1;
        while (s >= 1 && f[s] == n - (k - s)) s--;
        if (s < 1) break;
        f[s]++;
        for (int t = s + 1; t < k; t++) f[t] = f[t - 1] + 1;
    }
}

static void test_brute_force_by_stage(void **state)
{
    (void)state;
    rng_state = 0x51A6E5;
    double w[10], sw[5 * 10], sb[5 * 10], pk[10];
    int instances = 0, stage_matters = 0, peak_matters = 0;
    for (int it = 0; it < 4000; it++) {
        int n = rng_int(1, 10), k = rng_int(1, n < 5 ? n : 5);
        bool ties = it % 3 == 2;
        /* Every other instance with peaks (memory's one block: the largest
         * layer's working set), as large as the rest or larger. */
        const double *peak = it % 2 ? pk : NULL;
        for (int i = 0; i < n; i++) pk[i] = ties ? rng_int(0, 3) : (double)(rng_next() % (1u << 22));
        for (int i = 0; i < n; i++) {
            /* 1F1B-like: a fixed part and activations times the micro-batches
             * stage s holds (k - s), boundaries the frontier times its boxes. */
            double fixed = ties ? rng_int(0, 2) : (double)(rng_next() % (1u << 20));
            double act = ties ? rng_int(0, 1) : (double)(rng_next() % (1u << 16));
            double frontier = ties ? rng_int(0, 1) : (double)(rng_next() % (1u << 12));
            for (int s = 0; s < k; s++) {
                sw[s * n + i] = fixed + act * (k - s);
                sb[s * n + i] = i == 0 || s == 0 ? 0 : frontier * (k - s + 1);
            }
            w[i] = sw[i];
        }
        struct gp_partition_problem p = {.n = n, .weight = w, .k = k, .stage_weight = sw, .stage_boundary = sb,
                                         .peak = peak};
        struct gp_partition opt, even, heur;
        struct gp_error err = {0};
        assert_int_equal(gp_partition_optimal(&p, &opt, &err), GP_OK);
        assert_int_equal(gp_partition_even(&p, &even, &err), GP_OK);
        assert_int_equal(gp_partition_heuristic(&p, &heur, &err), GP_OK);
        int best[GP_MAX_STAGES + 1];
        double bottleneck;
        brute_force_by_stage(n, sw, sb, peak, k, best, &bottleneck);
        if (opt.bottleneck != bottleneck || memcmp(opt.first, best, sizeof(int) * (size_t)(k + 1)))
            fail_msg("instance %d (n=%d k=%d): optimum %.17g, brute force %.17g", it, n, k, opt.bottleneck, bottleneck);
        for (int s = 0; s < k; s++)
            assert_true(opt.cost[s] == stage_ref_cost(n, sw, sb, peak, s, opt.first[s], opt.first[s + 1]));
        assert_true(opt.bottleneck <= even.bottleneck && opt.bottleneck <= heur.bottleneck);
        /* The same problem without the stages (stage 0's costs everywhere)
         * often cuts elsewhere: the stages are not ignored. */
        struct gp_partition_problem flat = {.n = n, .weight = w, .k = k};
        struct gp_partition plain;
        assert_int_equal(gp_partition_optimal(&flat, &plain, &err), GP_OK);
        stage_matters += memcmp(plain.first, opt.first, sizeof(int) * (size_t)(k + 1)) != 0;
        if (peak) {
            /* Nor are the peaks. */
            struct gp_partition_problem no_peak = p;
            no_peak.peak = NULL;
            struct gp_partition without;
            assert_int_equal(gp_partition_optimal(&no_peak, &without, &err), GP_OK);
            peak_matters += memcmp(without.first, opt.first, sizeof(int) * (size_t)(k + 1)) != 0;
        }
        instances++;
    }
    printf("stage costs: %d instances match brute force; %d cut otherwise than without stages, %d than without "
           "peaks\n",
           instances, stage_matters, peak_matters);
    assert_true(stage_matters > 0);
    assert_true(peak_matters > 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_brute_force_time_like),
        cmocka_unit_test(test_brute_force_memory_like),
        cmocka_unit_test(test_brute_force_ties),
        cmocka_unit_test(test_medium_against_dp),
        cmocka_unit_test(test_medium_peaks_against_dp),
        cmocka_unit_test(test_edge_cases),
        cmocka_unit_test(test_even),
        cmocka_unit_test(test_heuristic_matches_torchgpipe),
        cmocka_unit_test(test_large),
        cmocka_unit_test(test_invalid),
        cmocka_unit_test(test_brute_force_by_stage),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
