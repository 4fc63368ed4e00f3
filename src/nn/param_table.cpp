// Parameter table: arenas with named views, Philox-keyed initialisation.
#include "nn/param_table.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/rng.h"
#include "ops/rng_fill.h"

namespace mt::nn {

namespace {
// The two log-uniform kinds, element i from Philox (seed, hash(name), i).
void init_log_uniform(const Tensor& host, const ParamSpec& s, uint64_t seed) {
    const uint64_t stream = core::hash_name(s.name.c_str());
    for (int64_t i = 0; i < host.numel(); ++i) {
        const double u = core::rng_uniform(seed, stream, static_cast<uint64_t>(i));
        double v = 0.0;
        if (s.init == InitKind::log_uniform) {
            v = std::log(s.init_lo + (s.init_hi - s.init_lo) * u);
        } else {
            const double lo = std::log(s.init_lo), hi = std::log(s.init_hi);
            v = std::log(std::expm1(std::exp(lo + (hi - lo) * u)));
        }
        core::tensor_set_flat(host, i, v);
    }
}
}  // namespace

int ParamTable::add(ParamSpec spec) {
    MT_CHECK(!laid_out_, "parameter {} declared after the table was finalized", spec.name);
    MT_CHECK(!index_.count(spec.name), "parameter {} declared twice", spec.name);
    const int i = size();
    index_[spec.name] = i;
    specs_.push_back(std::move(spec));
    return i;
}

Shape param_global_shape(const ParamSpec& spec) {
    Shape shape = spec.shape;
    if (param_expert_sharded(spec)) shape[0] = spec.shard_global;
    if (param_tp_split(spec)) shape[static_cast<size_t>(spec.tp_axis)] = spec.tp_global;
    return shape;
}

int64_t param_tp_real(const ParamSpec& spec) {
    const int64_t local = spec.shape.at(static_cast<size_t>(spec.tp_axis));
    return std::clamp<int64_t>(spec.tp_global - spec.tp_first, 0, local);
}

ParamBox param_box(const ParamSpec& spec) {
    ParamBox box{Shape(spec.shape.size(), 0), spec.shape};
    if (param_expert_sharded(spec)) box.offset[0] = spec.shard_first;
    if (param_tp_split(spec)) {
        const auto axis = static_cast<size_t>(spec.tp_axis);
        box.offset[axis] = spec.tp_first;
        box.extent[axis] = param_tp_real(spec);
    }
    return box;
}

ParamReduce param_reduce(const ParamSpec& spec) {
    if (param_expert_sharded(spec)) return ParamReduce::expert;
    return spec.tp_partial_grad ? ParamReduce::dense_tp : ParamReduce::dense;
}

int64_t param_shard_flat_offset(const ParamSpec& spec) {
    const int64_t numel = core::shape_numel(spec.shape);
    if (param_tp_split(spec)) return spec.tp_first * (numel / spec.shape[static_cast<size_t>(spec.tp_axis)]);
    return param_expert_sharded(spec) ? spec.shard_first * (numel / spec.shape[0]) : 0;
}

void ParamTable::layout(const Precision& precision, int64_t align) {
    MT_CHECK(!laid_out_, "parameter table finalized twice");
    MT_CHECK(align >= 1, "parameter alignment {} must be >= 1", align);
    align = std::lcm(align, int64_t{64});  // every parameter starts at least 128-byte aligned
    precision_ = precision;
    total_ = 0;
    for (const auto& s : specs_) {
        offsets_.push_back(total_);
        total_ += (core::shape_numel(s.shape) + align - 1) / align * align;
    }
    laid_out_ = true;
}

void ParamTable::finalize(const Precision& precision, int64_t align) {
    layout(precision, align);
    master_arena_ = precision.master_on_host ? Tensor::zeros_pinned({total_}, precision.master)
                                             : Tensor::zeros({total_}, precision.master, precision.device);
    param_arena_ =
        precision.has_master_copy() ? Tensor::zeros({total_}, precision.param, precision.device) : master_arena_;
    grad_arena_ = Tensor::zeros({total_}, precision.master, precision.device);
    for (int i = 0; i < size(); ++i) {
        params_.push_back(view(param_arena_, i));
        masters_.push_back(view(master_arena_, i));
        grads_.push_back(view(grad_arena_, i));
    }
    grad_state_.assign(static_cast<size_t>(size()), kZeroed);
    written_whole_.resize(static_cast<size_t>(size()), 0);
    // The runs of the arena that are not written whole, merged: what zero_grads(true) zeroes. The padding after a
    // written-whole parameter is among them (no write reaches it; zeroed, it cannot carry anything into the
    // arena-wide norms and reductions).
    for (int i = 0; i < size(); ++i) {
        const bool whole = written_whole_[static_cast<size_t>(i)] != 0;
        const int64_t begin = offset(i) + (whole ? core::shape_numel(specs_[static_cast<size_t>(i)].shape) : 0);
        const int64_t end = offset(i) + padded_numel(i);
        if (begin == end) continue;
        if (!zeroed_runs_.empty() && zeroed_runs_.back().second == begin)
            zeroed_runs_.back().second = end;
        else
            zeroed_runs_.emplace_back(begin, end);
    }
    finalized_ = true;
}

void ParamTable::initialize(uint64_t seed) {
    MT_CHECK(finalized_, "initialize before finalize");
    // Drawn on the host in the master dtype, then copied to the device; master weights on the GPU draw their normal
    // and constant kinds there (ops::rng_fill_normal gives the host's numbers), which for billions of parameters
    // takes milliseconds instead of tens of seconds.
    for (int i = 0; i < size(); ++i) {
        const ParamSpec& s = specs_[static_cast<size_t>(i)];
        if (initialize_on_device(i, seed)) continue;
        // An expert-sharded tensor draws the whole global tensor and keeps its rows (init is a one-time cost).
        // A normal draw writes every element: no zeroing memset first (the page faults of the first touch then land
        // in the fill's threads).
        Tensor host = s.init == InitKind::normal
                          ? Tensor::scratch(param_global_shape(s), precision_.master, core::Device::cpu)
                          : Tensor::zeros(param_global_shape(s), precision_.master);
        switch (s.init) {
            case InitKind::normal:
                core::rng_fill_normal(host, seed, core::hash_name(s.name.c_str()), 0.0, s.init_std);
                break;
            case InitKind::ones:
                host.fill(1.0);
                break;
            case InitKind::zeros:
                break;
            case InitKind::log_uniform:
            case InitKind::softplus_inv_log_uniform:
                init_log_uniform(host, s, seed);
                break;
        }
        if (param_expert_sharded(s)) host = host.slice(0, s.shard_first, s.shard_first + s.shape[0]);
        if (param_tp_split(s)) {
            // This rank's slice along the split axis; a padded last shard keeps zeros past the global tensor.
            const int64_t real = param_tp_real(s);
            host = host.slice(s.tp_axis, s.tp_first, s.tp_first + real);
            masters_[static_cast<size_t>(i)].slice(s.tp_axis, 0, real).copy_from(host);
            continue;
        }
        masters_[static_cast<size_t>(i)].copy_from(host);
    }
    refresh_params_from_master();
}

bool ParamTable::initialize_on_device(int i, uint64_t seed) {
    const ParamSpec& s = specs_[static_cast<size_t>(i)];
    const Tensor& master = masters_[static_cast<size_t>(i)];
    // A tensor-parallel slice is a strided part of the global stream: drawn on the host (tp runs are not the slow
    // start this is for). The log-uniform kinds are a few hundred elements.
    if (master.device() == core::Device::cpu || param_tp_split(s)) return false;
    switch (s.init) {
        case InitKind::normal: {
            // An expert shard's rows are a contiguous stretch of the global tensor's draws.
            const int64_t row = s.shape.empty() || s.shape[0] == 0 ? 0 : master.numel() / s.shape[0];
            const uint64_t offset = param_expert_sharded(s) ? static_cast<uint64_t>(s.shard_first * row) : 0;
            ops::rng_fill_normal(master, seed, core::hash_name(s.name.c_str()), offset, 0.0, s.init_std);
            return true;
        }
        case InitKind::ones:
            master.fill(1.0);
            return true;
        case InitKind::zeros:
            master.zero();
            return true;
        default:
            return false;
    }
}

void ParamTable::refresh_params_from_master() {
    if (precision_.has_master_copy()) param_arena_.copy_from(master_arena_);
}

void ParamTable::zero_grads(bool skip_written_whole) {
    const bool skip = skip_written_whole && first_grad_writes_ &&
                      std::find(written_whole_.begin(), written_whole_.end(), uint8_t{1}) != written_whole_.end();
    if (!skip) {
        grad_arena_.zero();
        std::fill(grad_state_.begin(), grad_state_.end(), uint8_t{kZeroed});
        return;
    }
    for (const auto& [begin, end] : zeroed_runs_) grad_arena_.slice(0, begin, end).zero();
    for (size_t i = 0; i < grad_state_.size(); ++i) grad_state_[i] = written_whole_[i] ? kLeft : kZeroed;
}

void ParamTable::set_grad_written_whole(int i) {
    MT_CHECK(!finalized_, "set_grad_written_whole after finalize");
    if (written_whole_.size() <= static_cast<size_t>(i)) written_whole_.resize(static_cast<size_t>(i) + 1, 0);
    written_whole_[static_cast<size_t>(i)] = 1;
}

bool ParamTable::first_grad_write(int i) {
    uint8_t& state = grad_state_.at(static_cast<size_t>(i));
    if (state == kLeft && !first_grad_writes_) grads_[static_cast<size_t>(i)].zero();  // turned off since: add to 0
    const bool first = first_grad_writes_ && state != kWritten;
    state = kWritten;
    return first;
}

void ParamTable::settle_grads(int first) {
    for (int i = std::max(first, 0); i < size(); ++i)
        if (grad_state_[static_cast<size_t>(i)] == kLeft) {
            grads_[static_cast<size_t>(i)].zero();
            grad_state_[static_cast<size_t>(i)] = kZeroed;
        }
}

int ParamTable::find(const std::string& name) const {
    auto it = index_.find(name);
    return it == index_.end() ? -1 : it->second;
}

Tensor ParamTable::make_arena(DType dtype) const {
    MT_CHECK(finalized_, "make_arena before finalize");
    return Tensor::zeros({total_}, dtype, precision_.device);
}

Tensor ParamTable::view(const Tensor& arena, int i) const {
    MT_CHECK(arena.numel() == total_, "arena of {} elements, table holds {}", arena.numel(), total_);
    const size_t bytes = static_cast<size_t>(offsets_[static_cast<size_t>(i)]) * core::dtype_size(arena.dtype());
    return Tensor::view_of(arena.storage(), bytes, specs_[static_cast<size_t>(i)].shape, arena.dtype());
}

}  // namespace mt::nn
