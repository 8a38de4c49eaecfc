/* CUDA Attention through cuDNN's SDPA graphs (attention_graph.h).
 *
 * Each problem gets two graphs, the forward (sdpa, statistics generated)
 * and the backward (sdpa_backward), built once per GPU with the heuristics'
 * first plan that builds; both or neither are used, so that the forward
 * that saved the statistics and the backward that reads them are the same
 * implementation. Input and output data bfloat16, intermediate and compute
 * float32. Plans may be compiled at run time by cuDNN (its flash attention
 * engines for some shapes): seconds, once per problem. */
#include "backend/cuda/attention_graph.h"

#include <cuda_runtime.h>

#include <cudnn_frontend.h>

#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>

namespace fe = cudnn_frontend;
using tensor_ptr = std::shared_ptr<fe::graph::Tensor_attributes>;

namespace {

struct direction {
    fe::graph::Graph graph;
    tensor_ptr q, k, v, y, dy, lse, dq, dk, dv; /* the backward's y and dy are its O and dO */
    int64_t ws = 0;
};

struct entry {
    bool ok = false;
    std::string why;
    direction fwd, bwd;
};

const char *code_name(fe::error_code_t c)
{
    switch (c) {
    case fe::error_code_t::OK: return "OK";
    case fe::error_code_t::ATTRIBUTE_NOT_SET: return "ATTRIBUTE_NOT_SET";
    case fe::error_code_t::SHAPE_DEDUCTION_FAILED: return "SHAPE_DEDUCTION_FAILED";
    case fe::error_code_t::INVALID_TENSOR_NAME: return "INVALID_TENSOR_NAME";
    case fe::error_code_t::INVALID_VARIANT_PACK: return "INVALID_VARIANT_PACK";
    case fe::error_code_t::GRAPH_NOT_SUPPORTED: return "GRAPH_NOT_SUPPORTED";
    case fe::error_code_t::GRAPH_EXECUTION_PLAN_CREATION_FAILED: return "GRAPH_EXECUTION_PLAN_CREATION_FAILED";
    case fe::error_code_t::GRAPH_EXECUTION_FAILED: return "GRAPH_EXECUTION_FAILED";
    case fe::error_code_t::HEURISTIC_QUERY_FAILED: return "HEURISTIC_QUERY_FAILED";
    case fe::error_code_t::UNSUPPORTED_GRAPH_FORMAT: return "UNSUPPORTED_GRAPH_FORMAT";
    case fe::error_code_t::CUDA_API_FAILED: return "CUDA_API_FAILED";
    case fe::error_code_t::CUDNN_BACKEND_API_FAILED: return "CUDNN_BACKEND_API_FAILED";
    case fe::error_code_t::INVALID_CUDA_DEVICE: return "INVALID_CUDA_DEVICE";
    case fe::error_code_t::HANDLE_ERROR: return "HANDLE_ERROR";
    case fe::error_code_t::INVALID_VALUE: return "INVALID_VALUE";
    default: return "error";
    }
}

/* "cudnn-frontend <what> <call>: <status>: <message>". */
std::string describe(const char *what, const char *call, fe::error_t &st)
{
    return std::string("cudnn-frontend ") + what + " " + call + ": " + code_name(st.get_code()) + ": " +
           st.get_message();
}

void set_why(char *why, size_t size, const std::string &text)
{
    if (size) snprintf(why, size, "%s", text.c_str());
}

/* A [B, H, T, n] view with the problem's batch, head and token strides. */
tensor_ptr view(fe::graph::Graph &g, const char *name, const attn_graph_problem *p, int64_t t, int64_t n,
                const int64_t *stride)
{
    return g.tensor(fe::graph::Tensor_attributes()
                        .set_name(name)
                        .set_dim({p->batch, p->heads, t, n})
                        .set_stride({stride[0], stride[1], stride[2], 1})
                        .set_data_type(fe::DataType_t::BFLOAT16));
}

void set_view(tensor_ptr &t, const attn_graph_problem *p, int64_t len, int64_t n, const int64_t *stride)
{
    t->set_output(true)
        .set_dim({p->batch, p->heads, len, n})
        .set_stride({stride[0], stride[1], stride[2], 1})
        .set_data_type(fe::DataType_t::BFLOAT16);
}

std::vector<int64_t> lse_dim(const attn_graph_problem *p) { return {p->batch, p->heads, p->q_len, 1}; }
std::vector<int64_t> lse_stride(const attn_graph_problem *p) { return {p->heads * p->q_len, p->q_len, 1, 1}; }

/* Validates, builds and checks graph g, builds its first supported plan
 * and reads its workspace; the failing call into *why. */
bool finish(cudnnHandle_t h, const char *what, direction &d, std::string &why)
{
    fe::graph::Graph &g = d.graph;
    fe::error_t st = g.validate();
    if (!st.is_good()) return why = describe(what, "validate", st), false;
    st = g.build_operation_graph(h);
    if (!st.is_good()) return why = describe(what, "build_operation_graph", st), false;
    st = g.create_execution_plans({fe::HeurMode_t::A});
    if (!st.is_good()) return why = describe(what, "create_execution_plans", st), false;
    st = g.check_support(h);
    if (!st.is_good()) return why = describe(what, "check_support", st), false;
    st = g.build_plans(fe::BuildPlanPolicy_t::HEURISTICS_CHOICE);
    if (!st.is_good()) return why = describe(what, "build_plans", st), false;
    st = g.get_workspace_size(d.ws);
    if (!st.is_good()) return why = describe(what, "get_workspace_size", st), false;
    return true;
}

bool build(cudnnHandle_t h, const attn_graph_problem *p, entry &e)
{
    auto types = [](fe::graph::Graph &g) {
        g.set_io_data_type(fe::DataType_t::BFLOAT16)
            .set_intermediate_data_type(fe::DataType_t::FLOAT)
            .set_compute_data_type(fe::DataType_t::FLOAT);
    };
    {
        direction &d = e.fwd;
        types(d.graph);
        d.q = view(d.graph, "Q", p, p->q_len, p->head_size, p->q_stride);
        d.k = view(d.graph, "K", p, p->kv_len, p->head_size, p->k_stride);
        d.v = view(d.graph, "V", p, p->kv_len, p->v_head_size, p->v_stride);
        auto o = fe::graph::SDPA_attributes()
                     .set_name("sdpa")
                     .set_generate_stats(true)
                     .set_causal_mask(p->causal)
                     .set_attn_scale(p->scale);
        auto out = d.graph.sdpa(d.q, d.k, d.v, o);
        d.y = out[0], d.lse = out[1];
        set_view(d.y, p, p->q_len, p->v_head_size, p->y_stride);
        d.lse->set_output(true).set_dim(lse_dim(p)).set_stride(lse_stride(p)).set_data_type(fe::DataType_t::FLOAT);
        if (!finish(h, "sdpa", d, e.why)) return false;
    }
    {
        direction &d = e.bwd;
        types(d.graph);
        d.q = view(d.graph, "Q", p, p->q_len, p->head_size, p->q_stride);
        d.k = view(d.graph, "K", p, p->kv_len, p->head_size, p->k_stride);
        d.v = view(d.graph, "V", p, p->kv_len, p->v_head_size, p->v_stride);
        d.y = view(d.graph, "O", p, p->q_len, p->v_head_size, p->y_stride);
        d.dy = view(d.graph, "dO", p, p->q_len, p->v_head_size, p->y_stride);
        d.lse = d.graph.tensor(fe::graph::Tensor_attributes()
                                   .set_name("Stats")
                                   .set_dim(lse_dim(p))
                                   .set_stride(lse_stride(p))
                                   .set_data_type(fe::DataType_t::FLOAT));
        auto o = fe::graph::SDPA_backward_attributes()
                     .set_name("sdpa_backward")
                     .set_causal_mask(p->causal)
                     .set_attn_scale(p->scale);
        if (p->deterministic) o.set_deterministic_algorithm(true);
        auto out = d.graph.sdpa_backward(d.q, d.k, d.v, d.y, d.dy, d.lse, o);
        d.dq = out[0], d.dk = out[1], d.dv = out[2];
        set_view(d.dq, p, p->q_len, p->head_size, p->q_stride);
        set_view(d.dk, p, p->kv_len, p->head_size, p->k_stride);
        set_view(d.dv, p, p->kv_len, p->v_head_size, p->v_stride);
        if (!finish(h, p->deterministic ? "sdpa_backward (deterministic)" : "sdpa_backward", d, e.why)) return false;
    }
    return true;
}

struct cache_key {
    int device;
    std::string problem;
    bool operator<(const cache_key &o) const
    {
        if (device != o.device) return device < o.device;
        return problem < o.problem;
    }
};

std::mutex plans_mu;
std::map<cache_key, std::unique_ptr<entry>> plans; /* kept for the process's life */

std::string problem_bytes(const attn_graph_problem *p)
{
    attn_graph_problem q;
    memset(&q, 0, sizeof q); /* padding too */
    q.batch = p->batch, q.heads = p->heads, q.q_len = p->q_len, q.kv_len = p->kv_len;
    q.head_size = p->head_size, q.v_head_size = p->v_head_size;
    memcpy(q.q_stride, p->q_stride, sizeof q.q_stride);
    memcpy(q.k_stride, p->k_stride, sizeof q.k_stride);
    memcpy(q.v_stride, p->v_stride, sizeof q.v_stride);
    memcpy(q.y_stride, p->y_stride, sizeof q.y_stride);
    q.causal = p->causal, q.scale = p->scale, q.deterministic = p->deterministic;
    return std::string((const char *)&q, sizeof q);
}

/* The problem's entry on the current GPU, built the first time; under
 * plans_mu. NULL when the device cannot be named. */
entry *lookup(cudnnHandle_t h, const attn_graph_problem *p, std::string &why)
{
    int device = 0;
    if (cudaGetDevice(&device) != cudaSuccess) {
        cudaGetLastError();
        why = "cudaGetDevice failed";
        return nullptr;
    }
    cache_key key{device, problem_bytes(p)};
    auto it = plans.find(key);
    if (it != plans.end()) return it->second.get();
    auto fresh = std::make_unique<entry>();
    fresh->ok = build(h, p, *fresh);
    entry *e = fresh.get();
    plans.emplace(key, std::move(fresh));
    return e;
}

} // namespace

extern "C" bool attn_graph_supported(cudnnHandle_t h, const struct attn_graph_problem *p, size_t *fwd_ws,
                                     size_t *bwd_ws, char *why, size_t why_size)
{
    std::lock_guard<std::mutex> lock(plans_mu);
    std::string reason;
    entry *e = lookup(h, p, reason);
    if (!e || !e->ok) {
        set_why(why, why_size, e ? e->why : reason);
        return false;
    }
    *fwd_ws = (size_t)e->fwd.ws;
    *bwd_ws = (size_t)e->bwd.ws;
    return true;
}

extern "C" bool attn_graph_forward(cudnnHandle_t h, const struct attn_graph_problem *p, const void *q,
                                   const void *k, const void *v, void *y, float *lse, void *ws, char *why,
                                   size_t why_size)
{
    /* Under the lock to the launch: a plan's first execution fills its
     * variant-pack template. */
    std::lock_guard<std::mutex> lock(plans_mu);
    std::string reason;
    entry *e = lookup(h, p, reason);
    if (!e || !e->ok) {
        set_why(why, why_size, e ? e->why : reason);
        return false;
    }
    direction &d = e->fwd;
    std::unordered_map<int64_t, void *> pack = {
        {d.q->get_uid(), const_cast<void *>(q)}, {d.k->get_uid(), const_cast<void *>(k)},
        {d.v->get_uid(), const_cast<void *>(v)}, {d.y->get_uid(), y}, {d.lse->get_uid(), lse}};
    fe::error_t st = d.graph.execute(h, pack, ws);
    if (!st.is_good()) {
        set_why(why, why_size, describe("sdpa", "execute", st));
        return false;
    }
    return true;
}

extern "C" bool attn_graph_backward(cudnnHandle_t h, const struct attn_graph_problem *p, const void *q,
                                    const void *k, const void *v, const void *y, const void *dy, const float *lse,
                                    void *dq, void *dk, void *dv, void *ws, char *why, size_t why_size)
{
    std::lock_guard<std::mutex> lock(plans_mu);
    std::string reason;
    entry *e = lookup(h, p, reason);
    if (!e || !e->ok) {
        set_why(why, why_size, e ? e->why : reason);
        return false;
    }
    direction &d = e->bwd;
    std::unordered_map<int64_t, void *> pack = {
        {d.q->get_uid(), const_cast<void *>(q)},    {d.k->get_uid(), const_cast<void *>(k)},
        {d.v->get_uid(), const_cast<void *>(v)},    {d.y->get_uid(), const_cast<void *>(y)},
        {d.dy->get_uid(), const_cast<void *>(dy)},  {d.lse->get_uid(), const_cast<float *>(lse)},
        {d.dq->get_uid(), dq},                      {d.dk->get_uid(), dk},
        {d.dv->get_uid(), dv}};
    fe::error_t st = d.graph.execute(h, pack, ws);
    if (!st.is_good()) {
        set_why(why, why_size, describe("sdpa_backward", "execute", st));
        return false;
    }
    return true;
}
