// GradNorm's per-source gradient norms on the shared weight (train/loss_gradnorm.h).
#include "train/loss_gradnorm.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace mt::train {

int gradnorm_param(const nn::ParamTable& table, int64_t n_layers, const std::string& name) {
    if (!name.empty()) {
        const int i = table.find(name);
        if (i < 0)
            core::fail_hint(core::ExitCode::usage,
                            "name a parameter of the model as a checkpoint holds it (`moetrain inspect`), e.g. "
                            "layers.0.mlp.w_down.weight, or leave it empty for the default",
                            "config value loss.gradnorm_layer = \"{}\" is not a parameter of the model",
                            name);
        return i;
    }
    const std::string last = fmt::format("layers.{}.", n_layers - 1);
    for (const char* candidate : {"moe.shared.w_down.weight", "mlp.w_down.weight", "moe.experts.w_down"}) {
        const int i = table.find(last + candidate);
        if (i >= 0) return i;
    }
    core::fail(core::ExitCode::usage,
               "loss.weighting = \"gradnorm\": the last layer has no down projection to measure; set "
               "loss.gradnorm_layer");
}

std::vector<double> gradnorm_grad_norms(nn::Model& model,
                                        int param,
                                        int64_t micro_batches,
                                        const std::function<std::pair<core::Tensor, core::Tensor>(int64_t)>& micro,
                                        const std::vector<std::vector<int32_t>>& sources,
                                        const std::vector<double>& weights,
                                        double n_global,
                                        double loss_scale,
                                        const std::function<void(core::Tensor&)>& reduce) {
    nn::ParamTable& table = model.params();
    std::vector<double> norms;
    for (size_t k = 0; k < weights.size(); ++k) {
        table.zero_grads();
        for (int64_t m = 0; m < micro_batches; ++m) {
            const std::vector<int32_t>& rows = sources.at(static_cast<size_t>(m));
            if (std::find(rows.begin(), rows.end(), static_cast<int32_t>(k)) == rows.end()) continue;
            std::vector<double> w;
            for (const int32_t s : rows) w.push_back(static_cast<size_t>(s) == k ? weights[k] : 0.0);
            const auto [inputs, targets] = micro(m);
            model.set_row_loss_weights(std::move(w));
            model.forward(inputs, targets);
            // As the step's backward: d(loss)/d(loss_t) = loss_scale x (row weight) / N for every counted token.
            model.backward(loss_scale * static_cast<double>(model.last_counted_tokens()) / n_global);
        }
        const core::Tensor g = table.grad(param);
        core::Tensor host =
            (g.device() == core::Device::cpu ? g.clone() : g.to_device(core::Device::cpu)).to(core::DType::f64);
        reduce(host);
        double sq = 0.0;
        const double* p = host.data<double>();
        for (int64_t i = 0; i < host.numel(); ++i) sq += p[i] * p[i];
        norms.push_back(std::sqrt(sq) / loss_scale);
    }
    model.set_row_loss_weights({});
    table.zero_grads();
    return norms;
}

}  // namespace mt::train
