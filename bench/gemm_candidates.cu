/* Times the matrix products of a model's step as the CUDA backend calls
 * cuBLAS (row-major, operands swapped, src/backend/cuda/matmul.cu's
 * rm_gemm), against each algorithm cuBLASLt's heuristic offers for the same
 * product: how much a measured choice of algorithm would save, product by
 * product and for a whole step, before the executor is changed to make it.
 *
 *   nvcc -O2 -o gemm_candidates bench/gemm_candidates.cu -lcublasLt -lcublas
 *   gemm_candidates [--precision fp32|tf32|bf16] [--reps N] [--candidates N]
 *                   [--workspace MIB] [M,N,K,TA,TB,COUNT ...]
 *
 * Without shapes: GPT-2 small's products at 16 x 1024 tokens (bench/models.py),
 * each Linear layer's forward, data gradient and weight gradient with the
 * weight stored [out, in] (as nn.Linear keeps it) and [in, out] (a folded
 * Transpose), COUNT the products of that shape in one step. Each line:
 * cuBLAS's default (cublasGemmEx, as the executor calls it), cuBLASLt's
 * first heuristic choice, and the fastest of its candidates with and
 * without a workspace, in ms and TFLOP/s; then the step's sums. */
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#define CUDA_OK(x)                                                                                   \
    do {                                                                                             \
        cudaError_t e_ = (x);                                                                        \
        if (e_ != cudaSuccess) {                                                                     \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));      \
            exit(1);                                                                                 \
        }                                                                                            \
    } while (0)
#define BLAS_OK(x)                                                                                   \
    do {                                                                                             \
        cublasStatus_t s_ = (x);                                                                     \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                                           \
            fprintf(stderr, "%s:%d: %s: status %d\n", __FILE__, __LINE__, #x, (int)s_);              \
            exit(1);                                                                                 \
        }                                                                                            \
    } while (0)

struct shape {
    long long m, n, k;
    int ta, tb, count;
    const char *what;
    int layout; /* 0: W [out, in] (or a given shape), 1: W [in, out] */
};

enum prec { FP32, TF32, BF16 };

static int reps = 10, max_candidates = 16;
static size_t workspace_bytes = (size_t)32 << 20;
static prec precision = TF32;

/* Mean ms of `reps` runs of f after two warm-up runs. */
template <class F> static float time_ms(cudaStream_t s, F f)
{
    cudaEvent_t a, b;
    CUDA_OK(cudaEventCreate(&a));
    CUDA_OK(cudaEventCreate(&b));
    for (int i = 0; i < 2; i++)
        if (!f()) return -1;
    CUDA_OK(cudaEventRecord(a, s));
    for (int i = 0; i < reps; i++)
        if (!f()) return -1;
    CUDA_OK(cudaEventRecord(b, s));
    CUDA_OK(cudaEventSynchronize(b));
    float ms = 0;
    CUDA_OK(cudaEventElapsedTime(&ms, a, b));
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    return ms / (float)reps;
}

static void describe(const cublasLtMatmulAlgo_t *algo, char *out, size_t size)
{
    int id = 0, tile = 0, splitk = 0, red = 0, swz = 0, stages = 0, cluster = 0;
    size_t w = 0;
    cublasLtMatmulAlgoConfigGetAttribute(algo, CUBLASLT_ALGO_CONFIG_ID, &id, sizeof id, &w);
    cublasLtMatmulAlgoConfigGetAttribute(algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof tile, &w);
    cublasLtMatmulAlgoConfigGetAttribute(algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splitk, sizeof splitk, &w);
    cublasLtMatmulAlgoConfigGetAttribute(algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &red, sizeof red, &w);
    cublasLtMatmulAlgoConfigGetAttribute(algo, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, &swz, sizeof swz, &w);
    cublasLtMatmulAlgoConfigGetAttribute(algo, CUBLASLT_ALGO_CONFIG_STAGES_ID, &stages, sizeof stages, &w);
    cublasLtMatmulAlgoConfigGetAttribute(algo, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, &cluster, sizeof cluster, &w);
    snprintf(out, size, "algo %d tile %d splitk %d red %d swz %d stages %d cluster %d", id, tile, splitk, red, swz,
             stages, cluster);
}

int main(int argc, char **argv)
{
    std::vector<shape> shapes;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--precision") && i + 1 < argc) {
            const char *p = argv[++i];
            precision = !strcmp(p, "fp32") ? FP32 : !strcmp(p, "bf16") ? BF16 : TF32;
        } else if (!strcmp(argv[i], "--reps") && i + 1 < argc) {
            reps = atoi(argv[++i]);
        } else if (!strcmp(argv[i], "--candidates") && i + 1 < argc) {
            max_candidates = atoi(argv[++i]);
        } else if (!strcmp(argv[i], "--workspace") && i + 1 < argc) {
            workspace_bytes = (size_t)atoll(argv[++i]) << 20;
        } else {
            shape s = {0, 0, 0, 0, 0, 1, "given", 0};
            if (sscanf(argv[i], "%lld,%lld,%lld,%d,%d,%d", &s.m, &s.n, &s.k, &s.ta, &s.tb, &s.count) < 5) {
                fprintf(stderr, "usage: %s [--precision fp32|tf32|bf16] [--reps N] [--candidates N] "
                                "[--workspace MIB] [M,N,K,TA,TB,COUNT ...]\n", argv[0]);
                return 2;
            }
            shapes.push_back(s);
        }
    }
    if (shapes.empty()) {
        const long long T = 16 * 1024, C = 768, V = 50304;
        struct lin {
            long long in, out;
            int count;
            const char *name;
        } lins[] = {{C, 3 * C, 12, "qkv"}, {C, C, 12, "attn proj"}, {C, 4 * C, 12, "fc"}, {4 * C, C, 12, "fc proj"},
                    {C, V, 1, "lm head"}};
        for (const lin &l : lins) {
            /* W [out, in]: Y = X W^T; dX = dY W; dW = dY^T X. */
            shapes.push_back({T, l.out, l.in, 0, 1, l.count, l.name, 0});
            shapes.push_back({T, l.in, l.out, 0, 0, l.count, l.name, 0});
            shapes.push_back({l.out, l.in, T, 1, 0, l.count, l.name, 0});
            /* W [in, out]: Y = X W; dX = dY W^T; dW = X^T dY. */
            shapes.push_back({T, l.out, l.in, 0, 0, l.count, l.name, 1});
            shapes.push_back({T, l.in, l.out, 0, 1, l.count, l.name, 1});
            shapes.push_back({l.in, l.out, T, 1, 0, l.count, l.name, 1});
        }
    }
    bool bf16 = precision == BF16;
    cudaDataType_t ab = bf16 ? CUDA_R_16BF : CUDA_R_32F, ct = bf16 ? CUDA_R_16BF : CUDA_R_32F;
    cublasComputeType_t compute = precision == TF32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    size_t esz = bf16 ? 2 : 4;
    size_t most = 0;
    for (const shape &s : shapes) most = std::max({most, (size_t)(s.m * s.k), (size_t)(s.k * s.n), (size_t)(s.m * s.n)});
    void *A, *B, *Cm, *ws;
    CUDA_OK(cudaMalloc(&A, most * esz));
    CUDA_OK(cudaMalloc(&B, most * esz));
    CUDA_OK(cudaMalloc(&Cm, most * esz));
    CUDA_OK(cudaMalloc(&ws, workspace_bytes ? workspace_bytes : 1));
    {
        std::vector<unsigned char> h(most * esz);
        srand(1);
        for (size_t i = 0; i < most; i++) {
            float v = (float)rand() / RAND_MAX - 0.5f;
            if (bf16) {
                __nv_bfloat16 b = __float2bfloat16(v);
                memcpy(&h[i * 2], &b, 2);
            } else {
                memcpy(&h[i * 4], &v, 4);
            }
        }
        CUDA_OK(cudaMemcpy(A, h.data(), h.size(), cudaMemcpyHostToDevice));
        CUDA_OK(cudaMemcpy(B, h.data(), h.size(), cudaMemcpyHostToDevice));
    }
    cudaStream_t stream;
    CUDA_OK(cudaStreamCreate(&stream));
    cublasHandle_t h;
    BLAS_OK(cublasCreate(&h));
    BLAS_OK(cublasSetStream(h, stream));
    cublasLtHandle_t lt;
    BLAS_OK(cublasLtCreate(&lt));
    int dev = 0;
    cudaDeviceProp prop;
    CUDA_OK(cudaGetDeviceProperties(&prop, dev));
    printf("# %s, cuBLAS %d, cuBLASLt %zu, %s, %d reps, up to %d candidates, workspace %zu MiB\n", prop.name,
           CUBLAS_VERSION, cublasLtGetVersion(), precision == FP32 ? "fp32" : precision == TF32 ? "tf32" : "bf16",
           reps, max_candidates, workspace_bytes >> 20);
    printf("%-10s %6s %6s %6s %2s %2s %3s | %8s %6s | %8s | %8s %3s | %8s %3s %6s | best\n", "layer", "m", "n", "k",
           "ta", "tb", "x", "default", "TF/s", "lt first", "best ws0", "#", "best ws", "#", "TF/s");
    double sum_default[2] = {0, 0}, sum_first[2] = {0, 0}, sum_best0[2] = {0, 0}, sum_best[2] = {0, 0};
    for (const shape &s : shapes) {
        float alpha = 1, beta = 0;
        int m = (int)s.m, n = (int)s.n, k = (int)s.k;
        int lda = s.ta ? m : k, ldb = s.tb ? k : n, ldc = n;
        cublasOperation_t opa = s.ta ? CUBLAS_OP_T : CUBLAS_OP_N, opb = s.tb ? CUBLAS_OP_T : CUBLAS_OP_N;
        float t_def = time_ms(stream, [&] {
            return cublasGemmEx(h, opb, opa, n, m, k, &alpha, B, ab, ldb, A, ab, lda, &beta, Cm, ct, ldc, compute,
                                CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_SUCCESS;
        });
        /* cuBLASLt, column-major: D [n, m] = op(B') op(A'). */
        cublasLtMatmulDesc_t desc;
        BLAS_OK(cublasLtMatmulDescCreate(&desc, compute, CUDA_R_32F));
        BLAS_OK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &opb, sizeof opb));
        BLAS_OK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &opa, sizeof opa));
        cublasLtMatrixLayout_t lb, la, lc;
        BLAS_OK(s.tb ? cublasLtMatrixLayoutCreate(&lb, ab, k, n, ldb) : cublasLtMatrixLayoutCreate(&lb, ab, n, k, ldb));
        BLAS_OK(s.ta ? cublasLtMatrixLayoutCreate(&la, ab, m, k, lda) : cublasLtMatrixLayoutCreate(&la, ab, k, m, lda));
        BLAS_OK(cublasLtMatrixLayoutCreate(&lc, ct, n, m, ldc));
        float best[2] = {1e30f, 1e30f}, first = -1;
        int best_i[2] = {-1, -1};
        char best_name[2][160] = {"", ""};
        for (int pass = 0; pass < 2; pass++) {
            size_t wsb = pass ? workspace_bytes : 0;
            cublasLtMatmulPreference_t pref;
            BLAS_OK(cublasLtMatmulPreferenceCreate(&pref));
            BLAS_OK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb, sizeof wsb));
            std::vector<cublasLtMatmulHeuristicResult_t> res(max_candidates);
            int found = 0;
            if (cublasLtMatmulAlgoGetHeuristic(lt, desc, lb, la, lc, lc, pref, max_candidates, res.data(), &found) !=
                CUBLAS_STATUS_SUCCESS)
                found = 0;
            for (int i = 0; i < found; i++) {
                float t = time_ms(stream, [&] {
                    return cublasLtMatmul(lt, desc, &alpha, B, lb, A, la, &beta, Cm, lc, Cm, lc, &res[i].algo, ws, wsb,
                                          stream) == CUBLAS_STATUS_SUCCESS;
                });
                if (t < 0) continue;
                if (pass == 1 && i == 0) first = t;
                if (t < best[pass]) {
                    best[pass] = t;
                    best_i[pass] = i;
                    describe(&res[i].algo, best_name[pass], sizeof best_name[pass]);
                }
            }
            cublasLtMatmulPreferenceDestroy(pref);
        }
        cublasLtMatrixLayoutDestroy(la);
        cublasLtMatrixLayoutDestroy(lb);
        cublasLtMatrixLayoutDestroy(lc);
        cublasLtMatmulDescDestroy(desc);
        double flop = 2.0 * s.m * s.n * s.k;
        float b = std::min(best[0], best[1]);
        printf("%-10s %6lld %6lld %6lld %2d %2d %3d | %8.3f %6.0f | %8.3f | %8.3f %3d | %8.3f %3d %6.0f | %s\n", s.what,
               s.m, s.n, s.k, s.ta, s.tb, s.count, t_def, flop / t_def / 1e9, first, best[0], best_i[0], best[1],
               best_i[1], flop / b / 1e9, best_name[best[1] < best[0]]);
        fflush(stdout);
        sum_default[s.layout] += s.count * t_def;
        sum_first[s.layout] += s.count * first;
        sum_best0[s.layout] += s.count * best[0];
        sum_best[s.layout] += s.count * b;
    }
    for (int l = 0; l < 2; l++)
        if (sum_default[l] > 0)
            printf("# step sums, %s (ms, each shape x its count): default %.2f, cuBLASLt first %.2f, best without "
                   "workspace %.2f, best %.2f\n",
                   l ? "W [in, out]" : "W [out, in] or as given", sum_default[l], sum_first[l], sum_best0[l],
                   sum_best[l]);
    return 0;
}
