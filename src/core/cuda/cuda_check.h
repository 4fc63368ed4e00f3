// CUDA error checks and NVTX ranges for the CUDA half (include only from .cu files).
#pragma once

#include <cuda_runtime.h>

#include "core/error.h"
#include "core/exec.h"
#include "core/trace.h"

namespace mt::core {

[[noreturn]] void cuda_fail(cudaError_t err, const char* what, const char* file, int line);

// The CUDA stream of a lane (created on first use), and the one of the current context (core::exec()): every kernel
// launch, copy and memset of an op goes to exec_stream().
cudaStream_t lane_stream(Lane lane);
cudaStream_t exec_stream();

// The range around a CUDA op: core::TraceRange on the GPU (an NVTX range through the CUDA backend, and a profile
// entry), named after the op.
class NvtxRange : public TraceRange {
   public:
    explicit NvtxRange(const char* name) : TraceRange(Device::cuda, name) {}
};

}  // namespace mt::core

// Every CUDA runtime call and every launch (MT_CUDA_CHECK(cudaGetLastError())) goes through this.
#define MT_CUDA_CHECK(expr)                                                                    \
    do {                                                                                       \
        const cudaError_t mt_err_ = (expr);                                                    \
        if (mt_err_ != cudaSuccess) ::mt::core::cuda_fail(mt_err_, #expr, __FILE__, __LINE__); \
    } while (0)
