// Attention layer forward and backward, side by side.
#include "nn/layers/attention_layer.h"

#include <cmath>

#include "ops/attention.h"
#include "ops/rope.h"

namespace mt::nn {

AttentionLayer::AttentionLayer(ParamTable& table, const std::string& prefix, const ModelConfig& cfg) : cfg_(cfg) {
    const int64_t d = cfg.resolved_head_dim();
    wq_ = Linear(table, prefix + ".wq", cfg.d_model, cfg.n_heads * d, cfg.init_std);
    wk_ = Linear(table, prefix + ".wk", cfg.d_model, cfg.n_kv_heads * d, cfg.init_std);
    wv_ = Linear(table, prefix + ".wv", cfg.d_model, cfg.n_kv_heads * d, cfg.init_std);
    // GPT-2 style scaled init for projections that write into the residual stream.
    wo_ = Linear(table,
                 prefix + ".wo",
                 cfg.n_heads * d,
                 cfg.d_model,
                 cfg.init_std / std::sqrt(2.0 * static_cast<double>(cfg.n_layers)));
}

void AttentionLayer::resize(int64_t batch, int64_t seq, const Precision& precision) {
    if (batch == batch_ && seq == seq_ && (q_.defined() || !dropped_.empty())) return;
    batch_ = batch;
    seq_ = seq;
    const int64_t d = cfg_.resolved_head_dim();
    const core::DType dtype = precision.compute;
    const core::Device dev = precision.device;
    act_dtype_ = dtype;
    q_ = Tensor::zeros({batch, seq, cfg_.n_heads, d}, dtype, dev);
    k_ = Tensor::zeros({batch, seq, cfg_.n_kv_heads, d}, dtype, dev);
    v_ = Tensor::zeros({batch, seq, cfg_.n_kv_heads, d}, dtype, dev);
    attn_ = Tensor::zeros({batch, seq, cfg_.n_heads, d}, dtype, dev);
    lse_ = Tensor::zeros({batch, cfg_.n_heads, seq}, precision.stats, dev);
    dropped_.clear();
    if (cfg_.recompute.drops(RecomputeModule::attn_core))
        for (Tensor* t : {&q_, &k_, &v_, &attn_, &lse_}) dropped_.add(t);
    dropped_.release();  // allocated in the forward that needs them, so that no two layers hold them at once
}

void AttentionLayer::forward(const Tensor& x, const Tensor& out) {
    const int64_t n = batch_ * seq_;
    dropped_.restore();
    forward_core(x);
    wo_.forward(attn_.reshape({n, attn_.numel() / n}), out);
    dropped_.release();
}

void AttentionLayer::forward_core(const Tensor& x) {
    const int64_t n = batch_ * seq_;
    wq_.forward(x, q_.reshape({n, q_.numel() / n}));
    wk_.forward(x, k_.reshape({n, k_.numel() / n}));
    wv_.forward(x, v_.reshape({n, v_.numel() / n}));
    if (cfg_.attn_rope()) {
        ops::rope_fwd(q_, cfg_.rope_theta, 0, q_, docs_.positions);
        ops::rope_fwd(k_, cfg_.rope_theta, 0, k_, docs_.positions);
    }
    ops::attention_fwd(q_, k_, v_, attn_, lse_, {}, {.doc_start = docs_.doc_start});
}

// Workspace slots: 0 d_attn, 1 d_q, 2 d_k, 3 d_v (all alive together from the attention backward on).
void AttentionLayer::reserve_scratch(Workspace& ws) const {
    const int64_t d = cfg_.resolved_head_dim(), n = batch_ * seq_;
    const size_t q = static_cast<size_t>(n * cfg_.n_heads * d) * core::dtype_size(act_dtype_);
    const size_t kv = static_cast<size_t>(n * cfg_.n_kv_heads * d) * core::dtype_size(act_dtype_);
    ws.reserve_slot(0, q), ws.reserve_slot(1, q), ws.reserve_slot(2, kv), ws.reserve_slot(3, kv);
}

void AttentionLayer::backward(const Tensor& x, const Tensor& dout, const Tensor& dx, Workspace& ws) {
    if (!dropped_.empty()) {  // recompute attn_core
        dropped_.restore();
        forward_core(x);
    }
    const int64_t n = batch_ * seq_;
    auto flat = [n](const Tensor& t) { return t.reshape({n, t.numel() / n}); };
    const core::Device dev = x.device();
    const Tensor d_attn = ws.slot(0, attn_.shape(), attn_.dtype(), dev);
    const Tensor d_q = ws.slot(1, q_.shape(), q_.dtype(), dev);
    const Tensor d_k = ws.slot(2, k_.shape(), k_.dtype(), dev);
    const Tensor d_v = ws.slot(3, v_.shape(), v_.dtype(), dev);
    wo_.backward(flat(attn_), dout, flat(d_attn));
    ops::attention_bwd(q_, k_, v_, attn_, lse_, d_attn, d_q, d_k, d_v, {}, {.doc_start = docs_.doc_start});
    if (cfg_.attn_rope()) {
        ops::rope_bwd(d_q, cfg_.rope_theta, 0, d_q, docs_.positions);
        ops::rope_bwd(d_k, cfg_.rope_theta, 0, d_k, docs_.positions);
    }
    // x feeds three projections: the k and v gradients add into dx inside their matmuls.
    wq_.backward(x, flat(d_q), dx);
    wk_.backward(x, flat(d_k), dx, /*accumulate_dx=*/true);
    wv_.backward(x, flat(d_v), dx, /*accumulate_dx=*/true);
    dropped_.release();
}

std::vector<SavedTensor> AttentionLayer::saved_for_backward() {
    return {{"q", &q_}, {"k", &k_}, {"v", &v_}, {"attn", &attn_}, {"lse", &lse_}};
}

}  // namespace mt::nn
