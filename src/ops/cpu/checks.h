// Argument checks used by the op entry points beyond those of ops/op_common.h: index tensors (exit 1, as every
// argument error).
#pragma once

#include <string_view>

#include "ops/op_common.h"

namespace mt::ops::cpu {

// Fails unless t is a defined, contiguous CPU i32 tensor of the given rank.
inline void check_i32_arg(const Tensor& t, std::string_view op, std::string_view arg, int ndim) {
    check_arg(t, op, arg, ndim);
    MT_CHECK(t.dtype() == DType::i32, "{}: {} has dtype {}, expected i32", op, arg, core::dtype_name(t.dtype()));
}

}  // namespace mt::ops::cpu
