/* Developer settings from the environment (util/env.h): each form read as
 * documented, unset and empty as the default, and every value a setting
 * does not take reported on stderr once, naming the variable, the value
 * and what it takes, and then the default used. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "util/env.h"

/* stderr goes to a temporary file between capture_start and capture_end,
 * which returns what was written (static; valid until the next call). */
static int saved_fd = -1;
static FILE *capture_file;

static void capture_start(void)
{
    fflush(stderr);
    capture_file = tmpfile();
    assert_non_null(capture_file);
    saved_fd = dup(fileno(stderr));
    assert_true(saved_fd >= 0);
    assert_true(dup2(fileno(capture_file), fileno(stderr)) >= 0);
}

static const char *capture_end(void)
{
    static char text[4096];
    fflush(stderr);
    assert_true(dup2(saved_fd, fileno(stderr)) >= 0);
    close(saved_fd);
    saved_fd = -1;
    rewind(capture_file);
    size_t n = fread(text, 1, sizeof text - 1, capture_file);
    text[n] = '\0';
    fclose(capture_file);
    return text;
}

/* While stderr is captured a failed assertion's message would be lost:
 * expect() records mismatches, capture_checked() fails on them after. */
static char mismatches[2048];

static void expect(long got, long want, const char *name)
{
    if (got == want) return;
    const char *v = getenv(name);
    size_t n = strlen(mismatches);
    snprintf(mismatches + n, sizeof mismatches - n, "%s=%s: %ld, want %ld\n", name, v ? v : "(unset)", got, want);
}

/* Ends the capture, fails on any mismatch recorded, returns what stderr
 * got. */
static const char *capture_checked(void)
{
    const char *text = capture_end();
    if (mismatches[0]) fail_msg("%s", mismatches);
    return text;
}

static int count_lines(const char *text)
{
    int n = 0;
    for (; *text; text++) n += *text == '\n';
    return n;
}

static void test_choice(void **state)
{
    (void)state;
    static const char *const ways[] = {"fastest", "graph", "legacy", NULL};
    unsetenv("GP_TEST_ENV_CHOICE");
    capture_start();
    expect(gp_env_choice("GP_TEST_ENV_CHOICE", ways, 0), 0, "GP_TEST_ENV_CHOICE");
    setenv("GP_TEST_ENV_CHOICE", "", 1);
    expect(gp_env_choice("GP_TEST_ENV_CHOICE", ways, 2), 2, "GP_TEST_ENV_CHOICE");
    for (int i = 0; ways[i]; i++) {
        setenv("GP_TEST_ENV_CHOICE", ways[i], 1);
        expect(gp_env_choice("GP_TEST_ENV_CHOICE", ways, 0), i, "GP_TEST_ENV_CHOICE");
    }
    assert_string_equal(capture_checked(), ""); /* nothing to report */

    /* A misspelling (and a value of another case): the default, reported
     * once per value. */
    capture_start();
    setenv("GP_TEST_ENV_CHOICE", "grpah", 1);
    expect(gp_env_choice("GP_TEST_ENV_CHOICE", ways, 0), 0, "GP_TEST_ENV_CHOICE");
    expect(gp_env_choice("GP_TEST_ENV_CHOICE", ways, 1), 1, "GP_TEST_ENV_CHOICE");
    setenv("GP_TEST_ENV_CHOICE", "Legacy", 1);
    expect(gp_env_choice("GP_TEST_ENV_CHOICE", ways, 0), 0, "GP_TEST_ENV_CHOICE");
    const char *text = capture_checked();
    assert_int_equal(count_lines(text), 2);
    assert_non_null(strstr(text, "GP_TEST_ENV_CHOICE=grpah is not one of fastest, graph, legacy: the default, fastest, is used"));
    assert_non_null(strstr(text, "GP_TEST_ENV_CHOICE=Legacy is not one of fastest, graph, legacy"));
    unsetenv("GP_TEST_ENV_CHOICE");
}

static void test_flag(void **state)
{
    (void)state;
    static const char *const on[] = {"1", "on", "yes", "true"}, *const off[] = {"0", "off", "no", "false"};
    capture_start();
    unsetenv("GP_TEST_ENV_FLAG");
    expect(gp_env_flag("GP_TEST_ENV_FLAG", true), 1, "GP_TEST_ENV_FLAG");
    expect(gp_env_flag("GP_TEST_ENV_FLAG", false), 0, "GP_TEST_ENV_FLAG");
    for (int i = 0; i < 4; i++) {
        setenv("GP_TEST_ENV_FLAG", on[i], 1);
        expect(gp_env_flag("GP_TEST_ENV_FLAG", false), 1, "GP_TEST_ENV_FLAG");
        setenv("GP_TEST_ENV_FLAG", off[i], 1);
        expect(gp_env_flag("GP_TEST_ENV_FLAG", true), 0, "GP_TEST_ENV_FLAG");
    }
    assert_string_equal(capture_checked(), "");

    capture_start();
    setenv("GP_TEST_ENV_FLAG", "2", 1); /* not a level: on or off */
    expect(gp_env_flag("GP_TEST_ENV_FLAG", true), 1, "GP_TEST_ENV_FLAG");
    expect(gp_env_flag("GP_TEST_ENV_FLAG", false), 0, "GP_TEST_ENV_FLAG");
    const char *text = capture_checked();
    assert_int_equal(count_lines(text), 1);
    assert_non_null(strstr(text, "GP_TEST_ENV_FLAG=2 is not 1 or 0"));
    unsetenv("GP_TEST_ENV_FLAG");
}

static void test_positive(void **state)
{
    (void)state;
    capture_start();
    unsetenv("GP_TEST_ENV_NUMBER");
    expect(gp_env_positive("GP_TEST_ENV_NUMBER", 64, 8), 8, "GP_TEST_ENV_NUMBER");
    setenv("GP_TEST_ENV_NUMBER", "12", 1);
    expect(gp_env_positive("GP_TEST_ENV_NUMBER", 64, 8), 12, "GP_TEST_ENV_NUMBER");
    setenv("GP_TEST_ENV_NUMBER", "64", 1);
    expect(gp_env_positive("GP_TEST_ENV_NUMBER", 64, 8), 64, "GP_TEST_ENV_NUMBER");
    setenv("GP_TEST_ENV_NUMBER", "9223372036854775807", 1);
    expect(gp_env_positive("GP_TEST_ENV_NUMBER", LONG_MAX, 0), LONG_MAX, "GP_TEST_ENV_NUMBER");
    assert_string_equal(capture_checked(), "");

    static const char *const bad[] = {"0", "-3", "65", "1x", " 5", "99999999999999999999999"};
    capture_start();
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        setenv("GP_TEST_ENV_NUMBER", bad[i], 1);
        expect(gp_env_positive("GP_TEST_ENV_NUMBER", 64, 8), 8, "GP_TEST_ENV_NUMBER");
    }
    setenv("GP_TEST_ENV_NUMBER", "lots", 1);
    expect(gp_env_positive("GP_TEST_ENV_NUMBER", 64, 0), 0, "GP_TEST_ENV_NUMBER");
    const char *text = capture_checked();
    assert_int_equal(count_lines(text), 7);
    assert_non_null(strstr(text, "GP_TEST_ENV_NUMBER=65 is not a whole number from 1 to 64: the default, 8, is used"));
    assert_non_null(strstr(text, "GP_TEST_ENV_NUMBER=lots is not a whole number from 1 to 64: it is ignored"));
    unsetenv("GP_TEST_ENV_NUMBER");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_choice),
        cmocka_unit_test(test_flag),
        cmocka_unit_test(test_positive),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
