// Pipeline schedules and the balanced layer split.
#include "parallel/pipeline_schedule.h"

#include <algorithm>
#include <limits>

#include "core/error.h"

namespace mt::parallel {

std::vector<PipeOp> pipeline_schedule(int64_t stages, int64_t stage, int64_t virtual_stages, int64_t micros) {
    MT_CHECK(stages >= 1 && stage >= 0 && stage < stages && virtual_stages >= 1 && micros >= 1,
             "pipeline schedule of rank {} of {} with {} virtual stages over {} micro-batches",
             stage,
             stages,
             virtual_stages,
             micros);
    const int64_t p = stages, v = virtual_stages;
    std::vector<PipeOp> ops;
    if (v == 1) {
        const int64_t warmup = std::min(p - stage - 1, micros);
        int64_t f = 0, b = 0;
        for (; f < warmup; ++f) ops.push_back({true, 0, f});
        while (f < micros) {
            ops.push_back({true, 0, f++});
            ops.push_back({false, 0, b++});
        }
        while (b < micros) ops.push_back({false, 0, b++});
        return ops;
    }
    MT_CHECK(micros % p == 0, "the interleaved schedule needs micro-batches ({}) a multiple of stages ({})", micros, p);
    // Megatron-LM's numbering: virtual micro-step k runs micro-batch (k / (p v)) p + k % p through chunk
    // (k / p) % v (backwards: the chunks in reverse).
    const int64_t total = micros * v;
    auto op = [&](int64_t k, bool forward) {
        int64_t chunk = (k % (p * v)) / p;
        if (!forward) chunk = v - 1 - chunk;
        return PipeOp{forward, chunk, (k / (p * v)) * p + k % p};
    };
    const int64_t warmup = std::min((p - stage - 1) * 2 + (v - 1) * p, total);
    int64_t f = 0, b = 0;
    for (; f < warmup; ++f) ops.push_back(op(f, true));
    while (f < total) {
        ops.push_back(op(f++, true));
        ops.push_back(op(b++, false));
    }
    while (b < total) ops.push_back(op(b++, false));
    return ops;
}

double pipeline_bubble(int64_t stages, int64_t virtual_stages, int64_t micros) {
    const double p = static_cast<double>(stages);
    return (p - 1.0) / (static_cast<double>(virtual_stages * micros) + p - 1.0);
}

std::vector<int64_t> pipeline_split(const std::vector<double>& layer_cost,
                                    double first_extra,
                                    double last_extra,
                                    int64_t chunks) {
    const auto n = static_cast<int64_t>(layer_cost.size());
    MT_CHECK(chunks >= 1 && chunks <= n, "{} layers cannot fill {} pipeline chunks", n, chunks);
    // best[k][i]: the smallest largest-chunk cost of splitting layers [0, i) into k chunks; from[k][i]: where the
    // last of those chunks starts. O(chunks n^2): layers and stages are few.
    std::vector<double> prefix(static_cast<size_t>(n) + 1, 0.0);
    for (int64_t i = 0; i < n; ++i) prefix[size_t(i) + 1] = prefix[size_t(i)] + layer_cost[size_t(i)];
    auto cost = [&](int64_t lo, int64_t hi, int64_t k) {  // chunk k of `chunks` holds layers [lo, hi)
        double c = prefix[size_t(hi)] - prefix[size_t(lo)];
        if (k == 0) c += first_extra;
        if (k == chunks - 1) c += last_extra;
        return c;
    };
    const double inf = std::numeric_limits<double>::infinity();
    std::vector<std::vector<double>> best(size_t(chunks), std::vector<double>(size_t(n) + 1, inf));
    std::vector<std::vector<int64_t>> from(size_t(chunks), std::vector<int64_t>(size_t(n) + 1, 0));
    for (int64_t i = 1; i <= n; ++i) best[0][size_t(i)] = cost(0, i, 0);
    for (int64_t k = 1; k < chunks; ++k)
        for (int64_t i = k + 1; i <= n; ++i)
            for (int64_t j = k; j < i; ++j) {
                const double c = std::max(best[size_t(k - 1)][size_t(j)], cost(j, i, k));
                if (c < best[size_t(k)][size_t(i)]) best[size_t(k)][size_t(i)] = c, from[size_t(k)][size_t(i)] = j;
            }
    std::vector<int64_t> sizes(static_cast<size_t>(chunks));
    for (int64_t k = chunks - 1, end = n; k >= 0; --k) {
        const int64_t start = k == 0 ? 0 : from[size_t(k)][size_t(end)];
        sizes[size_t(k)] = end - start;
        end = start;
    }
    return sizes;
}

}  // namespace mt::parallel
