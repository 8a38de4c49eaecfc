/* A small streaming JSON writer: commas, nesting and string escaping are
 * handled here so report code only says what to write. */
#ifndef GP_UTIL_JSON_WRITER_H
#define GP_UTIL_JSON_WRITER_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#define GP_JSON_MAX_DEPTH 32

struct gp_json {
    FILE *f;
    int depth;
    bool first[GP_JSON_MAX_DEPTH]; /* no element written yet at this depth */
    bool after_key;
    bool pretty;
};

void gp_json_init(struct gp_json *j, FILE *f, bool pretty);
void gp_json_object_begin(struct gp_json *j);
void gp_json_object_end(struct gp_json *j);
void gp_json_array_begin(struct gp_json *j);
void gp_json_array_end(struct gp_json *j);
void gp_json_key(struct gp_json *j, const char *key);
void gp_json_string(struct gp_json *j, const char *s);
void gp_json_int(struct gp_json *j, int64_t v);
void gp_json_double(struct gp_json *j, double v); /* NaN and infinities become null */
void gp_json_bool(struct gp_json *j, bool v);
void gp_json_null(struct gp_json *j);
/* Ends the document with a newline. */
void gp_json_finish(struct gp_json *j);

#endif
