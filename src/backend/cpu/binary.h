/* The broadcasting part of the elementwise family (binary.c): binary and
 * variadic ops, Where and Expand. elementwise.c lists them in the family's
 * kernel table. */
#ifndef GP_BACKEND_CPU_BINARY_H
#define GP_BACKEND_CPU_BINARY_H

#include "backend/cpu/kernel.h"

/* Add, Sub, Mul, Div, Pow, Mod, comparisons and And/Or/Xor. */
gp_status GP_CPU(gp_cpu_binary_forward)(struct gp_cpu_ctx *c, struct gp_error *err);
/* Add, Sub, Mul, Div, Pow (base and exponent). */
gp_status GP_CPU(gp_cpu_binary_backward)(struct gp_cpu_ctx *c, struct gp_error *err);

/* Max, Min, Sum, Mean over any number of inputs. */
size_t GP_CPU(gp_cpu_variadic_scratch)(const struct gp_graph *g, const struct gp_node *node);
gp_status GP_CPU(gp_cpu_variadic_forward)(struct gp_cpu_ctx *c, struct gp_error *err);
gp_status GP_CPU(gp_cpu_variadic_backward)(struct gp_cpu_ctx *c, struct gp_error *err);

gp_status GP_CPU(gp_cpu_where_forward)(struct gp_cpu_ctx *c, struct gp_error *err);
gp_status GP_CPU(gp_cpu_where_backward)(struct gp_cpu_ctx *c, struct gp_error *err);

gp_status GP_CPU(gp_cpu_expand_forward)(struct gp_cpu_ctx *c, struct gp_error *err);
gp_status GP_CPU(gp_cpu_expand_backward)(struct gp_cpu_ctx *c, struct gp_error *err);

#endif
