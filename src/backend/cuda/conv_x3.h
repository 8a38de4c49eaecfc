/* Float32 convolutions in 3xTF32 (cuda/conv_x3.cu, used by cuda/conv.cu).
 *
 * A float32 convolution without TF32 is a sum of products x w. Each
 * operand splits exactly into hi + lo, hi its value rounded to TF32 and lo
 * the rest (at most 2^-11 of it, itself rounded to TF32: a further 2^-11
 * of lo); x w is then hi hi + hi lo + lo hi within about 2^-21 of the
 * product (lo lo, under 2^-22, is left out), float32's accuracy, where
 * TF32 alone is within 2^-10. Every operand is TF32 exactly, so the result
 * does not depend on how a cuDNN kernel reads float32 (truncating or
 * rounding it), nor on whether it runs on tensor cores at all. A NaN or an
 * infinity in an operand stays in its hi part (its lo is 0): the result is
 * not finite wherever float32's would not be, but an infinity may come out
 * as NaN (infinity times a 0 lo part).
 *
 * Each direction runs as two TF32 calls (cuda/conv.cu's parts): hi hi over
 * the node's own summed axis, then hi lo + lo hi as one call over that
 * axis doubled, added to the first's result (beta = 1):
 *
 *   Y = conv(X, W):           X hi . W hi over the input channels, then
 *                             X's channels doubled into (lo, hi), W's
 *                             input channels into (hi, lo);
 *   dX = conv_data(dY, W):    over the output channels, the same way;
 *   dW = conv_filter(X, dY):  a ConvTranspose's over the batch, the same
 *                             way; a Conv's as below.
 *
 * A Conv's filter gradient sums over the batch and the image, so copies
 * along the batch (the old way, still a ConvTranspose's) meant a pass over
 * dY of its own, after the data gradient's split of the same dY. Instead it
 * takes that split as it lies: dY's channels doubled into (lo, hi) against
 * X's hi is a filter gradient of 2M output channels, lo hi and hi hi side
 * by side ([2M, ...], copy j of output channel m at 2m + j), and X's lo
 * against dY's hi (the data gradient's first operand) is the third
 * product; gp_cuda_conv_x3_filter_sum adds them into dW. X splits into two
 * copies instead of three and dY not at all (where the data gradient ran
 * first in the same call; else dY is split as it would have split it):
 * on ResNet-50 b128 about 25 GB a step fewer bytes moved, predicted 7-9
 * ms of the float32 step's 114 on an H100, measured 9.9 (115.4 -> 105.5
 * ms, bench/RESULTS.md 2026-12-06). Each output sums one kind of
 * product, as the separate calls do: hi hi alone, the small ones after.
 *
 * Copy j of channel c lies at channel 2c + j (sample 2n + j), so one
 * kernel makes each split in either layout; or, along the batch
 * (GP_CONV_X3_BATCH=blocked, not yet the default), copy j of sample n at
 * sample jN + n: two whole blocks, one of them hi's, which the first call
 * reads too (a pass fewer over each of the filter gradient's operands). At three times TF32's work
 * this is still 2.5x float32's rate on the H200's tensor cores (495
 * against 67 TFLOP/s dense), the copies costing passes over each operand.
 *
 * Why not one call over the tripled axis, (hi, hi, lo) . (hi, lo, hi):
 * tensor cores add each instruction's products into their float32
 * accumulator with truncation, not rounding to nearest (Fasi, Higham,
 * Mikaitis and Pranesh measured it on V100, T4 and A100, 2021; the H200's
 * errors fit it): up to one last place of the running sum lost per
 * instruction, always toward zero, so a long sum drifts by about half a
 * last place of its size per instruction whatever the operands' precision.
 * One call runs three times the instructions at the large sum's size.
 * bench/x3_model.py models it: on test_cuda_conv's 3x3 64 -> 64 data (576
 * terms) that call is 4-8e-4 off the exact sums, float32 summed in order
 * 1.1e-4; the H200 was 2.5e-4 off the CPU, above the test's float32 bound
 * (2.3e-4). Separate calls put a third of the instructions at the large
 * sum's size, 2-3x closer in the model whichever order a cuDNN kernel
 * takes the summed axis in, and pass the test's bounds on the H100 on
 * both cuDNN APIs (bench/RESULTS.md). Blocks of copies in one call help
 * only kernels that take the channels outermost: channels-last ones take
 * the kernel's taps outermost.
 */
#ifndef GP_CUDA_CONV_X3_H
#define GP_CUDA_CONV_X3_H

#include <stdbool.h>
#include <stdint.h>

#include <cuda_runtime.h>

#ifdef __cplusplus
extern "C" {
#endif

/* dst [outer, copies ch, inner] from src [outer, ch, inner] (float32),
 * copies 1 or 2: copy j of src's channel c is its TF32 hi part, or its lo
 * part where bit j of lo_parts is set, at dst's channel copies c + j; and
 * where hi is not NULL, the hi parts alone into hi in src's layout (the
 * first call's operand, made in the same pass over src). Returns the
 * launch's error (cudaErrorInvalidValue for other copies). */
cudaError_t gp_cuda_conv_x3_split(cudaStream_t stream, float *dst, float *hi, const float *src, int64_t outer,
                                  int64_t ch, int64_t inner, int copies, unsigned lo_parts);

/* The batch axis's two copies as two whole blocks (cuda/conv.cu with
 * GP_CONV_X3_BATCH=blocked, the filter gradient's operands): dst[0, n)
 * copy 0 and dst[n, 2n) copy 1 of src's n values (lo where bit j of
 * lo_parts is set, else hi), in one pass over src. The block that holds
 * the hi parts is then the first call's operand as well, so nothing more
 * is written for it: two copies where the interleaved split writes three.
 * Returns the launch's error. */
cudaError_t gp_cuda_conv_x3_split_blocks(cudaStream_t stream, float *dst, const float *src, int64_t n,
                                         unsigned lo_parts);

/* A Conv's filter gradient from its parts (above): out[m, i] = (out[m, i]
 * if add, else 0) + hi hi + (lo hi + hi lo), with a = [2M, R] (lo hi at
 * row 2m, hi hi at row 2m + 1) and b = [M, R] (hi lo); R the values of one
 * output channel's filter in dW's layout (C k... or k... C: M is
 * outermost in both). Returns the launch's error. */
cudaError_t gp_cuda_conv_x3_filter_sum(cudaStream_t stream, float *out, const float *a, const float *b, int64_t m,
                                       int64_t r, bool add);

/* The parts' patterns (bit j: copy j is lo): hi alone (the first call),
 * (lo, hi) and (hi, lo) (the small products' call). */
#define CONV_X3_HI 0u
#define CONV_X3_LO_HI 1u
#define CONV_X3_HI_LO 2u

#ifdef __cplusplus
}
#endif

#endif
