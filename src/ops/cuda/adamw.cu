// CUDA adamw: not implemented yet (CUDA backend issue); fails with a clear message until it is.
#include "core/error.h"
#include "ops/cuda/cuda_ops.h"

namespace mt::ops::cuda {

void adamw_step(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const AdamWHyper&, int64_t, double) {
    core::fail(core::ExitCode::device, "adamw_step is not implemented on CUDA yet");
}

}  // namespace mt::ops::cuda
