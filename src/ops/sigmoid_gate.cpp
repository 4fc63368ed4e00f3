// Entry points of the sigmoid gate: argument checks, then the CPU reference or the CUDA kernel.
#include "ops/sigmoid_gate.h"

#include <string_view>

#include "ops/cpu/checks.h"
#include "ops/cpu/kda_kernels.h"
#include "ops/cuda/cuda_ops.h"

namespace mt::ops {

namespace {

void check_like(const Tensor& t, const Tensor& x, std::string_view op, const char* name) {
    check_float_arg(t, op, name, x.ndim());
    check_shape(t, x.shape(), op, name);
    cpu::check_dtype_as(t, x, op, name, "x");
}

// Rank, contiguity and shape on any device (the CUDA path).
void check_shape_like(std::initializer_list<NamedArg> args, const Tensor& x, std::string_view op) {
    for (const NamedArg& a : args) {
        check_arg(a.tensor, op, a.name, x.ndim());
        check_shape(a.tensor, x.shape(), op, a.name);
    }
}

}  // namespace

void sigmoid_gate_fwd(const Tensor& x, const Tensor& z, const Tensor& out) {
    constexpr std::string_view op = "sigmoid_gate_fwd";
    if (check_same_device(op, {{"x", x}, {"z", z}, {"out", out}}) == core::Device::cuda) {
        check_shape_like({{"x", x}, {"z", z}, {"out", out}}, x, op);
        return cuda::sigmoid_gate_fwd(x, z, out);
    }
    check_float_arg(x, op, "x", x.ndim());
    check_like(z, x, op, "z");
    check_like(out, x, op, "out");
    MT_DISPATCH_FLOAT(
        x.dtype(), op, cpu::sigmoid_gate_fwd(x.data<scalar_t>(), z.data<scalar_t>(), out.data<scalar_t>(), x.numel()));
}

void sigmoid_gate_bwd(const Tensor& x, const Tensor& z, const Tensor& dout, const Tensor& dx, const Tensor& dz) {
    constexpr std::string_view op = "sigmoid_gate_bwd";
    if (check_same_device(op, {{"x", x}, {"z", z}, {"dout", dout}, {"dx", dx}, {"dz", dz}}) == core::Device::cuda) {
        check_shape_like({{"x", x}, {"z", z}, {"dout", dout}, {"dx", dx}, {"dz", dz}}, x, op);
        return cuda::sigmoid_gate_bwd(x, z, dout, dx, dz);
    }
    check_float_arg(x, op, "x", x.ndim());
    check_like(z, x, op, "z");
    check_like(dout, x, op, "dout");
    check_like(dx, x, op, "dx");
    check_like(dz, x, op, "dz");
    MT_DISPATCH_FLOAT(x.dtype(),
                      op,
                      cpu::sigmoid_gate_bwd(x.data<scalar_t>(),
                                            z.data<scalar_t>(),
                                            dout.data<scalar_t>(),
                                            dx.data<scalar_t>(),
                                            dz.data<scalar_t>(),
                                            x.numel()));
}

}  // namespace mt::ops
