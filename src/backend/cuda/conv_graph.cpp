/* CUDA conv family: convolutions through cuDNN's graph API (conv_graph.h).
 *
 * A problem's graph is one convolution node between packed tensors. Its
 * candidates are cuDNN's heuristics list (modes A, then FALLBACK), less
 * what the mode forbids (numerical notes, below) and what needs runtime
 * compilation (seconds per plan; plain convolutions have kernels built in;
 * GP_CONV_RUNTIME_COMPILED=1 keeps those too, to measure them: PyTorch's
 * benchmark mode does not exclude them).
 * Choosing builds the first MAX_CANDIDATES that build, runs each once to
 * warm up and TIMED_RUNS times timed, and keeps the fastest: what
 * cudnnFind does for the legacy API and PyTorch's benchmark mode for the
 * graph API. A candidate whose timed run is GIVE_UP_RATIO times the
 * fastest so far is not run again, nor timed at all when its first run
 * is far behind (conv_time_best). A configuration the list holds twice
 * is a candidate once: cuDNN's generic engine eng0 comes twice in almost
 * every list (the only name that does), at 10 to 500 times the fastest
 * (7 ms to 1.4 s a call); measuring ResNet-50's choices in fp32 on an
 * H100 spent 45 of its 104 s of timing on eng0's second runs
 * (GP_CONV_VERBOSE's lines, 2026-12-06). Built plans are kept per GPU,
 * problem and name for the process's life (a few kilobytes each). */
#include "backend/cuda/conv_graph.h"
#include "backend/cuda/conv_measure.h"
#include "util/env.h"

#include <cuda_runtime.h>

#include <cudnn_frontend.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

namespace fe = cudnn_frontend;
using tensor_ptr = std::shared_ptr<fe::graph::Tensor_attributes>;

namespace {

/* Plans measured per choice: ResNet-50 in bf16 on the H200 trained at 989
 * samples/s with the first 12, 1018 with the first 64. */
const int MAX_CANDIDATES = 64;
const int TIMED_RUNS = 3;      /* the best of these is the plan's time */
/* Timed runs of one plan differ by a few percent; one this much slower
 * than the best so far has lost. */
const float GIVE_UP_RATIO = 1.25f;
/* A first run includes one-off costs (the kernel's module loaded), so it
 * gives up only this far behind: both 10 times the best so far and 50 ms
 * more (cuDNN's fallback engine took 7 ms to 1.4 s a call on ResNet-50's
 * float32 problems on an H100). */
const float WARM_GIVE_UP_RATIO = 10.0f;
const float WARM_GIVE_UP_MS = 50.0f;

double seconds_now()
{
    timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

struct built {
    fe::graph::Graph graph;
    tensor_ptr a, b, out;
    int64_t index = -1; /* of the plan that runs */
};

/* GP_CONV_RUNTIME_COMPILED=1 (or "added", below): engines that cuDNN
 * compiles at run time (NVRTC) are candidates too. Read once; a choice
 * file made with it may name engines a run without it does not offer. Off by default not only
 * for their compile time: with cuDNN 9.14 on an H100 (2026-12-06), eng41
 * (cudnn_generated_fort_native_sm80_convFwd) wrote 16-byte stores 8 bytes
 * off alignment into its own workspace while being measured on
 * test_cuda_conv's 1 -> 8 channel 3x3 stride-2 case, a sticky memory
 * fault that ends the process (compute-sanitizer found it). Some eng41
 * configurations are offered without the setting too (ResNet-50's fp32
 * choice timed 39 of them, odd workspace sizes, chose none). */
enum rtc_scope { RTC_OFF, RTC_ALL, RTC_ADDED };

/* "added": only among the engines that add their result themselves (beta
 * 1, conv_graph_beta_choose), where they won on ResNet-50 tf32 (eng78,
 * the added data gradients: +0.8 to +1.2%, 2026-12-06). Not safe either:
 * under compute-sanitizer, whose timing picks other engines, a bfloat16
 * weight gradient came out about 1% off (bench/RESULTS.md). */
rtc_scope runtime_compiled_scope()
{
    static const rtc_scope scope = [] {
        static const char *const ways[] = {"off", "on", "added", "0", "1", "no", "yes", "false", "true", NULL};
        static const rtc_scope as[] = {RTC_OFF, RTC_ALL, RTC_ADDED, RTC_OFF, RTC_ALL,
                                       RTC_OFF, RTC_ALL, RTC_OFF,   RTC_ALL};
        return as[gp_env_choice("GP_CONV_RUNTIME_COMPILED", ways, 0)];
    }();
    return scope;
}

/* Whether the plain graphs (beta 0) offer runtime-compiled engines. */
bool runtime_compiled() { return runtime_compiled_scope() == RTC_ALL; }

/* Engines never offered: eng41 (above), seen to fault with
 * GP_CONV_RUNTIME_COMPILED=1 and offered in some configurations without
 * it (never chosen there: slow). Matched as cudnn-frontend's
 * deselect_engines matches, as a part of the tag ("eng41" or
 * "eng41_k2=8_..."): no engine number of cuDNN 9 has three digits, so
 * "eng41" names one engine. */
const std::vector<std::string> &barred_engines()
{
    static const std::vector<std::string> names = {"eng41"};
    return names;
}

bool barred(const std::string &tag)
{
    for (const std::string &n : barred_engines())
        if (tag.find(n) != std::string::npos) return true;
    return false;
}

const char *op_name(conv_graph_op op)
{
    return op == CONV_GRAPH_FPROP ? "fwd" : op == CONV_GRAPH_DGRAD ? "data" : "filter";
}

/* Strides of a packed tensor of dims d ([n, ch, spatial...]), in that
 * order or channels-last ([n, spatial..., ch] in memory). */
std::vector<int64_t> packed_strides(const std::vector<int64_t> &d, bool nhwc)
{
    std::vector<int64_t> s(d.size(), 1);
    if (!nhwc) {
        for (int i = (int)d.size() - 2; i >= 0; i--) s[i] = s[i + 1] * d[i + 1];
        return s;
    }
    int64_t run = d[1];
    s[1] = 1;
    for (int i = (int)d.size() - 1; i >= 2; i--) {
        s[i] = run;
        run *= d[i];
    }
    s[0] = run;
    return s;
}

void set_why(char *why, size_t size, const std::string &text)
{
    if (size) snprintf(why, size, "%s", text.c_str());
}

/* The graph of `op`, with its candidates filtered for the mode (not yet
 * built). */
fe::error_t make_graph(cudnnHandle_t h, const conv_graph_problem *p, conv_graph_op op, built &g)
{
    auto io = p->bf16 ? fe::DataType_t::BFLOAT16 : fe::DataType_t::FLOAT;
    g.graph.set_io_data_type(io)
        .set_intermediate_data_type(fe::DataType_t::FLOAT)
        .set_compute_data_type(fe::DataType_t::FLOAT);
    int ns = p->nd - 2;
    std::vector<int64_t> img(p->img, p->img + p->nd), w(p->w, p->w + p->nd), col(p->col, p->col + p->nd);
    std::vector<int64_t> pad(p->pad, p->pad + ns), stride(p->stride, p->stride + ns),
        dilation(p->dilation, p->dilation + ns);
    auto input = [&](const char *name, const std::vector<int64_t> &d) {
        return g.graph.tensor(
            fe::graph::Tensor_attributes().set_name(name).set_dim(d).set_stride(packed_strides(d, p->nhwc)).set_data_type(io));
    };
    std::vector<int64_t> out_dims;
    switch (op) {
    case CONV_GRAPH_FPROP:
        g.a = input("image", img);
        g.b = input("filter", w);
        g.out = g.graph.conv_fprop(
            g.a, g.b, fe::graph::Conv_fprop_attributes().set_padding(pad).set_stride(stride).set_dilation(dilation));
        out_dims = col;
        break;
    case CONV_GRAPH_DGRAD:
        g.a = input("columns gradient", col);
        g.b = input("filter", w);
        g.out = g.graph.conv_dgrad(
            g.a, g.b, fe::graph::Conv_dgrad_attributes().set_padding(pad).set_stride(stride).set_dilation(dilation));
        out_dims = img;
        break;
    case CONV_GRAPH_WGRAD:
        g.a = input("image", img);
        g.b = input("columns gradient", col);
        g.out = g.graph.conv_wgrad(
            g.b, g.a, fe::graph::Conv_wgrad_attributes().set_padding(pad).set_stride(stride).set_dilation(dilation));
        out_dims = w;
        break;
    }
    g.out->set_output(true)
        .set_dim(out_dims)
        .set_stride(packed_strides(out_dims, p->nhwc))
        .set_data_type(p->float_out ? fe::DataType_t::FLOAT : io);
    fe::error_t st = g.graph.validate();
    if (st.is_good()) st = g.graph.build_operation_graph(h);
    if (st.is_good()) st = g.graph.create_execution_plans({fe::HeurMode_t::A, fe::HeurMode_t::FALLBACK});
    if (!st.is_good()) return st;
    /* Float32 accumulation (reduced-precision reductions and inputs
     * converted down are not what the backends compute) and deterministic
     * engines, unless nondeterministic (--fast-conv: the fastest whatever
     * its numerics, as PyTorch's benchmark mode, which bans only the
     * down-conversion, chooses); float32 without TF32 keeps float32
     * products and sums: no tensor cores; where float32's precision is
     * promised (that, and 3xTF32's problems), no FFT or Winograd. */
    std::vector<fe::NumericalNote_t> banned = {fe::NumericalNote_t::DOWN_CONVERT_INPUTS};
    if (!p->nondeterministic) banned.push_back(fe::NumericalNote_t::REDUCED_PRECISION_REDUCTION);
    if (!p->bf16 && !p->tf32) banned.push_back(fe::NumericalNote_t::TENSOR_CORE);
    if (p->precise)
        banned.insert(banned.end(), {fe::NumericalNote_t::FFT, fe::NumericalNote_t::WINOGRAD,
                                     fe::NumericalNote_t::WINOGRAD_TILE_4x4, fe::NumericalNote_t::WINOGRAD_TILE_6x6,
                                     fe::NumericalNote_t::WINOGRAD_TILE_13x13});
    if (!p->nondeterministic) banned.push_back(fe::NumericalNote_t::NONDETERMINISTIC);
    g.graph.deselect_numeric_notes(banned);
    if (!runtime_compiled()) g.graph.deselect_behavior_notes({fe::BehaviorNote_t::RUNTIME_COMPILATION});
    g.graph.deselect_engines(barred_engines());
    return g.graph.check_support(h);
}

std::unordered_map<int64_t, void *> variant_pack(const built &g, const void *a, const void *b, void *out)
{
    return {{g.a->get_uid(), const_cast<void *>(a)}, {g.b->get_uid(), const_cast<void *>(b)},
            {g.out->get_uid(), out}};
}

size_t numel(const int64_t *d, int nd)
{
    size_t n = 1;
    for (int i = 0; i < nd; i++) n *= (size_t)d[i];
    return n;
}

/* Device buffers freed on every path out. */
struct cache_key {
    int device;
    conv_graph_op op;
    std::string problem, name;
    bool operator<(const cache_key &o) const
    {
        if (device != o.device) return device < o.device;
        if (op != o.op) return op < o.op;
        if (problem != o.problem) return problem < o.problem;
        return name < o.name;
    }
};

std::mutex plans_mu;
std::map<cache_key, std::unique_ptr<built>> plans; /* built plans, kept for the process's life */

std::string problem_bytes(const conv_graph_problem *p)
{
    conv_graph_problem q;
    memset(&q, 0, sizeof q); /* padding too */
    q.nd = p->nd;
    memcpy(q.img, p->img, sizeof q.img);
    memcpy(q.w, p->w, sizeof q.w);
    memcpy(q.col, p->col, sizeof q.col);
    memcpy(q.pad, p->pad, sizeof q.pad);
    memcpy(q.stride, p->stride, sizeof q.stride);
    memcpy(q.dilation, p->dilation, sizeof q.dilation);
    q.bf16 = p->bf16, q.tf32 = p->tf32, q.precise = p->precise, q.nondeterministic = p->nondeterministic;
    q.float_out = p->float_out;
    q.nhwc = p->nhwc;
    return std::string((const char *)&q, sizeof q);
}

/* The key of a plan for the problem on the current GPU; false (why) when
 * there is none. */
bool key_here(const conv_graph_problem *p, conv_graph_op op, const char *name, cache_key *key, char *why,
              size_t why_size)
{
    int device = 0;
    if (cudaGetDevice(&device) != cudaSuccess) {
        cudaGetLastError();
        set_why(why, why_size, "cudaGetDevice failed");
        return false;
    }
    *key = cache_key{device, op, problem_bytes(p), name};
    return true;
}

/* A cuDNN handle of a choice's own, destroyed with the scope (h is NULL
 * when cudnnCreate failed). */
struct own_handle {
    cudnnHandle_t h = nullptr;
    own_handle()
    {
        if (cudnnCreate(&h) != CUDNN_STATUS_SUCCESS) h = nullptr;
    }
    ~own_handle()
    {
        if (h) cudnnDestroy(h);
    }
};

/* Bytes of op's operands a and b (as conv_graph_run names them) in the
 * storage type, and of its output at out_es bytes a value. */
struct operand_bytes {
    size_t a, b, out;
};

operand_bytes bytes_of(const conv_graph_problem *p, conv_graph_op op, size_t out_es)
{
    size_t es = p->bf16 ? 2 : 4;
    size_t img = numel(p->img, p->nd), w = numel(p->w, p->nd), col = numel(p->col, p->nd);
    switch (op) {
    case CONV_GRAPH_FPROP: return {img * es, w * es, col * out_es};
    case CONV_GRAPH_DGRAD: return {col * es, w * es, img * out_es};
    default: return {img * es, col * es, w * out_es};
    }
}

/* When a candidate has lost against the fastest so far (best_ms; none
 * yet where it is not positive): conv_time_best's bounds. */
conv_give_up give_up_after(float best_ms)
{
    conv_give_up g;
    if (best_ms > 0) {
        g.timed = GIVE_UP_RATIO * best_ms;
        g.warm = std::max(WARM_GIVE_UP_RATIO * best_ms, best_ms + WARM_GIVE_UP_MS);
    }
    return g;
}

/* Times candidates 0..n-1 on stream s, run(k) making one call of
 * candidate k, each under conv_time_best's give-up rules against the
 * fastest so far, and tells report(k, ms) its time (-1: failed or not
 * run). Returns the fastest's index, -1 when none ran, its time in
 * *best_ms. */
template <class Run, class Report>
long fastest_candidate(cudaStream_t s, size_t n, Run run, Report report, float *best_ms)
{
    long best = -1;
    *best_ms = -1;
    for (size_t k = 0; k < n; k++) {
        float ms = conv_time_best(s, TIMED_RUNS, [&] { return run(k); }, give_up_after(*best_ms));
        if (ms >= 0 && (*best_ms < 0 || ms < *best_ms)) *best_ms = ms, best = (long)k;
        report(k, ms);
    }
    return best;
}

} // namespace

extern "C" bool conv_graph_choose(const struct conv_graph_problem *p, enum conv_graph_op op, size_t ws_cap,
                                  char *name, size_t name_size, size_t *ws, float *ms_out, char *why,
                                  size_t why_size)
{
    *ms_out = -1;
    own_handle own;
    cudnnHandle_t h = own.h;
    if (!h) {
        set_why(why, why_size, "cudnnCreate failed");
        return false;
    }
    built g;
    fe::error_t st = make_graph(h, p, op, g);
    if (!st.is_good()) {
        set_why(why, why_size, st.get_message());
        return false;
    }
    /* Build the first candidates that build and fit. */
    std::vector<int64_t> candidates;
    std::vector<int64_t> workspaces;
    std::set<std::string> names; /* each configuration once */
    int64_t max_ws = 0;
    const double t_build = seconds_now();
    for (int64_t i = 0; i < g.graph.get_execution_plan_count() && (int)candidates.size() < MAX_CANDIDATES; i++) {
        if (!g.graph.build_plan_at_index(i).is_good()) continue;
        int64_t w = 0;
        if (!g.graph.get_workspace_size_plan_at_index(i, w).is_good() || w < 0 || (size_t)w > ws_cap) continue;
        std::string tag;
        if (g.graph.get_plan_name_at_index(i, tag).is_good() && !names.insert(tag).second) continue;
        candidates.push_back(i);
        workspaces.push_back(w);
        if (w > max_ws) max_ws = w;
    }
    if (candidates.empty()) {
        set_why(why, why_size, "no engine configuration builds within the workspace cap");
        return false;
    }
    const operand_bytes nb = bytes_of(p, op, p->float_out ? 4 : p->bf16 ? 2 : 4);
    const double t_run = seconds_now();
    int64_t best = candidates[0];
    size_t best_ws = (size_t)workspaces[0];
    conv_device_buffers buf;
    void *a = buf.get(nb.a), *b = buf.get(nb.b), *out = buf.get(nb.out), *wsp = buf.get((size_t)max_ws);
    if (a && b && out && wsp) {
        /* Without memory to measure in, the heuristics' first. */
        cudaStream_t stream = nullptr;
        cudnnGetStream(h, &stream);
        /* The buffers were cleared on the legacy stream, which the stage's
         * non-blocking stream does not wait for: a clear of the workspace
         * (up to 4 GiB) still running would slow the first candidates'
         * timed runs and tilt the choice. */
        if (cudaStreamSynchronize(cudaStreamLegacy) != cudaSuccess) cudaGetLastError();
        auto pack = variant_pack(g, a, b, out);
        long k = fastest_candidate(
            stream, candidates.size(),
            [&](size_t j) { return g.graph.execute_plan_at_index(h, pack, wsp, candidates[j]).is_good(); },
            [&](size_t j, float ms) {
                std::string tag;
                if (conv_verbose() && g.graph.get_plan_name_at_index(candidates[j], tag).is_good())
                    fprintf(stderr, "conv-choice graph %s name=%s ms=%.4f ws=%lld\n", op_name(op), tag.c_str(),
                            (double)ms, (long long)workspaces[j]);
            },
            ms_out);
        if (k >= 0) best = candidates[k], best_ws = (size_t)workspaces[k];
    }
    if (conv_verbose())
        fprintf(stderr, "conv-choice graph %s seconds: %zu plans built in %.3f, measured in %.3f\n", op_name(op),
                candidates.size(), t_run - t_build, seconds_now() - t_run);
    std::string tag;
    if (!g.graph.get_plan_name_at_index(best, tag).is_good() || tag.empty() || tag.size() >= name_size) {
        set_why(why, why_size, "the chosen engine configuration has no usable name");
        return false;
    }
    snprintf(name, name_size, "%s", tag.c_str());
    *ws = best_ws;
    return true;
}

extern "C" bool conv_graph_run(cudnnHandle_t h, const struct conv_graph_problem *p, enum conv_graph_op op,
                               const char *name, const void *a, const void *b, void *out, void *ws, char *why,
                               size_t why_size)
{
    cache_key key;
    if (!key_here(p, op, name, &key, why, why_size)) return false;
    built *g = nullptr;
    /* Under the lock to the launch: a plan's first execution fills its
     * variant-pack template. */
    std::lock_guard<std::mutex> lock(plans_mu);
    {
        auto it = plans.find(key);
        if (it != plans.end()) {
            g = it->second.get();
        } else {
            auto fresh = std::make_unique<built>();
            fe::error_t st = make_graph(h, p, op, *fresh);
            if (!st.is_good()) {
                set_why(why, why_size, st.get_message());
                return false;
            }
            for (int64_t i = 0; i < fresh->graph.get_execution_plan_count() && fresh->index < 0; i++) {
                std::string tag;
                if (fresh->graph.get_plan_name_at_index(i, tag).is_good() && tag == name) fresh->index = i;
            }
            if (fresh->index < 0) {
                set_why(why, why_size, std::string("cuDNN no longer offers engine configuration ") + name);
                return false;
            }
            st = fresh->graph.build_plan_at_index(fresh->index);
            if (!st.is_good()) {
                set_why(why, why_size, st.get_message());
                return false;
            }
            g = fresh.get();
            plans.emplace(key, std::move(fresh));
        }
    }
    auto pack = variant_pack(*g, a, b, out);
    fe::error_t st = g->graph.execute_plan_at_index(h, pack, ws, g->index);
    if (!st.is_good()) {
        set_why(why, why_size, st.get_message());
        return false;
    }
    return true;
}

/* ---- a result added into its output (beta 1) ----
 * cudnn-frontend's graphs (above) build every convolution with beta 0
 * (its node/conv_*.h set it so), so a result added into its output went
 * through a buffer and an add, or to the legacy API's algorithms with
 * beta 1 (conv_algos.cu, choose_accumulation): 0.50 ms against the graph
 * API's 0.20 plus an add of 0.43 for the data gradient of ResNet-50's
 * layer1 block inputs in tf32 on an H100. cuDNN's backend convolution
 * operations take beta themselves (CUDNN_ATTR_OPERATION_CONVOLUTION_*_BETA),
 * and cudnn-frontend's descriptor builders (its v0.x API) set it: the
 * graph API's engines, each adding in its own epilogue. Engines that do
 * not take beta 1 are not offered or fail to build; the candidates follow
 * the same rules as the graph's (numerical and behaviour notes). */

namespace {

namespace cf = cudnn_frontend;

cudnnBackendDescriptorType_t beta_kind(conv_graph_op op)
{
    return op == CONV_GRAPH_FPROP   ? CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR
           : op == CONV_GRAPH_DGRAD ? CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR
                                    : CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR;
}

/* Tensor ids of the variant pack. */
const int64_t BETA_IMG = 'x', BETA_W = 'w', BETA_COL = 'y';

/* One problem's operation graph with beta 1 and its candidate engine
 * configurations, in cuDNN's order (heuristics mode A, then its fallback
 * list). Throws cudnn_frontend's exceptions. */
struct beta_graph {
    cf::OperationGraph graph;
    cf::EngineConfigList configs;
};

/* Whether a configuration breaks the problem's rules (make_graph's). */
bool beta_banned(cudnnBackendDescriptor_t c, const conv_graph_problem *p)
{
    if (cf::hasNumericalNote<CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS>(c)) return true;
    if (!p->nondeterministic && (cf::hasNumericalNote<CUDNN_NUMERICAL_NOTE_REDUCED_PRECISION_REDUCTION>(c) ||
                                 cf::hasNumericalNote<CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC>(c)))
        return true;
    if (!p->bf16 && !p->tf32 && cf::hasNumericalNote<CUDNN_NUMERICAL_NOTE_TENSOR_CORE>(c)) return true;
    if (p->precise && (cf::hasNumericalNote<CUDNN_NUMERICAL_NOTE_FFT>(c) ||
                       cf::hasNumericalNote<CUDNN_NUMERICAL_NOTE_WINOGRAD>(c) ||
                       cf::hasNumericalNote<CUDNN_NUMERICAL_NOTE_WINOGRAD_TILE_4x4>(c) ||
                       cf::hasNumericalNote<CUDNN_NUMERICAL_NOTE_WINOGRAD_TILE_6x6>(c) ||
                       cf::hasNumericalNote<CUDNN_NUMERICAL_NOTE_WINOGRAD_TILE_13x13>(c)))
        return true;
    return runtime_compiled_scope() == RTC_OFF && cf::hasBehaviorNote<CUDNN_BEHAVIOR_NOTE_RUNTIME_COMPILATION>(c);
}

std::unique_ptr<beta_graph> make_beta_graph(cudnnHandle_t h, const conv_graph_problem *p, conv_graph_op op)
{
    const int nd = p->nd, ns = nd - 2;
    const cudnnDataType_t io = p->bf16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_FLOAT;
    auto tensor = [&](int64_t id, const int64_t *d) {
        std::vector<int64_t> dims(d, d + nd), strides = packed_strides(dims, p->nhwc);
        return cf::TensorBuilder()
            .setDim(nd, dims.data())
            .setStride(nd, strides.data())
            .setId(id)
            .setAlignment(16)
            .setDataType(io)
            .build();
    };
    cf::Tensor img = tensor(BETA_IMG, p->img), w = tensor(BETA_W, p->w), col = tensor(BETA_COL, p->col);
    cf::ConvDesc conv = cf::ConvDescBuilder()
                            .setComputeType(CUDNN_DATA_FLOAT)
                            .setMathMode(CUDNN_CROSS_CORRELATION)
                            .setSpatialDimCount(ns)
                            .setSpatialStride(ns, p->stride)
                            .setPrePadding(ns, p->pad)
                            .setPostPadding(ns, p->pad)
                            .setDilation(ns, p->dilation)
                            .build();
    cf::OperationBuilder b(beta_kind(op));
    if (op == CONV_GRAPH_FPROP) b.setxDesc(img).setwDesc(w).setyDesc(col);
    else if (op == CONV_GRAPH_DGRAD) b.setdxDesc(img).setwDesc(w).setdyDesc(col);
    else b.setxDesc(img).setdwDesc(w).setdyDesc(col);
    cf::Operation operation = b.setcDesc(conv).setAlpha(1.0f).setBeta(1.0f).build();
    const cf::Operation *ops[1] = {&operation};
    auto g = std::unique_ptr<beta_graph>(
        new beta_graph{cf::OperationGraphBuilder().setHandle(h).setOperationGraph(1, ops).build(), {}});
    auto banned = [p](cudnnBackendDescriptor_t c) { return beta_banned(c, p); };
    for (cudnnBackendHeurMode_t mode : {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK}) {
        auto heur = cf::EngineHeuristicsBuilder().setOperationGraph(g->graph).setHeurMode(mode).build();
        cf::filter(heur.getEngineConfig(heur.getEngineConfigCount()), g->configs, banned);
    }
    return g;
}

/* Engine configuration k of g built into a plan; its name is the plan's
 * tag (engine and knobs, as the graph's names). Throws on failure. */
cf::ExecutionPlan build_beta_plan(cudnnHandle_t h, const beta_graph &g, size_t k)
{
    return cf::ExecutionPlanBuilder().setHandle(h).setEngineConfig(g.configs[k]).build();
}

/* The variant pack of one call: a and b as conv_graph_run names them,
 * FPROP (img, w), DGRAD (col, w), WGRAD (img, col); out the third.
 * Throws on failure. */
cf::VariantPack beta_pack(conv_graph_op op, const void *a, const void *b, void *out, void *ws)
{
    int64_t uids[3];
    void *ptrs[3] = {const_cast<void *>(a), const_cast<void *>(b), out};
    if (op == CONV_GRAPH_FPROP) uids[0] = BETA_IMG, uids[1] = BETA_W, uids[2] = BETA_COL;
    else if (op == CONV_GRAPH_DGRAD) uids[0] = BETA_COL, uids[1] = BETA_W, uids[2] = BETA_IMG;
    else uids[0] = BETA_IMG, uids[1] = BETA_COL, uids[2] = BETA_W;
    return cf::VariantPackBuilder().setWorkspacePointer(ws).setDataPointers(3, ptrs).setUids(3, uids).build();
}

std::mutex beta_mu;
std::map<cache_key, std::unique_ptr<cf::ExecutionPlan>> beta_plans; /* kept for the process's life */

} // namespace

extern "C" bool conv_graph_beta_choose(const struct conv_graph_problem *p, enum conv_graph_op op, size_t ws_cap,
                                       char *name, size_t name_size, size_t *ws, float *ms_out, char *why,
                                       size_t why_size)
{
    *ms_out = -1;
    own_handle own;
    cudnnHandle_t h = own.h;
    if (!h) {
        set_why(why, why_size, "cudnnCreate failed");
        return false;
    }
    try {
        std::unique_ptr<beta_graph> g = make_beta_graph(h, p, op);
        std::vector<cf::ExecutionPlan> plans;
        std::set<std::string> names; /* each configuration once, as above */
        int64_t max_ws = 0;
        for (size_t k = 0; k < g->configs.size() && (int)plans.size() < MAX_CANDIDATES; k++) {
            try {
                cf::ExecutionPlan plan = build_beta_plan(h, *g, k);
                int64_t w = plan.getWorkspaceSize();
                if (w < 0 || (size_t)w > ws_cap) continue;
                if (barred(plan.getTag()) || !names.insert(plan.getTag()).second) continue;
                if (w > max_ws) max_ws = w;
                plans.push_back(std::move(plan));
            } catch (cf::cudnnException &) {
                continue; /* this engine does not take the problem with beta 1 */
            }
        }
        if (plans.empty()) {
            set_why(why, why_size, "no engine configuration builds with beta 1 within the workspace cap");
            return false;
        }
        const operand_bytes nb = bytes_of(p, op, p->bf16 ? 2 : 4); /* the output in the storage type */
        conv_device_buffers buf;
        void *a = buf.get(nb.a), *b = buf.get(nb.b), *out = buf.get(nb.out), *wsp = buf.get((size_t)max_ws);
        if (!a || !b || !out || !wsp) {
            set_why(why, why_size, "no memory to measure in");
            return false;
        }
        cudaStream_t stream = nullptr;
        cudnnGetStream(h, &stream);
        if (cudaStreamSynchronize(cudaStreamLegacy) != cudaSuccess) cudaGetLastError(); /* the clears */
        /* One pack for every candidate, made before the timing: its host
         * time between a timed run's events would count against the
         * candidates. */
        cf::VariantPack pack = beta_pack(op, a, b, out, wsp);
        float best_ms = -1;
        long best = fastest_candidate(
            stream, plans.size(),
            [&](size_t k) {
                return cudnnBackendExecute(h, plans[k].get_raw_desc(), pack.get_raw_desc()) == CUDNN_STATUS_SUCCESS;
            },
            [&](size_t k, float ms) {
                if (conv_verbose())
                    fprintf(stderr, "conv-choice graph-beta %s name=%s ms=%.4f ws=%lld\n", op_name(op),
                            plans[k].getTag().c_str(), (double)ms, (long long)plans[k].getWorkspaceSize());
            },
            &best_ms);
        if (best < 0) {
            set_why(why, why_size, "no engine configuration ran with beta 1");
            return false;
        }
        const std::string &tag = plans[best].getTag();
        if (tag.empty() || tag.size() >= name_size) {
            set_why(why, why_size, "the chosen engine configuration has no usable name");
            return false;
        }
        snprintf(name, name_size, "%s", tag.c_str());
        *ws = (size_t)plans[best].getWorkspaceSize();
        *ms_out = best_ms;
        return true;
    } catch (cf::cudnnException &e) {
        set_why(why, why_size, e.what());
    } catch (std::exception &e) {
        set_why(why, why_size, e.what());
    }
    return false;
}

extern "C" bool conv_graph_beta_run(cudnnHandle_t h, const struct conv_graph_problem *p, enum conv_graph_op op,
                                    const char *name, const void *a, const void *b, void *out, void *ws, char *why,
                                    size_t why_size)
{
    cache_key key;
    if (!key_here(p, op, name, &key, why, why_size)) return false;
    std::lock_guard<std::mutex> lock(beta_mu);
    try {
        auto it = beta_plans.find(key);
        if (it == beta_plans.end()) {
            std::unique_ptr<beta_graph> g = make_beta_graph(h, p, op);
            std::unique_ptr<cf::ExecutionPlan> found;
            for (size_t k = 0; k < g->configs.size() && !found; k++) {
                try {
                    cf::ExecutionPlan plan = build_beta_plan(h, *g, k);
                    if (plan.getTag() == name && !barred(name))
                        found.reset(new cf::ExecutionPlan(std::move(plan)));
                } catch (cf::cudnnException &) {
                }
            }
            if (!found) {
                set_why(why, why_size, std::string("cuDNN no longer offers engine configuration ") + name +
                                           " with beta 1");
                return false;
            }
            it = beta_plans.emplace(key, std::move(found)).first;
        }
        cf::VariantPack pack = beta_pack(op, a, b, out, ws);
        cudnnStatus_t st = cudnnBackendExecute(h, it->second->get_raw_desc(), pack.get_raw_desc());
        if (st != CUDNN_STATUS_SUCCESS) {
            set_why(why, why_size, cudnnGetErrorString(st));
            return false;
        }
        return true;
    } catch (cf::cudnnException &e) {
        set_why(why, why_size, e.what());
    } catch (std::exception &e) {
        set_why(why, why_size, e.what());
    }
    return false;
}
