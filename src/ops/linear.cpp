// Entry points of the linear op: argument checks, then dispatch by device: CUDA tensors go to ops/cuda (bf16 or f32,
// dw and dbias f32 or the dtype of x), CPU tensors to the f32/f64 reference.
#include "ops/linear.h"

#include <initializer_list>

#include "core/backend.h"
#include "ops/cpu/checks.h"
#include "ops/registry.h"

namespace mt::ops {

namespace {

using core::Device;

void require_cuda(std::string_view op) {
    if (!core::backend_available(Device::cuda))
        core::fail(core::ExitCode::device, "{}: got cuda tensors, but no CUDA device is available", op);
}

}  // namespace

void linear_fwd(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& y) {
    constexpr std::string_view op = "linear_fwd";
    const core::Device device = check_same_device(op, {{"x", x}, {"w", w}, {"bias", bias}, {"y", y}});
    // Shapes on every device (the CPU kernel checks its dtypes).
    check_arg(x, op, "x", 2);
    check_arg(w, op, "w", 2);
    check_arg(y, op, "y", 2);
    const int64_t n = x.size(0), k = x.size(1), m = w.size(0);
    check_shape(w, {m, k}, op, "w");
    check_shape(y, {n, m}, op, "y");
    if (bias.defined()) {
        check_arg(bias, op, "bias", 1);
        check_shape(bias, {m}, op, "bias");
    }
    if (device == core::Device::cuda) {
        require_cuda(op);
        return MT_CALL_KERNEL(linear_fwd, core::Device::cuda, x, w, bias, y);
    }
    MT_CALL_KERNEL(linear_fwd, core::Device::cpu, x, w, bias, y);
}

void linear_bwd(const Tensor& x,
                const Tensor& w,
                const Tensor& dy,
                const Tensor& dx,
                const Tensor& dw,
                const Tensor& dbias,
                bool accumulate_dx,
                bool accumulate_dw) {
    constexpr std::string_view op = "linear_bwd";
    const core::Device device =
        check_same_device(op, {{"x", x}, {"w", w}, {"dy", dy}, {"dx", dx}, {"dw", dw}, {"dbias", dbias}});
    // Shapes on every device (the CPU kernel checks its dtypes).
    check_arg(x, op, "x", 2);
    check_arg(w, op, "w", 2);
    check_arg(dy, op, "dy", 2);
    check_arg(dw, op, "dw", 2);
    const int64_t n = x.size(0), k = x.size(1), m = w.size(0);
    check_shape(w, {m, k}, op, "w");
    check_shape(dy, {n, m}, op, "dy");
    check_shape(dw, {m, k}, op, "dw");
    if (dx.defined()) {
        check_arg(dx, op, "dx", 2);
        check_shape(dx, {n, k}, op, "dx");
    }
    if (dbias.defined()) {
        check_arg(dbias, op, "dbias", 1);
        check_shape(dbias, {m}, op, "dbias");
    }
    if (device == core::Device::cuda) {
        require_cuda(op);
        return MT_CALL_KERNEL(linear_bwd, core::Device::cuda, x, w, dy, dx, dw, dbias, accumulate_dx, accumulate_dw);
    }
    MT_CALL_KERNEL(linear_bwd, core::Device::cpu, x, w, dy, dx, dw, dbias, accumulate_dx, accumulate_dw);
}

}  // namespace mt::ops
