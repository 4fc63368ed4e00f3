// Backward scratch shared by every layer of a model. A backward runs one layer at a time, so one set of gradient
// buffers serves all of them (the activations saved for backward are per layer; see Layer::saved_for_backward).
// Two kinds:
//   d_norm, d_tmp   [N, C] in the compute dtype, with fixed roles: the gradient w.r.t. a norm output (a sub-layer's
//                   dx), and a branch's output in the block forward / a second dx in the backward.
//   slots           numbered, grow-only byte buffers; a layer's backward takes a typed view of one with slot(), and
//                   picks the slot numbers so that tensors alive at the same time never share one (each layer's
//                   backward lists its assignment). A view is valid until the next slot() call that grows the same
//                   slot; reserve_slot() lets the model size every slot once, before the first backward, so that
//                   none grows during training.
// Contents are undefined: every user writes a view in full before reading it (under scratch poisoning the buffers
// start as NaN, so a missed write shows up).
#pragma once

#include <array>
#include <memory>

#include "core/tensor.h"
#include "nn/model_config.h"
#include "nn/precision.h"

namespace mt::nn {

class Workspace {
   public:
    static constexpr int kSlots = 8;

    core::Tensor d_norm;  // [N, C] gradient w.r.t. a norm output
    core::Tensor d_tmp;   // [N, C] scratch: a branch's output in the block forward

    void resize(const ModelConfig& cfg, int64_t batch, int64_t seq, const Precision& precision);
    // At least `bytes` in slot `index` from the next slot() call on (its contents are then undefined).
    void reserve_slot(int index, size_t bytes);
    // A contiguous view [shape] of dtype over slot `index` on `device`, grown (contents lost) when too small.
    core::Tensor slot(int index, const core::Shape& shape, core::DType dtype, core::Device device);
    // Bytes the slots hold now (memory accounting, tests).
    size_t slot_bytes() const;

   private:
    std::array<std::shared_ptr<core::Storage>, kSlots> slots_;
    std::array<size_t, kSlots> reserved_ = {};
};

}  // namespace mt::nn
