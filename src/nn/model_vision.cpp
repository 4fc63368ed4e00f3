// The model's image + text path (multimodal.md §3): the image slots of a batch, the splice of the projector's outputs
// into the token embeddings, and its backward. Early fusion: past the splice an image embedding is a token like any
// other for every KDA, attention, MoE and AttnRes layer; the MoE layers learn each token's modality for per-modality
// routing and metrics (multimodal.md §4).
#include "core/trace.h"
#include "nn/layer_stats.h"
#include "nn/model.h"
#include "ops/layer_stats.h"
#include "ops/splice_rows.h"

namespace mt::nn {

void Model::set_vision_batch(VisionBatch batch) {
    MT_CHECK(vision_ != nullptr || batch.empty(),
             "an image batch for a model without a vision encoder on this part (vision.layers = {})",
             cfg_.vision.layers);
    vision_batch_ = std::move(batch);
}

void Model::vision_prepare() {
    // The tower belongs to the chunk of layer 0: another chunk's pass (pipeline parallelism) leaves its slots for that
    // chunk's backward.
    if (!vision_ || !chunk_has_embedding(chunk_)) return;
    vision_slots_ = Tensor();
    const int32_t image_token = static_cast<int32_t>(cfg_.vision.image_token);
    std::vector<int32_t> slots;
    const int32_t* ids = seq_ids_.data<int32_t>();
    for (int64_t i = 0; i < seq_ids_.numel(); ++i)
        if (ids[i] == image_token) slots.push_back(static_cast<int32_t>(i));
    const auto m = static_cast<int64_t>(slots.size());
    MT_CHECK(m == vision_batch_.num_tokens(),
             "the batch holds {} image tokens (vision.image_token = {}) but its {} images make {} (2x2 cells of their "
             "patch grids)",
             m,
             image_token,
             vision_batch_.grids.size(),
             vision_batch_.num_tokens());
    if (m == 0) return;
    MT_CHECK(bounds_.size() == 2 && !cp_.active() && !tp_.active(),
             "image batches run as one pass of whole rows yet: not with sequence segments, context or tensor "
             "parallelism (docs/multimodal.md)");
    Tensor host = Tensor::zeros({m}, core::DType::i32);
    std::copy(slots.begin(), slots.end(), host.data<int32_t>());
    vision_slots_ = precision_.device == core::Device::cpu ? host : host.to_device(precision_.device);
}

void Model::moe_modality_prepare(const Tensor& host_ids) {
    // The MoE layers under tensor parallelism route rows other than the stream's (the config refuses it first).
    MT_CHECK(!tp_.active(), "per-modality MoE routing and metrics with tensor parallelism");
    const int32_t image_token = static_cast<int32_t>(cfg_.vision.image_token);
    const Tensor ids = host_ids.is_contiguous() ? host_ids : host_ids.clone();
    Tensor host = Tensor::zeros({ids.numel()}, core::DType::i32);
    const int32_t* v = ids.data<int32_t>();
    int32_t* m = host.data<int32_t>();
    for (int64_t i = 0; i < ids.numel(); ++i) m[i] = image_token >= 0 && v[i] == image_token ? 1 : 0;
    // A fresh tensor per pass: a layer keeps the one of its forward for its backward.
    const MoeModality modality{precision_.device == core::Device::cpu ? host : host.to_device(precision_.device), host};
    for (int64_t l = chunk_lo(); l < chunk_hi(); ++l)
        if (MoeLayer* moe = blocks_[static_cast<size_t>(l)]->moe()) moe->set_modality(modality);
}

void Model::vision_forward() {
    if (!vision_slots_.defined()) return;
    core::TraceRange range(precision_.device, "model.vision_fwd");
    const Tensor& tokens = vision_->forward(vision_batch_);
    ops::splice_rows_fwd(tokens, vision_slots_, x0_);
    // A metrics step: the scale of the image embeddings against the text's (multimodal.md §8), which catches a
    // projector whose outputs drown or vanish beside the token embeddings. Counted by a micro-batch's first forward
    // only, not by a pipeline stage's re-run of it.
    if (pass_stats_.defined()) {
        const int64_t at = layer_stats_layout(cfg_).splice();
        ops::layer_stats_moments(tokens, 0.0, pass_stats_.slice(0, at, at + ops::kLayerStatsMoments));
        ops::layer_stats_moments(
            x0_, 0.0, pass_stats_.slice(0, at + ops::kLayerStatsMoments, at + 2 * ops::kLayerStatsMoments));
    }
}

void Model::vision_backward(const Tensor& d_embed) {
    if (!vision_slots_.defined()) return;
    core::TraceRange range(precision_.device, "model.vision_bwd");
    const Tensor d_tokens = Tensor::scratch({vision_slots_.numel(), cfg_.d_model}, d_embed.dtype(), precision_.device);
    ops::splice_rows_bwd(vision_slots_, d_embed, d_tokens);
    vision_->backward(d_tokens);
}

}  // namespace mt::nn
