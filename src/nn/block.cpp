// Transformer block forward and backward, side by side.
#include "nn/block.h"

#include "core/trace.h"
#include "ops/add.h"
#include "ops/layer_stats.h"
#include "ops/rmsnorm.h"

namespace mt::nn {

namespace {
// Under sequence parallelism each tp rank normalises its own rows: the gain's gradient is a part of the sum.
int add_norm(ParamTable& table, const std::string& name, int64_t dim, const TensorParallel& tp) {
    return table.add(tp_partial({.name = name, .shape = {dim}, .init = InitKind::ones, .weight_decay = false},
                                tp.splits_rows() ? tp : TensorParallel{}));
}

ModelConfig dense_ffn_config(ModelConfig cfg) {
    cfg.d_ff = cfg.dense_ffn_dim();
    return cfg;
}

// Under tensor parallelism the block holds the MoE layer's shared experts (split over tp): the layer gets none.
MoeConfig moe_layer_config(MoeConfig moe, const TensorParallel& tp) {
    if (tp.active()) moe.num_shared_experts = 0;
    return moe;
}

// The defined tensors of a saved list, but KDA's kept tiles (the KDA op allocates and frees those itself), with
// their shapes now: expert parallelism may have grown a buffer since the last time.
void list_saved(DropList& list, const std::vector<SavedTensor>& saved) {
    list.clear();
    for (const SavedTensor& s : saved)
        if (s.tensor->defined() && s.name.find("kept.") == std::string::npos) list.add(s.tensor);
}
}  // namespace

Block::Block(ParamTable& table,
             const std::string& prefix,
             const ModelConfig& cfg,
             Mixer mixer,
             bool moe,
             const MoeExpertParallel& ep,
             const TensorParallel& tp,
             const ContextParallel& cp)
    : cfg_(cfg),
      mixer_norm_(
          add_norm(table, prefix + (mixer == Mixer::kda ? ".kda_norm.weight" : ".attn_norm.weight"), cfg.d_model, tp)),
      mlp_norm_(add_norm(table, prefix + ".mlp_norm.weight", cfg.d_model, tp)),
      table_(&table),
      tp_(tp),
      mixer_(mixer),
      attn_(mixer != Mixer::kda ? std::make_optional<AttentionLayer>(
                                      table, prefix + ".attn", cfg, mixer == Mixer::window_attention, tp, cp)
                                : std::nullopt),
      kda_(mixer == Mixer::kda ? std::make_optional<KdaLayer>(table, prefix + ".kda", cfg, tp, cp) : std::nullopt),
      mlp_(moe ? std::nullopt : std::make_optional<Mlp>(table, prefix + ".mlp", dense_ffn_config(cfg), tp)),
      moe_(moe ? std::make_unique<MoeLayer>(table, prefix + ".moe", cfg, moe_layer_config(cfg.moe, tp), ep, tp)
               : nullptr) {
    if (moe_ && tp.active() && cfg.moe.num_shared_experts > 0) {
        ModelConfig shared = cfg;
        shared.d_ff = cfg.moe.expert_ffn_dim * cfg.moe.num_shared_experts;
        moe_shared_.emplace(table, prefix + ".moe.shared", shared, tp);
        moe_shared_->set_drop_act(cfg.recompute.drops(RecomputeModule::moe_act));
    }
    if (mlp_) mlp_->set_drop_act(cfg.recompute.drops(RecomputeModule::mlp_act));
    branch_recompute_ = cfg.recompute.full() && cfg.attnres.enabled();
}

void Block::ffn_forward(const Tensor& x, const Tensor& out) {
    if (moe_)
        moe_->forward(x, out, count_routing_);
    else
        mlp_->forward(x, out);
}

void Block::ffn_backward(const Tensor& x, const Tensor& dout, const Tensor& dx, Workspace& ws) {
    if (moe_)
        moe_->backward(x, dout, dx, ws);
    else
        mlp_->backward(x, dout, dx, ws);
}

void Block::resize(int64_t batch, int64_t seq, const Precision& precision) {
    full_rows_ = batch * seq;
    if (kda_)
        kda_->resize(batch, seq, precision);
    else
        attn_->resize(batch, seq, precision);
    if (moe_)  // under tp on this rank's own rows
        moe_->resize(full_rows_ / tp_.size, precision);
    else
        mlp_->resize(full_rows_, precision);
    if (moe_shared_) moe_shared_->resize(full_rows_, precision);
    const int64_t n = tp_.stream_rows(full_rows_);
    if (rows_ == n) return;
    rows_ = n;
    const core::DType dtype = precision.compute;
    const core::Device dev = precision.device;
    if (tp_.splits_rows())
        for (Tensor& g : gathered_) g = Tensor::zeros({full_rows_, cfg_.d_model}, dtype, dev);
    norm1_ = Tensor::zeros({n, cfg_.d_model}, dtype, dev);
    norm2_ = Tensor::zeros({n, cfg_.d_model}, dtype, dev);
    rstd1_ = Tensor::zeros({n}, precision.stats, dev);
    rstd2_ = Tensor::zeros({n}, precision.stats, dev);
    // Under Block AttnRes the stack drives the two branches (branch_forward) and holds the residual stream itself:
    // the block's own h and output would never be written.
    if (!cfg_.attnres.enabled()) {
        h_ = Tensor::zeros({n, cfg_.d_model}, dtype, dev);
        out_ = Tensor::zeros({n, cfg_.d_model}, dtype, dev);
    }
    all_dropped_.clear();
    for (DropList& d : norm_dropped_) d.clear();
    if (cfg_.recompute.drops(RecomputeModule::norm)) {
        norm_dropped_[0].add(&norm1_), norm_dropped_[1].add(&norm2_);
        if (tp_.splits_rows()) norm_dropped_[0].add(&gathered_[0]), norm_dropped_[1].add(&gathered_[1]);
        for (DropList& d : norm_dropped_) d.release();
    }
    for (int sub = 0; sub < 2 && branch_recompute_; ++sub) {  // allocated by each sub-layer's forward when it runs
        list_saved(branch_dropped_[sub], branch_saved(sub));
        branch_dropped_[sub].release();
    }
}

void Block::release_activations(bool output) {
    list_saved(all_dropped_, saved_for_backward());
    all_dropped_.release();
    if (output) out_ = Tensor();
}

void Block::restore_activations() {
    all_dropped_.restore();
    if (!out_.defined()) out_ = Tensor::scratch(h_.shape(), h_.dtype(), h_.device());
}

void Block::reserve_scratch(Workspace& ws) const {
    if (kda_)
        kda_->reserve_scratch(ws);
    else
        attn_->reserve_scratch(ws);
    if (moe_)
        moe_->reserve_scratch(ws);
    else
        mlp_->reserve_scratch(ws);
    if (moe_shared_) moe_shared_->reserve_scratch(ws);
}

// The plain residual stream: each sub-layer (branch_forward / branch_backward below) adds to it.
void Block::forward(const Tensor& x, Workspace& ws) {
    const Tensor branch = ws.d_tmp.slice(0, 0, rows_);  // scratch: a branch output is not needed by backward
    branch_forward(0, x, branch, ws);
    branch_forward(1, x, branch, ws, branch, h_);  // h_ = x + mixer branch, summed inside the FFN's norm
    ops::add_fwd(h_, branch, out_);
    if (collecting_stats()) ops::layer_stats_moments(out_, 0.0, stats_.slice(0, 0, ops::kLayerStatsMoments));
}

void Block::backward(const Tensor& x, const Tensor& dout, const Tensor& dx, Workspace& ws) {
    // FFN branch: dh = dout + d(norm2)/dh, held in dx; then the mixer branch in place: dx = dh + d(norm1)/dx. The
    // residual path's gradient is added inside each norm's backward, not by separate adds.
    branch_backward(1, h_, dout, dx, ws, dout);
    branch_backward(0, x, dx, dx, ws, dx);
}

void Block::branch_forward(
    int sub, const Tensor& h, const Tensor& out, Workspace& ws, const Tensor& residual, const Tensor& sum) {
    MT_CHECK(sub == 1 || !residual.defined(), "Block::branch_forward: only the FFN branch takes a residual to add");
    if (branch_recompute_) branch_dropped_[sub].restore();
    if (sub == 0)
        mixer_forward(h, out);
    else
        ffn_branch_forward(h, out, residual, sum);
    if (branch_recompute_ && !recomputing_) {
        list_saved(branch_dropped_[sub], branch_saved(sub));
        branch_dropped_[sub].release();
    }
}

void Block::mixer_forward(const Tensor& h, const Tensor& out) {
    core::TraceRange range(h.device(), kda_ ? "block.kda_fwd" : "block.attn_fwd");
    norm_dropped_[0].restore();
    ops::rmsnorm_fwd(h, table_->param(mixer_norm_), cfg_.norm_eps, norm1_, rstd1_);
    const Tensor& in = region_input(0);
    const Tensor y = region_output(out);
    if (kda_) {
        kda_->set_layer_stats(collecting_stats() ? stats_.slice(0, 4, 8) : Tensor(), stats_kda_low_);
        kda_->forward(in, y, keep_);
    } else {
        attn_->forward(in, y);
    }
    tp_sum_rows(tp_, y, out);
    norm_dropped_[0].release();
}

const Tensor& Block::region_input(int sub) {
    const Tensor& norm = sub == 0 ? norm1_ : norm2_;
    if (!tp_.splits_rows()) return norm;
    tp_gather_rows(tp_, norm, gathered_[sub]);
    return gathered_[sub];
}

Tensor Block::region_output(const Tensor& out) const {
    return tp_.splits_rows() ? Tensor::scratch({full_rows_, cfg_.d_model}, out.dtype(), out.device()) : out;
}

Tensor Block::region_backward(int sub, const Tensor& dout, Workspace& ws) {
    const Tensor& in = tp_.splits_rows() ? gathered_[sub] : (sub == 0 ? norm1_ : norm2_);
    // Sequence parallelism: the output's gradient gathered to every row, the input's reduce-scattered back.
    Tensor dy = dout, dx = ws.d_norm;
    if (tp_.splits_rows()) {
        dy = Tensor::scratch({full_rows_, cfg_.d_model}, dout.dtype(), dout.device());
        tp_gather_rows(tp_, dout, dy);
        dx = Tensor::scratch(dy.shape(), dy.dtype(), dy.device());
    }
    if (sub == 0 && kda_)
        kda_->backward(in, dy, dx, ws);
    else if (sub == 0)
        attn_->backward(in, dy, dx, ws);
    else
        ffn_backward(in, dy, dx, ws);
    const Tensor dnorm = ws.d_norm.slice(0, 0, rows_);
    tp_sum_rows(tp_, dx, dnorm);
    return dnorm;
}

void Block::ffn_branch_forward(const Tensor& h, const Tensor& out, const Tensor& residual, const Tensor& sum) {
    core::TraceRange range(h.device(), moe_ ? "block.moe_fwd" : "block.mlp_fwd");
    norm_dropped_[1].restore();
    // residual may alias out: the norm reads it before the FFN writes out.
    ops::rmsnorm_fwd(h, table_->param(mlp_norm_), cfg_.norm_eps, norm2_, rstd2_, residual, sum);
    if (moe_ && tp_.active()) {
        moe_tp_forward(out);
    } else {
        const Tensor& in = region_input(1);
        const Tensor y = region_output(out);
        ffn_forward(in, y);
        tp_sum_rows(tp_, y, out);
    }
    norm_dropped_[1].release();
}

void Block::moe_tp_forward(const Tensor& out) {
    // Routed: this rank's own rows (the stream rows under sequence parallelism; else a slice, gathered after).
    const Tensor own = tp_.splits_rows() ? norm2_ : tp_own_rows(tp_, norm2_);
    const Tensor routed = tp_.splits_rows() ? out : Tensor::scratch(own.shape(), out.dtype(), out.device());
    moe_->forward(own, routed, count_routing_);
    if (!tp_.splits_rows()) tp_gather_own_rows(tp_, routed, out);
    if (!moe_shared_) return;
    const Tensor y = Tensor::scratch({full_rows_, cfg_.d_model}, out.dtype(), out.device());
    moe_shared_->forward(region_input(1), y);
    const Tensor sum = tp_.splits_rows() ? Tensor::scratch(out.shape(), out.dtype(), out.device()) : y;
    tp_sum_rows(tp_, y, sum);
    ops::add_fwd(out, sum, out);
}

Tensor Block::moe_tp_backward(const Tensor& dout, Workspace& ws) {
    const Tensor dnorm = ws.d_norm.slice(0, 0, rows_);
    if (tp_.splits_rows()) {
        moe_->backward(norm2_, dout, dnorm, ws);
    } else {
        const Tensor d_own = Tensor::scratch({full_rows_ / tp_.size, cfg_.d_model}, dout.dtype(), dout.device());
        moe_->backward(tp_own_rows(tp_, norm2_), tp_own_rows(tp_, dout), d_own, ws);
        tp_gather_own_rows(tp_, d_own, dnorm);
    }
    if (!moe_shared_) return dnorm;
    Tensor dy = dout;
    if (tp_.splits_rows()) {
        dy = Tensor::scratch({full_rows_, cfg_.d_model}, dout.dtype(), dout.device());
        tp_gather_rows(tp_, dout, dy);
    }
    const Tensor dx = Tensor::scratch(dy.shape(), dy.dtype(), dy.device());
    moe_shared_->backward(tp_.splits_rows() ? gathered_[1] : norm2_, dy, dx, ws);
    const Tensor sum = tp_.splits_rows() ? Tensor::scratch(dnorm.shape(), dnorm.dtype(), dnorm.device()) : dx;
    tp_sum_rows(tp_, dx, sum);
    ops::add_fwd(dnorm, sum, dnorm);
    return dnorm;
}

void Block::branch_backward(
    int sub, const Tensor& h, const Tensor& dout, const Tensor& dh, Workspace& ws, const Tensor& dresidual) {
    if (branch_recompute_) {  // recompute full under AttnRes: the sub-layer's forward again (its output unused)
        branch_dropped_[sub].restore();
        const bool count = count_routing_, keep = keep_;
        recomputing_ = true, count_routing_ = false, keep_ = true;
        branch_forward(sub, h, ws.d_tmp.slice(0, 0, rows_), ws);
        recomputing_ = false, count_routing_ = count, keep_ = keep;
    }
    if (sub == 0) {
        core::TraceRange range(h.device(), kda_ ? "block.kda_bwd" : "block.attn_bwd");
        if (!norm_dropped_[0].empty()) {  // recompute norm
            norm_dropped_[0].restore();
            ops::rmsnorm_fwd(h, table_->param(mixer_norm_), cfg_.norm_eps, norm1_, rstd1_);
            region_input(0);
        }
        const Tensor dnorm = region_backward(0, dout, ws);
        ops::rmsnorm_bwd(h, table_->param(mixer_norm_), rstd1_, dnorm, dh, table_->grad(mixer_norm_), dresidual);
        norm_dropped_[0].release();
        if (branch_recompute_) branch_dropped_[0].release();
        return;
    }
    core::TraceRange range(h.device(), moe_ ? "block.moe_bwd" : "block.mlp_bwd");
    if (!norm_dropped_[1].empty()) {  // recompute norm
        norm_dropped_[1].restore();
        ops::rmsnorm_fwd(h, table_->param(mlp_norm_), cfg_.norm_eps, norm2_, rstd2_);
        region_input(1);
    }
    const Tensor dnorm = moe_ && tp_.active() ? moe_tp_backward(dout, ws) : region_backward(1, dout, ws);
    ops::rmsnorm_bwd(h, table_->param(mlp_norm_), rstd2_, dnorm, dh, table_->grad(mlp_norm_), dresidual);
    norm_dropped_[1].release();
    if (branch_recompute_) branch_dropped_[1].release();
}

std::vector<SavedTensor> Block::branch_saved(int sub) {
    std::vector<SavedTensor> saved;
    if (sub == 0) {
        saved = {{"norm1", &norm1_}, {"rstd1", &rstd1_}};
        if (tp_.splits_rows()) saved.push_back({"gathered1", &gathered_[0]});
        if (kda_)
            for (auto& s : kda_->saved_for_backward()) saved.push_back({"kda." + s.name, s.tensor});
        else
            for (auto& s : attn_->saved_for_backward()) saved.push_back({"attn." + s.name, s.tensor});
        return saved;
    }
    saved = {{"norm2", &norm2_}, {"rstd2", &rstd2_}};
    if (tp_.splits_rows()) saved.push_back({"gathered2", &gathered_[1]});
    if (moe_)
        for (auto& s : moe_->saved_for_backward()) saved.push_back({"moe." + s.name, s.tensor});
    if (moe_shared_)
        for (auto& s : moe_shared_->saved_for_backward()) saved.push_back({"moe.shared." + s.name, s.tensor});
    if (!moe_)
        for (auto& s : mlp_->saved_for_backward()) saved.push_back({"mlp." + s.name, s.tensor});
    return saved;
}

std::vector<SavedTensor> Block::saved_for_backward() {
    std::vector<SavedTensor> saved = branch_saved(0);
    saved.push_back({"h", &h_});
    for (const SavedTensor& s : branch_saved(1)) saved.push_back(s);
    return saved;
}

}  // namespace mt::nn
