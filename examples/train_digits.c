/* Trains the digits CNN for one epoch on two CPU devices through the
 * installed library, and prints its validation accuracy:
 *
 *     cc train_digits.c $(pkg-config --cflags --libs gpipe-onnx) -o train_digits
 *     ./train_digits [models/digits_cnn_op17.onnx]
 *
 * It loads the model, profiles its layers and splits them into two
 * pipeline stages, trains with that split, then runs the trained model on
 * the validation set. The data are the .npy files beside the model. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <gpipe_onnx.h>

/* A file beside the model: models/digits_cnn_op17.onnx -> models/NAME. */
static void beside(const char *model, const char *name, char *out, size_t size)
{
    const char *slash = strrchr(model, '/');
    int dir = slash ? (int)(slash - model + 1) : 0;
    snprintf(out, size, "%.*s%s", dir, model, name);
}

static void on_epoch(void *user, const struct gpo_epoch_info *e)
{
    (void)user;
    printf("epoch %lld: train loss %.4f, val loss %.4f\n", (long long)e->epoch + 1, e->train_loss, e->val_loss);
}

static int fail(gpo_model *m, const char *what)
{
    fprintf(stderr, "train_digits: %s: %s\n", what, gpo_last_error(m));
    gpo_close(m);
    return 1;
}

int main(int argc, char **argv)
{
    const char *model = argc > 1 ? argv[1] : "models/digits_cnn_op17.onnx";
    printf("gpipe-onnx %s\n", gpo_version());

    gpo_model *m = NULL;
    if (gpo_open(model, NULL, &m) != GPO_OK) return fail(m, "loading");
    struct gpo_model_info info;
    gpo_model_info(m, &info);
    printf("%s: %d layers, %lld parameters\n", model, info.n_layers, (long long)info.parameters);

    /* Profile every layer at the micro-batch size and split the list. */
    struct gpo_balance_options bo;
    gpo_balance_options_init(&bo);
    bo.devices = "cpu:0,cpu:1";
    bo.batch = 32;
    bo.chunks = 4;
    bo.repeats = 3;
    const struct gpo_balance_report *rep = NULL;
    if (gpo_balance(m, &bo, &rep) != GPO_OK) return fail(m, "balancing");
    char balance[64] = "";
    for (int s = 0; s < rep->optimal.n_stages; s++) {
        const struct gpo_stage *st = &rep->optimal.stages[s];
        struct gpo_layer first, last;
        gpo_layer(m, st->first_layer, &first);
        gpo_layer(m, st->last_layer, &last);
        printf("stage %d: layers %d-%d (%s .. %s), %.3f ms per micro-batch\n", s, st->first_layer, st->last_layer,
               first.op, last.op, st->time_ms);
        snprintf(balance + strlen(balance), sizeof balance - strlen(balance), "%s%d", s ? "," : "",
                 rep->optimal.balance[s]);
    }

    /* One epoch with that split, validated at its end. */
    char x[1024], y[1024], vx[1024], vy[1024];
    beside(model, "digits_train_x.npy", x, sizeof x);
    beside(model, "digits_train_y.npy", y, sizeof y);
    beside(model, "digits_val_x.npy", vx, sizeof vx);
    beside(model, "digits_val_y.npy", vy, sizeof vy);
    struct gpo_train_config tc;
    gpo_train_config_init(&tc);
    tc.data = x;
    tc.labels = y;
    tc.val_data = vx;
    tc.val_labels = vy;
    tc.devices = bo.devices;
    tc.balance = balance;
    tc.batch = bo.batch;
    tc.chunks = bo.chunks;
    tc.epochs = 1;
    tc.optimizer = GPO_OPTIMIZER_ADAMW;
    tc.lr = 3e-3;
    struct gpo_train_callbacks cb = {.on_epoch = on_epoch};
    struct gpo_train_result res;
    if (gpo_train(m, &tc, &cb, &res) != GPO_OK) return fail(m, "training");
    printf("trained %lld steps with balance %s: validation accuracy %.2f%%\n", (long long)res.steps, balance,
           100 * res.val_accuracy);

    /* The trained model, run on the validation inputs. */
    struct gpo_tensor out;
    if (gpo_predict_file(m, vx, NULL, &out) != GPO_OK) return fail(m, "predicting");
    int64_t n = out.dims[0], classes = out.rank > 1 ? out.dims[1] : 1;
    int first = 0;
    for (int c = 1; c < classes; c++)
        if (out.data[c] > out.data[first]) first = c;
    printf("predicted %lld samples x %lld classes; the first is a %d\n", (long long)n, (long long)classes, first);
    gpo_tensor_free(&out);
    gpo_close(m);
    return res.val_accuracy > 0.5 ? 0 : 1;
}
