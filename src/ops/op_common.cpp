// Argument checks shared by every op's entry point. A failed check is a bug in the caller (exit 1); the message
// names the op and the argument, e.g. "linear_fwd: w has shape [3, 5], expected [3, 4]".
#include "ops/op_common.h"

#include <string>

namespace mt::ops {

void check_arg(const Tensor& t, std::string_view op, std::string_view arg, int ndim) {
    MT_CHECK(t.defined(), "{}: {} is undefined", op, arg);
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
    MT_CHECK(t.defined(), "{}: {} is undefined", op, arg);
    MT_CHECK(t.device() == core::Device::cpu,
             "{}: {} is a {} tensor; {} is not implemented on cuda yet",
             op,
             arg,
             core::device_name(t.device()),
             op);
    check_arg(t, op, arg, ndim);
    MT_CHECK(t.dtype() == DType::f32 || t.dtype() == DType::f64,
             "{}: {} has dtype {}, expected f32 or f64",
             op,
             arg,
             core::dtype_name(t.dtype()));
}

void check_dtype_as(
    const Tensor& t, const Tensor& ref, std::string_view op, std::string_view arg, std::string_view ref_arg) {
    MT_CHECK(t.dtype() == ref.dtype(),
             "{}: {} has dtype {}, expected {} (the dtype of {})",
             op,
             arg,
             core::dtype_name(t.dtype()),
             core::dtype_name(ref.dtype()),
             ref_arg);
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

void check_dtype_in(const Tensor& t, std::initializer_list<DType> dtypes, std::string_view op, std::string_view arg) {
    std::string expected;
    size_t i = 0;
    for (DType d : dtypes) {
        if (t.dtype() == d) return;
        if (i > 0) expected += i + 1 == dtypes.size() ? " or " : ", ";
        expected += core::dtype_name(d);
        ++i;
    }
    core::fail(
        core::ExitCode::internal, "{}: {} has dtype {}, expected {}", op, arg, core::dtype_name(t.dtype()), expected);
}

core::Device check_same_device(std::string_view op, std::initializer_list<NamedArg> args) {
    const NamedArg* first = nullptr;
    for (const NamedArg& a : args) {
        if (!a.tensor.defined()) continue;
        if (first == nullptr) {
            first = &a;
            continue;
        }
        MT_CHECK(a.tensor.device() == first->tensor.device(),
                 "{}: {} is on {} but {} is on {}; all tensors of one call must be on the same device",
                 op,
                 a.name,
                 core::device_name(a.tensor.device()),
                 first->name,
                 core::device_name(first->tensor.device()));
    }
    return first == nullptr ? core::Device::cpu : first->tensor.device();
}

void check_vocab_shard(const VocabShard& shard, int64_t local, std::string_view op) {
    if (!shard.sharded()) {
        MT_CHECK(shard.first == 0 && shard.total == 0,
                 "{}: vocabulary shard first = {}, total = {}; an unsharded call has first = 0 and total = 0",
                 op,
                 shard.first,
                 shard.total);
        return;
    }
    MT_CHECK(shard.first >= 0 && shard.first + local <= shard.total,
             "{}: the vocabulary shard [{}, {}) is not inside a vocabulary of {} ids",
             op,
             shard.first,
             shard.first + local,
             shard.total);
}

}  // namespace mt::ops
