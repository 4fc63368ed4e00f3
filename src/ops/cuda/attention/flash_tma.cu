// cuTensorMapEncodeTiled comes from the driver through the runtime's entry-point query, so that the library links
// only the CUDA runtime (the driver library is whatever the machine has).
#include <cuda_runtime.h>

#include "core/cuda/cuda_check.h"
#include "ops/cuda/attention/flash_tma.h"

namespace mt::ops::cuda {

namespace {

using EncodeTiled = CUresult (*)(CUtensorMap*,
                                 CUtensorMapDataType,
                                 cuuint32_t,
                                 void*,
                                 const cuuint64_t*,
                                 const cuuint64_t*,
                                 const cuuint32_t*,
                                 const cuuint32_t*,
                                 CUtensorMapInterleave,
                                 CUtensorMapSwizzle,
                                 CUtensorMapL2promotion,
                                 CUtensorMapFloatOOBfill);

EncodeTiled encode_tiled() {
    static const EncodeTiled fn = [] {
        void* ptr = nullptr;
        cudaDriverEntryPointQueryResult found{};
        MT_CUDA_CHECK(
            cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &ptr, 12000, cudaEnableDefault, &found));
        MT_CHECK(found == cudaDriverEntryPointSuccess && ptr != nullptr,
                 "the CUDA driver has no cuTensorMapEncodeTiled (the TMA attention kernels need CUDA 12 or later)");
        return reinterpret_cast<EncodeTiled>(ptr);
    }();
    return fn;
}

}  // namespace

CUtensorMap make_bthd_tensor_map(const void* base, int b, int t, int h, int d, int rows) {
    CUtensorMap map{};
    const cuuint64_t dims[4] = {
        static_cast<cuuint64_t>(d), static_cast<cuuint64_t>(h), static_cast<cuuint64_t>(t), static_cast<cuuint64_t>(b)};
    constexpr cuuint64_t kElem = 2;  // bf16
    const cuuint64_t strides[3] = {dims[0] * kElem, dims[0] * dims[1] * kElem, dims[0] * dims[1] * dims[2] * kElem};
    const cuuint32_t box[4] = {64, 1, static_cast<cuuint32_t>(rows), 1};
    const cuuint32_t elem_strides[4] = {1, 1, 1, 1};
    const CUresult res = encode_tiled()(&map,
                                        CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
                                        4,
                                        const_cast<void*>(base),
                                        dims,
                                        strides,
                                        box,
                                        elem_strides,
                                        CU_TENSOR_MAP_INTERLEAVE_NONE,
                                        CU_TENSOR_MAP_SWIZZLE_128B,
                                        CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                                        CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    MT_CHECK(res == CUDA_SUCCESS,
             "cuTensorMapEncodeTiled failed ({}) for a [{}, {}, {}, {}] bf16 tensor in boxes of {} rows",
             static_cast<int>(res),
             b,
             t,
             h,
             d,
             rows);
    return map;
}

}  // namespace mt::ops::cuda
