// The vision tower: the ViT (patch embedding, L_v blocks, final LayerNorm; multimodal.md §1) and the projector (2 x 2
// pixel shuffle, LayerNorm, Linear, GELU, Linear; §2) that turns a batch's packed images into the LM-width embeddings
// of their image slots, one per 2 x 2 patch cell, image after image in raster order. Its parameters live in the
// model's table under "vision." and "projector.". With vision.pos = "learned" the patch embeddings get the position
// table (vision.pos_embed.weight) resized to each image's grid added. The pixels get no gradient: backward ends at the
// patch embedding.
#pragma once

#include <memory>
#include <vector>

#include "nn/vision/vit_block.h"

namespace mt::nn {

class VisionEncoder {
   public:
    // d_model: the LM's hidden size (the projector's output).
    VisionEncoder(ParamTable& table, const VisionConfig& cfg, int64_t d_model);

    // The image-slot embeddings [batch.num_tokens(), d_model] (compute dtype, on the model's device), valid until the
    // next forward. Keeps what backward needs.
    const Tensor& forward(const VisionBatch& batch);
    // d_tokens: the gradient of forward's output; accumulates every vision and projector parameter gradient.
    void backward(const Tensor& d_tokens);

    const VisionConfig& config() const {
        return cfg_;
    }
    // The ViT's output after its final norm [P, dim] (tests).
    const Tensor& features() const {
        return features_.current();
    }
    // Memory, as allocated (every buffer keeps the size of the largest batch so far; the memory planner's vision line,
    // parallel/plan_vision.h, is checked against both): what forward keeps for backward, and what the encoder holds
    // besides, the backward's gradient buffers (from the first backward on) and the patch positions on the device.
    int64_t saved_activation_bytes() const;
    int64_t held_bytes() const;

   private:
    VisionConfig cfg_;
    int64_t d_model_;
    const Precision* precision_;
    ParamTable* table_;
    BiasedLinear patch_embed_;
    int pos_table_ = -1;  // vision.pos_embed.weight with vision.pos = "learned", else -1
    std::vector<std::unique_ptr<VitBlock>> blocks_;
    LayerNorm final_norm_, proj_norm_;
    BiasedLinear proj1_, proj2_;
    VisionPositions pos_;
    // Saved by forward: the patches in the compute dtype, each block's input (stream_[l], l = 0..L), the final norm's
    // output and statistics, the shuffled cells, their norm, the projector's pre-activation, activation and output.
    RowBuffer pixels_, pos_rows_, features_, fmean_, frstd_, cells_, ncells_, cmean_, crstd_, p1_, g1_, out_;
    std::vector<RowBuffer> stream_;
    VitScratch scratch_;
    RowBuffer d_cells_, d_ncells_, d_p1_, d_stream_a_, d_stream_b_;
};

}  // namespace mt::nn
