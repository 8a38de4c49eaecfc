/* Saving trained weights back into the ONNX file: every value survives a
 * save and a reload, element types are kept (float16, bfloat16, float64),
 * typed and external data become raw_data, and no failure leaves a file. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fixtures.h"
#include "onnx.pb-c.h"
#include "onnx/load.h"
#include "onnx/save.h"

static int count_entries(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d) return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) n++;
    closedir(d);
    return n;
}

/* New values for every float32 initializer of a loaded graph. */
struct new_values {
    int n;
    struct gp_saved_tensor *t;
    float **data;
};

static void make_new_values(const struct gp_graph *g, struct new_values *nv)
{
    nv->t = calloc((size_t)g->n_values + 1, sizeof *nv->t);
    nv->data = calloc((size_t)g->n_values + 1, sizeof *nv->data);
    nv->n = 0;
    for (int v = 0; v < g->n_values; v++) {
        const struct gp_value *val = &g->values[v];
        if (!val->is_initializer || !val->constant || val->dtype != GP_DTYPE_FLOAT32) continue;
        int64_t n = gp_shape_numel(&val->shape);
        float *d = malloc(sizeof(float) * (size_t)(n + 1));
        /* Initializers may be views of the model file at any address. */
        memcpy(d, val->constant->data, sizeof(float) * (size_t)n);
        for (int64_t i = 0; i < n; i++) d[i] = d[i] * 1.5f + (float)(i % 7) * 0.125f - 0.25f;
        nv->data[nv->n] = d;
        nv->t[nv->n] = (struct gp_saved_tensor){.name = val->name, .data = d, .shape = val->shape};
        nv->n++;
    }
}

static void free_new_values(struct new_values *nv)
{
    for (int i = 0; i < nv->n; i++) free(nv->data[i]);
    free(nv->data);
    free(nv->t);
}

/* Save every float initializer with new values, reload, compare all. */
static void test_fixtures_round_trip(void **state)
{
    (void)state;
    const char *files[] = {"mlp_op13.onnx", "digits_cnn_op17.onnx", "resnet_op13.onnx",
                           "gpt_op17.onnx", "unet_op17.onnx"};
    char dir[1024], out[2048], path[4096];
    assert_non_null(temp_dir(dir, sizeof dir));
    snprintf(out, sizeof out, "%s/trained.onnx", dir);
    for (size_t f = 0; f < sizeof files / sizeof files[0]; f++) {
        struct gp_graph g, h;
        struct gp_error err = {0};
        fixture_path(files[f], path, sizeof path);
        if (gp_onnx_load(path, 2, &g, &err) != GP_OK) fail_msg("%s", err.msg);
        struct new_values nv;
        make_new_values(&g, &nv);
        assert_true(nv.n > 0);
        if (gp_onnx_save(path, out, nv.t, nv.n, &err) != GP_OK) fail_msg("%s", err.msg);
        if (gp_onnx_load(out, 2, &h, &err) != GP_OK) fail_msg("reloading %s: %s", files[f], err.msg);
        assert_int_equal(h.n_values, g.n_values);
        assert_int_equal(h.n_nodes, g.n_nodes);
        int replaced = 0;
        for (int v = 0; v < g.n_values; v++) {
            const struct gp_value *a = &g.values[v];
            if (!a->is_initializer || !a->constant) continue;
            int w = gp_graph_find_value(&h, a->name);
            assert_true(w >= 0);
            const struct gp_value *b = &h.values[w];
            assert_int_equal(b->dtype, a->dtype);
            assert_int_equal(b->kind, a->kind);
            assert_true(gp_shape_equal(&a->shape, &b->shape));
            const void *want = a->constant->data;
            for (int k = 0; k < nv.n; k++)
                if (nv.t[k].name == a->name) {
                    want = nv.data[k];
                    replaced++;
                }
            if (memcmp(b->constant->data, want, a->constant->nbytes) != 0)
                fail_msg("%s: initializer '%s' differs after the round trip", files[f], a->name);
        }
        assert_int_equal(replaced, nv.n);
        free_new_values(&nv);
        gp_graph_free(&h);

        /* Nothing replaced: the file comes back byte for byte (protobuf-c
         * packs fields in the order the exporter wrote them). */
        if (gp_onnx_save(path, out, NULL, 0, &err) != GP_OK) fail_msg("%s", err.msg);
        size_t n1 = 0, n2 = 0;
        unsigned char *a = read_whole(path, &n1), *b = read_whole(out, &n2);
        if (n1 != n2 || memcmp(a, b, n1) != 0) fail_msg("%s: an unchanged save differs", files[f]);
        free(a);
        free(b);
        gp_graph_free(&g);
        assert_int_equal(count_entries(dir), 1); /* no temporary file left */
    }
    remove_tree(dir);
}

/* ---- a hand-built model: every storage of tensor data ---- */

static Onnx__TensorProto *tensor(const char *name, int dtype, int rank, const int64_t *dims)
{
    Onnx__TensorProto *t = calloc(1, sizeof *t);
    onnx__tensor_proto__init(t);
    t->name = (char *)name;
    t->has_data_type = 1;
    t->data_type = dtype;
    t->n_dims = (size_t)rank;
    t->dims = (int64_t *)dims;
    return t;
}

static void set_external(Onnx__TensorProto *t, const char *location, const char *offset,
                         const char *length)
{
    static Onnx__StringStringEntryProto entries[32];
    static Onnx__StringStringEntryProto *ptrs[32];
    static int used;
    t->has_data_location = 1;
    t->data_location = ONNX__TENSOR_PROTO__DATA_LOCATION__EXTERNAL;
    const char *kv[3][2] = {{"location", location}, {"offset", offset}, {"length", length}};
    t->external_data = &ptrs[used];
    for (int i = 0; i < 3; i++) {
        onnx__string_string_entry_proto__init(&entries[used]);
        entries[used].key = (char *)kv[i][0];
        entries[used].value = (char *)kv[i][1];
        ptrs[used] = &entries[used];
        used++;
        t->n_external_data++;
    }
}

static const int64_t d3[1] = {3}, d22[2] = {2, 2}, d2[1] = {2}, d4[1] = {4};

/* Writes model.onnx and w.bin (external data) into dir. */
static void write_model(const char *dir, Onnx__TensorProto **inits, size_t n_inits,
                        Onnx__NodeProto **nodes, size_t n_nodes)
{
    Onnx__GraphProto gp;
    onnx__graph_proto__init(&gp);
    gp.name = "g";
    gp.n_initializer = n_inits;
    gp.initializer = inits;
    gp.n_node = n_nodes;
    gp.node = nodes;
    Onnx__OperatorSetIdProto op;
    onnx__operator_set_id_proto__init(&op);
    op.domain = "";
    op.has_version = 1;
    op.version = 17;
    Onnx__OperatorSetIdProto *ops[1] = {&op};
    Onnx__ModelProto mp;
    onnx__model_proto__init(&mp);
    mp.has_ir_version = 1;
    mp.ir_version = 8;
    mp.producer_name = "test_save";
    mp.graph = &gp;
    mp.n_opset_import = 1;
    mp.opset_import = ops;
    size_t size = onnx__model_proto__get_packed_size(&mp);
    unsigned char *buf = malloc(size);
    onnx__model_proto__pack(&mp, buf);
    char p[2048];
    snprintf(p, sizeof p, "%s/model.onnx", dir);
    assert_int_equal(write_whole(p, buf, size), 0);
    free(buf);
    /* w.bin: 4 floats (ext_keep), 2 floats (ext_new), 2 floats (c_ext) */
    const float w[8] = {1.5f, -2.0f, 3.25f, 0.0f, 7.0f, 8.0f, 0.5f, -0.5f};
    snprintf(p, sizeof p, "%s/w.bin", dir);
    assert_int_equal(write_whole(p, w, sizeof w), 0);
}

static Onnx__ModelProto *read_proto(const char *path)
{
    size_t size = 0;
    unsigned char *b = read_whole(path, &size);
    assert_non_null(b);
    Onnx__ModelProto *mp = onnx__model_proto__unpack(NULL, size, b);
    free(b);
    assert_non_null(mp);
    return mp;
}

static const Onnx__TensorProto *find_init(const Onnx__ModelProto *mp, const char *name)
{
    for (size_t i = 0; i < mp->graph->n_initializer; i++)
        if (!strcmp(mp->graph->initializer[i]->name, name)) return mp->graph->initializer[i];
    fail_msg("no initializer '%s'", name);
    return NULL;
}

/* Only raw_data holds the tensor now, and it holds `bytes`. */
static void assert_raw(const Onnx__TensorProto *t, const void *bytes, size_t len)
{
    assert_true(t->has_raw_data);
    assert_int_equal(t->n_float_data + t->n_int32_data + t->n_int64_data + t->n_double_data +
                         t->n_uint64_data + t->n_external_data,
                     0);
    assert_false(t->has_data_location && t->data_location != ONNX__TENSOR_PROTO__DATA_LOCATION__DEFAULT);
    assert_int_equal(t->raw_data.len, len);
    assert_memory_equal(t->raw_data.data, bytes, len);
}

static void test_types_typed_fields_and_external_data(void **state)
{
    (void)state;
    char src[1024], dst[1024], model[2048], out[2048];
    assert_non_null(temp_dir(src, sizeof src));
    assert_non_null(temp_dir(dst, sizeof dst));
    snprintf(model, sizeof model, "%s/model.onnx", src);
    snprintf(out, sizeof out, "%s/trained.onnx", dst);

    Onnx__TensorProto *h16 = tensor("h16", ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT16, 1, d3);
    uint16_t h16_old[3] = {0x3c00, 0x4000, 0xc000};
    h16->has_raw_data = 1;
    h16->raw_data = (ProtobufCBinaryData){sizeof h16_old, (uint8_t *)h16_old};
    Onnx__TensorProto *bf = tensor("bf", ONNX__TENSOR_PROTO__DATA_TYPE__BFLOAT16, 2, d22);
    int32_t bf_old[4] = {0x3f80, 0x4000, 0x4040, 0x4080};
    bf->n_int32_data = 4;
    bf->int32_data = bf_old;
    Onnx__TensorProto *d64 = tensor("d64", ONNX__TENSOR_PROTO__DATA_TYPE__DOUBLE, 1, d2);
    double d64_old[2] = {1.0, 2.0};
    d64->n_double_data = 2;
    d64->double_data = d64_old;
    Onnx__TensorProto *ft = tensor("f_typed", ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT, 1, d3);
    float ft_old[3] = {1, 2, 3};
    ft->n_float_data = 3;
    ft->float_data = ft_old;
    Onnx__TensorProto *keep = tensor("ext_keep", ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT, 1, d4);
    set_external(keep, "w.bin", "0", "16");
    Onnx__TensorProto *enew = tensor("ext_new", ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT, 1, d2);
    set_external(enew, "w.bin", "16", "8");
    Onnx__TensorProto *i64 = tensor("i64", ONNX__TENSOR_PROTO__DATA_TYPE__INT64, 1, d2);
    int64_t i64_old[2] = {5, 6};
    i64->n_int64_data = 2;
    i64->int64_data = i64_old;
    Onnx__TensorProto *inits[7] = {h16, bf, d64, ft, keep, enew, i64};

    /* a Constant node whose value lives in w.bin too */
    Onnx__TensorProto *cext = tensor("c_ext", ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT, 1, d2);
    set_external(cext, "w.bin", "24", "8");
    Onnx__AttributeProto attr;
    onnx__attribute_proto__init(&attr);
    attr.name = "value";
    attr.has_type = 1;
    attr.type = ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__TENSOR;
    attr.t = cext;
    Onnx__AttributeProto *attrs[1] = {&attr};
    Onnx__NodeProto node;
    onnx__node_proto__init(&node);
    char *outs[1] = {"c"};
    node.op_type = "Constant";
    node.n_output = 1;
    node.output = outs;
    node.n_attribute = 1;
    node.attribute = attrs;
    Onnx__NodeProto *nodes[1] = {&node};
    write_model(src, inits, 7, nodes, 1);
    for (int i = 0; i < 7; i++) free(inits[i]);
    free(cext);

    /* 1 + 2^-11 is a tie between two halves: even wins (1.0). */
    const float h16_new[3] = {1.0f, 1.00048828125f, -65504.0f};
    const float bf_new[4] = {1.0f, 1.00390625f, 3.0f, -0.5f};
    const float d64_new[2] = {0.1f, -3.0f};
    const float ft_new[3] = {-1.0f, 0.0f, 1e-3f};
    const float enew_new[2] = {42.0f, -42.0f};
    const int64_t i64_new[2] = {-7, 1LL << 40};
    struct gp_saved_tensor t[6] = {
        {.name = "h16", .data = h16_new, .shape = {1, {3}}},
        {.name = "bf", .data = bf_new, .shape = {2, {2, 2}}},
        {.name = "d64", .data = d64_new, .shape = {1, {2}}},
        {.name = "f_typed", .dtype = GP_DTYPE_FLOAT32, .data = ft_new, .shape = {1, {3}}},
        {.name = "ext_new", .data = enew_new, .shape = {1, {2}}},
        {.name = "i64", .dtype = GP_DTYPE_INT64, .data = i64_new, .shape = {1, {2}}},
    };
    struct gp_error err = {0};
    if (gp_onnx_save(model, out, t, 6, &err) != GP_OK) fail_msg("%s", err.msg);

    Onnx__ModelProto *mp = read_proto(out);
    const uint16_t h16_want[3] = {0x3c00, 0x3c00, 0xfbff};
    assert_raw(find_init(mp, "h16"), h16_want, sizeof h16_want);
    const uint16_t bf_want[4] = {0x3f80, 0x3f80, 0x4040, 0xbf00}; /* 1 + 2^-8 ties to 1 */
    assert_raw(find_init(mp, "bf"), bf_want, sizeof bf_want);
    const double d64_want[2] = {(double)0.1f, -3.0};
    assert_raw(find_init(mp, "d64"), d64_want, sizeof d64_want);
    assert_raw(find_init(mp, "f_typed"), ft_new, sizeof ft_new);
    assert_raw(find_init(mp, "ext_new"), enew_new, sizeof enew_new);
    assert_raw(find_init(mp, "i64"), i64_new, sizeof i64_new);
    /* kept but inlined: the output does not depend on w.bin */
    const float keep_want[4] = {1.5f, -2.0f, 3.25f, 0.0f};
    assert_raw(find_init(mp, "ext_keep"), keep_want, sizeof keep_want);
    const float c_want[2] = {0.5f, -0.5f};
    assert_raw(mp->graph->node[0]->attribute[0]->t, c_want, sizeof c_want);
    assert_string_equal(mp->producer_name, "test_save");
    assert_int_equal(mp->graph->n_initializer, 7);
    onnx__model_proto__free_unpacked(mp, NULL);
    assert_int_equal(count_entries(dst), 1);

    /* conversions that would lose meaning are refused, naming the tensor */
    struct gp_saved_tensor bad = {.name = "i64", .data = ft_new, .shape = {1, {2}}};
    gp_error_clear(&err);
    assert_int_equal(gp_onnx_save(model, out, &bad, 1, &err), GP_ERR_UNSUPPORTED);
    assert_non_null(strstr(err.msg, "'i64'"));
    bad = (struct gp_saved_tensor){.name = "f_typed", .dtype = GP_DTYPE_FLOAT64, .data = d64_old, .shape = {1, {3}}};
    gp_error_clear(&err);
    assert_int_equal(gp_onnx_save(model, out, &bad, 1, &err), GP_ERR_UNSUPPORTED);
    assert_non_null(strstr(err.msg, "'f_typed'"));

    /* external data that escapes the model's folder is refused as in loading */
    remove_tree(src);
    assert_non_null(temp_dir(src, sizeof src));
    snprintf(model, sizeof model, "%s/model.onnx", src);
    Onnx__TensorProto *esc = tensor("esc", ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT, 1, d2);
    set_external(esc, "../w.bin", "0", "8");
    Onnx__TensorProto *one[1] = {esc};
    write_model(src, one, 1, NULL, 0);
    free(esc);
    gp_error_clear(&err);
    assert_int_not_equal(gp_onnx_save(model, out, NULL, 0, &err), GP_OK);
    assert_non_null(strstr(err.msg, "esc"));
    remove_tree(src);
    remove_tree(dst);
}

static void test_bad_requests_write_nothing(void **state)
{
    (void)state;
    char dir[1024], out[2048], path[4096];
    assert_non_null(temp_dir(dir, sizeof dir));
    snprintf(out, sizeof out, "%s/trained.onnx", dir);
    fixture_path("mlp_op13.onnx", path, sizeof path);
    struct gp_graph g;
    struct gp_error err = {0};
    assert_int_equal(gp_onnx_load(path, 2, &g, &err), GP_OK);
    struct new_values nv;
    make_new_values(&g, &nv);

    struct gp_saved_tensor t = nv.t[0];
    t.name = "no_such_weight";
    assert_int_equal(gp_onnx_save(path, out, &t, 1, &err), GP_ERR_INVALID);
    assert_non_null(strstr(err.msg, "no_such_weight"));

    t = nv.t[0];
    t.shape.dims[0] += 1;
    char want[512];
    snprintf(want, sizeof want, "initializer '%s' has shape", t.name);
    gp_error_clear(&err);
    assert_int_equal(gp_onnx_save(path, out, &t, 1, &err), GP_ERR_SHAPE);
    assert_non_null(strstr(err.msg, want));

    struct gp_saved_tensor twice[2] = {nv.t[1], nv.t[1]};
    gp_error_clear(&err);
    assert_int_equal(gp_onnx_save(path, out, twice, 2, &err), GP_ERR_INVALID);
    assert_non_null(strstr(err.msg, "twice"));

    /* a later bad tensor fails the whole save: nothing half-replaced */
    nv.t[nv.n - 1].shape.rank = 0;
    gp_error_clear(&err);
    assert_int_equal(gp_onnx_save(path, out, nv.t, nv.n, &err), GP_ERR_SHAPE);

    char missing[2048];
    snprintf(missing, sizeof missing, "%s/none.onnx", dir);
    gp_error_clear(&err);
    assert_int_equal(gp_onnx_save(missing, out, NULL, 0, &err), GP_ERR_IO);
    assert_non_null(strstr(err.msg, missing));

    char junk[2048];
    snprintf(junk, sizeof junk, "%s/junk.onnx", dir);
    assert_int_equal(write_whole(junk, "\xff\xff\xff\xff not protobuf", 17), 0);
    gp_error_clear(&err);
    assert_int_equal(gp_onnx_save(junk, out, NULL, 0, &err), GP_ERR_PARSE);
    assert_non_null(strstr(err.msg, junk));
    unlink(junk);

    assert_int_equal(count_entries(dir), 0);
    free_new_values(&nv);
    gp_graph_free(&g);
    remove_tree(dir);
}

/* Failing writes: a missing folder, a folder in the way of the rename, and
 * a write cut short (file size limit) leave no file and keep the old one. */
static void test_failed_writes_leave_nothing(void **state)
{
    (void)state;
    char dir[1024], out[2048], path[4096];
    assert_non_null(temp_dir(dir, sizeof dir));
    fixture_path("digits_cnn_op13.onnx", path, sizeof path);
    struct gp_graph g;
    struct gp_error err = {0};
    assert_int_equal(gp_onnx_load(path, 2, &g, &err), GP_OK);
    struct new_values nv;
    make_new_values(&g, &nv);

    snprintf(out, sizeof out, "%s/missing/trained.onnx", dir);
    assert_int_equal(gp_onnx_save(path, out, nv.t, nv.n, &err), GP_ERR_IO);
    assert_non_null(strstr(err.msg, out));
    assert_int_equal(count_entries(dir), 0);

    snprintf(out, sizeof out, "%s/in_the_way", dir);
    assert_int_equal(mkdir(out, 0755), 0);
    gp_error_clear(&err);
    assert_int_equal(gp_onnx_save(path, out, nv.t, nv.n, &err), GP_ERR_IO);
    assert_non_null(strstr(err.msg, "rename"));
    assert_int_equal(count_entries(dir), 1);
    rmdir(out);

    /* an earlier output survives a failed overwrite intact */
    snprintf(out, sizeof out, "%s/trained.onnx", dir);
    assert_int_equal(gp_onnx_save(path, out, NULL, 0, &err), GP_OK);
    size_t before_n = 0;
    unsigned char *before = read_whole(out, &before_n);
    struct rlimit old, lim;
    getrlimit(RLIMIT_FSIZE, &old);
    lim = old;
    lim.rlim_cur = 4096; /* the model is about 150 KB */
    void (*prev)(int) = signal(SIGXFSZ, SIG_IGN);
    assert_int_equal(setrlimit(RLIMIT_FSIZE, &lim), 0);
    gp_error_clear(&err);
    gp_status st = gp_onnx_save(path, out, nv.t, nv.n, &err);
    setrlimit(RLIMIT_FSIZE, &old);
    signal(SIGXFSZ, prev);
    assert_int_equal(st, GP_ERR_IO);
    assert_non_null(strstr(err.msg, "write failed"));
    assert_int_equal(count_entries(dir), 1);
    size_t after_n = 0;
    unsigned char *after = read_whole(out, &after_n);
    assert_int_equal(after_n, before_n);
    assert_memory_equal(after, before, before_n);
    free(before);
    free(after);

    free_new_values(&nv);
    gp_graph_free(&g);
    remove_tree(dir);
}

/* A model whose weights would not fit in one protobuf (2 GiB): refused
 * before anything is read in or written. (The external file is a stub:
 * reading it would fail with another message.) */
static void test_over_2gib_is_refused(void **state)
{
    (void)state;
    char src[1024], dst[1024], model[2048], out[2048], big[2048];
    assert_non_null(temp_dir(src, sizeof src));
    assert_non_null(temp_dir(dst, sizeof dst));
    static const int64_t huge[1] = {600000000}; /* 2.4 GB of float32 */
    Onnx__TensorProto *t = tensor("huge", ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT, 1, huge);
    set_external(t, "big.bin", "0", "2400000000");
    Onnx__TensorProto *one[1] = {t};
    write_model(src, one, 1, NULL, 0);
    free(t);
    snprintf(big, sizeof big, "%s/big.bin", src);
    assert_int_equal(write_whole(big, "x", 1), 0);
    snprintf(model, sizeof model, "%s/model.onnx", src);
    snprintf(out, sizeof out, "%s/trained.onnx", dst);
    struct gp_error err = {0};
    assert_int_equal(gp_onnx_save(model, out, NULL, 0, &err), GP_ERR_UNSUPPORTED);
    assert_non_null(strstr(err.msg, "2 GiB"));
    assert_int_equal(count_entries(dst), 0);
    remove_tree(src);
    remove_tree(dst);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fixtures_round_trip),
        cmocka_unit_test(test_types_typed_fields_and_external_data),
        cmocka_unit_test(test_bad_requests_write_nothing),
        cmocka_unit_test(test_failed_writes_leave_nothing),
        cmocka_unit_test(test_over_2gib_is_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
