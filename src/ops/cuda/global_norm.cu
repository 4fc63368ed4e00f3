// CUDA global_norm: not implemented yet (CUDA backend issue); fails with a clear message until it is.
#include "core/error.h"
#include "ops/cuda/cuda_ops.h"

namespace mt::ops::cuda {

double global_norm(const std::vector<Tensor>&) {
    core::fail(core::ExitCode::device, "global_norm is not implemented on CUDA yet");
}

}  // namespace mt::ops::cuda
