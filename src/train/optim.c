#include "train/optim.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Only the multiply-adds written as fmaf may fuse: PyTorch's kernels fuse
 * exactly those. (GCC in ISO C mode never contracts; clang must be told.) */
#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#endif

/* The element loops run with the FMA instruction where the CPU has it (one
 * clone per target, picked at load time); elsewhere fmaf is libm's, just as
 * exact, only slower. */
#if defined(__x86_64__) && defined(__has_attribute)
#if __has_attribute(target_clones)
#define GP_FMA_CLONES __attribute__((target_clones("fma", "default")))
#endif
#endif
#ifndef GP_FMA_CLONES
#define GP_FMA_CLONES
#endif

/* Elements per parallel chunk; tensors smaller than GP_PAR_MIN run on the
 * calling thread. Updates are elementwise: chunking changes no bits. */
#define GP_CHUNK 16384
#define GP_PAR_MIN (1 << 17)

struct gp_optim_config gp_sgd_defaults(double lr)
{
    return (struct gp_optim_config){.kind = GP_OPTIM_SGD, .lr = lr};
}

struct gp_optim_config gp_adamw_defaults(double lr)
{
    return (struct gp_optim_config){.kind = GP_OPTIM_ADAMW, .lr = lr, .weight_decay = 1e-2,
                                    .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8};
}

gp_status gp_optim_check(const struct gp_optim_config *c, struct gp_error *err)
{
    if (!(c->lr >= 0.0))
        return gp_error_set(err, GP_ERR_INVALID, "invalid learning rate: %g", c->lr);
    if (!(c->weight_decay >= 0.0))
        return gp_error_set(err, GP_ERR_INVALID, "invalid weight_decay value: %g", c->weight_decay);
    switch (c->kind) {
    case GP_OPTIM_SGD:
        if (!(c->momentum >= 0.0))
            return gp_error_set(err, GP_ERR_INVALID, "invalid momentum value: %g", c->momentum);
        if (c->nesterov && (c->momentum <= 0.0 || c->dampening != 0.0))
            return gp_error_set(err, GP_ERR_INVALID,
                                "nesterov momentum requires a momentum and zero dampening");
        return GP_OK;
    case GP_OPTIM_ADAMW:
        if (!(c->eps >= 0.0))
            return gp_error_set(err, GP_ERR_INVALID, "invalid epsilon value: %g", c->eps);
        if (!(c->beta1 >= 0.0 && c->beta1 < 1.0))
            return gp_error_set(err, GP_ERR_INVALID, "invalid beta parameter at index 0: %g", c->beta1);
        if (!(c->beta2 >= 0.0 && c->beta2 < 1.0))
            return gp_error_set(err, GP_ERR_INVALID, "invalid beta parameter at index 1: %g", c->beta2);
        return GP_OK;
    }
    return gp_error_set(err, GP_ERR_INVALID, "unknown optimizer kind %d", (int)c->kind);
}

int gp_optim_state_floats(const struct gp_optim_config *c)
{
    if (c->kind == GP_OPTIM_ADAMW) return 2;
    return c->momentum != 0.0 ? 1 : 0;
}

/* Floats of state per parameter kind, each slice rounded up to 16 floats
 * (64 bytes), so every slice starts on a 64-byte boundary. */
static size_t state_floats(const struct gp_param *params, int n_params)
{
    size_t floats = 0;
    for (int i = 0; i < n_params; i++) floats += ((size_t)params[i].numel + 15) & ~(size_t)15;
    return floats;
}

size_t gp_optim_state_bytes_for(const struct gp_optim_config *cfg, const struct gp_param *params,
                                int n_params)
{
    return state_floats(params, n_params) * (size_t)gp_optim_state_floats(cfg) * sizeof(float);
}

static gp_status create(const struct gp_optim_config *cfg, const struct gp_param *params, int n_params,
                        void *state, struct gp_optim **out, struct gp_error *err)
{
    *out = NULL;
    GP_TRY(gp_optim_check(cfg, err));
    if (n_params < 0) return gp_error_set(err, GP_ERR_INVALID, "negative parameter count");
    int nstate = gp_optim_state_floats(cfg);
    for (int i = 0; i < n_params; i++)
        if (params[i].numel < 0 || (params[i].numel > 0 && (!params[i].data || !params[i].grad)))
            return gp_error_set(err, GP_ERR_INVALID, "parameter '%s' has no data or gradient",
                                params[i].name ? params[i].name : "?");
    size_t floats = state_floats(params, n_params);
    struct gp_optim *opt = calloc(1, sizeof *opt);
    if (!opt) return gp_error_set(err, GP_ERR_NOMEM, "out of memory");
    opt->cfg = *cfg;
    opt->n_params = n_params;
    opt->params = malloc(sizeof *opt->params * (size_t)(n_params ? n_params : 1));
    for (int s = 0; s < 2; s++)
        opt->state[s] = calloc((size_t)(n_params ? n_params : 1), sizeof *opt->state[s]);
    opt->state_bytes = floats * (size_t)nstate * sizeof(float);
    opt->owns_block = state == NULL;
    if (state) opt->block = state;
    else if (opt->state_bytes) opt->block = aligned_alloc(64, opt->state_bytes);
    if (!opt->params || !opt->state[0] || !opt->state[1] || (opt->state_bytes && !opt->block)) {
        gp_optim_free(opt);
        return gp_error_set(err, GP_ERR_NOMEM, "out of memory for optimizer state (%zu bytes)",
                            (size_t)(floats * (size_t)nstate * sizeof(float)));
    }
    if (opt->block && opt->owns_block) memset(opt->block, 0, opt->state_bytes);
    memcpy(opt->params, params, sizeof *params * (size_t)n_params);
    float *cut = opt->block;
    for (int s = 0; s < nstate; s++)
        for (int i = 0; i < n_params; i++) {
            opt->state[s][i] = cut;
            cut += ((size_t)params[i].numel + 15) & ~(size_t)15;
        }
    *out = opt;
    return GP_OK;
}

gp_status gp_optim_create(const struct gp_optim_config *cfg, const struct gp_param *params,
                          int n_params, struct gp_optim **out, struct gp_error *err)
{
    return create(cfg, params, n_params, NULL, out, err);
}

gp_status gp_optim_create_in(const struct gp_optim_config *cfg, const struct gp_param *params,
                             int n_params, void *state, struct gp_optim **out, struct gp_error *err)
{
    return create(cfg, params, n_params, state, out, err);
}

void gp_optim_free(struct gp_optim *opt)
{
    if (!opt) return;
    if (opt->owns_block) free(opt->block);
    free(opt->params);
    free(opt->state[0]);
    free(opt->state[1]);
    free(opt);
}

size_t gp_optim_state_bytes(const struct gp_optim *opt)
{
    return opt->state_bytes;
}

/* ---- SGD ----
 * torch/optim/sgd.py, _single_tensor_sgd (1.13 and 2.x alike):
 *   d_p = d_p.add(param, alpha=weight_decay)          if weight_decay != 0
 *   buf = clone(d_p)                                   first step, momentum != 0
 *   buf.mul_(momentum).add_(d_p, alpha=1 - dampening)  later steps
 *   d_p = d_p.add(buf, alpha=momentum) if nesterov else buf
 *   param.add_(d_p, alpha=-lr)
 * add(x, alpha=a) is fma(x, a, self) in ATen's CPU kernel (ufunc add:
 * vec::fmadd, and the scalar tail contracted the same way). */
GP_FMA_CLONES
static void sgd_kernel(const struct gp_optim_scalars *s, float *p, const float *g, float *buf, int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        float d = g[i];
        if (s->has_wd) d = fmaf(p[i], s->wd, d);
        if (s->has_mom) {
            float b = s->first ? d : fmaf(d, s->damp1, buf[i] * s->mom);
            buf[i] = b;
            d = s->nesterov ? fmaf(b, s->mom, d) : b;
        }
        p[i] = fmaf(d, s->neg_lr, p[i]);
    }
}

/* gp_sgd_update's scalars: the hyper-parameters rounded to float32 where
 * they meet the tensors, as PyTorch's scalar arguments are. */
static void sgd_scalars(const struct gp_optim_config *c, double lr, bool first, struct gp_optim_scalars *s)
{
    s->wd = (float)c->weight_decay;
    s->mom = (float)c->momentum;
    s->damp1 = (float)(1.0 - c->dampening);
    s->neg_lr = (float)(-lr);
    s->has_wd = c->weight_decay != 0.0;
    s->has_mom = c->momentum != 0.0;
    s->nesterov = c->nesterov;
    s->first = first;
}

static void sgd_run(const struct gp_optim_scalars *s, float *p, const float *g, float *buf, int64_t n)
{
    if (n < GP_PAR_MIN) {
        sgd_kernel(s, p, g, buf, n);
        return;
    }
    int64_t chunks = (n + GP_CHUNK - 1) / GP_CHUNK;
#pragma omp parallel for schedule(static)
    for (int64_t k = 0; k < chunks; k++) {
        int64_t i0 = k * GP_CHUNK, len = n - i0 < GP_CHUNK ? n - i0 : GP_CHUNK;
        sgd_kernel(s, p + i0, g + i0, buf ? buf + i0 : NULL, len);
    }
}

void gp_sgd_update(const struct gp_optim_config *c, double lr, bool first, float *p, const float *g,
                   float *buf, int64_t n)
{
    struct gp_optim_scalars s;
    memset(&s, 0, sizeof s);
    sgd_scalars(c, lr, first, &s);
    sgd_run(&s, p, g, buf, n);
}

/* ---- AdamW ----
 * torch 1.13, torch/optim/adamw.py, _single_tensor_adamw (capturable=False,
 * amsgrad=False, maximize=False), per parameter:
 *   step_t += 1                            (a float32 tensor; step = step_t.item())
 *   param.mul_(1 - lr * weight_decay)      scalar in double, then float32
 *   exp_avg.mul_(beta1).add_(grad, alpha=1 - beta1)
 *                                          m = fma(g, (float)(1-b1), m * (float)b1)
 *   exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
 *                                          v = fma((float)(1-b2) * g, g, v * (float)b2)
 *                                          (addcmul's self + value*t1*t2, contracted)
 *   bias_correction1 = 1 - beta1 ** step   Python floats: double, pow()
 *   bias_correction2 = 1 - beta2 ** step
 *   step_size = lr / bias_correction1
 *   bias_correction2_sqrt = math.sqrt(bias_correction2)
 *   denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps)
 *                                          sqrtf(v) / (float)bc2_sqrt + (float)eps
 *   param.addcdiv_(exp_avg, denom, value=-step_size)
 *                                          p + ((float)(-step_size) * m) / denom
 * torch 2.x (GP_TORCH_2) differs in two places:
 *   exp_avg.lerp_(grad, 1 - beta1)         w = (float)(1-b1); ATen's lerp:
 *                                          |w| < 0.5 ? fma(w, g - m, m) : fma(w - 1, g - m, g)
 *   bias_correction2_sqrt = bias_correction2 ** 0.5   pow(), which may differ from sqrt by an ulp
 * and skips param.mul_ when weight_decay == 0, a multiply by exactly 1. */
GP_FMA_CLONES
static void adamw_kernel(const struct gp_optim_scalars *s, float *p, const float *g, float *m, float *v,
                         int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        float pi = p[i] * s->decay;
        float gi = g[i];
        float mi;
        if (s->lerp) {
            float diff = gi - m[i];
            mi = s->lerp_small ? fmaf(s->a1, diff, m[i]) : fmaf(s->a1m1, diff, gi);
        } else {
            mi = fmaf(gi, s->a1, m[i] * s->b1);
        }
        float vi = fmaf(s->a2 * gi, gi, v[i] * s->b2);
        m[i] = mi;
        v[i] = vi;
        float denom = sqrtf(vi) / s->bc2_sqrt + s->eps;
        p[i] = pi + (s->neg_step * mi) / denom;
    }
}

/* gp_adamw_update's scalars, in double as Python computes them, each
 * rounded to float32 once where it meets a tensor. */
static void adamw_scalars(const struct gp_optim_config *c, double lr, int64_t step, struct gp_optim_scalars *s)
{
    /* state['step'] is a float32 tensor in PyTorch: past 2^24 it stops
     * counting. Bias corrections are 1 by then in double anyway. */
    double stepf = (double)(float)step;
    double bc1 = 1.0 - pow(c->beta1, stepf);
    double bc2 = 1.0 - pow(c->beta2, stepf);
    double step_size = lr / bc1;
    double bc2_sqrt = c->arith == GP_TORCH_2 ? pow(bc2, 0.5) : sqrt(bc2);
    s->decay = (float)(1.0 - lr * c->weight_decay);
    s->b1 = (float)c->beta1;
    s->a1 = (float)(1.0 - c->beta1);
    s->a1m1 = s->a1 - 1.0f;
    s->b2 = (float)c->beta2;
    s->a2 = (float)(1.0 - c->beta2);
    s->bc2_sqrt = (float)bc2_sqrt;
    s->neg_step = (float)(-step_size);
    s->eps = (float)c->eps;
    s->lerp = c->arith == GP_TORCH_2;
    s->lerp_small = fabsf(s->a1) < 0.5f;
}

static void adamw_run(const struct gp_optim_scalars *s, float *p, const float *g, float *exp_avg,
                      float *exp_avg_sq, int64_t n)
{
    if (n < GP_PAR_MIN) {
        adamw_kernel(s, p, g, exp_avg, exp_avg_sq, n);
        return;
    }
    int64_t chunks = (n + GP_CHUNK - 1) / GP_CHUNK;
#pragma omp parallel for schedule(static)
    for (int64_t k = 0; k < chunks; k++) {
        int64_t i0 = k * GP_CHUNK, len = n - i0 < GP_CHUNK ? n - i0 : GP_CHUNK;
        adamw_kernel(s, p + i0, g + i0, exp_avg + i0, exp_avg_sq + i0, len);
    }
}

void gp_adamw_update(const struct gp_optim_config *c, double lr, int64_t step, float *p,
                     const float *g, float *exp_avg, float *exp_avg_sq, int64_t n)
{
    struct gp_optim_scalars s;
    memset(&s, 0, sizeof s);
    adamw_scalars(c, lr, step, &s);
    adamw_run(&s, p, g, exp_avg, exp_avg_sq, n);
}

void gp_optim_scalars_for(const struct gp_optim_config *cfg, double lr, int64_t step,
                          struct gp_optim_scalars *out)
{
    memset(out, 0, sizeof *out);
    out->denominator = 1.0;
    out->coef = 1.0f;
    if (cfg->kind == GP_OPTIM_SGD) sgd_scalars(cfg, lr, step == 1, out);
    else adamw_scalars(cfg, lr, step, out);
}

void gp_optim_apply(struct gp_optim *opt, const struct gp_optim_scalars *s)
{
    if (s->skip) return;
    if (s->coef < 1.0f) gp_scale_grads(opt->params, opt->n_params, s->coef);
    for (int i = 0; i < opt->n_params; i++) {
        const struct gp_param *q = &opt->params[i];
        if (opt->cfg.kind == GP_OPTIM_SGD) sgd_run(s, q->data, q->grad, opt->state[0][i], q->numel);
        else adamw_run(s, q->data, q->grad, opt->state[0][i], opt->state[1][i], q->numel);
    }
}

void gp_optim_step(struct gp_optim *opt, double lr)
{
    opt->steps++;
    struct gp_optim_scalars s;
    gp_optim_scalars_for(&opt->cfg, lr, opt->steps, &s);
    gp_optim_apply(opt, &s);
}

/* ---- learning-rate schedules ---- */

gp_status gp_schedule_check(const struct gp_schedule *s, struct gp_error *err)
{
    if (!(s->base_lr >= 0.0))
        return gp_error_set(err, GP_ERR_INVALID, "invalid learning rate: %g", s->base_lr);
    switch (s->kind) {
    case GP_SCHEDULE_CONSTANT: return GP_OK;
    case GP_SCHEDULE_STEP:
        if (s->step_size < 1)
            return gp_error_set(err, GP_ERR_INVALID, "step schedule: step_size must be at least 1, not %lld",
                                (long long)s->step_size);
        if (!(s->gamma > 0.0))
            return gp_error_set(err, GP_ERR_INVALID, "step schedule: gamma must be positive, not %g", s->gamma);
        return GP_OK;
    case GP_SCHEDULE_COSINE:
        if (s->warmup_steps < 0 || s->total_steps <= s->warmup_steps)
            return gp_error_set(err, GP_ERR_INVALID,
                                "cosine schedule: need 0 <= warmup_steps (%lld) < total_steps (%lld)",
                                (long long)s->warmup_steps, (long long)s->total_steps);
        if (!(s->min_lr >= 0.0 && s->min_lr <= s->base_lr))
            return gp_error_set(err, GP_ERR_INVALID,
                                "cosine schedule: min_lr %g must lie in [0, the base lr %g]", s->min_lr,
                                s->base_lr);
        return GP_OK;
    }
    return gp_error_set(err, GP_ERR_INVALID, "unknown schedule kind %d", (int)s->kind);
}

double gp_schedule_lr(const struct gp_schedule *s, int64_t step)
{
    if (step < 0) step = 0;
    switch (s->kind) {
    case GP_SCHEDULE_CONSTANT: return s->base_lr;
    case GP_SCHEDULE_STEP: {
        double lr = s->base_lr;
        for (int64_t k = step / s->step_size; k > 0; k--) lr = lr * s->gamma;
        return lr;
    }
    case GP_SCHEDULE_COSINE: {
        if (step < s->warmup_steps) return s->base_lr * (double)(step + 1) / (double)s->warmup_steps;
        if (step >= s->total_steps) return s->min_lr;
        double progress = (double)(step - s->warmup_steps) / (double)(s->total_steps - s->warmup_steps);
        return s->min_lr + (s->base_lr - s->min_lr) * 0.5 * (1.0 + cos(M_PI * progress));
    }
    }
    return s->base_lr;
}

/* ---- gradient norm and clipping ---- */

/* The tail of ATen's kernel: n % 8 squares added one by one to the folded
 * lanes; GCC computed the first four products as a vector (rounded, then
 * added) and fused the rest. */
static float norm2_tail(float sum, const float *x, int t)
{
    int k = 0;
    if (t >= 4)
        for (; k < 4; k++) {
            float sq = x[k] * x[k];
            sum = sum + sq;
        }
    for (; k < t; k++) sum = fmaf(x[k], x[k], sum);
    return sum;
}

GP_FMA_CLONES
static void norm2_lanes(float lane[8], const float *x, int64_t n8)
{
    for (int64_t d = 0; d < n8; d += 8)
        for (int j = 0; j < 8; j++) lane[j] = fmaf(x[d + j], x[d + j], lane[j]);
}

float gp_norm2_f32(const float *x, int64_t n)
{
    float lane[8] = {0};
    int64_t n8 = n - n % 8;
    norm2_lanes(lane, x, n8);
    float sum = lane[0];
    for (int j = 1; j < 8; j++) sum = sum + lane[j];
    return sqrtf(norm2_tail(sum, x + n8, (int)(n % 8)));
}

/* gp_norm2_f32's lanes and tail fed one value at a time, for a norm of
 * values that are not one array: value k of n goes to lane k % 8 while
 * k < n - n % 8, the rest form the tail. */
struct norm2_stream {
    float lane[8], tail[8];
    int64_t n8, k;
};

static void norm2_stream_init(struct norm2_stream *s, int64_t n)
{
    memset(s, 0, sizeof *s);
    s->n8 = n - n % 8;
}

static void norm2_stream_add(struct norm2_stream *s, float v)
{
    if (s->k < s->n8) s->lane[s->k % 8] = fmaf(v, v, s->lane[s->k % 8]);
    else s->tail[s->k - s->n8] = v;
    s->k++;
}

static float norm2_stream_end(const struct norm2_stream *s)
{
    float sum = s->lane[0];
    for (int j = 1; j < 8; j++) sum = sum + s->lane[j];
    return sqrtf(norm2_tail(sum, s->tail, (int)(s->k - s->n8)));
}

float gp_norm2_f32_gather(const float *x, const int32_t *order, int64_t n)
{
    struct norm2_stream s;
    norm2_stream_init(&s, n);
    for (int64_t k = 0; k < n; k++) norm2_stream_add(&s, x[order ? order[k] : k]);
    return norm2_stream_end(&s);
}

float gp_grad_norm(const struct gp_param *params, int n_params)
{
    /* torch.stack(norms) then the same kernel, streamed. */
    struct norm2_stream s;
    norm2_stream_init(&s, n_params);
    for (int k = 0; k < n_params; k++) norm2_stream_add(&s, gp_norm2_f32(params[k].grad, params[k].numel));
    return norm2_stream_end(&s);
}

float gp_clip_coef(float total_norm, double max_norm)
{
    /* clip_coef = max_norm / (total_norm + 1e-6): float / Tensor is
     * Tensor.__rdiv__, i.e. total.reciprocal() * max_norm. */
    float shifted = total_norm + (float)1e-6;
    float coef = (1.0f / shifted) * (float)max_norm;
    /* torch.clamp(coef, max=1.0) keeps a NaN */
    return coef > 1.0f ? 1.0f : coef;
}

void gp_optim_guard(const float *norms, const int32_t *order, int n, const double *loss_parts, int m,
                    struct gp_optim_scalars *s)
{
    double sum = 0;
    for (int j = 0; j < m; j++) sum += loss_parts[j];
    bool finite = isfinite(sum / s->denominator);
    s->total_norm = 0.0f;
    s->coef = 1.0f;
    if (s->max_norm > 0) {
        s->total_norm = gp_norm2_f32_gather(norms, order, n);
        s->coef = gp_clip_coef(s->total_norm, s->max_norm);
        finite = finite && isfinite(s->total_norm);
    }
    s->skip = !finite;
}

void gp_scale_grads(const struct gp_param *params, int n_params, float coef)
{
    if (coef == 1.0f) return;
    for (int k = 0; k < n_params; k++) {
        float *g = params[k].grad;
        int64_t n = params[k].numel;
#pragma omp parallel for schedule(static) if (n >= GP_PAR_MIN)
        for (int64_t i = 0; i < n; i++) g[i] = g[i] * coef;
    }
}

float gp_clip_grad_norm(const struct gp_param *params, int n_params, double max_norm)
{
    float total = gp_grad_norm(params, n_params);
    gp_scale_grads(params, n_params, gp_clip_coef(total, max_norm));
    return total;
}

float gp_optim_clip_grad_norm(struct gp_optim *opt, double max_norm)
{
    return gp_clip_grad_norm(opt->params, opt->n_params, max_norm);
}
