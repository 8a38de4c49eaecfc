/* Optimizers, learning-rate schedules and gradient clipping on float32
 * parameters, with PyTorch's float32 arithmetic reproduced bit for bit.
 *
 * The reference is torch 1.13's single-tensor (foreach=False) code on the CPU
 * (torch/optim/sgd.py, adamw.py; nn/utils/clip_grad.py), as Debian's build
 * runs it with AVX2. Python floats (lr, betas, ...) are doubles; PyTorch
 * converts each scalar to float32 where it meets a float32 tensor, and the
 * CPU kernels of add(alpha=) and addcmul fuse a multiply into the add (one
 * rounding, fmaf here), as GCC compiled them. Each update below lists the
 * PyTorch statements it follows, in order.
 *
 * Against torch 2.x (GP_TORCH_2 below): SGD is unchanged and matches; AdamW's
 * formulas are followed, but torch 2.15's CPU sqrt is not correctly rounded,
 * so its parameters differ from ours by an ulp in some elements (the moments
 * match); its clip_grad_norm_ takes norms with _foreach_norm, which sums in
 * another order. Tests pin the 1.13 behavior.
 *
 * Optimizer state is allocated once, at creation: a step allocates nothing.
 * Steps are elementwise, so they give the same bits with any thread count. */
#ifndef GP_TRAIN_OPTIM_H
#define GP_TRAIN_OPTIM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "util/error.h"

enum gp_optim_kind {
    GP_OPTIM_SGD,
    GP_OPTIM_ADAMW,
};

/* Whose AdamW arithmetic to follow. SGD is the same in both. */
enum gp_torch_arith {
    GP_TORCH_1_13 = 0, /* exp_avg.mul_(beta1).add_(grad, alpha=1-beta1); sqrt(bc2) by math.sqrt */
    GP_TORCH_2 = 1,    /* exp_avg.lerp_(grad, 1-beta1); sqrt(bc2) as bc2 ** 0.5 (pow) */
};

struct gp_optim_config {
    enum gp_optim_kind kind;
    double lr;           /* the base learning rate, which schedules scale */
    double weight_decay; /* SGD: L2 added to the gradient; AdamW: decoupled */
    /* SGD */
    double momentum, dampening;
    bool nesterov;
    /* AdamW */
    double beta1, beta2, eps;
    enum gp_torch_arith arith;
};

/* torch.optim.SGD's defaults (momentum 0, dampening 0, weight_decay 0). */
struct gp_optim_config gp_sgd_defaults(double lr);
/* torch.optim.AdamW's: betas (0.9, 0.999), eps 1e-8, weight_decay 1e-2. */
struct gp_optim_config gp_adamw_defaults(double lr);

/* PyTorch's own checks of the hyper-parameters. */
gp_status gp_optim_check(const struct gp_optim_config *cfg, struct gp_error *err);

/* float32 values of state per parameter element: SGD 1 with momentum else
 * 0, AdamW 2 (exp_avg, exp_avg_sq). Times 4 is the bytes per parameter the
 * memory planner charges. */
int gp_optim_state_floats(const struct gp_optim_config *cfg);

/* One parameter tensor: its values and its (accumulated) gradient. */
struct gp_param {
    const char *name;
    float *data;  /* [numel] */
    float *grad;  /* [numel] */
    int64_t numel;
};

/* An optimizer bound to its parameters. The fields are public for backends
 * that keep the state elsewhere and for checkpoints; use the functions. */
struct gp_optim {
    struct gp_optim_config cfg;
    int n_params;
    struct gp_param *params; /* a copy of the list given at creation */
    float **state[2];        /* per parameter: SGD momentum_buffer / AdamW exp_avg,
                                exp_avg_sq; slices of one allocation */
    void *block;
    bool owns_block;         /* false when the caller gave the state memory */
    size_t state_bytes;      /* bytes of that allocation */
    int64_t steps;           /* steps taken (PyTorch's state['step']) */
};

/* Binds an optimizer to `params` (pointers kept: the memory must outlive it)
 * and allocates its zeroed state, all at once. */
gp_status gp_optim_create(const struct gp_optim_config *cfg, const struct gp_param *params,
                          int n_params, struct gp_optim **out, struct gp_error *err);
void gp_optim_free(struct gp_optim *opt); /* NULL is fine */

/* The same with the state in memory the caller owns (a device's, say):
 * gp_optim_state_bytes_for() bytes, 64-byte aligned, already zeroed. */
size_t gp_optim_state_bytes_for(const struct gp_optim_config *cfg, const struct gp_param *params,
                                int n_params);
gp_status gp_optim_create_in(const struct gp_optim_config *cfg, const struct gp_param *params,
                             int n_params, void *state, struct gp_optim **out, struct gp_error *err);

/* One optimizer.step() with learning rate `lr` (from a schedule, or cfg.lr). */
void gp_optim_step(struct gp_optim *opt, double lr);

/* ---- one step's scalars, for steps that read them from device memory ----
 * Everything an update needs besides the tensors, as one struct a backend's
 * kernels read where it lies (device memory: a CUDA graph replays the same
 * kernels with another learning rate, step and clipping coefficient).
 *
 * The host fills the first part with gp_optim_scalars_for, in exactly the
 * double and float operations gp_sgd_update and gp_adamw_update use (the
 * bias corrections' pow() stays on the host: CUDA's pow differs from
 * glibc's in the last bits). The guard (gp_optim_guard, or a backend's
 * twin of it) fills the rest from the step's gradient norms and losses.
 * The layout is shared by C and CUDA code: plain types only. */
struct gp_optim_scalars {
    /* by the host, per step */
    double max_norm;    /* clip_grad_norm_'s max_norm; <= 0: no clipping */
    double denominator; /* the step's loss is (sum of its loss terms) / denominator */
    float wd, mom, damp1, neg_lr;                             /* SGD */
    float decay, b1, a1, a1m1, b2, a2, bc2_sqrt, neg_step, eps; /* AdamW */
    int32_t has_wd, has_mom, nesterov, first;                 /* SGD */
    int32_t lerp, lerp_small;                                 /* AdamW (torch 2's lerp) */
    /* by the guard */
    float total_norm;   /* the gradients' norm before clipping; 0 without clipping */
    float coef;         /* gradients are multiplied by it where it is below 1 (gp_clip_coef) */
    int32_t skip;       /* nonzero: the loss or the norm is not finite; the step changes nothing */
};

/* The scalars of step `step` (counting from 1: PyTorch's state['step']
 * after its increment) at learning rate `lr`, for cfg's optimizer; the
 * guard's part as for a step that is not clipped (coef 1, skip 0),
 * max_norm 0 and denominator 1. */
void gp_optim_scalars_for(const struct gp_optim_config *cfg, double lr, int64_t step,
                          struct gp_optim_scalars *out);

/* One step of every parameter with the given scalars, gp_optim_step's
 * arithmetic: nothing when s->skip; gradients first multiplied by s->coef
 * when it is below 1 (gp_scale_grads). opt->steps is left alone (the
 * caller counts the steps it applied). */
void gp_optim_apply(struct gp_optim *opt, const struct gp_optim_scalars *s);

/* The step's guard, on the host (a CPU stage; across processes, where the
 * norms and losses went through host memory):
 *   loss = (((0 + loss_parts[0]) + loss_parts[1]) + ...) / s->denominator,
 *     in double, m parts;
 *   with s->max_norm > 0: total_norm = gp_norm2_f32 of norms[order[0]],
 *     norms[order[1]], ..., norms[order[n - 1]] (the model's parameter
 *     order), coef = gp_clip_coef(total_norm, s->max_norm);
 *     otherwise total_norm 0 and coef 1, and norms are not read;
 *   skip when the loss or total_norm is not finite.
 * Writes total_norm, coef and skip of *s. */
void gp_optim_guard(const float *norms, const int32_t *order, int n, const double *loss_parts, int m,
                    struct gp_optim_scalars *s);

/* Bytes of optimizer state (what gp_optim_create allocated). */
size_t gp_optim_state_bytes(const struct gp_optim *opt);

/* clip_grad_norm_ over the optimizer's parameters, in their order (below);
 * returns the total norm before clipping. */
float gp_optim_clip_grad_norm(struct gp_optim *opt, double max_norm);

/* The updates on one tensor, for backends and tests.
 *   p, g, buf, exp_avg, exp_avg_sq  [n] float32
 * gp_sgd_update: `first` is true on the tensor's first step (PyTorch's
 * momentum_buffer is None then and becomes a copy of d_p).
 * gp_adamw_update: `step` counts from 1 (after state['step'] += 1). */
void gp_sgd_update(const struct gp_optim_config *cfg, double lr, bool first, float *p, const float *g,
                   float *buf, int64_t n);
void gp_adamw_update(const struct gp_optim_config *cfg, double lr, int64_t step, float *p,
                     const float *g, float *exp_avg, float *exp_avg_sq, int64_t n);

/* ---- learning-rate schedules ----
 * gp_schedule_lr(s, k) is the learning rate of optimizer step k, counting from 0
 * (the first step), i.e. with PyTorch schedulers stepped once per
 * optimizer step, the lr in force after k scheduler.step() calls. */
enum gp_lr_kind {
    GP_SCHEDULE_CONSTANT,
    /* StepLR: lr multiplied by gamma after every step_size steps. The
     * products are taken one at a time in double, as the chainable form
     * PyTorch's StepLR.get_lr uses (not gamma ** n). */
    GP_SCHEDULE_STEP,
    /* Linear warmup then cosine decay to min_lr:
     *   k < warmup:       base * (k + 1) / warmup   (the first step is not wasted at 0)
     *   warmup <= k < total:
     *       min_lr + (base - min_lr) * 0.5 * (1 + cos(pi * (k - warmup) / (total - warmup)))
     *   k >= total:       min_lr
     * evaluated in double in exactly this order. */
    GP_SCHEDULE_COSINE,
};

struct gp_schedule {
    enum gp_lr_kind kind;
    double base_lr;
    int64_t step_size; /* GP_SCHEDULE_STEP */
    double gamma;      /* GP_SCHEDULE_STEP */
    int64_t warmup_steps, total_steps; /* GP_SCHEDULE_COSINE */
    double min_lr;                      /* GP_SCHEDULE_COSINE */
};

gp_status gp_schedule_check(const struct gp_schedule *s, struct gp_error *err);
double gp_schedule_lr(const struct gp_schedule *s, int64_t step);

/* ---- gradient clipping: torch.nn.utils.clip_grad_norm_ (norm_type 2) ----
 * total_norm = norm(stack([norm(g) for g in grads])), every norm in float32
 * as ATen's CPU kernel computes it (gp_norm2_f32); clip_coef =
 * max_norm / (total_norm + 1e-6), which Python evaluates as
 * reciprocal(total_norm + 1e-6) * max_norm in float32; the gradients are
 * multiplied by min(clip_coef, 1) (PyTorch always multiplies; by 1 it is
 * exact, so this skips it). A NaN or infinite norm makes every gradient
 * NaN or zero, as in PyTorch with error_if_nonfinite=False.
 *
 * A pipeline computes gp_norm2_f32 of each of its stage's gradients, gathers
 * them in the model's parameter order (the order torch's parameters() gives;
 * it matters in the last bits) and applies gp_norm2_f32 to that list. */

/* torch.linalg.vector_norm(x) of a contiguous float32 tensor, bit for bit as
 * ATen 1.13's AVX2 kernel (norm_kernel_tensor_iterator_impl, reduce over the
 * last dimension): 8 float lanes accumulate x*x with fused multiply-adds
 * over the first n - n % 8 elements, the lanes are added left to right, then
 * the n % 8 remaining squares are added in order, the first four of them
 * (when there are at least four) rounded before the add and the others
 * fused, which is how GCC compiled that loop; sqrtf at the end. */
float gp_norm2_f32(const float *x, int64_t n);
/* The same of x[order[0]], x[order[1]], ..., x[order[n - 1]] (order NULL:
 * x[0 .. n)), bit for bit gp_norm2_f32 of those values gathered into one
 * array: a norm of norms without a gathered copy. */
float gp_norm2_f32_gather(const float *x, const int32_t *order, int64_t n);

/* The total norm of the parameters' gradients (as above). */
float gp_grad_norm(const struct gp_param *params, int n_params);
/* min(max_norm / (total_norm + 1e-6), 1) in PyTorch's float32 arithmetic. */
float gp_clip_coef(float total_norm, double max_norm);
/* grad *= coef for every parameter (nothing when coef is exactly 1). */
void gp_scale_grads(const struct gp_param *params, int n_params, float coef);
/* All three; returns the total norm before clipping, as PyTorch does. */
float gp_clip_grad_norm(const struct gp_param *params, int n_params, double max_norm);

#endif
