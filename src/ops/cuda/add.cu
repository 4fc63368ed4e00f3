// CUDA add: not implemented yet (CUDA backend issue); fails with a clear message until it is.
#include "core/error.h"
#include "ops/cuda/cuda_ops.h"

namespace mt::ops::cuda {

void add_fwd(const Tensor&, const Tensor&, const Tensor&) {
    core::fail(core::ExitCode::device, "add_fwd is not implemented on CUDA yet");
}

void add_bwd(const Tensor&, const Tensor&, const Tensor&) {
    core::fail(core::ExitCode::device, "add_bwd is not implemented on CUDA yet");
}

}  // namespace mt::ops::cuda
