// Vision tower forward and backward, side by side: the ViT, then the projector.
#include "nn/vision/vision_encoder.h"

#include "core/error.h"
#include "ops/add.h"
#include "ops/bilinear_resize.h"
#include "ops/gelu.h"
#include "ops/pixel_shuffle.h"

namespace mt::nn {

VisionEncoder::VisionEncoder(ParamTable& table, const VisionConfig& cfg, int64_t d_model)
    : cfg_(cfg), d_model_(d_model), precision_(&table.precision()), table_(&table) {
    MT_CHECK(
        cfg.pos == "rope2d" || cfg.pos == "learned", "vision.pos = \"{}\": must be \"rope2d\" or \"learned\"", cfg.pos);
    MT_CHECK(cfg.heads > 0 && cfg.dim % cfg.heads == 0 && (!cfg.rope2d() || cfg.head_dim() % 4 == 0),
             "vision.dim = {} with vision.heads = {}: the head dim must be whole (and a multiple of 4 for 2-D RoPE)",
             cfg.dim,
             cfg.heads);
    // The patch embedding is an input layer, AdamW's like the token embedding (muon.md §2).
    patch_embed_ =
        BiasedLinear(table, "vision.patch_embed", cfg.patch_values(), cfg.dim, cfg.init_std, OptimGroup::adamw);
    if (!cfg.rope2d()) {
        MT_CHECK(cfg.pos_grid > 0, "vision.pos_grid = {} must be > 0", cfg.pos_grid);
        // An embedding table too: AdamW's, with weight decay, as the token embedding (embed.weight).
        pos_table_ = table.add({.name = "vision.pos_embed.weight",
                                .shape = {cfg.pos_grid, cfg.pos_grid, cfg.dim},
                                .init = InitKind::normal,
                                .init_std = cfg.init_std,
                                .weight_decay = true,
                                .group = OptimGroup::adamw});
    }
    for (int64_t l = 0; l < cfg.layers; ++l)
        blocks_.push_back(std::make_unique<VitBlock>(table, "vision.blocks." + std::to_string(l), cfg));
    final_norm_ = LayerNorm(table, "vision.final_norm", cfg.dim, cfg.norm_eps);
    proj_norm_ = LayerNorm(table, "projector.norm", 4 * cfg.dim, cfg.norm_eps);
    proj1_ = BiasedLinear(table, "projector.fc1", 4 * cfg.dim, cfg.projector_width(), cfg.init_std);
    proj2_ = BiasedLinear(table, "projector.fc2", cfg.projector_width(), d_model, cfg.init_std);
    stream_.resize(static_cast<size_t>(cfg.layers + 1));
}

const Tensor& VisionEncoder::forward(const VisionBatch& batch) {
    batch.check(cfg_.patch_values(), "vision batch");
    const core::DType act = precision_->compute, stats = precision_->stats;
    const core::Device dev = precision_->device;
    const int64_t p = batch.num_patches(), n = batch.num_tokens(), d = cfg_.dim, dp = cfg_.projector_width();
    pos_ = VisionPositions::make(batch.grids, dev);
    const Tensor pixels = pixels_.view(p, cfg_.patch_values(), act, dev);
    pixels.copy_from(batch.patches.to(act).to_device(dev));
    const Tensor x0 = stream_[0].view(p, d, act, dev);
    patch_embed_.forward(pixels, x0);
    if (pos_table_ >= 0) {  // x0 += the table resized to each image's grid
        const Tensor pos = pos_rows_.view(p, d, act, dev);
        ops::bilinear_resize_fwd(table_->param(pos_table_), pos_.grids, pos);
        ops::add_fwd(x0, pos, x0);
    }
    for (size_t l = 0; l < blocks_.size(); ++l)
        blocks_[l]->forward(stream_[l].current(), pos_, stream_[l + 1].view(p, d, act, dev));
    const Tensor feats = features_.view(p, d, act, dev);
    final_norm_.forward(stream_.back().current(), feats, fmean_.view(p, stats, dev), frstd_.view(p, stats, dev));
    const Tensor cells = cells_.view(n, 4 * d, act, dev), ncells = ncells_.view(n, 4 * d, act, dev);
    ops::pixel_shuffle_fwd(feats, pos_.grids, cells);
    proj_norm_.forward(cells, ncells, cmean_.view(n, stats, dev), crstd_.view(n, stats, dev));
    const Tensor p1 = p1_.view(n, dp, act, dev), g1 = g1_.view(n, dp, act, dev);
    proj1_.forward(ncells, p1);
    ops::gelu_fwd(p1, g1);
    proj2_.forward(g1, out_.view(n, d_model_, act, dev));
    return out_.current();
}

void VisionEncoder::backward(const Tensor& d_tokens) {
    const core::DType act = precision_->compute;
    const core::Device dev = precision_->device;
    const int64_t n = cells_.current().size(0), p = features_.current().size(0), d = cfg_.dim;
    MT_CHECK(d_tokens.ndim() == 2 && d_tokens.size(0) == n && d_tokens.size(1) == d_model_,
             "vision backward: d_tokens has shape {}, expected [{}, {}]",
             core::shape_str(d_tokens.shape()),
             n,
             d_model_);
    // Projector.
    const Tensor d_p1 = d_p1_.view(n, cfg_.projector_width(), act, dev);
    proj2_.backward(g1_.current(), d_tokens, d_p1);
    ops::gelu_bwd(p1_.current(), d_p1, d_p1);
    const Tensor d_ncells = d_ncells_.view(n, 4 * d, act, dev), d_cells = d_cells_.view(n, 4 * d, act, dev);
    proj1_.backward(ncells_.current(), d_p1, d_ncells);
    proj_norm_.backward(cells_.current(), cmean_.current(), crstd_.current(), d_ncells, d_cells);
    // ViT: the final norm, then the blocks last first, two stream gradients in turn.
    Tensor d_a = d_stream_a_.view(p, d, act, dev), d_b = d_stream_b_.view(p, d, act, dev);
    ops::pixel_shuffle_bwd(pos_.grids, d_cells, d_b);
    final_norm_.backward(stream_.back().current(), fmean_.current(), frstd_.current(), d_b, d_a);
    for (size_t l = blocks_.size(); l-- > 0;) {
        blocks_[l]->backward(stream_[l].current(), pos_, d_a, d_b, scratch_);
        std::swap(d_a, d_b);
    }
    if (pos_table_ >= 0) ops::bilinear_resize_bwd(pos_.grids, d_a, table_->grad(pos_table_));
    patch_embed_.backward(pixels_.current(), d_a, Tensor());  // no gradient for the pixels
}

int64_t VisionEncoder::saved_activation_bytes() const {
    int64_t bytes = 0;
    for (const RowBuffer* b :
         {&pixels_, &pos_rows_, &features_, &fmean_, &frstd_, &cells_, &ncells_, &cmean_, &crstd_, &p1_, &g1_, &out_})
        bytes += b->bytes();
    for (const RowBuffer& b : stream_) bytes += b.bytes();
    for (const auto& block : blocks_) bytes += block->saved_bytes();
    return bytes;
}

int64_t VisionEncoder::held_bytes() const {
    int64_t bytes = scratch_.bytes();
    for (const RowBuffer* b : {&d_cells_, &d_ncells_, &d_p1_, &d_stream_a_, &d_stream_b_}) bytes += b->bytes();
    // The positions the kernels read (the grids stay on the host).
    for (const Tensor* t : {&pos_.rows, &pos_.cols, &pos_.doc_start})
        bytes += t->defined() ? static_cast<int64_t>(t->nbytes()) : 0;
    return bytes;
}

}  // namespace mt::nn
