/* Counter-based random numbers for dropout: Philox4x32-10 keyed by
 * (seed, step, node) and counted by the element's global index, so a mask
 * is a pure function of where the element sits in the mini-batch. Any split
 * into stages or micro-batches, and any recomputation, draws the same mask;
 * the CUDA backend uses the same function. */
#ifndef GP_BACKEND_CPU_RNG_H
#define GP_BACKEND_CPU_RNG_H

#include <stdint.h>

#ifdef __CUDACC__
#define GP_RNG_FN __host__ __device__ static inline
#else
#define GP_RNG_FN static inline
#endif

GP_RNG_FN void gp_philox4x32_10(uint32_t ctr[4], uint32_t key[2])
{
    for (int round = 0; round < 10; round++) {
        uint64_t p0 = (uint64_t)0xD2511F53u * ctr[0];
        uint64_t p1 = (uint64_t)0xCD9E8D57u * ctr[2];
        uint32_t c0 = (uint32_t)(p1 >> 32) ^ ctr[1] ^ key[0];
        uint32_t c2 = (uint32_t)(p0 >> 32) ^ ctr[3] ^ key[1];
        ctr[1] = (uint32_t)p1;
        ctr[3] = (uint32_t)p0;
        ctr[0] = c0;
        ctr[2] = c2;
        key[0] += 0x9E3779B9u;
        key[1] += 0xBB67AE85u;
    }
}

/* Uniform floats in [0, 1) for elements 4 quad .. 4 quad + 3 of node
 * `node` at `step`: one Philox block gives all four (its four words, 24
 * random bits each, so every value is exactly representable in float32).
 * A block per element would cost four times the arithmetic, which bounds
 * the GPU's dropout by compute rather than by memory. */
GP_RNG_FN void gp_rng_uniform4(uint64_t seed, uint64_t step, uint32_t node, uint64_t quad, float u[4])
{
    uint32_t ctr[4] = {(uint32_t)quad, (uint32_t)(quad >> 32), (uint32_t)step, node};
    uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32) ^ (uint32_t)(step >> 32)};
    gp_philox4x32_10(ctr, key);
    for (int k = 0; k < 4; k++) u[k] = (float)(ctr[k] >> 8) * (1.0f / 16777216.0f);
}

/* The uniform float of element `index`: word index % 4 of block index / 4. */
GP_RNG_FN float gp_rng_uniform(uint64_t seed, uint64_t step, uint32_t node, uint64_t index)
{
    float u[4];
    gp_rng_uniform4(seed, step, node, index >> 2, u);
    return u[index & 3];
}

#endif
