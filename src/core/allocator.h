// Aligned CPU allocation (64 bytes, a cache line and an AVX-512 vector), and Storage: memory on any device,
// allocated through that device's backend.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/dtype.h"

namespace mt::core {

constexpr size_t kCpuAlignment = 64;

// Returns zeroed memory aligned to kCpuAlignment; throws Error on failure.
void* cpu_alloc(size_t bytes);
void cpu_free(void* ptr);

// A block of memory on one device. Owned storage frees itself; borrowed storage (a view over memory that
// someone else owns, such as an mmap) does not.
class Storage {
   public:
    Storage(size_t bytes, Device device);  // owned, zero-filled
    struct Uninitialized {};
    Storage(size_t bytes, Device device, Uninitialized);  // owned, contents undefined (Backend::alloc_scratch)
    Storage(void* data, size_t bytes, Device device);     // borrowed
    struct Pinned {};
    Storage(size_t bytes, Pinned);  // owned host memory, zero-filled, page-locked where a GPU can copy it (Backend)
    ~Storage();
    Storage(const Storage&) = delete;
    Storage& operator=(const Storage&) = delete;

    void* data() const {
        return data_;
    }
    size_t bytes() const {
        return bytes_;
    }
    Device device() const {
        return device_;
    }

   private:
    void* data_ = nullptr;
    size_t bytes_ = 0;
    Device device_ = Device::cpu;
    bool owned_ = false;
    bool pinned_ = false;
};

// Bytes of owned host storage alive now, ordinary (Device::cpu) and pinned: every CPU tensor's. The memory planner's
// CPU tests hold its figures to them (the CPU backend's bytes_in_use is the resident set, which counts far more).
struct HostStorageBytes {
    int64_t cpu = 0, pinned = 0;
};
HostStorageBytes host_storage_bytes();

class Backend;
// Where pinned host memory comes from: the CUDA backend when this process has a GPU, else the CPU backend.
Backend& pinned_backend();

}  // namespace mt::core
