/* CUDA conv family: what the algorithm choices measure with (host C++,
 * shared by conv_graph.cpp's engine choice and conv_algos.cu's choice of
 * the API that adds a result): device buffers freed with the scope, and
 * the best time of a call. */
#ifndef GP_CUDA_CONV_MEASURE_H
#define GP_CUDA_CONV_MEASURE_H

#include <cuda_runtime.h>

#include <vector>

/* Zeroed device buffers (on the legacy stream: a measuring stream that
 * does not wait for it synchronizes first), freed on scope exit; get
 * returns NULL when memory is short. */
struct conv_device_buffers {
    std::vector<void *> p;
    ~conv_device_buffers()
    {
        for (void *q : p) cudaFree(q);
    }
    void *get(size_t bytes)
    {
        void *q = nullptr;
        if (cudaMalloc(&q, bytes ? bytes : 1) != cudaSuccess) {
            cudaGetLastError();
            return nullptr;
        }
        if (cudaMemset(q, 0, bytes ? bytes : 1) != cudaSuccess) cudaGetLastError();
        p.push_back(q);
        return q;
    }
};

/* When a candidate has lost (conv_time_best): `timed`, a timed call
 * slower than it ends the timing there; `warm`, a first (untimed) call
 * slower than it ends it before any timed call. -1: never. */
struct conv_give_up {
    float timed = -1;
    float warm = -1;
};

/* The best of `runs` timed calls of call() on stream s (CUDA events),
 * after one untimed call waited for, in ms; -1 when any call fails. A
 * call slower than `give_up` says ends the timing there and returns that
 * call's time: a candidate that far behind the fastest so far does not
 * win on its later runs (their spread is a few percent), and measuring a
 * network's convolutions spends most of its time on such candidates
 * (ResNet-50 in fp32 on an H100: cuDNN's fallback engine at 7 ms to 1.4
 * s a call, median 0.1 s: their best times summed to 46 s of the 102 s
 * spent timing, each run at least twice). The first call's time includes
 * its one-off costs (a kernel's module loaded on first use), so its bound
 * is looser. */
template <class Call>
static inline float conv_time_best(cudaStream_t s, int runs, Call call, conv_give_up give_up = conv_give_up())
{
    cudaEvent_t e0 = nullptr, e1 = nullptr;
    float best = -1, first = 0;
    if (cudaEventCreate(&e0) == cudaSuccess && cudaEventCreate(&e1) == cudaSuccess &&
        cudaEventRecord(e0, s) == cudaSuccess && call() && cudaEventRecord(e1, s) == cudaSuccess &&
        cudaEventSynchronize(e1) == cudaSuccess && cudaEventElapsedTime(&first, e0, e1) == cudaSuccess) {
        if (give_up.warm > 0 && first > give_up.warm) runs = 0, best = first;
        for (int r = 0; r < runs; r++) {
            float t = 0;
            cudaEventRecord(e0, s);
            bool ok = call();
            cudaEventRecord(e1, s);
            if (!ok || cudaEventSynchronize(e1) != cudaSuccess || cudaEventElapsedTime(&t, e0, e1) != cudaSuccess) {
                best = -1;
                break;
            }
            if (best < 0 || t < best) best = t;
            if (give_up.timed > 0 && t > give_up.timed) break;
        }
    }
    cudaGetLastError();
    if (e0) cudaEventDestroy(e0);
    if (e1) cudaEventDestroy(e1);
    return best;
}

#endif
