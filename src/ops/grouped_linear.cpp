// Entry points of the grouped linear op: argument checks (host offsets monotone and covering the rows), the choice of
// the CUDA implementation (device offsets for the device kernel, a host copy for cuBLASLt), then the CUDA path or the
// CPU reference.
#include "ops/grouped_linear.h"

#include <cstdint>

#include "core/backend.h"
#include "ops/cpu/checks.h"
#include "ops/registry.h"

#ifdef MT_HAVE_CUDA
#include "ops/cuda/gemm/grouped_gemm_sm90.h"
#endif

namespace mt::ops {

namespace {

// The offsets on the host (a CUDA tensor is copied back: one synchronisation), checked.
Tensor host_offsets(const Tensor& offsets, int64_t e, int64_t rows, std::string_view op) {
    MT_CHECK(offsets.defined(), "{}: offsets is undefined", op);
    cpu::check_i32_arg(offsets, op, "offsets", 1);
    check_shape(offsets, {e + 1}, op, "offsets");
    const Tensor h = offsets.device() == core::Device::cpu ? offsets : offsets.to_device(core::Device::cpu);
    const int32_t* o = h.data<int32_t>();
    MT_CHECK(o[0] == 0 && o[e] == rows,
             "{}: offsets run from {} to {}, expected 0 to {} (the rows of x)",
             op,
             o[0],
             o[e],
             rows);
    for (int64_t j = 0; j < e; ++j)
        MT_CHECK(o[j] <= o[j + 1], "{}: offsets decrease at expert {} ({} > {})", op, j, o[j], o[j + 1]);
    return h;
}

// Whether a call on `dev` takes the device kernel (see the header); impl = device fails naming why it cannot.
bool use_device_kernel(core::Device dev,
                       const Tensor& offsets,
                       GroupedGemm impl,
                       DType dw_dtype,
                       const Tensor& x,
                       const Tensor& w,
                       std::initializer_list<std::pair<const char*, const Tensor*>> tensors,
                       std::string_view op) {
    if (dev != core::Device::cuda || impl == GroupedGemm::cublaslt) return false;
    std::string why;
    if (!offsets.defined() || offsets.device() != core::Device::cuda)
        why = "offsets are not a cuda tensor";
    else
        why = grouped_linear_device_why_not(x.dtype(), dw_dtype, w.size(2), w.size(1));
    for (const auto& [name, t] : tensors)
        if (why.empty() && t->defined() && reinterpret_cast<uintptr_t>(t->raw()) % 16 != 0)
            why = fmt::format("{} is not 16-byte aligned", name);
    MT_CHECK(why.empty() || impl != GroupedGemm::device, "{}: the device grouped GEMM cannot run: {}", op, why);
    return why.empty();
}

// Device offsets as the device kernel reads them: only their dtype and shape are checked (reading them would
// synchronise).
const Tensor& device_offsets(const Tensor& offsets, int64_t e, std::string_view op) {
    cpu::check_i32_arg(offsets, op, "offsets", 1);
    check_shape(offsets, {e + 1}, op, "offsets");
    return offsets;
}

}  // namespace

std::string grouped_linear_device_why_not(DType x, DType dw, int64_t k, int64_t m) {
#ifdef MT_HAVE_CUDA
    if (!core::backend_available(core::Device::cuda)) return "no CUDA device";
    return cuda::grouped_gemm_sm90_why_not(x, dw, k, m);
#else
    (void)x, (void)dw, (void)k, (void)m;
    return "this build has no CUDA path";
#endif
}

void grouped_linear_fwd(const Tensor& x, const Tensor& w, const Tensor& offsets, const Tensor& y, GroupedGemm impl) {
    constexpr std::string_view op = "grouped_linear_fwd";
    check_arg(x, op, "x", 2);
    check_arg(w, op, "w", 3);
    check_arg(y, op, "y", 2);
    const int64_t rows = x.size(0), k = x.size(1), e = w.size(0), m = w.size(1);
    check_shape(w, {e, m, k}, op, "w");
    check_shape(y, {rows, m}, op, "y");
    const core::Device dev = check_same_device(op, {{"x", x}, {"w", w}, {"y", y}});
    const bool device = use_device_kernel(dev, offsets, impl, x.dtype(), x, w, {{"x", &x}, {"w", &w}, {"y", &y}}, op);
    const Tensor o = device ? device_offsets(offsets, e, op) : host_offsets(offsets, e, rows, op);
    MT_CALL_KERNEL(grouped_linear_fwd, dev, x, w, o, y, impl);
}

void grouped_linear_bwd(const Tensor& x,
                        const Tensor& w,
                        const Tensor& offsets,
                        const Tensor& dy,
                        const Tensor& dx,
                        const Tensor& dw,
                        bool accumulate_dx,
                        GroupedGemm impl,
                        bool accumulate_dw) {
    constexpr std::string_view op = "grouped_linear_bwd";
    check_arg(x, op, "x", 2);
    check_arg(w, op, "w", 3);
    check_arg(dy, op, "dy", 2);
    MT_CHECK(dx.defined() || dw.defined(), "{}: dx and dw are both undefined (nothing to compute)", op);
    const int64_t rows = x.size(0), k = x.size(1), e = w.size(0), m = w.size(1);
    check_shape(w, {e, m, k}, op, "w");
    check_shape(dy, {rows, m}, op, "dy");
    if (dw.defined()) {
        check_arg(dw, op, "dw", 3);
        check_shape(dw, {e, m, k}, op, "dw");
    }
    if (dx.defined()) {
        check_arg(dx, op, "dx", 2);
        check_shape(dx, {rows, k}, op, "dx");
    }
    const core::Device dev = check_same_device(op, {{"x", x}, {"w", w}, {"dy", dy}, {"dx", dx}, {"dw", dw}});
    const DType dw_dtype = dw.defined() ? dw.dtype() : x.dtype();
    const bool device = use_device_kernel(
        dev, offsets, impl, dw_dtype, x, w, {{"x", &x}, {"w", &w}, {"dy", &dy}, {"dx", &dx}, {"dw", &dw}}, op);
    const Tensor o = device ? device_offsets(offsets, e, op) : host_offsets(offsets, e, rows, op);
    MT_CALL_KERNEL(grouped_linear_bwd, dev, x, w, o, dy, dx, dw, accumulate_dx, impl, accumulate_dw);
}

}  // namespace mt::ops
