/* A string -> int hash table (open addressing) for name lookups in graphs
 * with tens of thousands of values. Keys are not copied: they must outlive
 * the map (graph names live in the graph's arena). */
#ifndef GP_UTIL_STRMAP_H
#define GP_UTIL_STRMAP_H

#include <stdbool.h>
#include <stddef.h>

struct gp_strmap {
    size_t cap;   /* a power of two, at least twice the entries */
    size_t count;
    const char **keys;
    int *vals;
};

bool gp_strmap_init(struct gp_strmap *m, size_t expected);
/* Inserts or overwrites; false when memory is exhausted. */
bool gp_strmap_put(struct gp_strmap *m, const char *key, int val);
/* The value, or -1 when absent. */
int gp_strmap_get(const struct gp_strmap *m, const char *key);
void gp_strmap_free(struct gp_strmap *m);

#endif
