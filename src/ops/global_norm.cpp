// Entry points of the global L2 norm: argument checks and dispatch by device; tensors are summed in list order.
#include "ops/global_norm.h"

#include <cmath>

#include "ops/cpu/kernels.h"
#include "ops/cuda/cuda_ops.h"

namespace mt::ops {

namespace {

double sum_squares_checked(const Tensor& t, std::string_view op, std::string_view arg) {
    check_float_arg(t, op, arg, t.ndim());
    double result = 0.0;
    MT_DISPATCH_FLOAT(t.dtype(), op, result = cpu::sum_squares(t.data<scalar_t>(), t.numel()));
    return result;
}

// Checks every tensor (defined, contiguous) and that all are on one device, which it returns (cpu for none).
core::Device check_list(const std::vector<Tensor>& tensors, std::string_view op) {
    std::vector<std::string> names;
    for (size_t i = 0; i < tensors.size(); ++i) {
        names.push_back(tensors.size() == 1 && op == "global_norm_sq" ? "t" : fmt::format("tensors[{}]", i));
        check_arg(tensors[i], op, names[i], tensors[i].ndim());
    }
    for (size_t i = 1; i < tensors.size(); ++i) check_same_device(op, {{names[0], tensors[0]}, {names[i], tensors[i]}});
    return tensors.empty() ? core::Device::cpu : tensors[0].device();
}

}  // namespace

double global_norm_sq(const Tensor& t) {
    constexpr std::string_view op = "global_norm_sq";
    if (check_list({t}, op) == core::Device::cuda) {
        const double norm = cuda::global_norm({t});
        return norm * norm;  // the CUDA side returns the norm; squaring rounds once more (a relative 1e-16)
    }
    return sum_squares_checked(t, op, "t");
}

double global_norm(const std::vector<Tensor>& tensors) {
    constexpr std::string_view op = "global_norm";
    if (check_list(tensors, op) == core::Device::cuda) return cuda::global_norm(tensors);
    double total = 0.0;
    for (size_t i = 0; i < tensors.size(); ++i)
        total += sum_squares_checked(tensors[i], op, fmt::format("tensors[{}]", i));
    return std::sqrt(total);
}

}  // namespace mt::ops
