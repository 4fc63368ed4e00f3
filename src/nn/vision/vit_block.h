// One pre-norm ViT block (multimodal.md §1): x1 = x + W_o attn(rope2d(W_q h1), rope2d(W_k h1), W_v h1), h1 = LN_1(x);
// y = x1 + W_2 gelu(W_1 LN_2(x1)), every linear map with a bias; no rope2d with vision.pos = "learned" (the encoder
// adds the positions to the patch embeddings instead). The attention is bidirectional inside each image of
// the packed patch sequence (VisionPositions::doc_start), so a patch never sees another image.
#pragma once

#include <vector>

#include "nn/layer.h"
#include "nn/vision/vision_batch.h"
#include "nn/vision/vision_config.h"
#include "nn/vision/vision_parts.h"

namespace mt::nn {

// An activation buffer reused across batches whose patch counts differ: it grows to the most rows asked for and hands
// out a contiguous view of the first `rows`.
class RowBuffer {
   public:
    Tensor view(int64_t rows, int64_t cols, core::DType dtype, core::Device device);
    Tensor view(int64_t rows, core::DType dtype, core::Device device);  // [rows]
    const Tensor& current() const {
        return view_;
    }
    Tensor* current_ptr() {
        return &view_;
    }
    // The allocation's bytes (0 before the first view): the most rows asked for so far.
    int64_t bytes() const {
        return storage_.defined() ? static_cast<int64_t>(storage_.nbytes()) : 0;
    }

   private:
    Tensor storage_, view_;
};

// Gradient scratch the blocks of one encoder share in their backward (contents undefined between calls).
struct VitScratch {
    RowBuffer d_h, d_q, d_k, d_v, d_attn, d_a, d_x1;
    int64_t bytes() const;
};

class VitBlock : public Layer {
   public:
    VitBlock(ParamTable& table, const std::string& prefix, const VisionConfig& cfg);

    // x [P, dim] -> y [P, dim] (y must not alias x). Keeps what backward needs.
    void forward(const Tensor& x, const VisionPositions& pos, const Tensor& y);
    // dy [P, dim] -> dx [P, dim] written (=; may alias dy); the parameter gradients accumulate.
    void backward(const Tensor& x, const VisionPositions& pos, const Tensor& dy, const Tensor& dx, VitScratch& s);
    std::vector<SavedTensor> saved_for_backward() override;
    // The bytes of the buffers behind saved_for_backward(), as allocated (the largest batch so far).
    int64_t saved_bytes() const;

   private:
    VisionConfig cfg_;
    const Precision* precision_;
    LayerNorm norm1_, norm2_;
    BiasedLinear wq_, wk_, wv_, wo_, fc1_, fc2_;
    // Saved by forward: the normed inputs, statistics, rotated q and k, v, the attention output and lse, the
    // residual after attention, the MLP's pre-activation and activation.
    RowBuffer h1_, mean1_, rstd1_, q_, k_, v_, attn_, lse_, x1_, h2_, mean2_, rstd2_, a_, g_;
};

}  // namespace mt::nn
