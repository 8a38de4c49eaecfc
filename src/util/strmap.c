#include "util/strmap.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static uint64_t hash(const char *s)
{
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

bool gp_strmap_init(struct gp_strmap *m, size_t expected)
{
    size_t cap = 16;
    while (cap < 2 * expected + 2) cap *= 2;
    m->cap = cap;
    m->count = 0;
    m->keys = calloc(cap, sizeof *m->keys);
    m->vals = calloc(cap, sizeof *m->vals);
    if (!m->keys || !m->vals) {
        gp_strmap_free(m);
        return false;
    }
    return true;
}

static bool grow(struct gp_strmap *m)
{
    struct gp_strmap bigger;
    if (!gp_strmap_init(&bigger, m->cap)) return false;
    for (size_t i = 0; i < m->cap; i++)
        if (m->keys[i]) gp_strmap_put(&bigger, m->keys[i], m->vals[i]);
    gp_strmap_free(m);
    *m = bigger;
    return true;
}

bool gp_strmap_put(struct gp_strmap *m, const char *key, int val)
{
    if (2 * (m->count + 1) > m->cap && !grow(m)) return false;
    size_t i = hash(key) & (m->cap - 1);
    while (m->keys[i] && strcmp(m->keys[i], key) != 0) i = (i + 1) & (m->cap - 1);
    if (!m->keys[i]) m->count++;
    m->keys[i] = key;
    m->vals[i] = val;
    return true;
}

int gp_strmap_get(const struct gp_strmap *m, const char *key)
{
    if (!m->cap) return -1;
    size_t i = hash(key) & (m->cap - 1);
    while (m->keys[i]) {
        if (strcmp(m->keys[i], key) == 0) return m->vals[i];
        i = (i + 1) & (m->cap - 1);
    }
    return -1;
}

void gp_strmap_free(struct gp_strmap *m)
{
    free(m->keys);
    free(m->vals);
    m->keys = NULL;
    m->vals = NULL;
    m->cap = m->count = 0;
}
