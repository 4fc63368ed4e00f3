// CUDA rope: not implemented yet (CUDA backend issue); fails with a clear message until it is.
#include "core/error.h"
#include "ops/cuda/cuda_ops.h"

namespace mt::ops::cuda {

void rope_fwd(const Tensor&, double, int64_t, const Tensor&) {
    core::fail(core::ExitCode::device, "rope_fwd is not implemented on CUDA yet");
}

void rope_bwd(const Tensor&, double, int64_t, const Tensor&) {
    core::fail(core::ExitCode::device, "rope_bwd is not implemented on CUDA yet");
}

}  // namespace mt::ops::cuda
