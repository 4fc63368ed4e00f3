// The optimizer step of a training step: AdamW over its group (scaled by the global-norm clip), Muon over the
// hidden matrices (never by the global clip: muon.md §5), and the metrics of muon.md §8.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>

#include "core/clock.h"
#include "nn/layers/attention_layer.h"
#include "nn/qk_clip.h"
#include "parallel/comm.h"
#include "train/trainer.h"

namespace mt::train {

void Trainer::optimizer_step(StepResult& r, bool layer_stats) {
    const auto start = std::chrono::steady_clock::now();
    const auto& t = cfg_.train;
    OptimStepMetrics& o = r.optim;
    // As torch.nn.utils.clip_grad_norm_: scale by max_norm / (norm + 1e-6) when the norm exceeds max_norm; the loss
    // scale is divided out in the same multiplier.
    o.clip_coef = t.grad_clip > 0 && r.grad_norm > t.grad_clip ? t.grad_clip / (r.grad_norm + 1e-6) : 1.0;
    const bool metrics = metrics_step();
    const core::Tensor update_sq = layer_stats ? update_sq_ : core::Tensor();
    // AdamW alone updates every weight: its pass also sums the updated weights' squares (the metrics' weight norms),
    // which otherwise take a pass over the master weights of their own (and do where QK-clip rescales rows after).
    param_sq_measured_ = layer_stats && !muon_;
    adamw_->step(
        r.lr, step_ + 1, o.clip_coef / r.loss_scale, update_sq, param_sq_measured_ ? param_sq_ : core::Tensor());
    if (muon_) {
        // Muon's gradients are not scaled by the global norm (Newton-Schulz discards the magnitude, and a clip driven
        // by another group's spike would shrink them to the epsilon); muon.clip = "own_norm" clips them by their own.
        const nn::ParamTable& table = model_->params();
        std::vector<int> group_of(static_cast<size_t>(table.size()));
        for (int i = 0; i < table.size(); ++i)
            group_of[size_t(i)] = table.spec(i).group == nn::OptimGroup::muon ? 0 : 1;
        double muon_scale = 1.0 / r.loss_scale;
        if (fault_ && fault_->legacy_muon_clip) muon_scale *= o.clip_coef;  // tests only (FaultInjection)
        // o.muon_grad_norm and o.adamw_grad_norm: from the global norm's pass (compute_gradients).
        if (cfg_.muon.clip == "own_norm" && t.grad_clip > 0 && o.muon_grad_norm > t.grad_clip) {
            o.muon_clip_coef = t.grad_clip / (o.muon_grad_norm + 1e-6);
            muon_scale *= o.muon_clip_coef;
        }
        const auto muon_start = std::chrono::steady_clock::now();
        optim::Muon::StepStats stats;
        o.muon_overlapped_batches = muon_->staged_batches();
        if (o.muon_overlapped_batches > 0)  // stepped inside the reduction's wait (muon_overlaps): write it in
            muon_->commit(update_sq, metrics ? &stats : nullptr);
        else
            muon_->step(r.lr, muon_scale, update_sq, metrics ? &stats : nullptr);
        o.muon_seconds = core::seconds_since(muon_start) + muon_stage_seconds_;
        if (metrics) {
            // The change's RMS over every Muon element of the job, and ||N|| over every matrix (each counted by
            // the ranks that hold it: GradSync's weights).
            const std::vector<double> change = grad_sync_->group_sums(stats.update_sq, group_of, 2);
            double sums[3] = {change[0], 0.0, static_cast<double>(stats.n_norm.size())};
            for (double n : stats.n_norm) sums[1] += n;
            double lo = stats.n_norm.empty() ? INFINITY : *std::min_element(stats.n_norm.begin(), stats.n_norm.end());
            double hi = stats.n_norm.empty() ? 0.0 : *std::max_element(stats.n_norm.begin(), stats.n_norm.end());
            parallel::Comm& world = mesh_->world();
            if (world.size() > 1) {
                world.all_reduce(sums, 3, parallel::CommType::f64, parallel::ReduceOp::sum).wait();
                world.all_reduce(&lo, 1, parallel::CommType::f64, parallel::ReduceOp::min).wait();
                world.all_reduce(&hi, 1, parallel::CommType::f64, parallel::ReduceOp::max).wait();
            }
            int64_t numel = 0;
            for (int i = 0; i < table.size(); ++i)
                if (group_of[size_t(i)] == 0) numel += core::shape_numel(nn::param_global_shape(table.spec(i)));
            o.muon_update_rms = numel > 0 ? std::sqrt(sums[0] / static_cast<double>(numel)) : 0.0;
            // Replicated Muon: every rank of a group measured every matrix, so the mean holds; min and max are exact.
            o.n_norm_mean = sums[2] > 0 ? sums[1] / sums[2] : 0.0;
            o.n_norm_min = std::isfinite(lo) ? lo : 0.0;
            o.n_norm_max = hi;
        }
    }
    if (metrics && grad_sync_->compressing()) {
        const parallel::CompressReport c = grad_sync_->compress_report();
        double sums[6] = {c.stats.g_sq,
                          c.stats.p_sq,
                          c.stats.err_sq,
                          c.stats.e_sq,
                          static_cast<double>(c.wire_bytes),
                          static_cast<double>(c.raw_bytes)};
        mesh_->world().all_reduce(sums, 6, parallel::CommType::f64, parallel::ReduceOp::sum).wait();
        o.compress_ef_ratio = sums[0] > 0 ? std::sqrt(sums[3] / sums[0]) : 0.0;
        o.compress_error = sums[1] > 0 ? std::sqrt(sums[2] / sums[1]) : 0.0;
        o.compress_wire_bytes = static_cast<int64_t>(sums[4]);
        o.compress_raw_bytes = static_cast<int64_t>(sums[5]);
    }
    if (cfg_.optim.qk_clip) o.qk_clipped_heads = qk_clip();
    if (o.qk_clipped_heads > 0) param_sq_measured_ = false;
    grad_sync_->gather_params();  // ZeRO-1: every rank's updated slices and matrices to every replica
    o.step_seconds = core::seconds_since(start);
}

int64_t Trainer::qk_clip() {
    // S per head over the step's micro-batches (the layers keep it; cp is reduced inside them) and the data ranks.
    nn::ParamTable& table = model_->params();
    const bool copy = table.precision().has_master_copy();
    int64_t clipped = 0;
    const std::vector<nn::AttentionLayer*> layers = model_->attention_layers();
    std::vector<double> all;  // every layer's per-head maxima, one all-reduce for the step
    for (nn::AttentionLayer* a : layers) all.insert(all.end(), a->head_max_logit().begin(), a->head_max_logit().end());
    parallel::Comm& span = mesh_->group(parallel::MeshGroup::dp_span);
    if (span.size() > 1 && !all.empty())
        span.all_reduce(all.data(), static_cast<int64_t>(all.size()), parallel::CommType::f64, parallel::ReduceOp::max)
            .wait();
    if (kv_replicas_) {
        // Tensor parallelism over more ranks than kv heads: a kv group's query heads are spread over the tp ranks
        // holding its (replicated) key head, so S_g is their maximum: each head takes its group's, reduced over them.
        std::vector<double> groups;
        std::vector<size_t> group_of(all.size());  // each head's kv group, over every layer
        size_t at = 0;
        for (nn::AttentionLayer* a : layers) {
            const auto n = static_cast<int64_t>(a->head_max_logit().size()),
                       per = n / std::max<int64_t>(a->local_kv_heads(), 1);
            for (int64_t h = 0; h < n; ++h, ++at) {
                if (h % per == 0) groups.push_back(-INFINITY);
                group_of[at] = groups.size() - 1;
                groups.back() = std::max(groups.back(), all[at]);
            }
        }
        if (!groups.empty())
            kv_replicas_
                ->all_reduce(groups.data(), int64_t(groups.size()), parallel::CommType::f64, parallel::ReduceOp::max)
                .wait();
        for (size_t h = 0; h < all.size(); ++h) all[h] = groups[group_of[h]];
    }
    size_t at = 0;
    for (nn::AttentionLayer* a : layers) {
        const std::vector<double> s(all.begin() + static_cast<std::ptrdiff_t>(at),
                                    all.begin() + static_cast<std::ptrdiff_t>(at + a->head_max_logit().size()));
        at += s.size();
        if (s.empty()) continue;
        const nn::QkClipFactors f = nn::qk_clip_factors(
            s, a->local_heads(), a->local_kv_heads(), a->head_dim(), cfg_.optim.qk_clip_tau, cfg_.optim.qk_clip_alpha);
        if (!f.any) continue;
        clipped += f.heads_clipped;
        // The rows of Wq and Wk this rank updated: the whole tensors, or under ZeRO-1 the owned ranges (a slice of
        // an element-sharded weight, or a whole-owned Muon matrix); the gather then brings them to the others.
        for (const auto& [param, scale] :
             {std::pair{a->wq_param(), &f.q_row_scale}, std::pair{a->wk_param(), &f.k_row_scale}}) {
            const int64_t lo = table.offset(param), hi = lo + core::shape_numel(table.spec(param).shape);
            for (const optim::ArenaRange& r : grad_sync_->owned()) {
                const int64_t b = std::max(lo, r.begin), e = std::min(hi, r.end);
                if (b >= e) continue;
                nn::qk_clip_scale_rows_range(table.master(param), *scale, b - lo, e - lo);
                if (copy) table.param_arena().slice(0, b, e).copy_from(table.master_arena().slice(0, b, e));
            }
        }
    }
    // The query heads clipped over the job: each tp rank counted its own.
    parallel::Comm& tp = mesh_->group(parallel::MeshGroup::tp);
    if (tp.size() > 1) {
        double count = static_cast<double>(clipped);
        tp.all_reduce(&count, 1, parallel::CommType::f64, parallel::ReduceOp::sum).wait();
        clipped = static_cast<int64_t>(count);
    }
    return clipped;
}

std::function<void(int)> Trainer::muon_stage_hook(const StepResult& r) {
    // Muon's overlap (muon.md §3): each bucket's matrices are stepped (into side buffers, committed by the optimizer
    // step once the step is accepted) as soon as the bucket's reduction lands, while the later ones are in flight.
    if (muon_) muon_->discard();  // a re-run starts over
    muon_stage_seconds_ = 0.0;
    if (!muon_overlaps()) return {};
    return [this, &r, measure = metrics_step() || layer_stats_step()](int bucket) {
        const auto start = std::chrono::steady_clock::now();
        muon_->stage(bucket, r.lr, 1.0 / r.loss_scale, measure);
        muon_stage_seconds_ += core::seconds_since(start);
    };
}

bool Trainer::muon_overlaps() const {
    return muon_ && grad_sync_->active() && cfg_.muon.clip == "none" && !scaler_.dynamic() && !kv_replicas_ && !fault_;
}

void Trainer::add_optim_metrics(const StepResult& r, nlohmann::json& fields) const {
    const OptimStepMetrics& o = r.optim;
    fields["optim/clip_coef"] = o.clip_coef;
    fields["optim/step_seconds"] = o.step_seconds;
    if (cfg_.optim.qk_clip) fields["optim/qk_clipped_heads"] = o.qk_clipped_heads;
    if (!muon_) return;
    fields["optim/muon_seconds"] = o.muon_seconds;
    fields["optim/muon_overlapped_batches"] = o.muon_overlapped_batches;
    fields["optim/muon_clip_coef"] = o.muon_clip_coef;
    fields["optim/muon_grad_norm"] = o.muon_grad_norm;
    fields["optim/adamw_grad_norm"] = o.adamw_grad_norm;
    fields["optim/muon_update_rms"] = o.muon_update_rms;
    fields["optim/muon_n_norm_min"] = o.n_norm_min;
    fields["optim/muon_n_norm_mean"] = o.n_norm_mean;
    fields["optim/muon_n_norm_max"] = o.n_norm_max;
    if (grad_sync_->compressing()) {
        fields["compress/ef_ratio"] = o.compress_ef_ratio;
        fields["compress/error"] = o.compress_error;
        fields["compress/wire_bytes"] = o.compress_wire_bytes;
        fields["compress/raw_bytes"] = o.compress_raw_bytes;
    }
}

}  // namespace mt::train
