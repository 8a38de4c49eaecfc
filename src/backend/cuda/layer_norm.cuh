/* What the LayerNormalization kernels share across their files: the plan
 * of a call (X as [rows, cols]), its constants, the parameter indexing,
 * the storage dispatch, and the warp path's pieces (a warp per row).
 * layer_norm.cu plans every call and runs the generic and register paths;
 * the warp path's two kernels have a file each,
 * layer_norm_warp_forward.cu and layer_norm_warp_backward.cu: their
 * instances (3 storages x 2 run lengths x 4 row lengths each) are about
 * two thirds of the PTX of the one file that held them all, which took
 * 346 s to build on one core (274 s of it in ptxas) and so ended the
 * build's last; apart, the build's jobs share them. */
#ifndef GP_CUDA_LAYER_NORM_CUH
#define GP_CUDA_LAYER_NORM_CUH

#include <cuda_runtime.h>
#include <math.h>

#include "backend/cuda/bf16.cuh"
#include "backend/cuda/kernel_util.cuh"
#include "backend/cuda/norm_storage.cuh"

/* ---- storage: IO of norm_storage.cuh for the row kernels (par: Scale or
 * B); the per-row Mean and InvStdDev (and their gradients), and the
 * parameter gradients, are read and written with gp_ld / gp_st / gp_acc
 * whatever the call (once per row or column). */

/* X viewed as [rows, cols]: cols = the normalized axes. Scale and B
 * broadcast to the normalized shape; `full` when one has an entry per
 * column (indexed by column then), as on the CPU. */
struct ln_plan {
    int64_t rows, cols;
    double eps;
    int rank;
    int64_t dims[GP_MAX_RANK];                          /* normalized shape */
    int64_t sstride[GP_MAX_RANK], bstride[GP_MAX_RANK]; /* Scale's, B's strides over it */
    bool sfull, bfull;
    int64_t chunks; /* row chunks of the parameter-gradient partial sums */
    /* Rows of at most LN_REG_COLS (backward: LN_REG_BWD_COLS): a block
     * keeps LN_ROWS rows in registers (reg_threads threads, LN_VPT values
     * each) and backward adds the parameter gradients' terms of its rows
     * (blocks: reg_blocks) in registers too. */
    bool reg, reg_bwd;
    /* Rows of at most LN_WARP_COLS: a warp per row, npl values a lane
     * (the warp path, before the register path). */
    bool warp;
    int npl;
    int reg_threads;
    int64_t reg_blocks;
};

#define LN_CHUNK_ROWS 32
#define LN_MAX_CHUNKS 128
#define LN_MAX_PARTIALS (4 << 20) /* doubles of partials at most (32 MiB) */
#define LN_VPT 8                  /* values per thread of a row kept in registers */
#define LN_ROWS 4                 /* rows a register-path block holds at once */
#define LN_REG_COLS 4096          /* rows up to this length: in registers */
#define LN_REG_BWD_COLS 2048      /* backward (512 threads of 118 registers ran slower) */
#define LN_MAX_WARPS (LN_REG_COLS / (32 * LN_VPT)) /* of a register-path block */
/* Blocks of the fused register backward: what an H100 / H200 SXM (132
 * SMs) keeps resident, 8 warps an SM at the kernel's ~250 registers a
 * thread, so they run in one wave, each over many rows, and write few
 * partials (768 values: 3 warps a block, 264 blocks, 3.2 MB). Constants,
 * not the device's: the partials, and so the sums, depend on them. */
#define LN_BWD_SMS 132
#define LN_BWD_SM_WARPS 8
#define LN_FIN_COLS 8             /* columns of a final-sum block (768: 96 blocks) */
#define LN_FIN_LANES 32           /* partials each column's final sum splits over */
#define LN_WARP_COLS 1024         /* rows up to this: a warp each (32 values a lane at most) */
#define LN_WARP_BLOCK 256         /* threads of a warp-path block: 8 rows at once */
#define LN_CS_TX 32               /* column threads of a column-sum block, LN_VPT columns each */
#define LN_CS_TY 4                /* its row lanes */
#define LN_CS_ROWS 4              /* rows a column-sum thread loads before adding them */

/* Offset into a broadcast parameter of column j. */
__device__ static inline int64_t ln_index(const struct ln_plan &p, const int64_t *st, bool full,
                                          int64_t j)
{
    if (full) return j;
    int64_t off = 0;
    for (int i = p.rank - 1; i >= 0; i--) {
        off += (j % p.dims[i]) * st[i];
        j /= p.dims[i];
    }
    return off;
}

/* Runs the statement(s) with IO the storage `kind` names and VEC the run
 * length, 8 where vec is 8, else 1 (io_mixed: always 1). */
#define LN_IO_VEC_DISPATCH(kind, vec, ...)                                            \
    do {                                                                              \
        if ((kind) == IO_F32) {                                                       \
            typedef io_typed<float> IO;                                               \
            if ((vec) == 8) { const int VEC = 8; __VA_ARGS__; }                       \
            else { const int VEC = 1; __VA_ARGS__; }                                  \
        } else if ((kind) == IO_BF16) {                                               \
            typedef io_typed<__nv_bfloat16> IO;                                       \
            if ((vec) == 8) { const int VEC = 8; __VA_ARGS__; }                       \
            else { const int VEC = 1; __VA_ARGS__; }                                  \
        } else {                                                                      \
            typedef io_mixed IO;                                                      \
            const int VEC = 1;                                                        \
            __VA_ARGS__;                                                              \
        }                                                                             \
    } while (0)

/* ... and NPL the values a lane holds (ln_plan.npl: 8, 16, 24 or 32). */
#define LN_WARP_DISPATCH(kind, vec, npl, ...)                                         \
    LN_IO_VEC_DISPATCH(kind, vec, switch (npl) {                                      \
        case 8: { const int NPL = 8; __VA_ARGS__; } break;                            \
        case 16: { const int NPL = 16; __VA_ARGS__; } break;                          \
        case 24: { const int NPL = 24; __VA_ARGS__; } break;                          \
        default: { const int NPL = 32; __VA_ARGS__; } break;                          \
    })

/* ---- the warp path (rows of at most LN_WARP_COLS) ----
 * A warp per row, 8 rows a block, the blocks striding over rows: lane l
 * holds runs l, l + 32, ... of VEC values (run i: columns (32 i + l) VEC
 * .. + VEC - 1; NPL values a lane, NPL / VEC runs), a row's two sums go
 * through one shuffle tree each, and nothing else is shared: no shared
 * memory, no __syncthreads. The register path's blocks of 3 warps holding
 * 4 rows (124 registers forward, 255 with spills backward) kept 6 to 15
 * warps an SM, too few to cover the loads' latency (63.7 us forward,
 * 184.5 us backward for GPT-2's 16384 rows of 768 in bf16 on an H200).
 * GPT-2's rows: 24 values a lane, three 16-byte loads of bfloat16 per
 * tensor. Runs of 8 where io_vec_for allows them (cols % 8 == 0 and every
 * activation aligned to 16 bytes; then the run at column j of row r
 * starts at r cols + j, a multiple of 8, and lies wholly inside the row or
 * wholly past it), else single values (still coalesced: lane l takes
 * columns l, l + 32, ...); runs of 4 or 2 would save instructions only,
 * at the build time of more instances. The parameters are read per row
 * from L1 rather than held (24 registers each), by runs of 8 where they
 * are float32, one per column and aligned (pvec), else one by one. */

/* Row r's values of lane `lane` (0 past the row). */
template <class IO, int VEC, int NPL>
__device__ static inline void ln_warp_load(gp_fptr t, const struct ln_plan &p, int64_t r, int lane,
                                           float (&v)[NPL])
{
#pragma unroll
    for (int i = 0; i < NPL / VEC; i++) {
        const int64_t j = (int64_t)(32 * i + lane) * VEC;
        float u[VEC];
        if (j < p.cols) {
            IO::template acts<VEC>(t, r * p.cols + j, u);
        } else {
#pragma unroll
            for (int k = 0; k < VEC; k++) u[k] = 0.0f;
        }
#pragma unroll
        for (int k = 0; k < VEC; k++) v[VEC * i + k] = u[k];
    }
}

/* Parameter values of columns j .. j + VEC - 1 (within the row). */
template <class IO, int VEC>
__device__ static inline void ln_par_run(gp_fptr t, const struct ln_plan &p, const int64_t *st, bool full,
                                         bool pvec, int64_t j, float (&u)[VEC])
{
    if (pvec) {
        gp_run<float, VEC>::load(t.p, j, u);
    } else {
#pragma unroll
        for (int k = 0; k < VEC; k++) u[k] = IO::par(t, ln_index(p, st, full, j + k));
    }
}

/* v summed over the warp by a shuffle-down tree (fixed order), lane 0's
 * sum handed to every lane (a butterfly's lanes would each round in
 * another order). All lanes call it. */
__device__ static inline double ln_warp_sum(double v)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = DADD(v, __shfl_down_sync(0xffffffffu, v, o));
    return __shfl_sync(0xffffffffu, v, 0);
}

/* The warp path's launchers (rows of at most LN_WARP_COLS, p.warp): the
 * kernels' instance for the storage `kind`, run length `vec` and p.npl,
 * enqueued on `stream` with `grid` blocks of LN_WARP_BLOCK threads (the
 * caller checks the launch). pvec: the parameters read by runs of VEC
 * (layer_norm.cu ln_pvec). Forward: Y, the saved mean and invstd, and the
 * optional Mean / InvStdDev outputs; backward: dX alone (ow: written as 0
 * + its gradient), the parameter gradients being the column-sum kernel's. */
void ln_warp_forward(const struct ln_plan &p, enum io_kind kind, int vec, bool pvec, unsigned grid,
                     cudaStream_t stream, gp_fptr x, gp_fptr scale, gp_fptr bias, gp_fptr y, float *mean,
                     float *invstd, gp_fptr out_mean, gp_fptr out_inv);
void ln_warp_backward_dx(const struct ln_plan &p, enum io_kind kind, int vec, bool pvec, unsigned grid,
                         cudaStream_t stream, gp_fptr x, gp_fptr scale, gp_fptr dy, const float *mean,
                         const float *invstd, gp_fptr d_mean, gp_fptr d_inv, gp_fptr dx, bool ow);

#endif
