/* Resize and Upsample (resize.c); misc.c lists them in the family's kernel
 * table. */
#ifndef GP_BACKEND_CPU_RESIZE_H
#define GP_BACKEND_CPU_RESIZE_H

#include "backend/cpu/kernel.h"

size_t GP_CPU(gp_cpu_resize_scratch)(const struct gp_graph *g, const struct gp_node *node);
gp_status GP_CPU(gp_cpu_resize_forward)(struct gp_cpu_ctx *c, struct gp_error *err);
gp_status GP_CPU(gp_cpu_resize_backward)(struct gp_cpu_ctx *c, struct gp_error *err);

#endif
