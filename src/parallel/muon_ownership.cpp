// Whole-matrix ownership: LPT assignment and the packed bucket layout (parallel/muon_ownership.h).
#include "parallel/muon_ownership.h"

#include <algorithm>
#include <numeric>

#include "core/error.h"
#include "parallel/grad_sync.h"

namespace mt::parallel {

double newton_schulz_flops(int64_t rows, int64_t cols) {
    const auto p = static_cast<double>(std::min(rows, cols)), q = static_cast<double>(std::max(rows, cols));
    return 4.0 * p * p * q + 2.0 * p * p * p;
}

namespace {

// Appends [begin, end) to a block's ranges, merging it into the last range when they touch.
void append_range(std::vector<optim::ArenaRange>& ranges, int64_t begin, int64_t end) {
    if (begin >= end) return;
    if (!ranges.empty() && ranges.back().end == begin) {
        ranges.back().end = end;
        return;
    }
    ranges.push_back({begin, end});
}

}  // namespace

PackedBucket plan_packed_bucket(
    const std::vector<ArenaParam>& params, int lowest, int end, int64_t ranks, int64_t positions, OwnerLoad& load) {
    MT_CHECK(ranks >= 1 && positions >= 1 && positions <= ranks,
             "packed bucket: {} owner positions over {} ranks",
             positions,
             ranks);
    if (load.cost.empty()) load.cost.assign(static_cast<size_t>(positions), 0.0);
    MT_CHECK(static_cast<int64_t>(load.cost.size()) == positions,
             "packed bucket: a load of {} positions for {}",
             load.cost.size(),
             positions);
    PackedBucket out;
    out.blocks.resize(static_cast<size_t>(ranks));
    out.flat.resize(static_cast<size_t>(ranks));
    // The element-sharded parameters' real elements, concatenated, cut into `ranks` runs of ceil(n / ranks).
    int64_t flat_total = 0;
    for (int i = lowest; i < end; ++i)
        if (params[i].matrix_rows == 0) flat_total += params[i].numel;
    const int64_t per_rank = (flat_total + ranks - 1) / ranks;
    int64_t flat_at = 0;
    for (int i = lowest; i < end; ++i) {
        const ArenaParam& p = params[i];
        out.payload += p.numel;
        if (p.matrix_rows > 0) {
            const int64_t numel = p.matrix_rows * p.matrix_cols;
            MT_CHECK(numel > 0 && p.numel % numel == 0,
                     "packed bucket: parameter {} of {} elements is not a stack of {} x {} matrices",
                     i,
                     p.numel,
                     p.matrix_rows,
                     p.matrix_cols);
            for (int64_t e = 0; e < p.numel / numel; ++e)
                out.matrices.push_back({.param = i,
                                        .index = e,
                                        .rows = p.matrix_rows,
                                        .cols = p.matrix_cols,
                                        .begin = p.begin + e * numel,
                                        .numel = numel});
            continue;
        }
        // This parameter's elements [flat_at, flat_at + numel) of the flat run, cut at the rank boundaries.
        for (int64_t lo = flat_at; lo < flat_at + p.numel;) {
            const int64_t r = lo / per_rank, hi = std::min(flat_at + p.numel, (r + 1) * per_rank);
            append_range(out.flat[static_cast<size_t>(r)], p.begin + lo - flat_at, p.begin + hi - flat_at);
            lo = hi;
        }
        flat_at += p.numel;
    }
    // LPT: the costliest matrix first (table order among equals, so the result is a pure function of the layout).
    std::vector<size_t> order(out.matrices.size());
    std::iota(order.begin(), order.end(), size_t{0});
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
        return newton_schulz_flops(out.matrices[a].rows, out.matrices[a].cols) >
               newton_schulz_flops(out.matrices[b].rows, out.matrices[b].cols);
    });
    for (size_t k : order) {
        OwnedMatrix& m = out.matrices[k];
        m.owner = static_cast<int>(std::min_element(load.cost.begin(), load.cost.end()) - load.cost.begin());
        load.cost[static_cast<size_t>(m.owner)] += newton_schulz_flops(m.rows, m.cols);
    }
    out.blocks = out.flat;
    out.owned.resize(static_cast<size_t>(ranks));
    // Each block's matrices after its slice, in table order: every rank at an owner position holds them.
    for (int64_t r = 0; r < ranks; ++r)
        for (const OwnedMatrix& m : out.matrices)
            if (m.owner == r % positions) {
                append_range(out.blocks[static_cast<size_t>(r)], m.begin, m.begin + m.numel);
                append_range(out.owned[static_cast<size_t>(r)], m.begin, m.begin + m.numel);
            }
    std::vector<int64_t> sizes;
    for (const auto& block : out.blocks) {
        int64_t n = 0;
        for (const optim::ArenaRange& range : block) n += range.end - range.begin;
        sizes.push_back(n);
    }
    out.shard = std::max<int64_t>(1, *std::max_element(sizes.begin(), sizes.end()));
    for (int64_t n : sizes) out.padding += out.shard - n;
    return out;
}

}  // namespace mt::parallel
