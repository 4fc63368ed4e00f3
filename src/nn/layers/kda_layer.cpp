// KDA layer forward and backward, side by side (the op sequence of kda.md §1).
#include "nn/layers/kda_layer.h"

#include <cmath>

#include "ops/causal_conv1d.h"
#include "ops/l2norm.h"
#include "ops/rmsnorm.h"
#include "ops/sigmoid.h"
#include "ops/sigmoid_gate.h"

namespace mt::nn {

namespace {
constexpr double kL2Eps = 1e-6;  // kda.md §1: k / sqrt(|k|^2 + 1e-6)
}

KdaLayer::KdaLayer(ParamTable& table, const std::string& prefix, const ModelConfig& cfg) : cfg_(cfg), table_(&table) {
    const KdaConfig& kda = cfg.kda;
    h_ = cfg.kda_num_heads();
    hv_ = cfg.kda_num_v_heads();
    k_dim_ = cfg.kda_head_dim();
    v_dim_ = cfg.kda_head_v_dim();
    MT_CHECK(hv_ % h_ == 0, "{}: kda.num_v_heads = {} must be a multiple of kda.num_heads = {}", prefix, hv_, h_);
    MT_CHECK(kda.conv_size >= 1, "{}: kda.conv_size = {} must be >= 1", prefix, kda.conv_size);
    const bool bounded = kda.gate == ops::KdaGateKind::lower_bound;
    gate_options_ = {kda.gate, kda.gate_lower_bound, kda.gate_use_a_log};
    // The bounded gate keeps 15 |g| inside f32's exp range, so the diagonal tiles can be plain products; the
    // softplus gate needs the pairwise diagonal (kda.md §4.3).
    kda_options_ = {kda.algorithm,
                    bounded ? ops::KdaDiagonal::matmul : ops::KdaDiagonal::pairwise,
                    kda.chunk_size,
                    kda.save == KdaSave::states,
                    kda.save == KdaSave::workspace};
    keep_tiles_ = kda.save != KdaSave::none;

    const int64_t d = cfg.d_model, hk = h_ * k_dim_, hvk = hv_ * k_dim_, hvv = hv_ * v_dim_;
    const double init_std = cfg.init_std;
    wq_ = Linear(table, prefix + ".q_proj", d, hk, init_std);
    wk_ = Linear(table, prefix + ".k_proj", d, hk, init_std);
    wv_ = Linear(table, prefix + ".v_proj", d, hvv, init_std);
    const double conv_std = 1.0 / std::sqrt(static_cast<double>(kda.conv_size));
    auto conv = [&](const char* name, int64_t c) {
        return table.add({.name = prefix + name, .shape = {c, kda.conv_size}, .init_std = conv_std});
    };
    conv_q_ = conv(".q_conv1d.weight", hk);
    conv_k_ = conv(".k_conv1d.weight", hk);
    conv_v_ = conv(".v_conv1d.weight", hvv);
    wfa_ = Linear(table, prefix + ".f_a_proj", d, k_dim_, init_std);
    wfb_ = Linear(table, prefix + ".f_b_proj", k_dim_, hvk, init_std);
    // kda.md §3: A_log = 0 (a = 1) for the bounded gate, log U(1, 16) for softplus; dt_bias = softplus^-1(delta),
    // delta log-uniform in [1e-3, 1e-1].
    a_log_ = table.add({.name = prefix + ".A_log",
                        .shape = {hv_},
                        .init = bounded ? InitKind::zeros : InitKind::log_uniform,
                        .init_lo = 1.0,
                        .init_hi = 16.0,
                        .weight_decay = false});
    dt_bias_ = table.add({.name = prefix + ".dt_bias",
                          .shape = {hvk},
                          .init = InitKind::softplus_inv_log_uniform,
                          .init_lo = 1e-3,
                          .init_hi = 1e-1,
                          .weight_decay = false});
    wb_ = Linear(table, prefix + ".b_proj", d, hv_, init_std);
    wga_ = Linear(table, prefix + ".g_a_proj", d, v_dim_, init_std);
    wgb_ = Linear(table, prefix + ".g_b_proj", v_dim_, hvv, init_std);
    o_norm_ = table.add(
        {.name = prefix + ".o_norm.weight", .shape = {v_dim_}, .init = InitKind::ones, .weight_decay = false});
    wo_ = Linear(table, prefix + ".o_proj", hvv, d, init_std / std::sqrt(2.0 * static_cast<double>(cfg.n_layers)));
}

void KdaLayer::resize(int64_t batch, int64_t seq, const Precision& precision) {
    if (batch == batch_ && seq == seq_ && q_.defined()) return;
    batch_ = batch;
    seq_ = seq;
    const int64_t n = batch * seq, hk = h_ * k_dim_, hvk = hv_ * k_dim_, hvv = hv_ * v_dim_;
    const core::DType dt = precision.compute;
    const core::Device dev = precision.device;
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
    d_y_ = z({n, hvv}), d_on_ = z({n, hvv}), d_gz_ = z({n, hvv}), d_ga_ = z({n, v_dim_});
    d_o_ = z(o_.shape()), d_q_ = z(q_.shape()), d_k_ = z(k_.shape()), d_v_ = z(o_.shape());
    d_g_ = z(g_.shape()), d_beta_ = z(beta_.shape()), d_u_ = z({n, hvk}), d_fa_ = z({n, k_dim_}), d_bl_ = z({n, hv_});
    d_qc_ = z({n, hk}), d_kc_ = z({n, hk}), d_qp_ = z({n, hk}), d_kp_ = z({n, hk}), d_vp_ = z({n, hvv});
    ds0_ = Tensor();
}

void KdaLayer::set_initial_state(const Tensor& s0) {
    s0_ = s0;
}

void KdaLayer::set_final_state_grad(const Tensor& dst) {
    dst_ = dst;
}

void KdaLayer::forward(const Tensor& x, const Tensor& out, bool training) {
    const int64_t n = batch_ * seq_;
    const double q_scale = 1.0 / std::sqrt(static_cast<double>(k_dim_));
    auto rows = [](const Tensor& t, int64_t r) { return t.reshape({r, t.numel() / r}); };
    auto seq3 = [&](const Tensor& t) { return t.reshape({batch_, seq_, t.numel() / n}); };
    // q, k, v: projection, causal conv + SiLU, L2 norm of q and k per head
    wq_.forward(x, qp_);
    wk_.forward(x, kp_);
    wv_.forward(x, vp_);
    ops::causal_conv1d_fwd(seq3(qp_), table_->param(conv_q_), qc_, true);
    ops::causal_conv1d_fwd(seq3(kp_), table_->param(conv_k_), kc_, true);
    ops::causal_conv1d_fwd(seq3(vp_), table_->param(conv_v_), vc_, true);
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
    // the recurrence
    const Tensor v = vc_.reshape({batch_, seq_, hv_, v_dim_});
    if (!training) kept_ = ops::KdaSaved{};
    ops::kda_fwd(q_, k_, v, g_, beta_, s0_, o_, st_, kda_options_, keep_tiles_ && training ? &kept_ : nullptr);
    // output norm per head, sigmoid output gate, output projection
    ops::rmsnorm_fwd(rows(o_, n * hv_), table_->param(o_norm_), cfg_.norm_eps, rows(on_, n * hv_), rstd_);
    wga_.forward(x, ga_);
    wgb_.forward(ga_, gz_);
    ops::sigmoid_gate_fwd(on_, gz_, y_);
    wo_.forward(y_, out);
}

void KdaLayer::backward(const Tensor& x, const Tensor& dout, const Tensor& dx, Workspace& /*ws*/) {
    const int64_t n = batch_ * seq_;
    const double q_scale = 1.0 / std::sqrt(static_cast<double>(k_dim_));
    auto rows = [](const Tensor& t, int64_t r) { return t.reshape({r, t.numel() / r}); };
    auto seq3 = [&](const Tensor& t) { return t.reshape({batch_, seq_, t.numel() / n}); };
    // x feeds six projections: after the first, each adds its gradient into dx inside its matmul.
    auto add_dx = [&](const Linear& w, const Tensor& input, const Tensor& dy) {
        w.backward(input, dy, dx, /*accumulate_dx=*/true);
    };
    // output projection, gate, norm
    wo_.backward(y_, dout, d_y_);
    ops::sigmoid_gate_bwd(on_, gz_, d_y_, d_on_, d_gz_);
    wgb_.backward(ga_, d_gz_, d_ga_);
    wga_.backward(x, d_ga_, dx);  // the first contribution writes dx
    ops::rmsnorm_bwd(rows(o_, n * hv_),
                     table_->param(o_norm_),
                     rstd_,
                     rows(d_on_, n * hv_),
                     rows(d_o_, n * hv_),
                     table_->grad(o_norm_));
    // the recurrence
    if (s0_.defined() && (!ds0_.defined() || ds0_.shape() != s0_.shape()))
        ds0_ = Tensor::zeros(s0_.shape(), s0_.dtype(), s0_.device());
    if (!s0_.defined()) ds0_ = Tensor();
    const Tensor v = vc_.reshape({batch_, seq_, hv_, v_dim_});
    ops::kda_bwd(q_, k_, v, g_, beta_, s0_, d_o_, dst_, d_q_, d_k_, d_v_, d_g_, d_beta_, ds0_, kda_options_, &kept_);
    kept_ = ops::KdaSaved{};  // used once: freed for the next layer's backward (a second backward recomputes)
    // gate and beta
    const Tensor a_log = gate_options_.use_a_log ? table_->param(a_log_) : Tensor();
    const Tensor da_log = gate_options_.use_a_log ? table_->grad(a_log_) : Tensor();
    ops::kda_gate_bwd(u_.reshape({n, hv_, k_dim_}),
                      a_log,
                      table_->param(dt_bias_).reshape({hv_, k_dim_}),
                      d_g_.reshape({n, hv_, k_dim_}),
                      d_u_.reshape({n, hv_, k_dim_}),
                      da_log,
                      table_->grad(dt_bias_).reshape({hv_, k_dim_}),
                      gate_options_);
    wfb_.backward(fa_, d_u_, d_fa_);
    add_dx(wfa_, x, d_fa_);
    ops::sigmoid_bwd(rows(beta_, n), rows(d_beta_, n), d_bl_);
    add_dx(wb_, x, d_bl_);
    // L2 norms, convs, projections
    ops::l2norm_bwd(rows(qc_, n * h_), rq_, q_scale, rows(d_q_, n * h_), rows(d_qc_, n * h_));
    ops::l2norm_bwd(rows(kc_, n * h_), rk_, 1.0, rows(d_k_, n * h_), rows(d_kc_, n * h_));
    ops::causal_conv1d_bwd(seq3(qp_), table_->param(conv_q_), seq3(d_qc_), seq3(d_qp_), table_->grad(conv_q_), true);
    ops::causal_conv1d_bwd(seq3(kp_), table_->param(conv_k_), seq3(d_kc_), seq3(d_kp_), table_->grad(conv_k_), true);
    ops::causal_conv1d_bwd(
        seq3(vp_), table_->param(conv_v_), seq3(rows(d_v_, n)), seq3(d_vp_), table_->grad(conv_v_), true);
    add_dx(wq_, x, d_qp_);
    add_dx(wk_, x, d_kp_);
    add_dx(wv_, x, d_vp_);
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
