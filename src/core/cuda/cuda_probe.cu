// Proves the CUDA half compiles and links: a kernel, cuBLASLt and NCCL, all called from one probe.
#include <cublasLt.h>
#include <cuda_runtime.h>
#ifdef MT_HAVE_NCCL
#include <nccl.h>
#endif

#include <string>

#include "core/cuda_probe.h"

namespace mt::core {

namespace {
__global__ void probe_kernel(int* out) {
    *out = 42;
}
}  // namespace

bool cuda_compiled() {
    return true;
}

int cuda_device_count() {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess) return 0;
    return count;
}

std::string cuda_describe() {
    int runtime = 0;
    cudaRuntimeGetVersion(&runtime);
#ifdef MT_HAVE_NCCL
    int nccl_version = 0;
    ncclGetVersion(&nccl_version);
    const std::string nccl = std::to_string(nccl_version);
#else
    const std::string nccl = "absent";
#endif
    const size_t lt = cublasLtGetVersion();
    std::string s = "CUDA runtime " + std::to_string(runtime) + ", cuBLASLt " + std::to_string(lt) + ", NCCL " + nccl +
                    ", devices " + std::to_string(cuda_device_count());
    if (cuda_device_count() > 0) {
        int* d = nullptr;
        int h = 0;
        if (cudaMalloc(&d, sizeof(int)) == cudaSuccess) {
            probe_kernel<<<1, 1>>>(d);
            cudaMemcpy(&h, d, sizeof(int), cudaMemcpyDeviceToHost);
            cudaFree(d);
        }
        s += h == 42 ? ", kernel ok" : ", kernel FAILED";
    }
    return s;
}

}  // namespace mt::core
