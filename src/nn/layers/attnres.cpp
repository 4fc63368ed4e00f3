// Block AttnRes forward and backward over the sub-layers, side by side (attnres.md §3 control flow, §6 backward).
#include "nn/layers/attnres.h"

#include "core/trace.h"
#include "ops/add.h"
#include "ops/attnres_mix.h"

namespace mt::nn {

AttnResStack::AttnResStack(ParamTable& table, const ModelConfig& cfg, const TensorParallel& tp)
    : cfg_(cfg),
      table_(&table),
      layers_(2 * cfg.n_layers),
      block_(cfg.attnres.resolved_block_size()),
      blend_(cfg.attnres.blend_at(0)) {
    MT_CHECK(block_ >= 1, "attnres.block_size = {} must be >= 1", block_);
    const int64_t max_sources = cfg.attnres.max_sources(cfg.n_layers);
    MT_CHECK(max_sources <= ops::kAttnResMaxSources,
             "Block AttnRes over {} sub-layers in blocks of {} needs {} sources per mix; at most {} are supported "
             "(raise attnres.block_size)",
             layers_,
             block_,
             max_sources,
             ops::kAttnResMaxSources);
    // Under sequence parallelism each tp rank mixes its own rows: the queries' and key norms' gradients are parts.
    const TensorParallel rows = tp.splits_rows() ? tp : TensorParallel{};
    for (int64_t l = 1; l <= layers_ + 1; ++l) {
        const std::string p = "attnres.mix." + std::to_string(l);
        query_.push_back(table.add(tp_partial(
            {.name = p + ".query", .shape = {cfg.d_model}, .init = InitKind::zeros, .weight_decay = false}, rows)));
        gain_.push_back(table.add(tp_partial(
            {.name = p + ".key_norm", .shape = {cfg.d_model}, .init = InitKind::ones, .weight_decay = false}, rows)));
    }
}

void AttnResStack::resize(int64_t n, const Precision& precision) {
    if (!partial_.empty() && partial_[0].size(0) == n) return;
    const core::Device dev = precision.device;
    auto act = [&] { return Tensor::zeros({n, cfg_.d_model}, precision.compute, dev); };
    auto acc = [&] { return Tensor::zeros({n, cfg_.d_model}, precision.master, dev); };
    partial_.clear(), mixed_.clear(), alpha_.clear(), d_partial_.clear();
    for (int64_t l = 0; l <= layers_; ++l) {
        if (l < layers_) partial_.push_back(act()), d_partial_.push_back(acc());
        mixed_.push_back(act());
        alpha_.push_back(Tensor::zeros({n, static_cast<int64_t>(sources_of(l).size())}, precision.stats, dev));
    }
    drop_mixed_ = cfg_.recompute.drops(RecomputeModule::attnres);
    mixed_dropped_.assign(static_cast<size_t>(layers_), DropList());
    for (int64_t l = 0; l < layers_ && drop_mixed_; ++l) {
        mixed_dropped_[static_cast<size_t>(l)].add(&mixed_[static_cast<size_t>(l)]);
        mixed_dropped_[static_cast<size_t>(l)].release();
    }
    d_embed_ = acc();
    d_branch_ = act();
    d_mixed_ = act();
    zero_ = precision.master != precision.compute ? act() : Tensor();
}

std::vector<int64_t> AttnResStack::sources_of(int64_t l) const {
    std::vector<int64_t> src = {-1};  // the embedding
    const int64_t first = l == layers_ ? layers_ : (l / block_) * block_;
    for (int64_t end = block_ - 1; end < first; end += block_) src.push_back(end);  // completed blocks
    if (l == layers_ && layers_ % block_ != 0) src.push_back(layers_ - 1);          // the short last block
    if (l < layers_ && l > first) src.push_back(l - 1);                             // the running partial sum
    return src;
}

const Tensor& AttnResStack::partial_or_embedding(int64_t idx, const Tensor& e) const {
    return idx < 0 ? e : partial_[static_cast<size_t>(idx)];
}

const Tensor& AttnResStack::forward(const Tensor& e, std::vector<std::unique_ptr<Block>>& blocks, Workspace& ws) {
    const double eps = cfg_.norm_eps;
    for (int64_t l = 0; l <= layers_; ++l) {
        std::vector<Tensor> sources;
        for (int64_t idx : sources_of(l)) sources.push_back(partial_or_embedding(idx, e));
        const auto i = static_cast<size_t>(l);
        if (l < layers_) mixed_dropped_[i].restore();
        {
            core::TraceRange range(e.device(), "attnres.mix_fwd");
            ops::attnres_mix_fwd(
                sources, table_->param(query_[i]), table_->param(gain_[i]), eps, mixed_[i], alpha_[i], blend_);
        }
        if (l == layers_) break;
        Block& b = *blocks[static_cast<size_t>(l / 2)];
        if (l % block_ == 0) {
            b.branch_forward(static_cast<int>(l % 2), mixed_[i], partial_[i], ws);  // a new block starts at v_l
        } else {
            b.branch_forward(static_cast<int>(l % 2), mixed_[i], d_branch_, ws);  // d_branch_ as scratch for v_l
            ops::add_fwd(partial_[i - 1], d_branch_, partial_[i]);
        }
        mixed_dropped_[i].release();
    }
    return mixed_[static_cast<size_t>(layers_)];
}

void AttnResStack::backward(const Tensor& e,
                            std::vector<std::unique_ptr<Block>>& blocks,
                            const Tensor& d_final,
                            const Tensor& de,
                            Workspace& ws) {
    const double eps = cfg_.norm_eps;
    d_embed_.zero();
    for (const Tensor& d : d_partial_) d.zero();
    // The accumulator rounded to the compute dtype (into scratch), or itself when the dtypes agree.
    auto compute_copy = [&](const Tensor& acc, const Tensor& scratch) -> const Tensor& {
        if (!zero_.defined()) return acc;
        ops::add_fwd(acc, zero_, scratch);
        return scratch;
    };
    auto mix_backward = [&](int64_t l, const Tensor& dh) {
        std::vector<Tensor> sources, grads;
        for (int64_t idx : sources_of(l)) {
            sources.push_back(partial_or_embedding(idx, e));
            grads.push_back(idx < 0 ? d_embed_ : d_partial_[static_cast<size_t>(idx)]);
        }
        const auto i = static_cast<size_t>(l);
        core::TraceRange range(e.device(), "attnres.mix_bwd");
        ops::attnres_mix_bwd(sources,
                             table_->param(query_[i]),
                             table_->param(gain_[i]),
                             eps,
                             alpha_[i],
                             dh,
                             grads,
                             table_->grad(query_[i]),
                             table_->grad(gain_[i]),
                             blend_);
        if (cfg_.attnres.freeze_queries) table_->grad(query_[i]).zero();
    };
    mix_backward(layers_, d_final);
    for (int64_t l = layers_ - 1; l >= 0; --l) {
        const auto i = static_cast<size_t>(l);
        // d_partial_[l] is complete: every later mix that reads it and the next partial sum of its block are done.
        // partial_[l] = partial_[l - 1] + v_l, so dv_l = d_partial_[l].
        Block& b = *blocks[static_cast<size_t>(l / 2)];
        if (drop_mixed_) {  // recompute attnres: h_l from its sources again (alpha_[l] is rewritten, unchanged)
            mixed_dropped_[i].restore();
            std::vector<Tensor> sources;
            for (int64_t idx : sources_of(l)) sources.push_back(partial_or_embedding(idx, e));
            core::TraceRange range(e.device(), "attnres.mix_fwd");
            ops::attnres_mix_fwd(
                sources, table_->param(query_[i]), table_->param(gain_[i]), eps, mixed_[i], alpha_[i], blend_);
        }
        b.branch_backward(static_cast<int>(l % 2), mixed_[i], compute_copy(d_partial_[i], d_branch_), d_mixed_, ws);
        mix_backward(l, d_mixed_);
        mixed_dropped_[i].release();
        if (l % block_ != 0) ops::add_fwd(d_partial_[i - 1], d_partial_[i], d_partial_[i - 1]);
    }
    if (zero_.defined())
        ops::add_fwd(d_embed_, zero_, de);
    else
        de.copy_from(d_embed_);
}

std::vector<SavedTensor> AttnResStack::saved_for_backward() {
    std::vector<SavedTensor> saved;
    for (size_t l = 0; l < mixed_.size(); ++l) {
        if (l < partial_.size()) saved.push_back({"partial." + std::to_string(l), &partial_[l]});
        saved.push_back({"mixed." + std::to_string(l), &mixed_[l]});
        saved.push_back({"alpha." + std::to_string(l), &alpha_[l]});
    }
    return saved;
}

}  // namespace mt::nn
