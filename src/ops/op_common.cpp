// Argument checks shared by every op's entry point. A failed check is a bug in the caller (exit 1); the message
// names the op and the argument, e.g. "linear_fwd: w has shape [3, 5], expected [3, 4]".
#include "ops/op_common.h"

namespace mt::ops {

void check_arg(const Tensor& t, std::string_view op, std::string_view arg, int ndim) {
    MT_CHECK(t.defined(), "{}: {} is undefined", op, arg);
    // Only CPU kernels exist so far; the CUDA backend replaces this check with a per-op device dispatch.
    MT_CHECK(t.device() == core::Device::cpu,
             "{}: {} is a {} tensor; {} is not implemented on cuda yet",
             op,
             arg,
             core::device_name(t.device()),
             op);
    MT_CHECK(t.ndim() == ndim,
             "{}: {} has shape {} (rank {}), expected rank {}",
             op,
             arg,
             core::shape_str(t.shape()),
             t.ndim(),
             ndim);
    MT_CHECK(t.is_contiguous(),
             "{}: {} must be contiguous (shape {}, strides {})",
             op,
             arg,
             core::shape_str(t.shape()),
             core::shape_str(t.strides()));
}

void check_float_arg(const Tensor& t, std::string_view op, std::string_view arg, int ndim) {
    check_arg(t, op, arg, ndim);
    MT_CHECK(t.dtype() == DType::f32 || t.dtype() == DType::f64,
             "{}: {} has dtype {}, expected f32 or f64",
             op,
             arg,
             core::dtype_name(t.dtype()));
}

void check_same_dtype(const Tensor& a, const Tensor& b, std::string_view op) {
    MT_CHECK(a.dtype() == b.dtype(),
             "{}: mismatched dtypes {} and {} (shapes {} and {})",
             op,
             core::dtype_name(a.dtype()),
             core::dtype_name(b.dtype()),
             core::shape_str(a.shape()),
             core::shape_str(b.shape()));
}

void check_shape(const Tensor& t, const Shape& shape, std::string_view op, std::string_view arg) {
    MT_CHECK(t.shape() == shape,
             "{}: {} has shape {}, expected {}",
             op,
             arg,
             core::shape_str(t.shape()),
             core::shape_str(shape));
}

}  // namespace mt::ops
