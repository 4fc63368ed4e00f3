// Entry points of the sigmoid gate: argument checks, then the CPU reference or the CUDA kernel.
#include "ops/sigmoid_gate.h"

#include <string_view>

#include "ops/cpu/checks.h"
#include "ops/registry.h"

namespace mt::ops {

namespace {

// Rank, contiguity and shape on any device.
void check_shape_like(std::initializer_list<NamedArg> args, const Tensor& x, std::string_view op) {
    for (const NamedArg& a : args) {
        check_arg(a.tensor, op, a.name, x.ndim());
        check_shape(a.tensor, x.shape(), op, a.name);
    }
}

}  // namespace

void sigmoid_gate_fwd(const Tensor& x, const Tensor& z, const Tensor& out) {
    constexpr std::string_view op = "sigmoid_gate_fwd";
    const core::Device device = check_same_device(op, {{"x", x}, {"z", z}, {"out", out}});
    // Shapes on every device (the CPU kernel checks its dtypes).
    check_shape_like({{"x", x}, {"z", z}, {"out", out}}, x, op);
    if (device == core::Device::cuda) {
        return MT_CALL_KERNEL(sigmoid_gate_fwd, core::Device::cuda, x, z, out);
    }
    MT_CALL_KERNEL(sigmoid_gate_fwd, core::Device::cpu, x, z, out);
}

void sigmoid_gate_bwd(const Tensor& x, const Tensor& z, const Tensor& dout, const Tensor& dx, const Tensor& dz) {
    constexpr std::string_view op = "sigmoid_gate_bwd";
    const core::Device device = check_same_device(op, {{"x", x}, {"z", z}, {"dout", dout}, {"dx", dx}, {"dz", dz}});
    // Shapes on every device (the CPU kernel checks its dtypes).
    check_shape_like({{"x", x}, {"z", z}, {"dout", dout}, {"dx", dx}, {"dz", dz}}, x, op);
    if (device == core::Device::cuda) {
        return MT_CALL_KERNEL(sigmoid_gate_bwd, core::Device::cuda, x, z, dout, dx, dz);
    }
    MT_CALL_KERNEL(sigmoid_gate_bwd, core::Device::cpu, x, z, dout, dx, dz);
}

}  // namespace mt::ops
