/* Saved training states (the format: train/state.h): a run's settings and
 * their comparison, and one state read back and checked whole. Writing,
 * and the folder of states, are state_folder.c. */
#include "train/state.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util/json_parse.h"
#include "util/xxh64.h"

#define FORMAT_NAME GP_STATE_FORMAT
#define MANIFEST GP_STATE_MANIFEST
#define TENSORS GP_STATE_TENSORS
#define DIGEST_KEY "\"" GP_STATE_DIGEST_KEY "\""

/* ---- settings ---- */

static void copy_str(char *dst, size_t size, const char *src)
{
    snprintf(dst, size, "%s", src ? src : "");
}

void gp_state_set(struct gp_state_meta *m, const char *key, const char *label, enum gp_state_rule rule,
                  const char *detail, const char *value_fmt, ...)
{
    struct gp_state_setting *s = (struct gp_state_setting *)gp_state_get(m, key);
    if (!s) {
        if (m->n_settings >= GP_STATE_MAX_SETTINGS) return;
        s = &m->settings[m->n_settings++];
    }
    copy_str(s->key, sizeof s->key, key);
    copy_str(s->label, sizeof s->label, label);
    copy_str(s->detail, sizeof s->detail, detail);
    s->rule = rule;
    va_list ap;
    va_start(ap, value_fmt);
    vsnprintf(s->value, sizeof s->value, value_fmt, ap);
    va_end(ap);
}

const struct gp_state_setting *gp_state_get(const struct gp_state_meta *m, const char *key)
{
    for (int i = 0; i < m->n_settings; i++)
        if (!strcmp(m->settings[i].key, key)) return &m->settings[i];
    return NULL;
}

const char *gp_state_rule_name(enum gp_state_rule r)
{
    return r == GP_STATE_MATCH ? "match" : r == GP_STATE_NOTE ? "note" : "free";
}

/* "--data x.npy (1437 samples ...)" or "--batch 32". */
static void describe(const struct gp_state_setting *s, char *buf, size_t size)
{
    if (s->detail[0]) snprintf(buf, size, "%s %s (%s)", s->label, s->detail, s->value);
    else snprintf(buf, size, "%s %s", s->label, s->value);
}

/* One pass of gp_state_compare: settings both sides record (`both`), or
 * those only one does (the pass after, when nothing else differs: a run
 * with another optimizer records other hyper-parameters). */
static size_t compare_pass(const struct gp_state_meta *saved, const struct gp_state_meta *now, bool both,
                           void (*note)(void *user, const char *message), void *user, char *msg, size_t size,
                           size_t len)
{
    for (int side = 0; side < (both ? 1 : 2); side++) {
        const struct gp_state_meta *from = side == 0 ? now : saved, *other = side == 0 ? saved : now;
        for (int i = 0; i < from->n_settings; i++) {
            const struct gp_state_setting *x = &from->settings[i], *y = gp_state_get(other, x->key);
            if (both != (y != NULL)) continue;
            const struct gp_state_setting *a = side == 0 ? y : x, *b = side == 0 ? x : y; /* a saved, b now */
            if (a && b && !strcmp(a->value, b->value)) continue;
            if ((a && a->rule == GP_STATE_FREE) || (b && b->rule == GP_STATE_FREE)) continue;
            char was[640], is[640], line[1400];
            if (a) describe(a, was, sizeof was);
            if (b) describe(b, is, sizeof is);
            if (a && b) snprintf(line, sizeof line, "the state was saved with %s, this run has %s", was, is);
            else if (b) snprintf(line, sizeof line, "the state has no %s, this run has %s", b->label, is);
            else snprintf(line, sizeof line, "the state was saved with %s, this run has no %s", was, a->label);
            if ((b ? b->rule : a->rule) == GP_STATE_NOTE) {
                char full[1600];
                snprintf(full, sizeof full, "%s: training continues, but not bit for bit as the run that saved it",
                         line);
                if (note) note(user, full);
                continue;
            }
            if (len < size) len += (size_t)snprintf(msg + len, size - len, "%s%s", len ? "; " : "", line);
        }
    }
    return len;
}

gp_status gp_state_compare(const struct gp_state_meta *saved, const struct gp_state_meta *now,
                           void (*note)(void *user, const char *message), void *user, struct gp_error *err)
{
    char msg[GP_ERROR_MSG_MAX] = "";
    size_t len = compare_pass(saved, now, true, note, user, msg, sizeof msg, 0);
    if (!len) len = compare_pass(saved, now, false, note, user, msg, sizeof msg, 0);
    if (len) return gp_error_set(err, GP_ERR_INVALID, "%s", msg);
    return GP_OK;
}
/* ---- reading ---- */

static const struct gp_jvalue *member(const struct gp_jvalue *o, const char *key, enum gp_jtype type)
{
    const struct gp_jvalue *v = gp_jobject_get(o, key);
    return v && v->type == type ? v : NULL;
}

static bool get_int(const struct gp_jvalue *o, const char *key, int64_t *out)
{
    const struct gp_jvalue *v = member(o, key, GP_JNUMBER);
    if (!v || !v->is_int) return false;
    *out = v->i;
    return true;
}

static bool get_double(const struct gp_jvalue *o, const char *key, double *out)
{
    const struct gp_jvalue *v = member(o, key, GP_JNUMBER);
    if (!v) return false;
    *out = v->num;
    return true;
}

static bool parse_hex(const char *s, uint64_t *out)
{
    if (!s || strlen(s) != 16) return false;
    uint64_t v = 0;
    for (int i = 0; i < 16; i++) {
        char c = s[i];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
        if (d < 0) return false;
        v = v << 4 | (uint64_t)d;
    }
    *out = v;
    return true;
}

static bool get_hex(const struct gp_jvalue *o, const char *key, uint64_t *out)
{
    const struct gp_jvalue *v = member(o, key, GP_JSTRING);
    return v && parse_hex(v->str, out);
}

void gp_state_close(struct gp_state *s)
{
    if (!s) return;
    if (s->fd >= 0) close(s->fd);
    if (s->doc) {
        gp_json_doc_free(s->doc);
        free(s->doc);
    }
    free(s->tensors);
    free(s);
}

/* The manifest's own digest: over the bytes before the comma that precedes
 * its last member. */
static gp_status check_digest(const char *path, const char *text, size_t len, struct gp_error *err)
{
    const char *key = NULL;
    for (size_t i = len; i-- > 0;)
        if (text[i] == '"' && len - i >= sizeof DIGEST_KEY - 1 && !memcmp(text + i, DIGEST_KEY, sizeof DIGEST_KEY - 1)) {
            key = text + i;
            break;
        }
    if (!key)
        return gp_error_set(err, GP_ERR_PARSE, "%s: the manifest has no digest (cut short, or not a state)", path);
    const char *p = key;
    while (p > text && (p[-1] == ' ' || p[-1] == '\n' || p[-1] == '\r' || p[-1] == '\t')) p--;
    if (p == text || p[-1] != ',')
        return gp_error_set(err, GP_ERR_PARSE, "%s: the manifest's digest is not its last member", path);
    /* "manifest_xxh64": "<16 hex digits>" */
    const char *q = key + sizeof DIGEST_KEY - 1, *end = text + len;
    while (q < end && (*q == ' ' || *q == ':')) q++;
    char hex[17] = "";
    if (end - q >= 18 && q[0] == '"' && q[17] == '"') memcpy(hex, q + 1, 16);
    uint64_t want;
    if (!parse_hex(hex, &want)) return gp_error_set(err, GP_ERR_PARSE, "%s: the manifest's digest is malformed", path);
    uint64_t got = gp_xxh64(text, (size_t)(p - 1 - text), 0);
    if (got != want) {
        char a[17], b[17];
        gp_xxh64_hex(want, a);
        gp_xxh64_hex(got, b);
        return gp_error_set(err, GP_ERR_PARSE,
                            "%s: the manifest is corrupt (its digest says %s, its contents give %s)", path, a, b);
    }
    return GP_OK;
}

static gp_status parse_settings(const char *path, const struct gp_jvalue *config, struct gp_state_meta *m,
                                struct gp_error *err)
{
    for (size_t i = 0; config && i < config->count; i++) {
        const struct gp_jvalue *o = &config->items[i];
        const struct gp_jvalue *label = member(o, "label", GP_JSTRING), *value = member(o, "value", GP_JSTRING),
                               *detail = member(o, "detail", GP_JSTRING), *rule = member(o, "rule", GP_JSTRING);
        if (o->type != GP_JOBJECT || !label || !value || !detail || !rule)
            return gp_error_set(err, GP_ERR_PARSE, "%s: config entry '%s' is malformed", path, config->keys[i]);
        enum gp_state_rule r = !strcmp(rule->str, "match") ? GP_STATE_MATCH
                               : !strcmp(rule->str, "note") ? GP_STATE_NOTE
                                                            : GP_STATE_FREE;
        gp_state_set(m, config->keys[i], label->str, r, detail->str, "%s", value->str);
    }
    return GP_OK;
}

/* Reads the tensors back in order, checking each digest, the total and the size. */
static gp_status check_blob(struct gp_state *s, uint64_t total, uint64_t whole_digest, struct gp_error *err)
{
    struct stat sb;
    if (fstat(s->fd, &sb) != 0) return gp_error_set(err, GP_ERR_IO, "%s/" TENSORS ": %s", s->path, strerror(errno));
    if ((uint64_t)sb.st_size != total)
        return gp_error_set(err, GP_ERR_PARSE, "%s/" TENSORS " has %lld bytes, the manifest says %llu (%s)", s->path,
                            (long long)sb.st_size, (unsigned long long)total,
                            (uint64_t)sb.st_size < total ? "cut short" : "grown");
    size_t cap = 1 << 20;
    unsigned char *buf = malloc(cap);
    if (!buf) return gp_error_set(err, GP_ERR_NOMEM, "out of memory");
    struct gp_xxh64 whole;
    gp_xxh64_init(&whole, 0);
    gp_status st = GP_OK;
    for (int i = 0; i < s->n_tensors && st == GP_OK; i++) {
        const struct gp_state_tensor *t = &s->tensors[i];
        struct gp_xxh64 h;
        gp_xxh64_init(&h, 0);
        for (uint64_t done = 0; done < t->bytes && st == GP_OK;) {
            size_t n = t->bytes - done < cap ? (size_t)(t->bytes - done) : cap;
            ssize_t r = pread(s->fd, buf, n, (off_t)(t->offset + done));
            if (r != (ssize_t)n) st = gp_error_set(err, GP_ERR_IO, "%s/" TENSORS ": cannot read tensor '%s'", s->path, t->name);
            gp_xxh64_update(&h, buf, n);
            gp_xxh64_update(&whole, buf, n);
            done += n;
        }
        if (st == GP_OK && gp_xxh64_digest(&h) != t->xxh64)
            st = gp_error_set(err, GP_ERR_PARSE, "%s: tensor '%s' (%s) does not match its digest: the state is corrupt",
                              s->path, t->name, t->role);
    }
    free(buf);
    if (st == GP_OK && gp_xxh64_digest(&whole) != whole_digest)
        st = gp_error_set(err, GP_ERR_PARSE, "%s/" TENSORS " does not match its digest: the state is corrupt", s->path);
    return st;
}

static gp_status parse_tensors(struct gp_state *s, const struct gp_jvalue *list, uint64_t *total, struct gp_error *err)
{
    s->tensors = calloc(list->count + 1, sizeof *s->tensors);
    if (!s->tensors) return gp_error_set(err, GP_ERR_NOMEM, "out of memory");
    uint64_t at = 0;
    for (size_t i = 0; i < list->count; i++) {
        const struct gp_jvalue *o = &list->items[i];
        struct gp_state_tensor *t = &s->tensors[i];
        const struct gp_jvalue *name = member(o, "name", GP_JSTRING), *role = member(o, "role", GP_JSTRING),
                               *dtype = member(o, "dtype", GP_JSTRING), *shape = member(o, "shape", GP_JARRAY);
        int64_t offset = -1, bytes = -1;
        bool ok = o->type == GP_JOBJECT && name && role && dtype && shape && !strcmp(dtype->str, "float32") &&
                  get_int(o, "offset", &offset) && get_int(o, "bytes", &bytes) && get_hex(o, "xxh64", &t->xxh64) &&
                  shape->count <= GP_MAX_RANK;
        for (size_t d = 0; ok && d < shape->count; d++) {
            ok = shape->items[d].type == GP_JNUMBER && shape->items[d].is_int && shape->items[d].i >= 0;
            if (ok) t->shape.dims[d] = shape->items[d].i;
        }
        if (ok) t->shape.rank = (int)shape->count;
        ok = ok && gp_shape_check(&t->shape, sizeof(float)) &&
             (uint64_t)bytes == sizeof(float) * (uint64_t)gp_shape_numel(&t->shape) && (uint64_t)offset == at;
        if (!ok) return gp_error_set(err, GP_ERR_PARSE, "%s: the manifest's tensor %zu is malformed", s->path, i);
        t->name = name->str;
        t->role = role->str;
        t->offset = (uint64_t)offset;
        t->bytes = (uint64_t)bytes;
        at += t->bytes;
    }
    s->n_tensors = (int)list->count;
    *total = at;
    return GP_OK;
}

static gp_status open_state(const char *path, struct gp_state *s, struct gp_error *err)
{
    char file[4200];
    snprintf(file, sizeof file, "%s/" MANIFEST, path);
    FILE *f = fopen(file, "rb");
    if (!f) {
        if (errno == ENOENT) return gp_error_set(err, GP_ERR_IO, "%s: no " MANIFEST " (not a complete state)", path);
        return gp_error_set(err, GP_ERR_IO, "%s: %s", file, strerror(errno));
    }
    char *text = NULL;
    size_t len = 0, cap = 0;
    for (;;) {
        if (len == cap) {
            if (cap >= GP_JSON_PARSE_MAX_FILE) break;
            char *m = realloc(text, (cap = cap ? 2 * cap : 1 << 16));
            if (!m) break;
            text = m;
        }
        size_t r = fread(text + len, 1, cap - len, f);
        len += r;
        if (r == 0) break;
    }
    fclose(f);
    if (!text) return gp_error_set(err, GP_ERR_NOMEM, "out of memory");
    gp_status st = check_digest(file, text, len, err);
    s->doc = calloc(1, sizeof(struct gp_json_doc));
    if (st == GP_OK && !s->doc) st = gp_error_set(err, GP_ERR_NOMEM, "out of memory");
    if (st == GP_OK) {
        st = gp_json_parse(text, len, s->doc, err);
        if (st != GP_OK) gp_error_prefix(err, "%s: ", file);
    }
    free(text);
    GP_TRY(st);
    const struct gp_jvalue *root = ((struct gp_json_doc *)s->doc)->root;
    const struct gp_jvalue *format = member(root, "format", GP_JSTRING);
    int64_t version = 0;
    if (!format || strcmp(format->str, FORMAT_NAME) != 0)
        return gp_error_set(err, GP_ERR_PARSE, "%s: not a gpipe-onnx training state", file);
    if (!get_int(root, "version", &version) || version != GP_STATE_VERSION)
        return gp_error_set(err, GP_ERR_UNSUPPORTED, "%s: state format version %lld; this build reads version %d",
                            file, (long long)version, GP_STATE_VERSION);
    struct gp_state_meta *m = &s->meta;
    const struct gp_jvalue *order = member(root, "data_order", GP_JOBJECT);
    const struct gp_jvalue *shuffle = member(order, "shuffle", GP_JBOOL), *seed = member(order, "seed", GP_JSTRING);
    const struct gp_jvalue *tensors = member(root, "tensors", GP_JARRAY);
    const struct gp_jvalue *tensors_file = member(root, "tensors_file", GP_JSTRING);
    int64_t total = -1;
    uint64_t whole = 0;
    bool ok = get_int(root, "step", &m->step) && get_int(root, "epoch", &m->epoch) &&
              get_int(root, "next_sample", &m->next_sample) && get_int(root, "steps_per_epoch", &m->steps_per_epoch) &&
              get_int(root, "total_steps", &m->total_steps) && get_int(root, "optimizer_steps", &m->optimizer_steps) &&
              get_double(root, "next_lr", &m->next_lr) && get_double(root, "epoch_loss_sum", &m->epoch_loss_sum) &&
              get_int(root, "epoch_steps", &m->epoch_steps) && shuffle && seed && tensors && tensors_file &&
              !strcmp(tensors_file->str, TENSORS) && get_int(root, "tensors_bytes", &total) &&
              get_hex(root, "tensors_xxh64", &whole) && m->step >= 0 && m->epoch >= 0 && m->next_sample >= 0 &&
              m->steps_per_epoch > 0 && m->epoch_steps >= 0 && total >= 0;
    if (!ok) return gp_error_set(err, GP_ERR_PARSE, "%s: a field is missing or malformed", file);
    m->shuffle = shuffle->b;
    char *end = NULL;
    m->seed = strtoull(seed->str, &end, 10);
    if (!*seed->str || *end) return gp_error_set(err, GP_ERR_PARSE, "%s: the data-order seed is malformed", file);
    GP_TRY(parse_settings(file, member(root, "config", GP_JOBJECT), m, err));
    const struct gp_jvalue *choices = member(root, "kernel_choices", GP_JSTRING);
    m->kernel_choices = choices ? choices->str : NULL;
    uint64_t sum = 0;
    GP_TRY(parse_tensors(s, tensors, &sum, err));
    if (sum != (uint64_t)total)
        return gp_error_set(err, GP_ERR_PARSE, "%s: the tensors add up to %llu bytes, not tensors_bytes %lld", file,
                            (unsigned long long)sum, (long long)total);
    snprintf(file, sizeof file, "%s/" TENSORS, path);
    s->fd = open(file, O_RDONLY | O_CLOEXEC);
    if (s->fd < 0) return gp_error_set(err, GP_ERR_IO, "%s: %s", file, strerror(errno));
    return check_blob(s, sum, whole, err);
}

gp_status gp_state_open(const char *path, struct gp_state **out, struct gp_error *err)
{
    *out = NULL;
    struct gp_state *s = calloc(1, sizeof *s);
    if (!s) return gp_error_set(err, GP_ERR_NOMEM, "out of memory");
    s->fd = -1;
    copy_str(s->path, sizeof s->path, path);
    size_t n = strlen(s->path);
    while (n > 1 && s->path[n - 1] == '/') s->path[--n] = '\0';
    gp_status st = open_state(s->path, s, err);
    if (st != GP_OK) {
        gp_state_close(s);
        return st;
    }
    *out = s;
    return GP_OK;
}
const struct gp_state_tensor *gp_state_find(const struct gp_state *s, const char *name, const char *role)
{
    for (int i = 0; i < s->n_tensors; i++)
        if (!strcmp(s->tensors[i].name, name) && !strcmp(s->tensors[i].role, role)) return &s->tensors[i];
    return NULL;
}

gp_status gp_state_read(struct gp_state *s, const struct gp_state_tensor *t, float *out, struct gp_error *err)
{
    unsigned char *p = (unsigned char *)out;
    for (uint64_t done = 0; done < t->bytes;) {
        ssize_t r = pread(s->fd, p + done, (size_t)(t->bytes - done), (off_t)(t->offset + done));
        if (r <= 0) return gp_error_set(err, GP_ERR_IO, "%s/" TENSORS ": cannot read tensor '%s'", s->path, t->name);
        done += (uint64_t)r;
    }
    if (gp_xxh64(out, (size_t)t->bytes, 0) != t->xxh64)
        return gp_error_set(err, GP_ERR_PARSE, "%s: tensor '%s' (%s) changed while resuming: the state is corrupt",
                            s->path, t->name, t->role);
    return GP_OK;
}
