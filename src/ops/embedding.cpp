// Entry points of the embedding op: argument checks, the id range check (an input-data error), dispatch by device.
#include "ops/embedding.h"

#include "ops/cpu/checks.h"
#include "ops/registry.h"

namespace mt::ops {

void embedding_fwd(const Tensor& ids, const Tensor& weight, const Tensor& out, const VocabShard& shard) {
    constexpr std::string_view op = "embedding_fwd";
    cpu::check_i32_arg(ids, op, "ids", 1);
    check_arg(weight, op, "weight", 2);
    check_arg(out, op, "out", 2);
    const int64_t n = ids.size(0), c = weight.size(1);
    check_shape(out, {n, c}, op, "out");
    check_vocab_shard(shard, weight.size(0), op);
    const core::Device device = check_same_device(op, {{"ids", ids}, {"weight", weight}, {"out", out}});
    MT_CALL_KERNEL(embedding_fwd, device, ids, weight, out, shard);
}

void embedding_bwd(const Tensor& ids, const Tensor& dout, const Tensor& dweight, const VocabShard& shard) {
    constexpr std::string_view op = "embedding_bwd";
    cpu::check_i32_arg(ids, op, "ids", 1);
    check_arg(dout, op, "dout", 2);
    check_arg(dweight, op, "dweight", 2);
    const int64_t n = ids.size(0), c = dweight.size(1);
    check_shape(dout, {n, c}, op, "dout");
    check_vocab_shard(shard, dweight.size(0), op);
    const core::Device device = check_same_device(op, {{"ids", ids}, {"dout", dout}, {"dweight", dweight}});
    MT_CALL_KERNEL(embedding_bwd, device, ids, dout, dweight, shard);
}

}  // namespace mt::ops
