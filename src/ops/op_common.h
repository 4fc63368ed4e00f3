// Shared argument checks and the float-dtype dispatch used by every op's entry point. An entry point checks ranks,
// contiguity and shapes (device-independent), asks check_same_device which device the call runs on, and then
// either calls the CUDA side (mt::ops::cuda, which checks its own dtypes) or checks the CPU dtypes and runs the CPU
// reference.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string_view>

#include "core/exec.h"
#include "core/tensor.h"

namespace mt::ops {

using core::DType;
using core::Shape;
using core::Tensor;

// Fails (exit 1, naming the op and argument) unless t is defined, contiguous, of the given rank; any device.
void check_arg(const Tensor& t, std::string_view op, std::string_view arg, int ndim);
// The CPU path's float check: fails unless t passes check_arg, is on the CPU and has dtype f32 or f64. A tensor on
// another device fails with "<op>: <arg> is a cuda tensor; <op> is not implemented on cuda yet" (entry points
// dispatch CUDA tensors before calling this, so only ops without a CUDA path reach that message).
void check_float_arg(const Tensor& t, std::string_view op, std::string_view arg, int ndim);
// Fails unless a and b have the same dtype.
void check_same_dtype(const Tensor& a, const Tensor& b, std::string_view op);
// Fails unless t has exactly the given shape.
void check_shape(const Tensor& t, const Shape& shape, std::string_view op, std::string_view arg);
// Fails unless t has one of the given dtypes: "<op>: <arg> has dtype f16, expected bf16 or f32".
void check_dtype_in(const Tensor& t, std::initializer_list<DType> dtypes, std::string_view op, std::string_view arg);
// Fails unless t has the dtype of ref, naming both: "<op>: y has dtype f16, expected f32 (the dtype of x)". The CPU
// references and the CUDA kernels both use it.
void check_dtype_as(
    const Tensor& t, const Tensor& ref, std::string_view op, std::string_view arg, std::string_view ref_arg);

// One tensor argument and its name, for check_same_device.
struct NamedArg {
    std::string_view name;
    const Tensor& tensor;
};
// The device of the call: that of the first defined tensor (cpu when none is defined). Fails (exit 1) naming both
// arguments unless every defined tensor is on that device: "<op>: w is on cuda but x is on cpu; all tensors of
// one call must be on the same device".
core::Device check_same_device(std::string_view op, std::initializer_list<NamedArg> args);

// A vocabulary shard (tensor parallelism: vocab-parallel embedding and loss, docs/distributed.md): the op's weight
// rows / logit columns are the ids [first, first + local) of a vocabulary of `total` ids, local being the tensor's
// own vocabulary size. total = 0 (the default): not sharded, the tensor holds the whole vocabulary.
struct VocabShard {
    int64_t first = 0;
    int64_t total = 0;
    bool sharded() const {
        return total > 0;
    }
};
// Fails (exit 1, naming the op) unless the shard fits its vocabulary: first = total = 0 when not sharded, else
// 0 <= first and first + local <= total.
void check_vocab_shard(const VocabShard& shard, int64_t local, std::string_view op);

// Whether ops must be deterministic is part of the execution context: core::exec().deterministic (core/exec.h).

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
