/* The JSON reader: values of every type, escapes, integer limits, every error
 * class with its line and column, nesting limits, and hostile input (every
 * truncation of a document, random corruption) that must fail cleanly. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <fcntl.h>
#include <locale.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "util/json_parse.h"

/* A heap copy of exactly len bytes with no terminator after it, so that a
 * read past the end is caught by sanitizers and valgrind. */
static char *exact_copy(const char *text, size_t len)
{
    char *c = malloc(len ? len : 1);
    assert_non_null(c);
    memcpy(c, text, len);
    return c;
}

static gp_status parse_n(const char *text, size_t len, struct gp_json_doc *doc, struct gp_error *err)
{
    char *c = exact_copy(text, len);
    gp_status st = gp_json_parse(c, len, doc, err);
    free(c); /* the tree must not point into the text */
    return st;
}

static const struct gp_jvalue *parse_ok(struct gp_json_doc *doc, const char *text)
{
    struct gp_error err = {0};
    gp_status st = parse_n(text, strlen(text), doc, &err);
    if (st != GP_OK) fail_msg("'%s' failed: %s", text, err.msg);
    assert_non_null(doc->root);
    return doc->root;
}

/* Checks the invariants the header promises, at every node. */
static void check_tree(const struct gp_jvalue *v, int depth)
{
    assert_true(depth <= GP_JSON_PARSE_MAX_DEPTH);
    switch (v->type) {
    case GP_JNULL:
    case GP_JBOOL:
        break;
    case GP_JNUMBER:
        assert_true(isfinite(v->num));
        if (v->is_int) assert_true((double)v->i == v->num);
        break;
    case GP_JSTRING:
        assert_non_null(v->str);
        assert_int_equal(v->str[v->len], '\0');
        break;
    case GP_JARRAY:
    case GP_JOBJECT:
        assert_true((v->count == 0) == (v->items == NULL));
        if (v->type == GP_JOBJECT)
            assert_true((v->count == 0) == (v->keys == NULL));
        else
            assert_null(v->keys);
        for (size_t k = 0; k < v->count; k++) {
            if (v->type == GP_JOBJECT) assert_non_null(v->keys[k]);
            check_tree(&v->items[k], depth + 1);
        }
        break;
    default:
        fail_msg("bad type %d", (int)v->type);
    }
}

/* ---- valid documents ---- */

static void test_literals(void **state)
{
    (void)state;
    struct gp_json_doc doc;
    assert_int_equal(parse_ok(&doc, "null")->type, GP_JNULL);
    gp_json_doc_free(&doc);
    const struct gp_jvalue *v = parse_ok(&doc, " \t\r\n true \n");
    assert_int_equal(v->type, GP_JBOOL);
    assert_true(v->b);
    gp_json_doc_free(&doc);
    v = parse_ok(&doc, "false");
    assert_int_equal(v->type, GP_JBOOL);
    assert_false(v->b);
    gp_json_doc_free(&doc);
    v = parse_ok(&doc, "\xEF\xBB\xBF\"bom\""); /* a byte order mark is skipped */
    assert_string_equal(v->str, "bom");
    gp_json_doc_free(&doc);
}

struct num_case {
    const char *text;
    double num;
    bool is_int;
    int64_t i;
};

static void test_numbers(void **state)
{
    (void)state;
    static const struct num_case cases[] = {
        {"0", 0.0, true, 0},
        {"42", 42.0, true, 42},
        {"-7", -7.0, true, -7},
        {"3.5", 3.5, false, 0},
        {"1e3", 1000.0, false, 0},
        {"1E+2", 100.0, false, 0},
        {"-1.5E-2", -0.015, false, 0},
        {"1.0", 1.0, false, 0},
        {"0.1", 0.1, false, 0},
        {"1e-400", 0.0, false, 0}, /* underflow is accepted */
        {"9223372036854775807", 9223372036854775807.0, true, INT64_MAX},
        {"-9223372036854775808", -9223372036854775808.0, true, INT64_MIN},
        {"9223372036854775808", 9223372036854775808.0, false, 0},
        {"-9223372036854775809", -9223372036854775809.0, false, 0},
        {"18446744073709551616", 18446744073709551616.0, false, 0},
        {"123456789012345678901234567890", 123456789012345678901234567890.0, false, 0},
        {"1.7976931348623157e308", 1.7976931348623157e308, false, 0},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        struct gp_json_doc doc;
        const struct gp_jvalue *v = parse_ok(&doc, cases[k].text);
        assert_int_equal(v->type, GP_JNUMBER);
        if (v->num != cases[k].num) fail_msg("%s: got %.17g", cases[k].text, v->num);
        if (v->is_int != cases[k].is_int) fail_msg("%s: is_int %d", cases[k].text, v->is_int);
        if (v->i != cases[k].i) fail_msg("%s: i %lld", cases[k].text, (long long)v->i);
        gp_json_doc_free(&doc);
    }

    /* -0 is an exact integer 0 whose double keeps its sign. */
    struct gp_json_doc doc;
    const struct gp_jvalue *v = parse_ok(&doc, "-0");
    assert_true(v->is_int);
    assert_int_equal(v->i, 0);
    assert_true(signbit(v->num));
    gp_json_doc_free(&doc);

    /* A number far longer than any fixed buffer: 10^-1000 * 10^1000. */
    char long_num[1100];
    strcpy(long_num, "0.");
    memset(long_num + 2, '0', 999);
    strcpy(long_num + 1001, "1e1000");
    v = parse_ok(&doc, long_num);
    assert_true(v->num == 1.0);
    assert_false(v->is_int);
    gp_json_doc_free(&doc);
}

/* Numbers are read the same way whatever LC_NUMERIC the program chose. */
static void test_numbers_under_comma_locale(void **state)
{
    (void)state;
    static const char *const names[] = {"de_DE.UTF-8", "de_DE.utf8", "fr_FR.UTF-8", "fr_FR.utf8",
                                        "de_DE", "fr_FR"};
    const char *set = NULL;
    for (size_t k = 0; k < sizeof names / sizeof names[0] && !set; k++)
        set = setlocale(LC_NUMERIC, names[k]);
    if (!set || strcmp(localeconv()->decimal_point, ",") != 0) {
        setlocale(LC_NUMERIC, "C");
        skip(); /* no locale with a decimal comma is installed */
    }
    struct gp_json_doc doc;
    struct gp_error err = {0};
    gp_status st = gp_json_parse("[2.5,-1.25e1]", 13, &doc, &err);
    setlocale(LC_NUMERIC, "C");
    if (st != GP_OK) fail_msg("%s", err.msg);
    assert_true(gp_jarray_at(doc.root, 0)->num == 2.5);
    assert_true(gp_jarray_at(doc.root, 1)->num == -12.5);
    gp_json_doc_free(&doc);
}

static void want_string(const char *json, const char *bytes, size_t len)
{
    struct gp_json_doc doc;
    const struct gp_jvalue *v = parse_ok(&doc, json);
    assert_int_equal(v->type, GP_JSTRING);
    if (v->len != len || memcmp(v->str, bytes, len) != 0) fail_msg("%s: wrong bytes (len %zu)", json, v->len);
    assert_int_equal(v->str[v->len], '\0');
    gp_json_doc_free(&doc);
}

static void test_strings(void **state)
{
    (void)state;
    want_string("\"\"", "", 0);
    want_string("\"plain text\"", "plain text", 10);
    want_string("\"\\\"\\\\\\/\\b\\f\\n\\r\\t\"", "\"\\/\b\f\n\r\t", 8);
    want_string("\"\\u0041\\u00e9\\u20AC\"", "A\xc3\xa9\xe2\x82\xac", 6);
    want_string("\"\\ud83d\\ude00\"", "\xf0\x9f\x98\x80", 4);        /* a surrogate pair */
    want_string("\"\\uDBFF\\uDFFF\"", "\xf4\x8f\xbf\xbf", 4);        /* U+10FFFF */
    want_string("\"\\uFFFF\"", "\xef\xbf\xbf", 3);                    /* a noncharacter is allowed */
    want_string("\"a\\u0000b\"", "a\0b", 3);                          /* NUL is kept; len counts it */
    want_string("\"\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80\"", "\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80", 9);
    want_string("\"\x7f\"", "\x7f", 1); /* DEL need not be escaped */
}

static void test_containers(void **state)
{
    (void)state;
    struct gp_json_doc doc;
    const struct gp_jvalue *v = parse_ok(&doc, "[]");
    assert_int_equal(v->type, GP_JARRAY);
    assert_int_equal(v->count, 0);
    assert_null(gp_jarray_at(v, 0));
    gp_json_doc_free(&doc);

    v = parse_ok(&doc, "{}");
    assert_int_equal(v->type, GP_JOBJECT);
    assert_int_equal(v->count, 0);
    assert_null(gp_jobject_get(v, ""));
    gp_json_doc_free(&doc);

    v = parse_ok(&doc, " [ 1 , \"two\" , [ true , null , [] ] , { \"k\" : false , \"\" : {} } ] ");
    check_tree(v, 0);
    assert_int_equal(v->count, 4);
    assert_int_equal(gp_jarray_at(v, 0)->i, 1);
    assert_string_equal(gp_jarray_at(v, 1)->str, "two");
    const struct gp_jvalue *inner = gp_jarray_at(v, 2);
    assert_int_equal(inner->type, GP_JARRAY);
    assert_int_equal(inner->count, 3);
    assert_int_equal(gp_jarray_at(inner, 1)->type, GP_JNULL);
    assert_int_equal(gp_jarray_at(inner, 2)->type, GP_JARRAY);
    assert_null(gp_jarray_at(inner, 3));
    const struct gp_jvalue *obj = gp_jarray_at(v, 3);
    assert_int_equal(obj->type, GP_JOBJECT);
    assert_string_equal(obj->keys[0], "k");
    assert_string_equal(obj->keys[1], "");
    assert_false(gp_jobject_get(obj, "k")->b);
    assert_int_equal(gp_jobject_get(obj, "")->type, GP_JOBJECT);
    assert_null(gp_jobject_get(obj, "K"));
    assert_null(gp_jobject_get(obj, NULL));
    /* The accessors refuse the wrong type instead of misreading it. */
    assert_null(gp_jobject_get(v, "k"));
    assert_null(gp_jarray_at(obj, 0));
    assert_null(gp_jobject_get(NULL, "k"));
    assert_null(gp_jarray_at(NULL, 0));
    gp_json_doc_free(&doc);

    /* Keys keep document order; a repeated key is kept and the last wins. */
    v = parse_ok(&doc, "{\"b\":1,\"a\":2,\"b\":3,\"\\u00e9\":4}");
    assert_int_equal(v->count, 4);
    assert_string_equal(v->keys[0], "b");
    assert_string_equal(v->keys[1], "a");
    assert_int_equal(gp_jobject_get(v, "b")->i, 3);
    assert_int_equal(gp_jobject_get(v, "\xc3\xa9")->i, 4);
    gp_json_doc_free(&doc);

    /* Many members: the member stack grows well past its first size. */
    size_t n = 100000;
    char *big = malloc(n * 8 + 16);
    assert_non_null(big);
    size_t len = 0;
    big[len++] = '[';
    for (size_t k = 0; k < n; k++) len += (size_t)sprintf(big + len, k ? ",[%zu]" : "[%zu]", k);
    big[len++] = ']';
    struct gp_error err = {0};
    assert_int_equal(gp_json_parse(big, len, &doc, &err), GP_OK);
    free(big);
    assert_int_equal(doc.root->count, n);
    for (size_t k = 0; k < n; k += 997) assert_int_equal(gp_jarray_at(doc.root, k)->items[0].i, (int64_t)k);
    gp_json_doc_free(&doc);
    gp_json_doc_free(&doc); /* freeing twice is harmless */
}

static void test_type_names(void **state)
{
    (void)state;
    assert_string_equal(gp_jtype_name(GP_JNULL), "null");
    assert_string_equal(gp_jtype_name(GP_JBOOL), "boolean");
    assert_string_equal(gp_jtype_name(GP_JNUMBER), "number");
    assert_string_equal(gp_jtype_name(GP_JSTRING), "string");
    assert_string_equal(gp_jtype_name(GP_JARRAY), "array");
    assert_string_equal(gp_jtype_name(GP_JOBJECT), "object");
}

/* ---- errors ---- */

struct err_case {
    const char *text;
    size_t len;
    int line, col;
    const char *needle;
};

#define E(s, l, c, n) {s, sizeof(s) - 1, l, c, n}

static void want_error(const char *text, size_t len, int line, int col, const char *needle)
{
    struct gp_json_doc doc;
    struct gp_error err = {0};
    gp_status st = parse_n(text, len, &doc, &err);
    if (st != GP_ERR_PARSE) fail_msg("'%.*s': status %d (%s)", (int)len, text, st, err.msg);
    assert_null(doc.root);
    assert_null(doc.arena.head); /* nothing left to free after a failure */
    char where[64];
    snprintf(where, sizeof where, "line %d, column %d: ", line, col);
    if (strncmp(err.msg, where, strlen(where)) != 0 || !strstr(err.msg, needle))
        fail_msg("'%.*s': got \"%s\", want \"%s...%s\"", (int)len, text, err.msg, where, needle);
}

static void test_errors(void **state)
{
    (void)state;
    static const struct err_case cases[] = {
        /* structure */
        E("", 1, 1, "expected a value, found end of input"),
        E("   ", 1, 4, "expected a value, found end of input"),
        E("[", 1, 2, "expected a value, found end of input"),
        E("[1,2", 1, 5, "expected ',' or ']', found end of input"),
        E("[1 2]", 1, 4, "expected ',' or ']', found '2'"),
        E("[1}", 1, 3, "expected ',' or ']', found '}'"),
        E("{\"a\":1 \"b\":2}", 1, 8, "expected ',' or '}', found '\"'"),
        E("{\"a\":1]", 1, 7, "expected ',' or '}', found ']'"),
        E("{\"a\" 1}", 1, 6, "expected ':', found '1'"),
        E("{\"a\":}", 1, 6, "expected a value, found '}'"),
        E("{a:1}", 1, 2, "expected a string key or '}', found 'a'"),
        E("{\"a\":1,b:2}", 1, 8, "expected a string key, found 'b'"),
        E("[,1]", 1, 2, "expected a value, found ','"),
        E("[1,]", 1, 3, "trailing comma before ']'"),
        E("{\"a\":1,}", 1, 7, "trailing comma before '}'"),
        E("{\n  \"a\": 1,\n  \"b\" 2\n}", 3, 7, "expected ':', found '2'"),
        E("[\r\n1\r\n x]", 3, 2, "expected ',' or ']', found 'x'"),
        E("[\"\xc3\xa9\" x]", 1, 6, "found 'x'"), /* columns count characters */
        E("\xEF\xBB\xBF[1,]", 1, 3, "trailing comma"), /* ...and not the byte order mark */
        /* trailing garbage */
        E("1 2", 1, 3, "unexpected '2' after the JSON value"),
        E("[1]x", 1, 4, "unexpected 'x' after the JSON value"),
        E("{} {}", 1, 4, "unexpected '{' after the JSON value"),
        E("null\n\n  ]", 3, 3, "unexpected ']' after the JSON value"),
        /* bytes that start nothing */
        E("\xff", 1, 1, "expected a value, found byte 0xff"),
        E("[1,\0]", 1, 4, "expected a value, found byte 0x00"),
        E("True", 1, 1, "expected a value, found 'T'"),
        E("'a'", 1, 1, "strings must be in double quotes"),
        E("{'a':1}", 1, 2, "strings must be in double quotes"),
        E("[1 // note\n]", 1, 4, "comments are not allowed"),
        E("// note\n1", 1, 1, "comments are not allowed"),
        E("1 /* note */", 1, 3, "comments are not allowed"),
        /* literals */
        E("tru", 1, 1, "invalid literal"),
        E("[nul]", 1, 2, "invalid literal"),
        E("truex", 1, 1, "invalid literal"),
        E("nullnull", 1, 1, "invalid literal"),
        /* numbers */
        E("01", 1, 1, "leading zeros are not allowed"),
        E("-012", 1, 2, "leading zeros are not allowed"),
        E("[00]", 1, 2, "leading zeros are not allowed"),
        E("1.", 1, 3, "expected a digit after '.', found end of input"),
        E("1.e5", 1, 3, "expected a digit after '.', found 'e'"),
        E("1e", 1, 3, "expected a digit in the exponent, found end of input"),
        E("1e+", 1, 4, "expected a digit in the exponent"),
        E("-", 1, 2, "expected a digit after '-', found end of input"),
        E("-a", 1, 2, "expected a digit after '-', found 'a'"),
        E(".5", 1, 1, "expected a value, found '.'"),
        E("+1", 1, 1, "expected a value, found '+'"),
        E("NaN", 1, 1, "NaN and Infinity are not valid JSON"),
        E("Infinity", 1, 1, "NaN and Infinity are not valid JSON"),
        E("[1, -Infinity]", 1, 5, "NaN and Infinity are not valid JSON"),
        E("1e400", 1, 1, "number out of range"),
        E("[-1e400]", 1, 2, "number out of range"),
        E("0x10", 1, 2, "unexpected 'x' after the JSON value"),
        /* strings */
        E("\"abc", 1, 1, "unterminated string"),
        E("[\"abc\\", 1, 2, "unterminated string"),
        E("\"\\u12", 1, 1, "unterminated string"),
        E("\"\\x\"", 1, 2, "invalid escape: '\\' followed by 'x'"),
        E("\"\\'\"", 1, 2, "invalid escape: '\\' followed by '''"),
        E("\"\\u12G4\"", 1, 2, "invalid \\u escape: expected four hex digits"),
        E("\"\\u12\"", 1, 2, "invalid \\u escape"),
        E("\"a\nb\"", 1, 3, "control character 0x0a in a string (write it as \\n)"),
        E("\"\t\"", 1, 2, "control character 0x09 in a string (write it as \\t)"),
        E("\"\x01\"", 1, 2, "control character 0x01 in a string (write it as \\u0001)"),
        E("\"\\ud800\"", 1, 2, "lone surrogate \\uD800"),
        E("\"\\ud800\\u0041\"", 1, 2, "lone surrogate \\uD800"),
        E("\"\\ud800\\ud800\"", 1, 2, "lone surrogate \\uD800"),
        E("\"\\udc00\"", 1, 2, "lone surrogate \\uDC00: a low surrogate must follow a high one"),
        E("\"x\\ud800\\uzzzz\"", 1, 9, "invalid \\u escape"),
        E("\"\xc3\x28\"", 1, 2, "invalid UTF-8"),
        E("\"\xc0\xaf\"", 1, 2, "invalid UTF-8"),         /* overlong */
        E("\"\xe0\x80\xaf\"", 1, 2, "invalid UTF-8"),     /* overlong */
        E("\"\xed\xa0\x80\"", 1, 2, "invalid UTF-8"),     /* an encoded surrogate */
        E("\"\xf4\x90\x80\x80\"", 1, 2, "invalid UTF-8"), /* above U+10FFFF */
        E("\"\xe2\x82\"", 1, 2, "invalid UTF-8"),         /* cut short */
        E("\"\x80\"", 1, 2, "invalid UTF-8"),
        E("\"\xe2\x82", 1, 2, "invalid UTF-8"),
        E("{\"a\\u0000\":1}", 1, 2, "object keys must not contain \\u0000"),
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++)
        want_error(cases[k].text, cases[k].len, cases[k].line, cases[k].col, cases[k].needle);
}

/* An error already recorded is kept (the project's first-error rule), but
 * the status still says what went wrong this time. */
static void test_first_error_kept(void **state)
{
    (void)state;
    struct gp_error err = {0};
    gp_error_set(&err, GP_ERR_IO, "earlier");
    struct gp_json_doc doc;
    assert_int_equal(gp_json_parse("[", 1, &doc, &err), GP_ERR_PARSE);
    assert_string_equal(err.msg, "earlier");
    assert_int_equal(gp_json_parse("[]", 2, &doc, NULL), GP_OK); /* err may be NULL */
    gp_json_doc_free(&doc);
    assert_int_equal(gp_json_parse("[", 1, &doc, NULL), GP_ERR_PARSE);
    assert_int_equal(gp_json_parse(NULL, 0, &doc, NULL), GP_ERR_PARSE);
}

/* ---- nesting ---- */

static char *repeat(const char *open, const char *middle, const char *close, size_t times, size_t *len)
{
    size_t lo = strlen(open), lm = strlen(middle), lc = strlen(close);
    char *s = malloc(times * (lo + lc) + lm + 1);
    assert_non_null(s);
    size_t n = 0;
    for (size_t k = 0; k < times; k++, n += lo) memcpy(s + n, open, lo);
    memcpy(s + n, middle, lm);
    n += lm;
    for (size_t k = 0; k < times; k++, n += lc) memcpy(s + n, close, lc);
    s[n] = '\0';
    *len = n;
    return s;
}

static void test_depth_limit(void **state)
{
    (void)state;
    const size_t max = GP_JSON_PARSE_MAX_DEPTH;
    struct gp_json_doc doc;
    struct gp_error err = {0};
    size_t len;

    char *s = repeat("[", "1", "]", max, &len);
    assert_int_equal(gp_json_parse(s, len, &doc, &err), GP_OK);
    const struct gp_jvalue *v = doc.root;
    for (size_t k = 0; k < max; k++) {
        assert_int_equal(v->type, GP_JARRAY);
        v = gp_jarray_at(v, 0);
    }
    assert_int_equal(v->i, 1);
    gp_json_doc_free(&doc);
    free(s);

    s = repeat("[", "1", "]", max + 1, &len);
    want_error(s, len, 1, (int)max + 1, "nesting deeper than 256 levels");
    free(s);

    s = repeat("{\"a\":", "1", "}", max, &len);
    assert_int_equal(gp_json_parse(s, len, &doc, &err), GP_OK);
    gp_json_doc_free(&doc);
    free(s);

    s = repeat("{\"a\":", "1", "}", max + 1, &len);
    want_error(s, len, 1, 5 * (int)max + 1, "nesting deeper than 256 levels");
    free(s);

    s = repeat("[{\"a\":", "1", "}]", max / 2, &len);
    assert_int_equal(gp_json_parse(s, len, &doc, &err), GP_OK);
    gp_json_doc_free(&doc);
    free(s);

    /* A million open brackets: refused at the limit, not by the stack. */
    s = repeat("[", "", "", 1000000, &len);
    want_error(s, len, 1, (int)max + 1, "nesting deeper than 256 levels");
    free(s);
}

/* ---- hostile input ---- */

/* Every kind of value, escapes and multi-byte text; no trailing whitespace,
 * so that every proper prefix is invalid. */
static const char sample[] =
    "{\n"
    "  \"format\": 1,\n"
    "  \"name\": \"digits \\\"cnn\\\" \\u00e9\\ud83d\\ude00 \xe2\x82\xac\",\n"
    "  \"ok\": true, \"bad\": false, \"none\": null,\n"
    "  \"nums\": [0, -0, 12, -3.25e-2, 1E+3, 9223372036854775807, 18446744073709551616],\n"
    "  \"nested\": {\"a\": [[], {}, [{\"b\": [\"\\n\\t\\\\\\/\"]}]], \"\": \"\"}\n"
    "}";

static void test_sample_parses(void **state)
{
    (void)state;
    struct gp_json_doc doc;
    const struct gp_jvalue *v = parse_ok(&doc, sample);
    check_tree(v, 0);
    assert_int_equal(gp_jobject_get(v, "format")->i, 1);
    assert_string_equal(gp_jobject_get(v, "name")->str,
                        "digits \"cnn\" \xc3\xa9\xf0\x9f\x98\x80 \xe2\x82\xac");
    const struct gp_jvalue *nums = gp_jobject_get(v, "nums");
    assert_int_equal(nums->count, 7);
    assert_int_equal(gp_jarray_at(nums, 5)->i, INT64_MAX);
    assert_false(gp_jarray_at(nums, 6)->is_int);
    const struct gp_jvalue *b = gp_jobject_get(gp_jarray_at(gp_jarray_at(gp_jobject_get(gp_jobject_get(v, "nested"), "a"), 2), 0), "b");
    assert_string_equal(gp_jarray_at(b, 0)->str, "\n\t\\/");
    gp_json_doc_free(&doc);
}

static void test_every_truncation_fails(void **state)
{
    (void)state;
    size_t n = sizeof sample - 1;
    for (size_t k = 0; k < n; k++) {
        struct gp_json_doc doc;
        struct gp_error err = {0};
        gp_status st = parse_n(sample, k, &doc, &err);
        if (st != GP_ERR_PARSE) fail_msg("prefix of %zu bytes: status %d", k, st);
        if (strncmp(err.msg, "line ", 5) != 0) fail_msg("prefix of %zu bytes: \"%s\"", k, err.msg);
        assert_null(doc.root);
    }
}

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint64_t rng(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

/* Random corruption: each result is either a valid tree or a parse error. */
static void test_corruption(void **state)
{
    (void)state;
    static const char bytes[] = "{}[],:\"\\u0123456789-+.eE \n\xc3\xa9\xed\xf0\xff\x80\x01tfn";
    size_t n = sizeof sample - 1;
    char *buf = malloc(n);
    assert_non_null(buf);
    int ok = 0, bad = 0;
    for (int iter = 0; iter < 20000; iter++) {
        memcpy(buf, sample, n);
        int edits = 1 + (int)(rng() % 4);
        for (int e = 0; e < edits; e++) {
            size_t at = rng() % n;
            buf[at] = bytes[rng() % (sizeof bytes - 1)];
        }
        size_t len = rng() % 8 == 0 ? rng() % n : n; /* sometimes also cut short */
        struct gp_json_doc doc;
        struct gp_error err = {0};
        gp_status st = parse_n(buf, len, &doc, &err);
        if (st == GP_OK) {
            check_tree(doc.root, 0);
            ok++;
        } else {
            if (st != GP_ERR_PARSE) fail_msg("status %d: %s", st, err.msg);
            assert_null(doc.root);
            bad++;
        }
        gp_json_doc_free(&doc);
    }
    free(buf);
    /* Both outcomes must occur, or the corruption is not exercising anything. */
    assert_true(ok > 0);
    assert_true(bad > 0);
}

/* ---- files ---- */

static void test_parse_file(void **state)
{
    (void)state;
    struct gp_json_doc doc;
    struct gp_error err = {0};
    assert_int_equal(gp_json_parse_file("no-such-dir/missing.json", &doc, &err), GP_ERR_IO);
    assert_non_null(strstr(err.msg, "no-such-dir/missing.json"));
    assert_null(doc.root);

    char name[] = "test_json_parse_XXXXXX";
    int fd = mkstemp(name);
    assert_true(fd >= 0);
    static const char bad[] = "{\n  \"a\": 1,\n}";
    assert_int_equal(write(fd, bad, sizeof bad - 1), (ssize_t)(sizeof bad - 1));
    close(fd);
    gp_error_clear(&err);
    assert_int_equal(gp_json_parse_file(name, &doc, &err), GP_ERR_PARSE);
    char want[128];
    snprintf(want, sizeof want, "%s: line 2, column 9: trailing comma before '}'", name);
    assert_string_equal(err.msg, want);

    fd = open(name, O_WRONLY | O_TRUNC);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, sample, sizeof sample - 1), (ssize_t)(sizeof sample - 1));
    close(fd);
    gp_error_clear(&err);
    assert_int_equal(gp_json_parse_file(name, &doc, &err), GP_OK);
    assert_int_equal(gp_jobject_get(doc.root, "format")->i, 1);
    gp_json_doc_free(&doc);
    unlink(name);

    /* A folder opens but cannot be read. */
    gp_error_clear(&err);
    assert_int_equal(gp_json_parse_file(".", &doc, &err), GP_ERR_IO);
    assert_null(doc.root);
}

/* The fixture manifest: parses, holds what the loader tests rely on, and no
 * proper prefix of it parses. */
static void test_manifest(void **state)
{
    (void)state;
    const char *root = getenv("GP_SOURCE_ROOT");
    if (!root) skip(); /* run outside meson test */
    char path[4096];
    snprintf(path, sizeof path, "%s/models/manifest.json", root);

    struct gp_json_doc doc;
    struct gp_error err = {0};
    if (gp_json_parse_file(path, &doc, &err) != GP_OK) fail_msg("%s", err.msg);
    check_tree(doc.root, 0);
    assert_int_equal(doc.root->type, GP_JOBJECT);
    const struct gp_jvalue *format = gp_jobject_get(doc.root, "format");
    assert_non_null(format);
    assert_true(format->is_int);
    const struct gp_jvalue *fixtures = gp_jobject_get(doc.root, "fixtures");
    assert_non_null(fixtures);
    assert_int_equal(fixtures->type, GP_JOBJECT);
    assert_true(fixtures->count > 0);
    for (size_t k = 0; k < fixtures->count; k++) {
        const struct gp_jvalue *file = gp_jobject_get(&fixtures->items[k], "file");
        assert_non_null(file);
        assert_int_equal(file->type, GP_JSTRING);
    }
    gp_json_doc_free(&doc);

    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    assert_true(size > 0);
    rewind(f);
    char *text = malloc((size_t)size);
    assert_non_null(text);
    assert_int_equal(fread(text, 1, (size_t)size, f), (size_t)size);
    fclose(f);
    size_t end = (size_t)size;
    while (end > 0 && strchr(" \t\r\n", text[end - 1])) end--;
    for (size_t k = 0; k < end; k += 1 + k % 1499) {
        gp_error_clear(&err);
        if (gp_json_parse(text, k, &doc, &err) != GP_ERR_PARSE) fail_msg("manifest prefix of %zu bytes parsed", k);
    }
    free(text);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_literals),
        cmocka_unit_test(test_numbers),
        cmocka_unit_test(test_numbers_under_comma_locale),
        cmocka_unit_test(test_strings),
        cmocka_unit_test(test_containers),
        cmocka_unit_test(test_type_names),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_first_error_kept),
        cmocka_unit_test(test_depth_limit),
        cmocka_unit_test(test_sample_parses),
        cmocka_unit_test(test_every_truncation_fails),
        cmocka_unit_test(test_corruption),
        cmocka_unit_test(test_parse_file),
        cmocka_unit_test(test_manifest),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
