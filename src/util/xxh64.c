#include "util/xxh64.h"

#include <stdio.h>
#include <string.h>

static const uint64_t P1 = 0x9E3779B185EBCA87ull, P2 = 0xC2B2AE3D27D4EB4Full, P3 = 0x165667B19E3779F9ull,
                      P4 = 0x85EBCA77C2B2AE63ull, P5 = 0x27D4EB2F165667C5ull;

static uint64_t rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

/* Little-endian loads whatever the host's order (the spec reads bytes so). */
static uint64_t read64(const unsigned char *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

static uint32_t read32(const unsigned char *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t round64(uint64_t acc, uint64_t input)
{
    acc += input * P2;
    acc = rotl(acc, 31);
    return acc * P1;
}

static uint64_t merge(uint64_t acc, uint64_t v)
{
    acc ^= round64(0, v);
    return acc * P1 + P4;
}

void gp_xxh64_init(struct gp_xxh64 *h, uint64_t seed)
{
    memset(h, 0, sizeof *h);
    h->seed = seed;
    h->v[0] = seed + P1 + P2;
    h->v[1] = seed + P2;
    h->v[2] = seed;
    h->v[3] = seed - P1;
}

static void stripe(uint64_t v[4], const unsigned char *p)
{
    for (int i = 0; i < 4; i++) v[i] = round64(v[i], read64(p + 8 * i));
}

void gp_xxh64_update(struct gp_xxh64 *h, const void *data, size_t n)
{
    const unsigned char *p = data;
    h->total += n;
    if (h->buffered) {
        size_t take = 32 - h->buffered < n ? 32 - h->buffered : n;
        memcpy(h->buf + h->buffered, p, take);
        h->buffered += take;
        p += take;
        n -= take;
        if (h->buffered < 32) return;
        stripe(h->v, h->buf);
        h->buffered = 0;
    }
    for (; n >= 32; p += 32, n -= 32) stripe(h->v, p);
    memcpy(h->buf, p, n);
    h->buffered = n;
}

uint64_t gp_xxh64_digest(const struct gp_xxh64 *h)
{
    uint64_t acc;
    if (h->total >= 32) {
        const uint64_t *v = h->v;
        acc = rotl(v[0], 1) + rotl(v[1], 7) + rotl(v[2], 12) + rotl(v[3], 18);
        for (int i = 0; i < 4; i++) acc = merge(acc, v[i]);
    } else {
        acc = h->seed + P5;
    }
    acc += h->total;
    const unsigned char *p = h->buf;
    size_t n = h->buffered;
    for (; n >= 8; p += 8, n -= 8) acc = rotl(acc ^ round64(0, read64(p)), 27) * P1 + P4;
    if (n >= 4) {
        acc = rotl(acc ^ ((uint64_t)read32(p) * P1), 23) * P2 + P3;
        p += 4;
        n -= 4;
    }
    for (; n > 0; p++, n--) acc = rotl(acc ^ (*p * P5), 11) * P1;
    acc ^= acc >> 33;
    acc *= P2;
    acc ^= acc >> 29;
    acc *= P3;
    acc ^= acc >> 32;
    return acc;
}

uint64_t gp_xxh64(const void *data, size_t n, uint64_t seed)
{
    struct gp_xxh64 h;
    gp_xxh64_init(&h, seed);
    gp_xxh64_update(&h, data, n);
    return gp_xxh64_digest(&h);
}

void gp_xxh64_hex(uint64_t digest, char out[17])
{
    snprintf(out, 17, "%016llx", (unsigned long long)digest);
}
