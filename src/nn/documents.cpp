#include "nn/documents.h"

#include "core/error.h"

namespace mt::nn {

Documents documents_from_ids(const core::Tensor& ids, int32_t eot, core::Device device) {
    MT_CHECK(ids.device() == core::Device::cpu && ids.dtype() == core::DType::i32 && ids.ndim() == 2,
             "documents_from_ids: ids must be a [B, T] i32 host tensor");
    const int64_t b = ids.size(0), t = ids.size(1);
    core::Tensor ds = core::Tensor::zeros({b, t}, core::DType::i32),
                 pos = core::Tensor::zeros({b, t}, core::DType::i32);
    const int32_t* id = ids.data<int32_t>();
    int32_t* d = ds.data<int32_t>();
    int32_t* p = pos.data<int32_t>();
    for (int64_t row = 0; row < b; ++row) {
        int32_t start = 0;
        for (int64_t i = 0; i < t; ++i) {
            if (i > 0 && id[row * t + i - 1] == eot) start = static_cast<int32_t>(i);
            d[row * t + i] = start;
            p[row * t + i] = static_cast<int32_t>(i) - start;
        }
    }
    if (device == core::Device::cpu) return {ds, pos};
    return {ds.to_device(device), pos.to_device(device)};
}

}  // namespace mt::nn
