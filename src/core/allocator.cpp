// Aligned CPU allocator.
#include "core/allocator.h"

#include <atomic>
#include <cstdlib>
#include <cstring>

#include "core/backend.h"
#include "core/error.h"

namespace mt::core {

namespace {

std::atomic<int64_t> g_host_cpu_bytes{0}, g_host_pinned_bytes{0};

// The counter an owned storage of this kind adds its bytes to (none for device memory).
std::atomic<int64_t>* host_counter(Device device, bool pinned) {
    if (pinned) return &g_host_pinned_bytes;
    return device == Device::cpu ? &g_host_cpu_bytes : nullptr;
}

void host_count(Device device, bool pinned, int64_t bytes) {
    if (std::atomic<int64_t>* c = host_counter(device, pinned)) c->fetch_add(bytes, std::memory_order_relaxed);
}

}  // namespace

HostStorageBytes host_storage_bytes() {
    return {g_host_cpu_bytes.load(std::memory_order_relaxed), g_host_pinned_bytes.load(std::memory_order_relaxed)};
}

void* cpu_alloc(size_t bytes) {
    const size_t rounded = (bytes + kCpuAlignment - 1) / kCpuAlignment * kCpuAlignment;
    void* ptr = std::aligned_alloc(kCpuAlignment, rounded == 0 ? kCpuAlignment : rounded);
    if (ptr == nullptr) fail(ExitCode::device, "out of host memory allocating {} bytes", bytes);
    std::memset(ptr, 0, rounded);
    return ptr;
}

void cpu_free(void* ptr) {
    std::free(ptr);
}

Storage::Storage(size_t bytes, Device device) : bytes_(bytes), device_(device), owned_(true) {
    data_ = backend_get(device).alloc(bytes);
    host_count(device_, false, static_cast<int64_t>(bytes_));
}

Storage::Storage(size_t bytes, Device device, Uninitialized) : bytes_(bytes), device_(device), owned_(true) {
    data_ = backend_get(device).alloc_scratch(bytes);
    host_count(device_, false, static_cast<int64_t>(bytes_));
}

Storage::Storage(void* data, size_t bytes, Device device) : data_(data), bytes_(bytes), device_(device) {}

Storage::Storage(size_t bytes, Pinned) : bytes_(bytes), device_(Device::cpu), owned_(true), pinned_(true) {
    data_ = pinned_backend().alloc_pinned(bytes);
    host_count(device_, true, static_cast<int64_t>(bytes_));
}

Storage::~Storage() {
    if (owned_) host_count(device_, pinned_, -static_cast<int64_t>(bytes_));
    if (pinned_)
        pinned_backend().free_pinned(data_);
    else if (owned_)
        backend_get(device_).free(data_, bytes_);
}

Backend& pinned_backend() {
    // The backend whose copies will read the memory: CUDA's when this process has a GPU, else the CPU's.
    Backend* cuda = cuda_backend_instance();
    return cuda != nullptr ? *cuda : backend_get(Device::cpu);
}

}  // namespace mt::core
