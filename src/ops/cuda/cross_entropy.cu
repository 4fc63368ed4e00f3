// CUDA cross_entropy: not implemented yet (CUDA backend issue); fails with a clear message until it is.
#include "core/error.h"
#include "ops/cuda/cuda_ops.h"

namespace mt::ops::cuda {

void cross_entropy_fwd(const Tensor&, const Tensor&, int32_t, const Tensor&, const Tensor&) {
    core::fail(core::ExitCode::device, "cross_entropy_fwd is not implemented on CUDA yet");
}

void cross_entropy_bwd(const Tensor&, const Tensor&, const Tensor&, int32_t, const Tensor&, const Tensor&) {
    core::fail(core::ExitCode::device, "cross_entropy_bwd is not implemented on CUDA yet");
}

}  // namespace mt::ops::cuda
