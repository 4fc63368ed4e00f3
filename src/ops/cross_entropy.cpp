// Entry points of the fused softmax + cross-entropy: argument checks, the target range check (an input-data
// error), dispatch by device.
#include "ops/cross_entropy.h"

#include "ops/cpu/checks.h"
#include "ops/registry.h"

namespace mt::ops {

void cross_entropy_fwd(const Tensor& logits,
                       const Tensor& targets,
                       int32_t ignore_index,
                       const Tensor& losses,
                       const Tensor& lse,
                       const VocabShard& shard) {
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
    check_vocab_shard(shard, v, op);
    const core::Device device =
        check_same_device(op, {{"logits", logits}, {"targets", targets}, {"losses", losses}, {"lse", lse}});
    MT_CALL_KERNEL(cross_entropy_fwd, device, logits, targets, ignore_index, losses, lse, shard);
}

void cross_entropy_bwd(const Tensor& logits,
                       const Tensor& targets,
                       const Tensor& lse,
                       int32_t ignore_index,
                       const Tensor& dlosses,
                       const Tensor& dlogits,
                       const VocabShard& shard) {
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
    check_vocab_shard(shard, v, op);
    const core::Device device = check_same_device(
        op, {{"logits", logits}, {"targets", targets}, {"lse", lse}, {"dlosses", dlosses}, {"dlogits", dlogits}});
    MT_CALL_KERNEL(cross_entropy_bwd, device, logits, targets, lse, ignore_index, dlosses, dlogits, shard);
}

}  // namespace mt::ops
