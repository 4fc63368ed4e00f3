// The documents of a packed micro-batch (long_context.md §2, `data.document_mask`): where each token's document
// starts, which the mixers use so that no token sees another document (softmax attention masks the keys before the
// start, KDA restarts its state and its short conv reads zeros there), and each token's position in its document,
// which RoPE uses so that positions restart at every document. Token-wise layers (norms, MLP, MoE, AttnRes mixes)
// need neither.
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace mt::nn {

struct Documents {
    core::Tensor doc_start;  // [B, T] i32: the first position of each token's document (ops::AttentionMask::doc_start)
    core::Tensor positions;  // [B, T] i32: t - doc_start[b, t]
    bool defined() const {
        return doc_start.defined();
    }
};

// The documents of ids ([B, T] i32 on the host): every row starts a document at position 0 and after each `eot`
// token (the EOT ends its document: it is the last token of the one before). Both maps are placed on device.
Documents documents_from_ids(const core::Tensor& ids, int32_t eot, core::Device device);

}  // namespace mt::nn
