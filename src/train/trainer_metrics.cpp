// Trainer <-> the registry's step figures (metric_registry.h, docs/metrics.md): the data position, the model FLOPs
// rate and MFU, and the per-layer figures of the metrics steps: gradient and weight norms (GradSync), and the sums
// the forwards and the optimizer leave in the stat buffer on the device (nn/layer_stats.h): update norm and ratio,
// activation RMS, KDA gate, AttnRes mix weights and entropy.
#include <cmath>
#include <regex>

#include "nn/vision/vision_flops.h"
#include "ops/layer_stats.h"
#include "train/trainer.h"

namespace mt::train {

void Trainer::setup_layer_stats() {
    // "layers.<l>.<rest>": the block's parameters; the embedding, final norm, head and AttnRes queries are no layer's.
    // The vision encoder and the projector are two groups after the layers (multimodal.md §8: their gradient norms).
    static const std::regex layer_name(R"(^layers\.(\d+)\..*)");
    const nn::ParamTable& table = model_->params();
    const int layers = static_cast<int>(cfg_.model.n_layers);
    const int groups = nn::layer_stats_param_groups(cfg_.model);
    layer_of_param_.assign(static_cast<size_t>(table.size()), -1);
    for (int i = 0; i < table.size(); ++i) {
        const std::string& name = table.spec(i).name;
        std::smatch m;
        if (std::regex_match(name, m, layer_name))
            layer_of_param_[static_cast<size_t>(i)] = std::stoi(m[1].str());
        else if (groups > layers && name.starts_with("vision."))
            layer_of_param_[static_cast<size_t>(i)] = layers;
        else if (groups > layers && name.starts_with("projector."))
            layer_of_param_[static_cast<size_t>(i)] = layers + 1;
    }
    // Under Muon the global norm's pass also gives the two optimizer groups' norms: each layer's group split in two,
    // 2 x group + 1 for a Muon matrix (a parameter of no layer's in a group of its own after them).
    norm_group_of_.clear();
    if (muon_)
        for (int i = 0; i < table.size(); ++i) {
            const int group =
                layer_of_param_[static_cast<size_t>(i)] < 0 ? groups : layer_of_param_[static_cast<size_t>(i)];
            norm_group_of_.push_back(2 * group + (table.spec(i).group == nn::OptimGroup::muon ? 1 : 0));
        }
    stats_layout_ = nn::layer_stats_layout(cfg_.model);
}

void Trainer::layer_stats_begin() {
    if (!layer_stats_step()) {
        model_->set_layer_stats(core::Tensor());
        return;
    }
    const core::Device device = model_->params().precision().device;
    const int64_t params = model_->params().size();
    if (!stats_.defined()) {
        stats_ = core::Tensor::zeros({stats_layout_.size + 2 * params}, core::DType::f64, device);
        // The optimizer's sums beside the layers' (one copy back), unless the update runs on the host (offload).
        optimizer_sums_ = adamw_->update_device() == device
                              ? stats_.slice(0, stats_layout_.size, stats_layout_.size + 2 * params)
                              : core::Tensor::zeros({2 * params}, core::DType::f64, adamw_->update_device());
        update_sq_ = optimizer_sums_.slice(0, 0, params);
        param_sq_ = optimizer_sums_.slice(0, params, 2 * params);
    }
    stats_.zero();
    optimizer_sums_.zero();
    model_->set_layer_stats(stats_.slice(0, 0, stats_layout_.size));
}

void Trainer::layer_stats_end(StepResult& r) {
    model_->set_layer_stats(core::Tensor());
    // The one copy to the host of the step (the update's sums come with it unless they are on the host already).
    const core::Tensor host = stats_.device() == core::Device::cpu ? stats_ : stats_.to_device(core::Device::cpu);
    const bool beside = adamw_->update_device() == stats_.device();
    const core::Tensor optimizer = beside ? host.slice(0, stats_layout_.size, host.numel()) : optimizer_sums_;
    const double* u = optimizer.data<double>();
    const int64_t params = optimizer.numel() / 2;
    const int layers = nn::layer_stats_param_groups(cfg_.model);
    // Each rank's change of what it updated (and the updated weights' squares), divided by the ranks updating the
    // same elements (GradSync), then the layers' slot sums: every figure of the job is a sum over the world.
    std::vector<double> sums = grad_sync_->group_sums(std::vector<double>(u, u + params), layer_of_param_, layers);
    if (param_sq_measured_) {
        const std::vector<double> weights =
            grad_sync_->group_sums(std::vector<double>(u + params, u + 2 * params), layer_of_param_, layers);
        sums.insert(sums.end(), weights.begin(), weights.end());
    }
    const double* slots = host.data<double>();
    sums.insert(sums.end(), slots, slots + stats_layout_.size);
    parallel::Comm& world = mesh_->world();
    if (world.size() > 1)
        world
            .all_reduce(
                sums.data(), static_cast<int64_t>(sums.size()), parallel::CommType::f64, parallel::ReduceOp::sum)
            .wait();
    auto next = sums.begin();
    r.layer_update_sq.assign(next, next + layers);
    next += layers;
    if (param_sq_measured_) {
        r.layer_param_sq.assign(next, next + layers);
        next += layers;
    }
    r.layer_stats.assign(next, sums.end());
}

double Trainer::step_flops() const {
    double flops = model_->flops_per_token(seq_len_) * static_cast<double>(tokens_per_step());
    if (cfg_.model.vision.enabled()) {
        double vision = 0.0;
        for (const nn::VisionBatch& images : step_images_)
            vision += nn::vision_forward_flops(cfg_.model.vision, cfg_.model.d_model, images.grids);
        flops += 3.0 * vision * static_cast<double>(data_size());
    }
    return flops;
}

void Trainer::add_throughput_metrics(const StepResult& r, nlohmann::json& fields) const {
    fields["data_step"] = data_step(step_);
    // The whole model's FLOPs per token (a pipeline stage's model holds only its layers: no figure there).
    if (!pipelined() && r.seconds > 0) {
        const double flops = step_flops() / r.seconds;
        fields["flops_per_s"] = flops;
        const bool gpu = model_->params().precision().device == core::Device::cuda;
        const double peak = cfg_.metrics.peak_tflops > 0 ? cfg_.metrics.peak_tflops * 1e12 : (gpu ? 989e12 : 0.0);
        if (peak > 0) fields["mfu"] = flops / (peak * static_cast<double>(mesh_->world().size()));
    }
    // Groups past the layers are the vision encoder's and the projector's (setup_layer_stats).
    const auto layers = static_cast<size_t>(cfg_.model.n_layers);
    auto group = [&](size_t l) {
        return l < layers ? fmt::format("layer/{}", l) : std::string(l == layers ? "vision" : "projector");
    };
    for (size_t l = 0; l < r.layer_grad_sq.size(); ++l) fields[group(l) + "/grad_norm"] = std::sqrt(r.layer_grad_sq[l]);
    for (size_t l = 0; l < r.layer_param_sq.size(); ++l)
        fields[group(l) + "/param_norm"] = std::sqrt(r.layer_param_sq[l]);
    for (size_t l = layers; l < r.layer_update_sq.size() && l < r.layer_param_sq.size(); ++l) {
        const double update = std::sqrt(r.layer_update_sq[l]), param = std::sqrt(r.layer_param_sq[l]);
        fields[group(l) + "/update_ratio"] = param > 0 ? update / param : 0.0;
    }
    add_layer_stats_metrics(r, fields);
}

void Trainer::add_layer_stats_metrics(const StepResult& r, nlohmann::json& fields) const {
    if (r.layer_stats.empty()) return;
    const nn::LayerStatsLayout& s = stats_layout_;
    const std::vector<double>& x = r.layer_stats;
    auto at = [&](int64_t slot) { return x[static_cast<size_t>(slot)]; };
    for (int64_t l = 0; l < s.n_layers; ++l) {
        const auto i = static_cast<size_t>(l);
        const double update = std::sqrt(r.layer_update_sq[i]), param = std::sqrt(r.layer_param_sq[i]);
        fields[fmt::format("layer/{}/update_norm", l)] = update;
        fields[fmt::format("layer/{}/update_ratio", l)] = param > 0 ? update / param : 0.0;
        // Every layer's output is measured somewhere (its block, or the AttnRes mix that follows it).
        if (at(s.act(l)) > 0) fields[fmt::format("layer/{}/act_rms", l)] = std::sqrt(at(s.act(l) + 2) / at(s.act(l)));
        if (cfg_.model.layer_is_kda(l) && at(s.kda_gate(l)) > 0) {
            const double n = at(s.kda_gate(l));
            fields[fmt::format("layer/{}/kda_gate_mean", l)] = at(s.kda_gate(l) + 1) / n;
            fields[fmt::format("layer/{}/kda_gate_sat", l)] = at(s.kda_gate(l) + 3) / n;
        }
    }
    if (s.splice() >= 0 && at(s.splice()) > 0) {
        // The projector's outputs, and the embedding rows after the splice less them: the text's.
        const int64_t m = ops::kLayerStatsMoments;
        const double image_n = at(s.splice()), image_sq = at(s.splice() + 2);
        const double text_n = at(s.splice() + m) - image_n, text_sq = at(s.splice() + m + 2) - image_sq;
        fields["vision/image_token_share"] = image_n / at(s.splice() + m);
        fields["vision/projector_rms"] = std::sqrt(image_sq / image_n);
        if (text_n > 0) fields["vision/text_embed_rms"] = std::sqrt(std::max(0.0, text_sq) / text_n);
    }
    for (size_t l = 0; l < s.mix_offset.size(); ++l) {
        const int64_t base = s.mix_offset[l], m = s.mix_sources[l];
        const double tokens = at(base);
        if (tokens <= 0) continue;
        for (int64_t k = 0; k < m; ++k) fields[fmt::format("attnres/{}/w{}", l, k)] = at(base + 1 + k) / tokens;
        // Divided by ln m (attnres.md §10): 1 is the uniform mix, 0 a single source; a one-source mix has none.
        const double mean = at(base + 1 + m) / tokens;
        fields[fmt::format("attnres/{}/entropy", l)] = m > 1 ? mean / std::log(static_cast<double>(m)) : 0.0;
    }
}

}  // namespace mt::train
