// Entry points of the MoE balancing counters and the aux loss: argument checks and dispatch by device.
#include "ops/moe_balance.h"

#include "ops/cpu/checks.h"
#include "ops/registry.h"

namespace mt::ops {

namespace {

void check_i64(const Tensor& t, std::string_view op, std::string_view arg, int ndim) {
    check_arg(t, op, arg, ndim);
    MT_CHECK(t.dtype() == DType::i64, "{}: {} has dtype {}, expected i64", op, arg, core::dtype_name(t.dtype()));
}

void check_group(const Tensor& group, int64_t n, std::string_view op) {
    if (!group.defined()) return;
    cpu::check_i32_arg(group, op, "group", 1);
    check_shape(group, {n}, op, "group");
}

}  // namespace

void moe_expert_counts(const Tensor& indices, const Tensor& counts, const Tensor& group, int32_t keep) {
    constexpr std::string_view op = "moe_expert_counts";
    const core::Device device = check_same_device(op, {{"indices", indices}, {"counts", counts}, {"group", group}});
    cpu::check_i32_arg(indices, op, "indices", 2);
    check_i64(counts, op, "counts", 1);
    check_group(group, indices.size(0), op);
    MT_CALL_KERNEL(moe_expert_counts, device, indices, counts, group, keep);
}

void moe_qb_histogram(const Tensor& scores,
                      const Tensor& cutoff,
                      double lower,
                      double upper,
                      const Tensor& hist,
                      const Tensor& group,
                      int32_t keep) {
    constexpr std::string_view op = "moe_qb_histogram";
    const core::Device device =
        check_same_device(op, {{"scores", scores}, {"cutoff", cutoff}, {"hist", hist}, {"group", group}});
    check_arg(scores, op, "scores", 2);
    check_arg(cutoff, op, "cutoff", 1);
    check_i64(hist, op, "hist", 2);
    const int64_t n = scores.size(0), e = scores.size(1);
    check_shape(cutoff, {n}, op, "cutoff");
    MT_CHECK(hist.size(0) == e && hist.size(1) >= 1,
             "{}: hist has shape {}, expected [{}, B] with B >= 1",
             op,
             core::shape_str(hist.shape()),
             e);
    check_same_dtype(scores, cutoff, op);
    MT_CHECK(upper > lower, "{}: the bin range [{}, {}] is empty", op, lower, upper);
    check_group(group, n, op);
    MT_CALL_KERNEL(moe_qb_histogram, device, scores, cutoff, lower, upper, hist, group, keep);
}

void moe_token_entropy_sum(const Tensor& scores, const Tensor& acc) {
    constexpr std::string_view op = "moe_token_entropy_sum";
    const core::Device device = check_same_device(op, {{"scores", scores}, {"acc", acc}});
    check_arg(scores, op, "scores", 2);
    check_arg(acc, op, "acc", 1);
    check_shape(acc, {1}, op, "acc");
    MT_CHECK(acc.dtype() == DType::f64, "{}: acc has dtype {}, expected f64", op, core::dtype_name(acc.dtype()));
    MT_CALL_KERNEL(moe_token_entropy_sum, device, scores, acc);
}

double moe_aux_loss(const Tensor& scores, const Tensor& indices, double coeff, bool probs, const Tensor& dscores) {
    constexpr std::string_view op = "moe_aux_loss";
    const core::Device device = check_same_device(op, {{"scores", scores}, {"indices", indices}, {"dscores", dscores}});
    check_arg(scores, op, "scores", 2);
    cpu::check_i32_arg(indices, op, "indices", 2);
    const int64_t n = scores.size(0);
    MT_CHECK(
        indices.size(0) == n, "{}: indices has shape {}, expected [{}, K]", op, core::shape_str(indices.shape()), n);
    if (dscores.defined()) {
        check_arg(dscores, op, "dscores", 2);
        check_shape(dscores, scores.shape(), op, "dscores");
        check_same_dtype(scores, dscores, op);
    }
    if (n == 0) return 0.0;
    return MT_CALL_KERNEL(moe_aux_loss, device, scores, indices, coeff, probs, dscores);
}

}  // namespace mt::ops
