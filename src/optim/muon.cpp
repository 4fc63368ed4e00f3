// Muon over the table's Muon group (optim/muon.h).
#include "optim/muon.h"

#include <algorithm>
#include <map>

#include "core/error.h"

namespace mt::optim {

core::Tensor muon_matrices(const core::Tensor& t) {
    MT_CHECK(t.ndim() == 2 || t.ndim() == 3,
             "Muon matrices: a [A, B] or [E, A, B] tensor, got {}",
             core::shape_str(t.shape()));
    return t.ndim() == 3 ? t : t.reshape({1, t.size(0), t.size(1)});
}

Muon::Muon(nn::ParamTable& table, const ops::MuonHyper& hyper, const std::optional<std::vector<MuonMatrixRef>>& owned)
    : table_(&table), hyper_(hyper) {
    const nn::Precision& precision = table.precision();
    MT_CHECK(!precision.master_on_host || precision.device == core::Device::cpu,
             "Muon updates the master weights where the model is: not with offloaded master weights");
    std::map<int, Entry> held;  // by parameter, in table order
    for (int i = 0; i < table.size(); ++i) {
        const nn::ParamSpec& spec = table.spec(i);
        if (spec.group != nn::OptimGroup::muon) continue;
        MT_CHECK(spec.shape.size() == 2 || spec.shape.size() == 3,
                 "Muon parameter {} has shape {}: the Muon group holds matrices [A, B] and stacks [E, A, B]",
                 spec.name,
                 core::shape_str(spec.shape));
        if (owned) continue;
        Entry& e = held[i];
        e.param = i;
        for (int64_t k = 0; k < muon_matrices(table.master(i)).size(0); ++k) {
            e.matrices.push_back(k);
            e.writer.push_back(true);
        }
    }
    for (const MuonMatrixRef& m : owned.value_or(std::vector<MuonMatrixRef>{})) {
        MT_CHECK(m.param >= 0 && m.param < table.size() && table.spec(m.param).group == nn::OptimGroup::muon &&
                     m.index >= 0 && m.index < muon_matrices(table.master(m.param)).size(0),
                 "Muon: owned matrix {} of parameter {} is not a matrix of the Muon group",
                 m.index,
                 m.param);
        Entry& e = held[m.param];
        e.param = m.param;
        e.matrices.push_back(m.index);
        e.writer.push_back(m.writer);
    }
    for (auto& [param, e] : held) {
        MT_CHECK(std::is_sorted(e.matrices.begin(), e.matrices.end()) &&
                     std::adjacent_find(e.matrices.begin(), e.matrices.end()) == e.matrices.end(),
                 "Muon: the owned matrices of parameter {} are not ascending and distinct",
                 table.spec(param).name);
        const core::Tensor w = muon_matrices(table.master(param));
        e.momentum = core::Tensor::zeros(
            {static_cast<int64_t>(e.matrices.size()), w.size(1), w.size(2)}, precision.master, precision.device);
        entries_.push_back(std::move(e));
    }
}

core::Tensor Muon::momentum(int param, int64_t index) const {
    for (const Entry& e : entries_) {
        if (e.param != param) continue;
        const auto it = std::lower_bound(e.matrices.begin(), e.matrices.end(), index);
        if (it != e.matrices.end() && *it == index) return e.momentum.select(0, it - e.matrices.begin());
    }
    MT_CHECK(false, "matrix {} of parameter {} is not held by this rank's Muon", index, table_->spec(param).name);
    return {};
}

int64_t Muon::state_bytes() const {
    int64_t bytes = 0;
    for (const Entry& e : entries_) bytes += e.momentum.nbytes();
    return bytes;
}

void Muon::step(double lr, double grad_scale, const core::Tensor& update_sq, StepStats* stats) {
    ops::MuonHyper h = hyper_;
    h.lr = lr;
    // The metrics come from the step's own outputs on the device (the change's squared norm per parameter, ||N|| per
    // matrix), read back once at the end.
    core::Tensor change = update_sq, norms;
    const core::Device device = table_->precision().device;
    if (stats) {
        int64_t matrices = 0;
        for (const Entry& e : entries_) matrices += static_cast<int64_t>(e.matrices.size());
        if (!change.defined()) change = core::Tensor::zeros({table_->size()}, core::DType::f64, device);
        norms = core::Tensor::zeros({std::max<int64_t>(matrices, 1)}, core::DType::f64, device);
    }
    int64_t norm_at = 0;
    for (const Entry& e : entries_) {
        const int i = e.param;
        h.weight_decay = table_->spec(i).weight_decay ? hyper_.weight_decay : 0.0;
        const core::Tensor param = muon_matrices(table_->master(i)), grad = muon_matrices(table_->grad(i));
        // Mixed precision: the forward's copy of the updated matrices, written by the step itself.
        const core::Tensor copy =
            table_->precision().has_master_copy() ? muon_matrices(table_->param(i)) : core::Tensor();
        const core::Tensor sq = change.defined() ? change.slice(0, i, i + 1) : core::Tensor();
        const auto k = static_cast<int64_t>(e.matrices.size());
        const core::Tensor n_norm = stats ? norms.slice(0, norm_at, norm_at + k) : core::Tensor();
        norm_at += k;
        const int64_t first = e.matrices.front();
        core::Tensor p, g, c;
        const bool views = e.matrices.back() - first + 1 == k;  // a run of consecutive matrices
        if (views) {
            p = param.slice(0, first, first + k);
            g = grad.slice(0, first, first + k);
            if (copy.defined()) c = copy.slice(0, first, first + k);
        } else {
            // Scattered matrices (ownership hands a stack's experts round-robin): one batched step on packed copies.
            p = core::Tensor::zeros(e.momentum.shape(), param.dtype(), param.device());
            g = core::Tensor::zeros(e.momentum.shape(), grad.dtype(), grad.device());
            if (copy.defined()) c = core::Tensor::zeros(e.momentum.shape(), copy.dtype(), copy.device());
            for (int64_t j = 0; j < k; ++j) {
                p.select(0, j).copy_from(param.select(0, e.matrices[static_cast<size_t>(j)]));
                g.select(0, j).copy_from(grad.select(0, e.matrices[static_cast<size_t>(j)]));
            }
        }
        ops::muon_step(p, g, e.momentum, h, grad_scale, sq, c, n_norm);
        if (!views)
            for (int64_t j = 0; j < k; ++j) {
                const int64_t at = e.matrices[static_cast<size_t>(j)];
                param.select(0, at).copy_from(p.select(0, j));
                if (c.defined()) copy.select(0, at).copy_from(c.select(0, j));
            }
    }
    if (!stats) return;
    const core::Tensor changes = change.to_device(core::Device::cpu), n = norms.to_device(core::Device::cpu);
    stats->update_sq.assign(static_cast<size_t>(table_->size()), 0.0);
    for (const Entry& e : entries_) stats->update_sq[static_cast<size_t>(e.param)] = changes.data<double>()[e.param];
    stats->n_norm.assign(n.data<double>(), n.data<double>() + norm_at);
}

}  // namespace mt::optim
