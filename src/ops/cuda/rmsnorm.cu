// CUDA rmsnorm: not implemented yet (CUDA backend issue); fails with a clear message until it is.
#include "core/error.h"
#include "ops/cuda/cuda_ops.h"

namespace mt::ops::cuda {

void rmsnorm_fwd(const Tensor&, const Tensor&, double, const Tensor&, const Tensor&) {
    core::fail(core::ExitCode::device, "rmsnorm_fwd is not implemented on CUDA yet");
}

void rmsnorm_bwd(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&) {
    core::fail(core::ExitCode::device, "rmsnorm_bwd is not implemented on CUDA yet");
}

}  // namespace mt::ops::cuda
