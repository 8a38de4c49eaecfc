#include "data/npy.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util/atomic_file.h"

/* "\x93NUMPY", major, minor, then the header length: 2 bytes in 1.0, 4 bytes
 * in 2.0 and 3.0 (3.0 only allows utf-8 in the header, which we never need). */
static const unsigned char npy_magic[6] = {0x93, 'N', 'U', 'M', 'P', 'Y'};

/* ---- dtypes ---- */

static const struct {
    char kind;   /* numpy's type character */
    int size;
    enum gp_dtype dtype;
} npy_types[] = {
    {'f', 4, GP_DTYPE_FLOAT32}, {'f', 8, GP_DTYPE_FLOAT64}, {'f', 2, GP_DTYPE_FLOAT16},
    {'i', 8, GP_DTYPE_INT64},   {'i', 4, GP_DTYPE_INT32},   {'i', 2, GP_DTYPE_INT16},
    {'i', 1, GP_DTYPE_INT8},    {'u', 8, GP_DTYPE_UINT64},  {'u', 4, GP_DTYPE_UINT32},
    {'u', 2, GP_DTYPE_UINT16},  {'u', 1, GP_DTYPE_UINT8},   {'b', 1, GP_DTYPE_BOOL},
};

const char *gp_npy_descr(enum gp_dtype dtype)
{
    switch (dtype) {
    case GP_DTYPE_FLOAT32: return "<f4";
    case GP_DTYPE_FLOAT64: return "<f8";
    case GP_DTYPE_FLOAT16: return "<f2";
    case GP_DTYPE_INT64: return "<i8";
    case GP_DTYPE_INT32: return "<i4";
    case GP_DTYPE_INT16: return "<i2";
    case GP_DTYPE_INT8: return "|i1";
    case GP_DTYPE_UINT64: return "<u8";
    case GP_DTYPE_UINT32: return "<u4";
    case GP_DTYPE_UINT16: return "<u2";
    case GP_DTYPE_UINT8: return "|u1";
    case GP_DTYPE_BOOL: return "|b1";
    default: return NULL;
    }
}

/* Parses a descr such as "<f4"; *swap is set for big-endian data. */
static gp_status parse_descr(const char *d, const char *name, enum gp_dtype *dtype, bool *swap,
                             struct gp_error *err)
{
    const char *s = d;
    char order = '=';
    if (*s == '<' || *s == '>' || *s == '|' || *s == '=') order = *s++;
    char kind = *s ? *s++ : '\0';
    char *end = NULL;
    long size = 0;
    if (*s >= '0' && *s <= '9') size = strtol(s, &end, 10);
    if (!end || *end || size <= 0)
        return gp_error_set(err, GP_ERR_PARSE, "%s: dtype descr '%s' is not valid", name, d);
    for (size_t i = 0; i < sizeof npy_types / sizeof npy_types[0]; i++) {
        if (npy_types[i].kind != kind || npy_types[i].size != size) continue;
        if (order == '|' && size != 1)
            return gp_error_set(err, GP_ERR_PARSE,
                                "%s: dtype descr '%s' has no byte order but %ld-byte elements",
                                name, d, size);
        *dtype = npy_types[i].dtype;
        *swap = order == '>' && size > 1;
        return GP_OK;
    }
    return gp_error_set(err, GP_ERR_UNSUPPORTED,
                        "%s: dtype '%s' is not supported (use float32/64/16, int8/16/32/64, "
                        "uint8/16/32/64 or bool)",
                        name, d);
}

/* ---- the header: a Python dict literal ----
 * {'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }
 * Keys may come in any order, each exactly once; strings may use either
 * quote; Python 2 files may write longs as "3L". */

struct cursor {
    const char *p, *end;
};

static void skip_ws(struct cursor *c)
{
    while (c->p < c->end && (*c->p == ' ' || *c->p == '\t' || *c->p == '\n' || *c->p == '\r'))
        c->p++;
}

static bool eat(struct cursor *c, char ch)
{
    skip_ws(c);
    if (c->p < c->end && *c->p == ch) {
        c->p++;
        return true;
    }
    return false;
}

/* A quoted string without escapes (none of ours need any) into buf. */
static bool parse_string(struct cursor *c, char *buf, size_t size)
{
    skip_ws(c);
    if (c->p >= c->end || (*c->p != '\'' && *c->p != '"')) return false;
    char q = *c->p++;
    size_t n = 0;
    while (c->p < c->end && *c->p != q) {
        if (*c->p == '\\' || n + 1 >= size) return false;
        buf[n++] = *c->p++;
    }
    if (c->p >= c->end) return false;
    c->p++;
    buf[n] = '\0';
    return true;
}

static bool parse_word(struct cursor *c, const char *word)
{
    skip_ws(c);
    size_t n = strlen(word);
    if ((size_t)(c->end - c->p) < n || memcmp(c->p, word, n) != 0) return false;
    const char *after = c->p + n;
    if (after < c->end && ((*after >= 'a' && *after <= 'z') || (*after >= 'A' && *after <= 'Z') ||
                           (*after >= '0' && *after <= '9') || *after == '_'))
        return false;
    c->p = after;
    return true;
}

/* A tuple of non-negative integers: (), (3,), (2, 3) or (2, 3,). */
static gp_status parse_shape(struct cursor *c, const char *name, struct gp_shape *shape,
                             struct gp_error *err)
{
    if (!eat(c, '('))
        return gp_error_set(err, GP_ERR_PARSE, "%s: header 'shape' is not a tuple", name);
    shape->rank = 0;
    bool comma_after_last = false;
    for (;;) {
        skip_ws(c);
        if (eat(c, ')')) break;
        if (shape->rank > 0 && !comma_after_last)
            return gp_error_set(err, GP_ERR_PARSE, "%s: header 'shape' is malformed", name);
        if (c->p >= c->end || *c->p < '0' || *c->p > '9')
            return gp_error_set(err, GP_ERR_PARSE,
                                "%s: header 'shape' holds something other than non-negative "
                                "integers",
                                name);
        int64_t v = 0;
        while (c->p < c->end && *c->p >= '0' && *c->p <= '9') {
            int digit = *c->p++ - '0';
            if (v > (INT64_MAX - digit) / 10)
                return gp_error_set(err, GP_ERR_PARSE, "%s: a dimension in 'shape' is too large",
                                    name);
            v = v * 10 + digit;
        }
        if (c->p < c->end && (*c->p == 'L' || *c->p == 'l')) c->p++; /* Python 2 long */
        if (shape->rank == GP_MAX_RANK)
            return gp_error_set(err, GP_ERR_UNSUPPORTED,
                                "%s: the array has more than %d dimensions", name, GP_MAX_RANK);
        shape->dims[shape->rank++] = v;
        comma_after_last = eat(c, ',');
    }
    /* "(3)" is the integer 3 in Python, not a tuple: numpy refuses it too. */
    if (shape->rank == 1 && !comma_after_last)
        return gp_error_set(err, GP_ERR_PARSE, "%s: header 'shape' (n) is not a tuple", name);
    return GP_OK;
}

static gp_status parse_header(const char *text, size_t len, const char *name, enum gp_dtype *dtype,
                              bool *swap, struct gp_shape *shape, struct gp_error *err)
{
    struct cursor c = {text, text + len};
    bool have_descr = false, have_order = false, have_shape = false;
    if (!eat(&c, '{'))
        return gp_error_set(err, GP_ERR_PARSE, "%s: the header is not a Python dict", name);
    for (;;) {
        if (eat(&c, '}')) break;
        char key[32];
        if (!parse_string(&c, key, sizeof key) || !eat(&c, ':'))
            return gp_error_set(err, GP_ERR_PARSE, "%s: the header dict is malformed", name);
        if (strcmp(key, "descr") == 0) {
            if (have_descr)
                return gp_error_set(err, GP_ERR_PARSE, "%s: header key 'descr' appears twice", name);
            have_descr = true;
            char descr[32];
            skip_ws(&c);
            if (c.p < c.end && *c.p == '[')
                return gp_error_set(err, GP_ERR_UNSUPPORTED,
                                    "%s: structured dtypes are not supported", name);
            if (!parse_string(&c, descr, sizeof descr))
                return gp_error_set(err, GP_ERR_PARSE, "%s: header 'descr' is not a dtype string",
                                    name);
            GP_TRY(parse_descr(descr, name, dtype, swap, err));
        } else if (strcmp(key, "fortran_order") == 0) {
            if (have_order)
                return gp_error_set(err, GP_ERR_PARSE, "%s: header key 'fortran_order' appears twice",
                                    name);
            have_order = true;
            if (parse_word(&c, "True"))
                return gp_error_set(err, GP_ERR_UNSUPPORTED,
                                    "%s: the array is in Fortran order; save it in C order "
                                    "(np.save(path, np.ascontiguousarray(a)))",
                                    name);
            if (!parse_word(&c, "False"))
                return gp_error_set(err, GP_ERR_PARSE, "%s: header 'fortran_order' is not True or False",
                                    name);
        } else if (strcmp(key, "shape") == 0) {
            if (have_shape)
                return gp_error_set(err, GP_ERR_PARSE, "%s: header key 'shape' appears twice", name);
            have_shape = true;
            GP_TRY(parse_shape(&c, name, shape, err));
        } else {
            return gp_error_set(err, GP_ERR_PARSE, "%s: unexpected header key '%s'", name, key);
        }
        if (!eat(&c, ',')) {
            if (eat(&c, '}')) break;
            return gp_error_set(err, GP_ERR_PARSE, "%s: the header dict is malformed", name);
        }
    }
    skip_ws(&c);
    if (c.p != c.end)
        return gp_error_set(err, GP_ERR_PARSE, "%s: unexpected bytes after the header dict", name);
    if (!have_descr || !have_order || !have_shape)
        return gp_error_set(err, GP_ERR_PARSE, "%s: the header lacks '%s'", name,
                            !have_descr ? "descr" : !have_order ? "fortran_order" : "shape");
    return GP_OK;
}

/* Checks the fixed prefix and returns the header's offset and length. */
static gp_status parse_prefix(const unsigned char *b, size_t avail, uint64_t file_size,
                              const char *name, size_t *hstart, size_t *hlen, struct gp_error *err)
{
    if (avail < 10 || memcmp(b, npy_magic, sizeof npy_magic) != 0)
        return gp_error_set(err, GP_ERR_PARSE, "%s: not a .npy file (bad magic)", name);
    int major = b[6], minor = b[7];
    if ((major < 1 || major > 3) || minor != 0)
        return gp_error_set(err, GP_ERR_UNSUPPORTED, "%s: .npy format version %d.%d is not supported",
                            name, major, minor);
    if (major == 1) {
        *hstart = 10;
        *hlen = (size_t)b[8] | (size_t)b[9] << 8;
    } else {
        if (avail < 12)
            return gp_error_set(err, GP_ERR_PARSE, "%s: truncated .npy header", name);
        *hstart = 12;
        *hlen = (size_t)b[8] | (size_t)b[9] << 8 | (size_t)b[10] << 16 | (size_t)b[11] << 24;
    }
    if (*hlen > GP_NPY_MAX_HEADER)
        return gp_error_set(err, GP_ERR_PARSE, "%s: header length %zu is absurd (at most %d)", name,
                            *hlen, GP_NPY_MAX_HEADER);
    if (*hstart + *hlen > file_size)
        return gp_error_set(err, GP_ERR_PARSE,
                            "%s: truncated: the header says %zu bytes but the file has %llu", name,
                            *hstart + *hlen, (unsigned long long)file_size);
    return GP_OK;
}

/* Header text -> dtype and shape, with the data size checked against what
 * the file holds after the header. */
static gp_status describe(const char *text, size_t hlen, uint64_t data_bytes, const char *name,
                          struct gp_npy *out, bool *swap, struct gp_error *err)
{
    for (size_t i = 0; i < hlen; i++)
        if (text[i] == '\0' || (unsigned char)text[i] >= 0x80)
            return gp_error_set(err, GP_ERR_PARSE, "%s: the header holds non-ASCII bytes", name);
    GP_TRY(parse_header(text, hlen, name, &out->dtype, swap, &out->shape, err));
    size_t esize = gp_dtype_size(out->dtype);
    char s[256];
    if (!gp_shape_check(&out->shape, esize))
        return gp_error_set(err, GP_ERR_PARSE, "%s: shape %s is too large", name,
                            gp_shape_format(&out->shape, s, sizeof s));
    uint64_t need = (uint64_t)gp_shape_numel(&out->shape) * esize;
    if (need != data_bytes)
        return gp_error_set(err, GP_ERR_PARSE,
                            "%s: shape %s of %s needs %llu bytes of data but the file holds %llu%s",
                            name, gp_shape_format(&out->shape, s, sizeof s),
                            gp_dtype_name(out->dtype), (unsigned long long)need,
                            (unsigned long long)data_bytes,
                            need > data_bytes ? " (truncated)" : "");
    if (need > SIZE_MAX - 64)
        return gp_error_set(err, GP_ERR_NOMEM, "%s: %llu bytes do not fit in memory", name,
                            (unsigned long long)need);
    out->nbytes = (size_t)need;
    return GP_OK;
}

static void *alloc_data(size_t nbytes)
{
    /* aligned_alloc wants a size that is a multiple of the alignment. */
    size_t rounded = (nbytes + 63) & ~(size_t)63;
    return aligned_alloc(64, rounded ? rounded : 64);
}

static void byteswap(void *data, size_t nbytes, size_t esize)
{
    unsigned char *b = data;
    for (size_t i = 0; i + esize <= nbytes; i += esize)
        for (size_t k = 0; k < esize / 2; k++) {
            unsigned char t = b[i + k];
            b[i + k] = b[i + esize - 1 - k];
            b[i + esize - 1 - k] = t;
        }
}

gp_status gp_npy_read_buffer(const void *bytes, size_t size, const char *name, struct gp_npy *out,
                             struct gp_error *err)
{
    memset(out, 0, sizeof *out);
    const unsigned char *b = bytes;
    size_t hstart, hlen;
    GP_TRY(parse_prefix(b, size, size, name, &hstart, &hlen, err));
    struct gp_npy a = {0};
    bool swap = false;
    GP_TRY(describe((const char *)b + hstart, hlen, size - hstart - hlen, name, &a, &swap, err));
    a.data = alloc_data(a.nbytes);
    if (!a.data) return gp_error_set(err, GP_ERR_NOMEM, "%s: out of memory (%zu bytes)", name, a.nbytes);
    if (a.nbytes) memcpy(a.data, b + hstart + hlen, a.nbytes);
    if (swap) byteswap(a.data, a.nbytes, gp_dtype_size(a.dtype));
    *out = a;
    return GP_OK;
}

/* pread until `n` bytes arrived; false on error or early end of file. */
static bool read_fully(int fd, void *buf, size_t n, uint64_t offset)
{
    unsigned char *p = buf;
    while (n > 0) {
        /* Linux transfers at most ~2 GiB per call: loop for larger arrays. */
        ssize_t r = pread(fd, p, n, (off_t)offset);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return false;
        p += r;
        n -= (size_t)r;
        offset += (uint64_t)r;
    }
    return true;
}

gp_status gp_npy_read(const char *path, struct gp_npy *out, struct gp_error *err)
{
    memset(out, 0, sizeof *out);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return gp_error_set(err, GP_ERR_IO, "cannot open '%s': %s", path, strerror(errno));
    gp_status st = GP_OK;
    char *header = NULL;
    struct gp_npy a = {0};
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        st = gp_error_set(err, GP_ERR_IO, "'%s' is not a regular file", path);
        goto done;
    }
    uint64_t fsize = (uint64_t)sb.st_size;
    unsigned char prefix[12] = {0};
    size_t avail = fsize < sizeof prefix ? (size_t)fsize : sizeof prefix;
    if (!read_fully(fd, prefix, avail, 0)) {
        st = gp_error_set(err, GP_ERR_IO, "cannot read '%s': %s", path, strerror(errno));
        goto done;
    }
    size_t hstart, hlen;
    if ((st = parse_prefix(prefix, avail, fsize, path, &hstart, &hlen, err)) != GP_OK) goto done;
    header = malloc(hlen + 1);
    if (!header) {
        st = gp_error_set(err, GP_ERR_NOMEM, "%s: out of memory", path);
        goto done;
    }
    if (!read_fully(fd, header, hlen, hstart)) {
        st = gp_error_set(err, GP_ERR_IO, "cannot read the header of '%s'", path);
        goto done;
    }
    bool swap = false;
    if ((st = describe(header, hlen, fsize - hstart - hlen, path, &a, &swap, err)) != GP_OK) goto done;
#ifdef POSIX_FADV_SEQUENTIAL
    posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
#endif
    a.data = alloc_data(a.nbytes);
    if (!a.data) {
        st = gp_error_set(err, GP_ERR_NOMEM, "%s: out of memory (%zu bytes)", path, a.nbytes);
        goto done;
    }
    if (!read_fully(fd, a.data, a.nbytes, hstart + hlen)) {
        st = gp_error_set(err, GP_ERR_IO, "%s: the data could not be read (file changed or "
                                          "truncated while reading?)",
                          path);
        goto done;
    }
    if (swap) byteswap(a.data, a.nbytes, gp_dtype_size(a.dtype));
    *out = a;
    a.data = NULL;
done:
    free(a.data);
    free(header);
    close(fd);
    return st;
}

void gp_npy_free(struct gp_npy *a)
{
    if (!a) return;
    free(a->data);
    memset(a, 0, sizeof *a);
}

int64_t gp_npy_numel(const struct gp_npy *a)
{
    return gp_shape_numel(&a->shape);
}

/* ---- conversions ---- */

static double elem_f64(const struct gp_npy *a, int64_t i)
{
    struct gp_tensor t = {a->dtype, a->shape, a->data, a->nbytes};
    return gp_tensor_get_f64(&t, i);
}

gp_status gp_npy_to_f32(const struct gp_npy *a, float *out, struct gp_error *err)
{
    int64_t n = gp_npy_numel(a);
    switch (a->dtype) {
    case GP_DTYPE_FLOAT32: if (n) memcpy(out, a->data, (size_t)n * 4); return GP_OK;
    case GP_DTYPE_FLOAT64:
        for (int64_t i = 0; i < n; i++) out[i] = (float)((const double *)a->data)[i];
        return GP_OK;
    case GP_DTYPE_FLOAT16:
        for (int64_t i = 0; i < n; i++) out[i] = gp_half_to_float(((const uint16_t *)a->data)[i]);
        return GP_OK;
    case GP_DTYPE_INT64:
        for (int64_t i = 0; i < n; i++) out[i] = (float)((const int64_t *)a->data)[i];
        return GP_OK;
    case GP_DTYPE_UINT64:
        for (int64_t i = 0; i < n; i++) out[i] = (float)((const uint64_t *)a->data)[i];
        return GP_OK;
    case GP_DTYPE_BOOL:
        for (int64_t i = 0; i < n; i++) out[i] = ((const uint8_t *)a->data)[i] ? 1.0f : 0.0f;
        return GP_OK;
    case GP_DTYPE_INT32: case GP_DTYPE_INT16: case GP_DTYPE_INT8: case GP_DTYPE_UINT32:
    case GP_DTYPE_UINT16: case GP_DTYPE_UINT8:
        /* exact in double, then one rounding to float */
        for (int64_t i = 0; i < n; i++) out[i] = (float)elem_f64(a, i);
        return GP_OK;
    default:
        return gp_error_set(err, GP_ERR_UNSUPPORTED, "cannot convert %s to float32",
                            gp_dtype_name(a->dtype));
    }
}

gp_status gp_npy_to_i64(const struct gp_npy *a, int64_t *out, struct gp_error *err)
{
    int64_t n = gp_npy_numel(a);
    switch (a->dtype) {
    case GP_DTYPE_INT64: if (n) memcpy(out, a->data, (size_t)n * 8); return GP_OK;
    case GP_DTYPE_BOOL:
        for (int64_t i = 0; i < n; i++) out[i] = ((const uint8_t *)a->data)[i] ? 1 : 0;
        return GP_OK;
    case GP_DTYPE_UINT64:
        for (int64_t i = 0; i < n; i++) {
            uint64_t v = ((const uint64_t *)a->data)[i];
            if (v > (uint64_t)INT64_MAX)
                return gp_error_set(err, GP_ERR_INVALID, "element %lld is %llu, beyond int64",
                                    (long long)i, (unsigned long long)v);
            out[i] = (int64_t)v;
        }
        return GP_OK;
    case GP_DTYPE_INT32: case GP_DTYPE_INT16: case GP_DTYPE_INT8: case GP_DTYPE_UINT32:
    case GP_DTYPE_UINT16: case GP_DTYPE_UINT8: {
        struct gp_tensor t = {a->dtype, a->shape, a->data, a->nbytes};
        for (int64_t i = 0; i < n; i++) out[i] = gp_tensor_get_i64(&t, i);
        return GP_OK;
    }
    case GP_DTYPE_FLOAT32: case GP_DTYPE_FLOAT64: case GP_DTYPE_FLOAT16:
        for (int64_t i = 0; i < n; i++) {
            double v = elem_f64(a, i);
            /* 2^63 is exactly representable; anything at or above it is not an int64. */
            if (!(v == floor(v)) || v < -9223372036854775808.0 || v >= 9223372036854775808.0)
                return gp_error_set(err, GP_ERR_INVALID,
                                    "element %lld is %.17g, not an integer (labels must be whole "
                                    "numbers)",
                                    (long long)i, v);
            out[i] = (int64_t)v;
        }
        return GP_OK;
    default:
        return gp_error_set(err, GP_ERR_UNSUPPORTED, "cannot convert %s to int64",
                            gp_dtype_name(a->dtype));
    }
}

gp_status gp_npy_convert(struct gp_npy *a, enum gp_dtype to, struct gp_error *err)
{
    if (a->dtype == to) return GP_OK;
    if (to != GP_DTYPE_FLOAT32 && to != GP_DTYPE_INT64)
        return gp_error_set(err, GP_ERR_UNSUPPORTED, "cannot convert an array to %s",
                            gp_dtype_name(to));
    int64_t n = gp_npy_numel(a);
    size_t nbytes = (size_t)n * gp_dtype_size(to);
    if (n && nbytes / (size_t)n != gp_dtype_size(to))
        return gp_error_set(err, GP_ERR_NOMEM, "array too large to convert");
    void *data = alloc_data(nbytes);
    if (!data) return gp_error_set(err, GP_ERR_NOMEM, "out of memory (%zu bytes)", nbytes);
    gp_status st = to == GP_DTYPE_FLOAT32 ? gp_npy_to_f32(a, data, err) : gp_npy_to_i64(a, data, err);
    if (st != GP_OK) {
        free(data);
        return st;
    }
    free(a->data);
    a->data = data;
    a->nbytes = nbytes;
    a->dtype = to;
    return GP_OK;
}

/* ---- writing ---- */

/* The header and the data, written atomically (util/atomic_file.h). */
static gp_status atomic_write(const char *path, const void *head, size_t head_len, const void *body,
                              size_t body_len, struct gp_error *err)
{
    struct gp_atomic_file f;
    GP_TRY(gp_atomic_create(&f, path, err));
    gp_atomic_write(&f, head, head_len);
    gp_atomic_write(&f, body, body_len);
    return gp_atomic_commit(&f, err);
}

gp_status gp_npy_write(const char *path, enum gp_dtype dtype, const struct gp_shape *shape,
                       const void *data, struct gp_error *err)
{
    const char *descr = gp_npy_descr(dtype);
    if (!descr)
        return gp_error_set(err, GP_ERR_UNSUPPORTED, "%s: .npy files cannot hold %s here", path,
                            gp_dtype_name(dtype));
    size_t esize = gp_dtype_size(dtype);
    if (!gp_shape_check(shape, esize))
        return gp_error_set(err, GP_ERR_SHAPE, "%s: invalid shape", path);
    /* numpy 1.24's layout: sorted keys, repr of the shape tuple, room for
     * the first axis to grow to 21 digits, spaces up to a multiple of 64
     * bytes with the newline, version 1.0. */
    char dict[512];
    int n = snprintf(dict, sizeof dict, "{'descr': '%s', 'fortran_order': False, 'shape': (", descr);
    for (int i = 0; i < shape->rank; i++)
        n += snprintf(dict + n, sizeof dict - (size_t)n, "%s%lld", i ? ", " : "",
                      (long long)shape->dims[i]);
    n += snprintf(dict + n, sizeof dict - (size_t)n, "%s), }", shape->rank == 1 ? "," : "");
    if (shape->rank > 0) {
        char first[32];
        int digits = snprintf(first, sizeof first, "%lld", (long long)shape->dims[0]);
        for (int i = digits; i < 21; i++) dict[n++] = ' ';
    }
    size_t hlen = (size_t)n + 1; /* with the newline */
    size_t pad = 64 - ((10 + hlen) % 64); /* 1..64, as numpy computes it */
    unsigned char head[640];
    memcpy(head, npy_magic, 6);
    head[6] = 1;
    head[7] = 0;
    size_t total = hlen + pad;
    head[8] = (unsigned char)(total & 0xff);
    head[9] = (unsigned char)(total >> 8);
    memcpy(head + 10, dict, (size_t)n);
    memset(head + 10 + n, ' ', pad);
    head[10 + total - 1] = '\n';
    size_t nbytes = (size_t)gp_shape_numel(shape) * esize;
    return atomic_write(path, head, 10 + total, data, nbytes, err);
}
