// The CPU linear reference on raw pointers (cpu/linear.cpp), which the grouped linear reference calls per expert.
#pragma once

#include <cstdint>

namespace mt::ops::cpu {

// x [n, k], w [m, k], bias [m] or null, y [n, m]; dx [n, k] or null (= or += with accumulate_dx), dw [m, k] or null
// (+=, or = without accumulate_dw), dbias [m] or null (+=).
template <typename T>
void linear_fwd(const T* x, const T* w, const T* bias, T* y, int64_t n, int64_t k, int64_t m);
template <typename T>
void linear_bwd(const T* x,
                const T* w,
                const T* dy,
                T* dx,
                T* dw,
                T* dbias,
                int64_t n,
                int64_t k,
                int64_t m,
                bool accumulate_dx,
                bool accumulate_dw = true);

}  // namespace mt::ops::cpu
