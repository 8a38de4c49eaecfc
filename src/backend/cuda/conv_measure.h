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

/* The best of `runs` timed calls of call() on stream s (CUDA events),
 * after one untimed call waited for, in ms; -1 when any call fails. With
 * give_up_above > 0, a timed call slower than it ends the timing there
 * and returns that call's time: a candidate that far behind the fastest
 * so far does not win on its later runs (their spread is a few percent),
 * and measuring a network's convolutions spends most of its time on
 * such candidates. */
template <class Call>
static inline float conv_time_best(cudaStream_t s, int runs, Call call, float give_up_above = -1)
{
    cudaEvent_t e0 = nullptr, e1 = nullptr;
    float best = -1;
    if (cudaEventCreate(&e0) == cudaSuccess && cudaEventCreate(&e1) == cudaSuccess && call() &&
        cudaStreamSynchronize(s) == cudaSuccess) {
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
            if (give_up_above > 0 && t > give_up_above) break;
        }
    }
    cudaGetLastError();
    if (e0) cudaEventDestroy(e0);
    if (e1) cudaEventDestroy(e1);
    return best;
}

#endif
