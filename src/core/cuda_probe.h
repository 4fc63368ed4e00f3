// Reports what the CUDA half of the build sees (compiled only when nvcc was found).
#pragma once

#include <string>

namespace mt::core {

// True when this build contains the CUDA path.
bool cuda_compiled();
// Number of visible CUDA devices (0 without a GPU or without the CUDA path).
int cuda_device_count();
// One line: CUDA runtime, cuBLASLt and NCCL versions, or why CUDA is absent.
std::string cuda_describe();

}  // namespace mt::core
