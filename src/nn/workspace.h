// Gradient scratch shared by all blocks of a model: backward of one block at a time needs these, so one set
// serves every layer (the activations saved for backward are per layer; see Layer::saved_for_backward).
#pragma once

#include "core/tensor.h"
#include "nn/model_config.h"
#include "nn/precision.h"

namespace mt::nn {

struct Workspace {
    core::Tensor d_norm;  // [N, C] gradient w.r.t. a norm output
    core::Tensor d_tmp;   // [N, C] scratch: a branch's output in the block forward
    core::Tensor d_q;     // [B, T, Hq, D]
    core::Tensor d_k;     // [B, T, Hkv, D]
    core::Tensor d_v;     // [B, T, Hkv, D]
    core::Tensor d_attn;  // [B, T, Hq, D]
    core::Tensor d_gate;  // [N, F]
    core::Tensor d_up;    // [N, F]
    core::Tensor d_act;   // [N, F]

    void resize(const ModelConfig& cfg, int64_t batch, int64_t seq, const Precision& precision);
};

}  // namespace mt::nn
