// Segment boundaries and the time-axis row copies of sequence segments.
#include "nn/segments.h"

#include <algorithm>
#include <cmath>

#include "core/backend.h"
#include "core/error.h"
#include "ops/add.h"

namespace mt::nn {

std::vector<int64_t> segment_bounds(
    const SegmentConfig& cfg, int64_t seq, int64_t granule, double linear, double per_key) {
    std::vector<int64_t> bounds = {0};
    if (!cfg.bounds.empty()) {
        for (int64_t b : cfg.bounds) {
            MT_CHECK(b > bounds.back() && b < seq,
                     "segment boundaries must increase strictly inside (0, {}), got {} after {}",
                     seq,
                     b,
                     bounds.back());
            bounds.push_back(b);
        }
    } else if (cfg.tokens > 0) {
        for (int64_t b = cfg.tokens; b < seq; b += cfg.tokens) bounds.push_back(b);
    } else {
        // Cost up to position t: linear t + per_key t^2 / 2. Cut j solves cost(t) = j / J cost(seq).
        const double total = linear * static_cast<double>(seq) + per_key * 0.5 * std::pow(static_cast<double>(seq), 2);
        const int64_t step = std::max<int64_t>(granule, 1);
        for (int64_t j = 1; j < cfg.count; ++j) {
            const double target = total * static_cast<double>(j) / static_cast<double>(cfg.count);
            const double t = per_key > 0.0 ? (-linear + std::sqrt(linear * linear + 2.0 * per_key * target)) / per_key
                                           : target / std::max(linear, 1e-300);
            const int64_t cut = std::llround(t / static_cast<double>(step)) * step;
            if (cut > bounds.back() && cut < seq) bounds.push_back(cut);
        }
    }
    bounds.push_back(seq);
    return bounds;
}

core::Tensor doc_map_from(const core::Tensor& host_map, int64_t lo, int64_t hi, core::Device device) {
    MT_CHECK(host_map.device() == core::Device::cpu && host_map.dtype() == core::DType::i32 && host_map.ndim() == 2 &&
                 lo >= 0 && lo <= hi && hi <= host_map.size(1),
             "doc_map_from: columns [{}, {}) of a [B, T] i32 host map of shape {}",
             lo,
             hi,
             core::shape_str(host_map.shape()));
    const int64_t b = host_map.size(0), t = host_map.size(1), w = hi - lo;
    core::Tensor out = core::Tensor::zeros({b, w}, core::DType::i32);
    const int32_t* src = host_map.data<int32_t>();
    int32_t* dst = out.data<int32_t>();
    for (int64_t r = 0; r < b; ++r)
        for (int64_t i = 0; i < w; ++i)
            dst[r * w + i] = static_cast<int32_t>(std::max<int64_t>(src[r * t + lo + i] - lo, 0));
    return device == core::Device::cpu ? out : out.to_device(device);
}

namespace {

// Row block [first, first + count) of batch row b of a [B, T, ...] tensor: contiguous.
core::Tensor row_block(const core::Tensor& t, int64_t b, int64_t first, int64_t count) {
    return t.select(0, b).slice(0, first, first + count);
}

// same_device: the two on one device (copies and adds); else one may be pinned host memory (async copies).
void check_rows(const core::Tensor& dst,
                int64_t dst_first,
                const core::Tensor& src,
                int64_t src_first,
                int64_t count,
                const char* what,
                bool same_device = true) {
    MT_CHECK(
        dst.ndim() >= 2 && src.ndim() == dst.ndim() && src.size(0) == dst.size(0) && dst.is_contiguous() &&
            src.is_contiguous() && src.dtype() == dst.dtype() && (!same_device || src.device() == dst.device()) &&
            count >= 0 && dst_first >= 0 && src_first >= 0 && dst_first + count <= dst.size(1) &&
            src_first + count <= src.size(1) &&
            dst.numel() / (dst.size(0) * dst.size(1)) == src.numel() / std::max<int64_t>(src.size(0) * src.size(1), 1),
        "{}: rows [{}, +{}) of {} from rows [{}, +{}) of {}",
        what,
        dst_first,
        count,
        core::shape_str(dst.shape()),
        src_first,
        count,
        core::shape_str(src.shape()));
}

}  // namespace

void copy_time_rows(
    const core::Tensor& dst, int64_t dst_first, const core::Tensor& src, int64_t src_first, int64_t count) {
    check_rows(dst, dst_first, src, src_first, count, "copy_time_rows");
    if (count == 0) return;
    for (int64_t b = 0; b < dst.size(0); ++b)
        row_block(dst, b, dst_first, count).copy_from(row_block(src, b, src_first, count));
}

void add_time_rows(
    const core::Tensor& dst, int64_t dst_first, const core::Tensor& src, int64_t src_first, int64_t count) {
    check_rows(dst, dst_first, src, src_first, count, "add_time_rows");
    if (count == 0) return;
    for (int64_t b = 0; b < dst.size(0); ++b) {
        const core::Tensor d = row_block(dst, b, dst_first, count);
        ops::add_fwd(d, row_block(src, b, src_first, count), d);
    }
}

void copy_time_rows_async(
    const core::Tensor& dst, int64_t dst_first, const core::Tensor& src, int64_t src_first, int64_t count) {
    check_rows(dst, dst_first, src, src_first, count, "copy_time_rows_async", false);
    if (count == 0) return;
    const core::Device dev = dst.device() != core::Device::cpu ? dst.device() : src.device();
    core::Backend& backend = core::backend_get(dev);
    for (int64_t b = 0; b < dst.size(0); ++b) {
        const core::Tensor d = row_block(dst, b, dst_first, count), s = row_block(src, b, src_first, count);
        backend.copy_async(d.raw(), d.device(), s.raw(), s.device(), d.nbytes());
    }
}

core::Tensor keep_for_later(const core::Tensor& t, bool offload) {
    if (!offload || !t.defined()) return t;
    core::Tensor host = core::Tensor::zeros_pinned(t.shape(), t.dtype());
    host.copy_from(t);
    return host;
}

core::Tensor on_device(const core::Tensor& t, core::Device device) {
    return t.defined() && t.device() != device ? t.to_device(device) : t;
}

core::Tensor time_rows(const core::Tensor& src, int64_t first, int64_t count) {
    if (src.size(0) == 1) {  // rows of the one batch row: contiguous, viewed as [1, count, ...]
        core::Shape shape = src.shape();
        shape[1] = count;
        return row_block(src, 0, first, count).reshape(shape);
    }
    core::Shape shape = src.shape();
    shape[1] = count;
    core::Tensor out = core::Tensor::scratch(shape, src.dtype(), src.device());
    copy_time_rows(out, 0, src, first, count);
    return out;
}

}  // namespace mt::nn
