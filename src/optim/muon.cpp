// Muon over the table's Muon group (optim/muon.h).
#include "optim/muon.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <map>
#include <tuple>

#include "core/error.h"
#include "parallel/comm.h"

namespace mt::optim {

core::Tensor muon_matrices(const core::Tensor& t) {
    MT_CHECK(t.ndim() == 2 || t.ndim() == 3,
             "Muon matrices: a [A, B] or [E, A, B] tensor, got {}",
             core::shape_str(t.shape()));
    return t.ndim() == 3 ? t : t.reshape({1, t.size(0), t.size(1)});
}

// The matrices Newton-Schulz sees in a parameter's tensor t: its [E, A, B] view, or per head [E heads, A / heads, B].
core::Tensor Muon::units(const Entry& e, const core::Tensor& t) {
    const core::Tensor m = muon_matrices(t);
    return e.heads == 1 ? m : m.reshape({m.size(0) * e.heads, m.size(1) / e.heads, m.size(2)});
}

Muon::Muon(nn::ParamTable& table, const ops::MuonHyper& hyper, MuonOptions options)
    : table_(&table), tp_(options.tp), hyper_(hyper) {
    const auto& owned = options.owned;
    const nn::TensorParallel& tp = options.tp;
    const bool per_head = options.per_head;
    auto phase_of = [&](int param) {
        if (options.phase_of_param.empty()) return 0;
        const int phase = options.phase_of_param.at(static_cast<size_t>(param));
        MT_CHECK(phase >= 0, "Muon: parameter {} has no phase (no gradient bucket holds it)", table.spec(param).name);
        return phase;
    };
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
        const nn::ParamSpec& spec = table.spec(param);
        if (per_head && spec.head_rows > 0 && spec.shape.size() == 2) {
            MT_CHECK(spec.shape[0] % spec.head_rows == 0,
                     "Muon: {} has {} rows, not whole heads of {}",
                     spec.name,
                     spec.shape[0],
                     spec.head_rows);
            e.heads = spec.shape[0] / spec.head_rows;
        }
        entries_.push_back(std::move(e));
    }
    // Batches (muon.h): by (A, B, decay, tp split) for the small entries, in the order of their first entry.
    std::map<std::tuple<int64_t, int64_t, bool, int, int64_t, int>, size_t> batch_of;
    for (size_t j = 0; j < entries_.size(); ++j) {
        const Entry& e = entries_[j];
        const nn::ParamSpec& spec = table.spec(e.param);
        const core::Tensor w = units(e, table.master(e.param));
        const auto k = static_cast<int64_t>(e.matrices.size()) * e.heads;
        // Per head, a head lies whole on its tp rank (even where the rank holds one head: no gather).
        const bool heads_whole = per_head && spec.head_rows > 0;
        const bool split = tp.active() && nn::param_tp_split(spec) && !heads_whole;
        MT_CHECK(!split || (spec.shape.size() == 2 && nn::param_tp_real(spec) == spec.shape[size_t(spec.tp_axis)]),
                 "Muon: tp-split parameter {} must be a 2-D weight split evenly",
                 spec.name);
        const auto key = std::make_tuple(w.size(1),
                                         w.size(2),
                                         spec.weight_decay,
                                         split ? spec.tp_axis : -1,
                                         split ? spec.tp_replicas : 1,
                                         phase_of(e.param));
        auto it = batch_of.find(key);
        if (k >= kAloneFrom || it == batch_of.end()) {
            batches_.emplace_back();
            batches_.back().tp_axis = std::get<3>(key);
            batches_.back().tp_replicas = std::get<4>(key);
            batches_.back().phase = std::get<5>(key);
            if (k < kAloneFrom) batch_of[key] = batches_.size() - 1;
            it = batch_of.end();
        }
        Batch& b = it == batch_of.end() ? batches_.back() : batches_[it->second];
        b.entries.push_back(j);
        b.matrices += k;
    }
    for (Batch& b : batches_) {
        const Entry& first = entries_[b.entries.front()];
        const core::Tensor w = units(first, table.master(first.param));
        b.momentum = core::Tensor::zeros({b.matrices, w.size(1), w.size(2)}, precision.master, precision.device);
        b.first = units_;
        units_ += b.matrices;
        int64_t at = 0;
        for (size_t j : b.entries) {
            Entry& e = entries_[j];
            const auto k = static_cast<int64_t>(e.matrices.size());
            const core::Tensor whole = muon_matrices(table.master(e.param));
            e.momentum = b.momentum.slice(0, at, at + k * e.heads).reshape({k, whole.size(1), whole.size(2)});
            at += k * e.heads;
        }
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

void Muon::step_tp_split(const Batch& b,
                         const ops::MuonHyper& h,
                         double grad_scale,
                         const core::Tensor& m,
                         const core::Tensor& p,
                         const core::Tensor& g,
                         const core::Tensor& c,
                         const core::Tensor& change,
                         const core::Tensor& norms) const {
    const core::Device device = p.device();
    const core::Shape local = m.shape();
    const int axis = b.tp_axis + 1;  // in the stack [K, A, B]
    const int64_t parts = tp_.size / b.tp_replicas, width = local[size_t(axis)];
    core::Shape whole = local;
    whole[size_t(axis)] = width * parts;
    // This rank's slice of the direction, every rank's gathered (rank order), the whole matrices assembled from the
    // first replica of each slice.
    const core::Tensor n = core::Tensor::scratch(local, m.dtype(), device);
    ops::muon_momentum(g, m, n, h, grad_scale);
    const core::Tensor gathered = core::Tensor::scratch({tp_.size, local[0], local[1], local[2]}, n.dtype(), device);
    tp_.rows()
        .all_gather(n.raw(), gathered.raw(), static_cast<int64_t>(n.nbytes()), parallel::CommType::u8)
        .wait_on_device();
    const core::Tensor x = core::Tensor::scratch(whole, n.dtype(), device);
    for (int64_t s = 0; s < parts; ++s)
        x.slice(axis, s * width, (s + 1) * width).copy_from(gathered.select(0, s * b.tp_replicas));
    const core::Tensor o = core::Tensor::scratch(whole, n.dtype(), device);
    ops::newton_schulz(x, o, h);
    if (norms.defined()) {
        // ||N|| of each whole matrix (metrics steps): on the host, in f64.
        const core::Tensor hx = x.to_device(core::Device::cpu).to(core::DType::f64);
        const core::Tensor out = core::Tensor::zeros({local[0]}, core::DType::f64);
        const int64_t per = whole[1] * whole[2];
        for (int64_t k = 0; k < local[0]; ++k) {
            double sq = 0.0;
            for (int64_t i = 0; i < per; ++i) sq += hx.data<double>()[k * per + i] * hx.data<double>()[k * per + i];
            out.data<double>()[k] = std::sqrt(sq);
        }
        norms.copy_from(out);
    }
    const int64_t own = tp_.rank / b.tp_replicas;
    const core::Tensor mine = core::Tensor::scratch(local, n.dtype(), device);
    mine.copy_from(o.slice(axis, own * width, (own + 1) * width));
    const double decay = 1.0 - h.lr * h.weight_decay;
    const double step = h.lr * h.scale_factor * std::sqrt(static_cast<double>(std::max(whole[1], whole[2])));
    ops::muon_apply(p, mine, decay, step, change, c);
}

void Muon::pack(const Batch& b, const core::Tensor& stack, int which, bool into_stack) const {
    int64_t at = 0;
    for (size_t j : b.entries) {
        const Entry& e = entries_[j];
        const int i = e.param;
        const core::Tensor t = units(e,
                                     which == 0   ? table_->master(i)
                                     : which == 1 ? table_->grad(i)
                                                  : table_->param(i));
        // A matrix is e.heads units of the stack (one per head under muon.per_head).
        for_each_matrix_run(e, false, [&](int64_t first, int64_t count, int64_t pos) {
            const int64_t lo = first * e.heads, to = pos * e.heads, n = count * e.heads;
            const core::Tensor mine = t.slice(0, lo, lo + n), packed = stack.slice(0, at + to, at + to + n);
            (into_stack ? packed : mine).copy_from(into_stack ? mine : packed);
        });
        at += static_cast<int64_t>(e.matrices.size()) * e.heads;
    }
}

Muon::Pending Muon::run_batch(size_t index, const ops::MuonHyper& h, double grad_scale, bool in_place) {
    const Batch& b = batches_[index];
    const Entry& first = entries_[b.entries.front()];
    const nn::Precision& precision = table_->precision();
    const bool mixed = precision.has_master_copy();  // the forward's copy, written by the step itself
    const core::Tensor param0 = units(first, table_->master(first.param)),
                       grad0 = units(first, table_->grad(first.param));
    const auto k0 = static_cast<int64_t>(first.matrices.size());
    // One consecutive run of one parameter, in place: the step works on its views. Otherwise on packed copies.
    const bool views = in_place && b.entries.size() == 1 && first.matrices.back() - first.matrices.front() + 1 == k0;
    Pending out;
    out.batch = index;
    core::Tensor p, g, c, m = b.momentum;
    if (views) {
        const int64_t lo = first.matrices.front() * first.heads, hi = lo + k0 * first.heads;
        p = param0.slice(0, lo, hi);
        g = grad0.slice(0, lo, hi);
        if (mixed) c = units(first, table_->param(first.param)).slice(0, lo, hi);
    } else {
        p = core::Tensor::scratch(b.momentum.shape(), param0.dtype(), param0.device());
        g = core::Tensor::scratch(b.momentum.shape(), grad0.dtype(), grad0.device());
        if (mixed) c = core::Tensor::scratch(b.momentum.shape(), table_->param(first.param).dtype(), param0.device());
        pack(b, p, 0, true);
        pack(b, g, 1, true);
        if (!in_place) m = b.momentum.clone(), out = {index, p, c, m};
    }
    const auto range = [&](const core::Tensor& t) {
        return measured_ ? t.slice(0, b.first, b.first + b.matrices) : core::Tensor();
    };
    if (b.tp_axis >= 0)
        step_tp_split(b, h, grad_scale, m, p, g, c, range(change_), range(norms_));
    else
        ops::muon_step(p, g, m, h, grad_scale, range(change_), c, range(norms_));
    if (in_place && !views) {
        pack(b, p, 0, false);
        if (c.defined()) pack(b, c, 2, false);
    }
    return out;
}

void Muon::stage_batches(int phase, double lr, double grad_scale, bool measure, bool in_place) {
    if (pending_.empty()) {
        // The first stage of a step: the per-matrix measures start over.
        measured_ = measure;
        if (measure) {
            const core::Device device = table_->precision().device;
            change_ = core::Tensor::zeros({std::max<int64_t>(units_, 1)}, core::DType::f64, device);
            norms_ = core::Tensor::zeros({std::max<int64_t>(units_, 1)}, core::DType::f64, device);
        }
    }
    MT_CHECK(measure == measured_, "Muon: the stages of one step measure alike");
    ops::MuonHyper h = hyper_;
    h.lr = lr;
    for (size_t i = 0; i < batches_.size(); ++i) {
        if (phase >= 0 && batches_[i].phase != phase) continue;
        h.weight_decay =
            table_->spec(entries_[batches_[i].entries.front()].param).weight_decay ? hyper_.weight_decay : 0.0;
        pending_.push_back(run_batch(i, h, grad_scale, in_place));
    }
}

void Muon::stage(int phase, double lr, double grad_scale, bool measure) {
    stage_batches(phase, lr, grad_scale, measure, false);
}

void Muon::step(double lr, double grad_scale, const core::Tensor& update_sq, StepStats* stats) {
    MT_CHECK(pending_.empty(), "Muon::step with {} staged batches not committed", pending_.size());
    stage_batches(-1, lr, grad_scale, update_sq.defined() || stats != nullptr, true);
    commit(update_sq, stats);
}

void Muon::discard() {
    pending_.clear();
}

void Muon::commit(const core::Tensor& update_sq, StepStats* stats) {
    for (const Pending& d : pending_) {
        if (!d.param.defined()) continue;  // stepped in place
        const Batch& b = batches_[d.batch];
        b.momentum.copy_from(d.momentum);
        pack(b, d.param, 0, false);
        if (d.copy.defined()) pack(b, d.copy, 2, false);
    }
    const bool staged = !pending_.empty();
    pending_.clear();
    if (!staged || !measured_ || (!update_sq.defined() && stats == nullptr)) return;
    // Per parameter: the sum of its matrices' squared changes (each batch's entries' matrices consecutive).
    const core::Tensor changes = change_.to_device(core::Device::cpu);
    std::vector<double> sums(static_cast<size_t>(table_->size()), 0.0);
    for (const Batch& b : batches_) {
        int64_t at = b.first;
        for (size_t j : b.entries) {
            const Entry& e = entries_[j];
            for (size_t k = 0; k < e.matrices.size() * size_t(e.heads); ++k)
                sums[static_cast<size_t>(e.param)] += changes.data<double>()[at++];
        }
    }
    if (update_sq.defined()) {
        const core::Tensor total = update_sq.to_device(core::Device::cpu);
        for (const Entry& e : entries_) total.data<double>()[e.param] += sums[static_cast<size_t>(e.param)];
        update_sq.copy_from(total);
    }
    if (!stats) return;
    const core::Tensor n = norms_.to_device(core::Device::cpu);
    stats->update_sq = std::move(sums);
    stats->n_norm.assign(n.data<double>(), n.data<double>() + units_);
}

}  // namespace mt::optim
