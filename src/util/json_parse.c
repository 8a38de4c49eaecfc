#include "util/json_parse.h"

#include <errno.h>
#include <locale.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A member whose container is still open. The members of all open containers
 * share one growing stack; a container copies its own run into the arena when
 * it closes, so the arena never holds a half-built array that must grow. */
struct slot {
    struct gp_jvalue v;
    const char *key;
};

struct parser {
    const char *s;
    size_t n, pos;
    size_t start; /* past a byte order mark, where columns start counting */
    struct gp_arena *arena;
    struct gp_error *err;
    struct slot *stack;
    size_t sp, scap;
    char *buf; /* scratch: a string being decoded, or a number for strtod */
    size_t blen, bcap;
};

/* ---- errors ---- */

static void line_col(const struct parser *p, size_t off, size_t *line, size_t *col)
{
    size_t l = 1, c = 1;
    for (size_t k = p->start; k < off && k < p->n; k++) {
        unsigned char ch = (unsigned char)p->s[k];
        if (ch == '\n') {
            l++;
            c = 1;
        } else if ((ch & 0xC0) != 0x80) {
            c++; /* continuation bytes belong to the character before them */
        }
    }
    *line = l;
    *col = c;
}

static gp_status fail(struct parser *p, size_t off, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static gp_status fail(struct parser *p, size_t off, const char *fmt, ...)
{
    char what[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    size_t line, col;
    line_col(p, off, &line, &col);
    return gp_error_set(p->err, GP_ERR_PARSE, "line %zu, column %zu: %s", line, col, what);
}

static gp_status nomem(struct parser *p)
{
    size_t line, col;
    line_col(p, p->pos, &line, &col);
    return gp_error_set(p->err, GP_ERR_NOMEM, "line %zu, column %zu: out of memory", line, col);
}

/* "'x'", "byte 0x0a" or "end of input", for "expected ..., found ...". */
static const char *found(const struct parser *p, size_t off, char buf[16])
{
    if (off >= p->n) return "end of input";
    unsigned char c = (unsigned char)p->s[off];
    if (c >= 0x20 && c < 0x7f)
        snprintf(buf, 16, "'%c'", c);
    else
        snprintf(buf, 16, "byte 0x%02x", c);
    return buf;
}

static gp_status unexpected(struct parser *p, const char *what)
{
    char b[16];
    if (p->pos < p->n && p->s[p->pos] == '/')
        return fail(p, p->pos, "comments are not allowed in JSON");
    return fail(p, p->pos, "expected %s, found %s", what, found(p, p->pos, b));
}

/* ---- scratch memory ---- */

static bool buf_reserve(struct parser *p, size_t extra)
{
    if (extra <= p->bcap - p->blen) return true;
    if (extra > SIZE_MAX - p->blen) return false;
    size_t need = p->blen + extra;
    size_t cap = p->bcap ? p->bcap : 256;
    while (cap < need) cap = cap > SIZE_MAX / 2 ? need : cap * 2;
    char *nb = realloc(p->buf, cap);
    if (!nb) return false;
    p->buf = nb;
    p->bcap = cap;
    return true;
}

static bool buf_put(struct parser *p, const char *bytes, size_t n)
{
    if (n == 0) return true;
    if (!buf_reserve(p, n)) return false;
    memcpy(p->buf + p->blen, bytes, n);
    p->blen += n;
    return true;
}

static gp_status push(struct parser *p, const struct gp_jvalue *v, const char *key)
{
    if (p->sp == p->scap) {
        size_t cap = p->scap ? p->scap * 2 : 64;
        if (cap > SIZE_MAX / sizeof *p->stack) return nomem(p);
        struct slot *ns = realloc(p->stack, cap * sizeof *ns);
        if (!ns) return nomem(p);
        p->stack = ns;
        p->scap = cap;
    }
    p->stack[p->sp].v = *v;
    p->stack[p->sp].key = key;
    p->sp++;
    return GP_OK;
}

/* Moves the members above `base` into the arena as v's items (and keys). */
static gp_status pop_members(struct parser *p, size_t base, struct gp_jvalue *v, bool with_keys)
{
    size_t count = p->sp - base;
    v->count = count;
    if (count) {
        if (count > SIZE_MAX / sizeof *v->items) return nomem(p);
        struct gp_jvalue *items = gp_arena_alloc(p->arena, count * sizeof *items);
        const char **keys = with_keys ? gp_arena_alloc(p->arena, count * sizeof *keys) : NULL;
        if (!items || (with_keys && !keys)) return nomem(p);
        for (size_t k = 0; k < count; k++) {
            items[k] = p->stack[base + k].v;
            if (keys) keys[k] = p->stack[base + k].key;
        }
        v->items = items;
        v->keys = keys;
    }
    p->sp = base;
    return GP_OK;
}

/* ---- lexical pieces ---- */

static void skip_ws(struct parser *p)
{
    while (p->pos < p->n) {
        char c = p->s[p->pos];
        if (c != ' ' && c != '\t' && c != '\n' && c != '\r') break;
        p->pos++;
    }
}

static bool at(const struct parser *p, char c)
{
    return p->pos < p->n && p->s[p->pos] == c;
}

static bool starts_with(const struct parser *p, const char *word)
{
    size_t k = strlen(word);
    return p->n - p->pos >= k && memcmp(p->s + p->pos, word, k) == 0;
}

static bool is_digit(char c)
{
    return c >= '0' && c <= '9';
}

static int hex_digit(char c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* The four hex digits at s[0..avail) as a code unit; -1 if one is not a hex
 * digit, -2 if the input ends first. */
static long hex4(const char *s, size_t avail)
{
    long v = 0;
    for (size_t k = 0; k < 4; k++) {
        if (k >= avail) return -2;
        int d = hex_digit(s[k]);
        if (d < 0) return -1;
        v = v * 16 + d;
    }
    return v;
}

/* Length of the well-formed UTF-8 sequence at s (RFC 3629: no overlong
 * forms, no encoded surrogates, nothing above U+10FFFF), or 0. */
static size_t utf8_len(const unsigned char *s, size_t avail)
{
    unsigned char c = s[0];
    if (c < 0x80) return 1;
    size_t n;
    unsigned char lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) {
        n = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
        n = 3;
        if (c == 0xE0) lo = 0xA0;
        if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        n = 4;
        if (c == 0xF0) lo = 0x90;
        if (c == 0xF4) hi = 0x8F;
    } else {
        return 0;
    }
    if (avail < n || s[1] < lo || s[1] > hi) return 0;
    for (size_t k = 2; k < n; k++)
        if ((s[k] & 0xC0) != 0x80) return 0;
    return n;
}

static size_t utf8_encode(unsigned long cp, char out[4])
{
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | (cp >> 18));
    out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* ---- strings ---- */

/* \uXXXX at p->pos, with its low half when it is a high surrogate. */
static gp_status parse_u_escape(struct parser *p, size_t open)
{
    size_t bs = p->pos;
    long cp = hex4(p->s + bs + 2, p->n - bs - 2);
    if (cp == -2) return fail(p, open, "unterminated string");
    if (cp < 0) return fail(p, bs, "invalid \\u escape: expected four hex digits");
    size_t used = 6;
    if (cp >= 0xD800 && cp <= 0xDBFF) {
        long lo = -1;
        if (p->n - bs >= 8 && p->s[bs + 6] == '\\' && p->s[bs + 7] == 'u') {
            lo = hex4(p->s + bs + 8, p->n - bs - 8);
            if (lo == -2) return fail(p, open, "unterminated string");
            if (lo < 0) return fail(p, bs + 6, "invalid \\u escape: expected four hex digits");
        }
        if (lo < 0xDC00 || lo > 0xDFFF)
            return fail(p, bs,
                        "lone surrogate \\u%04lX: a high surrogate must be followed by a "
                        "low one (\\uDC00-\\uDFFF)",
                        cp);
        cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
        used = 12;
    } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
        return fail(p, bs, "lone surrogate \\u%04lX: a low surrogate must follow a high one", cp);
    }
    char utf8[4];
    if (!buf_put(p, utf8, utf8_encode((unsigned long)cp, utf8))) return nomem(p);
    p->pos = bs + used;
    return GP_OK;
}

static gp_status parse_escape(struct parser *p, size_t open)
{
    size_t bs = p->pos;
    if (p->n - bs < 2) return fail(p, open, "unterminated string");
    char e = p->s[bs + 1], c;
    switch (e) {
    case '"': c = '"'; break;
    case '\\': c = '\\'; break;
    case '/': c = '/'; break;
    case 'b': c = '\b'; break;
    case 'f': c = '\f'; break;
    case 'n': c = '\n'; break;
    case 'r': c = '\r'; break;
    case 't': c = '\t'; break;
    case 'u': return parse_u_escape(p, open);
    default: {
        char b[16];
        return fail(p, bs, "invalid escape: '\\' followed by %s (valid: \\\" \\\\ \\/ \\b \\f \\n \\r \\t \\uXXXX)",
                    found(p, bs + 1, b));
    }
    }
    if (!buf_put(p, &c, 1)) return nomem(p);
    p->pos = bs + 2;
    return GP_OK;
}

/* The string whose opening quote is at p->pos, decoded into the arena. */
static gp_status parse_string(struct parser *p, const char **out, size_t *out_len)
{
    size_t open = p->pos++;
    p->blen = 0;
    for (;;) {
        /* Plain ASCII goes over in runs; everything else is looked at alone. */
        size_t run = p->pos;
        while (run < p->n) {
            unsigned char ch = (unsigned char)p->s[run];
            if (ch < 0x20 || ch >= 0x80 || ch == '"' || ch == '\\') break;
            run++;
        }
        if (!buf_put(p, p->s + p->pos, run - p->pos)) return nomem(p);
        p->pos = run;
        if (p->pos >= p->n) return fail(p, open, "unterminated string");
        unsigned char c = (unsigned char)p->s[p->pos];
        if (c == '"') {
            p->pos++;
            break;
        }
        if (c == '\\') {
            GP_TRY(parse_escape(p, open));
        } else if (c < 0x20) {
            const char *hint = c == '\n' ? "\\n" : c == '\t' ? "\\t" : c == '\r' ? "\\r" : NULL;
            if (hint)
                return fail(p, p->pos, "control character 0x%02x in a string (write it as %s)", c, hint);
            return fail(p, p->pos, "control character 0x%02x in a string (write it as \\u%04x)", c, c);
        } else {
            size_t k = utf8_len((const unsigned char *)p->s + p->pos, p->n - p->pos);
            if (!k) return fail(p, p->pos, "invalid UTF-8 in a string (byte 0x%02x)", c);
            if (!buf_put(p, p->s + p->pos, k)) return nomem(p);
            p->pos += k;
        }
    }
    char *s = gp_arena_strndup(p->arena, p->buf ? p->buf : "", p->blen);
    if (!s) return nomem(p);
    *out = s;
    *out_len = p->blen;
    return GP_OK;
}

/* ---- numbers and literals ---- */

/* strtod on a NUL-terminated copy of the number's text. */
static gp_status convert_number(struct parser *p, size_t start, size_t tok, double *out)
{
    /* Room for the copy and for a second copy with a longer decimal point. */
    p->blen = 0;
    if (tok > (SIZE_MAX - 64) / 2 || !buf_reserve(p, 2 * tok + 64)) return nomem(p);
    char *copy = p->buf;
    memcpy(copy, p->s + start, tok);
    copy[tok] = '\0';
    char *end;
    double d = strtod(copy, &end);
    if (end != copy + tok) {
        /* Under a locale whose decimal point is not '.', strtod stops at the
         * '.'; say it the locale's way and try again. */
        const char *dp = localeconv()->decimal_point;
        size_t dpl = strlen(dp);
        char *alt = copy + tok + 1, *w = alt;
        if (dpl == 0 || dpl > 32) return fail(p, start, "cannot convert number in this locale");
        for (size_t k = 0; k < tok; k++) {
            if (copy[k] == '.') {
                memcpy(w, dp, dpl);
                w += dpl;
            } else {
                *w++ = copy[k];
            }
        }
        *w = '\0';
        d = strtod(alt, &end);
        if (end != w) return fail(p, start, "cannot convert number in this locale");
    }
    if (isinf(d)) return fail(p, start, "number out of range for a double");
    *out = d;
    return GP_OK;
}

static gp_status expect_digit(struct parser *p, const char *where)
{
    char b[16];
    return fail(p, p->pos, "expected a digit %s, found %s", where, found(p, p->pos, b));
}

static gp_status parse_number(struct parser *p, struct gp_jvalue *v)
{
    size_t start = p->pos;
    bool neg = at(p, '-');
    if (neg) p->pos++;
    if (p->pos >= p->n || !is_digit(p->s[p->pos])) {
        if (starts_with(p, "Infinity")) return fail(p, start, "NaN and Infinity are not valid JSON");
        return expect_digit(p, "after '-'");
    }
    uint64_t mag = 0;
    bool fits = true;
    if (p->s[p->pos] == '0') {
        p->pos++;
        if (p->pos < p->n && is_digit(p->s[p->pos]))
            return fail(p, p->pos - 1, "leading zeros are not allowed");
    } else {
        for (; p->pos < p->n && is_digit(p->s[p->pos]); p->pos++) {
            unsigned d = (unsigned)(p->s[p->pos] - '0');
            if (mag > (UINT64_MAX - d) / 10)
                fits = false;
            else
                mag = mag * 10 + d;
        }
    }
    bool integral = true;
    if (at(p, '.')) {
        p->pos++;
        if (p->pos >= p->n || !is_digit(p->s[p->pos])) return expect_digit(p, "after '.'");
        while (p->pos < p->n && is_digit(p->s[p->pos])) p->pos++;
        integral = false;
    }
    if (at(p, 'e') || at(p, 'E')) {
        p->pos++;
        if (at(p, '+') || at(p, '-')) p->pos++;
        if (p->pos >= p->n || !is_digit(p->s[p->pos])) return expect_digit(p, "in the exponent");
        while (p->pos < p->n && is_digit(p->s[p->pos])) p->pos++;
        integral = false;
    }
    v->type = GP_JNUMBER;
    GP_TRY(convert_number(p, start, p->pos - start, &v->num));
    uint64_t limit = neg ? (uint64_t)INT64_MAX + 1 : (uint64_t)INT64_MAX;
    if (integral && fits && mag <= limit) {
        v->is_int = true;
        if (!neg)
            v->i = (int64_t)mag;
        else
            v->i = mag == (uint64_t)INT64_MAX + 1 ? INT64_MIN : -(int64_t)mag;
    }
    return GP_OK;
}

static gp_status parse_literal(struct parser *p, const char *word)
{
    size_t k = strlen(word);
    if (!starts_with(p, word)) return fail(p, p->pos, "invalid literal (expected true, false or null)");
    char next = p->n - p->pos > k ? p->s[p->pos + k] : ' ';
    if ((next >= 'a' && next <= 'z') || (next >= 'A' && next <= 'Z') || is_digit(next) || next == '_')
        return fail(p, p->pos, "invalid literal (expected true, false or null)");
    p->pos += k;
    return GP_OK;
}

/* ---- structure ---- */

static gp_status parse_value(struct parser *p, struct gp_jvalue *v, int depth);

static gp_status parse_array(struct parser *p, struct gp_jvalue *v, int depth)
{
    if (depth >= GP_JSON_PARSE_MAX_DEPTH)
        return fail(p, p->pos, "nesting deeper than %d levels", GP_JSON_PARSE_MAX_DEPTH);
    v->type = GP_JARRAY;
    size_t base = p->sp;
    p->pos++;
    skip_ws(p);
    if (at(p, ']')) {
        p->pos++;
        return GP_OK;
    }
    for (;;) {
        struct gp_jvalue item;
        GP_TRY(parse_value(p, &item, depth + 1));
        GP_TRY(push(p, &item, NULL));
        skip_ws(p);
        if (at(p, ',')) {
            size_t comma = p->pos++;
            skip_ws(p);
            if (at(p, ']')) return fail(p, comma, "trailing comma before ']'");
            continue;
        }
        if (at(p, ']')) {
            p->pos++;
            break;
        }
        return unexpected(p, "',' or ']'");
    }
    return pop_members(p, base, v, false);
}

static gp_status parse_object(struct parser *p, struct gp_jvalue *v, int depth)
{
    if (depth >= GP_JSON_PARSE_MAX_DEPTH)
        return fail(p, p->pos, "nesting deeper than %d levels", GP_JSON_PARSE_MAX_DEPTH);
    v->type = GP_JOBJECT;
    size_t base = p->sp;
    p->pos++;
    skip_ws(p);
    if (at(p, '}')) {
        p->pos++;
        return GP_OK;
    }
    for (;;) {
        skip_ws(p);
        if (!at(p, '"')) {
            if (at(p, '\'')) return fail(p, p->pos, "strings must be in double quotes");
            return unexpected(p, p->sp == base ? "a string key or '}'" : "a string key");
        }
        size_t key_at = p->pos;
        const char *key;
        size_t klen;
        GP_TRY(parse_string(p, &key, &klen));
        if (memchr(key, '\0', klen)) return fail(p, key_at, "object keys must not contain \\u0000");
        skip_ws(p);
        if (!at(p, ':')) return unexpected(p, "':'");
        p->pos++;
        struct gp_jvalue item;
        GP_TRY(parse_value(p, &item, depth + 1));
        GP_TRY(push(p, &item, key));
        skip_ws(p);
        if (at(p, ',')) {
            size_t comma = p->pos++;
            skip_ws(p);
            if (at(p, '}')) return fail(p, comma, "trailing comma before '}'");
            continue;
        }
        if (at(p, '}')) {
            p->pos++;
            break;
        }
        return unexpected(p, "',' or '}'");
    }
    return pop_members(p, base, v, true);
}

/* depth: how many containers enclose this value. */
static gp_status parse_value(struct parser *p, struct gp_jvalue *v, int depth)
{
    memset(v, 0, sizeof *v);
    skip_ws(p);
    if (p->pos >= p->n) return unexpected(p, "a value");
    char c = p->s[p->pos];
    switch (c) {
    case '{': return parse_object(p, v, depth);
    case '[': return parse_array(p, v, depth);
    case '"':
        v->type = GP_JSTRING;
        return parse_string(p, &v->str, &v->len);
    case 't':
        v->type = GP_JBOOL;
        v->b = true;
        return parse_literal(p, "true");
    case 'f':
        v->type = GP_JBOOL;
        return parse_literal(p, "false");
    case 'n':
        v->type = GP_JNULL;
        return parse_literal(p, "null");
    case '\'': return fail(p, p->pos, "strings must be in double quotes");
    default: break;
    }
    if (c == '-' || is_digit(c)) return parse_number(p, v);
    if (starts_with(p, "NaN") || starts_with(p, "Infinity"))
        return fail(p, p->pos, "NaN and Infinity are not valid JSON");
    return unexpected(p, "a value");
}

/* ---- public ---- */

gp_status gp_json_parse(const char *text, size_t len, struct gp_json_doc *doc,
                        struct gp_error *err)
{
    doc->arena.head = NULL;
    doc->root = NULL;
    if (!text && len) return gp_error_set(err, GP_ERR_INVALID, "JSON text is NULL");
    struct parser p = {.s = text ? text : "", .n = len, .arena = &doc->arena, .err = err};
    if (len >= 3 && memcmp(text, "\xEF\xBB\xBF", 3) == 0) p.pos = p.start = 3;

    struct gp_jvalue root;
    gp_status st = parse_value(&p, &root, 0);
    if (st == GP_OK) {
        skip_ws(&p);
        if (p.pos < p.n) {
            char b[16];
            if (p.s[p.pos] == '/')
                st = fail(&p, p.pos, "comments are not allowed in JSON");
            else
                st = fail(&p, p.pos, "unexpected %s after the JSON value", found(&p, p.pos, b));
        }
    }
    if (st == GP_OK) {
        doc->root = gp_arena_memdup(&doc->arena, &root, sizeof root);
        if (!doc->root) st = nomem(&p);
    }
    free(p.stack);
    free(p.buf);
    if (st != GP_OK) gp_json_doc_free(doc);
    return st;
}

gp_status gp_json_parse_file(const char *path, struct gp_json_doc *doc, struct gp_error *err)
{
    doc->arena.head = NULL;
    doc->root = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) return gp_error_set(err, GP_ERR_IO, "cannot open '%s': %s", path, strerror(errno));

    /* Read until end of file rather than trusting a size taken beforehand, so
     * pipes and files that change under us are handled the same way. */
    size_t cap = 64 * 1024, len = 0;
    char *text = malloc(cap);
    gp_status st = GP_OK;
    if (!text) st = gp_error_set(err, GP_ERR_NOMEM, "%s: out of memory", path);
    while (st == GP_OK) {
        if (len == cap) {
            if (cap > GP_JSON_PARSE_MAX_FILE) {
                st = gp_error_set(err, GP_ERR_UNSUPPORTED, "%s: larger than %zu MiB", path,
                                  GP_JSON_PARSE_MAX_FILE >> 20);
                break;
            }
            size_t ncap = cap * 2 > GP_JSON_PARSE_MAX_FILE ? GP_JSON_PARSE_MAX_FILE + 1 : cap * 2;
            char *nt = realloc(text, ncap);
            if (!nt) {
                st = gp_error_set(err, GP_ERR_NOMEM, "%s: out of memory", path);
                break;
            }
            text = nt;
            cap = ncap;
        }
        size_t got = fread(text + len, 1, cap - len, f);
        len += got;
        if (got == 0) {
            if (ferror(f)) st = gp_error_set(err, GP_ERR_IO, "cannot read '%s': %s", path, strerror(errno));
            break;
        }
    }
    fclose(f);
    if (st == GP_OK) {
        st = gp_json_parse(text, len, doc, err);
        if (st != GP_OK) gp_error_prefix(err, "%s: ", path);
    }
    free(text);
    return st;
}

void gp_json_doc_free(struct gp_json_doc *doc)
{
    if (!doc) return;
    gp_arena_free(&doc->arena);
    doc->root = NULL;
}

const struct gp_jvalue *gp_jobject_get(const struct gp_jvalue *obj, const char *key)
{
    if (!obj || obj->type != GP_JOBJECT || !key) return NULL;
    for (size_t k = obj->count; k-- > 0;)
        if (strcmp(obj->keys[k], key) == 0) return &obj->items[k];
    return NULL;
}

const struct gp_jvalue *gp_jarray_at(const struct gp_jvalue *arr, size_t i)
{
    if (!arr || arr->type != GP_JARRAY || i >= arr->count) return NULL;
    return &arr->items[i];
}

const char *gp_jtype_name(enum gp_jtype type)
{
    switch (type) {
    case GP_JNULL: return "null";
    case GP_JBOOL: return "boolean";
    case GP_JNUMBER: return "number";
    case GP_JSTRING: return "string";
    case GP_JARRAY: return "array";
    case GP_JOBJECT: return "object";
    }
    return "unknown";
}
