// CPU reference of the MoE permutation: the plan (counting, capacity selection, row assignment; serial integer work)
// and the row gathers of the permute and of its backward, split over rows by OpenMP.
#include "ops/moe_permute.h"

#include <algorithm>
#include <numeric>
#include <vector>

#include "ops/cpu/checks.h"
#include "ops/cpu/threading.h"
#include "ops/moe_permute.h"
#include "ops/registry.h"

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

// The CPU kernel of ops::moe_permute_plan (registered in the op registry): the CPU dtypes, then the float dispatch.
int64_t moe_permute_plan(const Tensor& indices,
                         const Tensor& gates,
                         int64_t num_experts,
                         int64_t capacity,
                         MoeDropPolicy policy,
                         const Tensor& offsets,
                         const Tensor& slot_row,
                         const Tensor& row_token) {
    constexpr std::string_view op = "moe_permute_plan";
    const int64_t n = indices.size(0), k = indices.size(1);
    if (gates.defined()) check_float_arg(gates, op, "gates", 2);
    if (!gates.defined())
        return cpu::moe_permute_plan<float>(indices.data<int32_t>(),
                                            nullptr,
                                            n,
                                            k,
                                            num_experts,
                                            capacity,
                                            policy,
                                            offsets.data<int32_t>(),
                                            slot_row.data<int32_t>(),
                                            row_token.data<int32_t>());
    int64_t rows = 0;
    MT_DISPATCH_FLOAT(gates.dtype(),
                      op,
                      rows = cpu::moe_permute_plan(indices.data<int32_t>(),
                                                   gates.data<scalar_t>(),
                                                   n,
                                                   k,
                                                   num_experts,
                                                   capacity,
                                                   policy,
                                                   offsets.data<int32_t>(),
                                                   slot_row.data<int32_t>(),
                                                   row_token.data<int32_t>()));
    return rows;
}
MT_REGISTER_KERNEL(moe_permute_plan, cpu, moe_permute_plan, ::mt::ops::any_dtype);  // primary: indices i32

// The CPU kernel of ops::moe_permute_fwd (registered in the op registry): the CPU dtypes, then the float dispatch.
void moe_permute_fwd(const Tensor& x, const Tensor& row_token, const Tensor& xp) {
    constexpr std::string_view op = "moe_permute_fwd";
    const int64_t c = x.size(1), rows = xp.size(0);
    check_float_arg(x, op, "x", 2);
    check_float_arg(xp, op, "xp", 2);
    check_dtype_as(xp, x, op, "xp", "x");
    MT_DISPATCH_FLOAT(
        x.dtype(),
        op,
        cpu::moe_permute_fwd(x.data<scalar_t>(), row_token.data<int32_t>(), xp.data<scalar_t>(), rows, c));
}
MT_REGISTER_KERNEL(moe_permute_fwd, cpu, moe_permute_fwd, ::mt::ops::float_dtypes);

// The CPU kernel of ops::moe_permute_bwd (registered in the op registry): the CPU dtypes, then the float dispatch.
void moe_permute_bwd(const Tensor& slot_row, const Tensor& dxp, const Tensor& dx) {
    constexpr std::string_view op = "moe_permute_bwd";
    const int64_t c = dxp.size(1), n = slot_row.size(0), k = slot_row.size(1);
    check_float_arg(dxp, op, "dxp", 2);
    check_float_arg(dx, op, "dx", 2);
    check_dtype_as(dx, dxp, op, "dx", "dxp");
    MT_DISPATCH_FLOAT(
        dx.dtype(),
        op,
        cpu::moe_permute_bwd(slot_row.data<int32_t>(), dxp.data<scalar_t>(), dx.data<scalar_t>(), n, k, c));
}
MT_REGISTER_KERNEL(moe_permute_bwd, cpu, moe_permute_bwd, ::mt::ops::float_dtypes);

}  // namespace mt::ops::cpu
