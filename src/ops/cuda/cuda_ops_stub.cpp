// A build without nvcc: every CUDA op fails with one clear message (a CUDA tensor cannot exist in such a build
// anyway, so reaching these is a bug or a hand-made tensor).
#ifndef MT_HAVE_CUDA
#include "ops/cuda/cuda_ops.h"

namespace mt::ops::cuda {

namespace {
[[noreturn]] void absent(const char* op) {
    core::fail(core::ExitCode::device, "{}: this build has no CUDA path (nvcc was not found at build time)", op);
}
}  // namespace

void embedding_fwd(const Tensor&, const Tensor&, const Tensor&) {
    absent("embedding_fwd");
}
void embedding_bwd(const Tensor&, const Tensor&, const Tensor&) {
    absent("embedding_bwd");
}
void linear_fwd(const Tensor&, const Tensor&, const Tensor&, const Tensor&) {
    absent("linear_fwd");
}
void linear_bwd(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, bool) {
    absent("linear_bwd");
}
void rmsnorm_fwd(const Tensor&, const Tensor&, double, const Tensor&, const Tensor&) {
    absent("rmsnorm_fwd");
}
void rmsnorm_bwd(
    const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&) {
    absent("rmsnorm_bwd");
}
void rope_fwd(const Tensor&, double, int64_t, const Tensor&) {
    absent("rope_fwd");
}
void rope_bwd(const Tensor&, double, int64_t, const Tensor&) {
    absent("rope_bwd");
}
void attention_fwd(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&) {
    absent("attention_fwd");
}
void attention_bwd(const Tensor&,
                   const Tensor&,
                   const Tensor&,
                   const Tensor&,
                   const Tensor&,
                   const Tensor&,
                   const Tensor&,
                   const Tensor&,
                   const Tensor&) {
    absent("attention_bwd");
}
void swiglu_fwd(const Tensor&, const Tensor&, const Tensor&) {
    absent("swiglu_fwd");
}
void swiglu_bwd(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&) {
    absent("swiglu_bwd");
}
void cross_entropy_fwd(const Tensor&, const Tensor&, int32_t, const Tensor&, const Tensor&) {
    absent("cross_entropy_fwd");
}
void cross_entropy_bwd(const Tensor&, const Tensor&, const Tensor&, int32_t, const Tensor&, const Tensor&) {
    absent("cross_entropy_bwd");
}
void add_fwd(const Tensor&, const Tensor&, const Tensor&) {
    absent("add_fwd");
}
void add_bwd(const Tensor&, const Tensor&, const Tensor&) {
    absent("add_bwd");
}
void adamw_step(
    const Tensor&, const Tensor&, const Tensor&, const Tensor&, const AdamWHyper&, int64_t, double, const Tensor&) {
    absent("adamw_step");
}
double global_norm(const std::vector<Tensor>&) {
    absent("global_norm");
}
void kda_fwd(const Tensor&,
             const Tensor&,
             const Tensor&,
             const Tensor&,
             const Tensor&,
             const Tensor&,
             const Tensor&,
             const Tensor&,
             const ops::KdaOptions&,
             ops::KdaSaved*) {
    absent("kda_fwd");
}
void kda_bwd(const Tensor&,
             const Tensor&,
             const Tensor&,
             const Tensor&,
             const Tensor&,
             const Tensor&,
             const Tensor&,
             const Tensor&,
             const Tensor&,
             const Tensor&,
             const Tensor&,
             const Tensor&,
             const Tensor&,
             const Tensor&,
             const ops::KdaOptions&,
             const ops::KdaSaved*) {
    absent("kda_bwd");
}
void kda_gate_fwd(const Tensor&, const Tensor&, const Tensor&, const Tensor&, bool, double) {
    absent("kda_gate_fwd");
}
void kda_gate_bwd(const Tensor&,
                  const Tensor&,
                  const Tensor&,
                  const Tensor&,
                  const Tensor&,
                  const Tensor&,
                  const Tensor&,
                  bool,
                  double) {
    absent("kda_gate_bwd");
}
void causal_conv1d_fwd(const Tensor&, const Tensor&, const Tensor&, bool) {
    absent("causal_conv1d_fwd");
}
void causal_conv1d_bwd(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, bool) {
    absent("causal_conv1d_bwd");
}
void l2norm_fwd(const Tensor&, double, double, const Tensor&, const Tensor&) {
    absent("l2norm_fwd");
}
void l2norm_bwd(const Tensor&, const Tensor&, double, const Tensor&, const Tensor&) {
    absent("l2norm_bwd");
}
void sigmoid_fwd(const Tensor&, const Tensor&) {
    absent("sigmoid_fwd");
}
void sigmoid_bwd(const Tensor&, const Tensor&, const Tensor&) {
    absent("sigmoid_bwd");
}
void sigmoid_gate_fwd(const Tensor&, const Tensor&, const Tensor&) {
    absent("sigmoid_gate_fwd");
}
void sigmoid_gate_bwd(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&) {
    absent("sigmoid_gate_bwd");
}

void moe_router_fwd(
    const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const MoeRouterOptions&) {
    absent("moe_router_fwd");
}
void moe_router_bwd(
    const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const MoeRouterOptions&) {
    absent("moe_router_bwd");
}
int64_t moe_permute_plan(
    const Tensor&, const Tensor&, int64_t, int64_t, MoeDropPolicy, const Tensor&, const Tensor&, const Tensor&) {
    absent("moe_permute_plan");
}
void moe_permute_fwd(const Tensor&, const Tensor&, const Tensor&) {
    absent("moe_permute_fwd");
}
void moe_permute_bwd(const Tensor&, const Tensor&, const Tensor&) {
    absent("moe_permute_bwd");
}
void moe_unpermute_fwd(const Tensor&, const Tensor&, const Tensor&, const Tensor&) {
    absent("moe_unpermute_fwd");
}
void moe_unpermute_bwd(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&) {
    absent("moe_unpermute_bwd");
}
void grouped_linear_fwd(const Tensor&, const Tensor&, const int32_t*, const Tensor&) {
    absent("grouped_linear_fwd");
}
void grouped_linear_bwd(
    const Tensor&, const Tensor&, const int32_t*, const Tensor&, const Tensor&, const Tensor&, bool) {
    absent("grouped_linear_bwd");
}
void moe_expert_counts(const Tensor&, const Tensor&) {
    absent("moe_expert_counts");
}
void moe_qb_histogram(const Tensor&, const Tensor&, double, double, const Tensor&) {
    absent("moe_qb_histogram");
}
void moe_token_entropy_sum(const Tensor&, const Tensor&) {
    absent("moe_token_entropy_sum");
}
double moe_aux_loss(const Tensor&, const Tensor&, double, bool, const Tensor&) {
    absent("moe_aux_loss");
}

}  // namespace mt::ops::cuda
#endif
