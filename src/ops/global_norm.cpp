// Entry points of the global L2 norm: argument checks and CPU dispatch; tensors are summed in list order.
#include "ops/global_norm.h"

#include <cmath>

#include "ops/cpu/kernels.h"

namespace mt::ops {

namespace {

double sum_squares_checked(const Tensor& t, std::string_view op, std::string_view arg) {
    check_float_arg(t, op, arg, t.ndim());
    double result = 0.0;
    MT_DISPATCH_FLOAT(t.dtype(), op, result = cpu::sum_squares(t.data<scalar_t>(), t.numel()));
    return result;
}

}  // namespace

double global_norm_sq(const Tensor& t) {
    return sum_squares_checked(t, "global_norm_sq", "t");
}

double global_norm(const std::vector<Tensor>& tensors) {
    double total = 0.0;
    for (size_t i = 0; i < tensors.size(); ++i)
        total += sum_squares_checked(tensors[i], "global_norm", fmt::format("tensors[{}]", i));
    return std::sqrt(total);
}

}  // namespace mt::ops
