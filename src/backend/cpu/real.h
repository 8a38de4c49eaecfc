/* The CPU backend's element type for floating-point tensors.
 *
 * Every CPU kernel is written once in terms of `real` and compiled twice:
 * as float (the product) and, for the tests' finite-difference gradient
 * checks, as double (-DGP_CPU_DOUBLE). GP_CPU(name) gives each build's
 * symbols their own suffix so both can link into one test program. */
#ifndef GP_BACKEND_CPU_REAL_H
#define GP_BACKEND_CPU_REAL_H

#include <cblas.h>

#ifdef GP_CPU_DOUBLE
typedef double real;
#define GP_CPU(name) name##_f64
#define gp_cblas_gemm cblas_dgemm
#define gp_cblas_axpy cblas_daxpy
#define GP_REAL_EPS 2.220446049250313e-16
#else
typedef float real;
#define GP_CPU(name) name##_f32
#define gp_cblas_gemm cblas_sgemm
#define gp_cblas_axpy cblas_saxpy
#define GP_REAL_EPS 1.1920929e-07f
#endif

#endif
