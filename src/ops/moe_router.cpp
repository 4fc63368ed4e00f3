// Entry points of the MoE router: argument checks, then the CUDA path (which also takes f32 scores, gates, cutoff and
// bias with bf16/f16 logits, and trusts the indices of the backward) or the CPU reference.
#include "ops/moe_router.h"

#include "ops/cpu/checks.h"
#include "ops/registry.h"

namespace mt::ops {

namespace cpu {
// The kernels of src/ops/cpu/moe_router.cpp (shapes as in ops/moe_router.h; bias, cutoff, dscores may be null).
template <typename T>
void moe_router_fwd(const T* logits,
                    const T* bias,
                    const int32_t* bias_rows,
                    T* scores,
                    int32_t* indices,
                    T* gates,
                    T* cutoff,
                    int64_t n,
                    int64_t e,
                    const MoeRouterOptions& options);
template <typename T>
void moe_router_bwd(const T* scores,
                    const int32_t* indices,
                    const T* gates,
                    const T* dgates,
                    const T* dscores,
                    T* dlogits,
                    int64_t n,
                    int64_t e,
                    const MoeRouterOptions& options);
}  // namespace cpu

namespace {

void check_options(const MoeRouterOptions& options, int64_t e, std::string_view op) {
    MT_CHECK(options.top_k >= 1 && options.top_k <= e, "{}: top_k = {} must be in [1, {}]", op, options.top_k, e);
}

}  // namespace

void moe_router_fwd(const Tensor& logits,
                    const Tensor& bias,
                    const Tensor& scores,
                    const Tensor& indices,
                    const Tensor& gates,
                    const Tensor& cutoff,
                    const MoeRouterOptions& options,
                    const Tensor& bias_rows) {
    constexpr std::string_view op = "moe_router_fwd";
    const core::Device dev = check_same_device(op,
                                               {{"logits", logits},
                                                {"bias", bias},
                                                {"bias_rows", bias_rows},
                                                {"scores", scores},
                                                {"indices", indices},
                                                {"gates", gates},
                                                {"cutoff", cutoff}});
    check_arg(logits, op, "logits", 2);
    const int64_t n = logits.size(0), e = logits.size(1), k = options.top_k;
    check_options(options, e, op);
    check_arg(scores, op, "scores", 2);
    check_arg(gates, op, "gates", 2);
    cpu::check_i32_arg(indices, op, "indices", 2);
    check_shape(scores, {n, e}, op, "scores");
    check_shape(indices, {n, k}, op, "indices");
    check_shape(gates, {n, k}, op, "gates");
    if (bias_rows.defined()) {
        MT_CHECK(bias.defined(), "{}: bias_rows needs a bias [G, E]", op);
        cpu::check_i32_arg(bias_rows, op, "bias_rows", 1);
        check_shape(bias_rows, {n}, op, "bias_rows");
        check_arg(bias, op, "bias", 2);
        MT_CHECK(bias.size(1) == e && bias.size(0) >= 1,
                 "{}: bias has shape {}, expected [G, {}] with G >= 1",
                 op,
                 core::shape_str(bias.shape()),
                 e);
    } else if (bias.defined()) {
        check_arg(bias, op, "bias", 1);
        check_shape(bias, {e}, op, "bias");
    }
    if (cutoff.defined()) {
        check_arg(cutoff, op, "cutoff", 1);
        check_shape(cutoff, {n}, op, "cutoff");
        MT_CHECK(e > k, "{}: cutoff needs more experts than top_k (E = {}, top_k = {})", op, e, k);
    }
    MT_CALL_KERNEL(moe_router_fwd, dev, logits, bias, scores, indices, gates, cutoff, options, bias_rows);
}

void moe_router_bwd(const Tensor& scores,
                    const Tensor& indices,
                    const Tensor& gates,
                    const Tensor& dgates,
                    const Tensor& dscores,
                    const Tensor& dlogits,
                    const MoeRouterOptions& options) {
    constexpr std::string_view op = "moe_router_bwd";
    const core::Device dev = check_same_device(op,
                                               {{"scores", scores},
                                                {"indices", indices},
                                                {"gates", gates},
                                                {"dgates", dgates},
                                                {"dscores", dscores},
                                                {"dlogits", dlogits}});
    check_arg(scores, op, "scores", 2);
    const int64_t n = scores.size(0), e = scores.size(1), k = options.top_k;
    check_options(options, e, op);
    cpu::check_i32_arg(indices, op, "indices", 2);
    check_arg(gates, op, "gates", 2);
    check_arg(dgates, op, "dgates", 2);
    check_arg(dlogits, op, "dlogits", 2);
    check_shape(indices, {n, k}, op, "indices");
    check_shape(gates, {n, k}, op, "gates");
    check_shape(dgates, {n, k}, op, "dgates");
    check_shape(dlogits, {n, e}, op, "dlogits");
    if (dscores.defined()) {
        check_arg(dscores, op, "dscores", 2);
        check_shape(dscores, {n, e}, op, "dscores");
    }
    MT_CALL_KERNEL(moe_router_bwd, dev, scores, indices, gates, dgates, dscores, dlogits, options);
}

}  // namespace mt::ops
