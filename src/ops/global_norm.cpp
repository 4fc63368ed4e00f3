// Entry points of the global L2 norm: argument checks and dispatch by device; tensors are summed in list order.
#include "ops/global_norm.h"

#include "ops/registry.h"

namespace mt::ops {

namespace {

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
    return MT_CALL_KERNEL(global_norm_sq, check_list({t}, op), t);
}

double global_norm(const std::vector<Tensor>& tensors) {
    constexpr std::string_view op = "global_norm";
    return MT_CALL_KERNEL(global_norm, check_list(tensors, op), tensors);
}

std::vector<double> global_norms_sq(const std::vector<Tensor>& tensors, const std::vector<int>& group, int groups) {
    constexpr std::string_view op = "global_norms_sq";
    MT_CHECK(group.size() == tensors.size(), "{}: {} group ids for {} tensors", op, group.size(), tensors.size());
    MT_CHECK(groups >= 0, "{}: groups {} must be >= 0", op, groups);
    for (size_t i = 0; i < group.size(); ++i)
        MT_CHECK(group[i] >= 0 && group[i] < groups, "{}: group[{}] = {} is not in [0, {})", op, i, group[i], groups);
    return MT_CALL_KERNEL(global_norms_sq, check_list(tensors, op), tensors, group, groups);
}

}  // namespace mt::ops
