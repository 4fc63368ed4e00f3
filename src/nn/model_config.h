// Model hyper-parameters of the decoder-only LM ([model] in the job TOML) and of its KDA layers ([kda]). The layer
// pattern picks each block's token mixer: 'A' global softmax attention, 'K' Kimi Delta Attention (KDA).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "nn/enum_names.h"
#include "nn/moe_config.h"
#include "nn/recompute.h"
#include "nn/segments.h"
#include "nn/vision/vision_config.h"
#include "ops/kda.h"
#include "ops/kda_gate.h"

namespace mt::nn {

// kda.save: what the KDA op keeps from a training forward to its backward (GPU only; kda.md §4.6). From tiles on,
// each level keeps what the one before keeps and more; states_bf16 stands apart.
enum class KdaSave {
    none,         // the backward recomputes everything (the default)
    states_bf16,  // the state entering each chunk and Vn alone, in bf16 (768 B per token and value head at K = V = 128)
    tiles,        // the chunk tiles A, M, T (768 B per token and value head at chunk 64)
    states,       // also the state entering each chunk and Vn (1,536 B more at K = V = 128)
    workspace,    // everything the backward would recompute (Gamma, Qg, Kg, W: 2,048 B more than states at K = 128)
};

template <>
struct EnumNames<KdaSave> {
    static constexpr std::array<std::pair<KdaSave, const char*>, 5> names = {{{KdaSave::none, "none"},
                                                                              {KdaSave::states_bf16, "states_bf16"},
                                                                              {KdaSave::tiles, "tiles"},
                                                                              {KdaSave::states, "states"},
                                                                              {KdaSave::workspace, "workspace"}}};
};

template <>
struct EnumNames<ops::KdaGateKind> {
    static constexpr std::array<std::pair<ops::KdaGateKind, const char*>, 2> names = {
        {{ops::KdaGateKind::lower_bound, "lower_bound"}, {ops::KdaGateKind::softplus, "softplus"}}};
};

template <>
struct EnumNames<ops::KdaAlgorithm> {
    static constexpr std::array<std::pair<ops::KdaAlgorithm, const char*>, 2> names = {
        {{ops::KdaAlgorithm::chunked, "chunked"}, {ops::KdaAlgorithm::recurrent, "recurrent"}}};
};

// attnres.mode: the residual connection. off: the plain residual stream; block: Block Attention Residuals over
// blocks of attnres.block_size sub-layers; full: block with one sub-layer per block.
enum class AttnResMode { off, block, full };

template <>
struct EnumNames<AttnResMode> {
    static constexpr std::array<std::pair<AttnResMode, const char*>, 3> names = {
        {{AttnResMode::off, "off"}, {AttnResMode::block, "block"}, {AttnResMode::full, "full"}}};
};

// KDA layer settings (kda.md §6, [kda] in the job TOML). Zero sizes take their value from the ModelConfig.
struct KdaConfig {
    int64_t num_heads = 0;    // H; 0: ModelConfig::n_heads
    int64_t num_v_heads = 0;  // HV (a multiple of H); 0: H
    int64_t head_dim = 0;     // K; 0: ModelConfig::resolved_head_dim()
    int64_t head_v_dim = 0;   // V; 0: K
    int64_t conv_size = 4;    // short conv taps
    // lower_bound: g = l sigmoid(a (u + b)); softplus: g = -a softplus(u + b)
    ops::KdaGateKind gate = ops::KdaGateKind::lower_bound;
    double gate_lower_bound = -5.0;  // l, in [-5, 0)
    bool gate_use_a_log = true;      // per-head temperature a = exp(A_log); false: a = 1
    // chunked | recurrent (the token loop: a reference, slow)
    ops::KdaAlgorithm algorithm = ops::KdaAlgorithm::chunked;
    int64_t chunk_size = 64;       // 64 or 32
    KdaSave save = KdaSave::none;  // what the forward keeps for the backward (GPU)
};

// Block Attention Residuals (attnres.md, [attnres] in the job TOML): each sub-layer's input is a learned softmax mix
// of the embedding, the completed blocks of S sub-layers and the running partial sum of the current block.
struct AttnResConfig {
    AttnResMode mode = AttnResMode::off;
    int64_t block_size = 6;       // S in sub-layers (a transformer layer has two: the mixer and the MLP)
    bool freeze_queries = false;  // keep the pseudo-queries at zero (equivalence test, ablation)
    // Pipeline parallelism: a hop sends only the sources the next stage did not keep from its previous chunk of the
    // micro-batch (attnres.md §7); false sends every source of the chunk's first mix on every hop (the baseline).
    bool pp_cache = true;
    // Residual blend (attnres.md §5, an ablation knob, off by default): each mix's weights become
    // lambda / m + (1 - lambda) alpha, lambda(t) = residual_blend * max(0, 1 - t / residual_blend_steps) at
    // optimizer step t (residual_blend_steps = 0: lambda stays residual_blend).
    double residual_blend = 0.0;
    int64_t residual_blend_steps = 0;

    bool enabled() const {
        return mode != AttnResMode::off;
    }
    int64_t resolved_block_size() const {
        return mode == AttnResMode::full ? 1 : block_size;
    }
    // Sources of the last mix over n_layers layers (2 sub-layers each): the embedding and one per block begun.
    int64_t max_sources(int64_t n_layers) const {
        const int64_t sub_layers = 2 * n_layers, s = resolved_block_size();
        return (sub_layers + s - 1) / s + 1;
    }
    double blend_at(int64_t step) const {
        if (residual_blend_steps <= 0) return residual_blend;
        const double left = 1.0 - static_cast<double>(step) / static_cast<double>(residual_blend_steps);
        return residual_blend * (left > 0.0 ? left : 0.0);
    }
};

// Sliding-window softmax attention with global (memory) tokens and a sink logit (long_context.md §2, `attn.*`).
struct AttnWindowConfig {
    int64_t window = 4096;               // w: a window layer's query sees itself and the w - 1 keys before it
    std::vector<int64_t> window_layers;  // the attention layers (1-based layer numbers) that use the window
    int64_t global_tokens = 4;           // g learned memory tokens of every window layer (0: none)
    bool sink_logit = false;             // a learned per-head logit in every softmax layer's denominator
    double window_rope_base = 10000.0;   // RoPE base of window layers; 0: no position encoding there
};

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
    // Layer l's mixer is layer_pattern[l % size]: 'A' attention, 'K' KDA; the length must divide n_layers.
    std::string layer_pattern = "A";
    // Position encoding of the attention layers: rope | nope | auto (rope when every layer is attention, nope in a
    // hybrid model, where KDA's decay and short conv carry position).
    std::string attn_pos = "auto";
    KdaConfig kda;
    AttnWindowConfig attn;
    AttnResConfig attnres;
    RecomputeConfig recompute;  // which saved activations are dropped and rebuilt in the backward
    // The LM head and loss run over row chunks of this many tokens (long_context.md §5, `loss.chunk_tokens`), so
    // the [N, V] logits are never held whole: one [chunk, V] buffer, whose logits the backward recomputes chunk by
    // chunk. 0, or a batch of at most this many tokens: one chunk, the logits kept from the forward (no recompute).
    int64_t loss_chunk_tokens = 4096;
    // Sequence segments (long_context.md §4, `long.segments` / `long.segment_tokens`): a batch's sequence runs as
    // consecutive segments with exact gradients, so that only one segment's activations are held at a time.
    SegmentConfig segments;
    // Document masking of packed sequences (long_context.md §2, `data.document_mask`): a document ends at every
    // eot_token id (`data.eot_token`; the config resolves -1 to the tokenizer's EOT), no token's mixer sees another
    // document, and RoPE positions restart at each document (nn/documents.h).
    bool document_mask = false;
    int64_t eot_token = -1;
    // The vision encoder and projector of image + text training ([vision], [projector]; multimodal.md): off (0 layers)
    // for a text-only model.
    VisionConfig vision;
    // Mixture-of-Experts FFN ([moe], moe.md §5): with moe_enabled, layer l's FFN is an MoE layer
    // (nn/layers/moe_layer.h) for l >= moe_first_k_dense; the leading layers keep a dense SwiGLU MLP of width
    // moe_dense_ffn_dim (0: d_ff). The FFN choice is independent of the mixer's layer_pattern, so MoE mixes with
    // attention and KDA layers.
    bool moe_enabled = false;
    int64_t moe_first_k_dense = 1;
    int64_t moe_dense_ffn_dim = 0;
    MoeConfig moe;

    // Rows per LM-head chunk for a micro-batch of n tokens: loss_chunk_tokens, or n when that is 0 or at least n.
    int64_t loss_chunk_rows(int64_t n) const {
        return loss_chunk_tokens > 0 && loss_chunk_tokens < n ? loss_chunk_tokens : n;
    }
    int64_t resolved_head_dim() const {
        return head_dim > 0 ? head_dim : d_model / n_heads;
    }
    bool layer_is_kda(int64_t layer) const {
        return layer_pattern[static_cast<size_t>(layer) % layer_pattern.size()] == 'K';
    }
    int64_t n_kda_layers() const {
        int64_t n = 0;
        for (int64_t l = 0; l < n_layers; ++l) n += layer_is_kda(l) ? 1 : 0;
        return n;
    }
    // KDA sizes with the defaults applied: H, HV, K, V.
    int64_t kda_num_heads() const {
        return kda.num_heads > 0 ? kda.num_heads : n_heads;
    }
    int64_t kda_num_v_heads() const {
        return kda.num_v_heads > 0 ? kda.num_v_heads : kda_num_heads();
    }
    int64_t kda_head_dim() const {
        return kda.head_dim > 0 ? kda.head_dim : resolved_head_dim();
    }
    int64_t kda_head_v_dim() const {
        return kda.head_v_dim > 0 ? kda.head_v_dim : kda_head_dim();
    }
    bool layer_is_moe(int64_t layer) const {
        return moe_enabled && layer >= moe_first_k_dense;
    }
    int64_t n_moe_layers() const {
        int64_t n = 0;
        for (int64_t l = 0; l < n_layers; ++l) n += layer_is_moe(l) ? 1 : 0;
        return n;
    }
    int64_t dense_ffn_dim() const {
        return moe_enabled && moe_dense_ffn_dim > 0 ? moe_dense_ffn_dim : d_ff;
    }
    bool attn_rope() const {
        return attn_pos == "rope" || (attn_pos == "auto" && layer_pattern.find('K') == std::string::npos);
    }
    // Whether layer l (0-based) is an attention layer listed in attn.window_layers (1-based).
    bool layer_is_window(int64_t layer) const {
        if (layer_is_kda(layer)) return false;
        for (int64_t w : attn.window_layers)
            if (w == layer + 1) return true;
        return false;
    }
    int64_t n_window_layers() const {
        int64_t n = 0;
        for (int64_t l = 0; l < n_layers; ++l) n += layer_is_window(l) ? 1 : 0;
        return n;
    }
};

// Pipeline parallelism: the model chunks this rank holds, as global layer ranges [first, last) in model order (rank
// s of p with v virtual stages holds chunks s, s + p, ...; docs/distributed.md). The chunk that starts at layer 0
// holds the embedding, the one that ends at n_layers the final norm, LM head and loss (and, with tied embeddings, its
// own copy of the embedding as the head). Empty: one chunk of every layer, the whole model.
struct ModelPart {
    std::vector<std::pair<int64_t, int64_t>> chunks;
};

}  // namespace mt::nn
