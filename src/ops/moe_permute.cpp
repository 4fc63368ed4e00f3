// Entry points of the MoE permutation: argument checks (on the CPU including the range of every index; CUDA index
// tensors come from the router and the plan and are trusted), then the CUDA path or the CPU reference.
#include "ops/moe_permute.h"

#include "ops/cpu/checks.h"
#include "ops/registry.h"

namespace mt::ops {

namespace cpu {
// The kernels of src/ops/cpu/moe_permute.cpp (shapes as in ops/moe_permute.h; gates may be null without capacity).
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
                         int32_t* row_token);
template <typename T>
void moe_permute_fwd(const T* x, const int32_t* row_token, T* xp, int64_t rows, int64_t c);
template <typename T>
void moe_permute_bwd(const int32_t* slot_row, const T* dxp, T* dx, int64_t n, int64_t k, int64_t c);
}  // namespace cpu

namespace {

// Fails unless the defined tensor t is an i32 tensor of the given rank.
void check_index_arg(const Tensor& t, std::string_view op, std::string_view arg, int ndim) {
    MT_CHECK(t.defined(), "{}: {} is undefined", op, arg);
    cpu::check_i32_arg(t, op, arg, ndim);
}

}  // namespace

int64_t moe_permute_plan(const Tensor& indices,
                         const Tensor& gates,
                         int64_t num_experts,
                         int64_t capacity,
                         MoeDropPolicy policy,
                         const Tensor& offsets,
                         const Tensor& slot_row,
                         const Tensor& row_token) {
    constexpr std::string_view op = "moe_permute_plan";
    check_same_device(op,
                      {{"indices", indices},
                       {"gates", gates},
                       {"offsets", offsets},
                       {"slot_row", slot_row},
                       {"row_token", row_token}});
    check_index_arg(indices, op, "indices", 2);
    check_index_arg(offsets, op, "offsets", 1);
    check_index_arg(slot_row, op, "slot_row", 2);
    check_index_arg(row_token, op, "row_token", 1);
    const int64_t n = indices.size(0), k = indices.size(1);
    MT_CHECK(num_experts >= 1, "{}: num_experts = {} must be >= 1", op, num_experts);
    MT_CHECK(capacity >= 0, "{}: capacity = {} must be >= 0", op, capacity);
    MT_CHECK(n * k < (int64_t{1} << 31), "{}: {} rows do not fit int32 row indices", op, n * k);
    check_shape(offsets, {num_experts + 1}, op, "offsets");
    check_shape(slot_row, {n, k}, op, "slot_row");
    check_shape(row_token, {n * k}, op, "row_token");
    cpu::check_index_range(indices, 0, num_experts, op, "indices");
    const bool need_gates = capacity > 0 && policy == MoeDropPolicy::probs;
    if (need_gates || gates.defined()) {
        MT_CHECK(gates.defined(), "{}: gates is undefined", op);
        check_arg(gates, op, "gates", 2);
        check_shape(gates, {n, k}, op, "gates");
    }
    return MT_CALL_KERNEL(moe_permute_plan,
                          indices.device(),
                          indices,
                          gates,
                          num_experts,
                          capacity,
                          policy,
                          offsets,
                          slot_row,
                          row_token);
}

void moe_permute_fwd(const Tensor& x, const Tensor& row_token, const Tensor& xp) {
    constexpr std::string_view op = "moe_permute_fwd";
    check_same_device(op, {{"x", x}, {"row_token", row_token}, {"xp", xp}});
    check_arg(x, op, "x", 2);
    check_arg(xp, op, "xp", 2);
    check_index_arg(row_token, op, "row_token", 1);
    const int64_t n = x.size(0), c = x.size(1), rows = xp.size(0);
    check_shape(xp, {rows, c}, op, "xp");
    check_shape(row_token, {rows}, op, "row_token");
    cpu::check_index_range(row_token, 0, n, op, "row_token");
    MT_CALL_KERNEL(moe_permute_fwd, x.device(), x, row_token, xp);
}

void moe_permute_bwd(const Tensor& slot_row, const Tensor& dxp, const Tensor& dx) {
    constexpr std::string_view op = "moe_permute_bwd";
    check_same_device(op, {{"slot_row", slot_row}, {"dxp", dxp}, {"dx", dx}});
    check_arg(dxp, op, "dxp", 2);
    check_arg(dx, op, "dx", 2);
    check_index_arg(slot_row, op, "slot_row", 2);
    const int64_t rows = dxp.size(0), c = dxp.size(1), n = slot_row.size(0);
    check_shape(dx, {n, c}, op, "dx");
    cpu::check_index_range(slot_row, -1, rows, op, "slot_row");
    MT_CALL_KERNEL(moe_permute_bwd, dx.device(), slot_row, dxp, dx);
}

}  // namespace mt::ops
