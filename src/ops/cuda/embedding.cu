// CUDA embedding: not implemented yet (CUDA backend issue); fails with a clear message until it is.
#include "core/error.h"
#include "ops/cuda/cuda_ops.h"

namespace mt::ops::cuda {

void embedding_fwd(const Tensor&, const Tensor&, const Tensor&) {
    core::fail(core::ExitCode::device, "embedding_fwd is not implemented on CUDA yet");
}

void embedding_bwd(const Tensor&, const Tensor&, const Tensor&) {
    core::fail(core::ExitCode::device, "embedding_bwd is not implemented on CUDA yet");
}

}  // namespace mt::ops::cuda
