// Backends behind one small interface (conventions §1.8): memory on a device, copies between host and device,
// synchronisation. The CPU backend is always there; the CUDA backend exists when the build found nvcc and a GPU is
// visible at run time. Ops dispatch on the tensors' device, so model code never contains #ifdefs.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "core/dtype.h"
#include "core/exec.h"

namespace mt::core {

class Backend {
   public:
    virtual ~Backend() = default;
    virtual std::string name() const = 0;
    // Zero-filled memory; throws Error(ExitCode::device) when it cannot be had.
    virtual void* alloc(size_t bytes) = 0;
    virtual void free(void* ptr, size_t bytes) = 0;
    // alloc, alloc_scratch, copy and memset_zero run on the current context's lane (core::exec()); free returns
    // the memory to the pool of the lane that allocated it.
    // Scratch an op overwrites in full before reading it: contents undefined (the CUDA backend skips the zeroing
    // memset, which for the attention backward's 134 MB dq buffer cost about 1 ms per training step of the 1.3B
    // model). Freed with free().
    virtual void* alloc_scratch(size_t bytes) {
        return alloc(bytes);
    }
    // Tests: fill every later scratch allocation with all-ones bytes (NaN as f32/bf16/f16), so that a read of a
    // byte an op never wrote shows up in its results. Also on with MT_SCRATCH_POISON=1 in the environment.
    virtual void set_scratch_poison(bool on) {}
    // Copies bytes; either side may be host memory (src_device / dst_device say which). Returns when the data
    // has arrived (host-visible copies are synchronous).
    virtual void copy(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes) = 0;
    virtual void memset_zero(void* ptr, size_t bytes) = 0;
    // Waits for all work queued on this backend (every lane).
    virtual void synchronize() = 0;
    // Orders two lanes (core::lane_wait); the CPU runs everything in call order and needs nothing.
    virtual void lane_wait(Lane waiter, Lane signaller) {}

    // Host memory for copies that overlap other work (optimizer offload, docs/training.md "Memory"): zero-filled and
    // page-locked on CUDA, so copy_async moves it by DMA without staging; ordinary aligned memory on the CPU.
    virtual void* alloc_pinned(size_t bytes);
    virtual void free_pinned(void* ptr);
    // Like copy, but queued on the current lane and returning at once: the host side must be pinned memory that
    // stays untouched until a marker recorded after the copy has been waited for. The CPU copies now.
    virtual void copy_async(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes) {
        copy(dst, dst_device, src, src_device, bytes);
    }
    // A point in lane's queue (a CUDA event; 0 on the CPU, where the work is already done), and the host's wait
    // for it, which also releases it (each marker is waited for exactly once, from any thread).
    virtual uint64_t lane_marker(Lane lane) {
        return 0;
    }
    virtual void marker_wait(uint64_t marker) {}
    // Memory statistics (the per-step mem/* metrics, docs/training.md); 0 where not known.
    // CUDA: the caching allocator's figures, kept on the host as blocks are handed out and returned (in whole size
    // classes, so a little above what callers asked for). bytes_in_use: handed out now; reserved_bytes: held from
    // the driver (in use plus cached for reuse); peak_bytes: the most handed out at once since reset_peak (or since
    // the start); total_bytes: the GPU's memory.
    // CPU: the process's resident set, every page it holds and not only tensors (the allocator does not track its
    // blocks, and freed memory may stay with the process). bytes_in_use = reserved_bytes: the RSS now; peak_bytes:
    // the kernel's high-water mark (VmHWM), which reset_peak sets back to the RSS now (/proc/self/clear_refs; where
    // that fails the peak stays the one since the process started); total_bytes: the machine's physical memory.
    virtual size_t bytes_in_use() const {
        return 0;
    }
    virtual size_t reserved_bytes() const {
        return 0;
    }
    virtual size_t peak_bytes() const {
        return 0;
    }
    virtual void reset_peak() {}
    virtual size_t total_bytes() const {
        return 0;
    }
    // The device index this thread's calls go to (CUDA: cudaGetDevice), and making it this thread's: a helper
    // thread that allocates for another (the asynchronous checkpoint's reservation) must use that thread's GPU,
    // not device 0. Nothing on the CPU.
    virtual int thread_device_index() const {
        return 0;
    }
    virtual void set_thread_device_index(int index) {}
    // CUDA graphs (core/graph.h): between begin_capture and end_capture the work this thread queues on the main lane
    // is recorded instead of run (end_capture returns the instantiated graph, graph_launch queues it on the main lane,
    // graph_destroy frees it). While capturing, and while any graph lives, scratch comes from and goes back to a pool
    // of the graphs' own (the CUDA backend's graph pool), so that no allocation outside a graph is ever handed an
    // address a replay writes. supports_graphs is false on the CPU, whose calls throw.
    virtual bool supports_graphs() const {
        return false;
    }
    virtual void begin_capture();
    // keep = false ends a capture that failed, discarding what it recorded (returns 0).
    virtual uint64_t end_capture(bool keep);
    virtual void graph_launch(uint64_t graph);
    virtual void graph_destroy(uint64_t graph);
    // Named ranges for external profilers (NVTX on CUDA); nothing by default.
    virtual void range_push(const char* name) {}
    virtual void range_pop() {}
};

// The backend of a device; fails with ExitCode::device (naming why) when the device is unavailable.
Backend& backend_get(Device device);
// True when the device can be used in this process (CUDA: compiled in and at least one GPU visible).
bool backend_available(Device device);

// The CUDA backend instance, or nullptr (no CUDA path in this build, or no GPU). Defined by the CUDA half of
// the build, or by a stub in CPU-only builds.
Backend* cuda_backend_instance();

}  // namespace mt::core
