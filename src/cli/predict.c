/* gpipe-onnx predict: a model's outputs for the samples of a .npy file. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backends.h"
#include "cli/cli.h"
#include "data/npy.h"
#include "train/predict.h"

static void help(FILE *f)
{
    fputs("usage: gpipe-onnx predict MODEL.onnx --data X.npy --output Y.npy [--batch N]\n"
          "                          [--mode eval|train] [--device D] [--precision P] [--layout L]\n"
          "\n"
          "Runs the model forward in evaluation mode (BatchNorm running statistics, no\n"
          "dropout) on every sample of X and writes its first output, float32, one row per\n"
          "sample, to Y (atomically).\n"
          "\n"
          "options:\n"
          "  --batch N   samples per forward pass (default 32)\n"
          "  --mode M    eval (default) or train: BatchNorm normalizes each batch of N\n"
          "              with its own statistics, as in training (dropout stays off)\n"
          "  --device D  cpu:N (default) or cuda:N (or N)\n"
          "  --precision P  fp32 (default), tf32 or bf16, as for train\n"
          "  --layout L     auto (default), nchw or nhwc: activations channels-last, as for train\n"
          "  -h, --help  this help\n",
          f);
}

int gp_cmd_predict(int argc, char **argv)
{
    const char *model = NULL, *data = NULL, *output = NULL;
    int64_t batch = 32;
    bool training = false;
    enum gp_precision precision = GP_PRECISION_FP32;
    enum gp_layout_policy layout = GP_LAYOUT_AUTO;
    bool cuda[GP_CLI_MAX_DEVICES] = {false};
    int device[GP_CLI_MAX_DEVICES] = {0};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            help(stdout);
            return GP_EXIT_OK;
        } else if (!strcmp(a, "--mode")) {
            if (!v || (strcmp(v, "eval") && strcmp(v, "train")))
                return gp_cli_usage("predict", "--mode is eval or train (got '%s')", v ? v : "");
            training = !strcmp(v, "train");
            i++;
        } else if (!strcmp(a, "--precision")) {
            if (!v || !gp_precision_parse(v, &precision))
                return gp_cli_usage("predict", "--precision takes fp32, tf32 or bf16, not '%s'", v ? v : "");
            i++;
        } else if (!strcmp(a, "--layout")) {
            if (!v || !gp_layout_policy_parse(v, &layout))
                return gp_cli_usage("predict", "--layout takes auto, nchw or nhwc, not '%s'", v ? v : "");
            i++;
        } else if (!strcmp(a, "--device")) {
            int n = 0;
            if (!gp_cli_parse_devices("predict", v, &n, cuda, device)) return GP_EXIT_USAGE;
            if (n != 1) return gp_cli_usage("predict", "--device takes one device (got '%s')", v);
            i++;
        } else if (!strcmp(a, "--data") || !strcmp(a, "--output") || !strcmp(a, "--batch")) {
            if (!v) return gp_cli_usage("predict", "%s needs a value", a);
            i++;
            if (a[2] == 'd') data = v;
            else if (a[2] == 'o') output = v;
            else if (!gp_cli_parse_int("predict", a, v, 1, (int64_t)1 << 31, &batch)) return GP_EXIT_USAGE;
        } else if (a[0] == '-' && a[1]) {
            return gp_cli_usage("predict", "unknown option '%s'", a);
        } else if (!model) {
            model = a;
        } else {
            return gp_cli_usage("predict", "only one model (got '%s' and '%s')", model, a);
        }
    }
    if (!model || !data || !output)
        return gp_cli_usage("predict", "needs a model, --data and --output");
    const struct gp_device_ops *ops = gp_backend_find(cuda[0] ? "cuda" : "cpu");
    if (!ops) return gp_cli_fail("this build has no CUDA backend (rebuild with CUDA, or use --device cpu)");
    struct gp_predict_options po = {
        .batch = batch, .training = training, .precision = precision, .device_ops = ops, .device_index = device[0],
        .channels_last = gp_layout_policy_on(layout, cuda[0])};
    struct gp_error err = {0};
    struct gp_npy x = {0};
    struct gp_dataset ds = {0};
    struct gp_tensor y = {0};
    int status = GP_EXIT_OK;
    if (gp_npy_read(data, &x, &err) != GP_OK || gp_dataset_from_arrays(model, &x, NULL, &ds, &err) != GP_OK ||
        gp_predict(model, &ds, &po, &y, &err) != GP_OK ||
        gp_npy_write(output, y.dtype, &y.shape, y.data, &err) != GP_OK)
        status = gp_cli_fail("%s", err.msg);
    free(y.data);
    gp_dataset_free(&ds);
    gp_npy_free(&x);
    return status;
}
