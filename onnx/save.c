#include "onnx/save.h"

#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "onnx.pb-c.h"
#include "onnx/external_data.h"
#include "onnx/wire.h"
#include "util/strmap.h"
#include "util/atomic_file.h"
#include "util/mapped.h"

/* protobuf's limit for one message, and the loader's (onnx/load.c). */
#define GP_MAX_MODEL_BYTES ((size_t)2 << 30)

/* The model mapped read-only (the loader's way, onnx/load.c): the weights
 * that are written back unchanged go from its pages to the output file
 * without a copy on the heap. */
static gp_status map_model(const char *path, void **map, size_t *size, struct gp_error *err)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return gp_error_set(err, GP_ERR_IO, "cannot open '%s': %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return gp_error_set(err, GP_ERR_IO, "'%s' is not a regular file", path);
    }
    if ((size_t)st.st_size > GP_MAX_MODEL_BYTES) {
        close(fd);
        return gp_error_set(err, GP_ERR_UNSUPPORTED, "'%s' is %lld bytes: models over 2 GiB are not supported",
                            path, (long long)st.st_size);
    }
    size_t n = (size_t)st.st_size;
    void *m = n ? mmap(NULL, n, PROT_READ, MAP_PRIVATE, fd, 0) : NULL;
    close(fd);
    if (n && m == MAP_FAILED) return gp_error_set(err, GP_ERR_IO, "cannot map '%s': %s", path, strerror(errno));
    *map = m;
    *size = n;
    return GP_OK;
}

static const char *tensor_name(const Onnx__TensorProto *tp)
{
    return tp->name && *tp->name ? tp->name : "(unnamed)";
}

static bool is_external(const Onnx__TensorProto *tp)
{
    return tp->has_data_location && tp->data_location == ONNX__TENSOR_PROTO__DATA_LOCATION__EXTERNAL;
}

/* Element count and byte size from the proto's dims and type. */
static gp_status proto_size(const Onnx__TensorProto *tp, struct gp_shape *shape, size_t *nbytes,
                            struct gp_error *err)
{
    enum gp_dtype dt = (enum gp_dtype)(tp->has_data_type ? tp->data_type : 0);
    size_t esize = gp_dtype_size(dt);
    if (!esize)
        return gp_error_set(err, GP_ERR_UNSUPPORTED, "tensor '%s': element type %d is not supported",
                            tensor_name(tp), (int)tp->data_type);
    if (tp->n_dims > GP_MAX_RANK)
        return gp_error_set(err, GP_ERR_UNSUPPORTED, "tensor '%s': rank %zu exceeds %d", tensor_name(tp),
                            tp->n_dims, GP_MAX_RANK);
    shape->rank = (int)tp->n_dims;
    for (size_t i = 0; i < tp->n_dims; i++) shape->dims[i] = tp->dims[i];
    if (!gp_shape_check(shape, esize))
        return gp_error_set(err, GP_ERR_INVALID, "tensor '%s': invalid dimensions", tensor_name(tp));
    *nbytes = (size_t)gp_shape_numel(shape) * esize;
    return GP_OK;
}

/* Makes `bytes` the tensor's only data: raw_data, with the typed fields
 * and the external data reference cleared. `lent` (may be NULL): whether
 * the old raw_data is borrowed (not protobuf-c's to free); on return it says
 * whether `bytes` is, i.e. `!owned` (owned bytes are malloc'd, taken over). */
static void set_raw(Onnx__TensorProto *tp, unsigned char *bytes, size_t len, bool owned, bool *lent)
{
    /* Repeated scalar fields: a zero count is enough, free_unpacked still
     * frees the arrays. Repeated messages must be freed one by one. */
    tp->n_float_data = tp->n_int32_data = tp->n_int64_data = 0;
    tp->n_double_data = tp->n_uint64_data = 0;
    for (size_t i = 0; i < tp->n_external_data; i++)
        protobuf_c_message_free_unpacked(&tp->external_data[i]->base, NULL);
    tp->n_external_data = 0;
    tp->has_data_location = 0;
    tp->data_location = ONNX__TENSOR_PROTO__DATA_LOCATION__DEFAULT;
    if (!lent || !*lent) free(tp->raw_data.data);
    if (lent) *lent = !owned;
    tp->raw_data.data = bytes;
    tp->raw_data.len = len;
    tp->has_raw_data = 1;
}

/* ---- replacing an initializer's data ---- */

/* The bytes to store: the caller's own when the type is the same (*owned
 * false: borrowed until the file is written), else a converted copy. */
static gp_status convert(const struct gp_saved_tensor *t, enum gp_dtype to, const char *name,
                         unsigned char **out, size_t *len, bool *owned, struct gp_error *err)
{
    enum gp_dtype from = t->dtype == GP_DTYPE_UNDEFINED ? GP_DTYPE_FLOAT32 : t->dtype;
    int64_t n = gp_shape_numel(&t->shape);
    size_t esize = gp_dtype_size(to);
    bool same = from == to;
    bool widen = from == GP_DTYPE_FLOAT32 &&
                 (to == GP_DTYPE_FLOAT16 || to == GP_DTYPE_BFLOAT16 || to == GP_DTYPE_FLOAT64);
    if (!same && !widen)
        return gp_error_set(err, GP_ERR_UNSUPPORTED,
                            "initializer '%s' is %s: cannot store %s values in it", name,
                            gp_dtype_name(to), gp_dtype_name(from));
    *len = (size_t)n * esize;
    *owned = !same || !*len;
    if (!*owned) {
        *out = (unsigned char *)t->data;
        return GP_OK;
    }
    unsigned char *b = malloc(*len ? *len : 1);
    if (!b) return gp_error_set(err, GP_ERR_NOMEM, "out of memory saving '%s'", name);
    const float *f = t->data;
    if (same) {
        /* empty */
    } else if (to == GP_DTYPE_FLOAT16) {
        for (int64_t i = 0; i < n; i++) {
            uint16_t h = gp_float_to_half(f[i]);
            memcpy(b + 2 * i, &h, 2);
        }
    } else if (to == GP_DTYPE_BFLOAT16) {
        for (int64_t i = 0; i < n; i++) {
            uint16_t h = gp_float_to_bf16(f[i]);
            memcpy(b + 2 * i, &h, 2);
        }
    } else {
        for (int64_t i = 0; i < n; i++) {
            double d = f[i];
            memcpy(b + 8 * i, &d, 8);
        }
    }
    *out = b;
    return GP_OK;
}

/* Validates every replacement against its initializer before changing any. */
static gp_status check_replacements(Onnx__GraphProto *gp, const struct gp_strmap *inits,
                                    const struct gp_saved_tensor *tensors, int n, int *target,
                                    struct gp_error *err)
{
    struct gp_strmap seen;
    if (!gp_strmap_init(&seen, (size_t)n + 1)) return gp_error_set(err, GP_ERR_NOMEM, "out of memory");
    gp_status st = GP_OK;
    for (int k = 0; k < n && st == GP_OK; k++) {
        const struct gp_saved_tensor *t = &tensors[k];
        if (!t->name) {
            st = gp_error_set(err, GP_ERR_INVALID, "tensor %d to save has no name", k);
            break;
        }
        if (gp_strmap_get(&seen, t->name) >= 0) {
            st = gp_error_set(err, GP_ERR_INVALID, "tensor '%s' is given twice", t->name);
            break;
        }
        if (!gp_strmap_put(&seen, t->name, k)) {
            st = gp_error_set(err, GP_ERR_NOMEM, "out of memory");
            break;
        }
        int i = gp_strmap_get(inits, t->name);
        if (i < 0) {
            st = gp_error_set(err, GP_ERR_INVALID, "the model has no initializer '%s'", t->name);
            break;
        }
        struct gp_shape shape;
        size_t nbytes;
        if ((st = proto_size(gp->initializer[i], &shape, &nbytes, err)) != GP_OK) break;
        if (!gp_shape_equal(&shape, &t->shape)) {
            char a[256], b[256];
            st = gp_error_set(err, GP_ERR_SHAPE, "initializer '%s' has shape %s, the new values %s",
                              t->name, gp_shape_format(&shape, a, sizeof a),
                              gp_shape_format(&t->shape, b, sizeof b));
            break;
        }
        if (!t->data && gp_shape_numel(&shape) > 0) {
            st = gp_error_set(err, GP_ERR_INVALID, "tensor '%s' to save has no data", t->name);
            break;
        }
        target[k] = i;
    }
    gp_strmap_free(&seen);
    return st;
}

/* Every tensor left in external files, and what inlining them adds. */
struct external_ref {
    Onnx__TensorProto *tp;
    size_t nbytes;
    bool lent; /* raw_data borrowed (from the model's mapping, then the external file's) */
};

struct external_list {
    struct external_ref *refs;
    int count, cap;
    size_t total;
};

static gp_status add_if_external(struct external_list *l, Onnx__TensorProto *tp, bool lent,
                                 struct gp_error *err)
{
    if (!tp || !is_external(tp)) return GP_OK;
    struct gp_shape s;
    size_t nb;
    GP_TRY(proto_size(tp, &s, &nb, err));
    if (l->count == l->cap) {
        int cap = l->cap ? 2 * l->cap : 16;
        struct external_ref *m = realloc(l->refs, sizeof *m * (size_t)cap);
        if (!m) return gp_error_set(err, GP_ERR_NOMEM, "out of memory");
        l->refs = m;
        l->cap = cap;
    }
    l->refs[l->count++] = (struct external_ref){tp, nb, lent};
    l->total += nb;
    return GP_OK;
}

/* Initializers that keep their data, and tensors in node attributes
 * (Constant's value), whose data lives in external files. */
static gp_status collect_external(Onnx__GraphProto *gp, const bool *replaced, const bool *lent,
                                  struct external_list *l, struct gp_error *err)
{
    for (size_t i = 0; i < gp->n_initializer; i++)
        if (!replaced[i]) GP_TRY(add_if_external(l, gp->initializer[i], lent[i], err));
    for (size_t i = 0; i < gp->n_node; i++)
        for (size_t a = 0; a < gp->node[i]->n_attribute; a++) {
            Onnx__AttributeProto *ap = gp->node[i]->attribute[a];
            GP_TRY(add_if_external(l, ap->t, false, err));
            for (size_t k = 0; k < ap->n_tensors; k++)
                GP_TRY(add_if_external(l, ap->tensors[k], false, err));
        }
    return GP_OK;
}

/* Points each tensor at its bytes in the external file, mapped into
 * *maps (the caller releases them once the file is written). */
static gp_status inline_external(const char *model_dir, struct external_ref *refs, int count,
                                 struct gp_mapping **maps, struct gp_error *err)
{
    gp_status st = GP_OK;
    for (int r = 0; r < count && st == GP_OK; r++) {
        Onnx__TensorProto *tp = refs[r].tp;
        const char *location = NULL;
        int64_t offset = 0, length = -1;
        for (size_t i = 0; i < tp->n_external_data; i++) {
            const Onnx__StringStringEntryProto *e = tp->external_data[i];
            if (!e->key || !e->value) continue;
            char *end = NULL;
            if (strcmp(e->key, "location") == 0) {
                location = e->value;
            } else if (strcmp(e->key, "offset") == 0 || strcmp(e->key, "length") == 0) {
                errno = 0;
                long long v = strtoll(e->value, &end, 10);
                if (errno || end == e->value || *end || v < 0) {
                    st = gp_error_set(err, GP_ERR_INVALID,
                                      "tensor '%s': external data %s '%s' is not a valid number",
                                      tensor_name(tp), e->key, e->value);
                    break;
                }
                if (e->key[0] == 'o') offset = v;
                else length = v;
            }
        }
        if (st != GP_OK) break;
        void *data = NULL;
        st = gp_external_data_map(model_dir, location, offset, length, (int64_t)refs[r].nbytes,
                                  tensor_name(tp), maps, &data, err);
        if (st != GP_OK) break;
        bool lent = refs[r].lent;
        set_raw(tp, data, refs[r].nbytes, false, &lent);
        refs[r].lent = true;
    }
    return st;
}

/* ---- the atomic write ---- */

/* protobuf-c packs through this: bytes gather in a buffer and go to the
 * file in large writes; the first failure is kept and stops the rest. */
struct file_sink {
    ProtobufCBuffer base;
    int fd;
    unsigned char *buf;
    size_t used, cap;
    int error; /* errno of the first failed write, or 0 */
};

static void sink_flush(struct file_sink *s)
{
    size_t off = 0;
    while (!s->error && off < s->used) {
        ssize_t w = write(s->fd, s->buf + off, s->used - off);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) s->error = w < 0 ? errno : EIO;
        else off += (size_t)w;
    }
    s->used = 0;
}

static void sink_append(ProtobufCBuffer *b, size_t len, const uint8_t *data)
{
    struct file_sink *s = (struct file_sink *)b;
    while (len > 0 && !s->error) {
        size_t room = s->cap - s->used;
        size_t take = len < room ? len : room;
        memcpy(s->buf + s->used, data, take);
        s->used += take;
        data += take;
        len -= take;
        if (s->used == s->cap) sink_flush(s);
    }
}

static gp_status write_atomic(const Onnx__ModelProto *mp, const char *path, struct gp_error *err)
{
    unsigned char *buf = malloc(1 << 20);
    if (!buf) return gp_error_set(err, GP_ERR_NOMEM, "out of memory");
    struct gp_atomic_file f;
    gp_status st = gp_atomic_create(&f, path, err);
    if (st != GP_OK) {
        free(buf);
        return st;
    }
    struct file_sink sink = {.base = {.append = sink_append}, .fd = f.fd, .buf = buf, .cap = 1 << 20};
    onnx__model_proto__pack_to_buffer(mp, &sink.base);
    sink_flush(&sink);
    free(buf);
    f.write_errno = sink.error;
    return gp_atomic_commit(&f, err);
}

/* ---- the whole save ---- */

/* `lent[i]`: whether initializer i's raw_data is borrowed (from the mapped
 * model), updated as data is replaced; gp_onnx_save clears those before
 * protobuf-c frees the message. */
static gp_status save(Onnx__ModelProto *mp, const char *model_dir, const char *out_path,
                      const struct gp_saved_tensor *tensors, int n, bool *lent, struct gp_error *err)
{
    Onnx__GraphProto *gp = mp->graph;
    if (!gp) return gp_error_set(err, GP_ERR_INVALID, "the model has no graph");
    struct gp_strmap inits;
    if (!gp_strmap_init(&inits, gp->n_initializer + 1))
        return gp_error_set(err, GP_ERR_NOMEM, "out of memory");
    int *target = calloc((size_t)n + 1, sizeof *target);
    bool *replaced = calloc(gp->n_initializer + 1, sizeof *replaced);
    struct external_list ext = {0};
    struct gp_mapping *maps = NULL;
    gp_status st = GP_OK;
    if (!target || !replaced) {
        st = gp_error_set(err, GP_ERR_NOMEM, "out of memory");
        goto done;
    }
    for (size_t i = 0; i < gp->n_initializer; i++) {
        const char *name = gp->initializer[i]->name;
        if (name && *name && !gp_strmap_put(&inits, name, (int)i)) {
            st = gp_error_set(err, GP_ERR_NOMEM, "out of memory");
            goto done;
        }
    }
    if ((st = check_replacements(gp, &inits, tensors, n, target, err)) != GP_OK) goto done;
    for (int k = 0; k < n; k++) replaced[target[k]] = true;

    /* Refuse outputs over 2 GiB before reading anything in. */
    if ((st = collect_external(gp, replaced, lent, &ext, err)) != GP_OK) goto done;
    size_t ext_bytes = ext.total;
    size_t new_bytes = 0;
    for (int k = 0; k < n; k++) {
        struct gp_shape s;
        size_t nb;
        proto_size(gp->initializer[target[k]], &s, &nb, NULL);
        new_bytes += nb + 16; /* raw_data's tag and length */
    }
    if (onnx__model_proto__get_packed_size(mp) + ext_bytes + new_bytes >= GP_MAX_MODEL_BYTES) {
        st = gp_error_set(err, GP_ERR_UNSUPPORTED,
                          "the saved model would exceed 2 GiB (%zu bytes of weights): saving "
                          "models that need external data is not supported",
                          ext_bytes + new_bytes);
        goto done;
    }

    for (int k = 0; k < n; k++) {
        Onnx__TensorProto *tp = gp->initializer[target[k]];
        unsigned char *bytes = NULL;
        size_t len = 0;
        bool owned = true;
        st = convert(&tensors[k], (enum gp_dtype)tp->data_type, tensors[k].name, &bytes, &len,
                     &owned, err);
        if (st != GP_OK) goto done;
        set_raw(tp, bytes, len, owned, &lent[target[k]]);
    }
    if ((st = inline_external(model_dir, ext.refs, ext.count, &maps, err)) != GP_OK) goto done;
    size_t packed = onnx__model_proto__get_packed_size(mp);
    if (packed >= GP_MAX_MODEL_BYTES) {
        st = gp_error_set(err, GP_ERR_UNSUPPORTED, "the saved model would be %zu bytes, over 2 GiB",
                          packed);
        goto done;
    }
    st = write_atomic(mp, out_path, err);
done:
    /* The external files' bytes are not protobuf-c's to free. */
    for (int r = 0; r < ext.count; r++) {
        if (!ext.refs[r].lent) continue;
        ext.refs[r].tp->raw_data.data = NULL;
        ext.refs[r].tp->raw_data.len = 0;
        ext.refs[r].tp->has_raw_data = 0;
    }
    gp_external_data_release(maps);
    free(ext.refs);
    free(target);
    free(replaced);
    gp_strmap_free(&inits);
    return st;
}

/* The model without copies of its weights: the wire pass (onnx/wire.h)
 * takes raw_data out before protobuf-c unpacks it, and each initializer is
 * pointed back at its bytes in the mapping (lent[i]). Files the pass does
 * not handle are unpacked as they are, copying the weights as before. */
static Onnx__ModelProto *unpack_lent(const uint8_t *data, size_t size, bool **lent)
{
    *lent = NULL;
    uint8_t *stripped = NULL;
    size_t stripped_size = 0, n_refs = 0;
    struct gp_raw_ref *refs = NULL;
    enum gp_wire_result wr =
        gp_wire_strip_raw_data(data, size, &stripped, &stripped_size, &refs, &n_refs);
    Onnx__ModelProto *mp = NULL;
    if (wr == GP_WIRE_STRIPPED) {
        mp = onnx__model_proto__unpack(NULL, stripped_size, stripped);
        free(stripped);
        if (mp && (!mp->graph || mp->graph->n_initializer != n_refs)) {
            onnx__model_proto__free_unpacked(mp, NULL);
            mp = NULL;
        }
        bool *l = mp ? calloc(n_refs + 1, sizeof *l) : NULL;
        if (mp && !l) {
            onnx__model_proto__free_unpacked(mp, NULL);
            mp = NULL;
        }
        for (size_t i = 0; mp && i < n_refs; i++) {
            if (!refs[i].present) continue;
            Onnx__TensorProto *tp = mp->graph->initializer[i];
            tp->has_raw_data = 1;
            tp->raw_data.data = (uint8_t *)data + refs[i].offset;
            tp->raw_data.len = refs[i].length;
            l[i] = true;
        }
        free(refs);
        if (mp) {
            *lent = l;
            return mp;
        }
    }
    mp = onnx__model_proto__unpack(NULL, size, data);
    if (mp && mp->graph) {
        *lent = calloc(mp->graph->n_initializer + 1, sizeof **lent);
        if (!*lent) {
            onnx__model_proto__free_unpacked(mp, NULL);
            mp = NULL;
        }
    }
    return mp;
}

gp_status gp_onnx_save(const char *model_path, const char *out_path,
                       const struct gp_saved_tensor *tensors, int n_tensors, struct gp_error *err)
{
    if (n_tensors < 0 || (n_tensors > 0 && !tensors))
        return gp_error_set(err, GP_ERR_INVALID, "saving '%s': no tensors given", out_path);
    void *map = NULL;
    size_t size = 0;
    GP_TRY(map_model(model_path, &map, &size, err));
    static const uint8_t empty[1];
    gp_mapped_register(map, size, model_path);
    bool *lent = NULL;
    Onnx__ModelProto *mp = unpack_lent(map ? map : empty, size, &lent);
    gp_status st = GP_OK;
    char *dir = NULL;
    if (!mp) {
        st = gp_error_set(err, GP_ERR_PARSE,
                          "%s: not a valid ONNX model: the protobuf is malformed or truncated",
                          model_path);
    } else if (!(dir = strdup(model_path))) {
        st = gp_error_set(err, GP_ERR_NOMEM, "out of memory");
    } else {
        char *slash = strrchr(dir, '/');
        if (slash) *(slash == dir ? slash + 1 : slash) = '\0';
        else strcpy(dir, ".");
        if (mp->graph) st = save(mp, dir, out_path, tensors, n_tensors, lent, err);
        else st = gp_error_set(err, GP_ERR_INVALID, "the model has no graph");
    }
    free(dir);
    /* Borrowed bytes are not protobuf-c's to free. */
    for (size_t i = 0; mp && mp->graph && lent && i < mp->graph->n_initializer; i++) {
        if (!lent[i]) continue;
        mp->graph->initializer[i]->raw_data.data = NULL;
        mp->graph->initializer[i]->raw_data.len = 0;
    }
    free(lent);
    if (mp) onnx__model_proto__free_unpacked(mp, NULL);
    if (map) {
        gp_mapped_unregister(map);
        munmap(map, size);
    }
    gp_error_prefix(err, "saving %s as %s: ", model_path, out_path);
    return st;
}
