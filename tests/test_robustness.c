/* Bad input gets a clear error, never a crash: truncated and corrupted
 * files, random bytes, and hand-made models with each kind of defect. Run
 * under AddressSanitizer and UBSan in CI, so a memory error fails the test. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <signal.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fixtures.h"
#include "onnx.pb-c.h"
#include "graph/build.h"
#include "onnx/load.h"
#include "util/mapped.h"

/* ---- corrupted fixtures ---- */

static void test_truncated_files(void **state)
{
    (void)state;
    char path[4096];
    size_t size;
    unsigned char *data = read_whole(fixture_path("gpt_op17.onnx", path, sizeof path), &size);
    assert_non_null(data);
    /* Every prefix would take minutes under sanitizers: a dense sweep of
     * the head (where the structure is) and a coarse one of the rest. */
    int refused = 0;
    for (size_t len = 0; len < size; len += len < 4096 ? 1 : 997) {
        struct gp_graph g;
        struct gp_error err = {0};
        gp_status st = gp_onnx_load_buffer(data, len, NULL, 2, &g, &err);
        if (st == GP_OK) {
            gp_graph_free(&g);
            continue; /* a prefix can be a valid smaller model */
        }
        assert_true(err.msg[0] != '\0');
        refused++;
    }
    assert_true(refused > 100);
    free(data);
}

static void test_random_bytes_and_bit_flips(void **state)
{
    (void)state;
    char path[4096];
    size_t size;
    unsigned char *data = read_whole(fixture_path("resnet_op13.onnx", path, sizeof path), &size);
    assert_non_null(data);
    unsigned char *copy = malloc(size);
    srand(1234);
    for (int round = 0; round < 300; round++) {
        memcpy(copy, data, size);
        if (round < 100) {
            for (size_t i = 0; i < 512 && i < size; i++) copy[i] = (unsigned char)rand();
        } else {
            for (int k = 0; k < 8; k++) copy[(size_t)rand() % size] ^= (unsigned char)(1u << (rand() % 8));
        }
        struct gp_graph g;
        struct gp_error err = {0};
        if (gp_onnx_load_buffer(copy, size, NULL, 2, &g, &err) == GP_OK) gp_graph_free(&g);
        else assert_true(err.msg[0] != '\0');
    }
    free(copy);
    free(data);
}

/* Inputs the fuzzer once found a crash or undefined behaviour with (kept
 * in tests/data/fuzz/): each must load or fail with a message, and under
 * the sanitizers neither may report anything. */
static void test_fuzz_regressions(void **state)
{
    (void)state;
    static const char *const files[] = {"slice_huge_step.onnx", "range_huge_length.onnx"};
    const char *root = getenv("GP_SOURCE_ROOT");
    for (size_t i = 0; i < sizeof files / sizeof *files; i++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/tests/data/fuzz/%s", root ? root : ".", files[i]);
        size_t size;
        unsigned char *data = read_whole(path, &size);
        if (!data) fail_msg("cannot read %s", path);
        struct gp_graph g;
        struct gp_error err = {0};
        if (gp_onnx_load_buffer(data, size, NULL, 2, &g, &err) == GP_OK) gp_graph_free(&g);
        else assert_true(err.msg[0] != '\0');
        free(data);
    }
}

static void test_missing_file_and_folder(void **state)
{
    (void)state;
    struct gp_graph g;
    struct gp_error err = {0};
    assert_int_equal(gp_onnx_load("/nonexistent/model.onnx", 1, &g, &err), GP_ERR_IO);
    assert_non_null(strstr(err.msg, "cannot open '/nonexistent/model.onnx'"));
    gp_error_clear(&err);
    char dir[256];
    assert_non_null(temp_dir(dir, sizeof dir));
    assert_int_equal(gp_onnx_load(dir, 1, &g, &err), GP_ERR_IO);
    assert_non_null(strstr(err.msg, "not a regular file"));
    rmdir(dir);
}

/* ---- hand-made models ---- */

/* A one-node model: y = Relu(x) or y = Add(x, w), built with protobuf-c so
 * each test can break one thing. */
struct model {
    Onnx__ModelProto m;
    Onnx__GraphProto g;
    Onnx__OperatorSetIdProto opset;
    Onnx__OperatorSetIdProto *opsets[1];
    Onnx__NodeProto node;
    Onnx__NodeProto *nodes[1];
    char *node_in[2], *node_out[1];
    Onnx__ValueInfoProto in, out;
    Onnx__ValueInfoProto *ins[1], *outs[1];
    Onnx__TypeProto in_type, out_type;
    Onnx__TypeProto__Tensor in_tt, out_tt;
    Onnx__TensorShapeProto in_shape;
    Onnx__TensorShapeProto__Dimension dims[2];
    Onnx__TensorShapeProto__Dimension *dimp[2];
    Onnx__TensorProto w;
    Onnx__TensorProto *inits[1];
    int64_t w_dims[2];
    float w_data[4];
    Onnx__StringStringEntryProto ext[3];
    Onnx__StringStringEntryProto *extp[3];
};

static void model_init(struct model *md, bool with_weight)
{
    memset(md, 0, sizeof *md);
    onnx__model_proto__init(&md->m);
    onnx__graph_proto__init(&md->g);
    onnx__operator_set_id_proto__init(&md->opset);
    onnx__node_proto__init(&md->node);
    onnx__value_info_proto__init(&md->in);
    onnx__value_info_proto__init(&md->out);
    onnx__type_proto__init(&md->in_type);
    onnx__type_proto__init(&md->out_type);
    onnx__type_proto__tensor__init(&md->in_tt);
    onnx__type_proto__tensor__init(&md->out_tt);
    onnx__tensor_shape_proto__init(&md->in_shape);
    onnx__tensor_proto__init(&md->w);
    for (int i = 0; i < 2; i++) {
        onnx__tensor_shape_proto__dimension__init(&md->dims[i]);
        md->dimp[i] = &md->dims[i];
    }
    md->m.has_ir_version = 1;
    md->m.ir_version = 8;
    md->m.producer_name = "test";
    md->opset.domain = "";
    md->opset.has_version = 1;
    md->opset.version = 17;
    md->opsets[0] = &md->opset;
    md->m.n_opset_import = 1;
    md->m.opset_import = md->opsets;
    md->m.graph = &md->g;

    md->dims[0].value_case = ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_PARAM;
    md->dims[0].dim_param = "batch";
    md->dims[1].value_case = ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_VALUE;
    md->dims[1].dim_value = 4;
    md->in_shape.n_dim = 2;
    md->in_shape.dim = md->dimp;
    md->in_tt.has_elem_type = 1;
    md->in_tt.elem_type = ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT;
    md->in_tt.shape = &md->in_shape;
    md->in_type.value_case = ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE;
    md->in_type.tensor_type = &md->in_tt;
    md->in.name = "x";
    md->in.type = &md->in_type;
    md->ins[0] = &md->in;
    md->g.n_input = 1;
    md->g.input = md->ins;
    md->out.name = "y";
    md->outs[0] = &md->out;
    md->g.n_output = 1;
    md->g.output = md->outs;

    md->node_in[0] = "x";
    md->node_in[1] = "w";
    md->node_out[0] = "y";
    md->node.op_type = with_weight ? "Add" : "Relu";
    md->node.name = "the_node";
    md->node.n_input = with_weight ? 2 : 1;
    md->node.input = md->node_in;
    md->node.n_output = 1;
    md->node.output = md->node_out;
    md->nodes[0] = &md->node;
    md->g.n_node = 1;
    md->g.node = md->nodes;

    if (with_weight) {
        md->w.name = "w";
        md->w.has_data_type = 1;
        md->w.data_type = ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT;
        md->w_dims[0] = 1;
        md->w_dims[1] = 4;
        md->w.n_dims = 2;
        md->w.dims = md->w_dims;
        md->w.has_raw_data = 1;
        md->w.raw_data.len = sizeof md->w_data;
        md->w.raw_data.data = (uint8_t *)md->w_data;
        md->inits[0] = &md->w;
        md->g.n_initializer = 1;
        md->g.initializer = md->inits;
    }
}

/* Loads the packed model from a file in `dir` (so external data resolves
 * there); returns the status and leaves the message in err. */
static gp_status load_model(struct model *md, const char *dir, struct gp_error *err)
{
    size_t len = onnx__model_proto__get_packed_size(&md->m);
    uint8_t *buf = malloc(len + 1);
    onnx__model_proto__pack(&md->m, buf);
    char path[512];
    snprintf(path, sizeof path, "%s/model.onnx", dir);
    assert_int_equal(write_whole(path, buf, len), 0);
    free(buf);
    struct gp_graph g;
    gp_status st = gp_onnx_load(path, 2, &g, err);
    if (st == GP_OK) gp_graph_free(&g);
    unlink(path);
    return st;
}

static char dir[256];

static int make_dir(void **state)
{
    (void)state;
    return temp_dir(dir, sizeof dir) ? 0 : -1;
}

static int remove_dir(void **state)
{
    (void)state;
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    return system(cmd) == 0 ? 0 : -1;
}

static void expect(struct model *md, gp_status status, const char *needle)
{
    struct gp_error err = {0};
    gp_status st = load_model(md, dir, &err);
    if (st != status) fail_msg("expected status %d, got %d: '%s'", status, st, err.msg);
    if (needle && !strstr(err.msg, needle)) fail_msg("message '%s' lacks '%s'", err.msg, needle);
}

static void test_valid_hand_made_model(void **state)
{
    (void)state;
    struct model md;
    model_init(&md, true);
    expect(&md, GP_OK, NULL);
    model_init(&md, false);
    expect(&md, GP_OK, NULL);
}

static void test_wrong_tensor_types(void **state)
{
    (void)state;
    struct model md;
    model_init(&md, true);
    md.w.data_type = ONNX__TENSOR_PROTO__DATA_TYPE__STRING;
    expect(&md, GP_ERR_UNSUPPORTED, "tensor 'w': element type 8 (string) is not supported");
    model_init(&md, true);
    md.w.data_type = 99;
    expect(&md, GP_ERR_UNSUPPORTED, "element type 99");
    /* An int64 weight added to a float input. */
    model_init(&md, true);
    md.w.data_type = ONNX__TENSOR_PROTO__DATA_TYPE__INT64;
    md.w.raw_data.len = 4 * 8;
    int64_t ints[4] = {0};
    md.w.raw_data.data = (uint8_t *)ints;
    expect(&md, GP_ERR_INVALID, "node 'the_node' (Add)");
    model_init(&md, false);
    md.in_tt.elem_type = ONNX__TENSOR_PROTO__DATA_TYPE__COMPLEX64;
    expect(&md, GP_ERR_UNSUPPORTED, "graph input 'x' has element type 14");
}

static void test_bad_dimensions(void **state)
{
    (void)state;
    struct model md;
    model_init(&md, true);
    md.w_dims[1] = -4;
    expect(&md, GP_ERR_INVALID, "tensor 'w': invalid dimensions [1, -4]");
    model_init(&md, true);
    md.w_dims[0] = INT64_MAX / 2;
    md.w_dims[1] = 1024;
    expect(&md, GP_ERR_INVALID, "negative or too large");
    model_init(&md, false);
    md.dims[1].dim_value = -3;
    expect(&md, GP_ERR_SHAPE, "negative dimension");
    model_init(&md, false);
    md.dims[1].dim_value = INT64_MAX / 3;
    expect(&md, GP_ERR_SHAPE, "graph input 'x' has an invalid shape");
    model_init(&md, false);
    md.dims[1].value_case = ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_PARAM;
    md.dims[1].dim_param = "features";
    expect(&md, GP_ERR_SHAPE, "symbolic dimension 'features' at axis 1");
}

static void test_data_size_mismatch(void **state)
{
    (void)state;
    struct model md;
    model_init(&md, true);
    md.w.raw_data.len = 12;
    expect(&md, GP_ERR_INVALID, "raw_data holds 12 bytes but its float32 shape needs 16");
    model_init(&md, true);
    md.w.has_raw_data = 0;
    float three[3] = {1, 2, 3};
    md.w.n_float_data = 3;
    md.w.float_data = three;
    expect(&md, GP_ERR_INVALID, "holds 3 float32 values but its shape needs 4");
}

static void test_missing_initializer(void **state)
{
    (void)state;
    struct model md;
    model_init(&md, true);
    md.g.n_initializer = 0;
    expect(&md, GP_ERR_INVALID, "reads 'w', which no node, graph input or initializer defines");
}

static void test_inconsistent_shapes(void **state)
{
    (void)state;
    struct model md;
    model_init(&md, true);
    md.w_dims[1] = 3;
    md.w.raw_data.len = 12;
    expect(&md, GP_ERR_SHAPE, "do not broadcast");
}

static void test_no_graph_or_opset(void **state)
{
    (void)state;
    struct model md;
    model_init(&md, false);
    md.m.graph = NULL;
    expect(&md, GP_ERR_INVALID, "the model has no graph");
    model_init(&md, false);
    md.m.n_opset_import = 0;
    expect(&md, GP_ERR_INVALID, "imports no opset");
    model_init(&md, false);
    md.g.n_output = 0;
    expect(&md, GP_ERR_INVALID, "no outputs");
}

static void test_unknown_ops_named(void **state)
{
    (void)state;
    struct model md;
    model_init(&md, false);
    md.node.op_type = "Frobnicate";
    expect(&md, GP_ERR_UNSUPPORTED, "1 unsupported op type: Frobnicate (1 node, first 'the_node')");
}

static void set_external(struct model *md, const char *location, const char *offset,
                         const char *length)
{
    md->w.has_raw_data = 0;
    md->w.has_data_location = 1;
    md->w.data_location = ONNX__TENSOR_PROTO__DATA_LOCATION__EXTERNAL;
    const char *keys[3] = {"location", "offset", "length"};
    const char *vals[3] = {location, offset, length};
    int n = 0;
    for (int i = 0; i < 3; i++) {
        if (!vals[i]) continue;
        onnx__string_string_entry_proto__init(&md->ext[n]);
        md->ext[n].key = (char *)keys[i];
        md->ext[n].value = (char *)vals[i];
        md->extp[n] = &md->ext[n];
        n++;
    }
    md->w.n_external_data = (size_t)n;
    md->w.external_data = md->extp;
}

static void test_external_data(void **state)
{
    (void)state;
    char path[600];
    float w[6] = {1, 2, 3, 4, 5, 6};
    snprintf(path, sizeof path, "%s/weights.bin", dir);
    assert_int_equal(write_whole(path, w, sizeof w), 0);

    struct model md;
    model_init(&md, true);
    set_external(&md, "weights.bin", "8", "16");
    expect(&md, GP_OK, NULL);
    model_init(&md, true);
    set_external(&md, "weights.bin", NULL, NULL); /* no length: the shape's 16 bytes */
    expect(&md, GP_OK, NULL);
    model_init(&md, true);
    set_external(&md, "weights.bin", "0", "24");
    expect(&md, GP_ERR_INVALID, "holds 24 bytes but its shape needs 16");
    model_init(&md, true);
    set_external(&md, "weights.bin", "16", "16");
    expect(&md, GP_ERR_INVALID, "range [16, 32) exceeds 'weights.bin' (24 bytes)");
    model_init(&md, true);
    set_external(&md, "weights.bin", "-8", "16");
    expect(&md, GP_ERR_INVALID, "offset '-8' is not a valid number");
    model_init(&md, true);
    set_external(&md, "missing.bin", NULL, NULL);
    expect(&md, GP_ERR_IO, "cannot open external data");
    model_init(&md, true);
    set_external(&md, "/etc/passwd", NULL, NULL);
    expect(&md, GP_ERR_INVALID, "is an absolute path");
    model_init(&md, true);
    set_external(&md, "../outside.bin", NULL, NULL);
    snprintf(path, sizeof path, "%s/../outside.bin", dir);
    /* Even when the file exists, a path leaving the folder is refused. */
    FILE *f = fopen(path, "wb");
    int made = f != NULL;
    if (f) {
        fwrite(w, 1, 16, f);
        fclose(f);
    }
    expect(&md, made ? GP_ERR_INVALID : GP_ERR_IO, made ? "lies outside the model's folder" : NULL);
    if (made) unlink(path);
    /* A symbolic link inside the folder that points out of it. */
    char link_path[600];
    snprintf(link_path, sizeof link_path, "%s/sneaky.bin", dir);
    assert_int_equal(symlink("/etc/hostname", link_path), 0);
    model_init(&md, true);
    set_external(&md, "sneaky.bin", NULL, NULL);
    expect(&md, GP_ERR_INVALID, "lies outside the model's folder");
    unlink(link_path);
}

/* Packs the model into `dir`/model.onnx and loads it into *g (kept). */
static gp_status load_kept(struct model *md, struct gp_graph *g, uint8_t **bytes, size_t *size,
                           struct gp_error *err)
{
    *size = onnx__model_proto__get_packed_size(&md->m);
    *bytes = malloc(*size + 1);
    onnx__model_proto__pack(&md->m, *bytes);
    char path[512];
    snprintf(path, sizeof path, "%s/model.onnx", dir);
    assert_int_equal(write_whole(path, *bytes, *size), 0);
    gp_status st = gp_onnx_load(path, 2, g, err);
    unlink(path);
    return st;
}

static const struct gp_tensor *weight(const struct gp_graph *g)
{
    int id = gp_graph_lookup(g, "w");
    assert_true(id >= 0);
    assert_non_null(g->values[id].constant);
    return g->values[id].constant;
}

/* Loaded from a file, initializers are views of the mapped file (raw_data)
 * or of the external data file, whatever their alignment, and read right;
 * loaded from a caller's buffer, they are copies. */
static void test_initializers_are_views(void **state)
{
    (void)state;
    struct model md;
    model_init(&md, true);
    for (int i = 0; i < 4; i++) md.w_data[i] = 0.5f + (float)i;
    struct gp_graph g;
    struct gp_error err = {0};
    uint8_t *bytes;
    size_t size;
    if (load_kept(&md, &g, &bytes, &size, &err) != GP_OK) fail_msg("%s", err.msg);
    const struct gp_tensor *t = weight(&g);
    assert_true(t->view);
    for (int i = 0; i < 4; i++) assert_true(gp_tensor_get_f64(t, i) == 0.5 + i);
    gp_graph_free(&g);
    if (gp_onnx_load_buffer(bytes, size, NULL, 2, &g, &err) != GP_OK) fail_msg("%s", err.msg);
    t = weight(&g);
    assert_false(t->view);
    for (int i = 0; i < 4; i++) assert_true(gp_tensor_get_f64(t, i) == 0.5 + i);
    gp_graph_free(&g);
    free(bytes);

    /* External data at an offset that is no multiple of 4: still a view. */
    char path[600];
    unsigned char file[24] = {0};
    float w[4] = {1, 2, 3, 4};
    memcpy(file + 3, w, sizeof w);
    snprintf(path, sizeof path, "%s/unaligned.bin", dir);
    assert_int_equal(write_whole(path, file, sizeof file), 0);
    model_init(&md, true);
    set_external(&md, "unaligned.bin", "3", "16");
    if (load_kept(&md, &g, &bytes, &size, &err) != GP_OK) fail_msg("%s", err.msg);
    t = weight(&g);
    assert_true(t->view);
    for (int i = 0; i < 4; i++) assert_true(gp_tensor_get_f64(t, i) == 1.0 + i);
    gp_graph_free(&g);
    free(bytes);
    unlink(path);
}

/* A mapped model that another process truncates while its views are in use
 * faults (SIGBUS) on the next read of a lost page: no check made at load
 * can rule that out. Every mapping is recorded (util/mapped.h) so that the
 * command line's handler names the file; here a child reads a view after
 * truncating the file, and its handler must find the file by the fault's
 * address. The record goes with the graph. */
static void on_sigbus(int sig, siginfo_t *info, void *ctx)
{
    (void)sig;
    (void)ctx;
    const char *path = gp_mapped_find(info->si_addr);
    _exit(path && strstr(path, "model.onnx") ? 42 : 43);
}

static void test_truncated_while_mapped(void **state)
{
    (void)state;
    struct model md;
    model_init(&md, true);
    size_t size = onnx__model_proto__get_packed_size(&md.m);
    uint8_t *bytes = malloc(size + 1);
    onnx__model_proto__pack(&md.m, bytes);
    char path[512];
    snprintf(path, sizeof path, "%s/model.onnx", dir);
    assert_int_equal(write_whole(path, bytes, size), 0);
    free(bytes);
    struct gp_graph g;
    struct gp_error err = {0};
    if (gp_onnx_load(path, 2, &g, &err) != GP_OK) fail_msg("%s", err.msg);
    const struct gp_tensor *t = weight(&g);
    assert_true(t->view);
    const char *found = gp_mapped_find(t->data);
    assert_non_null(found);
    assert_string_equal(found, path);
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        struct sigaction sa = {.sa_sigaction = on_sigbus, .sa_flags = SA_SIGINFO};
        sigemptyset(&sa.sa_mask);
        sigaction(SIGBUS, &sa, NULL);
        if (truncate(path, 0) != 0) _exit(44);
        volatile double v = gp_tensor_get_f64(t, 0);
        (void)v;
        _exit(0); /* no fault: the page survived, which Linux does not allow */
    }
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 42);
    const void *view = t->data;
    gp_graph_free(&g);
    assert_null(gp_mapped_find(view));
    unlink(path);
}

/* The wire format's corners the raw_data pass must agree with protobuf on:
 * raw_data given twice (the last counts), and a second graph field (merged
 * into the first; such files are unpacked as they are, weights copied). */
static void test_raw_data_wire_corners(void **state)
{
    (void)state;
    struct model md;
    model_init(&md, true);
    for (int i = 0; i < 4; i++) md.w_data[i] = (float)(i + 1);
    /* protobuf-c writes an unknown field as its tag and then `data`, which
     * therefore begins with the length. */
    float later[4] = {10, 20, 30, 40};
    uint8_t field[1 + sizeof later] = {sizeof later};
    memcpy(field + 1, later, sizeof later);
    ProtobufCMessageUnknownField again = {.tag = 9, .wire_type = PROTOBUF_C_WIRE_TYPE_LENGTH_PREFIXED,
                                          .len = sizeof field, .data = field};
    md.w.base.n_unknown_fields = 1;
    md.w.base.unknown_fields = &again;
    struct gp_graph g;
    struct gp_error err = {0};
    uint8_t *bytes;
    size_t size;
    if (load_kept(&md, &g, &bytes, &size, &err) != GP_OK) fail_msg("%s", err.msg);
    const struct gp_tensor *t = weight(&g);
    assert_true(t->view);
    for (int i = 0; i < 4; i++) assert_true(gp_tensor_get_f64(t, i) == later[i]);
    gp_graph_free(&g);
    free(bytes);

    model_init(&md, true);
    for (int i = 0; i < 4; i++) md.w_data[i] = (float)(i + 1);
    uint8_t zero_length = 0;
    ProtobufCMessageUnknownField empty_graph = {.tag = 7, .wire_type = PROTOBUF_C_WIRE_TYPE_LENGTH_PREFIXED,
                                                .len = 1, .data = &zero_length};
    md.m.base.n_unknown_fields = 1;
    md.m.base.unknown_fields = &empty_graph;
    if (load_kept(&md, &g, &bytes, &size, &err) != GP_OK) fail_msg("%s", err.msg);
    t = weight(&g);
    assert_false(t->view);
    for (int i = 0; i < 4; i++) assert_true(gp_tensor_get_f64(t, i) == i + 1);
    gp_graph_free(&g);
    free(bytes);
}

/* A raw_data whose length runs past the file, or a file cut inside it, is a
 * parse error with a message, never a read out of the mapping. */
static void test_raw_data_out_of_range(void **state)
{
    (void)state;
    struct model md;
    model_init(&md, true);
    for (int i = 0; i < 4; i++) md.w_data[i] = (float)(i + 1);
    size_t size = onnx__model_proto__get_packed_size(&md.m);
    uint8_t *bytes = malloc(size);
    onnx__model_proto__pack(&md.m, bytes);
    /* raw_data is field 9, length-delimited (tag 0x4a), 16 bytes (0x10). */
    size_t at = 0;
    for (size_t i = 2; i + 16 <= size; i++)
        if (bytes[i - 2] == 0x4a && bytes[i - 1] == 0x10 && !memcmp(bytes + i, md.w_data, 16)) at = i;
    assert_true(at > 0);
    char path[512];
    snprintf(path, sizeof path, "%s/model.onnx", dir);
    const uint8_t lengths[] = {0x11, 0x7f};
    for (size_t k = 0; k < sizeof lengths; k++) {
        uint8_t keep = bytes[at - 1];
        bytes[at - 1] = lengths[k];
        assert_int_equal(write_whole(path, bytes, size), 0);
        struct gp_graph g;
        struct gp_error err = {0};
        gp_status st = gp_onnx_load(path, 2, &g, &err);
        if (st == GP_OK) gp_graph_free(&g);
        assert_int_not_equal(st, GP_OK);
        if (!strstr(err.msg, "malformed or truncated") && !strstr(err.msg, "raw_data holds"))
            fail_msg("length %u: unclear message '%s'", (unsigned)lengths[k], err.msg);
        bytes[at - 1] = keep;
    }
    for (size_t cut = at - 1; cut < at + 16; cut++) {
        assert_int_equal(write_whole(path, bytes, cut), 0);
        struct gp_graph g;
        struct gp_error err = {0};
        gp_status st = gp_onnx_load(path, 2, &g, &err);
        if (st == GP_OK) gp_graph_free(&g);
        assert_int_equal(st, GP_ERR_PARSE);
        assert_non_null(strstr(err.msg, "malformed or truncated"));
    }
    unlink(path);
    free(bytes);
}

/* A Reshape target that baked in the export-time batch (2) cannot hold a
 * batch of 2 with another size... here the file declares batch 3 at export
 * and the target [3, 4]: loading at batch 2 must explain the fix. */
static void test_baked_batch_reshape(void **state)
{
    (void)state;
    struct model md;
    model_init(&md, true);
    md.dims[0].value_case = ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_VALUE;
    md.dims[0].dim_value = 3;
    md.node.op_type = "Reshape";
    md.w.data_type = ONNX__TENSOR_PROTO__DATA_TYPE__INT64;
    md.w.n_dims = 1;
    md.w_dims[0] = 2;
    int64_t target[2] = {3, 4};
    md.w.raw_data.len = sizeof target;
    md.w.raw_data.data = (uint8_t *)target;
    expect(&md, GP_ERR_SHAPE, "dynamic batch axis");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_truncated_files),
        cmocka_unit_test(test_random_bytes_and_bit_flips),
        cmocka_unit_test(test_fuzz_regressions),
        cmocka_unit_test(test_missing_file_and_folder),
        cmocka_unit_test(test_valid_hand_made_model),
        cmocka_unit_test(test_wrong_tensor_types),
        cmocka_unit_test(test_bad_dimensions),
        cmocka_unit_test(test_data_size_mismatch),
        cmocka_unit_test(test_missing_initializer),
        cmocka_unit_test(test_inconsistent_shapes),
        cmocka_unit_test(test_no_graph_or_opset),
        cmocka_unit_test(test_unknown_ops_named),
        cmocka_unit_test(test_external_data),
        cmocka_unit_test(test_baked_batch_reshape),
        cmocka_unit_test(test_initializers_are_views),
        cmocka_unit_test(test_raw_data_out_of_range),
        cmocka_unit_test(test_raw_data_wire_corners),
        cmocka_unit_test(test_truncated_while_mapped),
    };
    return cmocka_run_group_tests(tests, make_dir, remove_dir);
}
