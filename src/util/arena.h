/* A bump allocator for everything a loaded graph owns (names, attributes,
 * shapes, folded constants). One free releases it all, so the loader's many
 * error paths need no per-object cleanup. */
#ifndef GP_UTIL_ARENA_H
#define GP_UTIL_ARENA_H

#include <stddef.h>

struct gp_arena_block;

struct gp_arena {
    struct gp_arena_block *head;
};

/* Returns zeroed memory aligned to 64 bytes for large requests (tensor data)
 * and to 16 bytes otherwise, or NULL when memory is exhausted. */
void *gp_arena_alloc(struct gp_arena *arena, size_t size);
void *gp_arena_memdup(struct gp_arena *arena, const void *src, size_t size);
char *gp_arena_strdup(struct gp_arena *arena, const char *s);
char *gp_arena_strndup(struct gp_arena *arena, const char *s, size_t n);
void gp_arena_free(struct gp_arena *arena);

#endif
