// KDA layer forward and backward, side by side (the op sequence of kda.md §1).
#include "nn/layers/kda_layer.h"

#include <algorithm>
#include <cmath>
#include <initializer_list>

#include "nn/layers/conv_halo.h"
#include "ops/l2norm.h"
#include "ops/layer_stats.h"
#include "ops/rmsnorm.h"
#include "ops/sigmoid.h"
#include "ops/sigmoid_gate.h"

namespace mt::nn {

namespace {
constexpr double kL2Eps = 1e-6;  // kda.md §1: k / sqrt(|k|^2 + 1e-6)
}

KdaLayer::KdaLayer(ParamTable& table,
                   const std::string& prefix,
                   const ModelConfig& cfg,
                   const TensorParallel& tp,
                   const ContextParallel& cp)
    : cfg_(cfg), table_(&table), cp_(cp, cfg.kda.conv_size - 1) {
    using Split = Linear::Split;
    const KdaConfig& kda = cfg.kda;
    // This rank's heads (all of them without tp); the declarations below name the global sizes.
    const int64_t h_all = cfg.kda_num_heads(), hv_all = cfg.kda_num_v_heads();
    h_ = tp.shard(h_all);
    hv_ = tp.shard(hv_all);
    k_dim_ = cfg.kda_head_dim();
    v_dim_ = cfg.kda_head_v_dim();
    MT_CHECK(hv_ % h_ == 0, "{}: kda.num_v_heads = {} must be a multiple of kda.num_heads = {}", prefix, hv_, h_);
    MT_CHECK(kda.conv_size >= 1, "{}: kda.conv_size = {} must be >= 1", prefix, kda.conv_size);
    const bool bounded = kda.gate == ops::KdaGateKind::lower_bound;
    gate_options_ = {kda.gate, kda.gate_lower_bound, kda.gate_use_a_log};
    // The bounded gate keeps 15 |g| inside f32's exp range, so the diagonal tiles can be plain products; the
    // softplus gate needs the pairwise diagonal (kda.md §4.3).
    kda_options_ = {.algorithm = kda.algorithm,
                    .diagonal = bounded ? ops::KdaDiagonal::matmul : ops::KdaDiagonal::pairwise,
                    .chunk_size = kda.chunk_size,
                    .save_states = kda.save == KdaSave::states,
                    .save_workspace = kda.save == KdaSave::workspace,
                    .save_states_bf16 = kda.save == KdaSave::states_bf16};
    keep_saved_ = kda.save != KdaSave::none;

    const int64_t d = cfg.d_model, hk = h_all * k_dim_, hvk = hv_all * k_dim_, hvv = hv_all * v_dim_;
    const double init_std = cfg.init_std;
    wq_ = Linear(table, prefix + ".q_proj", d, hk, init_std, tp, Split::column, 1, k_dim_);
    wk_ = Linear(table, prefix + ".k_proj", d, hk, init_std, tp, Split::column, 1, k_dim_);
    wv_ = Linear(table, prefix + ".v_proj", d, hvv, init_std, tp, Split::column, 1, v_dim_);
    const double conv_std = 1.0 / std::sqrt(static_cast<double>(kda.conv_size));
    auto conv = [&](const char* name, int64_t c) {  // per channel: split with the channels' heads
        return table.add(tp_split({.name = prefix + name, .shape = {c, kda.conv_size}, .init_std = conv_std}, tp, 0));
    };
    conv_q_ = conv(".q_conv1d.weight", hk);
    conv_k_ = conv(".k_conv1d.weight", hk);
    conv_v_ = conv(".v_conv1d.weight", hvv);
    wfa_ = Linear(table, prefix + ".f_a_proj", d, k_dim_, init_std, tp, Split::partial);
    wfb_ = Linear(table, prefix + ".f_b_proj", k_dim_, hvk, init_std, tp, Split::column);
    // kda.md §3: A_log = 0 (a = 1) for the bounded gate, log U(1, 16) for softplus; dt_bias = softplus^-1(delta),
    // delta log-uniform in [1e-3, 1e-1].
    a_log_ = table.add(tp_split({.name = prefix + ".A_log",
                                 .shape = {hv_all},
                                 .init = bounded ? InitKind::zeros : InitKind::log_uniform,
                                 .init_lo = 1.0,
                                 .init_hi = 16.0,
                                 .weight_decay = false},
                                tp,
                                0));
    dt_bias_ = table.add(tp_split({.name = prefix + ".dt_bias",
                                   .shape = {hvk},
                                   .init = InitKind::softplus_inv_log_uniform,
                                   .init_lo = 1e-3,
                                   .init_hi = 1e-1,
                                   .weight_decay = false},
                                  tp,
                                  0));
    wb_ = Linear(table, prefix + ".b_proj", d, hv_all, init_std, tp, Split::column);
    wga_ = Linear(table, prefix + ".g_a_proj", d, v_dim_, init_std, tp, Split::partial);
    wgb_ = Linear(table, prefix + ".g_b_proj", v_dim_, hvv, init_std, tp, Split::column);
    o_norm_ = table.add(tp_partial(
        {.name = prefix + ".o_norm.weight", .shape = {v_dim_}, .init = InitKind::ones, .weight_decay = false}, tp));
    wo_ = Linear(table,
                 prefix + ".o_proj",
                 hvv,
                 d,
                 init_std / std::sqrt(2.0 * static_cast<double>(cfg.n_layers)),
                 tp,
                 Split::row);
}

void KdaLayer::resize(int64_t batch, int64_t seq, const Precision& precision) {
    if (batch == batch_ && seq == seq_ && (q_.defined() || !dropped_.empty())) return;
    batch_ = batch;
    seq_ = seq;
    const int64_t n = batch * seq, hk = h_ * k_dim_, hvk = hv_ * k_dim_, hvv = hv_ * v_dim_;
    const core::DType dt = precision.compute;
    act_dtype_ = dt;
    const core::Device dev = precision.device;
    device_ = dev;
    auto z = [&](const Shape& s) { return Tensor::zeros(s, dt, dev); };
    qp_ = z({n, hk}), kp_ = z({n, hk}), vp_ = z({n, hvv});
    qc_ = z({batch, seq, hk}), kc_ = z({batch, seq, hk}), vc_ = z({batch, seq, hvv});
    // Statistics and states in the statistics dtype (f32 under mixed precision, as the CUDA ops require).
    auto zs = [&](const Shape& s) { return Tensor::zeros(s, precision.stats, dev); };
    q_ = z({batch, seq, h_, k_dim_}), k_ = z({batch, seq, h_, k_dim_}), rq_ = zs({n * h_}), rk_ = zs({n * h_});
    bl_ = z({n, hv_}), beta_ = z({batch, seq, hv_});
    fa_ = z({n, k_dim_}), u_ = z({n, hvk}), g_ = z({batch, seq, hv_, k_dim_});
    o_ = z({batch, seq, hv_, v_dim_}), st_ = zs({batch, hv_, k_dim_, v_dim_});
    on_ = z({n, hvv}), rstd_ = Tensor::zeros({n * hv_}, precision.stats, dev);
    ga_ = z({n, v_dim_}), gz_ = z({n, hvv}), y_ = z({n, hvv});
    ds0_ = Tensor();
    dropped_.clear();
    if (cfg_.recompute.drops(RecomputeModule::kda))
        for (const SavedTensor& s : saved_for_backward())
            if (s.tensor->defined() && !s.name.starts_with("kept.")) dropped_.add(s.tensor);
    dropped_.release();  // allocated in the forward that needs them, so that no two layers hold them at once
}

void KdaLayer::set_initial_state(const Tensor& s0) {
    s0_ = s0;
}

void KdaLayer::set_final_state_grad(const Tensor& dst) {
    dst_ = dst;
}

void KdaLayer::set_segment(const SegmentContext& seg) {
    seg_ = seg;
    if (!seg.active()) {
        seg_s0_.clear(), seg_halo_.clear();
        next_s0_ = pending_dst_ = seg_final_ = conv_doc_start_ = cur_s0_ = Tensor();
        next_halo_ = pending_dhalo_ = cur_halo_ = {};
        return;
    }
    MT_CHECK(seg.length == seq_ * cp_.ranks(),
             "KDA segment of {} tokens on a layer sized for {} over {} cp ranks",
             seg.length,
             seq_,
             cp_.ranks());
    const auto j = static_cast<size_t>(seg.index);
    if (seg.index == 0 && !seg.recompute) {  // a new sequence
        seg_s0_.assign(static_cast<size_t>(seg.count), Tensor());
        seg_halo_.assign(static_cast<size_t>(seg.count), {});
    }
    doc_start_rows_.clear();
    conv_doc_start_ = Tensor();
    if (seg.index == 0) return;
    const int64_t w1 = cfg_.kda.conv_size - 1;
    MT_CHECK(seg.first >= w1, "KDA segment at {}: the segments before it need >= {} tokens", seg.first, w1);
    if (seg.host_doc_start.defined()) {
        const int32_t* map = seg.host_doc_start.data<int32_t>();
        for (int64_t b = 0; b < batch_; ++b)
            if (map[b * seg.total + seg.first] == seg.first) doc_start_rows_.push_back(b);
        if (w1 > 0) conv_doc_start_ = doc_map_from(seg.host_doc_start, seg.first - w1, seg.first + seg.length, device_);
    }
    if (!seg.recompute) {
        // A document that starts at the segment does not continue the state: its row starts from zero. With
        // long.offload_kv the kept state and halos wait in pinned host memory for the backward's re-run.
        for (int64_t b : doc_start_rows_) next_s0_.select(0, b).zero();
        seg_s0_[j] = keep_for_later(next_s0_, cfg_.segments.offload_kv);
        for (size_t i = 0; i < 3; ++i) seg_halo_[j][i] = keep_for_later(next_halo_[i], cfg_.segments.offload_kv);
    }
    cur_s0_ = on_device(seg_s0_[j], device_);
    for (size_t i = 0; i < 3; ++i) cur_halo_[i] = on_device(seg_halo_[j][i], device_);
}

void KdaLayer::keep_for_next_segment() {
    if (seg_.index == seg_.count - 1) {
        seg_final_ = st_.clone();
        return;
    }
    next_s0_ = st_.clone();
    const int64_t w1 = cfg_.kda.conv_size - 1;
    if (w1 == 0) return;
    const Tensor* proj[3] = {&qp_, &kp_, &vp_};
    for (int i = 0; i < 3; ++i) {
        const Tensor xp = proj[i]->reshape({batch_, seq_, proj[i]->size(1)});
        next_halo_[static_cast<size_t>(i)] = Tensor::scratch({batch_, w1, xp.size(2)}, act_dtype_, device_);
        copy_time_rows(next_halo_[static_cast<size_t>(i)], 0, xp, seq_ - w1, w1);
    }
}

void KdaLayer::conv_forward(int which, const Tensor& xp, const Tensor& y) {
    const int conv[3] = {conv_q_, conv_k_, conv_v_};
    const Tensor w = table_->param(conv[which]), x = xp.reshape(y.shape());
    if (cp_.active()) {
        cp_.conv_forward(which, x, w, y);
        return;
    }
    // A later segment's rows read the W - 1 rows of the segment before.
    const bool halo = has_halo();
    conv_halo_forward(halo ? cur_halo_[static_cast<size_t>(which)] : Tensor(),
                      x,
                      w,
                      y,
                      halo ? conv_doc_start_ : kda_options_.doc_start);
}

void KdaLayer::conv_backward(int which, const Tensor& xp, const Tensor& dy, const Tensor& dxp, Tensor& dhalo) {
    const int conv[3] = {conv_q_, conv_k_, conv_v_};
    const Tensor w = table_->param(conv[which]), dw = table_->grad(conv[which]);
    const Shape shape = {batch_, seq_, xp.size(1)};
    const Tensor x = xp.reshape(shape), dy3 = dy.reshape(shape), dx3 = dxp.reshape(shape);
    if (cp_.active()) {
        cp_.conv_backward(which, x, w, dy3, dx3, dw);
        return;
    }
    const bool halo = has_halo();
    dhalo = conv_halo_backward(halo ? cur_halo_[static_cast<size_t>(which)] : Tensor(),
                               x,
                               w,
                               dy3,
                               dx3,
                               dw,
                               halo ? conv_doc_start_ : kda_options_.doc_start);
}

void KdaLayer::forward(const Tensor& x, const Tensor& out, bool training) {
    dropped_.restore();
    // Under recompute kda the backward re-runs this forward, which keeps the tiles then: none are kept now.
    forward_core(x, training && dropped_.empty());
    if (seg_.active() && !seg_.recompute) keep_for_next_segment();
    wo_.forward(y_, out);
    dropped_.release();
}

void KdaLayer::forward_core(const Tensor& x, bool keep) {
    const int64_t n = batch_ * seq_;
    const double q_scale = 1.0 / std::sqrt(static_cast<double>(k_dim_));
    auto rows = [](const Tensor& t, int64_t r) { return t.reshape({r, t.numel() / r}); };
    // q, k, v: projection, causal conv + SiLU, L2 norm of q and k per head
    wq_.forward(x, qp_);
    wk_.forward(x, kp_);
    wv_.forward(x, vp_);
    if (cp_.active()) {  // a segment after the first continues the one before's state and halo (kda_cp.h)
        cp_.set_carry(start_state(), has_halo() ? cur_halo_ : std::array<Tensor, 3>{});
        cp_.exchange_halos({seq_rows(qp_), seq_rows(kp_), seq_rows(vp_)});
    }
    conv_forward(0, qp_, qc_);
    conv_forward(1, kp_, kc_);
    conv_forward(2, vp_, vc_);
    ops::l2norm_fwd(rows(qc_, n * h_), q_scale, kL2Eps, rows(q_, n * h_), rq_);
    ops::l2norm_fwd(rows(kc_, n * h_), 1.0, kL2Eps, rows(k_, n * h_), rk_);
    // beta and the gate
    wb_.forward(x, bl_);
    ops::sigmoid_fwd(bl_, rows(beta_, n));
    wfa_.forward(x, fa_);
    wfb_.forward(fa_, u_);
    const Tensor a_log = gate_options_.use_a_log ? table_->param(a_log_) : Tensor();
    const Tensor bias = table_->param(dt_bias_).reshape({hv_, k_dim_});
    ops::kda_gate_fwd(u_.reshape({n, hv_, k_dim_}), a_log, bias, g_.reshape({n, hv_, k_dim_}), gate_options_);
    if (stats_.defined()) ops::layer_stats_moments(g_, stats_low_, stats_);
    // the recurrence
    const Tensor v = vc_.reshape({batch_, seq_, hv_, v_dim_});
    if (!keep) kept_ = ops::KdaSaved{};
    if (cp_.active()) {
        MT_CHECK(!s0_.defined(), "KDA under context parallelism starts every sequence from the zero state");
        cp_.forward(q_, k_, v, g_, beta_, kda_options_, o_, st_);
    } else {
        ops::kda_fwd(
            q_, k_, v, g_, beta_, start_state(), o_, st_, kda_options_, keep_saved_ && keep ? &kept_ : nullptr);
    }
    // output norm per head, sigmoid output gate, output projection
    ops::rmsnorm_fwd(rows(o_, n * hv_), table_->param(o_norm_), cfg_.norm_eps, rows(on_, n * hv_), rstd_);
    wga_.forward(x, ga_);
    wgb_.forward(ga_, gz_);
    ops::sigmoid_gate_fwd(on_, gz_, y_);
}

// Workspace slots, by lifetime (a slot is reused once its tensor is dead; the numbers in brackets are the steps
// below that write and last read it):
//   0  d_y [1-2], d_ga [3-4], d_o [5-6], d_u [7-8], d_bl [10-11], d_qc [12-13]
//   1  d_on [2-5], d_q [6-12], d_qp [13-14]
//   2  d_gz [2-3], d_k [6-12], d_kp [13-14]
//   3  d_v [6-13]
//   4  d_g [6-7], d_fa [8-9], d_kc [12-13]
//   5  d_beta [6-10], d_vp [13-14]
void KdaLayer::reserve_scratch(Workspace& ws) const {
    const int64_t n = batch_ * seq_, hk = h_ * k_dim_, hvk = hv_ * k_dim_, hvv = hv_ * v_dim_;
    const auto bytes = [&](std::initializer_list<int64_t> widths) {
        return static_cast<size_t>(n * std::max(widths)) * core::dtype_size(act_dtype_);
    };
    ws.reserve_slot(0, bytes({hvv, v_dim_, hvk, hv_, hk}));
    ws.reserve_slot(1, bytes({hvv, hk}));
    ws.reserve_slot(2, bytes({hvv, hk}));
    ws.reserve_slot(3, bytes({hvv}));
    ws.reserve_slot(4, bytes({hvk, k_dim_, hk}));
    ws.reserve_slot(5, bytes({hv_, hvv}));
}

void KdaLayer::backward(const Tensor& x, const Tensor& dout, const Tensor& dx, Workspace& ws) {
    if (!dropped_.empty()) {  // recompute kda
        dropped_.restore();
        forward_core(x, true);
    }
    const int64_t n = batch_ * seq_, hk = h_ * k_dim_, hvk = hv_ * k_dim_, hvv = hv_ * v_dim_;
    const double q_scale = 1.0 / std::sqrt(static_cast<double>(k_dim_));
    auto rows = [](const Tensor& t, int64_t r) { return t.reshape({r, t.numel() / r}); };
    auto seq3 = [&](const Tensor& t) { return t.reshape({batch_, seq_, t.numel() / n}); };
    auto scratch = [&](int slot, const Shape& shape) { return ws.slot(slot, shape, act_dtype_, x.device()); };
    // x feeds six projections: after the first, each adds its gradient into dx inside its matmul.
    auto add_dx = [&](const Linear& w, const Tensor& input, const Tensor& dy) {
        w.backward(input, dy, dx, /*accumulate_dx=*/true);
    };
    // output projection, gate, norm (steps 1-5)
    const Tensor d_y = scratch(0, {n, hvv});
    wo_.backward(y_, dout, d_y);
    const Tensor d_on = scratch(1, {n, hvv}), d_gz = scratch(2, {n, hvv});
    ops::sigmoid_gate_bwd(on_, gz_, d_y, d_on, d_gz);
    const Tensor d_ga = scratch(0, {n, v_dim_});
    wgb_.backward(ga_, d_gz, d_ga);
    wga_.backward(x, d_ga, dx);  // the first contribution writes dx
    const Tensor d_o = scratch(0, o_.shape());
    ops::rmsnorm_bwd(rows(o_, n * hv_),
                     table_->param(o_norm_),
                     rstd_,
                     rows(d_on, n * hv_),
                     rows(d_o, n * hv_),
                     table_->grad(o_norm_));
    // the recurrence (step 6). With segments the last one's dS_T is the caller's, every other one's is the next
    // segment's dS_0.
    const bool last_segment = !seg_.active() || seg_.index == seg_.count - 1;
    if (last_segment) pending_dst_ = Tensor(), pending_dhalo_ = {};
    const Tensor& s0 = start_state();
    const Tensor dst = last_segment ? dst_ : pending_dst_;
    if (s0.defined() && (!ds0_.defined() || ds0_.shape() != s0.shape()))
        ds0_ = Tensor::zeros(s0.shape(), s0.dtype(), s0.device());
    if (!s0.defined()) ds0_ = Tensor();
    const Tensor v = vc_.reshape({batch_, seq_, hv_, v_dim_});
    const Tensor d_q = scratch(1, q_.shape()), d_k = scratch(2, k_.shape()), d_v = scratch(3, o_.shape());
    const Tensor d_g = scratch(4, g_.shape()), d_beta = scratch(5, beta_.shape());
    if (cp_.active()) {
        MT_CHECK(!dst_.defined(), "KDA under context parallelism takes no final-state gradient");
        // With segments ds0_ is the start state's gradient on the ranks that carry it (kda_cp.h), else undefined.
        ds0_ = cp_.backward(q_, k_, v, g_, beta_, kda_options_, d_o, d_q, d_k, d_v, d_g, d_beta, dst);
    } else {
        ops::kda_bwd(q_, k_, v, g_, beta_, s0, d_o, dst, d_q, d_k, d_v, d_g, d_beta, ds0_, kda_options_, &kept_);
    }
    kept_ = ops::KdaSaved{};  // used once: freed for the next layer's backward (a second backward recomputes)
    if (seg_.active() && seg_.index > 0) {  // the previous segment's dS_T (zero where this one's s0 row was)
        pending_dst_ = ds0_.defined() ? ds0_.clone() : Tensor();
        if (pending_dst_.defined())
            for (int64_t b : doc_start_rows_) pending_dst_.select(0, b).zero();
    }
    // gate and beta (steps 7-11)
    const Tensor a_log = gate_options_.use_a_log ? table_->param(a_log_) : Tensor();
    const Tensor da_log = gate_options_.use_a_log ? table_->grad(a_log_) : Tensor();
    const Tensor d_u = scratch(0, {n, hvk});
    ops::kda_gate_bwd(u_.reshape({n, hv_, k_dim_}),
                      a_log,
                      table_->param(dt_bias_).reshape({hv_, k_dim_}),
                      d_g.reshape({n, hv_, k_dim_}),
                      d_u.reshape({n, hv_, k_dim_}),
                      da_log,
                      table_->grad(dt_bias_).reshape({hv_, k_dim_}),
                      gate_options_);
    const Tensor d_fa = scratch(4, {n, k_dim_});
    wfb_.backward(fa_, d_u, d_fa);
    add_dx(wfa_, x, d_fa);
    const Tensor d_bl = scratch(0, {n, hv_});
    ops::sigmoid_bwd(rows(beta_, n), rows(d_beta, n), d_bl);
    add_dx(wb_, x, d_bl);
    // L2 norms, convs, projections (steps 12-14)
    const Tensor d_qc = scratch(0, {n, hk}), d_kc = scratch(4, {n, hk});
    ops::l2norm_bwd(rows(qc_, n * h_), rq_, q_scale, rows(d_q, n * h_), rows(d_qc, n * h_));
    ops::l2norm_bwd(rows(kc_, n * h_), rk_, 1.0, rows(d_k, n * h_), rows(d_kc, n * h_));
    const Tensor d_qp = scratch(1, {n, hk}), d_kp = scratch(2, {n, hk}), d_vp = scratch(5, {n, hvv});
    std::array<Tensor, 3> dhalo;
    conv_backward(0, qp_, d_qc, d_qp, dhalo[0]);
    conv_backward(1, kp_, d_kc, d_kp, dhalo[1]);
    conv_backward(2, vp_, rows(d_v, n), d_vp, dhalo[2]);
    // The next segment's convs read this one's last W - 1 projection rows: their gradient joins here.
    const Tensor* d_proj[3] = {&d_qp, &d_kp, &d_vp};
    for (size_t i = 0; i < 3; ++i)
        if (pending_dhalo_[i].defined()) {
            const int64_t w1 = pending_dhalo_[i].size(1);
            add_time_rows(seq3(*d_proj[i]), seq_ - w1, pending_dhalo_[i], 0, w1);
        }
    if (cp_.active()) dhalo = cp_.return_halo_grads({seq3(d_qp), seq3(d_kp), seq3(d_vp)});
    pending_dhalo_ = dhalo;
    add_dx(wq_, x, d_qp);
    add_dx(wk_, x, d_kp);
    add_dx(wv_, x, d_vp);
    dropped_.release();
}

std::vector<SavedTensor> KdaLayer::saved_for_backward() {
    return {{"qp", &qp_},
            {"kp", &kp_},
            {"vp", &vp_},
            {"qc", &qc_},
            {"kc", &kc_},
            {"vc", &vc_},
            {"q", &q_},
            {"k", &k_},
            {"rq", &rq_},
            {"rk", &rk_},
            {"beta", &beta_},
            {"fa", &fa_},
            {"u", &u_},
            {"g", &g_},
            {"o", &o_},
            {"on", &on_},
            {"rstd", &rstd_},
            {"ga", &ga_},
            {"gz", &gz_},
            {"y", &y_},
            {"kept.a", &kept_.a},
            {"kept.m", &kept_.m},
            {"kept.t", &kept_.t},
            {"kept.hs", &kept_.hs},
            {"kept.vn", &kept_.vn},
            {"kept.gam", &kept_.gam},
            {"kept.qg", &kept_.qg},
            {"kept.kg", &kept_.kg},
            {"kept.w", &kept_.w}};
}

}  // namespace mt::nn
