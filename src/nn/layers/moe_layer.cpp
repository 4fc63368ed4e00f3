// MoE layer forward and backward, side by side (the op sequence of moe.md §1.2 and §1.4), and the step's balancing
// update, metrics and collapse alarm.
#include "nn/layers/moe_layer.h"

#include <algorithm>
#include <array>
#include <cmath>

#include "ops/add.h"
#include "ops/embedding.h"
#include "ops/grouped_linear.h"
#include "ops/moe_balance.h"
#include "ops/moe_unpermute.h"
#include "ops/swiglu.h"
#include "parallel/comm.h"

namespace mt::nn {

namespace {
constexpr int64_t kMaxExperts = 1024;
// The per-modality collapse alarm judges a step when the modality's rows per expert T_m k / n reach this
// (multimodal.md §4).
constexpr int64_t kModalityAlarmRows = 32;
}  // namespace

MoeLayer::MoeLayer(ParamTable& table,
                   const std::string& prefix,
                   const ModelConfig& model,
                   const MoeConfig& moe,
                   const MoeExpertParallel& ep,
                   const TensorParallel& tp)
    : prefix_(prefix), model_(model), moe_(moe), ep_(ep), table_(&table) {
    const int64_t e = moe.num_experts, k = moe.top_k, c = model.d_model, f = moe.expert_ffn_dim;
    // The config parser rejects all of these first (exit 2, naming the key); here they are the layer's contract.
    MT_CHECK(e >= 1 && e <= kMaxExperts, "{}: moe.num_experts = {} must be in [1, {}]", prefix, e, kMaxExperts);
    MT_CHECK(k >= 1 && k <= e, "{}: moe.top_k = {} must be in [1, moe.num_experts = {}]", prefix, k, e);
    MT_CHECK(f >= 1, "{}: moe.expert_ffn_dim = {} must be >= 1", prefix, f);
    MT_CHECK(
        moe.num_shared_experts >= 0, "{}: moe.num_shared_experts = {} must be >= 0", prefix, moe.num_shared_experts);
    MT_CHECK(moe.capacity_factor >= 0.0,
             "{}: moe.capacity_factor = {} must be >= 0 (0: dropless)",
             prefix,
             moe.capacity_factor);
    router_options_ = {k, moe.score, moe.normalize_gates, moe.routed_scale};
    // The communicators are needed from the first forward on (Model::param_layout declares without them).
    MT_CHECK(ep.size >= 1 && e % ep.size == 0 && ep.rank >= 0 && ep.rank < ep.size,
             "{}: moe.num_experts = {} cannot be split over expert-parallel rank {} of {}",
             prefix,
             e,
             ep.rank,
             ep.size);
    const bool balanced = moe.modality_bias == MoeModalityBias::balanced;
    MT_CHECK(
        !balanced || moe.balance.mode == MoeBalanceMode::quantile || moe.balance.mode == MoeBalanceMode::sign_bias,
        "{}: moe.modality_bias = \"balanced\" needs a bias balancer (moe.balance = \"quantile\" or \"sign_bias\"), "
        "not \"{}\"",
        prefix,
        enum_name(moe.balance.mode));
    balancers_.assign(balanced ? kMoeModalities : 1, MoeBalancer(e, k, moe.balance));
    detector_ = MoeCollapseDetector(e, moe.alarm);
    step_load_.assign(static_cast<size_t>(e), 0);
    per_modality_ = model.vision.enabled() || moe.modality_bias != MoeModalityBias::off;
    if (per_modality_) {
        // Every tp rank routes its own rows of partial router logits: per-modality routing is not built for it.
        MT_CHECK(!tp.active(), "{}: per-modality routing and metrics with tensor parallelism", prefix);
        modality_detectors_.assign(kMoeModalities, MoeCollapseDetector(e, moe.alarm));
        step_modality_load_.assign(static_cast<size_t>(kMoeModalities * e), 0);
    }

    const double out_std = model.init_std / std::sqrt(2.0 * static_cast<double>(model.n_layers));
    router_ = Linear(table, prefix + ".router", c, e, model.init_std, tp, Linear::Split::partial);
    if (moe.modality_bias == MoeModalityBias::learned)  // c_m: the router's per-modality logit offsets
        learned_bias_ = table.add({.name = prefix + ".router.modality_bias",
                                   .shape = {kMoeModalities, e},
                                   .init = InitKind::zeros,
                                   .weight_decay = false});
    // This rank's experts: all of them, or its E / ep under expert parallelism.
    const int64_t el = e / ep.size, first = ep.size > 1 ? ep.rank * el : 0, global = ep.size > 1 ? e : 0;
    auto expert = [&](const char* name, int64_t out, int64_t in, double std) {
        const int i = table.add({.name = prefix + ".experts." + name,
                                 .shape = {el, out, in},
                                 .init_std = std,
                                 .group = OptimGroup::muon,  // E matrices, each orthogonalised on its own
                                 .shard_first = first,
                                 .shard_global = global});
        table.set_grad_written_whole(i);  // the grouped dw writes every expert's, an empty one's as zeros
        return i;
    };
    w_gate_ = expert("w_gate", f, c, model.init_std);
    w_up_ = expert("w_up", f, c, model.init_std);
    w_down_ = expert("w_down", c, f, out_std);
    if (moe.num_shared_experts > 0) {
        ModelConfig shared = model;
        shared.d_ff = f * moe.num_shared_experts;
        shared_ = std::make_unique<Mlp>(table, prefix + ".shared", shared);
        shared_->set_drop_act(model.recompute.drops(RecomputeModule::moe_act));
    }
    drop_act_ = model.recompute.drops(RecomputeModule::moe_act);
    drop_permute_ = model.recompute.drops(RecomputeModule::moe_permute);
    drop_experts_ = model.recompute.drops(RecomputeModule::moe_experts);
}

void MoeLayer::resize(int64_t n, const Precision& precision) {
    if (n == n_ && logits_.defined() && logits_.device() == precision.device && logits_.dtype() == precision.compute)
        return;
    n_ = n;
    const int64_t e = moe_.num_experts, k = moe_.top_k, c = model_.d_model, r = n * k;
    const core::DType dt = precision.compute, rt = precision.stats;  // activations, routing
    const core::Device dev = precision.device;
    auto z = [&](const Shape& s) { return Tensor::zeros(s, dt, dev); };
    auto zr = [&](const Shape& s) { return Tensor::zeros(s, rt, dev); };
    auto zi = [&](const Shape& s) { return Tensor::zeros(s, DType::i32, dev); };
    const int64_t groups = static_cast<int64_t>(balancers_.size());
    logits_ = z({n, e}), scores_ = zr({n, e}), indices_ = zi({n, k}), gates_ = zr({n, k}), cutoff_ = zr({n}),
    bias_ = groups > 1 ? zr({groups, e}) : zr({e});
    bias_uploaded_.assign(static_cast<size_t>(groups * e), 0.0f);
    offsets_ = zi({e + 1}), slot_row_ = zi({n, k}), row_token_ = zi({r});
    offsets_host_ = dev == core::Device::cpu ? offsets_ : Tensor::zeros({e + 1}, DType::i32);
    device_gemm_ = use_device_gemm(precision, n);
    local_offsets_ = device_gemm_.any() && ep_.size > 1 ? zi({e / ep_.size + 1}) : Tensor();
    xp_ = z({r, c}), yp_ = z({r, c});
    // The aux loss's gradient on the scores is computed in the forward and kept for the backward.
    d_scores_aux_ = moe_.balance.mode == MoeBalanceMode::aux_loss ? zr({n, e}) : Tensor();
    expert_capacity_ = -1;
    reserve_expert_rows(r);
    dropped_.release();  // allocated in the forward that needs them, so that no two layers hold them at once
    // The step's routing totals survive a resize: sequence segments resize between the passes of one step.
    if (!step_load_acc_.defined() || step_load_acc_.device() != dev) {
        step_load_acc_ = Tensor::zeros({e}, DType::i64, dev);
        step_entropy_acc_ = Tensor::zeros({1}, DType::f64, dev);
        if (per_modality_) step_modality_load_acc_ = Tensor::zeros({kMoeModalities, e}, DType::i64, dev);
    }
    if (shared_) {
        shared_->resize(n, precision);
        shared_out_ = z({n, c});
    }
}

// Which expert GEMMs take the device kernel (moe.grouped_gemm): a cuda precision whose activations and gradient
// dtypes and sizes it takes. The conditions on K and M are symmetric, so (d_model, F) covers all three GEMMs. auto
// splits by the average rows an expert gets, N k / E, as bench_moe measured the two on an H100 (the three products,
// docs/moe.md "CUDA"): the device forward is ahead of cuBLASLt's per-expert GEMMs from 1,024 rows an expert down
// (2.1x at 512, 4.4x at 128; the kimi step at 1,024: 199 against 221 ms), the device dx from 512 down (1.4x at 512,
// 3.1x at 128; 0.65x at 2,048), and the device dw nowhere yet (0.49x to 0.72x), so auto keeps dw on cuBLASLt.
MoeLayer::DeviceGemm MoeLayer::use_device_gemm(const Precision& precision, int64_t n) const {
    constexpr int64_t kAutoFwdMaxRows = 1024, kAutoDxMaxRows = 512;
    const ops::GroupedGemm choice = moe_.grouped_gemm;
    if (precision.device != core::Device::cuda || choice == ops::GroupedGemm::cublaslt) return {};
    const std::string why =
        ops::grouped_linear_device_why_not(precision.compute, precision.master, model_.d_model, moe_.expert_ffn_dim);
    MT_CHECK(why.empty() || choice != ops::GroupedGemm::device, "{}: moe.grouped_gemm = \"device\": {}", prefix_, why);
    if (!why.empty()) return {};
    if (choice == ops::GroupedGemm::device) return {true, true, true};
    // Under expert parallelism a local expert takes the rows of all ep ranks' tokens.
    const int64_t rows_per_expert = n * moe_.top_k * ep_.size / std::max<int64_t>(moe_.num_experts, 1);
    return {rows_per_expert <= kAutoFwdMaxRows, rows_per_expert <= kAutoDxMaxRows, false};
}

void MoeLayer::expert_gemm_bwd(const Tensor& x, int w, const Tensor& dy, const Tensor& dx, bool accumulate_dx) {
    const Tensor& weight = table_->param(w);
    const Tensor& dw = table_->grad(w);
    const bool on_dx = device_gemm_.dx, on_dw = device_gemm_.dw;
    const bool accumulate_dw = !table_->first_grad_write(w);  // the step's first: written, no read of dw
    if (on_dx == on_dw) {
        ops::grouped_linear_bwd(
            x, weight, expert_offsets(on_dx), dy, dx, dw, accumulate_dx, gemm_impl(on_dx), accumulate_dw);
        return;
    }
    ops::grouped_linear_bwd(x, weight, expert_offsets(on_dx), dy, dx, Tensor(), accumulate_dx, gemm_impl(on_dx));
    ops::grouped_linear_bwd(x, weight, expert_offsets(on_dw), dy, Tensor(), dw, false, gemm_impl(on_dw), accumulate_dw);
}

ops::GroupedGemm MoeLayer::gemm_impl(bool device) const {
    if (!device) return ops::GroupedGemm::cublaslt;
    return moe_.grouped_gemm == ops::GroupedGemm::device ? ops::GroupedGemm::device : ops::GroupedGemm::automatic;
}

void MoeLayer::reserve_expert_rows(int64_t rows) {
    if (rows <= expert_capacity_) return;
    // Without expert parallelism the experts see at most N k rows (sized once in resize); under it the rows that
    // arrive vary per step, so the buffers grow (by half again, to settle after a few steps) and never shrink.
    const int64_t cap = expert_capacity_ < 0 ? rows : std::max(rows, expert_capacity_ + expert_capacity_ / 2);
    const int64_t c = model_.d_model, f = moe_.expert_ffn_dim;
    const DType dt = logits_.dtype();
    const core::Device dev = logits_.device();
    auto z = [&](const Shape& s) { return Tensor::zeros(s, dt, dev); };
    hg_ = z({cap, f}), hu_ = z({cap, f}), act_ = z({cap, f});
    if (ep_.size > 1) xe_ = z({cap, c}), ye_ = z({cap, c});
    expert_capacity_ = cap;
    list_dropped();
}

void MoeLayer::list_dropped() {
    dropped_.clear();
    if (drop_act_ || drop_experts_) dropped_.add(&act_);
    if (drop_permute_) dropped_.add(&xp_);
    if (drop_permute_ && ep_.size > 1) dropped_.add(&xe_);
    if (drop_experts_) {
        for (Tensor* t : {&hg_, &hu_, &yp_}) dropped_.add(t);
        if (ep_.size > 1) dropped_.add(&ye_);
    }
}

void MoeLayer::experts_forward(const Tensor& xe, const Tensor& ye, const Tensor& yp) {
    const int64_t re = expert_rows_;
    const Tensor hg = hg_.slice(0, 0, re), hu = hu_.slice(0, 0, re), act = act_.slice(0, 0, re);
    const ops::GroupedGemm impl = gemm_impl(device_gemm_.fwd);
    const Tensor& offsets = expert_offsets(device_gemm_.fwd);
    ops::grouped_linear_fwd(xe, table_->param(w_gate_), offsets, hg, impl);
    ops::grouped_linear_fwd(xe, table_->param(w_up_), offsets, hu, impl);
    ops::swiglu_fwd(hg, hu, act);
    ops::grouped_linear_fwd(act, table_->param(w_down_), offsets, ye, impl);
    if (ep_.size > 1) dispatch_.to_sources(ye, yp);
}

void MoeLayer::forward(const Tensor& x, const Tensor& out, bool training) {
    const int64_t n = n_, e = moe_.num_experts, k = moe_.top_k;
    MT_CHECK(x.ndim() == 2 && x.size(0) == n,
             "moe layer: x has shape {}, expected [{}, C] (resize first)",
             core::shape_str(x.shape()),
             n);
    dropped_.restore();
    if (per_modality_)
        MT_CHECK(modality_.ids.defined() && modality_.ids.numel() == n && modality_.ids.device() == x.device(),
                 "{}: the tokens' modalities ([{}] i32 on the layer's device) must be set before the forward",
                 prefix_,
                 n);
    // router: z = x W_r^T (+ c_m, learned per modality), scores, top-k on s + b (b_m per modality), gates; QB's cutoff
    router_.forward(x, logits_);
    if (learned_bias_ >= 0) {
        const Tensor c = Tensor::scratch(logits_.shape(), logits_.dtype(), logits_.device());
        ops::embedding_fwd(modality_.ids, table_->param(learned_bias_), c);
        ops::add_fwd(logits_, c, logits_);
    }
    std::vector<float> bias;  // [E], or [M, E] with a balancer per modality
    for (const MoeBalancer& b : balancers_) bias.insert(bias.end(), b.bias().begin(), b.bias().end());
    if (bias != bias_uploaded_) {  // changes at balancer updates only: one small host-to-device copy then
        Tensor host = Tensor::zeros(bias_.shape(), DType::f32);
        std::copy(bias.begin(), bias.end(), host.data<float>());
        bias_.copy_from(host.to(bias_.dtype()));
        bias_uploaded_ = bias;
    }
    const bool use_bias =
        moe_.balance.mode == MoeBalanceMode::quantile || moe_.balance.mode == MoeBalanceMode::sign_bias;
    const bool need_cutoff = training && balancers_[0].needs_cutoff();
    const bool by_modality = balancers_.size() > 1;
    ops::moe_router_fwd(logits_,
                        use_bias ? bias_ : Tensor(),
                        scores_,
                        indices_,
                        gates_,
                        need_cutoff ? cutoff_ : Tensor(),
                        router_options_,
                        by_modality ? modality_.ids : Tensor());
    // permutation plan with optional capacity C = ceil(N k / E * CF), then gather
    const int64_t capacity = moe_.capacity_factor > 0
                                 ? static_cast<int64_t>(std::ceil(static_cast<double>(n * k) / static_cast<double>(e) *
                                                                  moe_.capacity_factor))
                                 : 0;
    rows_ = ops::moe_permute_plan(indices_, gates_, e, capacity, moe_.drop_policy, offsets_, slot_row_, row_token_);
    // The host copy of the offsets (CUDA: a synchronisation) only where something reads it: the cuBLASLt expert GEMMs
    // and expert parallelism's dispatch plan. The device grouped GEMM reads the plan's offsets where they are.
    const bool ep = ep_.size > 1;
    if ((ep || !device_gemm_.all()) && offsets_host_.raw() != offsets_.raw()) offsets_host_.copy_from(offsets_);
    const Tensor xp = xp_.slice(0, 0, rows_), yp = yp_.slice(0, 0, rows_);
    ops::moe_permute_fwd(x, row_token_.slice(0, 0, rows_), xp);
    // expert parallelism: the rows go to the ranks holding their experts
    expert_rows_ = rows_;
    expert_offsets_device_ = offsets_, expert_offsets_host_ = offsets_host_;
    if (ep) {
        MT_CHECK(ep_.comm != nullptr, "{}: expert parallelism over {} ranks without a communicator", prefix_, ep_.size);
        dispatch_.plan(offsets_host_, *ep_.comm, ep_.rows_comm != nullptr ? *ep_.rows_comm : *ep_.comm, xp_.device());
        expert_rows_ = dispatch_.expert_rows();
        expert_offsets_host_ = dispatch_.local_offsets();
        // Planned on the host, up for the device GEMM.
        if (device_gemm_.any()) local_offsets_.copy_from(expert_offsets_host_);
        expert_offsets_device_ = local_offsets_;
        reserve_expert_rows(expert_rows_);
    }
    const int64_t re = expert_rows_;
    const Tensor xe = ep ? xe_.slice(0, 0, re) : xp, ye = ep ? ye_.slice(0, 0, re) : yp;
    // Overlapped dispatch: the shared experts' forward runs while the rows travel (it reads only x).
    const bool shared_early = ep && shared_ && moe_.overlap_dispatch;
    if (ep) dispatch_.start_to_experts(xp, xe);
    if (shared_early) shared_->forward(x, shared_out_);
    if (ep) dispatch_.finish(/*block_host=*/!moe_.overlap_dispatch);
    // routed experts: grouped SwiGLU FFN, then the gate-weighted combine
    experts_forward(xe, ye, yp);
    ops::moe_unpermute_fwd(yp, slot_row_, gates_, out);
    // shared expert(s)
    if (shared_) {
        if (!shared_early) shared_->forward(x, shared_out_);
        ops::add_fwd(out, shared_out_, out);
    }
    // aux loss (its gradient on the scores is kept for the backward)
    const bool probs = router_options_.score == ops::MoeScore::softmax;
    aux_loss_ = moe_.balance.mode == MoeBalanceMode::aux_loss
                    ? ops::moe_aux_loss(scores_, indices_, moe_.balance.aux_coeff, probs, d_scores_aux_)
                    : 0.0;
    dropped_.release();
    if (!training) return;
    const Tensor cut = need_cutoff ? cutoff_ : Tensor();
    if (by_modality) {
        for (size_t m = 0; m < balancers_.size(); ++m)
            balancers_[m].observe(
                scores_, cut, indices_, {modality_.ids, static_cast<int32_t>(m), modality_tokens_[m]});
    } else {
        balancers_[0].observe(scores_, cut, indices_);
    }
    if (per_modality_) {
        for (int64_t m = 0; m < kMoeModalities; ++m) {
            ops::moe_expert_counts(indices_,
                                   step_modality_load_acc_.slice(0, m, m + 1).reshape({e}),
                                   modality_.ids,
                                   static_cast<int32_t>(m));
            step_modality_tokens_[static_cast<size_t>(m)] += modality_tokens_[static_cast<size_t>(m)];
        }
        if (rows_ < n * k) count_modality_drops();
    }
    step_tokens_ += n;
    step_dropped_ += n * k - rows_;
    step_aux_ += aux_loss_;
    ops::moe_expert_counts(indices_, step_load_acc_);  // counted on the routing device until step_end
    ops::moe_token_entropy_sum(scores_, step_entropy_acc_);
}

// Workspace slots, by lifetime (R routed rows, Re the rows this rank's experts process; Re = R without expert
// parallelism, where d_ye is d_yp and d_xe is d_xp):
//   0  d_yp [R, C] until the experts' backward (expert parallelism: until it is sent), then d_xp [R, C] (ep;
//      under overlapped dispatch it receives while the router's backward runs, so it stays out of slots 1, 5, 6)
//   1  d_ye [Re, C] (ep) until the down projection's backward, then d_logits [N, E]
//   2  d_act [Re, F] until swiglu_bwd, then d_xe [Re, C] until the permutation's backward
//   3, 4  d_hg, d_hu [Re, F]
//   5  d_tmp [N, C]: the router's and the shared experts' dx before each is added to dx
//   6  d_gates [N, K] in the routing dtype
// The shared experts' MLP takes slots 0-2 last, when the routed part is done.
void MoeLayer::reserve_scratch(Workspace& ws) const {
    const int64_t n = n_, c = model_.d_model, f = moe_.expert_ffn_dim, e = moe_.num_experts;
    const int64_t r = n * moe_.top_k, cap = expert_capacity_;
    const size_t act = core::dtype_size(logits_.dtype()), route = core::dtype_size(scores_.dtype());
    auto bytes = [&](int64_t elements) { return static_cast<size_t>(elements) * act; };
    ws.reserve_slot(0, bytes(r * c));
    ws.reserve_slot(1, bytes(std::max(ep_.size > 1 ? cap * c : 0, n * e)));
    ws.reserve_slot(2, bytes(std::max(cap * f, cap * c)));
    ws.reserve_slot(3, bytes(cap * f));
    ws.reserve_slot(4, bytes(cap * f));
    ws.reserve_slot(5, bytes(n * c));
    ws.reserve_slot(6, static_cast<size_t>(n * moe_.top_k) * route);
    if (shared_) shared_->reserve_scratch(ws);
}

void MoeLayer::backward(const Tensor& x, const Tensor& dout, const Tensor& dx, Workspace& ws) {
    const bool ep = ep_.size > 1;
    const int64_t n = n_, re = expert_rows_, c = model_.d_model, f = moe_.expert_ffn_dim;
    const core::Device dev = x.device();
    const DType dt = logits_.dtype();
    dropped_.restore();
    const Tensor xp = xp_.slice(0, 0, rows_), yp = yp_.slice(0, 0, rows_);
    const Tensor xe = ep ? xe_.slice(0, 0, re) : xp;
    const Tensor hg = hg_.slice(0, 0, re), hu = hu_.slice(0, 0, re), act = act_.slice(0, 0, re);
    if (drop_permute_) {  // recompute moe_permute: the gather (and the rows' trip to the experts) again
        ops::moe_permute_fwd(x, row_token_.slice(0, 0, rows_), xp);
        if (ep) dispatch_.to_experts(xp, xe);
    }
    if (drop_experts_)  // recompute moe_experts: the experts' FFN again, from the gathered rows
        experts_forward(xe, ep ? ye_.slice(0, 0, re) : yp, yp);
    else if (drop_act_)
        ops::swiglu_fwd(hg, hu, act);  // recompute moe_act
    // combine: row gradients g dy, gate gradients dy . row
    const Tensor d_yp = ws.slot(0, {rows_, c}, dt, dev), d_gates = ws.slot(6, gates_.shape(), gates_.dtype(), dev);
    ops::moe_unpermute_bwd(yp, slot_row_, gates_, dout, d_yp, d_gates);
    // routed experts (under expert parallelism the row gradients go to the experts' ranks and back)
    const Tensor d_ye = ep ? ws.slot(1, {re, c}, dt, dev) : d_yp;
    if (ep) dispatch_.to_experts(d_yp, d_ye);
    const Tensor d_act = ws.slot(2, {re, f}, dt, dev);
    expert_gemm_bwd(act, w_down_, d_ye, d_act, false);
    const Tensor d_hg = ws.slot(3, {re, f}, dt, dev), d_hu = ws.slot(4, {re, f}, dt, dev);
    ops::swiglu_bwd(hg, hu, d_act, d_hg, d_hu);
    const Tensor d_xe = ws.slot(2, {re, c}, dt, dev);
    expert_gemm_bwd(xe, w_gate_, d_hg, d_xe, false);
    expert_gemm_bwd(xe, w_up_, d_hu, d_xe, /*accumulate_dx=*/true);
    const Tensor d_xp = ep ? ws.slot(0, {rows_, c}, dt, dev) : d_xe;
    // Overlapped dispatch: the router's backward (slots 1, 5, 6) runs while the row gradients travel back (sent from
    // the dispatch's staging buffer, received into d_xp in slot 0); dx is then written in the same order as without.
    const bool router_early = ep && moe_.overlap_dispatch;
    if (ep) dispatch_.start_to_sources(d_xe, d_xp);
    if (!router_early) {
        if (ep) dispatch_.finish(/*block_host=*/true);
        ops::moe_permute_bwd(slot_row_, d_xp, dx);  // the first contribution writes dx
    }
    // router: through the gates (and the aux loss's P), the score function, the router GEMM
    const bool aux = moe_.balance.mode == MoeBalanceMode::aux_loss;
    if (aux && aux_grad_scale_ != 1.0) {
        // The model's backward scales the LM loss (loss scaling, 1 / grad_accum); the aux loss's gradient must be
        // scaled the same way. It is linear in the coefficient, so recompute it with the scaled one.
        const bool probs = router_options_.score == ops::MoeScore::softmax;
        ops::moe_aux_loss(scores_, indices_, moe_.balance.aux_coeff * aux_grad_scale_, probs, d_scores_aux_);
    }
    const Tensor d_logits = ws.slot(1, logits_.shape(), dt, dev), d_tmp = ws.slot(5, {n, c}, dt, dev);
    ops::moe_router_bwd(scores_, indices_, gates_, d_gates, aux ? d_scores_aux_ : Tensor(), d_logits, router_options_);
    if (learned_bias_ >= 0) ops::embedding_bwd(modality_.ids, d_logits, table_->grad(learned_bias_));  // dc_m
    router_.backward(x, d_logits, d_tmp);
    if (router_early) {
        dispatch_.finish();
        ops::moe_permute_bwd(slot_row_, d_xp, dx);
    }
    ops::add_fwd(dx, d_tmp, dx);
    // shared expert(s)
    if (shared_) {
        shared_->backward(x, dout, d_tmp, ws);
        ops::add_fwd(dx, d_tmp, dx);
    }
    dropped_.release();
}

void MoeLayer::set_modality(const MoeModality& modality) {
    MT_CHECK(per_modality_, "{}: token modalities for a layer without per-modality routing or metrics", prefix_);
    MT_CHECK(modality.ids.defined() && modality.host.defined() && modality.host.device() == core::Device::cpu &&
                 modality.ids.dtype() == DType::i32 && modality.host.dtype() == DType::i32 &&
                 modality.ids.numel() == modality.host.numel(),
             "{}: token modalities must be [N] i32 on the routing device and its copy on the host",
             prefix_);
    modality_ = modality;
    modality_tokens_.fill(0);
    const int32_t* v = modality.host.data<int32_t>();
    for (int64_t i = 0; i < modality.host.numel(); ++i) {
        MT_CHECK(v[i] >= 0 && v[i] < kMoeModalities, "{}: token {} has modality {}", prefix_, i, v[i]);
        ++modality_tokens_[static_cast<size_t>(v[i])];
    }
}

void MoeLayer::count_modality_drops() {
    // Capacity dropping: the kept rows' tokens (row_token_[0, rows_)) by modality, on the host.
    const Tensor kept = row_token_.slice(0, 0, rows_);
    const Tensor host = kept.device() == core::Device::cpu ? kept : kept.to_device(core::Device::cpu);
    std::array<int64_t, kMoeModalities> rows = {};
    const int32_t *token = host.data<int32_t>(), *m = modality_.host.data<int32_t>();
    for (int64_t r = 0; r < rows_; ++r) ++rows[static_cast<size_t>(m[token[r]])];
    for (size_t i = 0; i < rows.size(); ++i) step_modality_dropped_[i] += modality_tokens_[i] * moe_.top_k - rows[i];
}

void MoeLayer::reset_modality_step() {
    if (!per_modality_) return;
    if (step_modality_load_acc_.defined()) step_modality_load_acc_.zero();
    std::fill(step_modality_load_.begin(), step_modality_load_.end(), 0);
    step_modality_tokens_.fill(0);
    step_modality_dropped_.fill(0);
}

MoeStepMetrics MoeLayer::step_end(int64_t step, parallel::Comm* data_group) {
    const int64_t e = moe_.num_experts;
    if (step_load_acc_.defined()) {  // the step's counts come back (one copy each from a GPU) and are reset
        const Tensor load = step_load_acc_.to_device(core::Device::cpu);
        for (size_t j = 0; j < step_load_.size(); ++j) step_load_[j] += load.data<int64_t>()[j];
        step_entropy_ += step_entropy_acc_.item();
        step_load_acc_.zero();
        step_entropy_acc_.zero();
        if (per_modality_) {
            const Tensor mload = step_modality_load_acc_.to_device(core::Device::cpu);
            for (size_t j = 0; j < step_modality_load_.size(); ++j) step_modality_load_[j] += mload.data<int64_t>()[j];
            step_modality_load_acc_.zero();
        }
    }
    if (data_group != nullptr && data_group->size() > 1) {
        // The step's totals over every rank that routed tokens: counts as integers (exact), sums in f64.
        std::vector<int64_t> counts(step_load_);
        counts.push_back(step_tokens_);
        counts.push_back(step_dropped_);
        // per modality: loads [M E], tokens [M], dropped rows [M]
        counts.insert(counts.end(), step_modality_load_.begin(), step_modality_load_.end());
        if (per_modality_) {
            counts.insert(counts.end(), step_modality_tokens_.begin(), step_modality_tokens_.end());
            counts.insert(counts.end(), step_modality_dropped_.begin(), step_modality_dropped_.end());
        }
        std::array<double, 2> sums = {step_entropy_, step_aux_};
        data_group
            ->all_reduce(
                counts.data(), static_cast<int64_t>(counts.size()), parallel::CommType::i64, parallel::ReduceOp::sum)
            .wait();
        data_group->all_reduce(sums.data(), 2, parallel::CommType::f64, parallel::ReduceOp::sum).wait();
        auto at = counts.begin();
        auto take = [&](auto first, size_t count) {
            std::copy(at, at + static_cast<std::ptrdiff_t>(count), first);
            at += static_cast<std::ptrdiff_t>(count);
        };
        take(step_load_.begin(), step_load_.size());
        step_tokens_ = *at++;
        step_dropped_ = *at++;
        take(step_modality_load_.begin(), step_modality_load_.size());
        if (per_modality_) {
            take(step_modality_tokens_.begin(), step_modality_tokens_.size());
            take(step_modality_dropped_.begin(), step_modality_dropped_.size());
        }
        step_entropy_ = sums[0];
        step_aux_ = sums[1];
        for (MoeBalancer& b : balancers_) b.sum_step_counts(*data_group);
    }
    // The bias metrics cover every balancer's bias (both modalities' under "balanced"), bias_step their mean.
    std::vector<float> bias;
    double bias_step = 0.0;
    for (MoeBalancer& b : balancers_) {
        b.step();
        bias.insert(bias.end(), b.bias().begin(), b.bias().end());
        bias_step += b.last_bias_step() / static_cast<double>(balancers_.size());
    }
    MoeStepMetrics m = moe_metrics_compute(
        step_load_, step_tokens_, moe_.top_k, step_dropped_, bias, bias_step, step_entropy_, step_aux_);
    last_alarm_ = detector_.update(step, m);
    last_modality_alarms_.clear();
    if (per_modality_) {
        std::vector<std::vector<int64_t>> load;
        for (int64_t i = 0; i < kMoeModalities; ++i)
            load.emplace_back(step_modality_load_.begin() + i * e, step_modality_load_.begin() + (i + 1) * e);
        const std::vector<MoeStepMetrics> own =
            moe_modality_metrics_add(m,
                                     load,
                                     {step_modality_tokens_.begin(), step_modality_tokens_.end()},
                                     {step_modality_dropped_.begin(), step_modality_dropped_.end()});
        // The collapse alarm per modality, at the steps where the modality has T_m k / n >= 32 rows per expert.
        for (size_t i = 0; i < own.size(); ++i) {
            MoeCollapseDetector& d = modality_detectors_[i];
            if (own[i].tokens * moe_.top_k < kModalityAlarmRows * e) {
                d.skip();
                continue;
            }
            if (std::optional<MoeCollapseEvent> ev = d.update(step, own[i])) {
                ev->modality = kMoeModalityNames[i];
                last_modality_alarms_.push_back(*ev);
            }
        }
    }
    std::fill(step_load_.begin(), step_load_.end(), 0);
    step_tokens_ = step_dropped_ = 0;
    step_entropy_ = step_aux_ = 0.0;
    reset_modality_step();
    return m;
}

void MoeLayer::discard_step() {
    if (step_load_acc_.defined()) {
        step_load_acc_.zero();
        step_entropy_acc_.zero();
    }
    std::fill(step_load_.begin(), step_load_.end(), 0);
    step_tokens_ = step_dropped_ = 0;
    step_entropy_ = step_aux_ = 0.0;
    reset_modality_step();
    for (MoeBalancer& b : balancers_) b.discard_step();
}

namespace {
// The checkpoint prefix of balancer m: the layer's router for the first (the one balancer, or the text one), then
// "{router}.image" (moe.modality_bias = "balanced").
std::string balancer_prefix(const std::string& layer, size_t m) {
    const std::string router = layer + ".router";
    return m == 0 ? router : router + "." + kMoeModalityNames[m];
}
const char* balancer_json_key(size_t m) {
    return m == 0 ? "balancer" : "balancer_image";
}
}  // namespace

std::vector<std::pair<std::string, Tensor>> MoeLayer::state_tensors() const {
    std::vector<std::pair<std::string, Tensor>> out;
    for (size_t m = 0; m < balancers_.size(); ++m)
        for (auto& t : balancers_[m].state_tensors(balancer_prefix(prefix_, m))) out.push_back(std::move(t));
    return out;
}

void MoeLayer::load_state_tensors(const std::vector<std::pair<std::string, Tensor>>& tensors) {
    for (size_t m = 0; m < balancers_.size(); ++m) balancers_[m].load_state(tensors, balancer_prefix(prefix_, m));
}

nlohmann::json MoeLayer::state_json() const {
    nlohmann::json j = {{"alarm", detector_.state_json()}};
    for (size_t m = 0; m < balancers_.size(); ++m) j[balancer_json_key(m)] = balancers_[m].state_json();
    if (per_modality_) j["modality_alarms"] = modality_alarm_state_json();
    return j;
}

void MoeLayer::load_state_json(const nlohmann::json& j) {
    if (!j.is_object() || !j.contains("alarm"))
        core::fail(core::ExitCode::checkpoint, "{}: MoE layer state needs \"balancer\" and \"alarm\"", prefix_);
    for (size_t m = 0; m < balancers_.size(); ++m) {
        if (!j.contains(balancer_json_key(m)))
            core::fail(core::ExitCode::checkpoint, "{}: MoE layer state needs \"{}\"", prefix_, balancer_json_key(m));
        balancers_[m].load_state_json(j.at(balancer_json_key(m)));
    }
    detector_.load_state_json(j.at("alarm"));
    if (per_modality_ && j.contains("modality_alarms")) load_modality_alarm_state_json(j.at("modality_alarms"));
}

nlohmann::json MoeLayer::modality_alarm_state_json() const {
    nlohmann::json j = nlohmann::json::array();
    for (const MoeCollapseDetector& d : modality_detectors_) j.push_back(d.state_json());
    return j;
}

void MoeLayer::load_modality_alarm_state_json(const nlohmann::json& j) {
    if (!j.is_array() || j.size() != modality_detectors_.size())
        core::fail(core::ExitCode::checkpoint,
                   "{}: the per-modality collapse detectors' state must be an array of {}",
                   prefix_,
                   modality_detectors_.size());
    for (size_t i = 0; i < modality_detectors_.size(); ++i) modality_detectors_[i].load_state_json(j.at(i));
}

std::vector<SavedTensor> MoeLayer::saved_for_backward() {
    std::vector<SavedTensor> saved = {{"scores", &scores_},
                                      {"indices", &indices_},
                                      {"gates", &gates_},
                                      {"offsets", &offsets_},
                                      {"slot_row", &slot_row_},
                                      {"row_token", &row_token_},
                                      {"xp", &xp_},
                                      {"hg", &hg_},
                                      {"hu", &hu_},
                                      {"act", &act_},
                                      {"yp", &yp_}};
    if (d_scores_aux_.defined()) saved.push_back({"d_scores_aux", &d_scores_aux_});
    if (shared_)
        for (const SavedTensor& s : shared_->saved_for_backward()) saved.push_back({"shared." + s.name, s.tensor});
    return saved;
}

}  // namespace mt::nn
