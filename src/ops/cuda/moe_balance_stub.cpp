// A build without nvcc: the MoE balancing counters fail with one clear message (a CUDA tensor cannot exist in such a
// build anyway, so reaching these is a bug or a hand-made tensor).
#ifndef MT_HAVE_CUDA
#include "ops/cuda/moe_balance.h"

namespace mt::ops::cuda {

namespace {
[[noreturn]] void absent(const char* op) {
    core::fail(core::ExitCode::device, "{}: this build has no CUDA path (nvcc was not found at build time)", op);
}
}  // namespace

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
