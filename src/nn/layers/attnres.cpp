// Block AttnRes forward and backward over the sub-layers, side by side (attnres.md §3 control flow, §6 backward).
#include "nn/layers/attnres.h"

#include "core/trace.h"
#include "ops/add.h"
#include "ops/attnres_mix.h"
#include "ops/layer_stats.h"

namespace mt::nn {

std::vector<int64_t> attnres_sources(int64_t l, int64_t layers, int64_t block) {
    std::vector<int64_t> src = {-1};  // the embedding
    const int64_t first = l == layers ? layers : (l / block) * block;
    for (int64_t end = block - 1; end < first; end += block) src.push_back(end);  // completed blocks
    if (l == layers && layers % block != 0) src.push_back(layers - 1);            // the short last block
    if (l < layers && l > first) src.push_back(l - 1);                            // the running partial sum
    return src;
}

std::vector<int64_t> attnres_hop_sources(
    const std::vector<std::pair<int64_t, int64_t>>& chunks, int64_t k, int64_t stages, bool cache, int64_t block) {
    MT_CHECK(k > 0 && k < static_cast<int64_t>(chunks.size()), "no hop into chunk {} of {}", k, chunks.size());
    const int64_t layers = chunks.back().second;
    std::vector<int64_t> src = attnres_sources(chunks[static_cast<size_t>(k)].first, layers, block);
    if (!cache || k < stages) return src;
    // The receiver's previous chunk of this micro-batch kept the embedding and every block completed before it ended.
    const int64_t kept_before = chunks[static_cast<size_t>(k - stages)].second;
    std::erase_if(src, [&](int64_t idx) { return idx < 0 || (idx % block == block - 1 && idx < kept_before); });
    return src;
}

AttnResStack::AttnResStack(ParamTable& table, const ModelConfig& cfg, const TensorParallel& tp, const ModelPart& part)
    : cfg_(cfg),
      table_(&table),
      layers_(2 * cfg.n_layers),
      block_(cfg.attnres.resolved_block_size()),
      blend_(cfg.attnres.blend_at(0)),
      stats_layout_(layer_stats_layout(cfg)) {
    MT_CHECK(block_ >= 1, "attnres.block_size = {} must be >= 1", block_);
    const int64_t max_sources = cfg.attnres.max_sources(cfg.n_layers);
    MT_CHECK(max_sources <= ops::kAttnResMaxSources,
             "Block AttnRes over {} sub-layers in blocks of {} needs {} sources per mix; at most {} are supported "
             "(raise attnres.block_size)",
             layers_,
             block_,
             max_sources,
             ops::kAttnResMaxSources);
    head_ = part.chunks.empty();
    if (head_) held_ = {{0, layers_}};
    for (const auto& [first, last] : part.chunks) {
        held_.emplace_back(2 * first, 2 * last);
        head_ = head_ || last == cfg.n_layers;
    }
    // Under sequence parallelism each tp rank mixes its own rows: the queries' and key norms' gradients are parts.
    const TensorParallel rows = tp.splits_rows() ? tp : TensorParallel{};
    for (int64_t l = 1; l <= layers_ + 1; ++l) {
        if (!holds(l - 1)) {
            query_.push_back(-1), gain_.push_back(-1);
            continue;
        }
        const std::string p = "attnres.mix." + std::to_string(l);
        query_.push_back(table.add(tp_partial(
            {.name = p + ".query", .shape = {cfg.d_model}, .init = InitKind::zeros, .weight_decay = false}, rows)));
        gain_.push_back(table.add(tp_partial(
            {.name = p + ".key_norm", .shape = {cfg.d_model}, .init = InitKind::ones, .weight_decay = false}, rows)));
    }
}

bool AttnResStack::holds(int64_t l) const {
    if (l == layers_) return head_;
    for (const auto& [first, last] : held_)
        if (first <= l && l < last) return true;
    return false;
}

void AttnResStack::resize(int64_t n, const Precision& precision) {
    if (rows_ == n) return;
    rows_ = n;
    const core::Device dev = precision.device;
    auto act = [&] { return Tensor::zeros({n, cfg_.d_model}, precision.compute, dev); };
    auto acc = [&] { return Tensor::zeros({n, cfg_.d_model}, precision.master, dev); };
    partial_.assign(static_cast<size_t>(layers_), Tensor());
    d_partial_.assign(static_cast<size_t>(layers_), Tensor());
    mixed_.assign(static_cast<size_t>(layers_ + 1), Tensor());
    alpha_.assign(static_cast<size_t>(layers_ + 1), Tensor());
    drop_mixed_ = cfg_.recompute.drops(RecomputeModule::attnres);
    mixed_dropped_.assign(static_cast<size_t>(layers_), DropList());
    for (int64_t l = 0; l <= layers_; ++l) {
        if (!holds(l)) continue;
        const auto i = static_cast<size_t>(l);
        if (l < layers_) partial_[i] = act(), d_partial_[i] = acc();
        mixed_[i] = act();
        alpha_[i] = Tensor::zeros({n, static_cast<int64_t>(sources_of(l).size())}, precision.stats, dev);
        if (l < layers_ && drop_mixed_) {
            mixed_dropped_[i].add(&mixed_[i]);
            mixed_dropped_[i].release();
        }
    }
    d_embed_ = acc();
    d_branch_ = act();
    d_mixed_ = act();
    zero_ = precision.master != precision.compute ? act() : Tensor();
}

const Tensor& AttnResStack::source(const AttnResPass& pass, int64_t idx, const Tensor& e) const {
    if (pass.owns(idx)) return idx < 0 ? e : partial_[static_cast<size_t>(idx)];
    MT_CHECK(pass.carry && pass.carry->values.count(idx),
             "Block AttnRes: sub-layer {} reads source {}, which this pipeline stage neither computed nor received",
             pass.first,
             idx);
    return pass.carry->values.at(idx);
}

const Tensor& AttnResStack::source_grad(const AttnResPass& pass, int64_t idx) {
    if (pass.owns(idx)) return idx < 0 ? d_embed_ : d_partial_[static_cast<size_t>(idx)];
    MT_CHECK(pass.carry != nullptr, "Block AttnRes: source {} is outside the pass and there is no carry", idx);
    Tensor& g = pass.carry->grads[idx];
    if (!g.defined()) g = Tensor::zeros({rows_, cfg_.d_model}, d_embed_.dtype(), d_embed_.device());
    return g;
}

namespace {

// carry[idx] = t (a copy: the stack's buffers change with the next micro-batch's pass).
void keep(std::map<int64_t, Tensor>& carry, int64_t idx, const Tensor& t) {
    Tensor& kept = carry[idx];
    if (kept.defined() && kept.shape() == t.shape() && kept.dtype() == t.dtype())
        kept.copy_from(t);
    else
        kept = t.clone();
}

}  // namespace

void AttnResStack::forward(const AttnResPass& pass, const Tensor& e, const std::vector<Block*>& blocks, Workspace& ws) {
    const double eps = cfg_.norm_eps;
    auto mix = [&](int64_t l) {
        std::vector<Tensor> sources;
        for (int64_t idx : sources_of(l)) sources.push_back(source(pass, idx, e));
        const auto i = static_cast<size_t>(l);
        core::TraceRange range(e.device(), "attnres.mix_fwd");
        ops::attnres_mix_fwd(
            sources, table_->param(query_[i]), table_->param(gain_[i]), eps, mixed_[i], alpha_[i], blend_);
        if (!stats_.defined()) return;
        const int64_t at = stats_layout_.mix(l), m = static_cast<int64_t>(sources.size());
        ops::layer_stats_mix(alpha_[i], stats_.slice(0, at, at + m + 2));
        if (l >= 2 && l % 2 == 0) {  // the input of layer l / 2 (or the final mix): layer l / 2 - 1's output
            const int64_t act = stats_layout_.act(l / 2 - 1);
            ops::layer_stats_moments(mixed_[i], 0.0, stats_.slice(0, act, act + ops::kLayerStatsMoments));
        }
    };
    for (int64_t l = pass.first; l < pass.last; ++l) {
        const auto i = static_cast<size_t>(l);
        mixed_dropped_[i].restore();
        mix(l);
        Block& b = *blocks[static_cast<size_t>(l / 2)];
        if (l % block_ == 0) {
            b.branch_forward(static_cast<int>(l % 2), mixed_[i], partial_[i], ws);  // a new block starts at v_l
        } else {
            b.branch_forward(static_cast<int>(l % 2), mixed_[i], d_branch_, ws);  // d_branch_ as scratch for v_l
            ops::add_fwd(source(pass, l - 1, e), d_branch_, partial_[i]);
        }
        mixed_dropped_[i].release();
    }
    if (pass.head) {
        mix(layers_);
    } else if (pass.carry) {
        // What a later chunk reads: the embedding, the completed blocks, the cut block's partial sum.
        if (pass.embedding) keep(pass.carry->values, -1, e);
        for (int64_t l = pass.first; l < pass.last; ++l)
            if (l % block_ == block_ - 1 || l == pass.last - 1)
                keep(pass.carry->values, l, partial_[static_cast<size_t>(l)]);
    }
}

void AttnResStack::backward(const AttnResPass& pass,
                            const Tensor& e,
                            const std::vector<Block*>& blocks,
                            const Tensor& d_final,
                            const Tensor& de,
                            Workspace& ws) {
    const double eps = cfg_.norm_eps;
    // The pass's own sources start from the gradients the chunks after it left in the carry (taken out of it).
    auto start = [&](int64_t idx, const Tensor& acc) {
        acc.zero();
        if (!pass.carry) return;
        auto it = pass.carry->grads.find(idx);
        if (it == pass.carry->grads.end()) return;
        acc.copy_from(it->second);
        pass.carry->grads.erase(it);
    };
    if (pass.embedding) start(-1, d_embed_);
    for (int64_t l = pass.first; l < pass.last; ++l) start(l, d_partial_[static_cast<size_t>(l)]);
    // The accumulator rounded to the compute dtype (into scratch), or itself when the dtypes agree.
    auto compute_copy = [&](const Tensor& acc, const Tensor& scratch) -> const Tensor& {
        if (!zero_.defined()) return acc;
        ops::add_fwd(acc, zero_, scratch);
        return scratch;
    };
    auto mix_backward = [&](int64_t l, const Tensor& dh) {
        std::vector<Tensor> sources, grads;
        for (int64_t idx : sources_of(l)) {
            sources.push_back(source(pass, idx, e));
            grads.push_back(source_grad(pass, idx));
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
    if (pass.head) mix_backward(layers_, d_final);
    for (int64_t l = pass.last - 1; l >= pass.first; --l) {
        const auto i = static_cast<size_t>(l);
        // d_partial_[l] is complete: every later mix that reads it and the next partial sum of its block are done.
        // partial_[l] = partial_[l - 1] + v_l, so dv_l = d_partial_[l].
        Block& b = *blocks[static_cast<size_t>(l / 2)];
        if (drop_mixed_) {  // recompute attnres: h_l from its sources again (alpha_[l] is rewritten, unchanged)
            mixed_dropped_[i].restore();
            std::vector<Tensor> sources;
            for (int64_t idx : sources_of(l)) sources.push_back(source(pass, idx, e));
            core::TraceRange range(e.device(), "attnres.mix_fwd");
            ops::attnres_mix_fwd(
                sources, table_->param(query_[i]), table_->param(gain_[i]), eps, mixed_[i], alpha_[i], blend_);
        }
        b.branch_backward(static_cast<int>(l % 2), mixed_[i], compute_copy(d_partial_[i], d_branch_), d_mixed_, ws);
        mix_backward(l, d_mixed_);
        mixed_dropped_[i].release();
        if (l % block_ != 0) {
            const Tensor& d_prev = source_grad(pass, l - 1);
            ops::add_fwd(d_prev, d_partial_[i], d_prev);
        }
    }
    if (!pass.embedding) return;
    if (zero_.defined())
        ops::add_fwd(d_embed_, zero_, de);
    else
        de.copy_from(d_embed_);
}

std::vector<SavedTensor> AttnResStack::saved_for_backward() {
    std::vector<SavedTensor> saved;
    for (size_t l = 0; l < mixed_.size(); ++l) {
        if (!holds(static_cast<int64_t>(l))) continue;  // a mix of another pipeline stage
        if (l < partial_.size()) saved.push_back({"partial." + std::to_string(l), &partial_[l]});
        saved.push_back({"mixed." + std::to_string(l), &mixed_[l]});
        saved.push_back({"alpha." + std::to_string(l), &alpha_[l]});
    }
    return saved;
}

}  // namespace mt::nn
