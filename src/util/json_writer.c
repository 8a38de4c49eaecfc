#include "util/json_writer.h"

#include <math.h>
#include <stdlib.h>

void gp_json_init(struct gp_json *j, FILE *f, bool pretty)
{
    j->f = f;
    j->depth = 0;
    j->first[0] = true;
    j->after_key = false;
    j->pretty = pretty;
}

static void indent(struct gp_json *j)
{
    if (!j->pretty) return;
    fputc('\n', j->f);
    for (int i = 0; i < j->depth; i++) fputs("  ", j->f);
}

/* Separator and indentation before a value or key at the current depth. */
static void before_item(struct gp_json *j)
{
    if (j->after_key) {
        j->after_key = false;
        return;
    }
    if (j->depth == 0) return;
    if (!j->first[j->depth]) fputc(',', j->f);
    j->first[j->depth] = false;
    indent(j);
}

static void open(struct gp_json *j, char c)
{
    before_item(j);
    fputc(c, j->f);
    if (j->depth < GP_JSON_MAX_DEPTH - 1) j->depth++;
    j->first[j->depth] = true;
}

static void close_(struct gp_json *j, char c)
{
    bool empty = j->first[j->depth];
    if (j->depth > 0) j->depth--;
    if (!empty) indent(j);
    fputc(c, j->f);
}

void gp_json_object_begin(struct gp_json *j) { open(j, '{'); }
void gp_json_object_end(struct gp_json *j) { close_(j, '}'); }
void gp_json_array_begin(struct gp_json *j) { open(j, '['); }
void gp_json_array_end(struct gp_json *j) { close_(j, ']'); }

static void write_string(FILE *f, const char *s)
{
    fputc('"', f);
    for (const unsigned char *p = (const unsigned char *)(s ? s : ""); *p; p++) {
        switch (*p) {
        case '"': fputs("\\\"", f); break;
        case '\\': fputs("\\\\", f); break;
        case '\n': fputs("\\n", f); break;
        case '\r': fputs("\\r", f); break;
        case '\t': fputs("\\t", f); break;
        default:
            if (*p < 0x20) fprintf(f, "\\u%04x", *p);
            else fputc(*p, f);
        }
    }
    fputc('"', f);
}

void gp_json_key(struct gp_json *j, const char *key)
{
    before_item(j);
    write_string(j->f, key);
    fputs(j->pretty ? ": " : ":", j->f);
    j->after_key = true;
}

void gp_json_string(struct gp_json *j, const char *s)
{
    before_item(j);
    write_string(j->f, s);
}

void gp_json_int(struct gp_json *j, int64_t v)
{
    before_item(j);
    fprintf(j->f, "%lld", (long long)v);
}

void gp_json_double(struct gp_json *j, double v)
{
    before_item(j);
    /* The shortest of 15 or 17 significant digits that reads back exactly. */
    char buf[40];
    snprintf(buf, sizeof buf, "%.15g", v);
    if (isfinite(v) && strtod(buf, NULL) != v) snprintf(buf, sizeof buf, "%.17g", v);
    if (isfinite(v)) fputs(buf, j->f);
    else fputs("null", j->f);
}

void gp_json_bool(struct gp_json *j, bool v)
{
    before_item(j);
    fputs(v ? "true" : "false", j->f);
}

void gp_json_null(struct gp_json *j)
{
    before_item(j);
    fputs("null", j->f);
}

void gp_json_finish(struct gp_json *j) { fputc('\n', j->f); }
