// AdamW over the parameter table: replicated, ZeRO-1 sharded, or offloaded to the host.
#include "optim/adamw.h"

#include <algorithm>
#include <utility>

#include "core/backend.h"
#include "core/rng.h"

namespace mt::optim {

namespace {
core::Tensor flat(const core::Tensor& t) {
    return t.reshape({t.numel()});
}
// Parameter i's slot [1] of a per-parameter sum buffer (update_sq, param_sq), or undefined.
core::Tensor slot(const core::Tensor& sums, int i) {
    return sums.defined() ? sums.slice(0, i, i + 1) : core::Tensor();
}
}  // namespace

AdamW::AdamW(nn::ParamTable& table,
             const ops::AdamWHyper& hyper,
             std::optional<std::vector<ArenaRange>> owned,
             const AdamWOptions& options)
    : table_(&table), hyper_(hyper), options_(options), sharded_(owned.has_value()) {
    auto in_group = [&](const nn::ParamSpec& spec) {
        return !options.adamw_group_only || spec.group == nn::OptimGroup::adamw;
    };
    const nn::Precision& precision = table.precision();
    const core::DType dtype = options.state_dtype;
    MT_CHECK(dtype == precision.master || (dtype == core::DType::bf16 && precision.master == core::DType::f32),
             "AdamW state dtype {} with master weights in {}: the moments are the master dtype, or bf16 over f32",
             core::dtype_name(dtype),
             core::dtype_name(precision.master));
    MT_CHECK(!options.offload || !options.adamw_group_only, "AdamW offload updates the whole arena, every group");
    MT_CHECK(!options.offload || (precision.master_on_host && !sharded_),
             "AdamW offload needs the master weights on the host and an unsharded optimizer");
    if (!sharded_ && options.adamw_group_only) {
        // Only the AdamW group has moments (under Muon most elements are Muon's): its parameters back to back.
        int64_t packed = 0;
        for (int i = 0; i < table.size(); ++i) {
            if (!in_group(table.spec(i))) continue;
            const int64_t numel = core::shape_numel(table.spec(i).shape);
            pieces_.push_back({i, 0, numel, packed});
            packed += numel;
        }
        m_ = core::Tensor::zeros({std::max<int64_t>(packed, 1)}, dtype, precision.device);
        v_ = core::Tensor::zeros({std::max<int64_t>(packed, 1)}, dtype, precision.device);
        return;
    }
    if (!sharded_) {
        for (int i = 0; i < table.size(); ++i)
            if (in_group(table.spec(i)))
                pieces_.push_back({i, 0, core::shape_numel(table.spec(i).shape), table.offset(i)});
        const int64_t n = table.total_numel();
        m_ = options.offload ? core::Tensor::zeros_pinned({n}, dtype)
                             : core::Tensor::zeros({n}, dtype, precision.device);
        v_ = options.offload ? core::Tensor::zeros_pinned({n}, dtype)
                             : core::Tensor::zeros({n}, dtype, precision.device);
        if (options.offload) {
            const int64_t chunk = std::max<int64_t>(options.offload_chunk, 1);
            for (int64_t b = 0; b < n; b += chunk) chunks_.push_back({b, std::min(n, b + chunk)});
            const int64_t span = std::min(chunk, n);
            for (int k = 0; k < 2; ++k) {
                grad_stage_[k] = core::Tensor::zeros_pinned({span}, precision.master);
                param_stage_[k] = core::Tensor::zeros_pinned({span}, precision.param);
            }
        }
        return;
    }
    // The state buffers hold the owned ranges back to back (alignment padding included, so that every rank of a
    // group holds exactly 1 / |group| of the arena); a piece is a parameter's real elements inside a range.
    int64_t packed = 0;
    for (const ArenaRange& r : *owned) {
        for (int i = 0; i < table.size(); ++i) {
            const int64_t lo = table.offset(i), hi = lo + core::shape_numel(table.spec(i).shape);
            const int64_t b = std::max(lo, r.begin), e = std::min(hi, r.end);
            if (b < e && in_group(table.spec(i))) pieces_.push_back({i, b - lo, e - lo, packed + b - r.begin});
        }
        packed += r.end - r.begin;
    }
    std::sort(pieces_.begin(), pieces_.end(), [](const Piece& a, const Piece& b) {
        return a.param != b.param ? a.param < b.param : a.begin < b.begin;
    });
    if (packed == 0) return;  // nothing owned: no state
    m_ = core::Tensor::zeros({packed}, dtype, precision.device);
    v_ = core::Tensor::zeros({packed}, dtype, precision.device);
}

AdamW::~AdamW() {
    // The pinned staging buffers must outlive the uploads that read them.
    try {
        wait_uploads();
    } catch (...) {  // a failed device: nothing left to protect
    }
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

int64_t AdamW::device_state_bytes() const {
    return options_.offload && table_->precision().device != core::Device::cpu ? 0 : state_bytes();
}

ops::AdamWHyper AdamW::piece_hyper(double lr, const Piece* p) const {
    ops::AdamWHyper h = hyper_;
    h.lr = lr;
    if (p != nullptr && !table_->spec(p->param).weight_decay) h.weight_decay = 0.0;
    return h;
}

ops::AdamWRounding AdamW::piece_rounding(const Piece& p, int64_t begin) const {
    // Numbered in the global tensor, so an expert shard or a ZeRO slice draws the bits one process would.
    const nn::ParamSpec& spec = table_->spec(p.param);
    return {.seed = options_.seed ^ core::hash_name(spec.name.c_str()),
            .first = nn::param_shard_flat_offset(spec) + begin};
}

void AdamW::step(
    double lr, int64_t step, double grad_scale, const core::Tensor& update_sq, const core::Tensor& param_sq) {
    for (const auto& [sums, name] : {std::pair{&update_sq, "update_sq"}, std::pair{&param_sq, "param_sq"}})
        MT_CHECK(!sums->defined() || (sums->numel() == table_->size() && sums->device() == update_device()),
                 "AdamW::step: {} must be [{}] on {}",
                 name,
                 table_->size(),
                 core::device_name(update_device()));
    if (options_.offload) return step_offloaded(lr, step, grad_scale, update_sq, param_sq);
    const bool copy = table_->precision().has_master_copy();
    // Every piece in one call: on a GPU a few launches for the whole table instead of one a parameter.
    std::vector<ops::AdamWPiece> list;
    list.reserve(pieces_.size());
    for (const Piece& p : pieces_) {
        auto part = [&](const core::Tensor& t) { return flat(t).slice(0, p.begin, p.end); };
        // Under mixed precision the same kernel also writes the forward's bf16 copy of the weights.
        list.push_back({.param = part(table_->master(p.param)),
                        .grad = part(table_->grad(p.param)),
                        .m = m(p),
                        .v = v(p),
                        .param_copy = copy ? part(table_->param(p.param)) : core::Tensor(),
                        .decay = table_->spec(p.param).weight_decay,
                        .rounding = piece_rounding(p, p.begin),
                        .update_sq = slot(update_sq, p.param),
                        .param_sq = slot(param_sq, p.param)});
    }
    ops::adamw_step_list(list, piece_hyper(lr), step, grad_scale);
}

void AdamW::wait_uploads() {
    if (chunks_.empty()) return;
    core::Backend& backend = core::backend_get(table_->precision().device);
    for (uint64_t& marker : upload_marker_) {
        backend.marker_wait(marker);
        marker = 0;
    }
}

void AdamW::step_offloaded(
    double lr, int64_t step, double grad_scale, const core::Tensor& update_sq, const core::Tensor& param_sq) {
    const core::Device device = table_->precision().device;
    core::Backend& backend = core::backend_get(device);
    const core::Tensor grads = table_->grad_arena(), weights = table_->param_arena();
    const size_t grad_size = core::dtype_size(grads.dtype()), weight_size = core::dtype_size(weights.dtype());
    core::ExecCtx side = core::exec();
    side.lane = core::Lane::side;
    // Chunk c's gradients, down on the side lane (after the backward, which ran on the main lane).
    auto download = [&](size_t c) {
        const core::ExecScope scope(side);
        const Chunk& ch = chunks_[c];
        backend.copy_async(grad_stage_[c % 2].raw(),
                           core::Device::cpu,
                           static_cast<const char*>(grads.raw()) + ch.begin * grad_size,
                           device,
                           static_cast<size_t>(ch.end - ch.begin) * grad_size);
        return backend.lane_marker(core::Lane::side);
    };
    core::lane_wait(core::Lane::side, core::Lane::main);
    uint64_t download_marker[2] = {download(0), 0};
    size_t piece = 0;  // the first piece that may overlap the chunk (pieces are in arena order)
    for (size_t c = 0; c < chunks_.size(); ++c) {
        const Chunk& ch = chunks_[c];
        const int k = static_cast<int>(c % 2);
        backend.marker_wait(download_marker[k]);
        if (c + 1 < chunks_.size()) download_marker[1 - k] = download(c + 1);  // its buffer's update is done
        backend.marker_wait(upload_marker_[k]);                                // chunk c - 2's upload read it
        upload_marker_[k] = 0;
        // Update every piece's elements in the chunk; the staging weights between pieces (alignment padding) are
        // zeroed so that the upload writes the zeros the arena holds there.
        int64_t cursor = ch.begin;
        while (piece < pieces_.size() && table_->offset(pieces_[piece].param) + pieces_[piece].end <= ch.begin) ++piece;
        for (size_t q = piece; q < pieces_.size(); ++q) {
            const Piece& p = pieces_[q];
            const int64_t base = table_->offset(p.param);
            const int64_t a = std::max(ch.begin, base + p.begin), b = std::min(ch.end, base + p.end);
            if (base + p.begin >= ch.end) break;
            if (a >= b) continue;
            if (a > cursor) param_stage_[k].slice(0, cursor - ch.begin, a - ch.begin).zero();
            ops::adamw_step(flat(table_->master(p.param)).slice(0, a - base, b - base),
                            grad_stage_[k].slice(0, a - ch.begin, b - ch.begin),
                            m_.slice(0, a, b),
                            v_.slice(0, a, b),
                            piece_hyper(lr, &p),
                            step,
                            grad_scale,
                            param_stage_[k].slice(0, a - ch.begin, b - ch.begin),
                            piece_rounding(p, a - base),
                            slot(update_sq, p.param),
                            slot(param_sq, p.param));
            cursor = b;
        }
        if (ch.end > cursor) param_stage_[k].slice(0, cursor - ch.begin, ch.end - ch.begin).zero();
        // Up on the main lane: the next forward's kernels queue behind it.
        backend.copy_async(static_cast<char*>(weights.raw()) + ch.begin * weight_size,
                           device,
                           param_stage_[k].raw(),
                           core::Device::cpu,
                           static_cast<size_t>(ch.end - ch.begin) * weight_size);
        upload_marker_[k] = backend.lane_marker(core::Lane::main);
    }
}

}  // namespace mt::optim
