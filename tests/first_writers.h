/* First writers (gp_layer_call.din_overwrite): a kernel that says it can
 * write an input's gradient whole (gp_compute_ops.overwrites) must give,
 * with NaN in that gradient beforehand, what the ordinary call gives, which
 * adds into zeros: 0 + x is what it writes. A kernel that leaves an
 * element unwritten leaves its NaN; one that adds to what is there turns
 * every element to NaN. */
#ifndef GP_TESTS_FIRST_WRITERS_H
#define GP_TESTS_FIRST_WRITERS_H

#include <stdbool.h>
#include <stdint.h>

#include "backend/device.h"

/* Every layer of fixture `name` at `batch` whose kernel on `ops` can write
 * a gradient whole, each such input alone and all at once, in fp32 and
 * bf16: the input gradients equal the ordinary call's, bit for bit when
 * `exact`, else as values (-0 and +0 alike). Fails the test otherwise;
 * returns the number of calls checked. */
int first_writers_check(const struct gp_device_ops *ops, const char *name, int64_t batch, bool exact);

#endif
