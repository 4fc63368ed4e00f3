// Workspace sizing, and the saved-bytes helper of the layer contract.
#include "nn/workspace.h"

#include "nn/layer.h"

namespace mt::nn {

void Workspace::resize(const ModelConfig& cfg, int64_t batch, int64_t seq, const Precision& precision) {
    const int64_t n = batch * seq, d = cfg.resolved_head_dim();
    if (d_norm.defined() && d_norm.size(0) == n) return;
    const core::DType dtype = precision.compute;
    const core::Device dev = precision.device;
    using core::Tensor;
    d_norm = Tensor::zeros({n, cfg.d_model}, dtype, dev);
    d_tmp = Tensor::zeros({n, cfg.d_model}, dtype, dev);
    d_q = Tensor::zeros({batch, seq, cfg.n_heads, d}, dtype, dev);
    d_k = Tensor::zeros({batch, seq, cfg.n_kv_heads, d}, dtype, dev);
    d_v = Tensor::zeros({batch, seq, cfg.n_kv_heads, d}, dtype, dev);
    d_attn = Tensor::zeros({batch, seq, cfg.n_heads, d}, dtype, dev);
    d_gate = Tensor::zeros({n, cfg.dense_ffn_dim()}, dtype, dev);
    d_up = Tensor::zeros({n, cfg.dense_ffn_dim()}, dtype, dev);
    d_act = Tensor::zeros({n, cfg.dense_ffn_dim()}, dtype, dev);
}

size_t saved_bytes(const std::vector<SavedTensor>& saved) {
    size_t bytes = 0;
    for (const auto& s : saved) bytes += s.tensor->defined() ? s.tensor->nbytes() : 0;
    return bytes;
}

}  // namespace mt::nn
