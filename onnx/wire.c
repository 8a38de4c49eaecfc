#include "onnx/wire.h"

#include <stdlib.h>
#include <string.h>

/* Field numbers of onnx.proto. */
enum {
    MODEL_GRAPH = 7,       /* ModelProto.graph */
    GRAPH_INITIALIZER = 5, /* GraphProto.initializer */
    TENSOR_RAW_DATA = 9,   /* TensorProto.raw_data */
    WIRE_VARINT = 0, WIRE_FIXED64 = 1, WIRE_LEN = 2, WIRE_FIXED32 = 5,
};

/* One pass over the message: with out == NULL it only measures the
 * stripped message, otherwise it writes it at out + pos and records refs. */
struct pass {
    const uint8_t *base;
    uint8_t *out;
    size_t pos;
    bool bad, nomem;
    struct gp_raw_ref *refs;
    size_t n_refs, cap_refs;
};

/* Reads a varint of at most `max_bytes` bytes; 0 when truncated or longer
 * (protobuf-c takes at most 5 bytes for tags and lengths, 10 for values). */
static size_t get_varint(const uint8_t *p, const uint8_t *end, int max_bytes, uint64_t *v)
{
    uint64_t x = 0;
    for (int i = 0; i < max_bytes && p + i < end; i++) {
        x |= (uint64_t)(p[i] & 0x7f) << (7 * i);
        if (!(p[i] & 0x80)) {
            *v = x;
            return (size_t)i + 1;
        }
    }
    return 0;
}

static size_t varint_size(uint64_t v)
{
    size_t n = 1;
    while (v >= 0x80) {
        v >>= 7;
        n++;
    }
    return n;
}

static void emit(struct pass *ps, const void *src, size_t len)
{
    if (ps->out) memcpy(ps->out + ps->pos, src, len);
    ps->pos += ps->out ? len : 0;
}

static void emit_varint(struct pass *ps, uint64_t v)
{
    uint8_t b[10];
    size_t n = 0;
    do {
        b[n] = (uint8_t)(v & 0x7f);
        v >>= 7;
        if (v) b[n] |= 0x80;
        n++;
    } while (v);
    emit(ps, b, n);
}

/* One field at p: its tag, wire type and the extent of its body. A
 * length-delimited body is [*body, *body + *body_len); every field ends at
 * *next. False on anything this pass does not follow (protobuf-c judges). */
static bool next_field(struct pass *ps, const uint8_t *p, const uint8_t *end, uint32_t *field,
                       int *wire, const uint8_t **body, size_t *body_len, const uint8_t **next)
{
    uint64_t tag, v;
    size_t n = get_varint(p, end, 5, &tag);
    if (!n || tag > UINT32_MAX || (tag >> 3) == 0) return ps->bad = true, false;
    p += n;
    *field = (uint32_t)(tag >> 3);
    *wire = (int)(tag & 7);
    *body = p;
    *body_len = 0;
    switch (*wire) {
    case WIRE_VARINT:
        n = get_varint(p, end, 10, &v);
        if (!n) return ps->bad = true, false;
        *next = p + n;
        return true;
    case WIRE_FIXED64:
        if (end - p < 8) return ps->bad = true, false;
        *next = p + 8;
        return true;
    case WIRE_FIXED32:
        if (end - p < 4) return ps->bad = true, false;
        *next = p + 4;
        return true;
    case WIRE_LEN:
        n = get_varint(p, end, 5, &v);
        if (!n || v > UINT32_MAX || v > (uint64_t)(end - p - (ptrdiff_t)n))
            return ps->bad = true, false;
        *body = p + n;
        *body_len = (size_t)v;
        *next = *body + v;
        return true;
    default: /* groups (3, 4) and the undefined 6, 7 */
        return ps->bad = true, false;
    }
}

/* Copies one message [p, p + n), handing each field to `on_field` first:
 * it returns true when it took care of the field (wrote it or left it out). */
typedef bool (*field_fn)(struct pass *ps, uint32_t field, int wire, const uint8_t *tag,
                         const uint8_t *body, size_t len, size_t *size, void *user);

static size_t copy_message(struct pass *ps, const uint8_t *p, size_t n, field_fn on_field,
                           void *user)
{
    const uint8_t *end = p + n;
    size_t size = 0;
    while (p < end && !ps->bad) {
        uint32_t field;
        int wire;
        const uint8_t *body, *next;
        size_t len;
        if (!next_field(ps, p, end, &field, &wire, &body, &len, &next)) break;
        if (!on_field(ps, field, wire, p, body, len, &size, user)) {
            emit(ps, p, (size_t)(next - p));
            size += (size_t)(next - p);
        }
        p = next;
    }
    return size;
}

/* Writes the length-delimited field whose tag starts at `tag` and whose
 * body [body, body + len) becomes what `fn` makes of it, behind its new
 * length; returns the bytes that takes. */
static size_t rewrite_field(struct pass *ps, const uint8_t *tag, const uint8_t *body, size_t len,
                            field_fn fn, void *user)
{
    const uint8_t *len_at = body - 1; /* back over the length varint to the tag's end */
    while (len_at > tag && (len_at[-1] & 0x80)) len_at--;
    uint8_t *out = ps->out;
    ps->out = NULL;
    size_t inner = copy_message(ps, body, len, fn, NULL);
    ps->out = out;
    emit(ps, tag, (size_t)(len_at - tag));
    emit_varint(ps, inner);
    if (ps->out && copy_message(ps, body, len, fn, user) != inner) ps->bad = true;
    return (size_t)(len_at - tag) + varint_size(inner) + inner;
}

static bool tensor_field(struct pass *ps, uint32_t field, int wire, const uint8_t *tag,
                         const uint8_t *body, size_t len, size_t *size, void *user)
{
    (void)tag;
    (void)size;
    if (field != TENSOR_RAW_DATA || wire != WIRE_LEN) return false;
    struct gp_raw_ref *ref = user;
    if (ref) *ref = (struct gp_raw_ref){true, (size_t)(body - ps->base), len};
    return true; /* left out */
}

static bool graph_field(struct pass *ps, uint32_t field, int wire, const uint8_t *tag,
                        const uint8_t *body, size_t len, size_t *size, void *user)
{
    (void)user;
    if (field != GRAPH_INITIALIZER || wire != WIRE_LEN) return false;
    struct gp_raw_ref ref = {0};
    *size += rewrite_field(ps, tag, body, len, tensor_field, &ref);
    if (!ps->out) return true;
    if (ps->n_refs == ps->cap_refs) {
        size_t cap = ps->cap_refs ? 2 * ps->cap_refs : 64;
        struct gp_raw_ref *grown = realloc(ps->refs, cap * sizeof *grown);
        if (!grown) {
            ps->nomem = ps->bad = true;
            return true;
        }
        ps->refs = grown;
        ps->cap_refs = cap;
    }
    ps->refs[ps->n_refs++] = ref;
    return true;
}

static bool model_field(struct pass *ps, uint32_t field, int wire, const uint8_t *tag,
                        const uint8_t *body, size_t len, size_t *size, void *user)
{
    if (field != MODEL_GRAPH || wire != WIRE_LEN) return false;
    /* A second graph field would be merged into the first by protobuf: left
     * to protobuf-c, with the weights copied as before. */
    int *graphs = user;
    if (++*graphs > 1) {
        ps->bad = true;
        return true;
    }
    *size += rewrite_field(ps, tag, body, len, graph_field, NULL);
    return true;
}

enum gp_wire_result gp_wire_strip_raw_data(const uint8_t *data, size_t size, uint8_t **out,
                                           size_t *out_size, struct gp_raw_ref **refs,
                                           size_t *n_refs)
{
    *out = NULL;
    *refs = NULL;
    *out_size = *n_refs = 0;
    struct pass ps = {.base = data};
    int graphs = 0;
    size_t stripped = copy_message(&ps, data, size, model_field, &graphs);
    if (ps.bad) return GP_WIRE_AS_IS;
    ps.out = malloc(stripped ? stripped : 1);
    if (!ps.out) return GP_WIRE_NOMEM;
    graphs = 0;
    size_t written = copy_message(&ps, data, size, model_field, &graphs);
    if (ps.bad || written != stripped || ps.pos != stripped) {
        free(ps.out);
        free(ps.refs);
        return ps.nomem ? GP_WIRE_NOMEM : GP_WIRE_AS_IS;
    }
    *out = ps.out;
    *out_size = stripped;
    *refs = ps.refs;
    *n_refs = ps.n_refs;
    return GP_WIRE_STRIPPED;
}
