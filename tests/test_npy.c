/* .npy reading and writing: numpy's own files for every dtype and format
 * version (tests/data/npy, written by make.py there), byte-identical output,
 * and broken files that must fail with a message naming the file. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "data/npy.h"
#include "fixtures.h"

static const char *data_path(const char *name, char *buf, size_t size)
{
    const char *root = getenv("GP_SOURCE_ROOT");
    snprintf(buf, size, "%s/tests/data/npy/%s", root ? root : ".", name);
    return buf;
}

static void read_ok(const char *name, struct gp_npy *a)
{
    char path[4096];
    struct gp_error err = {0};
    if (gp_npy_read(data_path(name, path, sizeof path), a, &err) != GP_OK)
        fail_msg("%s: %s", name, err.msg);
}

static void assert_dims(const struct gp_npy *a, int rank, const int64_t *dims)
{
    assert_int_equal(a->shape.rank, rank);
    for (int i = 0; i < rank; i++) assert_int_equal(a->shape.dims[i], dims[i]);
}

/* The values make.py wrote, as float64 and (for the integer files) int64. */
static const double v_f[6] = {0.0, -1.5, 3.25, 1e-3, 65504.0, -2.0};
static const int64_t v_ints[6] = {0, -1, 2, -3, 100, -128};

static void test_every_dtype_from_numpy(void **state)
{
    (void)state;
    static const int64_t dims23[2] = {2, 3};
    struct {
        const char *file;
        enum gp_dtype dtype;
        int64_t scale; /* integer files: ints * scale */
    } cases[] = {
        {"f4.npy", GP_DTYPE_FLOAT32, 0}, {"f8.npy", GP_DTYPE_FLOAT64, 0},
        {"f2.npy", GP_DTYPE_FLOAT16, 0}, {"i8.npy", GP_DTYPE_INT64, 1000003},
        {"i4.npy", GP_DTYPE_INT32, 1001}, {"i2.npy", GP_DTYPE_INT16, 11},
        {"i1.npy", GP_DTYPE_INT8, 1},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        struct gp_npy a;
        read_ok(cases[c].file, &a);
        assert_int_equal(a.dtype, cases[c].dtype);
        assert_dims(&a, 2, dims23);
        assert_int_equal(a.nbytes, 6 * gp_dtype_size(cases[c].dtype));
        assert_int_equal((uintptr_t)a.data % 64, 0);
        float f[6];
        int64_t i64[6];
        struct gp_error err = {0};
        assert_int_equal(gp_npy_to_f32(&a, f, &err), GP_OK);
        for (int i = 0; i < 6; i++) {
            if (cases[c].scale) {
                assert_int_equal(gp_npy_to_i64(&a, i64, &err), GP_OK);
                assert_int_equal(i64[i], v_ints[i] * cases[c].scale);
                assert_true(f[i] == (float)(v_ints[i] * cases[c].scale));
            } else if (cases[c].dtype == GP_DTYPE_FLOAT16) {
                /* 1e-3 is not a half: numpy rounded it to the nearest one. */
                assert_true(f[i] == gp_half_to_float(gp_float_to_half((float)v_f[i])));
            } else {
                assert_true(f[i] == (float)v_f[i]);
            }
        }
        gp_npy_free(&a);
    }
}

static void test_unsigned_and_bool(void **state)
{
    (void)state;
    struct gp_error err = {0};
    int64_t out[6];
    struct gp_npy a;

    read_ok("u1.npy", &a);
    assert_int_equal(a.dtype, GP_DTYPE_UINT8);
    assert_int_equal(gp_npy_to_i64(&a, out, &err), GP_OK);
    static const int64_t u1[6] = {0, 1, 2, 127, 128, 255};
    for (int i = 0; i < 6; i++) assert_int_equal(out[i], u1[i]);
    gp_npy_free(&a);

    read_ok("u2.npy", &a);
    assert_int_equal(a.dtype, GP_DTYPE_UINT16);
    assert_int_equal(gp_npy_to_i64(&a, out, &err), GP_OK);
    assert_int_equal(out[4], 40000);
    assert_int_equal(out[5], 65535);
    gp_npy_free(&a);

    read_ok("u4.npy", &a);
    assert_int_equal(a.dtype, GP_DTYPE_UINT32);
    assert_int_equal(gp_npy_to_i64(&a, out, &err), GP_OK);
    assert_int_equal(out[4], 3000000000LL);
    assert_int_equal(out[5], 4294967295LL);
    gp_npy_free(&a);

    read_ok("u8.npy", &a);
    assert_int_equal(a.dtype, GP_DTYPE_UINT64);
    assert_int_equal(gp_npy_to_i64(&a, out, &err), GP_OK);
    assert_int_equal(out[5], (int64_t)1 << 62);
    gp_npy_free(&a);

    read_ok("b1.npy", &a);
    assert_int_equal(a.dtype, GP_DTYPE_BOOL);
    float f[6];
    assert_int_equal(gp_npy_to_f32(&a, f, &err), GP_OK);
    static const float b1[6] = {1, 0, 1, 0, 0, 1};
    for (int i = 0; i < 6; i++) assert_true(f[i] == b1[i]);
    gp_npy_free(&a);
}

static void test_versions_endianness_and_shapes(void **state)
{
    (void)state;
    struct gp_npy ref, a;
    read_ok("f4.npy", &ref);
    const char *same[] = {"f4_v2.npy", "f4_v3.npy", "big_f4.npy"};
    for (size_t i = 0; i < 3; i++) {
        read_ok(same[i], &a);
        assert_int_equal(a.dtype, GP_DTYPE_FLOAT32);
        assert_true(gp_shape_equal(&a.shape, &ref.shape));
        assert_memory_equal(a.data, ref.data, ref.nbytes);
        gp_npy_free(&a);
    }
    gp_npy_free(&ref);

    read_ok("i8.npy", &ref);
    read_ok("big_i8.npy", &a);
    assert_int_equal(a.dtype, GP_DTYPE_INT64);
    assert_memory_equal(a.data, ref.data, ref.nbytes);
    gp_npy_free(&a);
    gp_npy_free(&ref);

    read_ok("scalar.npy", &a);
    assert_int_equal(a.shape.rank, 0);
    assert_int_equal(gp_npy_numel(&a), 1);
    assert_true(((float *)a.data)[0] == 2.5f);
    gp_npy_free(&a);

    read_ok("empty.npy", &a);
    static const int64_t d03[2] = {0, 3};
    assert_dims(&a, 2, d03);
    assert_int_equal(a.nbytes, 0);
    gp_npy_free(&a);

    read_ok("rank1.npy", &a);
    static const int64_t d5[1] = {5};
    assert_dims(&a, 1, d5);
    assert_int_equal(((int64_t *)a.data)[4], 4);
    gp_npy_free(&a);

    read_ok("rank8.npy", &a);
    static const int64_t d8[8] = {2, 1, 2, 1, 1, 2, 1, 1};
    assert_dims(&a, 8, d8);
    assert_true(((float *)a.data)[7] == 7.0f);
    gp_npy_free(&a);
}

static void test_labels_saved_as_float(void **state)
{
    (void)state;
    struct gp_npy a;
    struct gp_error err = {0};
    read_ok("labels_f4.npy", &a);
    assert_int_equal(gp_npy_convert(&a, GP_DTYPE_INT64, &err), GP_OK);
    assert_int_equal(a.dtype, GP_DTYPE_INT64);
    assert_int_equal(a.nbytes, 4 * 8);
    static const int64_t want[4] = {3, 0, 9, 1};
    assert_memory_equal(a.data, want, sizeof want);
    gp_npy_free(&a);

    /* A fractional label is an error naming its position; `a` is kept. */
    read_ok("f4.npy", &a);
    assert_int_equal(gp_npy_convert(&a, GP_DTYPE_INT64, &err), GP_ERR_INVALID);
    assert_non_null(strstr(err.msg, "element 1"));
    assert_int_equal(a.dtype, GP_DTYPE_FLOAT32);
    gp_error_clear(&err);
    assert_int_equal(gp_npy_convert(&a, GP_DTYPE_FLOAT32, &err), GP_OK);
    gp_npy_free(&a);

    read_ok("f8.npy", &a);
    assert_int_equal(gp_npy_convert(&a, GP_DTYPE_FLOAT32, &err), GP_OK);
    assert_int_equal(a.dtype, GP_DTYPE_FLOAT32);
    assert_true(((float *)a.data)[3] == 1e-3f);
    gp_npy_free(&a);
}

/* Writing numpy's data back must give numpy's bytes exactly. */
static void test_write_is_byte_identical_to_numpy(void **state)
{
    (void)state;
    const char *files[] = {"f4.npy", "f8.npy", "f2.npy", "i8.npy", "i4.npy", "i2.npy",
                           "i1.npy", "u1.npy", "u2.npy", "u4.npy", "u8.npy", "b1.npy",
                           "scalar.npy", "empty.npy", "rank1.npy", "rank8.npy"};
    char dir[1024], out[2048], path[4096];
    assert_non_null(temp_dir(dir, sizeof dir));
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        struct gp_npy a;
        read_ok(files[i], &a);
        snprintf(out, sizeof out, "%s/%s", dir, files[i]);
        struct gp_error err = {0};
        if (gp_npy_write(out, a.dtype, &a.shape, a.data, &err) != GP_OK) fail_msg("%s", err.msg);
        size_t n1 = 0, n2 = 0;
        unsigned char *mine = read_whole(out, &n1);
        unsigned char *theirs = read_whole(data_path(files[i], path, sizeof path), &n2);
        assert_non_null(mine);
        assert_non_null(theirs);
        if (n1 != n2 || memcmp(mine, theirs, n1) != 0) fail_msg("%s differs from numpy's", files[i]);
        free(mine);
        free(theirs);
        struct gp_npy b;
        assert_int_equal(gp_npy_read(out, &b, &err), GP_OK);
        assert_int_equal(b.dtype, a.dtype);
        assert_true(gp_shape_equal(&a.shape, &b.shape));
        assert_memory_equal(a.data, b.data, a.nbytes);
        gp_npy_free(&b);
        gp_npy_free(&a);
        unlink(out);
    }
    rmdir(dir);
}

/* Round trip of a larger array and every header width (rank 0 to 8). */
static void test_round_trip_shapes(void **state)
{
    (void)state;
    char dir[1024], out[2048];
    assert_non_null(temp_dir(dir, sizeof dir));
    snprintf(out, sizeof out, "%s/x.npy", dir);
    for (int rank = 0; rank <= GP_MAX_RANK; rank++) {
        struct gp_shape s = {.rank = rank};
        for (int i = 0; i < rank; i++) s.dims[i] = i == 0 ? 1000 : 2;
        int64_t n = gp_shape_numel(&s);
        double *x = malloc(sizeof *x * (size_t)n);
        for (int64_t i = 0; i < n; i++) x[i] = sin((double)i) * 1e6;
        struct gp_error err = {0};
        assert_int_equal(gp_npy_write(out, GP_DTYPE_FLOAT64, &s, x, &err), GP_OK);
        struct gp_npy a;
        assert_int_equal(gp_npy_read(out, &a, &err), GP_OK);
        assert_true(gp_shape_equal(&a.shape, &s));
        assert_memory_equal(a.data, x, sizeof *x * (size_t)n);
        /* numpy's layout: data starts on a 64-byte boundary */
        size_t size = 0;
        unsigned char *bytes = read_whole(out, &size);
        assert_int_equal((size - a.nbytes) % 64, 0);
        free(bytes);
        gp_npy_free(&a);
        free(x);
    }
    unlink(out);
    rmdir(dir);
}

/* ---- broken files ---- */

/* A .npy image with the given version and header text, then `data_len`
 * bytes of data. */
static unsigned char *make_npy(int major, const char *header, size_t data_len, size_t *size)
{
    size_t hlen = strlen(header);
    size_t pre = major == 1 ? 10 : 12;
    *size = pre + hlen + data_len;
    unsigned char *b = calloc(1, *size);
    memcpy(b, "\x93NUMPY", 6);
    b[6] = (unsigned char)major;
    b[7] = 0;
    b[8] = (unsigned char)(hlen & 0xff);
    b[9] = (unsigned char)(hlen >> 8);
    if (major > 1) {
        b[10] = (unsigned char)(hlen >> 16);
        b[11] = (unsigned char)(hlen >> 24);
    }
    memcpy(b + pre, header, hlen);
    return b;
}

static gp_status try_header(const char *header, size_t data_len, struct gp_error *err)
{
    size_t size;
    unsigned char *b = make_npy(1, header, data_len, &size);
    struct gp_npy a;
    gp_error_clear(err);
    gp_status st = gp_npy_read_buffer(b, size, "test.npy", &a, err);
    if (st == GP_OK) gp_npy_free(&a);
    else if (!strstr(err->msg, "test.npy")) fail_msg("message does not name the file: %s", err->msg);
    free(b);
    return st;
}

static void test_bad_headers(void **state)
{
    (void)state;
    struct gp_error err = {0};
    /* sanity: the good header and its accepted variants */
    assert_int_equal(try_header("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }\n", 24, &err), GP_OK);
    assert_int_equal(try_header("{\"shape\": (2,3), \"descr\": \"<f4\", \"fortran_order\": False}", 24, &err), GP_OK);
    assert_int_equal(try_header("{'descr': '<i8', 'fortran_order': False, 'shape': (3L,), }", 24, &err), GP_OK);
    assert_int_equal(try_header("{'descr': '=f4', 'fortran_order': False, 'shape': (), }", 4, &err), GP_OK);

    struct {
        const char *header;
        size_t data;
        gp_status want;
        const char *says;
    } bad[] = {
        {"{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3), }", 24, GP_ERR_UNSUPPORTED, "Fortran"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", 20, GP_ERR_PARSE, "truncated"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", 28, GP_ERR_PARSE, "holds 28"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (2, 4), }", 24, GP_ERR_PARSE, "needs 32"},
        {"{'descr': '<f4', 'fortran_order': False}", 4, GP_ERR_PARSE, "shape"},
        {"{'descr': '<f4', 'shape': (1,)}", 4, GP_ERR_PARSE, "fortran_order"},
        {"{'fortran_order': False, 'shape': (1,)}", 4, GP_ERR_PARSE, "descr"},
        {"{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (1,)}", 4, GP_ERR_PARSE, "twice"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (1,), 'extra': 1}", 4, GP_ERR_PARSE, "extra"},
        {"{'descr': '<c8', 'fortran_order': False, 'shape': (1,)}", 8, GP_ERR_UNSUPPORTED, "<c8"},
        {"{'descr': '|f4', 'fortran_order': False, 'shape': (1,)}", 4, GP_ERR_PARSE, "|f4"},
        {"{'descr': '<f', 'fortran_order': False, 'shape': (1,)}", 4, GP_ERR_PARSE, "descr"},
        {"{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (1,)}", 4, GP_ERR_UNSUPPORTED, "structured"},
        {"{'descr': '<f4', 'fortran_order': 0, 'shape': (1,)}", 4, GP_ERR_PARSE, "fortran_order"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (4)}", 16, GP_ERR_PARSE, "tuple"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (-1,)}", 4, GP_ERR_PARSE, "shape"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (2 3,)}", 24, GP_ERR_PARSE, "shape"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (1,1,1,1,1,1,1,1,1)}", 4, GP_ERR_UNSUPPORTED, "8 dimensions"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (4611686018427387904, 4)}", 4, GP_ERR_PARSE, "too large"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999999,)}", 4, GP_ERR_PARSE, "too large"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (1,)} x", 4, GP_ERR_PARSE, "after"},
        {"['descr', '<f4']", 4, GP_ERR_PARSE, "dict"},
        {"{'descr': '<f4' 'fortran_order': False, 'shape': (1,)}", 4, GP_ERR_PARSE, "malformed"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (1,)", 4, GP_ERR_PARSE, "malformed"},
        {"{'descr': '<f4\xc3\xa9', 'fortran_order': False, 'shape': (1,)}", 4, GP_ERR_PARSE, "ASCII"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        gp_status st = try_header(bad[i].header, bad[i].data, &err);
        if (st != bad[i].want || !strstr(err.msg, bad[i].says))
            fail_msg("header %zu (%s): status %d, message '%s'", i, bad[i].header, st, err.msg);
    }
}

static void test_bad_prefix_and_truncation(void **state)
{
    (void)state;
    char path[4096];
    size_t size = 0;
    unsigned char *good = read_whole(data_path("f4.npy", path, sizeof path), &size);
    assert_non_null(good);
    struct gp_error err = {0};
    struct gp_npy a;
    /* every truncation is an error, never a crash */
    for (size_t n = 0; n < size; n++) {
        gp_error_clear(&err);
        unsigned char *cut = malloc(n ? n : 1);
        memcpy(cut, good, n);
        if (gp_npy_read_buffer(cut, n, "cut.npy", &a, &err) == GP_OK) fail_msg("truncated to %zu accepted", n);
        assert_non_null(strstr(err.msg, "cut.npy"));
        free(cut);
    }
    unsigned char *b = malloc(size);
    memcpy(b, good, size);
    b[1] = 'X';
    gp_error_clear(&err);
    assert_int_equal(gp_npy_read_buffer(b, size, "m.npy", &a, &err), GP_ERR_PARSE);
    assert_non_null(strstr(err.msg, "magic"));
    memcpy(b, good, size);
    b[6] = 4;
    gp_error_clear(&err);
    assert_int_equal(gp_npy_read_buffer(b, size, "m.npy", &a, &err), GP_ERR_UNSUPPORTED);
    assert_non_null(strstr(err.msg, "version 4.0"));
    /* a header length larger than the file */
    memcpy(b, good, size);
    b[8] = 0xff;
    b[9] = 0x7f;
    gp_error_clear(&err);
    assert_int_equal(gp_npy_read_buffer(b, size, "m.npy", &a, &err), GP_ERR_PARSE);
    free(b);

    /* an absurd version 2.0 header length */
    size_t n;
    unsigned char *v2 = make_npy(2, "{'descr': '<f4', 'fortran_order': False, 'shape': (1,)}", 4, &n);
    v2[8] = v2[9] = v2[10] = 0xff;
    v2[11] = 0x7f;
    gp_error_clear(&err);
    assert_int_equal(gp_npy_read_buffer(v2, n, "h.npy", &a, &err), GP_ERR_PARSE);
    assert_non_null(strstr(err.msg, "absurd"));
    free(v2);

    /* flipped bytes anywhere in the header: any outcome but a crash, and a
     * success only with a consistent array */
    unsigned int seed = 12345;
    for (int trial = 0; trial < 4000; trial++) {
        unsigned char *f = malloc(size);
        memcpy(f, good, size);
        for (int k = 0; k < 1 + trial % 3; k++) {
            seed = seed * 1103515245u + 12345u;
            size_t at = (seed >> 8) % 128;
            seed = seed * 1103515245u + 12345u;
            f[at] = (unsigned char)(seed >> 16);
        }
        gp_error_clear(&err);
        if (gp_npy_read_buffer(f, size, "fuzz.npy", &a, &err) == GP_OK) {
            assert_int_equal(a.nbytes, (size_t)gp_npy_numel(&a) * gp_dtype_size(a.dtype));
            gp_npy_free(&a);
        }
        free(f);
    }

    /* the same through a file: truncated on disk, and a missing file */
    char dir[1024], p[2048];
    assert_non_null(temp_dir(dir, sizeof dir));
    snprintf(p, sizeof p, "%s/short.npy", dir);
    assert_int_equal(write_whole(p, good, size - 1), 0);
    gp_error_clear(&err);
    assert_int_equal(gp_npy_read(p, &a, &err), GP_ERR_PARSE);
    assert_non_null(strstr(err.msg, p));
    assert_non_null(strstr(err.msg, "truncated"));
    unlink(p);
    gp_error_clear(&err);
    assert_int_equal(gp_npy_read(p, &a, &err), GP_ERR_IO);
    assert_non_null(strstr(err.msg, p));
    gp_error_clear(&err);
    assert_int_equal(gp_npy_read(dir, &a, &err), GP_ERR_IO);
    gp_error_clear(&err);
    assert_int_equal(gp_npy_read(data_path("fortran.npy", path, sizeof path), &a, &err),
                     GP_ERR_UNSUPPORTED);
    assert_non_null(strstr(err.msg, "fortran.npy"));
    assert_non_null(strstr(err.msg, "Fortran order"));
    rmdir(dir);
    free(good);
}

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

/* A failing write leaves no temporary file and keeps the old file intact. */
static void test_write_failures_leave_nothing(void **state)
{
    (void)state;
    char dir[1024], p[2048];
    assert_non_null(temp_dir(dir, sizeof dir));
    float x[256];
    for (int i = 0; i < 256; i++) x[i] = (float)i;
    struct gp_shape s = {.rank = 1, .dims = {256}};
    struct gp_error err = {0};

    snprintf(p, sizeof p, "%s/missing/x.npy", dir);
    assert_int_equal(gp_npy_write(p, GP_DTYPE_FLOAT32, &s, x, &err), GP_ERR_IO);
    assert_non_null(strstr(err.msg, p));
    assert_int_equal(count_entries(dir), 0);

    /* the destination is a folder: rename fails after the data was written */
    snprintf(p, sizeof p, "%s/adir", dir);
    assert_int_equal(mkdir(p, 0755), 0);
    gp_error_clear(&err);
    assert_int_equal(gp_npy_write(p, GP_DTYPE_FLOAT32, &s, x, &err), GP_ERR_IO);
    assert_non_null(strstr(err.msg, "rename"));
    assert_int_equal(count_entries(dir), 1);
    rmdir(p);

    /* a write cut short by the file size limit */
    snprintf(p, sizeof p, "%s/x.npy", dir);
    assert_int_equal(gp_npy_write(p, GP_DTYPE_FLOAT32, &s, x, &err), GP_OK);
    struct rlimit old, lim;
    getrlimit(RLIMIT_FSIZE, &old);
    lim = old;
    lim.rlim_cur = 500; /* less than the 1152-byte file */
    void (*prev)(int) = signal(SIGXFSZ, SIG_IGN);
    assert_int_equal(setrlimit(RLIMIT_FSIZE, &lim), 0);
    float y[256] = {0};
    gp_error_clear(&err);
    gp_status st = gp_npy_write(p, GP_DTYPE_FLOAT32, &s, y, &err);
    setrlimit(RLIMIT_FSIZE, &old);
    signal(SIGXFSZ, prev);
    assert_int_equal(st, GP_ERR_IO);
    assert_int_equal(count_entries(dir), 1);
    struct gp_npy a;
    assert_int_equal(gp_npy_read(p, &a, &err), GP_OK);
    assert_memory_equal(a.data, x, sizeof x);
    gp_npy_free(&a);

    /* a type .npy files cannot hold */
    gp_error_clear(&err);
    assert_int_equal(gp_npy_write(p, GP_DTYPE_BFLOAT16, &s, x, &err), GP_ERR_UNSUPPORTED);
    unlink(p);
    rmdir(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_dtype_from_numpy),
        cmocka_unit_test(test_unsigned_and_bool),
        cmocka_unit_test(test_versions_endianness_and_shapes),
        cmocka_unit_test(test_labels_saved_as_float),
        cmocka_unit_test(test_write_is_byte_identical_to_numpy),
        cmocka_unit_test(test_round_trip_shapes),
        cmocka_unit_test(test_bad_headers),
        cmocka_unit_test(test_bad_prefix_and_truncation),
        cmocka_unit_test(test_write_failures_leave_nothing),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
