/* A JSON reader (RFC 8259) that builds a tree in one arena, for the fixture
 * manifest and user-supplied profile files. Input is untrusted: every length
 * is checked, nesting is bounded, and a malformed document yields a message
 * with its line and column instead of a crash.
 *
 * Choices where the RFC leaves room:
 *  - strings must be valid UTF-8; escapes are decoded, and a lone surrogate
 *    (\uD800 without its low half, or a low half alone) is an error rather
 *    than being replaced with U+FFFD;
 *  - \u0000 is kept in string values (count it through `len`) but refused in
 *    object keys, which are compared as C strings;
 *  - a number whose magnitude overflows a double (1e400) is an error; one
 *    that underflows becomes 0 or a subnormal, as strtod gives it;
 *  - duplicate keys are kept in order; gp_jobject_get returns the last one,
 *    as JavaScript and Python do;
 *  - a leading UTF-8 byte order mark is skipped;
 *  - comments, trailing commas, NaN, Infinity, single quotes and leading
 *    zeros are errors, with a message that says so.
 * Columns count characters (UTF-8 code points) from 1; lines count '\n'. */
#ifndef GP_UTIL_JSON_PARSE_H
#define GP_UTIL_JSON_PARSE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "util/arena.h"
#include "util/error.h"

/* Containers nested deeper than this are refused, so recursion stays bounded. */
#define GP_JSON_PARSE_MAX_DEPTH 256
/* gp_json_parse_file refuses larger files rather than trying to hold them. */
#define GP_JSON_PARSE_MAX_FILE ((size_t)256 << 20)

enum gp_jtype { GP_JNULL, GP_JBOOL, GP_JNUMBER, GP_JSTRING, GP_JARRAY, GP_JOBJECT };

struct gp_jvalue {
    enum gp_jtype type;
    bool b;       /* GP_JBOOL */
    double num;   /* GP_JNUMBER, always set (strtod's correctly rounded value) */
    int64_t i;    /* GP_JNUMBER when is_int, else 0 */
    bool is_int;  /* exact integer: no fraction or exponent, and it fits int64 */
    const char *str; /* GP_JSTRING: NUL-terminated UTF-8, escapes decoded */
    size_t len;      /* GP_JSTRING: bytes in str, not counting the final NUL */
    size_t count;             /* GP_JARRAY, GP_JOBJECT: number of members */
    struct gp_jvalue *items;  /* members in document order; NULL when count is 0 */
    const char **keys;        /* GP_JOBJECT: keys, parallel to items */
};

struct gp_json_doc {
    struct gp_arena arena; /* owns every node and string under root */
    struct gp_jvalue *root;
};

/* Parses text[0..len) (no terminating NUL needed) into doc, which is
 * overwritten. The tree does not point into text. On failure doc is left
 * empty (root NULL) and err holds "line L, column C: what was expected";
 * GP_ERR_PARSE for bad input, GP_ERR_NOMEM when memory runs out. */
gp_status gp_json_parse(const char *text, size_t len, struct gp_json_doc *doc,
                        struct gp_error *err);

/* Reads and parses a file; every message starts with "<path>: ". */
gp_status gp_json_parse_file(const char *path, struct gp_json_doc *doc, struct gp_error *err);

/* Releases the tree; safe on an empty or already freed doc. */
void gp_json_doc_free(struct gp_json_doc *doc);

/* The member named key (the last one if repeated); NULL if absent, or if obj
 * is NULL or not an object. */
const struct gp_jvalue *gp_jobject_get(const struct gp_jvalue *obj, const char *key);

/* Element i; NULL if out of range, or if arr is NULL or not an array. */
const struct gp_jvalue *gp_jarray_at(const struct gp_jvalue *arr, size_t i);

/* "null", "boolean", "number", "string", "array" or "object", for messages
 * such as "'batch' must be a number, not a string". */
const char *gp_jtype_name(enum gp_jtype type);

#endif
