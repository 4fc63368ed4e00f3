// CPU reference of the row-wise argmax (ops/argmax.h): one pass per row, rows split over the OpenMP team.
#include "ops/argmax.h"

#include <limits>

#include "ops/cpu/threading.h"
#include "ops/registry.h"

namespace mt::ops::cpu {

namespace {

// A strict > from -inf keeps the first maximum and never takes a NaN; -1 (nothing taken: every element NaN or -inf)
// becomes 0, the first of the equal -inf maxima, or the documented answer for NaNs.
template <typename T>
void first_max_per_row(const T* x, int32_t* out, int64_t n, int64_t v) {
#pragma omp parallel for schedule(static) if (n * v >= kParallelMinWork)
    for (int64_t row = 0; row < n; ++row) {
        const T* r = x + row * v;
        T best = -std::numeric_limits<T>::infinity();
        int64_t at = -1;
        for (int64_t j = 0; j < v; ++j)
            if (r[j] > best) {
                best = r[j];
                at = j;
            }
        out[row] = static_cast<int32_t>(at < 0 ? 0 : at);
    }
}

}  // namespace

// The CPU kernel of ops::argmax_rows (registered in the op registry): f32 or f64 x.
void argmax_rows(const Tensor& x, const Tensor& out) {
    constexpr std::string_view op = "argmax_rows";
    check_float_arg(x, op, "x", 2);
    MT_DISPATCH_FLOAT(x.dtype(), op, first_max_per_row(x.data<scalar_t>(), out.data<int32_t>(), x.size(0), x.size(1)));
}
MT_REGISTER_KERNEL(argmax_rows, cpu, argmax_rows, ::mt::ops::float_dtypes);

}  // namespace mt::ops::cpu
