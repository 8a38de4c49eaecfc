/* First writers on the CPU backend (first_writers.h), bit for bit: every
 * layer of every fixture model whose kernel writes a gradient whole gives
 * the bits of adding into zeros. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "first_writers.h"

static void test_fixtures(void **state)
{
    (void)state;
    static const struct {
        const char *name;
        int64_t batch;
    } list[] = {
        {"mlp_op17", 16}, {"digits_cnn_op17", 16}, {"resnet_op17", 8}, {"unet_op17", 4},
        {"gpt_op17", 8},  {"gpt_torch2_op17", 8},
    };
    int total = 0;
    for (size_t f = 0; f < sizeof list / sizeof *list; f++)
        total += first_writers_check(&gp_cpu_device_ops, list[f].name, list[f].batch, true);
    /* ReLU, BatchNorm, Add and GELU's Mul are all among them. */
    if (total < 20) fail_msg("only %d layer calls wrote a gradient whole", total);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_fixtures)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
