#include "util/mapped.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Enough for a model whose every tensor lies in its own external mapping. */
#define GP_MAPPED_MAX 8192

struct entry {
    _Atomic uintptr_t addr; /* 0: free */
    _Atomic size_t len;
    _Atomic(char *) path;
};

static struct entry table[GP_MAPPED_MAX];
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

void gp_mapped_register(const void *addr, size_t len, const char *path)
{
    if (!addr || !len) return;
    char *copy = strdup(path ? path : "?");
    if (!copy) return;
    pthread_mutex_lock(&lock);
    for (int i = 0; i < GP_MAPPED_MAX; i++) {
        if (atomic_load(&table[i].addr)) continue;
        atomic_store(&table[i].len, len);
        atomic_store(&table[i].path, copy);
        atomic_store(&table[i].addr, (uintptr_t)addr); /* published last */
        copy = NULL;
        break;
    }
    pthread_mutex_unlock(&lock);
    free(copy);
}

void gp_mapped_unregister(const void *addr)
{
    if (!addr) return;
    char *path = NULL;
    pthread_mutex_lock(&lock);
    for (int i = 0; i < GP_MAPPED_MAX; i++) {
        if (atomic_load(&table[i].addr) != (uintptr_t)addr) continue;
        atomic_store(&table[i].addr, 0);
        path = atomic_exchange(&table[i].path, NULL);
        break;
    }
    pthread_mutex_unlock(&lock);
    free(path);
}

const char *gp_mapped_find(const void *addr)
{
    uintptr_t a = (uintptr_t)addr;
    for (int i = 0; i < GP_MAPPED_MAX; i++) {
        uintptr_t start = atomic_load(&table[i].addr);
        if (!start || a < start || a - start >= atomic_load(&table[i].len)) continue;
        return atomic_load(&table[i].path);
    }
    return NULL;
}
