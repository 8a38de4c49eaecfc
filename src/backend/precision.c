/* Precision names (backend/compute.h). */
#include <string.h>

#include "backend/compute.h"

const char *gp_precision_name(enum gp_precision p)
{
    switch (p) {
    case GP_PRECISION_FP32: return "fp32";
    case GP_PRECISION_TF32: return "tf32";
    case GP_PRECISION_BF16: return "bf16";
    }
    return "?";
}

bool gp_precision_parse(const char *s, enum gp_precision *out)
{
    static const struct {
        const char *name;
        enum gp_precision p;
    } names[] = {{"fp32", GP_PRECISION_FP32}, {"float32", GP_PRECISION_FP32}, {"tf32", GP_PRECISION_TF32},
                 {"bf16", GP_PRECISION_BF16}, {"bfloat16", GP_PRECISION_BF16}};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++)
        if (strcmp(s, names[i].name) == 0) {
            *out = names[i].p;
            return true;
        }
    return false;
}
