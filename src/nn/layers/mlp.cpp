// SwiGLU MLP forward and backward, side by side.
#include "nn/layers/mlp.h"

#include <cmath>

#include "ops/swiglu.h"

namespace mt::nn {

Mlp::Mlp(ParamTable& table, const std::string& prefix, const ModelConfig& cfg, const TensorParallel& tp) : cfg_(cfg) {
    using Split = Linear::Split;
    w_gate_ = Linear(table, prefix + ".w_gate", cfg.d_model, cfg.d_ff, cfg.init_std, tp, Split::column);
    w_up_ = Linear(table, prefix + ".w_up", cfg.d_model, cfg.d_ff, cfg.init_std, tp, Split::column);
    w_down_ = Linear(table,
                     prefix + ".w_down",
                     cfg.d_ff,
                     cfg.d_model,
                     cfg.init_std / std::sqrt(2.0 * static_cast<double>(cfg.n_layers)),
                     tp,
                     Split::row);
    cfg_.d_ff = tp.shard(cfg.d_ff);
}

void Mlp::resize(int64_t n, const Precision& precision) {
    if (gate_.defined() && gate_.size(0) == n) return;
    const core::DType dtype = precision.compute;
    const core::Device dev = precision.device;
    gate_ = Tensor::zeros({n, cfg_.d_ff}, dtype, dev);
    up_ = Tensor::zeros({n, cfg_.d_ff}, dtype, dev);
    act_ = Tensor::zeros({n, cfg_.d_ff}, dtype, dev);
    dropped_.clear();
    if (drop_act_) dropped_.add(&act_);
    dropped_.release();
}

void Mlp::forward(const Tensor& x, const Tensor& out) {
    dropped_.restore();
    w_gate_.forward(x, gate_);
    w_up_.forward(x, up_);
    ops::swiglu_fwd(gate_, up_, act_);
    w_down_.forward(act_, out);
    dropped_.release();
}

// Workspace slots: 0 d_act, 1 d_gate, 2 d_up.
void Mlp::reserve_scratch(Workspace& ws) const {
    for (int i = 0; i < 3; ++i) ws.reserve_slot(i, gate_.nbytes());
}

void Mlp::backward(const Tensor& x, const Tensor& dout, const Tensor& dx, Workspace& ws) {
    if (!dropped_.empty()) {  // recompute mlp_act / moe_act
        dropped_.restore();
        ops::swiglu_fwd(gate_, up_, act_);
    }
    const core::Device dev = x.device();
    const Tensor d_act = ws.slot(0, gate_.shape(), gate_.dtype(), dev);
    const Tensor d_gate = ws.slot(1, gate_.shape(), gate_.dtype(), dev);
    const Tensor d_up = ws.slot(2, gate_.shape(), gate_.dtype(), dev);
    w_down_.backward(act_, dout, d_act);
    ops::swiglu_bwd(gate_, up_, d_act, d_gate, d_up);
    w_gate_.backward(x, d_gate, dx);
    w_up_.backward(x, d_up, dx, /*accumulate_dx=*/true);
    dropped_.release();
}

std::vector<SavedTensor> Mlp::saved_for_backward() {
    return {{"gate", &gate_}, {"up", &up_}, {"act", &act_}};
}

}  // namespace mt::nn
