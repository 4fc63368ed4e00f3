// Trainer <-> the registry's step figures (metric_registry.h, docs/metrics.md): the data position, the model FLOPs
// rate and MFU, and the per-layer gradient and weight norms that train_step measures on the metrics steps.
#include <cmath>
#include <regex>

#include "train/trainer.h"

namespace mt::train {

void Trainer::setup_layer_stats() {
    // "layers.<l>.<rest>": the block's parameters; the embedding, final norm, head and AttnRes queries are no layer's.
    static const std::regex layer_name(R"(^layers\.(\d+)\..*)");
    const nn::ParamTable& table = model_->params();
    layer_of_param_.assign(static_cast<size_t>(table.size()), -1);
    for (int i = 0; i < table.size(); ++i) {
        std::smatch m;
        if (std::regex_match(table.spec(i).name, m, layer_name))
            layer_of_param_[static_cast<size_t>(i)] = std::stoi(m[1].str());
    }
}

void Trainer::add_throughput_metrics(const StepResult& r, nlohmann::json& fields) const {
    fields["data_step"] = data_step(step_);
    // The whole model's FLOPs per token (a pipeline stage's model holds only its layers: no figure there).
    if (!pipelined() && r.seconds > 0) {
        const double flops = model_->flops_per_token(seq_len_) * static_cast<double>(tokens_per_step()) / r.seconds;
        fields["flops_per_s"] = flops;
        const bool gpu = model_->params().precision().device == core::Device::cuda;
        const double peak = cfg_.metrics.peak_tflops > 0 ? cfg_.metrics.peak_tflops * 1e12 : (gpu ? 989e12 : 0.0);
        if (peak > 0) fields["mfu"] = flops / (peak * static_cast<double>(mesh_->world().size()));
    }
    for (size_t l = 0; l < r.layer_grad_sq.size(); ++l)
        fields[fmt::format("layer/{}/grad_norm", l)] = std::sqrt(r.layer_grad_sq[l]);
    for (size_t l = 0; l < r.layer_param_sq.size(); ++l)
        fields[fmt::format("layer/{}/param_norm", l)] = std::sqrt(r.layer_param_sq[l]);
}

}  // namespace mt::train
