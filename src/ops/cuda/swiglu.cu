// CUDA swiglu: not implemented yet (CUDA backend issue); fails with a clear message until it is.
#include "core/error.h"
#include "ops/cuda/cuda_ops.h"

namespace mt::ops::cuda {

void swiglu_fwd(const Tensor&, const Tensor&, const Tensor&) {
    core::fail(core::ExitCode::device, "swiglu_fwd is not implemented on CUDA yet");
}

void swiglu_bwd(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&) {
    core::fail(core::ExitCode::device, "swiglu_bwd is not implemented on CUDA yet");
}

}  // namespace mt::ops::cuda
