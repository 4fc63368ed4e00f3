// Entry points of the residual add: argument checks and dispatch by device.
#include "ops/add.h"

#include "ops/cpu/checks.h"
#include "ops/cpu/kernels.h"
#include "ops/cuda/cuda_ops.h"

namespace mt::ops {

void add_fwd(const Tensor& a, const Tensor& b, const Tensor& out) {
    constexpr std::string_view op = "add_fwd";
    check_arg(a, op, "a", a.ndim());
    check_arg(b, op, "b", a.ndim());
    check_arg(out, op, "out", a.ndim());
    check_shape(b, a.shape(), op, "b");
    check_shape(out, a.shape(), op, "out");
    if (check_same_device(op, {{"a", a}, {"b", b}, {"out", out}}) == core::Device::cuda)
        return cuda::add_fwd(a, b, out);
    check_float_arg(a, op, "a", a.ndim());
    check_float_arg(b, op, "b", a.ndim());
    check_float_arg(out, op, "out", a.ndim());
    cpu::check_dtype_as(b, a, op, "b", "a");
    cpu::check_dtype_as(out, a, op, "out", "a");
    MT_DISPATCH_FLOAT(
        a.dtype(), op, cpu::add_fwd(a.data<scalar_t>(), b.data<scalar_t>(), out.data<scalar_t>(), a.numel()));
}

void add_bwd(const Tensor& dout, const Tensor& da, const Tensor& db) {
    constexpr std::string_view op = "add_bwd";
    check_arg(dout, op, "dout", dout.ndim());
    check_arg(da, op, "da", dout.ndim());
    check_arg(db, op, "db", dout.ndim());
    check_shape(da, dout.shape(), op, "da");
    check_shape(db, dout.shape(), op, "db");
    if (check_same_device(op, {{"dout", dout}, {"da", da}, {"db", db}}) == core::Device::cuda)
        return cuda::add_bwd(dout, da, db);
    check_float_arg(dout, op, "dout", dout.ndim());
    check_float_arg(da, op, "da", dout.ndim());
    check_float_arg(db, op, "db", dout.ndim());
    cpu::check_dtype_as(da, dout, op, "da", "dout");
    cpu::check_dtype_as(db, dout, op, "db", "dout");
    MT_DISPATCH_FLOAT(
        dout.dtype(), op, cpu::add_bwd(dout.data<scalar_t>(), da.data<scalar_t>(), db.data<scalar_t>(), dout.numel()));
}

}  // namespace mt::ops
