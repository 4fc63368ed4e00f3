// Entry points of the MoE combine: argument checks, then the CUDA path (gates may be f32 with bf16/f16 rows there;
// slot_row is trusted, not range-checked) or the CPU reference.
#include "ops/moe_unpermute.h"

#include <utility>

#include "ops/cpu/checks.h"
#include "ops/registry.h"

namespace mt::ops {

namespace cpu {
// The kernels of src/ops/cpu/moe_unpermute.cpp (shapes as in ops/moe_unpermute.h).
template <typename T>
void moe_unpermute_fwd(const T* yp, const int32_t* slot_row, const T* gates, T* y, int64_t n, int64_t k, int64_t c);
template <typename T>
void moe_unpermute_bwd(const T* yp,
                       const int32_t* slot_row,
                       const T* gates,
                       const T* dy,
                       T* dyp,
                       T* dgates,
                       int64_t n,
                       int64_t k,
                       int64_t c,
                       int64_t rows);
}  // namespace cpu

namespace {

// slot_row: an i32 [N, K] tensor whose entries are -1 or rows of the buffer, each row named at most once (the range
// is checked on the CPU only).
void check_slot_row(const Tensor& slot_row, int64_t rows, std::string_view op) {
    MT_CHECK(slot_row.defined(), "{}: slot_row is undefined", op);
    cpu::check_i32_arg(slot_row, op, "slot_row", 2);
    if (slot_row.device() != core::Device::cpu) return;
    const int32_t* v = slot_row.data<int32_t>();
    for (int64_t i = 0; i < slot_row.numel(); ++i)
        MT_CHECK(v[i] >= -1 && v[i] < rows, "{}: slot_row[{}] = {} is outside [-1, {})", op, i, v[i], rows);
}

}  // namespace

void moe_unpermute_fwd(const Tensor& yp, const Tensor& slot_row, const Tensor& gates, const Tensor& y) {
    constexpr std::string_view op = "moe_unpermute_fwd";
    const core::Device dev = check_same_device(op, {{"yp", yp}, {"slot_row", slot_row}, {"gates", gates}, {"y", y}});
    check_arg(yp, op, "yp", 2);
    check_arg(gates, op, "gates", 2);
    check_arg(y, op, "y", 2);
    const int64_t rows = yp.size(0), c = yp.size(1);
    check_slot_row(slot_row, rows, op);
    const int64_t n = slot_row.size(0), k = slot_row.size(1);
    check_shape(gates, {n, k}, op, "gates");
    check_shape(y, {n, c}, op, "y");
    MT_CALL_KERNEL(moe_unpermute_fwd, dev, yp, slot_row, gates, y);
}

void moe_unpermute_bwd(const Tensor& yp,
                       const Tensor& slot_row,
                       const Tensor& gates,
                       const Tensor& dy,
                       const Tensor& dyp,
                       const Tensor& dgates) {
    constexpr std::string_view op = "moe_unpermute_bwd";
    const core::Device dev = check_same_device(
        op, {{"yp", yp}, {"slot_row", slot_row}, {"gates", gates}, {"dy", dy}, {"dyp", dyp}, {"dgates", dgates}});
    for (const auto& [t, name] : {std::pair<const Tensor*, const char*>{&yp, "yp"},
                                  {&gates, "gates"},
                                  {&dy, "dy"},
                                  {&dyp, "dyp"},
                                  {&dgates, "dgates"}})
        check_arg(*t, op, name, 2);
    const int64_t rows = yp.size(0), c = yp.size(1);
    check_slot_row(slot_row, rows, op);
    const int64_t n = slot_row.size(0), k = slot_row.size(1);
    check_shape(gates, {n, k}, op, "gates");
    check_shape(dy, {n, c}, op, "dy");
    check_shape(dyp, {rows, c}, op, "dyp");
    check_shape(dgates, {n, k}, op, "dgates");
    MT_CALL_KERNEL(moe_unpermute_bwd, dev, yp, slot_row, gates, dy, dyp, dgates);
}

}  // namespace mt::ops
