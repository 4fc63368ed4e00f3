// Entry points of the per-layer statistics: argument checks and dispatch by device.
#include "ops/layer_stats.h"

#include "ops/registry.h"

namespace mt::ops {

namespace {

void check_out(const Tensor& out, int64_t slots, std::string_view op) {
    check_arg(out, op, "out", 1);
    check_shape(out, {slots}, op, "out");
    check_dtype_in(out, {DType::f64}, op, "out");
}

}  // namespace

void layer_stats_moments(const Tensor& x, double low, const Tensor& out) {
    constexpr std::string_view op = "layer_stats_moments";
    check_arg(x, op, "x", x.ndim());
    check_out(out, kLayerStatsMoments, op);
    const core::Device device = check_same_device(op, {{"x", x}, {"out", out}});
    MT_CALL_KERNEL(layer_stats_moments, device, x, low, out);
}

void layer_stats_mix(const Tensor& alpha, const Tensor& out) {
    constexpr std::string_view op = "layer_stats_mix";
    check_arg(alpha, op, "alpha", 2);
    MT_CHECK(alpha.size(1) >= 1 && alpha.size(1) <= kLayerStatsMaxSources,
             "{}: alpha has {} sources, expected 1 to {}",
             op,
             alpha.size(1),
             kLayerStatsMaxSources);
    check_out(out, alpha.size(1) + 2, op);
    const core::Device device = check_same_device(op, {{"alpha", alpha}, {"out", out}});
    MT_CALL_KERNEL(layer_stats_mix, device, alpha, out);
}

}  // namespace mt::ops
