/* Optimizers, schedules and clipping against PyTorch, bit for bit.
 *
 * The expected values were computed with torch 1.13 (Debian's build, CPU,
 * foreach=False) and pasted as hex float literals:
 *
 *   torch.manual_seed(42)
 *   p0 = randn(11) * 0.5, p0[3] = 0
 *   grads[s] = randn(11) * (0.1, 1, 3)[s], grads[1][5] = 0, grads[2][0] *= -50
 *   three opt.step() with lr = (lr, lr, lr / 2) set in param_groups
 *
 * want_t2_* come from the same run with torch 2.15 (AdamW's lerp). */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "train/optim.h"

static const float p0[11] = {
    0x1.58c55cp-3f, 0x1.07cd3ap-4f, 0x1.e02dcep-4f, 0.0f, -0x1.1f7384p-1f, -0x1.7d99bp-4f,
    0x1.1aa658p+0f, -0x1.46a78cp-2f, 0x1.d8bcacp-3f, 0x1.11c46ep-3f, 0x1.11df06p-2f};
static const float grads[33] = {
    0x1.4b8342p-4f, 0x1.c6c66p-4f, -0x1.5a1222p-3f, -0x1.9513f6p-4f, 0x1.8862ap-4f, 0x1.0ec5f6p-3f,
    0x1.4eb88ep-4f, -0x1.39bp-4f, -0x1.337476p-4f, 0x1.150076p-3f, 0x1.191e12p-4f, -0x1.4f9ff6p-2f,
    0x1.970624p-1f, 0x1.2046aap-2f, 0x1.cc177cp-5f, 0x1.0ba17p-1f, 0.0f, -0x1.98cee8p-5f,
    0x1.0d7c0ap-1f, -0x1.167d4cp-7f, 0x1.75476ep-1f, 0x1.10acbcp-3f, -0x1.03317cp+7f, -0x1.8604e4p+1f,
    -0x1.554788p+1f, 0x1.cc1f8ep-2f, -0x1.40dc7p-1f, -0x1.293b6ap+0f, 0x1.7ca2a4p+1f, 0x1.67597cp+0f,
    -0x1.3ac682p-1f, -0x1.1c8222p+1f, 0x1.15e492p+0f};
/* sgd {'lr': 0.1} */
static const float want_sgd_plain[11] = {
    0x1.ab1024p+2f, 0x1.025e26p-3f, 0x1.ea109ap-3f, -0x1.2a15f6p-6f, -0x1.2f1378p-1f, -0x1.8bf04cp-5f,
    0x1.e78b24p-1f, -0x1.bc944p-2f, 0x1.146718p-2f, 0x1.445cb8p-3f, 0x1.8b430cp-3f};
/* sgd {'lr': 0.05, 'momentum': 0.9} */
static const float want_sgd_momentum[11] = {
    0x1.b61aeap+1f, 0x1.1f548ap-4f, 0x1.76af96p-3f, -0x1.00162ep-8f, -0x1.307c58p-1f, -0x1.451eeap-4f,
    0x1.062218p+0f, -0x1.88a068p-2f, 0x1.0598c6p-2f, 0x1.eeca6p-4f, 0x1.c8320cp-3f};
static const float want_sgd_momentum_buf[11] = {
    -0x1.03a6f4p+7f, -0x1.1eed5ep+1f, -0x1.465e42p+1f, 0x1.addaf4p-2f, -0x1.421dcp-4f, -0x1.0dd0f8p+0f,
    0x1.7f5becp+1f, 0x1.d0bcb6p+0f, -0x1.5dd24cp-1f, -0x1.74fea4p+0f, 0x1.42cce2p+0f};
/* sgd {'lr': 0.05, 'momentum': 0.9, 'nesterov': True, 'weight_decay': 0.001} */
static const float want_sgd_nesterov_wd[11] = {
    0x1.965da4p+2f, 0x1.9b622ap-4f, 0x1.e62272p-3f, -0x1.9d5f74p-7f, -0x1.36806ep-1f, -0x1.dda562p-5f,
    0x1.e9503cp-1f, -0x1.bce322p-2f, 0x1.1703cep-2f, 0x1.13413cp-3f, 0x1.84f0b8p-3f};
static const float want_sgd_nesterov_wd_buf[11] = {
    -0x1.03a6b6p+7f, -0x1.1eeaeep+1f, -0x1.465382p+1f, 0x1.addf4ap-2f, -0x1.48a33p-4f, -0x1.0de36ep+0f,
    0x1.7fbd84p+1f, 0x1.d081e4p+0f, -0x1.5d7e0ap-1f, -0x1.74ed66p+0f, 0x1.42fa8ep+0f};
/* sgd {'lr': 0.01, 'momentum': 0.8, 'dampening': 0.3, 'weight_decay': 0.0005} */
static const float want_sgd_dampening_wd[11] = {
    0x1.3f31cap-1f, 0x1.09ed6cp-4f, 0x1.04e22ap-3f, -0x1.bca03p-16f, -0x1.21fc6p-1f, -0x1.786df4p-4f,
    0x1.17a984p+0f, -0x1.4f4c92p-2f, 0x1.e090b6p-3f, 0x1.0d30acp-3f, 0x1.0b2662p-2f};
static const float want_sgd_dampening_wd_buf[11] = {
    -0x1.6b659ep+6f, -0x1.9ddaa8p+0f, -0x1.d116e8p+0f, 0x1.217b22p-2f, -0x1.5ce762p-4f, -0x1.74d8dep-1f,
    0x1.0db23cp+1f, 0x1.3a6006p+0f, -0x1.ee86d4p-2f, -0x1.0f9a04p+0f, 0x1.c1d7eep-1f};
/* adamw {'lr': 0.001} */
static const float want_adamw_default[11] = {
    0x1.58853ap-3f, 0x1.013b52p-4f, 0x1.e44d8ap-4f, 0x1.e550b4p-11f, -0x1.206082p-1f, -0x1.834054p-4f,
    0x1.1a41ep+0f, -0x1.46ac56p-2f, 0x1.dd07ap-3f, 0x1.0e5ee2p-3f, 0x1.0f78eap-2f};
static const float want_adamw_default_m[11] = {
    -0x1.9f7186p+3f, -0x1.cb1564p-3f, -0x1.051836p-2f, 0x1.57e25ep-5f, -0x1.01b16ep-7f, -0x1.afb4c2p-4f,
    0x1.32affp-2f, 0x1.73ca2cp-3f, -0x1.17db72p-4f, -0x1.2a655p-3f, 0x1.023d82p-3f};
static const float want_adamw_default_v[11] = {
    0x1.0cb9fcp+4f, 0x1.45522p-7f, 0x1.d8f164p-8f, 0x1.c2816p-13f, 0x1.61d086p-11f, 0x1.65f5fcp-10f,
    0x1.2211p-7f, 0x1.274e5cp-9f, 0x1.924e62p-12f, 0x1.67c6a6p-8f, 0x1.3ac5bcp-10f};
/* adamw {'lr': 0.03, 'betas': (0.8, 0.95), 'eps': 1e-06, 'weight_decay': 0.1} */
static const float want_adamw_custom[11] = {
    0x1.537514p-3f, 0x1.09206p-6f, 0x1.2a4a68p-3f, 0x1.990f38p-6f, -0x1.390f02p-1f, -0x1.0dffcep-3f,
    0x1.0d3e18p+0f, -0x1.4710a2p-2f, 0x1.2ad496p-2f, 0x1.55cd02p-4f, 0x1.8e6b86p-3f};
static const float want_adamw_custom_m[11] = {
    -0x1.9f61f2p+4f, -0x1.df3ae8p-2f, -0x1.050926p-1f, 0x1.610e54p-4f, -0x1.e25746p-6f, -0x1.b8e99p-3f,
    0x1.31c694p-1f, 0x1.6bad3cp-2f, -0x1.124848p-3f, -0x1.3e0932p-2f, 0x1.fa3f8p-3f};
static const float want_adamw_custom_v[11] = {
    0x1.a3e29p+9f, 0x1.faabp-2f, 0x1.7125fp-2f, 0x1.5e2c7ap-7f, 0x1.0e9322p-5f, 0x1.1750a8p-4f,
    0x1.c5309cp-2f, 0x1.ca855cp-4f, 0x1.39dba6p-6f, 0x1.17a6eap-2f, 0x1.eb4ab6p-5f};
static const float norm_x[40] = {
    0x1.74cac6p+0f, -0x1.6bd942p+0f, -0x1.34424cp+0f, 0x1.ebbff2p+0f, 0x1.9e87a2p-1f, -0x1.5ab638p+1f,
    -0x1.fd96fap-1f, 0x1.e60dap-1f, -0x1.949b38p-2f, 0x1.44b00ep+1f, 0x1.39694ap+1f, 0x1.91e35ap-3f,
    0x1.be0446p+1f, -0x1.5a48d2p+1f, 0x1.c0a2cap-2f, 0x1.1af2f6p+0f, -0x1.5b8582p+0f, 0x1.260cc2p+0f,
    0x1.80829ap-2f, -0x1.6e34bap-1f, -0x1.441acp-1f, 0x1.2d616ep+0f, -0x1.c7e9f8p+0f, 0x1.a3a5e4p-1f,
    0x1.ee608ap+1f, 0x1.030982p+1f, -0x1.6fb856p+1f, -0x1.213e7ep+1f, -0x1.169946p-2f, 0x1.a2aa34p+1f,
    0x1.4f3a2ep+0f, 0x1.26ea12p+0f, 0x1.2439dep+1f, 0x1.30297ap-5f, -0x1.ce493ep+1f, 0x1.d9d29ap+0f,
    -0x1.805a46p-1f, 0x1.08786ap+1f, -0x1.5f90b6p+0f, 0x1.460c7p+0f};
static const float norm_want[40] = {
    0x1.74cac6p+0f, 0x1.047606p+1f, 0x1.2ea5e6p+1f, 0x1.85efbp+1f, 0x1.9378f2p+1f, 0x1.09fdp+2f,
    0x1.11825cp+2f, 0x1.182d16p+2f, 0x1.1950a4p+2f, 0x1.44cc42p+2f, 0x1.689ffap+2f, 0x1.68d7fp+2f,
    0x1.a831bap+2f, 0x1.ca2b5p+2f, 0x1.cb06c2p+2f, 0x1.d071ep+2f, 0x1.d88042p+2f, 0x1.de2f76p+2f,
    0x1.dec9f4p+2f, 0x1.e0f8ep+2f, 0x1.e2ace6p+2f, 0x1.e8854ap+2f, 0x1.f5a40cp+2f, 0x1.f86042p+2f,
    0x1.18d884p+3f, 0x1.203722p+3f, 0x1.2e857ep+3f, 0x1.370b28p+3f, 0x1.372a58p+3f, 0x1.484c08p+3f,
    0x1.4af5ep+3f, 0x1.4d01d8p+3f, 0x1.54ed3ep+3f, 0x1.54edc6p+3f, 0x1.67fc2cp+3f, 0x1.6cd32ap+3f,
    0x1.6d9d68p+3f, 0x1.738b8cp+3f, 0x1.76228ep+3f, 0x1.78592ap+3f};
static const float clip_g[47] = {
    -0x1.9a1258p-2f, 0x1.06435ep+0f, -0x1.b7bc0cp-3f, -0x1.17371ap-2f, -0x1.fe9a1p+1f, -0x1.a0b416p+0f,
    0x1.a42bfp+0f, 0x1.eddf78p+0f, -0x1.2f8b74p+1f, -0x1.5bd766p+1f, -0x1.90797cp-1f, -0x1.a3b85p+0f,
    0x1.968a7ap+2f, -0x1.48aa78p+2f, 0x1.fb4afcp-2f, 0x1.2fb7f4p+2f, 0x1.586b04p+0f, -0x1.65de34p+1f,
    -0x1.31772cp+2f, -0x1.b436f4p+1f, -0x1.915aep+0f, -0x1.e9770cp-2f, -0x1.465b54p+0f, 0x1.6a95aep+1f,
    -0x1.1c0f38p-1f, 0x1.9758ccp+1f, 0x1.3ff44p-1f, -0x1.bbc98ep+0f, 0x1.f3e8a6p-1f, 0x1.921748p-1f,
    -0x1.23d0a2p+1f, -0x1.88dbccp+2f, -0x1.25a7b2p+2f, 0x1.36f088p+0f, 0x1.e547f8p+0f, 0x1.e00cc6p-1f,
    -0x1.9baaacp-4f, 0x1.95df0ep-4f, -0x1.ed2324p+1f, -0x1.099abp+1f, -0x1.9b9b84p+0f, 0x1.01ae5p+0f,
    0x1.7b4b6ep-1f, 0x1.8e825cp-4f, 0x1.37918p+0f, 0x1.36adc2p+2f, 0x1.2df166p+0f};
/* max_norm 1.0: total norm 0x1.1fc7a4p+4f */
static const float clip_want_1[47] = {
    -0x1.6cc976p-6f, 0x1.d29a2cp-5f, -0x1.872c94p-7f, -0x1.f0c328p-7f, -0x1.c63728p-3f, -0x1.72afb8p-4f,
    0x1.75c586p-4f, 0x1.b7557ep-4f, -0x1.0e062p-3f, -0x1.356dcap-3f, -0x1.643feap-5f, -0x1.755eaap-4f,
    0x1.69a568p-2f, -0x1.245ef6p-2f, 0x1.c3459ep-6f, 0x1.0e2db6p-2f, 0x1.32623p-4f, -0x1.3e5924p-3f,
    -0x1.0fbb8cp-2f, -0x1.840bp-3f, -0x1.65086ap-4f, -0x1.b369aep-6f, -0x1.225118p-4f, 0x1.428b46p-3f,
    -0x1.f9618p-6f, 0x1.6a5cf2p-3f, 0x1.1c9f06p-5f, -0x1.8ac784p-4f, 0x1.bcb408p-5f, 0x1.65b004p-5f,
    -0x1.0396eap-3f, -0x1.5d7988p-2f, -0x1.0539f4p-2f, 0x1.149a26p-4f, 0x1.afb0e2p-4f, 0x1.ab0994p-5f,
    -0x1.6e34b2p-8f, 0x1.690ceap-8f, -0x1.b6adf6p-3f, -0x1.d88be8p-4f, -0x1.6e2736p-4f, 0x1.ca7326p-5f,
    0x1.5168ap-5f, 0x1.62805ap-8f, 0x1.152958p-4f, 0x1.145ecp-2f, 0x1.0c995ap-4f};
/* max_norm 1000.0: total norm 0x1.1fc7a4p+4f */
static const float clip_want_1000[47] = {
    -0x1.9a1258p-2f, 0x1.06435ep+0f, -0x1.b7bc0cp-3f, -0x1.17371ap-2f, -0x1.fe9a1p+1f, -0x1.a0b416p+0f,
    0x1.a42bfp+0f, 0x1.eddf78p+0f, -0x1.2f8b74p+1f, -0x1.5bd766p+1f, -0x1.90797cp-1f, -0x1.a3b85p+0f,
    0x1.968a7ap+2f, -0x1.48aa78p+2f, 0x1.fb4afcp-2f, 0x1.2fb7f4p+2f, 0x1.586b04p+0f, -0x1.65de34p+1f,
    -0x1.31772cp+2f, -0x1.b436f4p+1f, -0x1.915aep+0f, -0x1.e9770cp-2f, -0x1.465b54p+0f, 0x1.6a95aep+1f,
    -0x1.1c0f38p-1f, 0x1.9758ccp+1f, 0x1.3ff44p-1f, -0x1.bbc98ep+0f, 0x1.f3e8a6p-1f, 0x1.921748p-1f,
    -0x1.23d0a2p+1f, -0x1.88dbccp+2f, -0x1.25a7b2p+2f, 0x1.36f088p+0f, 0x1.e547f8p+0f, 0x1.e00cc6p-1f,
    -0x1.9baaacp-4f, 0x1.95df0ep-4f, -0x1.ed2324p+1f, -0x1.099abp+1f, -0x1.9b9b84p+0f, 0x1.01ae5p+0f,
    0x1.7b4b6ep-1f, 0x1.8e825cp-4f, 0x1.37918p+0f, 0x1.36adc2p+2f, 0x1.2df166p+0f};

/* torch 2.15.0+cu132 AdamW {'lr': 0.001} */
static const float want_t2_b09_m[11] = {
    -0x1.9f7184p+3f, -0x1.cb1564p-3f, -0x1.051836p-2f, 0x1.57e25cp-5f, -0x1.01b164p-7f, -0x1.afb4c2p-4f,
    0x1.32affp-2f, 0x1.73ca2ap-3f, -0x1.17db7p-4f, -0x1.2a654ep-3f, 0x1.023d82p-3f};
static const float want_t2_b09_v[11] = {
    0x1.0cb9fcp+4f, 0x1.45522p-7f, 0x1.d8f164p-8f, 0x1.c2816p-13f, 0x1.61d086p-11f, 0x1.65f5fcp-10f,
    0x1.2211p-7f, 0x1.274e5cp-9f, 0x1.924e62p-12f, 0x1.67c6a6p-8f, 0x1.3ac5bcp-10f};
/* torch 2.15.0+cu132 AdamW {'lr': 0.005, 'betas': (0.3, 0.99), 'weight_decay': 0.05} */
static const float want_t2_b03_m[11] = {
    -0x1.6b2022p+6f, -0x1.f57fap+0f, -0x1.d161cap+0f, 0x1.47c8ap-2f, -0x1.4a9edep-2f, -0x1.9bdc38p-1f,
    0x1.09c326p+1f, 0x1.169afcp+0f, -0x1.bf5b08p-2f, -0x1.64ef9cp+0f, 0x1.959448p-1f};
static const float want_t2_b03_v[11] = {
    0x1.4fe878p+7f, 0x1.9668b4p-4f, 0x1.278a06p-4f, 0x1.194c96p-9f, 0x1.b88c86p-8f, 0x1.bf593ap-7f,
    0x1.6a93c2p-4f, 0x1.70b4f4p-6f, 0x1.f6bfe8p-9f, 0x1.c14d1cp-5f, 0x1.8962b6p-7f};

/* torch.optim.lr_scheduler.StepLR(step_size=3, gamma=0.1) from lr 0.1: the lr of steps 0..11 */
static const double step_lrs[12] = {
    0x1.999999999999ap-4, 0x1.999999999999ap-4, 0x1.999999999999ap-4,
    0x1.47ae147ae147cp-7, 0x1.47ae147ae147cp-7, 0x1.47ae147ae147cp-7,
    0x1.0624dd2f1a9fdp-10, 0x1.0624dd2f1a9fdp-10, 0x1.0624dd2f1a9fdp-10,
    0x1.a36e2eb1c432fp-14, 0x1.a36e2eb1c432fp-14, 0x1.a36e2eb1c432fp-14};

/* The cosine formula of optim.h in Python (math.cos): base 0.1, warmup 4,
 * total 20, min_lr 1e-3, steps 0..22 */
static const double cos_lrs[23] = {
    0x1.999999999999ap-6, 0x1.999999999999ap-5, 0x1.3333333333334p-4,
    0x1.999999999999ap-4, 0x1.999999999999ap-4, 0x1.95b444f485afap-4,
    0x1.8a2a9ab2360e8p-4, 0x1.776e1ccacb4bfp-4, 0x1.5e371ed32626fp-4,
    0x1.3f7db0987a047p-4, 0x1.1c7015b5effc0p-4, 0x1.ecce4fda02eb5p-5,
    0x1.9db22d0e56042p-5, 0x1.4e960a42a91d1p-5, 0x1.02842eb0cc105p-5,
    0x1.78d1f1d76ffeep-6, 0x1.fbd871d97ee98p-7, 0x1.3220821c55c16p-7,
    0x1.387925c1ff5a1p-8, 0x1.ff7a0674151e8p-10, 0x1.0624dd2f1a9fcp-10,
    0x1.0624dd2f1a9fcp-10, 0x1.0624dd2f1a9fcp-10};

#define N 11

static void assert_bits(const float *got, const float *want, int n, const char *what)
{
    for (int i = 0; i < n; i++)
        if (memcmp(&got[i], &want[i], sizeof(float)) != 0)
            fail_msg("%s[%d]: got %a, PyTorch %a", what, i, got[i], want[i]);
}

/* Three steps over p0/grads with lr, lr, lr/2; returns the optimizer. */
static struct gp_optim *run3(const struct gp_optim_config *cfg, float *p, float *g)
{
    memcpy(p, p0, sizeof p0);
    struct gp_param prm = {.name = "w", .data = p, .grad = g, .numel = N};
    struct gp_optim *opt = NULL;
    struct gp_error err = {0};
    if (gp_optim_create(cfg, &prm, 1, &opt, &err) != GP_OK) fail_msg("%s", err.msg);
    const double lrs[3] = {cfg->lr, cfg->lr, cfg->lr * 0.5};
    for (int s = 0; s < 3; s++) {
        memcpy(g, grads + s * N, sizeof(float) * N);
        gp_optim_step(opt, lrs[s]);
    }
    return opt;
}

static void test_sgd(void **state)
{
    (void)state;
    float p[N], g[N];
    struct gp_optim_config c = gp_sgd_defaults(0.1);
    struct gp_optim *o = run3(&c, p, g);
    assert_bits(p, want_sgd_plain, N, "sgd");
    assert_int_equal(gp_optim_state_bytes(o), 0);
    gp_optim_free(o);

    c = gp_sgd_defaults(0.05);
    c.momentum = 0.9;
    o = run3(&c, p, g);
    assert_bits(p, want_sgd_momentum, N, "sgd momentum");
    assert_bits(o->state[0][0], want_sgd_momentum_buf, N, "momentum_buffer");
    gp_optim_free(o);

    c.nesterov = true;
    c.weight_decay = 1e-3;
    o = run3(&c, p, g);
    assert_bits(p, want_sgd_nesterov_wd, N, "sgd nesterov");
    assert_bits(o->state[0][0], want_sgd_nesterov_wd_buf, N, "momentum_buffer");
    gp_optim_free(o);

    c = gp_sgd_defaults(0.01);
    c.momentum = 0.8;
    c.dampening = 0.3;
    c.weight_decay = 5e-4;
    o = run3(&c, p, g);
    assert_bits(p, want_sgd_dampening_wd, N, "sgd dampening");
    assert_bits(o->state[0][0], want_sgd_dampening_wd_buf, N, "momentum_buffer");
    gp_optim_free(o);
}

static void test_adamw(void **state)
{
    (void)state;
    float p[N], g[N];
    struct gp_optim_config c = gp_adamw_defaults(1e-3);
    struct gp_optim *o = run3(&c, p, g);
    assert_int_equal(o->steps, 3);
    assert_bits(p, want_adamw_default, N, "adamw");
    assert_bits(o->state[0][0], want_adamw_default_m, N, "exp_avg");
    assert_bits(o->state[1][0], want_adamw_default_v, N, "exp_avg_sq");
    gp_optim_free(o);

    c = gp_adamw_defaults(3e-2);
    c.beta1 = 0.8;
    c.beta2 = 0.95;
    c.eps = 1e-6;
    c.weight_decay = 0.1;
    o = run3(&c, p, g);
    assert_bits(p, want_adamw_custom, N, "adamw custom");
    assert_bits(o->state[0][0], want_adamw_custom_m, N, "exp_avg");
    assert_bits(o->state[1][0], want_adamw_custom_v, N, "exp_avg_sq");
    gp_optim_free(o);
}

/* torch 2.x's exp_avg.lerp_: both of ATen's branches (weight 0.1 and 0.7).
 * Only the moments are compared: torch 2.15's CPU sqrt is not correctly
 * rounded, so its parameters differ from any exact sqrt by an ulp. */
static void test_adamw_torch2_moments(void **state)
{
    (void)state;
    float p[N], g[N];
    struct gp_optim_config c = gp_adamw_defaults(1e-3);
    c.arith = GP_TORCH_2;
    struct gp_optim *o = run3(&c, p, g);
    assert_bits(o->state[0][0], want_t2_b09_m, N, "exp_avg (lerp, weight 0.1)");
    assert_bits(o->state[1][0], want_t2_b09_v, N, "exp_avg_sq");
    gp_optim_free(o);
    c = gp_adamw_defaults(5e-3);
    c.arith = GP_TORCH_2;
    c.beta1 = 0.3;
    c.beta2 = 0.99;
    c.weight_decay = 0.05;
    o = run3(&c, p, g);
    assert_bits(o->state[0][0], want_t2_b03_m, N, "exp_avg (lerp, weight 0.7)");
    assert_bits(o->state[1][0], want_t2_b03_v, N, "exp_avg_sq");
    gp_optim_free(o);
}

/* torch.norm of every prefix of norm_x: all eight tail lengths, with and
 * without the 8-lane part. */
static void test_norm_matches_aten(void **state)
{
    (void)state;
    for (int k = 1; k <= 40; k++) {
        float got = gp_norm2_f32(norm_x, k);
        if (memcmp(&got, &norm_want[k - 1], sizeof got) != 0)
            fail_msg("norm of %d elements: got %a, PyTorch %a", k, got, norm_want[k - 1]);
    }
    assert_true(gp_norm2_f32(norm_x, 0) == 0.0f);
}

static void test_clip_grad_norm(void **state)
{
    (void)state;
    static const int sizes[5] = {13, 4, 20, 1, 9};
    float g[47];
    struct gp_param ps[5];
    for (int maxn = 0; maxn < 2; maxn++) {
        memcpy(g, clip_g, sizeof g);
        float *at = g;
        for (int i = 0; i < 5; i++) {
            ps[i] = (struct gp_param){.name = "g", .data = NULL, .grad = at, .numel = sizes[i]};
            at += sizes[i];
        }
        float total = gp_clip_grad_norm(ps, 5, maxn ? 1000.0 : 1.0);
        assert_true(total == 0x1.1fc7a4p+4f);
        assert_bits(g, maxn ? clip_want_1000 : clip_want_1, 47, maxn ? "unclipped" : "clipped");
    }
    /* through the optimizer: its parameters, in their order */
    memcpy(g, clip_g, sizeof g);
    float data[47] = {0};
    float *at = g, *dat = data;
    for (int i = 0; i < 5; i++) {
        ps[i] = (struct gp_param){.name = "g", .data = dat, .grad = at, .numel = sizes[i]};
        at += sizes[i];
        dat += sizes[i];
    }
    struct gp_optim *o;
    struct gp_error err = {0};
    struct gp_optim_config c = gp_sgd_defaults(0.1);
    assert_int_equal(gp_optim_create(&c, ps, 5, &o, &err), GP_OK);
    assert_true(gp_optim_clip_grad_norm(o, 1.0) == 0x1.1fc7a4p+4f);
    assert_bits(g, clip_want_1, 47, "clipped through the optimizer");
    gp_optim_free(o);
    /* a NaN gradient makes every gradient NaN, as in PyTorch */
    memcpy(g, clip_g, sizeof g);
    g[3] = NAN;
    assert_true(isnan(gp_clip_grad_norm(ps, 5, 1.0)));
    assert_true(isnan(g[40]));
}

static void test_schedules(void **state)
{
    (void)state;
    struct gp_error err = {0};
    struct gp_schedule s = {.kind = GP_SCHEDULE_STEP, .base_lr = 0.1, .step_size = 3, .gamma = 0.1};
    assert_int_equal(gp_schedule_check(&s, &err), GP_OK);
    for (int k = 0; k < 12; k++)
        if (gp_schedule_lr(&s, k) != step_lrs[k])
            fail_msg("StepLR at %d: %a, PyTorch %a", k, gp_schedule_lr(&s, k), step_lrs[k]);
    struct gp_schedule cs = {.kind = GP_SCHEDULE_COSINE, .base_lr = 0.1, .warmup_steps = 4,
                             .total_steps = 20, .min_lr = 1e-3};
    assert_int_equal(gp_schedule_check(&cs, &err), GP_OK);
    for (int k = 0; k < 23; k++)
        if (gp_schedule_lr(&cs, k) != cos_lrs[k])
            fail_msg("cosine at %d: %a, want %a", k, gp_schedule_lr(&cs, k), cos_lrs[k]);
    struct gp_schedule c0 = {.kind = GP_SCHEDULE_CONSTANT, .base_lr = 0.25};
    assert_true(gp_schedule_lr(&c0, 0) == 0.25 && gp_schedule_lr(&c0, 1000000) == 0.25);
    /* no warmup: the first step already decays from the base */
    cs.warmup_steps = 0;
    assert_true(gp_schedule_lr(&cs, 0) == 0.1);
    cs.warmup_steps = 20;
    assert_int_equal(gp_schedule_check(&cs, &err), GP_ERR_INVALID);
    gp_error_clear(&err);
    s.step_size = 0;
    assert_int_equal(gp_schedule_check(&s, &err), GP_ERR_INVALID);
}

static void test_config_checks_and_state_bytes(void **state)
{
    (void)state;
    struct gp_error err = {0};
    struct gp_optim_config c = gp_sgd_defaults(0.1);
    c.nesterov = true;
    assert_int_equal(gp_optim_check(&c, &err), GP_ERR_INVALID);
    gp_error_clear(&err);
    c = gp_adamw_defaults(1e-3);
    c.beta2 = 1.0;
    assert_int_equal(gp_optim_check(&c, &err), GP_ERR_INVALID);
    assert_non_null(strstr(err.msg, "index 1"));
    gp_error_clear(&err);
    c.beta2 = 0.999;
    c.lr = -1;
    assert_int_equal(gp_optim_check(&c, &err), GP_ERR_INVALID);

    assert_int_equal(gp_optim_state_floats(&(struct gp_optim_config){.kind = GP_OPTIM_SGD}), 0);
    assert_int_equal(gp_optim_state_floats(&(struct gp_optim_config){.kind = GP_OPTIM_SGD, .momentum = 0.9}), 1);
    assert_int_equal(gp_optim_state_floats(&(struct gp_optim_config){.kind = GP_OPTIM_ADAMW}), 2);

    /* 17 + 5 elements: slices of 32 and 16 floats, twice for AdamW */
    float a[17] = {0}, ga[17] = {0}, b[5] = {0}, gb[5] = {0};
    struct gp_param ps[2] = {{"a", a, ga, 17}, {"b", b, gb, 5}};
    struct gp_optim *o;
    c = gp_adamw_defaults(1e-3);
    gp_error_clear(&err);
    assert_int_equal(gp_optim_create(&c, ps, 2, &o, &err), GP_OK);
    assert_int_equal(gp_optim_state_bytes(o), 2 * (32 + 16) * sizeof(float));
    float *m0 = o->state[0][0], *v1 = o->state[1][1];
    assert_int_equal((uintptr_t)m0 % 64, 0);
    assert_int_equal((uintptr_t)o->state[0][1] % 64, 0);
    for (int s = 0; s < 5; s++) gp_optim_step(o, 1e-3);
    assert_ptr_equal(o->state[0][0], m0); /* the state never moves */
    assert_ptr_equal(o->state[1][1], v1);
    gp_optim_free(o);
    gp_optim_free(NULL);
}

/* A tensor big enough to be split across threads updates exactly as the
 * same elements one small piece at a time, with any thread count. */
static void test_large_tensors_are_exact(void **state)
{
    (void)state;
    const int64_t n = 300007;
    float *p1 = malloc(sizeof(float) * n), *p2 = malloc(sizeof(float) * n);
    float *g = malloc(sizeof(float) * n), *m1 = calloc(n, 4), *v1 = calloc(n, 4);
    float *m2 = calloc(n, 4), *v2 = calloc(n, 4);
    for (int64_t i = 0; i < n; i++) {
        p1[i] = p2[i] = p0[i % N] * (float)(1 + i % 7);
        g[i] = grads[i % 33] * (float)(1 + i % 5);
    }
    struct gp_optim_config c = gp_adamw_defaults(1e-2);
    int keep = omp_get_max_threads();
    omp_set_num_threads(4);
    for (int s = 1; s <= 3; s++) gp_adamw_update(&c, 1e-2, s, p1, g, m1, v1, n);
    omp_set_num_threads(keep);
    for (int s = 1; s <= 3; s++)
        for (int64_t i = 0; i < n; i += 1000)
            gp_adamw_update(&c, 1e-2, s, p2 + i, g + i, m2 + i, v2 + i, n - i < 1000 ? n - i : 1000);
    assert_memory_equal(p1, p2, sizeof(float) * n);
    assert_memory_equal(v1, v2, sizeof(float) * n);
    free(p1);
    free(p2);
    free(g);
    free(m1);
    free(v1);
    free(m2);
    free(v2);
}

/* A step's scalars (gp_optim_scalars_for, gp_optim_apply), the way a
 * pipeline takes its steps, give gp_optim_step's bits; a skipped step
 * changes nothing; the guard's norm of gathered norms is gp_norm2_f32 of
 * them gathered, its coefficient gp_clip_coef's, and it skips exactly on a
 * loss or a clipped norm that is not finite. */
static void test_scalars_and_guard(void **state)
{
    (void)state;
    enum { NP = 3, LEN = 37 };
    for (int kind = 0; kind < 2; kind++) {
        struct gp_optim_config c = kind ? gp_adamw_defaults(3e-3) : gp_sgd_defaults(0.1);
        if (!kind) c.momentum = 0.9, c.weight_decay = 1e-3;
        float p1[NP * LEN], p2[NP * LEN], g1[NP * LEN], g2[NP * LEN];
        for (int i = 0; i < NP * LEN; i++) p1[i] = p2[i] = p0[i % N] * (float)(1 + i % 3);
        struct gp_param a[NP], b[NP];
        for (int k = 0; k < NP; k++) {
            a[k] = (struct gp_param){"a", p1 + k * LEN, g1 + k * LEN, LEN};
            b[k] = (struct gp_param){"b", p2 + k * LEN, g2 + k * LEN, LEN};
        }
        struct gp_optim *oa, *ob;
        struct gp_error err = {0};
        assert_int_equal(gp_optim_create(&c, a, NP, &oa, &err), GP_OK);
        assert_int_equal(gp_optim_create(&c, b, NP, &ob, &err), GP_OK);
        for (int s = 0; s < 4; s++) {
            double lr = c.lr * (1.0 + 0.5 * s);
            for (int i = 0; i < NP * LEN; i++) g1[i] = g2[i] = grads[(i + 5 * s) % 33];
            gp_scale_grads(a, NP, 0.375f);
            gp_optim_step(oa, lr);
            struct gp_optim_scalars sc;
            gp_optim_scalars_for(&c, lr, ++ob->steps, &sc);
            sc.coef = 0.375f;
            gp_optim_apply(ob, &sc);
            assert_memory_equal(p1, p2, sizeof p1);
            assert_memory_equal(g1, g2, sizeof g1);
            assert_memory_equal(oa->block, ob->block, gp_optim_state_bytes(oa));
        }
        float before[NP * LEN];
        memcpy(before, p2, sizeof before);
        void *state_before = malloc(gp_optim_state_bytes(ob) + 1);
        memcpy(state_before, ob->block, gp_optim_state_bytes(ob));
        struct gp_optim_scalars skip;
        gp_optim_scalars_for(&c, 1.0, ob->steps + 1, &skip);
        skip.coef = 0.5f;
        skip.skip = 1;
        for (int i = 0; i < NP * LEN; i++) g2[i] = 1.0f;
        gp_optim_apply(ob, &skip);
        assert_memory_equal(p2, before, sizeof before);
        assert_memory_equal(ob->block, state_before, gp_optim_state_bytes(ob));
        for (int i = 0; i < NP * LEN; i++) assert_true(g2[i] == 1.0f); /* not even clipped */
        free(state_before);
        gp_optim_free(oa);
        gp_optim_free(ob);
    }

    /* the guard */
    float norms[40], gathered[40];
    int32_t order[40];
    for (int i = 0; i < 40; i++) norms[i] = fabsf(grads[i % 33]) * (float)(1 + i % 9) * 0.37f;
    for (int i = 0; i < 40; i++) order[i] = (int32_t)((i * 17 + 3) % 40);
    double losses[3] = {1.5, 2.25, 0.125};
    for (int n = 0; n <= 40; n++) {
        for (int i = 0; i < n; i++) gathered[i] = norms[order[i]];
        float want = gp_norm2_f32(gathered, n), got = gp_norm2_f32_gather(norms, order, n);
        assert_memory_equal(&got, &want, sizeof got);
        struct gp_optim_scalars s;
        gp_optim_scalars_for(&(struct gp_optim_config){.kind = GP_OPTIM_SGD}, 0.1, 1, &s);
        s.max_norm = 0.3;
        s.denominator = 8;
        gp_optim_guard(norms, order, n, losses, 3, &s);
        assert_memory_equal(&s.total_norm, &want, sizeof want);
        float coef = gp_clip_coef(want, 0.3);
        assert_memory_equal(&s.coef, &coef, sizeof coef);
        assert_int_equal(s.skip, 0);
        s.max_norm = 0;
        gp_optim_guard(norms, order, n, losses, 3, &s);
        assert_true(s.coef == 1.0f && s.total_norm == 0.0f && !s.skip);
    }
    struct gp_optim_scalars s;
    gp_optim_scalars_for(&(struct gp_optim_config){.kind = GP_OPTIM_SGD}, 0.1, 1, &s);
    s.max_norm = 0.3;
    losses[1] = NAN;
    gp_optim_guard(norms, order, 10, losses, 3, &s);
    assert_int_equal(s.skip, 1);
    losses[1] = 2.25;
    s.denominator = 0; /* no loss terms: the trainer's loss is not finite either */
    gp_optim_guard(norms, order, 10, losses, 3, &s);
    assert_int_equal(s.skip, 1);
    s.denominator = 8;
    norms[order[4]] = INFINITY;
    gp_optim_guard(norms, order, 10, losses, 3, &s);
    assert_int_equal(s.skip, 1);
    s.max_norm = 0; /* a norm that is not taken does not count */
    gp_optim_guard(norms, order, 10, losses, 3, &s);
    assert_int_equal(s.skip, 0);
}

/* ---- bulk checks: 1000 elements, five steps, compared by hash ----
 * Inputs come from an LCG both sides compute exactly (below); PyTorch's
 * results were hashed with FNV-1a over their float32 bytes (torch 1.13):
 * small tensors alone would miss roundings that differ in few elements. */

static uint64_t fnv(const void *data, size_t n, uint64_t h)
{
    const unsigned char *b = data;
    for (size_t i = 0; i < n; i++) {
        h ^= b[i];
        h *= 0x100000001b3ull;
    }
    return h;
}
#define FNV0 0xcbf29ce484222325ull

/* (((s >> 8) % 20001) - 10000) / 4096 * scale, every 17th value zero */
static void lcg_values(uint32_t *s, float *out, int n, double scale)
{
    for (int i = 0; i < n; i++) {
        *s = *s * 1664525u + 1013904223u;
        double v = (double)((int)((*s >> 8) % 20001) - 10000) / 4096.0;
        out[i] = i % 17 ? (float)(v * scale) : 0.0f;
    }
}

#define BULK 1000

static void run_bulk(const struct gp_optim_config *c, const uint64_t *want, const char *what)
{
    static const double scales[5] = {0x1p-4, 1.0, 0x1p3, 0x1p-1, 0x1p2};
    float p[BULK], g[BULK];
    uint32_t s = 12345;
    lcg_values(&s, p, BULK, 1.0);
    struct gp_param prm = {.name = "w", .data = p, .grad = g, .numel = BULK};
    struct gp_optim *o;
    struct gp_error err = {0};
    assert_int_equal(gp_optim_create(c, &prm, 1, &o, &err), GP_OK);
    for (int k = 0; k < 5; k++) {
        lcg_values(&s, g, BULK, scales[k]);
        gp_optim_step(o, c->lr * (k < 2 ? 1.0 : pow(0.7, (double)k)));
    }
    if (fnv(p, sizeof p, FNV0) != want[0]) fail_msg("%s: parameters differ from PyTorch's", what);
    if (fnv(o->state[0][0], sizeof p, FNV0) != want[1]) fail_msg("%s: first state differs", what);
    if (c->kind == GP_OPTIM_ADAMW && fnv(o->state[1][0], sizeof p, FNV0) != want[2])
        fail_msg("%s: exp_avg_sq differs", what);
    gp_optim_free(o);
}

static void test_bulk_against_pytorch(void **state)
{
    (void)state;
    struct gp_optim_config c = gp_sgd_defaults(0.02);
    c.momentum = 0.9;
    c.nesterov = true;
    c.weight_decay = 1e-2;
    run_bulk(&c, (const uint64_t[]){0x040bf0a170da0d62ull, 0x75c64e36281e44e0ull}, "sgd nesterov");
    c = gp_sgd_defaults(0.05);
    c.momentum = 0.7;
    c.dampening = 0.5;
    c.weight_decay = 3e-3;
    run_bulk(&c, (const uint64_t[]){0x64c8bc0af45cba69ull, 0xd7d4aa10da34eb3cull}, "sgd dampening");
    c = gp_adamw_defaults(1e-3);
    run_bulk(&c, (const uint64_t[]){0xc258877f8b61cbf5ull, 0xdba0da7ba11c885eull, 0x335a7d9c9112202cull},
             "adamw");
    c = gp_adamw_defaults(1e-2);
    c.beta1 = 0.5;
    c.beta2 = 0.9;
    c.eps = 1e-4;
    c.weight_decay = 0.3;
    run_bulk(&c, (const uint64_t[]){0xef345cb4378ffaaeull, 0x6feb429aceb97eccull, 0xda3410333bafd06dull},
             "adamw custom");

    /* clip_grad_norm_ over 21 fresh tensors (16 norms in lanes, 5 in the
     * tail) at 40 max norms 0.05 * 1.25^t: every total norm and gradient hashed */
    float g[3200];
    struct gp_param ps[21];
    int sizes[21], total = 0;
    for (int k = 0; k < 21; k++) {
        sizes[k] = 1 + (7 * k * k + 3 * k) % 290;
        total += sizes[k];
    }
    uint32_t s = 999;
    uint64_t h = FNV0;
    float tn = 0;
    for (int t = 0; t < 40; t++) {
        for (int k = 0, at = 0; k < 21; at += sizes[k], k++) {
            lcg_values(&s, g + at, sizes[k], pow(2.0, (double)(k % 5 - 2)));
            ps[k] = (struct gp_param){.name = "g", .grad = g + at, .numel = sizes[k]};
        }
        tn = gp_clip_grad_norm(ps, 21, 0.05 * pow(1.25, (double)t));
        h = fnv(&tn, sizeof tn, h);
        h = fnv(g, sizeof(float) * (size_t)total, h);
    }
    assert_true(tn == 0x1.2835aap+7f);
    if (h != 0x80521c56185f533full) fail_msg("clipping differs from PyTorch's");

    /* StepLR(step_size=2, gamma=0.9) from 0.3 over 40 steps */
    struct gp_schedule sch = {.kind = GP_SCHEDULE_STEP, .base_lr = 0.3, .step_size = 2, .gamma = 0.9};
    h = FNV0;
    for (int k = 0; k < 40; k++) {
        double lr = gp_schedule_lr(&sch, k);
        h = fnv(&lr, sizeof lr, h);
    }
    if (h != 0xe736f5991a5040b5ull) fail_msg("StepLR's learning rates differ from PyTorch's");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sgd),
        cmocka_unit_test(test_adamw),
        cmocka_unit_test(test_adamw_torch2_moments),
        cmocka_unit_test(test_norm_matches_aten),
        cmocka_unit_test(test_clip_grad_norm),
        cmocka_unit_test(test_schedules),
        cmocka_unit_test(test_config_checks_and_state_bytes),
        cmocka_unit_test(test_large_tensors_are_exact),
        cmocka_unit_test(test_scalars_and_guard),
        cmocka_unit_test(test_bulk_against_pytorch),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
