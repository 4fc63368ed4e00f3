// The op registry: one kernel slot per (op, device). Each backend file fills its slots at static initialisation
// (ops/cpu/NAME.cpp, ops/cuda/*/NAME.cu, with MT_REGISTER_KERNEL); an op's entry point (ops/NAME.cpp) checks shapes,
// asks which device the call runs on and calls that device's slot (MT_CALL_KERNEL). A kernel has the signature of
// its public entry point (ops/NAME.h), checked at registration against every other slot of the op and at each call
// against the entry point's. An empty slot fails with "<op>: not implemented on <device>" (exit 5, device).
//
// Adding an op touches ops/NAME.h (the contract), ops/NAME.cpp (checks + dispatch), ops/cpu/NAME.cpp (the
// reference, registered) and, when it has one, ops/cuda/*/NAME.cu (registered): docs/code_tour.md has the recipe.
// Compiled by nvcc too (C++17).
#pragma once

#include <string>
#include <string_view>
#include <typeinfo>
#include <vector>

#include "core/dtype.h"

namespace mt::ops {

// Whether a kernel accepts a given dtype of its primary tensor (the one named in its registration comment).
using SupportsFn = bool (*)(core::DType);
bool float_dtypes(core::DType dtype);           // f32, f64: the CPU references
bool half_and_float_dtypes(core::DType dtype);  // bf16, f16, f32: most CUDA kernels
bool any_dtype(core::DType dtype);              // ops whose dtype the kernel checks itself (index ops, mixed)

namespace registry {

using ErasedFn = void (*)();
// Fills the slot (op, device); fails (exit 1) if the slot is taken or the signature differs from the op's other
// slots. Returns true (for the static initialiser of MT_REGISTER_KERNEL).
bool add(const char* op, core::Device device, ErasedFn fn, const std::type_info& type, SupportsFn supports);
// The slot's function, or fails: exit 5 naming the op and device when the slot is empty, exit 1 when the caller's
// signature is not the registered one.
ErasedFn find(std::string_view op, core::Device device, const std::type_info& type);
// Every op with at least one filled slot, sorted; and whether (op, device) has a slot.
std::vector<std::string> ops();
bool has(std::string_view op, core::Device device);

}  // namespace registry

// Whether the build has a kernel for op on device that accepts dtype (conventions §1.8).
bool supports(std::string_view op, core::Device device, core::DType dtype);

template <typename Fn>
Fn* kernel(std::string_view op, core::Device device) {
    return reinterpret_cast<Fn*>(registry::find(op, device, typeid(Fn)));
}

}  // namespace mt::ops

#define MT_REGISTRY_CONCAT2(a, b) a##b
#define MT_REGISTRY_CONCAT(a, b) MT_REGISTRY_CONCAT2(a, b)
// MT_REGISTER_KERNEL(rmsnorm_fwd, cpu, cpu::rmsnorm_fwd, ::mt::ops::float_dtypes): at namespace scope in the
// backend's file, which includes the op's header (ops/rmsnorm.h). fn must have the signature of the entry point
// ::mt::ops::rmsnorm_fwd: g++ checks it at compile time (fn may name an overload set, of which that one is taken);
// nvcc cannot take decltype of a function with default arguments, so a .cu file registers fn's own type, which
// registry::add compares with the op's CPU slot when the program starts (a mismatch stops every binary at once).
#ifdef __CUDACC__
#define MT_KERNEL_AS_ENTRY(op, fn) (&(fn))
#define MT_KERNEL_TYPE(op, fn) decltype(fn)
#else
#define MT_KERNEL_AS_ENTRY(op, fn) static_cast<decltype(::mt::ops::op)*>(&(fn))
#define MT_KERNEL_TYPE(op, fn) decltype(::mt::ops::op)
#endif
#define MT_REGISTER_KERNEL(op, device, fn, supports)                                                          \
    static const bool MT_REGISTRY_CONCAT(mt_kernel_registered_, __LINE__) =                                   \
        ::mt::ops::registry::add(#op,                                                                         \
                                 ::mt::core::Device::device,                                                  \
                                 reinterpret_cast<::mt::ops::registry::ErasedFn>(MT_KERNEL_AS_ENTRY(op, fn)), \
                                 typeid(MT_KERNEL_TYPE(op, fn)),                                              \
                                 (supports))
// MT_CALL_KERNEL(rmsnorm_fwd, device, x, weight, eps, y, rstd): calls the slot of ::mt::ops::rmsnorm_fwd on device.
#define MT_CALL_KERNEL(op, device, ...) ::mt::ops::kernel<decltype(::mt::ops::op)>(#op, (device))(__VA_ARGS__)
