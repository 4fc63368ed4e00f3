// Array exp and max for the softmax, sigmoid and cross-entropy loops (GCC does not vectorize std::exp or a float
// max reduction without -ffast-math, which moetrain does not use). libm's expf is a scalar call that dominated those
// loops; the f32 version here evaluates eight lanes at a time (a Cody-Waite range reduction and the degree-6 Cephes
// polynomial, relative error below 2 ulp) and is compiled for AVX2 and for baseline x86-64, picked at load time.
// Every element goes through the same lane arithmetic (the tail is padded), so results do not depend on where an
// element sits in the array, and they are the same on every machine (libm's expf differs between glibc versions).
// Inputs below -87.33 give 0 and inputs above 88.37 give exp(88.37). The f64 version, used by the gradient
// checks, calls std::exp.
#pragma once

#include <cstdint>

namespace mt::ops::cpu {

// y[i] = exp(a * x[i] + b) for i < n; y may alias x.
void exp_affine(const float* x, float* y, int64_t n, float a, float b);
void exp_affine(const double* x, double* y, int64_t n, double a, double b);

// max(x[0], ..., x[n-1]) for n >= 1 (NaNs are skipped; they reach the result through exp instead).
float max_value(const float* x, int64_t n);
double max_value(const double* x, int64_t n);

}  // namespace mt::ops::cpu
