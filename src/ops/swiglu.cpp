// Entry points of the SwiGLU gate: argument checks and dispatch by device.
#include "ops/swiglu.h"

#include "ops/cpu/checks.h"
#include "ops/cpu/kernels.h"
#include "ops/cuda/cuda_ops.h"

namespace mt::ops {

void swiglu_fwd(const Tensor& gate, const Tensor& up, const Tensor& out) {
    constexpr std::string_view op = "swiglu_fwd";
    check_arg(gate, op, "gate", 2);
    check_arg(up, op, "up", 2);
    check_arg(out, op, "out", 2);
    check_shape(up, gate.shape(), op, "up");
    check_shape(out, gate.shape(), op, "out");
    if (check_same_device(op, {{"gate", gate}, {"up", up}, {"out", out}}) == core::Device::cuda)
        return cuda::swiglu_fwd(gate, up, out);
    check_float_arg(gate, op, "gate", 2);
    check_float_arg(up, op, "up", 2);
    check_float_arg(out, op, "out", 2);
    cpu::check_dtype_as(up, gate, op, "up", "gate");
    cpu::check_dtype_as(out, gate, op, "out", "gate");
    MT_DISPATCH_FLOAT(gate.dtype(),
                      op,
                      cpu::swiglu_fwd(gate.data<scalar_t>(), up.data<scalar_t>(), out.data<scalar_t>(), gate.numel()));
}

void swiglu_bwd(const Tensor& gate, const Tensor& up, const Tensor& dout, const Tensor& dgate, const Tensor& dup) {
    constexpr std::string_view op = "swiglu_bwd";
    check_arg(gate, op, "gate", 2);
    check_arg(up, op, "up", 2);
    check_arg(dout, op, "dout", 2);
    check_arg(dgate, op, "dgate", 2);
    check_arg(dup, op, "dup", 2);
    check_shape(up, gate.shape(), op, "up");
    check_shape(dout, gate.shape(), op, "dout");
    check_shape(dgate, gate.shape(), op, "dgate");
    check_shape(dup, gate.shape(), op, "dup");
    if (check_same_device(op, {{"gate", gate}, {"up", up}, {"dout", dout}, {"dgate", dgate}, {"dup", dup}}) ==
        core::Device::cuda)
        return cuda::swiglu_bwd(gate, up, dout, dgate, dup);
    check_float_arg(gate, op, "gate", 2);
    check_float_arg(up, op, "up", 2);
    check_float_arg(dout, op, "dout", 2);
    check_float_arg(dgate, op, "dgate", 2);
    check_float_arg(dup, op, "dup", 2);
    cpu::check_dtype_as(up, gate, op, "up", "gate");
    cpu::check_dtype_as(dout, gate, op, "dout", "gate");
    cpu::check_dtype_as(dgate, gate, op, "dgate", "gate");
    cpu::check_dtype_as(dup, gate, op, "dup", "gate");
    MT_DISPATCH_FLOAT(gate.dtype(),
                      op,
                      cpu::swiglu_bwd(gate.data<scalar_t>(),
                                      up.data<scalar_t>(),
                                      dout.data<scalar_t>(),
                                      dgate.data<scalar_t>(),
                                      dup.data<scalar_t>(),
                                      gate.numel()));
}

}  // namespace mt::ops
