// The op registry's table. It is a function-local static so that registrations running at static initialisation,
// in any translation unit's order, find it constructed.
#include "ops/registry.h"

#include <algorithm>
#include <map>
#include <typeindex>

#include "core/error.h"

namespace mt::ops {

bool float_dtypes(core::DType dtype) {
    return dtype == core::DType::f32 || dtype == core::DType::f64;
}
bool half_and_float_dtypes(core::DType dtype) {
    return dtype == core::DType::bf16 || dtype == core::DType::f16 || dtype == core::DType::f32;
}
bool any_dtype(core::DType) {
    return true;
}

namespace registry {
namespace {

constexpr int kDevices = 2;

struct Slot {
    ErasedFn fn = nullptr;
    SupportsFn supports = nullptr;
};
struct Entry {
    const std::type_info* type = nullptr;
    Slot slots[kDevices];
};

std::map<std::string, Entry, std::less<>>& table() {
    static std::map<std::string, Entry, std::less<>> entries;
    return entries;
}

}  // namespace

bool add(const char* op, core::Device device, ErasedFn fn, const std::type_info& type, SupportsFn supports) {
    Entry& entry = table()[op];
    MT_CHECK(entry.type == nullptr || std::type_index(*entry.type) == std::type_index(type),
             "op registry: the {} kernel of {} has another signature than the op's other kernels",
             core::device_name(device),
             op);
    Slot& slot = entry.slots[static_cast<int>(device)];
    MT_CHECK(slot.fn == nullptr, "op registry: {} has two {} kernels", op, core::device_name(device));
    entry.type = &type;
    slot = {fn, supports};
    return true;
}

ErasedFn find(std::string_view op, core::Device device, const std::type_info& type) {
    const auto it = table().find(op);
    const Slot* slot = it == table().end() ? nullptr : &it->second.slots[static_cast<int>(device)];
    if (slot == nullptr || slot->fn == nullptr) {
#ifndef MT_HAVE_CUDA
        if (device == core::Device::cuda)
            core::fail(
                core::ExitCode::device, "{}: this build has no CUDA path (nvcc was not found at build time)", op);
#endif
        core::fail(core::ExitCode::device, "{}: not implemented on {}", op, core::device_name(device));
    }
    MT_CHECK(std::type_index(*it->second.type) == std::type_index(type),
             "op registry: {} is called with another signature than its kernels'",
             op);
    return slot->fn;
}

std::vector<std::string> ops() {
    std::vector<std::string> names;
    for (const auto& [name, entry] : table()) names.push_back(name);
    return names;
}

bool has(std::string_view op, core::Device device) {
    const auto it = table().find(op);
    return it != table().end() && it->second.slots[static_cast<int>(device)].fn != nullptr;
}

}  // namespace registry

bool supports(std::string_view op, core::Device device, core::DType dtype) {
    const auto it = registry::table().find(op);
    if (it == registry::table().end()) return false;
    const registry::Slot& slot = it->second.slots[static_cast<int>(device)];
    return slot.fn != nullptr && slot.supports(dtype);
}

}  // namespace mt::ops
