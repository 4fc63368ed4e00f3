// CPU reference of the sum of squares behind the global gradient norm, deterministic for any thread count.
#include "ops/global_norm.h"

#include <cstddef>
#include <vector>

#include "ops/cpu/checks.h"
#include "ops/cpu/threading.h"
#include "ops/registry.h"

namespace mt::ops::cpu {

// sum(x^2) over x [n] in f64: fixed blocks of kNormBlock elements, each summed in order, then the block sums in
// block order, so the result does not depend on the thread count.
constexpr int64_t kNormBlock = 4096;

// Block sums in parallel (each block of kNormBlock elements summed in order, in f64), then the block sums in
// block order.
template <typename T>
double sum_squares(const T* x, int64_t n) {
    const int64_t blocks = (n + kNormBlock - 1) / kNormBlock;
    std::vector<double> partial(static_cast<size_t>(blocks), 0.0);
#pragma omp parallel for schedule(static) if (n >= kParallelMinWork)
    for (int64_t blk = 0; blk < blocks; ++blk) {
        const int64_t end = blk * kNormBlock + kNormBlock < n ? blk * kNormBlock + kNormBlock : n;
        double sum = 0.0;
        for (int64_t i = blk * kNormBlock; i < end; ++i) sum += static_cast<double>(x[i]) * static_cast<double>(x[i]);
        partial[static_cast<size_t>(blk)] = sum;
    }
    double total = 0.0;
    for (double p : partial) total += p;
    return total;
}

template double sum_squares<float>(const float*, int64_t);
template double sum_squares<double>(const double*, int64_t);

namespace {

double sum_squares_checked(const Tensor& t, std::string_view op, std::string_view arg) {
    check_float_arg(t, op, arg, t.ndim());
    double result = 0.0;
    MT_DISPATCH_FLOAT(t.dtype(), op, result = sum_squares(t.data<scalar_t>(), t.numel()));
    return result;
}

// Each tensor's sum of squares added to its group's, in list order.
std::vector<double> group_sums(const std::vector<Tensor>& tensors,
                               const std::vector<int>& group,
                               int groups,
                               std::string_view op) {
    std::vector<double> out(static_cast<size_t>(groups), 0.0);
    for (size_t i = 0; i < tensors.size(); ++i)
        out[static_cast<size_t>(group[i])] += sum_squares_checked(tensors[i], op, fmt::format("tensors[{}]", i));
    return out;
}

}  // namespace

// The CPU kernel of ops::global_norm_sq (registered in the op registry).
double global_norm_sq(const Tensor& t) {
    return sum_squares_checked(t, "global_norm_sq", "t");
}
MT_REGISTER_KERNEL(global_norm_sq, cpu, global_norm_sq, ::mt::ops::float_dtypes);

// The CPU kernel of ops::global_norm (registered in the op registry): the CPU dtypes, then the float dispatch.
double global_norm(const std::vector<Tensor>& tensors) {
    return std::sqrt(group_sums(tensors, std::vector<int>(tensors.size(), 0), 1, "global_norm")[0]);
}
MT_REGISTER_KERNEL(global_norm, cpu, global_norm, ::mt::ops::float_dtypes);

// The CPU kernel of ops::global_norms_sq.
std::vector<double> global_norms_sq(const std::vector<Tensor>& tensors, const std::vector<int>& group, int groups) {
    return group_sums(tensors, group, groups, "global_norms_sq");
}
MT_REGISTER_KERNEL(global_norms_sq, cpu, global_norms_sq, ::mt::ops::float_dtypes);

}  // namespace mt::ops::cpu
