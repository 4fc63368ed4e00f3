// CUDA linear: not implemented yet (CUDA backend issue); fails with a clear message until it is.
#include "core/error.h"
#include "ops/cuda/cuda_ops.h"

namespace mt::ops::cuda {

void linear_fwd(const Tensor&, const Tensor&, const Tensor&, const Tensor&) {
    core::fail(core::ExitCode::device, "linear_fwd is not implemented on CUDA yet");
}

void linear_bwd(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&) {
    core::fail(core::ExitCode::device, "linear_bwd is not implemented on CUDA yet");
}

}  // namespace mt::ops::cuda
