// The CUDA backend: a caching device allocator (freed blocks are kept per size class and reused, as PyTorch's
// caching allocator does, so training steps stop calling cudaMalloc after the first), one stream per lane
// (core/exec.h) with its own pool of cached blocks, copies, and CUDA graphs with a pool of their own.
#include <cuda_runtime.h>
#include <nvtx3/nvToolsExt.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "core/backend.h"
#include "core/cuda/cuda_check.h"
#include "core/cuda_probe.h"

namespace mt::core {

void cuda_fail(cudaError_t err, const char* what, const char* file, int line) {
    throw Error(ExitCode::device,
                std::string("CUDA error: ") + cudaGetErrorString(err) + " in " + what + " at " + file + ":" +
                    std::to_string(line));
}

namespace {

constexpr int kLanes = 3;
// The graphs' pool (after the lanes' pools): what a capture allocates, and every block freed during one. A replay
// writes the addresses its capture recorded, so while a graph lives none of them may go to an allocation outside a
// capture; when the last graph is destroyed the pool's free blocks go back to the main lane's.
constexpr int kGraphPool = kLanes;
constexpr int kPools = kLanes + 1;

int lane_index(Lane lane) {
    return lane == Lane::main ? 0 : lane == Lane::side ? 1 : 2;
}

cudaStream_t make_stream() {
    cudaStream_t s = nullptr;
    MT_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    return s;
}

}  // namespace

cudaStream_t lane_stream(Lane lane) {
    static cudaStream_t main_stream = make_stream();
    if (lane == Lane::main) return main_stream;
    static cudaStream_t side_stream = make_stream();
    if (lane == Lane::side) return side_stream;
    static cudaStream_t copy_stream = make_stream();
    return copy_stream;
}

cudaStream_t exec_stream() {
    return lane_stream(exec().lane);
}

namespace {

cudaMemcpyKind copy_kind(Device dst, Device src) {
    if (dst == Device::cpu && src != Device::cpu) return cudaMemcpyDeviceToHost;
    if (dst != Device::cpu && src == Device::cpu) return cudaMemcpyHostToDevice;
    return cudaMemcpyDeviceToDevice;
}

// Size classes: multiples of 512 bytes below 1 MiB, of 2 MiB above.
size_t size_class(size_t bytes) {
    const size_t quantum = bytes < (size_t{1} << 20) ? 512 : (size_t{2} << 20);
    return (bytes + quantum - 1) / quantum * quantum;
}

class CudaBackend final : public Backend {
   public:
    std::string name() const override {
        return "cuda";
    }

    void* alloc(size_t bytes) override {
        void* ptr = alloc_scratch(bytes);
        MT_CUDA_CHECK(cudaMemsetAsync(ptr, 0, size_class(bytes == 0 ? 1 : bytes), exec_stream()));
        return ptr;
    }

    void set_scratch_poison(bool on) override {
        poison_ = on;
    }

    void* alloc_scratch(size_t bytes) override {
        const size_t cls = size_class(bytes == 0 ? 1 : bytes);
        void* ptr = nullptr;
        int lane = 0;
        {
            std::lock_guard<std::mutex> lock(mutex_);
            lane = in_capture() ? kGraphPool : lane_index(exec().lane);
            auto it = cache_[lane].find(cls);
            if (it != cache_[lane].end() && !it->second.empty()) {
                ptr = it->second.back();
                it->second.pop_back();
                cached_bytes_ -= cls;
                if (lane == kGraphPool) seeded_.erase(ptr);  // a graph uses it now
            }
        }
        if (ptr == nullptr) {
            cudaError_t err = cudaMalloc(&ptr, cls);
            if (err == cudaErrorMemoryAllocation && !in_capture()) {  // release_cache synchronises: not in a capture
                (void)cudaGetLastError();
                release_cache();
                err = cudaMalloc(&ptr, cls);
            }
            if (err != cudaSuccess)
                fail_hint(ExitCode::device,
                          in_capture() ? "set train.cuda_graphs = false (a graph's capture cannot release the cache), "
                                         "reduce train.batch_size or train.seq_len, or enable recomputation"
                                       : "reduce train.batch_size or train.seq_len, or enable recomputation",
                          "cannot allocate {} bytes on the GPU: {} ({} bytes in use)",
                          cls,
                          cudaGetErrorString(err),
                          in_use_bytes_);
        }
        if (poison_) MT_CUDA_CHECK(cudaMemsetAsync(ptr, 0xFF, cls, exec_stream()));
        std::lock_guard<std::mutex> lock(mutex_);
        owner_[ptr] = lane;
        in_use_bytes_ += cls;
        peak_bytes_ = std::max(peak_bytes_, in_use_bytes_);
        return ptr;
    }

    void free(void* ptr, size_t bytes) override {
        if (ptr == nullptr) return;
        const size_t cls = size_class(bytes == 0 ? 1 : bytes);
        std::lock_guard<std::mutex> lock(mutex_);
        const auto owner = owner_.find(ptr);
        int lane = owner != owner_.end() ? owner->second : 0;
        if (owner != owner_.end()) owner_.erase(owner);
        // A block the capturing thread frees during a capture may be one the graph uses; a graph block goes back to
        // the main lane's pool once no graph lives.
        if (in_capture()) lane = kGraphPool;
        if (lane == kGraphPool && graphs_alive_ == 0 && !capturing_) lane = 0;
        cache_[lane][cls].push_back(ptr);  // reused by a later alloc on the same lane: stream order keeps it safe
        in_use_bytes_ -= cls;
        cached_bytes_ += cls;
    }

    void copy(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes) override {
        if (bytes == 0) return;
        const cudaMemcpyKind kind = copy_kind(dst_device, src_device);
        MT_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, kind, exec_stream()));
        if (kind != cudaMemcpyDeviceToDevice) MT_CUDA_CHECK(cudaStreamSynchronize(exec_stream()));
    }

    void memset_zero(void* ptr, size_t bytes) override {
        MT_CUDA_CHECK(cudaMemsetAsync(ptr, 0, bytes, exec_stream()));
    }

    void synchronize() override {
        for (Lane lane : {Lane::main, Lane::side, Lane::copy}) MT_CUDA_CHECK(cudaStreamSynchronize(lane_stream(lane)));
    }

    void lane_wait(Lane waiter, Lane signaller) override {
        cudaEvent_t event = nullptr;
        MT_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
        MT_CUDA_CHECK(cudaEventRecord(event, lane_stream(signaller)));
        MT_CUDA_CHECK(cudaStreamWaitEvent(lane_stream(waiter), event, 0));
        MT_CUDA_CHECK(cudaEventDestroy(event));  // released once the wait has completed
    }

    void* alloc_pinned(size_t bytes) override {
        void* ptr = nullptr;
        const cudaError_t err = cudaHostAlloc(&ptr, bytes == 0 ? 1 : bytes, cudaHostAllocDefault);
        if (err != cudaSuccess) {
            (void)cudaGetLastError();
            fail_hint(ExitCode::device,
                      "the host's memory: optim.offload = \"cpu\" keeps 12 bytes per parameter there (8 with "
                      "optim.state_dtype = \"bf16\")",
                      "cannot allocate {} bytes of pinned host memory: {}",
                      bytes,
                      cudaGetErrorString(err));
        }
        std::memset(ptr, 0, bytes);
        return ptr;
    }

    void free_pinned(void* ptr) override {
        if (ptr != nullptr) cudaFreeHost(ptr);
    }

    void copy_async(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes) override {
        if (bytes == 0) return;
        MT_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, copy_kind(dst_device, src_device), exec_stream()));
    }

    // A marker is the event and the device it was recorded on, so that any thread can wait for it: a thread other
    // than the recording one (the asynchronous checkpoint's writer) starts on device 0, and is moved to the
    // marker's device (its primary context, which the recording thread already holds) before it waits.
    struct Marker {
        cudaEvent_t event;
        int device;
    };

    uint64_t lane_marker(Lane lane) override {
        auto marker = std::make_unique<Marker>();
        MT_CUDA_CHECK(cudaGetDevice(&marker->device));
        MT_CUDA_CHECK(cudaEventCreateWithFlags(&marker->event, cudaEventDisableTiming));
        MT_CUDA_CHECK(cudaEventRecord(marker->event, lane_stream(lane)));
        return reinterpret_cast<uint64_t>(marker.release());
    }

    void marker_wait(uint64_t marker) override {
        if (marker == 0) return;
        const std::unique_ptr<Marker> m(reinterpret_cast<Marker*>(marker));
        int current = 0;
        MT_CUDA_CHECK(cudaGetDevice(&current));
        if (current != m->device) MT_CUDA_CHECK(cudaSetDevice(m->device));
        const cudaError_t synced = cudaEventSynchronize(m->event);
        MT_CUDA_CHECK(cudaEventDestroy(m->event));
        MT_CUDA_CHECK(synced);
    }

    size_t bytes_in_use() const override {
        std::lock_guard<std::mutex> lock(mutex_);
        return in_use_bytes_;
    }
    // Everything cudaMalloc gave and cudaFree has not taken back: the blocks in use and those cached for reuse.
    size_t reserved_bytes() const override {
        std::lock_guard<std::mutex> lock(mutex_);
        return in_use_bytes_ + cached_bytes_;
    }
    size_t peak_bytes() const override {
        std::lock_guard<std::mutex> lock(mutex_);
        return peak_bytes_;
    }
    void reset_peak() override {
        std::lock_guard<std::mutex> lock(mutex_);
        peak_bytes_ = in_use_bytes_;
    }
    size_t total_bytes() const override {
        // The current device's memory: the one this process uses (a rank sets its device before any allocation).
        // Asked once: the trainer reads it every step, and it does not change.
        if (total_bytes_ == 0) {
            size_t free = 0, total = 0;
            MT_CUDA_CHECK(cudaMemGetInfo(&free, &total));
            total_bytes_ = total;
        }
        return total_bytes_;
    }
    int thread_device_index() const override {
        int device = 0;
        MT_CUDA_CHECK(cudaGetDevice(&device));
        return device;
    }
    void set_thread_device_index(int index) override {
        MT_CUDA_CHECK(cudaSetDevice(index));
    }
    bool supports_graphs() const override {
        return true;
    }

    // Relaxed mode: a capture may call cudaMalloc (a scratch pool's miss), and other threads (the checkpoint writer)
    // go on with their own streams; a synchronisation of the captured stream still fails the capture.
    void begin_capture() override {
        {
            std::lock_guard<std::mutex> lock(mutex_);
            MT_CHECK(!capturing_, "a CUDA graph capture is already under way");
            // The main lane's free blocks (an eager step's scratch) are lent to the capture, which reuses them
            // instead of allocating the same sizes again; end_capture gives back those it did not take.
            for (const auto& [cls, ptrs] : cache_[0]) seeded_.insert(ptrs.begin(), ptrs.end());
            move_free_blocks(0, kGraphPool);
            capture_thread_ = std::this_thread::get_id();
            capturing_ = true;
        }
        const cudaError_t err = cudaStreamBeginCapture(lane_stream(Lane::main), cudaStreamCaptureModeRelaxed);
        if (err != cudaSuccess) {
            {
                std::lock_guard<std::mutex> lock(mutex_);
                capturing_ = false;
                return_unused_seeds();
            }
            release_graph_pool_if_unused();
            MT_CUDA_CHECK(err);
        }
    }

    uint64_t end_capture(bool keep) override {
        cudaGraph_t graph = nullptr;
        const cudaError_t ended = cudaStreamEndCapture(lane_stream(Lane::main), &graph);
        {
            std::lock_guard<std::mutex> lock(mutex_);
            capturing_ = false;
            return_unused_seeds();
            if (keep && ended == cudaSuccess) ++graphs_alive_;  // before instantiating: a failure below undoes it
        }
        if (!keep || ended != cudaSuccess) {
            if (graph != nullptr) cudaGraphDestroy(graph);
            (void)cudaGetLastError();
            release_graph_pool_if_unused();
            if (keep) MT_CUDA_CHECK(ended);
            return 0;
        }
        cudaGraphExec_t exec = nullptr;
        const cudaError_t made = cudaGraphInstantiate(&exec, graph, 0);
        cudaGraphDestroy(graph);
        if (made != cudaSuccess) {
            {
                std::lock_guard<std::mutex> lock(mutex_);
                --graphs_alive_;
            }
            release_graph_pool_if_unused();
            MT_CUDA_CHECK(made);
        }
        return reinterpret_cast<uint64_t>(exec);
    }

    void graph_launch(uint64_t graph) override {
        MT_CUDA_CHECK(cudaGraphLaunch(reinterpret_cast<cudaGraphExec_t>(graph), lane_stream(Lane::main)));
    }

    void graph_destroy(uint64_t graph) override {
        if (graph == 0) return;
        // A replay may still be running: its blocks go back to the main pool only after it has finished.
        MT_CUDA_CHECK(cudaStreamSynchronize(lane_stream(Lane::main)));
        MT_CUDA_CHECK(cudaGraphExecDestroy(reinterpret_cast<cudaGraphExec_t>(graph)));
        {
            std::lock_guard<std::mutex> lock(mutex_);
            --graphs_alive_;
        }
        release_graph_pool_if_unused();
    }

    void range_push(const char* name) override {
        nvtxRangePushA(name);
    }
    void range_pop() override {
        nvtxRangePop();
    }

   private:
    // Whether this call is the capturing thread's during a capture: only its allocations and frees go to the graph
    // pool (another thread's, such as the checkpoint writer's, keep their own).
    bool in_capture() const {
        return capturing_ && std::this_thread::get_id() == capture_thread_;
    }

    // Callers hold mutex_. The lent main-lane blocks that the capture did not take go back to the main lane's pool.
    void return_unused_seeds() {
        for (auto& [cls, ptrs] : cache_[kGraphPool]) {
            auto unused = std::stable_partition(ptrs.begin(), ptrs.end(), [&](void* p) { return !seeded_.count(p); });
            auto& dst = cache_[0][cls];
            dst.insert(dst.end(), unused, ptrs.end());
            ptrs.erase(unused, ptrs.end());
        }
        seeded_.clear();
    }

    // Callers hold mutex_.
    void move_free_blocks(int from, int to) {
        for (auto& [cls, ptrs] : cache_[from]) {
            auto& dst = cache_[to][cls];
            dst.insert(dst.end(), ptrs.begin(), ptrs.end());
        }
        cache_[from].clear();
    }

    void release_graph_pool_if_unused() {
        std::lock_guard<std::mutex> lock(mutex_);
        if (graphs_alive_ > 0 || capturing_) return;
        move_free_blocks(kGraphPool, 0);
        for (auto& [ptr, pool] : owner_)
            if (pool == kGraphPool) pool = 0;
    }

    void release_cache() {
        synchronize();
        std::lock_guard<std::mutex> lock(mutex_);
        for (int pool = 0; pool < kPools; ++pool) {
            if (pool == kGraphPool && graphs_alive_ > 0) continue;  // a replay writes them: not the driver's to reuse
            for (auto& [cls, ptrs] : cache_[pool])
                for (void* p : ptrs) {
                    cudaFree(p);
                    cached_bytes_ -= cls;
                }
            cache_[pool].clear();
        }
    }

    mutable std::mutex mutex_;  // also taken by the const getters, so they read the counters as alloc and free do
    std::map<size_t, std::vector<void*>> cache_[kPools];  // per lane, and the graphs': size class -> free blocks
    std::unordered_map<void*, int> owner_;                // live block -> the pool that gets it back
    std::atomic<bool> capturing_{false};                  // begin_capture .. end_capture (alloc reads it unlocked)
    std::thread::id capture_thread_;                      // the thread that capture is recording
    std::unordered_set<void*> seeded_;                    // main-lane blocks lent to the capture and not yet taken
    int graphs_alive_ = 0;
    size_t in_use_bytes_ = 0, cached_bytes_ = 0, peak_bytes_ = 0;
    mutable std::atomic<size_t> total_bytes_{0};
    std::atomic<bool> poison_{[] {
        const char* env = std::getenv("MT_SCRATCH_POISON");
        return env != nullptr && std::strcmp(env, "1") == 0;
    }()};
};

}  // namespace

Backend* cuda_backend_instance() {
    static CudaBackend* backend = cuda_device_count() > 0 ? new CudaBackend() : nullptr;
    return backend;
}

}  // namespace mt::core
