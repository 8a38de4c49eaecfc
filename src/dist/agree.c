/* Agreeing on the run's settings across ranks (dist/agree.h). */
#include "dist/agree.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/xxh64.h"

void gp_agree_init(struct gp_agree_record *r) { memset(r, 0, sizeof *r); }

static void add(struct gp_agree_record *r, const char *label, const char *detail, const char *fmt, va_list ap)
    __attribute__((format(printf, 4, 0)));
static void add(struct gp_agree_record *r, const char *label, const char *detail, const char *fmt, va_list ap)
{
    char text[4096], shown[4096 + 512];
    vsnprintf(text, sizeof text, fmt, ap);
    if (detail) snprintf(shown, sizeof shown, "%s (%s)", detail, text);
    else snprintf(shown, sizeof shown, "%s", text);
    struct gp_agree_item *it = NULL;
    for (int k = 0; k < r->n && !it; k++)
        if (!strncmp(r->items[k].label, label, sizeof it->label - 1)) it = &r->items[k];
    if (!it) {
        if (r->n >= GP_AGREE_MAX_ITEMS) {
            r->dropped++;
            return;
        }
        it = &r->items[r->n++];
    }
    memset(it, 0, sizeof *it);
    snprintf(it->label, sizeof it->label, "%s", label);
    /* Shown cut to fit (the digest compares the whole value). */
    size_t len = strlen(shown);
    if (len >= sizeof it->value) len = sizeof it->value - 1;
    memcpy(it->value, shown, len);
    it->digest = gp_xxh64(text, strlen(text), 0);
}

void gp_agree_add(struct gp_agree_record *r, const char *label, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    add(r, label, NULL, fmt, ap);
    va_end(ap);
}

void gp_agree_add_detail(struct gp_agree_record *r, const char *label, const char *detail, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    add(r, label, detail, fmt, ap);
    va_end(ap);
}

void gp_agree_fail(struct gp_agree_record *r, const char *fmt, ...)
{
    if (r->error[0]) return; /* the first reason is the one closest to the cause */
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->error, sizeof r->error, fmt, ap);
    va_end(ap);
}

static const struct gp_agree_item *find(const struct gp_agree_record *r, const char *label)
{
    for (int k = 0; k < r->n; k++)
        if (!strcmp(r->items[k].label, label)) return &r->items[k];
    return NULL;
}

/* Appends "; "-separated clauses to a message, counting those that do not
 * fit in the first few. */
struct clauses {
    char text[GP_ERROR_MSG_MAX - 128];
    size_t len;
    int shown, more;
};

static void clause(struct clauses *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void clause(struct clauses *c, const char *fmt, ...)
{
    char one[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(one, sizeof one, fmt, ap);
    va_end(ap);
    if (c->shown >= 6 || c->len + strlen(one) + 2 >= sizeof c->text) {
        c->more++;
        return;
    }
    c->len += (size_t)snprintf(c->text + c->len, sizeof c->text - c->len, "%s%s", c->shown ? "; " : "", one);
    c->shown++;
}

gp_status gp_agree_compare(const struct gp_agree_record *records, int n, struct gp_error *err)
{
    struct clauses *c = calloc(1, sizeof *c);
    if (!c) return gp_error_set(err, GP_ERR_NOMEM, "out of memory");
    bool failed = false;
    for (int r = 0; r < n; r++)
        if (records[r].error[0]) {
            clause(c, "rank %d: %s", r, records[r].error);
            failed = true;
        }
    const struct gp_agree_record *base = &records[0];
    for (int r = 1; r < n; r++) {
        const struct gp_agree_record *x = &records[r];
        if (x->error[0]) continue;
        for (int k = 0; k < x->n; k++) {
            const struct gp_agree_item *mine = &x->items[k], *theirs = find(base, mine->label);
            if (!theirs)
                clause(c, "rank %d has %s %s where rank 0 has none", r, mine->label, mine->value);
            else if (mine->digest != theirs->digest)
                clause(c, "rank %d's %s %s differs from rank 0's %s", r, mine->label, mine->value, theirs->value);
        }
        for (int k = 0; k < base->n; k++)
            if (!find(x, base->items[k].label))
                clause(c, "rank %d has no %s where rank 0 has %s", r, base->items[k].label, base->items[k].value);
        if (x->dropped != base->dropped)
            clause(c, "rank %d has %d settings past the %d compared, rank 0 %d", r, x->dropped, GP_AGREE_MAX_ITEMS,
                   base->dropped);
    }
    gp_status st = GP_OK;
    if (c->shown) {
        char more[64] = "";
        if (c->more) snprintf(more, sizeof more, " (and %d more)", c->more);
        st = gp_error_set(err, GP_ERR_INVALID, "%s: %s%s",
                          failed ? "not every rank can run" : "the ranks do not run the same model and settings",
                          c->text, more);
    }
    free(c);
    return st;
}

gp_status gp_agree_check(struct gp_comm *c, const struct gp_agree_record *mine, struct gp_error *err)
{
    int n = gp_comm_size(c);
    uint64_t digest = gp_xxh64(mine, sizeof *mine, 0);
    uint64_t *digests = calloc((size_t)n, sizeof *digests);
    if (!digests) return gp_error_set(err, GP_ERR_NOMEM, "out of memory");
    gp_status st = gp_comm_allgather(c, NULL, &digest, sizeof digest, digests, err);
    bool same = true;
    for (int r = 0; st == GP_OK && r < n; r++) same &= digests[r] == digests[0];
    free(digests);
    /* Every rank saw the same digests, so all take this branch together. */
    if (st != GP_OK || (same && !mine->error[0])) return st;
    struct gp_agree_record *all = calloc((size_t)n, sizeof *all);
    if (!all) return gp_error_set(err, GP_ERR_NOMEM, "out of memory for %d ranks' settings", n);
    st = gp_comm_allgather(c, NULL, mine, sizeof *mine, all, err);
    if (st == GP_OK) st = gp_agree_compare(all, n, err);
    free(all);
    return st;
}
