// ViT block forward and backward, side by side.
#include "nn/vision/vit_block.h"

#include <cmath>

#include "ops/add.h"
#include "ops/attention.h"
#include "ops/gelu.h"
#include "ops/rope2d.h"

namespace mt::nn {

Tensor RowBuffer::view(int64_t rows, int64_t cols, core::DType dtype, core::Device device) {
    if (!storage_.defined() || storage_.size(0) < rows || storage_.size(1) != cols || storage_.dtype() != dtype ||
        storage_.device() != device)
        storage_ = Tensor::zeros({rows, cols}, dtype, device);
    view_ = storage_.slice(0, 0, rows);
    return view_;
}

Tensor RowBuffer::view(int64_t rows, core::DType dtype, core::Device device) {
    view_ = view(rows, 1, dtype, device).reshape({rows});
    return view_;
}

namespace {
// [P, H * Dh] as the attention op's [B = 1, P, H, Dh].
Tensor heads_of(const Tensor& x, int64_t heads) {
    return x.reshape({1, x.size(0), heads, x.size(1) / heads});
}
}  // namespace

VitBlock::VitBlock(ParamTable& table, const std::string& prefix, const VisionConfig& cfg)
    : cfg_(cfg), precision_(&table.precision()) {
    const int64_t d = cfg.dim, hd = cfg.head_dim();
    norm1_ = LayerNorm(table, prefix + ".norm1", d, cfg.norm_eps);
    wq_ = BiasedLinear(table, prefix + ".attn.q", d, d, cfg.init_std, OptimGroup::muon, hd);
    wk_ = BiasedLinear(table, prefix + ".attn.k", d, d, cfg.init_std, OptimGroup::muon, hd);
    wv_ = BiasedLinear(table, prefix + ".attn.v", d, d, cfg.init_std, OptimGroup::muon, hd);
    wo_ = BiasedLinear(table, prefix + ".attn.o", d, d, cfg.init_std);
    norm2_ = LayerNorm(table, prefix + ".norm2", d, cfg.norm_eps);
    fc1_ = BiasedLinear(table, prefix + ".mlp.fc1", d, cfg.mlp, cfg.init_std);
    fc2_ = BiasedLinear(table, prefix + ".mlp.fc2", cfg.mlp, d, cfg.init_std);
}

void VitBlock::forward(const Tensor& x, const VisionPositions& pos, const Tensor& y) {
    const int64_t p = x.size(0), d = cfg_.dim, heads = cfg_.heads;
    const core::DType act = precision_->compute, stats = precision_->stats;
    const core::Device dev = precision_->device;
    const Tensor h1 = h1_.view(p, d, act, dev), q = q_.view(p, d, act, dev), k = k_.view(p, d, act, dev),
                 v = v_.view(p, d, act, dev), attn = attn_.view(p, d, act, dev), x1 = x1_.view(p, d, act, dev);
    norm1_.forward(x, h1, mean1_.view(p, stats, dev), rstd1_.view(p, stats, dev));
    wq_.forward(h1, q);
    wk_.forward(h1, k);
    wv_.forward(h1, v);
    if (cfg_.rope2d()) {  // else the positions were added to the patch embeddings (vision.pos = "learned")
        ops::rope2d_fwd(
            q.reshape({p, heads, d / heads}), pos.rows, pos.cols, q.reshape({p, heads, d / heads}), cfg_.rope_base);
        ops::rope2d_fwd(
            k.reshape({p, heads, d / heads}), pos.rows, pos.cols, k.reshape({p, heads, d / heads}), cfg_.rope_base);
    }
    const Tensor lse = lse_.view(heads, p, stats, dev).reshape({1, heads, p});
    const ops::AttentionMask mask{.doc_start = pos.doc_start, .causal = false};
    ops::attention_fwd(
        heads_of(q, heads), heads_of(k, heads), heads_of(v, heads), heads_of(attn, heads), lse, {}, mask);
    wo_.forward(attn, x1);
    ops::add_fwd(x1, x, x1);  // x1 = x + attention branch
    const Tensor h2 = h2_.view(p, d, act, dev), a = a_.view(p, cfg_.mlp, act, dev), g = g_.view(p, cfg_.mlp, act, dev);
    norm2_.forward(x1, h2, mean2_.view(p, stats, dev), rstd2_.view(p, stats, dev));
    fc1_.forward(h2, a);
    ops::gelu_fwd(a, g);
    fc2_.forward(g, y);
    ops::add_fwd(y, x1, y);  // y = x1 + MLP branch
}

void VitBlock::backward(
    const Tensor& x, const VisionPositions& pos, const Tensor& dy, const Tensor& dx, VitScratch& s) {
    const int64_t p = x.size(0), d = cfg_.dim, heads = cfg_.heads;
    const core::DType act = precision_->compute;
    const core::Device dev = precision_->device;
    const Tensor h1 = h1_.current(), q = q_.current(), k = k_.current(), v = v_.current(), attn = attn_.current(),
                 x1 = x1_.current(), h2 = h2_.current(), a = a_.current(), g = g_.current();
    // MLP branch: y = x1 + fc2(gelu(fc1(LN2(x1)))).
    const Tensor d_a = s.d_a.view(p, cfg_.mlp, act, dev), d_h = s.d_h.view(p, d, act, dev);
    fc2_.backward(g, dy, d_a);
    ops::gelu_bwd(a, d_a, d_a);
    fc1_.backward(h2, d_a, d_h);
    const Tensor d_x1 = s.d_x1.view(p, d, act, dev);
    norm2_.backward(x1, mean2_.current(), rstd2_.current(), d_h, d_x1, dy);  // + the residual's dy
    // Attention branch: x1 = x + W_o attn(...).
    const Tensor d_attn = s.d_attn.view(p, d, act, dev);
    wo_.backward(attn, d_x1, d_attn);
    const Tensor d_q = s.d_q.view(p, d, act, dev), d_k = s.d_k.view(p, d, act, dev), d_v = s.d_v.view(p, d, act, dev);
    const ops::AttentionMask mask{.doc_start = pos.doc_start, .causal = false};
    ops::attention_bwd(heads_of(q, heads),
                       heads_of(k, heads),
                       heads_of(v, heads),
                       heads_of(attn, heads),
                       lse_.current().reshape({1, heads, p}),
                       heads_of(d_attn, heads),
                       heads_of(d_q, heads),
                       heads_of(d_k, heads),
                       heads_of(d_v, heads),
                       {},
                       mask);
    const core::Shape per_head{p, heads, d / heads};
    if (cfg_.rope2d()) {
        ops::rope2d_bwd(d_q.reshape(per_head), pos.rows, pos.cols, d_q.reshape(per_head), cfg_.rope_base);
        ops::rope2d_bwd(d_k.reshape(per_head), pos.rows, pos.cols, d_k.reshape(per_head), cfg_.rope_base);
    }
    wq_.backward(h1, d_q, d_h);
    wk_.backward(h1, d_k, d_h, /*accumulate_dx=*/true);
    wv_.backward(h1, d_v, d_h, /*accumulate_dx=*/true);
    norm1_.backward(x, mean1_.current(), rstd1_.current(), d_h, dx, d_x1);  // + the residual's d_x1
}

std::vector<SavedTensor> VitBlock::saved_for_backward() {
    return {{"h1", h1_.current_ptr()},
            {"mean1", mean1_.current_ptr()},
            {"rstd1", rstd1_.current_ptr()},
            {"q", q_.current_ptr()},
            {"k", k_.current_ptr()},
            {"v", v_.current_ptr()},
            {"attn", attn_.current_ptr()},
            {"lse", lse_.current_ptr()},
            {"x1", x1_.current_ptr()},
            {"h2", h2_.current_ptr()},
            {"mean2", mean2_.current_ptr()},
            {"rstd2", rstd2_.current_ptr()},
            {"a", a_.current_ptr()},
            {"g", g_.current_ptr()}};
}

int64_t VitBlock::saved_bytes() const {
    int64_t bytes = 0;
    for (const RowBuffer* b :
         {&h1_, &mean1_, &rstd1_, &q_, &k_, &v_, &attn_, &lse_, &x1_, &h2_, &mean2_, &rstd2_, &a_, &g_})
        bytes += b->bytes();
    return bytes;
}

int64_t VitScratch::bytes() const {
    int64_t n = 0;
    for (const RowBuffer* b : {&d_h, &d_q, &d_k, &d_v, &d_attn, &d_a, &d_x1}) n += b->bytes();
    return n;
}

}  // namespace mt::nn
