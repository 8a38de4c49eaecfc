#include "util/arena.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Small requests share 64 KiB blocks; a request above a quarter of that gets
 * a block of its own so big tensors never waste a shared block's tail. */
#define GP_ARENA_BLOCK (64 * 1024)

struct gp_arena_block {
    struct gp_arena_block *next;
    size_t used, size;
    _Alignas(64) unsigned char data[];
};

static struct gp_arena_block *new_block(size_t size)
{
    struct gp_arena_block *b = calloc(1, sizeof *b + size);
    if (!b) return NULL;
    b->size = size;
    return b;
}

void *gp_arena_alloc(struct gp_arena *arena, size_t size)
{
    if (size == 0) size = 1;
    if (size > SIZE_MAX - 64 - sizeof(struct gp_arena_block)) return NULL;
    if (size > GP_ARENA_BLOCK / 4) {
        struct gp_arena_block *b = new_block(size);
        if (!b) return NULL;
        b->used = size;
        /* Keep the shared block at the head so small requests still find it. */
        if (arena->head) {
            b->next = arena->head->next;
            arena->head->next = b;
        } else {
            arena->head = b;
        }
        return b->data;
    }
    size_t aligned = (size + 15) & ~(size_t)15;
    struct gp_arena_block *b = arena->head;
    if (!b || b->size - b->used < aligned) {
        b = new_block(GP_ARENA_BLOCK);
        if (!b) return NULL;
        b->next = arena->head;
        arena->head = b;
    }
    void *p = b->data + b->used;
    b->used += aligned;
    return p;
}

void *gp_arena_memdup(struct gp_arena *arena, const void *src, size_t size)
{
    void *p = gp_arena_alloc(arena, size);
    if (p && size) memcpy(p, src, size);
    return p;
}

char *gp_arena_strndup(struct gp_arena *arena, const char *s, size_t n)
{
    char *p = gp_arena_alloc(arena, n + 1);
    if (!p) return NULL;
    if (n) memcpy(p, s, n);
    p[n] = '\0';
    return p;
}

char *gp_arena_strdup(struct gp_arena *arena, const char *s)
{
    return gp_arena_strndup(arena, s ? s : "", s ? strlen(s) : 0);
}

void gp_arena_free(struct gp_arena *arena)
{
    struct gp_arena_block *b = arena->head;
    while (b) {
        struct gp_arena_block *next = b->next;
        free(b);
        b = next;
    }
    arena->head = NULL;
}
