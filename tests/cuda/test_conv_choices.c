/* The convolution choices as text (cuda/conv_algos.cu: what a saved
 * training state keeps, so that a resumed run computes as the first): a
 * text read back is written out the same, lines of every form (channels-
 * last, one direction, results added on the legacy API or by the graph
 * API's engine (beta 1) in each direction, lines from before those
 * words); malformed lines are refused with a message, and choices
 * measured elsewhere are left out with a note. No GPU needed: nothing is
 * measured. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/device.h"

/* A problem's numbers: the key's 31 (cuda/conv_algos.cu, KEY_INTS), a
 * 3x3 convolution of batch b, then the three legacy algorithms, their
 * math types and workspaces. */
static void key_line(char *out, size_t size, const char *word, int b, const char *tail)
{
    snprintf(out, size,
             "%s 2 1 0 1 0 0 1 %d 64 56 56 0 %d 64 56 56 0 64 64 3 3 0 1 1 0 1 1 0 1 1 0 1 1 1024 6 0 0 1 1 4096%s",
             word, b, b, tail);
}

/* The identity line, then the given lines. */
static char *text_of(const char *const *lines, int n)
{
    size_t size = 512;
    for (int i = 0; i < n; i++) size += strlen(lines[i]) + 1;
    char *t = malloc(size);
    assert_non_null(t);
    gp_cuda_choices_identity(t, size);
    for (int i = 0; i < n; i++) {
        strcat(t, "\n");
        strcat(t, lines[i]);
    }
    strcat(t, "\n");
    return t;
}

static void test_round_trip(void **state)
{
    (void)state;
    char l[9][512];
    key_line(l[0], sizeof l[0], "conv", 8, " - - -");
    key_line(l[1], sizeof l[1], "conv-nhwc", 9, " eng0_k2=1 - eng7 data-acc-legacy 2048");
    key_line(l[2], sizeof l[2], "conv-nhwc", 10,
             " eng1 eng2 eng3 fwd-acc-legacy 0 data-acc-legacy 512 filter-acc-legacy 8192");
    key_line(l[3], sizeof l[3], "conv-nhwc-filter", 11, " - - eng4 filter-acc-legacy 64");
    key_line(l[4], sizeof l[4], "conv-data", 12, " - eng5 - data-acc-legacy 1");
    key_line(l[5], sizeof l[5], "conv-fwd", 13, " eng6 - - fwd-acc-legacy 16");
    key_line(l[6], sizeof l[6], "conv-nhwc", 14, " eng1 eng2 eng3 data-acc-graph eng62_k25=2 0");
    key_line(l[7], sizeof l[7], "conv-nhwc", 15,
             " eng1 eng2 eng3 fwd-acc-graph eng9 4 data-acc-legacy 512 filter-acc-graph eng10_k2=1_k3=0 8192");
    key_line(l[8], sizeof l[8], "conv-filter", 16, " - - eng4 filter-acc-graph eng11 64");
    const char *lines[9] = {l[0], l[1], l[2], l[3], l[4], l[5], l[6], l[7], l[8]};
    char *in = text_of(lines, 9);
    char note[512];
    struct gp_error err = {0};
    assert_int_equal(gp_cuda_choices_import(in, note, sizeof note, &err), GP_OK);
    assert_string_equal(note, "");
    char *out = gp_cuda_choices_export();
    assert_non_null(out);
    assert_string_equal(out, in);
    /* Read again: the same problems replaced, not added. */
    assert_int_equal(gp_cuda_choices_import(in, note, sizeof note, &err), GP_OK);
    char *again = gp_cuda_choices_export();
    assert_string_equal(again, in);
    free(again);
    free(out);
    free(in);
}

static void test_malformed(void **state)
{
    (void)state;
    static const char *const tails[] = {
        " - eng5 - data-acc-legacy",                          /* a word without its workspace */
        " - eng5 - data-acc-legacy x",                        /* not a number */
        " - eng5 - data-acc-legacy -3",                       /* negative */
        " - eng5 - data-acc-legacy 1 fwd-acc-legacy 2",       /* out of order */
        " - eng5 - data-acc-legacy 1 data-acc-legacy 2",      /* twice */
        " - eng5 - bwd-acc-legacy 1",                         /* a word this reader does not know */
        " - eng5",                                            /* a name missing */
        " - eng5 - data-acc-graph 1",                         /* the graph word without its name */
        " - eng5 - data-acc-graph eng3",                      /* ... or without its workspace */
        " - eng5 - data-acc-graph eng3 x",                    /* not a number */
        " - eng5 - data-acc-legacy 1 data-acc-graph eng3 2",  /* both ways for one direction */
        " - eng5 - filter-acc-graph eng3 2 data-acc-legacy 1", /* out of order */
    };
    for (size_t i = 0; i < sizeof tails / sizeof tails[0]; i++) {
        char line[512];
        key_line(line, sizeof line, "conv", 20 + (int)i, tails[i]);
        const char *lines[1] = {line};
        char *in = text_of(lines, 1);
        char note[512];
        struct gp_error err = {0};
        if (gp_cuda_choices_import(in, note, sizeof note, &err) != GP_ERR_PARSE)
            fail_msg("accepted: %s", line);
        assert_non_null(strstr(err.msg, "malformed"));
        free(in);
    }
}

/* Measured with another cuDNN or GPU: left out, with a note that says so. */
static void test_elsewhere(void **state)
{
    (void)state;
    char line[512];
    key_line(line, sizeof line, "conv", 40, " - eng5 - data-acc-legacy 1");
    char in[1024];
    snprintf(in, sizeof in, "cuda cudnn 1 device another GPU\n%s\n", line);
    char note[512];
    struct gp_error err = {0};
    assert_int_equal(gp_cuda_choices_import(in, note, sizeof note, &err), GP_OK);
    assert_non_null(strstr(note, "chosen again"));
    char *out = gp_cuda_choices_export();
    assert_true(out == NULL || strstr(out, " 40 ") == NULL);
    free(out);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_malformed),
        cmocka_unit_test(test_elsewhere),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
