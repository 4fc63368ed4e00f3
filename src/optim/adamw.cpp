// AdamW over the parameter table, replicated or ZeRO-1 sharded.
#include "optim/adamw.h"

#include <algorithm>

namespace mt::optim {

namespace {
core::Tensor flat(const core::Tensor& t) {
    return t.reshape({t.numel()});
}
}  // namespace

AdamW::AdamW(nn::ParamTable& table, const ops::AdamWHyper& hyper, std::optional<std::vector<ArenaRange>> owned)
    : table_(&table), hyper_(hyper), sharded_(owned.has_value()) {
    const core::DType dtype = table.precision().master;
    if (!sharded_) {
        for (int i = 0; i < table.size(); ++i)
            pieces_.push_back({i, 0, core::shape_numel(table.spec(i).shape), table.offset(i)});
        m_ = table.make_arena(dtype);
        v_ = table.make_arena(dtype);
        return;
    }
    // The state buffers hold the owned ranges back to back (alignment padding included, so that every rank of a
    // group holds exactly 1 / |group| of the arena); a piece is a parameter's real elements inside a range.
    int64_t packed = 0;
    for (const ArenaRange& r : *owned) {
        for (int i = 0; i < table.size(); ++i) {
            const int64_t lo = table.offset(i), hi = lo + core::shape_numel(table.spec(i).shape);
            const int64_t b = std::max(lo, r.begin), e = std::min(hi, r.end);
            if (b < e) pieces_.push_back({i, b - lo, e - lo, packed + b - r.begin});
        }
        packed += r.end - r.begin;
    }
    std::sort(pieces_.begin(), pieces_.end(), [](const Piece& a, const Piece& b) {
        return a.param != b.param ? a.param < b.param : a.begin < b.begin;
    });
    if (packed == 0) return;  // nothing owned: no state
    m_ = core::Tensor::zeros({packed}, dtype, table.precision().device);
    v_ = core::Tensor::zeros({packed}, dtype, table.precision().device);
}

core::Tensor AdamW::m(const Piece& p) const {
    return m_.slice(0, p.state_offset, p.state_offset + p.end - p.begin);
}

core::Tensor AdamW::v(const Piece& p) const {
    return v_.slice(0, p.state_offset, p.state_offset + p.end - p.begin);
}

int64_t AdamW::state_bytes() const {
    return m_.defined() ? 2 * m_.numel() * static_cast<int64_t>(core::dtype_size(m_.dtype())) : 0;
}

void AdamW::step(double lr, int64_t step, double grad_scale) {
    const bool copy = table_->precision().has_master_copy();
    for (const Piece& p : pieces_) {
        ops::AdamWHyper h = hyper_;
        h.lr = lr;
        if (!table_->spec(p.param).weight_decay) h.weight_decay = 0.0;
        auto part = [&](const core::Tensor& t) { return flat(t).slice(0, p.begin, p.end); };
        // Under mixed precision the same kernel also writes the forward's bf16 copy of the weights.
        ops::adamw_step(part(table_->master(p.param)),
                        part(table_->grad(p.param)),
                        m(p),
                        v(p),
                        h,
                        step,
                        grad_scale,
                        copy ? part(table_->param(p.param)) : core::Tensor());
    }
}

}  // namespace mt::optim
