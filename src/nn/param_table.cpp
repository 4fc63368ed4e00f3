// Parameter table: arenas with named views, Philox-keyed initialisation.
#include "nn/param_table.h"

#include "core/rng.h"

namespace mt::nn {

int ParamTable::add(ParamSpec spec) {
    MT_CHECK(!finalized_, "parameter {} declared after the table was finalized", spec.name);
    MT_CHECK(!index_.count(spec.name), "parameter {} declared twice", spec.name);
    const int i = size();
    index_[spec.name] = i;
    specs_.push_back(std::move(spec));
    return i;
}

void ParamTable::finalize(DType dtype) {
    MT_CHECK(!finalized_, "parameter table finalized twice");
    dtype_ = dtype;
    total_ = 0;
    for (const auto& s : specs_) {
        offsets_.push_back(total_);
        // Round each view up to 16 elements so every parameter starts 64-byte aligned in f32.
        total_ += (core::shape_numel(s.shape) + 15) / 16 * 16;
    }
    param_arena_ = Tensor::zeros({total_}, dtype);
    grad_arena_ = Tensor::zeros({total_}, dtype);
    for (int i = 0; i < size(); ++i) {
        params_.push_back(view(param_arena_, i));
        grads_.push_back(view(grad_arena_, i));
    }
    finalized_ = true;
}

void ParamTable::initialize(uint64_t seed) {
    MT_CHECK(finalized_, "initialize before finalize");
    for (int i = 0; i < size(); ++i) {
        const ParamSpec& s = specs_[static_cast<size_t>(i)];
        switch (s.init) {
            case InitKind::normal:
                core::rng_fill_normal(params_[i], seed, core::hash_name(s.name.c_str()), 0.0, s.init_std);
                break;
            case InitKind::ones:
                params_[i].fill(1.0);
                break;
            case InitKind::zeros:
                params_[i].fill(0.0);
                break;
        }
    }
}

void ParamTable::zero_grads() {
    grad_arena_.zero();
}

int ParamTable::find(const std::string& name) const {
    auto it = index_.find(name);
    return it == index_.end() ? -1 : it->second;
}

Tensor ParamTable::make_arena(DType dtype) const {
    MT_CHECK(finalized_, "make_arena before finalize");
    return Tensor::zeros({total_}, dtype);
}

Tensor ParamTable::view(const Tensor& arena, int i) const {
    MT_CHECK(arena.numel() == total_, "arena of {} elements, table holds {}", arena.numel(), total_);
    const size_t bytes = static_cast<size_t>(offsets_[static_cast<size_t>(i)]) * core::dtype_size(arena.dtype());
    return Tensor::view_of(arena.storage(), bytes, specs_[static_cast<size_t>(i)].shape, arena.dtype());
}

}  // namespace mt::nn
