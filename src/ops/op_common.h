// Shared argument checks and the float-dtype dispatch used by every op's entry point.
#pragma once

#include <string_view>

#include "core/tensor.h"

namespace mt::ops {

using core::DType;
using core::Shape;
using core::Tensor;

// Fails (exit 1, naming the op and argument) unless t is defined, on the CPU, contiguous, of the given rank.
void check_arg(const Tensor& t, std::string_view op, std::string_view arg, int ndim);
// Fails unless t has dtype f32 or f64.
void check_float_arg(const Tensor& t, std::string_view op, std::string_view arg, int ndim);
// Fails unless a and b have the same dtype.
void check_same_dtype(const Tensor& a, const Tensor& b, std::string_view op);
// Fails unless t has exactly the given shape.
void check_shape(const Tensor& t, const Shape& shape, std::string_view op, std::string_view arg);

}  // namespace mt::ops

// Runs the body with `scalar_t` bound to float or double according to `dtype`.
#define MT_DISPATCH_FLOAT(dtype, op_name, ...)                       \
    do {                                                             \
        if ((dtype) == ::mt::core::DType::f32) {                     \
            using scalar_t = float;                                  \
            __VA_ARGS__;                                             \
        } else if ((dtype) == ::mt::core::DType::f64) {              \
            using scalar_t = double;                                 \
            __VA_ARGS__;                                             \
        } else {                                                     \
            ::mt::core::fail(::mt::core::ExitCode::internal,         \
                             "{}: dtype {} is not supported on CPU", \
                             (op_name),                              \
                             ::mt::core::dtype_name(dtype));         \
        }                                                            \
    } while (0)
