// A build without nvcc: the CUDA AttnRes mix fails with one clear message (no CUDA tensor can exist in such a build).
#ifndef MT_HAVE_CUDA
#include "core/error.h"
#include "ops/cuda/attnres_mix_cuda.h"

namespace mt::ops::cuda {

void attnres_mix_fwd(const std::vector<core::Tensor>&,
                     const core::Tensor&,
                     const core::Tensor&,
                     double,
                     const core::Tensor&,
                     const core::Tensor&,
                     double) {
    core::fail(core::ExitCode::device, "attnres_mix_fwd: this build has no CUDA path (nvcc was not found)");
}
void attnres_mix_bwd(const std::vector<core::Tensor>&,
                     const core::Tensor&,
                     const core::Tensor&,
                     double,
                     const core::Tensor&,
                     const core::Tensor&,
                     const std::vector<core::Tensor>&,
                     const core::Tensor&,
                     const core::Tensor&,
                     double) {
    core::fail(core::ExitCode::device, "attnres_mix_bwd: this build has no CUDA path (nvcc was not found)");
}

}  // namespace mt::ops::cuda
#endif
