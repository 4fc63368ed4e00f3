// CPU reference of the MoE permutation: the plan (counting, capacity selection, row assignment; serial integer work)
// and the row gathers of the permute and of its backward, split over rows by OpenMP.
#include "ops/moe_permute.h"

#include <algorithm>
#include <numeric>
#include <vector>

#include "ops/cpu/kernels.h"

namespace mt::ops::cpu {

template <typename T>
int64_t moe_permute_plan(const int32_t* indices,
                         const T* gates,
                         int64_t n,
                         int64_t k,
                         int64_t e,
                         int64_t capacity,
                         MoeDropPolicy policy,
                         int32_t* offsets,
                         int32_t* slot_row,
                         int32_t* row_token) {
    const int64_t slots = n * k;
    std::vector<int64_t> count(static_cast<size_t>(e), 0);
    for (int64_t s = 0; s < slots; ++s) ++count[static_cast<size_t>(indices[s])];
    std::vector<char> keep(static_cast<size_t>(slots), 1);
    if (capacity > 0) {
        std::vector<std::vector<int64_t>> by_expert(static_cast<size_t>(e));
        for (int64_t s = 0; s < slots; ++s)
            if (count[static_cast<size_t>(indices[s])] > capacity)
                by_expert[static_cast<size_t>(indices[s])].push_back(s);
        for (auto& list : by_expert) {  // slots of an over-full expert, in (i, q) order
            if (list.empty()) continue;
            if (policy == MoeDropPolicy::probs)
                std::stable_sort(list.begin(), list.end(), [&](int64_t a, int64_t b) { return gates[a] > gates[b]; });
            for (size_t j = static_cast<size_t>(capacity); j < list.size(); ++j) keep[static_cast<size_t>(list[j])] = 0;
        }
    }
    std::vector<int64_t> kept(static_cast<size_t>(e), 0);
    for (int64_t s = 0; s < slots; ++s) kept[static_cast<size_t>(indices[s])] += keep[static_cast<size_t>(s)];
    offsets[0] = 0;
    for (int64_t j = 0; j < e; ++j) offsets[j + 1] = static_cast<int32_t>(offsets[j] + kept[static_cast<size_t>(j)]);
    std::vector<int64_t> cursor(offsets, offsets + e);
    for (int64_t s = 0; s < slots; ++s) {
        if (!keep[static_cast<size_t>(s)]) {
            slot_row[s] = -1;
            continue;
        }
        const int64_t r = cursor[static_cast<size_t>(indices[s])]++;
        slot_row[s] = static_cast<int32_t>(r);
        row_token[r] = static_cast<int32_t>(s / k);
    }
    const int64_t rows = offsets[e];
    std::fill(row_token + rows, row_token + slots, -1);
    return rows;
}

// xp[r] = x[row_token[r]]
template <typename T>
void moe_permute_fwd(const T* x, const int32_t* row_token, T* xp, int64_t rows, int64_t c) {
#pragma omp parallel for schedule(static) if (rows * c >= kParallelMinWork)
    for (int64_t r = 0; r < rows; ++r) std::copy(x + row_token[r] * c, x + (row_token[r] + 1) * c, xp + r * c);
}

// dx_i = sum_q dxp[slot_row(i, q)], in slot order (0 when every slot of i was dropped)
template <typename T>
void moe_permute_bwd(const int32_t* slot_row, const T* dxp, T* dx, int64_t n, int64_t k, int64_t c) {
#pragma omp parallel for schedule(static) if (n * k * c >= kParallelMinWork)
    for (int64_t i = 0; i < n; ++i) {
        T* d = dx + i * c;  // [C]
        std::fill(d, d + c, T(0));
        for (int64_t q = 0; q < k; ++q) {
            const int32_t r = slot_row[i * k + q];
            if (r < 0) continue;
            const T* src = dxp + static_cast<int64_t>(r) * c;
            for (int64_t j = 0; j < c; ++j) d[j] += src[j];
        }
    }
}

#define MT_INSTANTIATE(T)                                                                                           \
    template int64_t moe_permute_plan<T>(                                                                           \
        const int32_t*, const T*, int64_t, int64_t, int64_t, int64_t, MoeDropPolicy, int32_t*, int32_t*, int32_t*); \
    template void moe_permute_fwd<T>(const T*, const int32_t*, T*, int64_t, int64_t);                               \
    template void moe_permute_bwd<T>(const int32_t*, const T*, T*, int64_t, int64_t, int64_t);
MT_INSTANTIATE(float)
MT_INSTANTIATE(double)
#undef MT_INSTANTIATE

}  // namespace mt::ops::cpu
