// Entry points of the fused softmax + cross-entropy: argument checks, the target range check (an input-data
// error), dispatch by device.
#include "ops/cross_entropy.h"

#include "ops/cpu/checks.h"
#include "ops/cpu/kernels.h"
#include "ops/cuda/cuda_ops.h"

namespace mt::ops {

namespace {

// Every target must be a class index or ignore_index; anything else means bad label data (exit 3), not a bug. (The
// CUDA side checks on the device and reports the same message.)
void check_targets(const Tensor& targets, int64_t vocab, int32_t ignore_index, std::string_view op) {
    const int32_t* p = targets.data<int32_t>();
    for (int64_t i = 0; i < targets.numel(); ++i) {
        if (p[i] != ignore_index && (p[i] < 0 || p[i] >= vocab))
            core::fail_hint(core::ExitCode::data,
                            "the token data holds ids outside the vocabulary; check model.vocab_size and the "
                            "tokenizer used to write the data",
                            "{}: targets[{}] = {} is outside [0, {}) and is not ignore_index ({})",
                            op,
                            i,
                            p[i],
                            vocab,
                            ignore_index);
    }
}

}  // namespace

void cross_entropy_fwd(
    const Tensor& logits, const Tensor& targets, int32_t ignore_index, const Tensor& losses, const Tensor& lse) {
    constexpr std::string_view op = "cross_entropy_fwd";
    check_arg(logits, op, "logits", 2);
    cpu::check_i32_arg(targets, op, "targets", 1);
    check_arg(losses, op, "losses", 1);
    check_arg(lse, op, "lse", 1);
    const int64_t n = logits.size(0), v = logits.size(1);
    MT_CHECK(v > 0, "{}: logits has shape {}; the vocabulary must not be empty", op, core::shape_str(logits.shape()));
    check_shape(targets, {n}, op, "targets");
    check_shape(losses, {n}, op, "losses");
    check_shape(lse, {n}, op, "lse");
    if (check_same_device(op, {{"logits", logits}, {"targets", targets}, {"losses", losses}, {"lse", lse}}) ==
        core::Device::cuda)
        return cuda::cross_entropy_fwd(logits, targets, ignore_index, losses, lse);
    check_float_arg(logits, op, "logits", 2);
    check_float_arg(losses, op, "losses", 1);
    check_float_arg(lse, op, "lse", 1);
    cpu::check_dtype_as(losses, logits, op, "losses", "logits");
    cpu::check_dtype_as(lse, logits, op, "lse", "logits");
    check_targets(targets, v, ignore_index, op);
    MT_DISPATCH_FLOAT(logits.dtype(),
                      op,
                      cpu::cross_entropy_fwd(logits.data<scalar_t>(),
                                             targets.data<int32_t>(),
                                             ignore_index,
                                             losses.data<scalar_t>(),
                                             lse.data<scalar_t>(),
                                             n,
                                             v));
}

void cross_entropy_bwd(const Tensor& logits,
                       const Tensor& targets,
                       const Tensor& lse,
                       int32_t ignore_index,
                       const Tensor& dlosses,
                       const Tensor& dlogits) {
    constexpr std::string_view op = "cross_entropy_bwd";
    check_arg(logits, op, "logits", 2);
    cpu::check_i32_arg(targets, op, "targets", 1);
    check_arg(lse, op, "lse", 1);
    check_arg(dlosses, op, "dlosses", 1);
    check_arg(dlogits, op, "dlogits", 2);
    const int64_t n = logits.size(0), v = logits.size(1);
    check_shape(targets, {n}, op, "targets");
    check_shape(lse, {n}, op, "lse");
    check_shape(dlosses, {n}, op, "dlosses");
    check_shape(dlogits, {n, v}, op, "dlogits");
    if (check_same_device(
            op, {{"logits", logits}, {"targets", targets}, {"lse", lse}, {"dlosses", dlosses}, {"dlogits", dlogits}}) ==
        core::Device::cuda)
        return cuda::cross_entropy_bwd(logits, targets, lse, ignore_index, dlosses, dlogits);
    check_float_arg(logits, op, "logits", 2);
    check_float_arg(lse, op, "lse", 1);
    check_float_arg(dlosses, op, "dlosses", 1);
    check_float_arg(dlogits, op, "dlogits", 2);
    cpu::check_dtype_as(lse, logits, op, "lse", "logits");
    cpu::check_dtype_as(dlosses, logits, op, "dlosses", "logits");
    cpu::check_dtype_as(dlogits, logits, op, "dlogits", "logits");
    check_targets(targets, v, ignore_index, op);
    MT_DISPATCH_FLOAT(logits.dtype(),
                      op,
                      cpu::cross_entropy_bwd(logits.data<scalar_t>(),
                                             targets.data<int32_t>(),
                                             lse.data<scalar_t>(),
                                             ignore_index,
                                             dlosses.data<scalar_t>(),
                                             dlogits.data<scalar_t>(),
                                             n,
                                             v));
}

}  // namespace mt::ops
