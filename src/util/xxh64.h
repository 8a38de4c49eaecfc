/* XXH64, the 64-bit xxHash of Yann Collet (github.com/Cyan4973/xxHash,
 * its XXH64 specification), for checksums of saved training states: fast
 * (several GB/s) and the same digest `xxhsum -H1` and Python's
 * xxhash.xxh64 print, so a state's files can be checked by hand. Not a
 * cryptographic hash: it detects corruption, not tampering. */
#ifndef GP_UTIL_XXH64_H
#define GP_UTIL_XXH64_H

#include <stddef.h>
#include <stdint.h>

/* A digest computed over several pieces, equal to the one-shot digest of
 * their concatenation. */
struct gp_xxh64 {
    uint64_t v[4];
    uint64_t total;          /* bytes seen */
    unsigned char buf[32];   /* a partial stripe */
    size_t buffered;
    uint64_t seed;
};

void gp_xxh64_init(struct gp_xxh64 *h, uint64_t seed);
void gp_xxh64_update(struct gp_xxh64 *h, const void *data, size_t n);
uint64_t gp_xxh64_digest(const struct gp_xxh64 *h);

uint64_t gp_xxh64(const void *data, size_t n, uint64_t seed);

/* 16 lowercase hex digits and a NUL into out[17], as xxhsum prints it. */
void gp_xxh64_hex(uint64_t digest, char out[17]);

#endif
