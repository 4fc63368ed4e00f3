// Entry points of the residual add: argument checks and dispatch by device.
#include "ops/add.h"

#include "ops/cpu/checks.h"
#include "ops/registry.h"

namespace mt::ops {

void add_fwd(const Tensor& a, const Tensor& b, const Tensor& out) {
    constexpr std::string_view op = "add_fwd";
    check_arg(a, op, "a", a.ndim());
    check_arg(b, op, "b", a.ndim());
    check_arg(out, op, "out", a.ndim());
    check_shape(b, a.shape(), op, "b");
    check_shape(out, a.shape(), op, "out");
    const core::Device device = check_same_device(op, {{"a", a}, {"b", b}, {"out", out}});
    MT_CALL_KERNEL(add_fwd, device, a, b, out);
}

void add_bwd(const Tensor& dout, const Tensor& da, const Tensor& db) {
    constexpr std::string_view op = "add_bwd";
    check_arg(dout, op, "dout", dout.ndim());
    check_arg(da, op, "da", dout.ndim());
    check_arg(db, op, "db", dout.ndim());
    check_shape(da, dout.shape(), op, "da");
    check_shape(db, dout.shape(), op, "db");
    const core::Device device = check_same_device(op, {{"dout", dout}, {"da", da}, {"db", db}});
    MT_CALL_KERNEL(add_bwd, device, dout, da, db);
}

}  // namespace mt::ops
