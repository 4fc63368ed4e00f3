// Workspace sizing and slots, and the saved-bytes helper of the layer contract.
#include "nn/workspace.h"

#include <algorithm>

#include "core/allocator.h"
#include "core/error.h"
#include "nn/layer.h"

namespace mt::nn {

void Workspace::resize(const ModelConfig& cfg, int64_t batch, int64_t seq, const Precision& precision) {
    const int64_t n = batch * seq;
    if (d_norm.defined() && d_norm.size(0) == n && d_norm.device() == precision.device) return;
    d_norm = core::Tensor::zeros({n, cfg.d_model}, precision.compute, precision.device);
    d_tmp = core::Tensor::zeros({n, cfg.d_model}, precision.compute, precision.device);
}

void Workspace::reserve_slot(int index, size_t bytes) {
    MT_CHECK(index >= 0 && index < kSlots, "workspace slot {} is not in [0, {})", index, kSlots);
    reserved_[static_cast<size_t>(index)] = std::max(reserved_[static_cast<size_t>(index)], bytes);
}

core::Tensor Workspace::slot(int index, const core::Shape& shape, core::DType dtype, core::Device device) {
    MT_CHECK(index >= 0 && index < kSlots, "workspace slot {} is not in [0, {})", index, kSlots);
    const auto i = static_cast<size_t>(index);
    const size_t bytes = static_cast<size_t>(core::shape_numel(shape)) * core::dtype_size(dtype);
    reserved_[i] = std::max(reserved_[i], bytes);
    std::shared_ptr<core::Storage>& s = slots_[i];
    if (!s || s->bytes() < reserved_[i] || s->device() != device) {
        s.reset();  // the old buffer goes back to the allocator first, so that growing never holds both
        s = std::make_shared<core::Storage>(reserved_[i], device, core::Storage::Uninitialized{});
    }
    return core::Tensor::view_of(s, 0, shape, dtype);
}

size_t Workspace::slot_bytes() const {
    size_t bytes = 0;
    for (const auto& s : slots_) bytes += s ? s->bytes() : 0;
    return bytes;
}

size_t saved_bytes(const std::vector<SavedTensor>& saved) {
    size_t bytes = 0;
    for (const auto& s : saved) bytes += s.tensor->defined() ? s.tensor->nbytes() : 0;
    return bytes;
}

}  // namespace mt::nn
