// Model hyper-parameters of the dense decoder-only LM ([model] in the job TOML).
#pragma once

#include <cstdint>

namespace mt::nn {

struct ModelConfig {
    int64_t vocab_size = 257;
    int64_t d_model = 128;
    int64_t n_layers = 4;
    int64_t n_heads = 4;
    int64_t n_kv_heads = 4;
    int64_t head_dim = 0;  // 0: d_model / n_heads
    int64_t d_ff = 384;
    int64_t max_seq_len = 256;
    double rope_theta = 10000.0;
    double norm_eps = 1e-5;
    double init_std = 0.02;
    bool tie_embeddings = true;

    int64_t resolved_head_dim() const {
        return head_dim > 0 ? head_dim : d_model / n_heads;
    }
};

}  // namespace mt::nn
