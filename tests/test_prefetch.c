/* train/prefetch.c: the batches gathered two steps ahead on a worker
 * thread are those the trainer would gather itself, in its visiting order
 * (each epoch's shuffle, the rows after the last whole batch dropped),
 * from any first step (a resumed run starts mid-epoch), whether or not the
 * step asked for is the one prefetched, and with labels or without; the
 * next step's inputs, handed out with the step's, are that step's and stay
 * as they were until the call after (their upload runs meanwhile). */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "data/dataset.h"
#include "train/prefetch.h"

enum { N = 11, F = 3, BATCH = 3, PER_EPOCH = N / BATCH };

/* x [N, F] float32 with x[i][j] = 10 i + j, y [N] int64 with y[i] = i. */
static void dataset(struct gp_dataset *d, bool labels)
{
    memset(d, 0, sizeof *d);
    float *x = malloc(sizeof(float) * N * F);
    int64_t *y = malloc(sizeof(int64_t) * N);
    assert_non_null(x);
    assert_non_null(y);
    for (int i = 0; i < N; i++) {
        y[i] = i;
        for (int j = 0; j < F; j++) x[i * F + j] = (float)(10 * i + j);
    }
    d->n = N;
    d->x = (struct gp_tensor){.dtype = GP_DTYPE_FLOAT32, .shape = {.rank = 2, .dims = {N, F}}, .data = x,
                              .nbytes = sizeof(float) * N * F};
    d->owned_x = x;
    if (labels) {
        d->y = (struct gp_tensor){.dtype = GP_DTYPE_INT64, .shape = {.rank = 1, .dims = {N}}, .data = y,
                                  .nbytes = sizeof(int64_t) * N};
        d->owned_y = y;
    } else {
        d->y.dtype = GP_DTYPE_UNDEFINED;
        free(y);
    }
}

/* Step s's batch as the trainer computes it without prefetching. */
static void expected(const struct gp_dataset *d, int64_t step, float *x, int64_t *y)
{
    int64_t order[N];
    gp_dataset_order(N, true, 7, step / PER_EPOCH, order);
    gp_dataset_gather(&d->x, order, N, step % PER_EPOCH * BATCH, BATCH, x);
    if (y) gp_dataset_gather(&d->y, order, N, step % PER_EPOCH * BATCH, BATCH, y);
}

static void check_steps(bool labels, int64_t first, int64_t last, int64_t skip)
{
    struct gp_dataset d;
    dataset(&d, labels);
    struct gp_prefetch *f = NULL;
    struct gp_error err = {0};
    assert_int_equal(gp_prefetch_create(NULL, &d, BATCH, PER_EPOCH, true, 7, &f, &err), GP_OK);
    const void *prev_next = NULL; /* the last call's next inputs */
    float prev_want[BATCH * F];
    for (int64_t s = first; s <= last; s++) {
        if (s == skip) continue; /* the batch prefetched is not the one asked for next */
        const void *x = NULL, *y = NULL, *xn = NULL;
        int64_t next = s + 1 == skip ? s + 2 : s + 1, after = next + 1 == skip ? next + 2 : next + 1;
        gp_prefetch_get(f, s, next <= last ? next : -1, after <= last ? after : -1, &x, &y, &xn);
        if (prev_next && memcmp(prev_next, prev_want, sizeof prev_want))
            fail_msg("step %lld: the inputs handed out as the next step's changed before this call returned",
                     (long long)s);
        float want_x[BATCH * F];
        int64_t want_y[BATCH];
        expected(&d, s, want_x, labels ? want_y : NULL);
        if (memcmp(x, want_x, sizeof want_x))
            fail_msg("step %lld: inputs differ from the trainer's gather", (long long)s);
        if (labels ? memcmp(y, want_y, sizeof want_y) != 0 : y != NULL)
            fail_msg("step %lld: labels differ", (long long)s);
        prev_next = xn;
        if (next > last) {
            assert_null(xn);
            continue;
        }
        expected(&d, next, prev_want, NULL);
        if (!xn || memcmp(xn, prev_want, sizeof prev_want))
            fail_msg("step %lld: the next step's inputs differ from its gather", (long long)s);
    }
    gp_prefetch_free(f);
    gp_dataset_free(&d);
}

static void test_in_order(void **state)
{
    (void)state;
    check_steps(true, 0, 4 * PER_EPOCH, -1);  /* four epochs, each reshuffled */
    check_steps(false, 0, 2 * PER_EPOCH, -1); /* no labels */
}

static void test_resumed_and_skipped(void **state)
{
    (void)state;
    check_steps(true, PER_EPOCH + 1, 3 * PER_EPOCH, -1); /* starts mid-epoch */
    check_steps(true, 0, 3 * PER_EPOCH, PER_EPOCH);      /* a step not asked for */
}

/* The shuffle changes between epochs (else the order checks above would
 * not tell epochs apart). */
static void test_epochs_differ(void **state)
{
    (void)state;
    int64_t a[N], b[N];
    gp_dataset_order(N, true, 7, 0, a);
    gp_dataset_order(N, true, 7, 1, b);
    assert_true(memcmp(a, b, sizeof a) != 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_in_order),
        cmocka_unit_test(test_resumed_and_skipped),
        cmocka_unit_test(test_epochs_differ),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
