/* CUDA conv family: what the algorithm choices measure with (host C++,
 * shared by conv_graph.cpp's engine choice and conv_algos.cu's choice of
 * the API that adds a result): device buffers freed with the scope, and
 * the best time of a call. */
#ifndef GP_CUDA_CONV_MEASURE_H
#define GP_CUDA_CONV_MEASURE_H

#include <cuda_runtime.h>

#include "util/env.h"

#include <atomic>
#include <chrono>
#include <thread>
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

/* Holds a stream until opened: a timed call queued behind it runs on
 * the GPU straight after its start event, so that the host's time
 * spent launching it (cudnn-frontend builds a variant pack and checks
 * the plan on each execute, tens of microseconds; a legacy cuDNN call
 * or a kernel launch, a few) is not timed as the candidate's. Without
 * it a graph API engine's timed run would count host work that in
 * training overlaps the GPU's, while cudnnFind times the legacy
 * algorithms on the GPU alone: a bias toward the legacy API on the
 * smallest layers, whose kernels take 50-100 microseconds. The host
 * function waits at most 100 ms (a call that waited for its own stream
 * would otherwise never return); `expired` then says the time is not
 * to be trusted. Off unless GP_CONV_TIME_GATE=1: measured once on an
 * H100 (2026-12-06, ResNet-50), the choices it made trained 0.8% slower
 * in tf32 and in fp32 than the ungated ones of the run before, within
 * what two measurements of the same code differ by, but no gain. */
struct conv_stream_gate {
    std::atomic<bool> opened{false};
    std::atomic<bool> expired{false};
    static void CUDART_CB wait(void *arg)
    {
        conv_stream_gate *g = static_cast<conv_stream_gate *>(arg);
        const auto t0 = std::chrono::steady_clock::now();
        while (!g->opened.load(std::memory_order_acquire)) {
            if (std::chrono::steady_clock::now() - t0 > std::chrono::milliseconds(100)) {
                g->expired.store(true);
                return;
            }
            std::this_thread::yield();
        }
    }
    /* Whether the stream is now held (false: it was not, run ungated). */
    bool hold(cudaStream_t s)
    {
        opened.store(false);
        expired.store(false);
        if (cudaLaunchHostFunc(s, wait, this) == cudaSuccess) return true;
        cudaGetLastError();
        return false;
    }
    void open() { opened.store(true, std::memory_order_release); }
    static bool wanted()
    {
        return gp_env_flag("GP_CONV_TIME_GATE", false);
    }
};

/* The best of `runs` timed calls of call() on stream s (CUDA events),
 * after one untimed call waited for, in ms; -1 when any call fails. With
 * GP_CONV_TIME_GATE=1 each timed call is queued behind a
 * conv_stream_gate, its GPU time alone (ungated where the gate cannot
 * be set or expired). A
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
    conv_stream_gate gate;
    bool gated = conv_stream_gate::wanted();
    if (cudaEventCreate(&e0) == cudaSuccess && cudaEventCreate(&e1) == cudaSuccess &&
        cudaEventRecord(e0, s) == cudaSuccess && call() && cudaEventRecord(e1, s) == cudaSuccess &&
        cudaEventSynchronize(e1) == cudaSuccess && cudaEventElapsedTime(&first, e0, e1) == cudaSuccess) {
        if (give_up.warm > 0 && first > give_up.warm) runs = 0, best = first;
        for (int r = 0; r < runs; r++) {
            float t = 0;
            const bool held = gated && gate.hold(s);
            cudaEventRecord(e0, s);
            bool ok = call();
            cudaEventRecord(e1, s);
            if (held) gate.open();
            if (!ok || cudaEventSynchronize(e1) != cudaSuccess || cudaEventElapsedTime(&t, e0, e1) != cudaSuccess) {
                best = -1;
                break;
            }
            if (held && gate.expired.load()) { /* the call waited on its stream: time it ungated */
                gated = false;
                r--;
                continue;
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
