// A batch's way into the model (model.h's prepare_batch, plan_segments, begin_pass): its host copies, documents and
// loss count, its segments, and the inputs and per-pass settings of each pass's blocks.
#include <algorithm>
#include <vector>

#include "nn/layer_stats.h"
#include "nn/model.h"
#include "parallel/comm.h"

namespace mt::nn {

void Model::prepare_batch(const Tensor& ids, const Tensor& targets, bool training, bool reset_metrics) {
    MT_CHECK(ids.ndim() == 2 && ids.shape() == targets.shape(),
             "ids {} and targets {} must both be [B, T]",
             core::shape_str(ids.shape()),
             core::shape_str(targets.shape()));
    MT_CHECK(ids.size(1) <= cfg_.max_seq_len,
             "sequence length {} exceeds model.max_seq_len {}",
             ids.size(1),
             cfg_.max_seq_len);
    training_ = training;
    const int64_t batch = ids.size(0), seq = ids.size(1);
    if (cp_.active())  // the config refuses it first (exit 2, naming the key)
        MT_CHECK(seq % parallel::cp_granularity(cp_.size) == 0,
                 "context parallelism over {} ranks needs a multiple of {} tokens, not {}",
                 cp_.size,
                 parallel::cp_granularity(cp_.size),
                 seq);
    bounds_ = cfg_.segments.enabled() ? plan_segments(seq) : std::vector<int64_t>{0, seq};
    // The loss is the mean over the whole batch's counted targets, whatever the segments.
    const Tensor host_targets = targets.device() == core::Device::cpu ? targets : targets.to_device(core::Device::cpu);
    counted_ = 0;
    for (int64_t i = 0; i < host_targets.numel(); ++i)
        counted_ += core::tensor_get_flat(host_targets, i) != kIgnoreIndex ? 1 : 0;
    seq_ids_ = ids.device() == core::Device::cpu ? ids.clone() : ids.to_device(core::Device::cpu);
    seq_targets_ = host_targets.clone();
    seq_docs_ = cfg_.document_mask
                    ? documents_from_ids(seq_ids_, static_cast<int32_t>(cfg_.eot_token), core::Device::cpu)
                    : Documents{};
    total_seq_ = seq;
    const int64_t segments = static_cast<int64_t>(bounds_.size()) - 1;
    if (reset_metrics && !max_logit_per_step_) reset_max_logits();
    seq_losses_ = segments > 1 || cp_.active() ? Tensor::zeros({batch * seq}, precision_.stats) : Tensor();
    vision_prepare();
}

Tensor Model::in_place(Tensor& buffer, const Tensor& host, core::Device device) {
    if (!buffer.defined() || buffer.shape() != host.shape() || buffer.device() != device)
        buffer = Tensor::zeros(host.shape(), host.dtype(), device);  // a new shape: the graphs are recorded again
    buffer.copy_from(host);
    return buffer;
}

std::vector<int64_t> Model::plan_segments(int64_t seq) const {
    MT_CHECK(cfg_.moe.capacity_factor <= 0.0 && cfg_.moe.balance.mode != MoeBalanceMode::aux_loss,
             "sequence segments need dropless MoE without the auxiliary loss (both are per batch, not per token)");
    // The causal attention FLOPs grow with the position: 12 (Hq D) per key per query and layer, fwd + bwd.
    const int64_t n_attn = cfg_.n_layers - cfg_.n_kda_layers() - cfg_.n_window_layers();
    const double per_key = 12.0 * static_cast<double>(n_attn * cfg_.n_heads * cfg_.resolved_head_dim());
    const double linear = flops_per_token(seq) - per_key * 0.5 * static_cast<double>(seq);
    // Under context parallelism every segment is cut in 2 cp chunks of whole 64-token blocks (CpBatch).
    const int64_t granule = cp_.active()              ? parallel::cp_granularity(cp_.size)
                            : cfg_.n_kda_layers() > 0 ? cfg_.kda.chunk_size
                                                      : 64;
    std::vector<int64_t> bounds = nn::segment_bounds(cfg_.segments, seq, granule, linear, per_key);
    if (cp_.active())
        for (int64_t b : bounds)
            MT_CHECK(b % granule == 0,
                     "segment boundary {} is not a multiple of 2 x cp x 64 = {}: context parallelism cuts every "
                     "segment into 2 x {} chunks of whole 64-token blocks",
                     b,
                     granule,
                     cp_.size);
    const int64_t halo = cfg_.n_kda_layers() > 0 ? cfg_.kda.conv_size - 1 : 0;
    for (size_t j = 0; j + 2 < bounds.size(); ++j)
        MT_CHECK(bounds[j + 1] - bounds[j] >= std::max<int64_t>(halo, 1),
                 "segment {} of [{}, {}) is shorter than the short conv's halo of {} tokens",
                 j,
                 bounds[j],
                 bounds[j + 1],
                 halo);
    return bounds;
}

void Model::begin_pass(int64_t batch, int64_t j, bool recompute, bool count_routing) {
    // The pass runs positions [first, first + whole) of every row; under context parallelism this rank's 2 cp-th of
    // them (its zigzag chunks of the segment, or of the sequence without segments).
    const int64_t first = bounds_[static_cast<size_t>(j)];
    const int64_t whole = bounds_[static_cast<size_t>(j) + 1] - first;
    const int64_t len = cp_.active() ? whole / cp_.size : whole;
    const int64_t segments = static_cast<int64_t>(bounds_.size()) - 1;
    pass_ = j;
    resize(batch, len);
    x0_ = chunk_in_[static_cast<size_t>(chunk_)];
    const int64_t n = batch * len;
    const core::Device dev = precision_.device;
    // The pass's rows of a [B, total] host map: a segment's, or this cp rank's two chunks.
    auto rows = [&](const Tensor& map) {
        const Tensor pass = time_rows(map, first, whole);
        return cp_.active() ? cp_local(cp_, pass) : pass;
    };
    host_targets_.copy_from(rows(seq_targets_).reshape({n}));
    const Tensor host_ids = rows(seq_ids_).reshape({n});
    ids_.copy_from(host_ids);
    if (moe_modality_) moe_modality_prepare(host_ids);
    targets_.copy_from(host_targets_);
    docs_ = Documents{};
    const CpBatch cp_batch{.total = whole, .first = first, .host_doc_start = seq_docs_.doc_start};
    if (cp_.active()) {  // the mixers take the whole row's document map (cp_batch), RoPE global positions
        const Tensor pos = seq_docs_.defined() ? time_rows(seq_docs_.positions, first, whole) : Tensor();
        docs_.positions = on_device(cp_local_positions(cp_, pos, batch, whole, first), dev);
    } else if (seq_docs_.defined()) {
        // The segment's own map, from its first position (a document that began earlier starts at 0), and each
        // token's position in its document (RoPE), built on the host.
        const Tensor doc_start = doc_map_from(seq_docs_.doc_start, first, first + len, core::Device::cpu);
        const Tensor pos = time_rows(seq_docs_.positions, first, len);
        if (graphs_.enabled && num_chunks() == 1 && segments == 1) {
            // With CUDA graphs they are uploaded into buffers that stay put from batch to batch: a replay reads them
            // where the recording found them. Only then, and only for one pass over the whole model: a pipeline's
            // chunks keep their own micro-batches' maps, and sequence segments their own (graphs run neither).
            docs_.doc_start = in_place(graphs_.doc_start, doc_start, dev);
            docs_.positions = in_place(graphs_.positions, pos, dev);
        } else {
            docs_.doc_start = on_device(doc_start, dev);
            docs_.positions = dev == core::Device::cpu ? pos.clone() : pos.to_device(dev);
        }
    }
    const SegmentContext seg{.index = j,
                             .count = segments,
                             .first = first,
                             .length = whole,
                             .total = total_seq_,
                             .recompute = recompute,
                             .host_doc_start = seq_docs_.doc_start};
    // Routing is counted once per token, by the first forward. KDA keeps its tiles (kda.save) for a backward that
    // follows at once: the last segment's first forward, every re-run, not recompute full's first forward.
    const bool full = cfg_.recompute.full();
    const bool count = training_ && !recompute && count_routing;
    const bool keep = training_ && !full && (recompute || j == segments - 1);
    // The active chunk's blocks only: another pipeline chunk's layers keep their own segment state (their kept KDA
    // states and caches belong to their own passes).
    const bool stats = count && layer_stats_.defined();
    const double kda_low = layer_stats_kda_low(cfg_);
    pass_stats_ = stats ? layer_stats_ : Tensor();
    if (attnres_) attnres_->set_layer_stats(pass_stats_);
    for (int64_t l = chunk_lo(); l < chunk_hi(); ++l) {
        Block& b = *blocks_[static_cast<size_t>(l)];
        const int64_t at = LayerStatsLayout{}.act(block_layer_[static_cast<size_t>(l)]);
        b.set_layer_stats(stats ? layer_stats_.slice(0, at, at + 8) : Tensor(), kda_low);
        b.set_documents(docs_);
        b.set_segment(seg);
        if (cp_.active()) b.set_context_parallel(cp_batch);
        b.set_forward_flags(count, keep);
    }
}

}  // namespace mt::nn
