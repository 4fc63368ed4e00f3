// Entry points of the SwiGLU gate: argument checks and dispatch by device.
#include "ops/swiglu.h"

#include "ops/cpu/checks.h"
#include "ops/registry.h"

namespace mt::ops {

void swiglu_fwd(const Tensor& gate, const Tensor& up, const Tensor& out) {
    constexpr std::string_view op = "swiglu_fwd";
    check_arg(gate, op, "gate", 2);
    check_arg(up, op, "up", 2);
    check_arg(out, op, "out", 2);
    check_shape(up, gate.shape(), op, "up");
    check_shape(out, gate.shape(), op, "out");
    const core::Device device = check_same_device(op, {{"gate", gate}, {"up", up}, {"out", out}});
    MT_CALL_KERNEL(swiglu_fwd, device, gate, up, out);
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
    const core::Device device =
        check_same_device(op, {{"gate", gate}, {"up", up}, {"dout", dout}, {"dgate", dgate}, {"dup", dup}});
    MT_CALL_KERNEL(swiglu_bwd, device, gate, up, dout, dgate, dup);
}

}  // namespace mt::ops
