/* libFuzzer target for the .npy reader (the training data and labels users
 * hand us): any bytes end in an array or an error with a message, never a
 * crash, a hang or a sanitizer report; an array read converts to float32
 * and to int64 (labels) the same way, or says why not. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "data/npy.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct gp_npy a;
    struct gp_error err = {0};
    if (gp_npy_read_buffer(data, size, "fuzz.npy", &a, &err) != GP_OK) {
        if (err.msg[0] == '\0') __builtin_trap(); /* every failure must explain itself */
        return 0;
    }
    int64_t n = gp_npy_numel(&a);
    if (n >= 0 && n <= (1 << 20)) {
        float *f = malloc(sizeof(float) * (size_t)(n + 1));
        int64_t *i = malloc(sizeof(int64_t) * (size_t)(n + 1));
        if (f && gp_npy_to_f32(&a, f, &err) != GP_OK && err.msg[0] == '\0') __builtin_trap();
        err.msg[0] = '\0';
        if (i && gp_npy_to_i64(&a, i, &err) != GP_OK && err.msg[0] == '\0') __builtin_trap();
        free(f);
        free(i);
    }
    gp_npy_free(&a);
    return 0;
}
