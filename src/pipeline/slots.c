#include "pipeline/slots.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

/* An occupation of one slot: issue positions [start, end]. */
struct interval {
    int start, end;
    int mb;
    bool forward;            /* it begins with the micro-batch's forward */
    int *slot, *after;       /* where the slot and the wait go */
    int *next_start;         /* where the next occupation's start goes (NULL: nowhere) */
};

static int by_start(const void *a, const void *b)
{
    const struct interval *x = a, *y = b;
    return (x->start > y->start) - (x->start < y->start);
}

/* Scratch for allocate: per slot its last occupation, and two binary
 * min-heaps of slot numbers, the free ones (by number) and the busy ones
 * (by the end of their occupation), so that n occupations take
 * O(n log n) whatever the number of slots. */
struct slot_state {
    int end, mb;
    bool forward;
    int *next_start;
};

struct heaps {
    struct slot_state *slot;
    int *free_, n_free;
    int *busy, n_busy;
};

static int key_of(const struct heaps *h, const int *heap, int q)
{
    return heap == h->busy ? h->slot[heap[q]].end : heap[q];
}

static void heap_push(struct heaps *h, int *heap, int *n, int v)
{
    int q = (*n)++;
    heap[q] = v;
    while (q > 0 && key_of(h, heap, (q - 1) / 2) > key_of(h, heap, q)) {
        int up = (q - 1) / 2, t = heap[up];
        heap[up] = heap[q];
        heap[q] = t;
        q = up;
    }
}

static int heap_pop(struct heaps *h, int *heap, int *n)
{
    int top = heap[0];
    heap[0] = heap[--*n];
    for (int q = 0;;) {
        int l = 2 * q + 1, r = l + 1, least = q;
        if (l < *n && key_of(h, heap, l) < key_of(h, heap, least)) least = l;
        if (r < *n && key_of(h, heap, r) < key_of(h, heap, least)) least = r;
        if (least == q) break;
        int t = heap[least];
        heap[least] = heap[q];
        heap[q] = t;
        q = least;
    }
    return top;
}

/* Lowest free slot first, in order of start; `after` gets the previous
 * occupant's micro-batch (for sets only when that one began with its
 * forward), the previous occupant's next_start this one's start. Returns
 * the number of slots. */
static int allocate(struct interval *iv, int n, bool sets, struct heaps *h)
{
    qsort(iv, (size_t)n, sizeof *iv, by_start);
    int slots = 0;
    h->n_free = h->n_busy = 0;
    for (int q = 0; q < n; q++) {
        /* Slots whose occupation ended before this one starts are free. */
        while (h->n_busy > 0 && h->slot[h->busy[0]].end < iv[q].start)
            heap_push(h, h->free_, &h->n_free, heap_pop(h, h->busy, &h->n_busy));
        int s;
        if (h->n_free > 0) {
            s = heap_pop(h, h->free_, &h->n_free);
        } else {
            s = slots++;
            h->slot[s] = (struct slot_state){.mb = -1};
        }
        struct slot_state *st = &h->slot[s];
        *iv[q].slot = s;
        *iv[q].after = sets && !st->forward ? -1 : st->mb;
        if (st->next_start) *st->next_start = iv[q].start;
        if (iv[q].next_start) *iv[q].next_start = INT_MAX;
        *st = (struct slot_state){.end = iv[q].end, .mb = iv[q].mb, .forward = iv[q].forward,
                                  .next_start = iv[q].next_start};
        heap_push(h, h->busy, &h->n_busy, s);
    }
    return slots;
}

void gp_stage_slots_free(struct gp_stage_slots *s)
{
    free(s->box);
    free(s->inbox);
    free(s->fwd_set);
    free(s->bwd_set);
    free(s->checkpointed);
    free(s->copy_after);
    free(s->box_after);
    free(s->inbox_after);
    free(s->fwd_set_after);
    free(s->bwd_set_after);
    memset(s, 0, sizeof *s);
}

/* Issue positions of every stage's forwards, recomputations and backwards
 * ([K * M] each, -1: none), checked as slots.h says. */
static gp_status positions(const struct gp_pipe_schedule *s, int *pf, int *pr, int *pb, struct gp_error *err)
{
    int K = s->n_stages, M = s->n_micro;
    size_t km = (size_t)K * (size_t)M;
    for (size_t q = 0; q < km; q++) pf[q] = pr[q] = pb[q] = -1;
    for (int a = 0; a < s->n_actions; a++) {
        const struct gp_action *act = &s->actions[a];
        if (act->stage < 0 || act->stage >= K || act->microbatch < 0 || act->microbatch >= M)
            return gp_error_set(err, GP_ERR_INVALID, "schedule action %d names stage %d, micro-batch %d", a,
                                act->stage, act->microbatch);
        int *at = act->kind == GP_ACT_FORWARD ? pf : act->kind == GP_ACT_RECOMPUTE ? pr : pb;
        size_t q = (size_t)act->stage * M + act->microbatch;
        if (at[q] >= 0)
            return gp_error_set(err, GP_ERR_INVALID, "schedule: stage %d runs micro-batch %d's %s twice", act->stage,
                                act->microbatch,
                                act->kind == GP_ACT_FORWARD     ? "forward"
                                : act->kind == GP_ACT_RECOMPUTE ? "recomputation"
                                                                : "backward");
        at[q] = a;
    }
    for (int k = 0; k < K; k++)
        for (int j = 0; j < M; j++) {
            size_t q = (size_t)k * M + j;
            const char *wrong = NULL;
            if (pf[q] < 0 || pb[q] < 0) wrong = "lacks its forward or its backward";
            else if (pb[q] < pf[q]) wrong = "runs its backward before its forward";
            else if (pr[q] >= 0 && (pr[q] < pf[q] || pr[q] > pb[q])) wrong = "recomputes outside forward and backward";
            else if (k > 0 && pf[q - M] > pf[q]) wrong = "runs its forward before the previous stage's";
            else if (k + 1 < K && pb[q + M] > pb[q]) wrong = "runs its backward before the next stage's";
            if (wrong)
                return gp_error_set(err, GP_ERR_INVALID, "schedule: stage %d %s for micro-batch %d", k, wrong, j);
        }
    return GP_OK;
}

static gp_status alloc_stage(struct gp_stage_slots *o, int M, struct gp_error *err)
{
    size_t m = (size_t)M;
    o->n_micro = M;
    int **lists[9] = {&o->box,       &o->inbox,       &o->fwd_set,       &o->bwd_set,      &o->copy_after,
                      &o->box_after, &o->inbox_after, &o->fwd_set_after, &o->bwd_set_after};
    bool ok = true;
    for (int l = 0; l < 9; l++) ok &= (*lists[l] = malloc(sizeof(int) * m)) != NULL;
    ok &= (o->checkpointed = calloc(m, sizeof(bool))) != NULL;
    return ok ? GP_OK : gp_error_set(err, GP_ERR_NOMEM, "out of memory planning the stages");
}

/* Stage k's slots from the positions; fwd_next[j] gets the start of the
 * occupation that follows j's forward in its set (INT_MAX: none). */
static void plan_stage(int K, int M, int k, const int *pf, const int *pr, const int *pb, struct interval *iv,
                       struct heaps *scratch, int *fwd_next, struct gp_stage_slots *o)
{
    size_t m = (size_t)M;
    const int *f = pf + (size_t)k * m, *r = pr + (size_t)k * m, *b = pb + (size_t)k * m;
    /* Boxes: micro-batches in flight. */
    for (int j = 0; j < M; j++)
        iv[j] = (struct interval){.start = f[j], .end = b[j], .mb = j, .slot = &o->box[j], .after = &o->box_after[j]};
    o->n_boxes = allocate(iv, M, false, scratch);
    /* The copy into a box: after the forward that made it and the backward
     * that freed the box, in micro-batch order on its copy stream. */
    for (int j = 0; j < M; j++) {
        if (k == 0) {
            o->copy_after[j] = -1;
            continue;
        }
        int at = pf[(size_t)(k - 1) * m + j];
        if (o->box_after[j] >= 0 && b[o->box_after[j]] > at) at = b[o->box_after[j]];
        if (j > 0 && o->copy_after[j - 1] > at) at = o->copy_after[j - 1];
        o->copy_after[j] = at;
    }
    /* Inboxes: filled by the next stage's backward, or by the loss in this
     * stage's forward on the last stage. */
    for (int j = 0; j < M; j++)
        iv[j] = (struct interval){.start = k + 1 < K ? pb[(size_t)(k + 1) * m + j] : f[j], .end = b[j], .mb = j,
                                  .slot = &o->inbox[j], .after = &o->inbox_after[j]};
    o->n_inboxes = allocate(iv, M, false, scratch);
    int n = 0;
    for (int j = 0; j < M; j++) {
        o->checkpointed[j] = r[j] >= 0;
        o->n_checkpointed += r[j] >= 0;
        iv[n++] = (struct interval){.start = f[j], .end = r[j] >= 0 ? f[j] : b[j], .mb = j, .forward = true,
                                    .slot = &o->fwd_set[j], .after = &o->fwd_set_after[j], .next_start = &fwd_next[j]};
        if (r[j] >= 0)
            iv[n++] = (struct interval){.start = r[j], .end = b[j], .mb = j, .slot = &o->bwd_set[j],
                                        .after = &o->bwd_set_after[j]};
    }
    o->n_sets = allocate(iv, n, true, scratch);
    for (int j = 0; j < M; j++)
        if (r[j] < 0) {
            o->bwd_set[j] = o->fwd_set[j];
            o->bwd_set_after[j] = -1;
        }
}

gp_status gp_pipe_slots_plan(const struct gp_pipe_schedule *s, struct gp_stage_slots *out, struct gp_error *err)
{
    int K = s->n_stages, M = s->n_micro;
    for (int k = 0; k < K; k++) memset(&out[k], 0, sizeof out[k]);
    if (K < 1 || M < 1) return gp_error_set(err, GP_ERR_INVALID, "a schedule needs a stage and a micro-batch");
    size_t km = (size_t)K * (size_t)M, m = (size_t)M;
    int *pf = malloc(sizeof(int) * km), *pr = malloc(sizeof(int) * km), *pb = malloc(sizeof(int) * km);
    int *fwd_next = malloc(sizeof(int) * km);
    struct interval *iv = malloc(sizeof *iv * 2 * m);
    struct heaps scratch = {.slot = malloc(sizeof *scratch.slot * 2 * m), .free_ = malloc(sizeof(int) * 2 * m),
                            .busy = malloc(sizeof(int) * 2 * m)};
    gp_status st = pf && pr && pb && fwd_next && iv && scratch.slot && scratch.free_ && scratch.busy
                       ? positions(s, pf, pr, pb, err)
                       : gp_error_set(err, GP_ERR_NOMEM, "out of memory planning the stages");
    for (int k = 0; k < K && st == GP_OK; k++)
        if ((st = alloc_stage(&out[k], M, err)) == GP_OK)
            plan_stage(K, M, k, pf, pr, pb, iv, &scratch, fwd_next + (size_t)k * m, &out[k]);
    /* A copy issued late must still find what it sends: the set micro-
     * batch j's forward wrote on the sending stage is not written again
     * before the copy is issued. (A frontier value may also live in the
     * sender's box, kept until its backward, which comes later.) */
    for (int k = 1; k < K && st == GP_OK; k++)
        for (int j = 0; j < M; j++)
            if (fwd_next[(size_t)(k - 1) * m + j] <= out[k].copy_after[j]) {
                st = gp_error_set(err, GP_ERR_INVALID,
                                  "schedule: stage %d would overwrite micro-batch %d's activations before "
                                  "sending them to stage %d",
                                  k - 1, j, k);
                break;
            }
    free(pf);
    free(pr);
    free(pb);
    free(fwd_next);
    free(iv);
    free(scratch.slot);
    free(scratch.free_);
    free(scratch.busy);
    if (st != GP_OK)
        for (int k = 0; k < K; k++) gp_stage_slots_free(&out[k]);
    return st;
}
