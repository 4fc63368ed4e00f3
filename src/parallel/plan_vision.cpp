// The planner's vision tower (parallel/plan_buffers.h PlanVision): the buffers nn::VisionEncoder and its VitBlocks
// allocate for one micro-batch's P patches (their RowBuffers, each sized by its view() call), the slot indices of the
// model's splice, and the allocations of the tower's forward and backward. Read it beside nn/vision/vision_encoder.cpp,
// vit_block.cpp and nn/model_vision.cpp; PlanMemory.VisionTowerEqualsTheRealEncoder holds it to a real model.
#include <algorithm>

#include "parallel/plan_buffers.h"

namespace mt::parallel {

int64_t plan_image_slots(int64_t batch, int64_t seq, int64_t image_tokens, int64_t frame_tokens) {
    if (image_tokens <= 0) return 0;
    int64_t row = 0;
    for (int64_t k = 1; k * frame_tokens < seq; ++k)
        row = std::max(row, std::min(k * image_tokens, seq - k * frame_tokens));
    return batch * row;
}

PlanVision plan_vision(const nn::ModelConfig& cfg,
                       const nn::Precision& precision,
                       int64_t patches,
                       bool deterministic) {
    const nn::VisionConfig& v = cfg.vision;
    const int64_t p = patches, m = patches / 4, d = v.dim, dp = v.projector_width();
    const core::DType act = precision.compute, stats = precision.stats;
    const bool cuda = precision.device == core::Device::cuda;
    PlanVision out{.patches = p, .tokens = m, .buffers = {}, .fwd_transient = {}, .bwd_transient = {}};
    auto add = [&](const std::string& name, int64_t numel, core::DType dtype, bool saved) {
        if (numel > 0)
            out.buffers.push_back(
                {PlanKind::vision, name, numel * static_cast<int64_t>(core::dtype_size(dtype)), saved, false});
    };
    // VisionEncoder::forward: the patches in the compute dtype, the learned positions resized to the grids, each
    // block's input and the last block's output (L + 1 rows of the stream), the final norm and its statistics.
    add("pixels", p * v.patch_values(), act, true);
    if (!v.rope2d()) add("pos_rows", p * d, act, true);
    for (int64_t l = 0; l <= v.layers; ++l) add("stream." + std::to_string(l), p * d, act, true);
    // VitBlock::forward, per block (saved_for_backward's list).
    for (int64_t l = 0; l < v.layers; ++l) {
        const std::string b = "blocks." + std::to_string(l) + ".";
        for (const char* name : {"h1", "q", "k", "v", "attn", "x1", "h2"}) add(b + name, p * d, act, true);
        for (const char* name : {"mean1", "rstd1", "mean2", "rstd2"}) add(b + name, p, stats, true);
        add(b + "lse", v.heads * p, stats, true);
        add(b + "a", p * v.mlp, act, true), add(b + "g", p * v.mlp, act, true);
    }
    add("features", p * d, act, true);
    add("fmean", p, stats, true), add("frstd", p, stats, true);
    // The projector: the 2 x 2 cells, their norm, fc1's output and its GELU, the image embeddings.
    add("cells", m * 4 * d, act, true), add("ncells", m * 4 * d, act, true);
    add("cmean", m, stats, true), add("crstd", m, stats, true);
    add("p1", m * dp, act, true), add("g1", m * dp, act, true);
    add("out", m * cfg.d_model, act, true);
    // VisionEncoder::backward's gradient buffers and the blocks' shared VitScratch, kept from the first backward on.
    add("d_cells", m * 4 * d, act, false), add("d_ncells", m * 4 * d, act, false), add("d_p1", m * dp, act, false);
    add("d_stream_a", p * d, act, false), add("d_stream_b", p * d, act, false);
    for (const char* name : {"scratch.d_h", "scratch.d_q", "scratch.d_k", "scratch.d_v", "scratch.d_attn"})
        add(name, p * d, act, false);
    add("scratch.d_x1", p * d, act, false), add("scratch.d_a", p * v.mlp, act, false);
    // VisionPositions on the device (rows, cols, doc_start; the grids stay on the host) and the model's slot indices.
    for (const char* name : {"positions.rows", "positions.cols", "positions.doc_start"})
        add(name, p, core::DType::i32, false);
    add("slots", m, core::DType::i32, false);
    // The forward's pixels: Tensor::to makes the compute-dtype copy on the host, to_device the one the ViT reads, each
    // a fresh tensor (on the CPU both are the device's memory).
    const int64_t pixels = p * v.patch_values() * static_cast<int64_t>(core::dtype_size(act));
    out.fwd_transient = cuda ? std::vector<int64_t>{pixels} : std::vector<int64_t>{pixels, pixels};
    // Model::vision_backward: the image slots' gradient rows [M, C] (Tensor::scratch) while the tower's backward
    // runs, with each block's attention backward scratch inside it.
    out.bwd_transient = {m * cfg.d_model * static_cast<int64_t>(core::dtype_size(act))};
    if (cuda && v.layers > 0)
        out.bwd_transient.push_back(plan_attention_bwd_scratch(1, v.heads, p, v.head_dim(), act, deterministic));
    return out;
}

}  // namespace mt::parallel
