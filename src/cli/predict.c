/* gpipe-onnx predict: a model's outputs for the samples of a .npy file.
 * Built on the public API (include/gpipe_onnx.h) alone. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "gpipe_onnx.h"

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
    struct gpo_predict_options po;
    gpo_predict_options_init(&po);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            help(stdout);
            return GP_EXIT_OK;
        } else if (!strcmp(a, "--mode")) {
            if (!v || (strcmp(v, "eval") && strcmp(v, "train")))
                return gp_cli_usage("predict", "--mode is eval or train (got '%s')", v ? v : "");
            po.batch_statistics = !strcmp(v, "train");
            i++;
        } else if (!strcmp(a, "--precision")) {
            if (!gpo_precision_parse(v, &po.precision))
                return gp_cli_usage("predict", "--precision takes fp32, tf32 or bf16, not '%s'", v ? v : "");
            i++;
        } else if (!strcmp(a, "--layout")) {
            if (!gpo_layout_parse(v, &po.layout))
                return gp_cli_usage("predict", "--layout takes auto, nchw or nhwc, not '%s'", v ? v : "");
            i++;
        } else if (!strcmp(a, "--device")) {
            struct gpo_device d[GPO_MAX_STAGES];
            int n = 0;
            if (!gp_cli_parse_devices("predict", v, &n, d)) return GP_EXIT_USAGE;
            if (n != 1) return gp_cli_usage("predict", "--device takes one device (got '%s')", v);
            po.device = v;
            i++;
        } else if (!strcmp(a, "--data") || !strcmp(a, "--output") || !strcmp(a, "--batch")) {
            if (!v) return gp_cli_usage("predict", "%s needs a value", a);
            i++;
            if (a[2] == 'd') data = v;
            else if (a[2] == 'o') output = v;
            else if (!gp_cli_parse_int("predict", a, v, 1, (int64_t)1 << 31, &po.batch)) return GP_EXIT_USAGE;
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
    gpo_model *m = NULL;
    struct gpo_tensor y = {0};
    int status = GP_EXIT_OK;
    if (gpo_open(model, NULL, &m) != GPO_OK || gpo_check_output(m, output) != GPO_OK ||
        gpo_predict_file(m, data, &po, &y) != GPO_OK || gpo_tensor_write_npy(m, &y, output) != GPO_OK)
        status = gp_cli_fail("%s", gpo_last_error(m));
    gpo_tensor_free(&y);
    gpo_close(m);
    return status;
}
