// The layer contract. Every layer has explicit forward and backward calls (signatures differ per layer) and
// declares, by name, the activations its forward keeps for its backward; a recompute policy can free those
// and re-run forward before backward.
#pragma once

#include <string>
#include <vector>

#include "core/tensor.h"

namespace mt::nn {

struct SavedTensor {
    std::string name;
    core::Tensor* tensor;  // the layer's own buffer
};

class Layer {
   public:
    virtual ~Layer() = default;
    // What forward saves for backward, in the layer's own buffers.
    virtual std::vector<SavedTensor> saved_for_backward() = 0;
};

// Bytes held by a list of saved tensors (memory planning, tests).
size_t saved_bytes(const std::vector<SavedTensor>& saved);

}  // namespace mt::nn
