// Muon over the table's Muon group (optim/muon.h).
#include "optim/muon.h"

#include "core/error.h"

namespace mt::optim {

core::Tensor muon_matrices(const core::Tensor& t) {
    MT_CHECK(t.ndim() == 2 || t.ndim() == 3,
             "Muon matrices: a [A, B] or [E, A, B] tensor, got {}",
             core::shape_str(t.shape()));
    return t.ndim() == 3 ? t : t.reshape({1, t.size(0), t.size(1)});
}

Muon::Muon(nn::ParamTable& table, const ops::MuonHyper& hyper) : table_(&table), hyper_(hyper) {
    const nn::Precision& precision = table.precision();
    MT_CHECK(
        !precision.has_master_copy() && precision.device == core::Device::cpu,
        "Muon runs on the CPU in f32 or f64 yet (the CUDA step and mixed precision are the Muon issue's next step)");
    for (int i = 0; i < table.size(); ++i) {
        const nn::ParamSpec& spec = table.spec(i);
        if (spec.group != nn::OptimGroup::muon) continue;
        MT_CHECK(spec.shape.size() == 2 || spec.shape.size() == 3,
                 "Muon parameter {} has shape {}: the Muon group holds matrices [A, B] and stacks [E, A, B]",
                 spec.name,
                 core::shape_str(spec.shape));
        params_.push_back(i);
        momentum_.push_back(core::Tensor::zeros(spec.shape, precision.master, precision.device));
    }
}

core::Tensor Muon::momentum(int param) const {
    for (size_t k = 0; k < params_.size(); ++k)
        if (params_[k] == param) return momentum_[k];
    MT_CHECK(false, "parameter {} is not in the Muon group", table_->spec(param).name);
    return {};
}

int64_t Muon::state_bytes() const {
    int64_t bytes = 0;
    for (const core::Tensor& m : momentum_) bytes += m.nbytes();
    return bytes;
}

void Muon::step(double lr, double grad_scale, const core::Tensor& update_sq) {
    ops::MuonHyper h = hyper_;
    h.lr = lr;
    for (size_t k = 0; k < params_.size(); ++k) {
        const int i = params_[k];
        h.weight_decay = table_->spec(i).weight_decay ? hyper_.weight_decay : 0.0;
        ops::muon_step(muon_matrices(table_->master(i)),
                       muon_matrices(table_->grad(i)),
                       muon_matrices(momentum_[k]),
                       h,
                       grad_scale,
                       update_sq.defined() ? update_sq.slice(0, i, i + 1) : core::Tensor());
    }
}

}  // namespace mt::optim
