// CPU reference of the counter-based normal fill (ops/rng_fill.h): one draw per element, each its own Philox
// counter, so any thread count gives the same values.
#include "ops/rng_fill.h"

#include "core/philox.h"
#include "ops/registry.h"

namespace mt::ops::cpu {

namespace {

template <typename T, typename Convert>
void fill(T* out, int64_t n, uint64_t seed, uint64_t stream, uint64_t offset, double mean, double std, Convert cvt) {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i)
        out[i] = cvt(mean + std * core::philox_normal(seed, stream, offset + static_cast<uint64_t>(i)));
}

bool any_float(core::DType dtype) {
    return core::dtype_is_float(dtype);
}

}  // namespace

void rng_fill_normal(const Tensor& out, uint64_t seed, uint64_t stream, uint64_t offset, double mean, double std) {
    constexpr std::string_view op = "rng_fill_normal";
    check_dtype_in(out, {DType::f32, DType::f64, DType::bf16, DType::f16}, op, "out");
    const int64_t n = out.numel();
    switch (out.dtype()) {
        case DType::f64:
            fill(out.data<double>(), n, seed, stream, offset, mean, std, [](double v) { return v; });
            break;
        case DType::f32:
            fill(out.data<float>(), n, seed, stream, offset, mean, std, [](double v) { return static_cast<float>(v); });
            break;
        case DType::bf16:
            fill(static_cast<uint16_t*>(out.raw()), n, seed, stream, offset, mean, std, [](double v) {
                return core::f32_to_bf16(static_cast<float>(v));
            });
            break;
        default:
            fill(static_cast<uint16_t*>(out.raw()), n, seed, stream, offset, mean, std, [](double v) {
                return core::f32_to_f16(static_cast<float>(v));
            });
            break;
    }
}
MT_REGISTER_KERNEL(rng_fill_normal, cpu, rng_fill_normal, any_float);

}  // namespace mt::ops::cpu
