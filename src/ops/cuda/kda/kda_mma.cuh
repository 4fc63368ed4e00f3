// Tensor-core building blocks of the fast KDA kernels (kda_scan_tc.cu and the others): the TF32 mma.sync m16n8k8
// fragments (instructions in prim/mma.cuh) read from fp32 shared memory, cp.async staging of fp32 tiles, and the
// per-kernel timing hooks. TF32 keeps fp32's exponent range (the workspace tiles are fp32) and rounds operands to 10
// mantissa bits; every accumulator, and the state itself, stays fp32.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "ops/cuda/common.cuh"
#include "ops/cuda/prim/cp_async.cuh"
#include "ops/cuda/prim/ldmatrix.cuh"
#include "ops/cuda/prim/mma.cuh"

namespace mt::ops::cuda::kda {

// The largest spread of Gamma inside a 16-row tile (nats) for which the anchored tile products run: their operand
// factors reach e^spread, and the products must stay finite in fp32 (the bound dates from a to_tf32 that needed
// |x| * 8193 below fp32's maximum, e^76 * 8193 ~ 8e36; kept as the margin). The lower-bounded gate keeps the spread
// <= 15 * 5 = 75.
constexpr float kAnchorMaxNats = 76.0f;
// Whether a 16-row tile's anchored operands stay in range in channel x: Gamma's spread over the tile
// (nats) plus the log of the largest |q|, |k| of its rows there (magnitudes up to 1, the layer's, add nothing).
__device__ __forceinline__ bool anchor_ok(float spread_nats, float max_abs) {
    return spread_nats + __logf(fmaxf(max_abs, 1.0f)) <= kAnchorMaxNats;
}

// Fragment loads (PTX m16n8k8 tf32 layout; g = lane / 4, t = lane % 4). X is fp32 in shared memory with row stride
// ld. The paddings of the callers (ld = 4 mod 32 for row reads, 8 mod 32 for transposed reads and B tiles) make every
// load below free of bank conflicts.
// A[m][k] = X[m][k] (row-major A tile at (m0, k0)).
__device__ __forceinline__ void frag_a(uint32_t (&a)[4], const float* x, int ld, int m0, int k0, int g, int t) {
    a[0] = to_tf32(x[(m0 + g) * ld + k0 + t]);
    a[1] = to_tf32(x[(m0 + g + 8) * ld + k0 + t]);
    a[2] = to_tf32(x[(m0 + g) * ld + k0 + t + 4]);
    a[3] = to_tf32(x[(m0 + g + 8) * ld + k0 + t + 4]);
}
// A[m][k] = X[k][m] (A is the transpose of the stored tile).
__device__ __forceinline__ void frag_at(uint32_t (&a)[4], const float* x, int ld, int m0, int k0, int g, int t) {
    a[0] = to_tf32(x[(k0 + t) * ld + m0 + g]);
    a[1] = to_tf32(x[(k0 + t) * ld + m0 + g + 8]);
    a[2] = to_tf32(x[(k0 + t + 4) * ld + m0 + g]);
    a[3] = to_tf32(x[(k0 + t + 4) * ld + m0 + g + 8]);
}
// B[k][n] = X[k][n] (row-major over k).
__device__ __forceinline__ void frag_b(uint32_t (&b)[2], const float* x, int ld, int k0, int n0, int g, int t) {
    b[0] = to_tf32(x[(k0 + t) * ld + n0 + g]);
    b[1] = to_tf32(x[(k0 + t + 4) * ld + n0 + g]);
}
// B[k][n] = X[n][k] (the stored tile holds B's columns as rows).
__device__ __forceinline__ void frag_bt(uint32_t (&b)[2], const float* x, int ld, int k0, int n0, int g, int t) {
    b[0] = to_tf32(x[(n0 + g) * ld + k0 + t]);
    b[1] = to_tf32(x[(n0 + g) * ld + k0 + t + 4]);
}

// Fragment loads without conversion, same layouts as frag_a / frag_at / frag_b / frag_bt: E = float for operands
// converted or split afterwards, E = uint32_t for tiles already holding TF32 bit patterns (split_tile_tf32).
template <typename E>
__device__ __forceinline__ void frag_a_f(E (&a)[4], const E* x, int ld, int m0, int k0, int g, int t) {
    a[0] = x[(m0 + g) * ld + k0 + t];
    a[1] = x[(m0 + g + 8) * ld + k0 + t];
    a[2] = x[(m0 + g) * ld + k0 + t + 4];
    a[3] = x[(m0 + g + 8) * ld + k0 + t + 4];
}
template <typename E>
__device__ __forceinline__ void frag_at_f(E (&a)[4], const E* x, int ld, int m0, int k0, int g, int t) {
    a[0] = x[(k0 + t) * ld + m0 + g];
    a[1] = x[(k0 + t) * ld + m0 + g + 8];
    a[2] = x[(k0 + t + 4) * ld + m0 + g];
    a[3] = x[(k0 + t + 4) * ld + m0 + g + 8];
}
template <typename E>
__device__ __forceinline__ void frag_b_f(E (&b)[2], const E* x, int ld, int k0, int n0, int g, int t) {
    b[0] = x[(k0 + t) * ld + n0 + g];
    b[1] = x[(k0 + t + 4) * ld + n0 + g];
}
template <typename E>
__device__ __forceinline__ void frag_bt_f(E (&b)[2], const E* x, int ld, int k0, int n0, int g, int t) {
    b[0] = x[(n0 + g) * ld + k0 + t];
    b[1] = x[(n0 + g) * ld + k0 + t + 4];
}

// ldmatrix on 32-bit tiles already holding TF32 bits: an 8 x 8 matrix of 16-bit elements is 8 rows of four 32-bit
// words, and ldmatrix gives lane (g, t) row g, word t, which is where the m16n8k8 TF32 fragments want them. One
// ldmatrix.x4 replaces four 32-bit shared loads (the scans issued 2.5 loads per MMA, a third of their
// instructions). Rows 16-byte aligned (ld % 4 == 0 and an aligned base); a row stride of 4 mod 32 words keeps each
// 8-row phase free of bank conflicts.
// frag_a_f's fragment (row-major A tile at (m0, k0)) by one ldmatrix.x4.
__device__ __forceinline__ void frag_a_ldsm(uint32_t (&a)[4], const uint32_t* x, int ld, int m0, int k0, int lane) {
    const int j = lane / 8, r = lane % 8;
    ldmatrix_x4(a, x + (m0 + r + 8 * (j & 1)) * ld + k0 + 4 * (j >> 1));
}
// Two B fragments (b[0], b[1]) from B's transpose stored row-major (X[n][k] = B[k][n]) by one ldmatrix.x4: k-step
// k0 of column tiles n0 and n0 + dn, or with dn = 0 k-steps k0 and k0 + 8 of tile n0 (each frag_bt_f's fragment).
// lane_off = bt_x4_lane(ld, dn, lane), computed once: with the tile offset folded into it, the scans kept one
// address per tile pair live and spilled.
__device__ __forceinline__ int bt_x4_lane(int ld, int dn, int lane) {
    const int j = lane / 8;
    return dn > 0 ? ((j < 2 ? 0 : dn) + lane % 8) * ld + 4 * (j & 1) : (lane % 8) * ld + 4 * j;
}
__device__ __forceinline__ void frag_bt_x4(
    uint32_t (&b)[2][2], const uint32_t* x, int lane_off, int ld, int k0, int n0) {
    uint32_t r[4];
    ldmatrix_x4(r, x + lane_off + n0 * ld + k0);
    b[0][0] = r[0];
    b[0][1] = r[1];
    b[1][0] = r[2];
    b[1][1] = r[3];
}

// A [rows, cols] fp32 tile of stride ld in shared memory -> its TF32 high parts in place and the low parts
// (split_tf32) into lo, by the whole block, for operands that many warps read: split once, not at every load.
template <bool kSplit>
__device__ __forceinline__ void split_tile_tf32(float* x, uint32_t* lo, int ld, int rows, int cols) {
    for (int e = threadIdx.x; e < rows * cols; e += blockDim.x) {
        const int i = (e / cols) * ld + e % cols;
        uint32_t hi, l;
        split_tf32<kSplit>(x[i], hi, l);
        reinterpret_cast<uint32_t*>(x)[i] = hi;
        lo[i] = l;
    }
}

// rows x cols elements of E (fp32, or a 16-bit type; cols * sizeof(E) % 16 == 0, contiguous rows of stride src_ld)
// into shared memory of row stride ld, by the whole block, 16 bytes per copy. kNThreads: the block size when the
// caller knows it at compile time (with rows and cols constants too, the copy loop then has no division and unrolls:
// the scans' per-copy issue).
template <int kNThreads = 0, typename E>
__device__ __forceinline__ void stage_async(E* dst, int ld, const E* src, int src_ld, int rows, int cols) {
    constexpr int kPerCopy = 16 / static_cast<int>(sizeof(E));  // elements per 16-byte copy
    const int per = cols / kPerCopy, nthreads = kNThreads > 0 ? kNThreads : static_cast<int>(blockDim.x);
    if (nthreads % per == 0) {
        // Each thread keeps one 16-byte column slot and walks the rows by pointer steps: no integer division per
        // copy (the scans issue ~7k copies per chunk; a 32 KB tile's issue measured 1.7k cycles with the division,
        // 1.0k without, at BV = 16).
        const int tid = static_cast<int>(threadIdx.x), r0 = tid / per, c4 = (tid % per) * kPerCopy,
                  step = nthreads / per;
        const E* s = src + static_cast<int64_t>(r0) * src_ld + c4;
        E* p = dst + r0 * ld + c4;
        for (int r = r0; r < rows; r += step, s += static_cast<int64_t>(step) * src_ld, p += step * ld)
            cp_async16(p, s);
        return;
    }
    for (int e = threadIdx.x; e < rows * per; e += nthreads) {
        const int r = e / per, c4 = (e % per) * kPerCopy;
        cp_async16(dst + r * ld + c4, src + static_cast<int64_t>(r) * src_ld + c4);
    }
}

// MT_PROFILE=kda (core::profile_requested): cudaEvents around each kernel of a call, printed to stderr when the call
// ends (the host waits for the device then). Off by default: a tuning aid, not part of the op's contract.
class Profile {
   public:
    explicit Profile(const char* op) : op_(op), on_(core::profile_requested("kda")) {
        if (on_) mark("start");
    }
    void mark(const char* name) {
        if (!on_) return;
        cudaEvent_t e;
        MT_CUDA_CHECK(cudaEventCreate(&e));
        MT_CUDA_CHECK(cudaEventRecord(e, core::exec_stream()));
        events_.push_back(e);
        names_.emplace_back(name);
    }
    ~Profile() {
        if (!on_) return;
        cudaEventSynchronize(events_.back());
        std::string line = std::string("kda-profile ") + op_;
        for (size_t i = 1; i < events_.size(); ++i) {
            float ms = 0.0f;
            cudaEventElapsedTime(&ms, events_[i - 1], events_[i]);
            line += " " + names_[i] + "=" + std::to_string(ms);
        }
        std::fprintf(stderr, "%s\n", line.c_str());
        for (cudaEvent_t e : events_) cudaEventDestroy(e);
    }
    Profile(const Profile&) = delete;
    Profile& operator=(const Profile&) = delete;

   private:
    const char* op_;
    bool on_;
    std::vector<cudaEvent_t> events_;
    std::vector<std::string> names_;
};

// MT_PROFILE=kda_phases (the purpose of MT_PROFILE=kda, inside one kernel): thread 0 of each block stamps clock64() at
// the kernel's phase boundaries into a [blocks, kMaxPhases] buffer, and the host prints the mean cycles of each
// phase over the blocks (one SM's clock per block, so the differences are meaningful). Off by default.
constexpr int kMaxPhases = 16;
struct PhaseClock {
    long long* p;
    __device__ __forceinline__ void mark(int i) const {
        if (p != nullptr && threadIdx.x == 0)
            p[(static_cast<int64_t>(blockIdx.y) * gridDim.x + blockIdx.x) * kMaxPhases + i] = clock64();
    }
};
// A loop's version: thread 0 adds the cycles since its last stamp to phase i's total (registers); flush writes the
// running sums as marks 1..n, so PhaseLog prints each phase's total cycles per block.
struct PhaseSums {
    long long* p;
    long long last = 0, sum[kMaxPhases] = {};
    __device__ __forceinline__ void start() {
        if (p != nullptr && threadIdx.x == 0) last = clock64();
    }
    __device__ __forceinline__ void add(int i) {
        if (p != nullptr && threadIdx.x == 0) {
            const long long now = clock64();
            sum[i] += now - last;
            last = now;
        }
    }
    __device__ __forceinline__ void flush(int n) const {
        if (p == nullptr || threadIdx.x != 0) return;
        long long* q = p + (static_cast<int64_t>(blockIdx.y) * gridDim.x + blockIdx.x) * kMaxPhases;
        long long run = 0;
        q[0] = 0;
        for (int i = 1; i < n; ++i) q[i] = run += sum[i];
    }
};
class PhaseLog {
   public:
    PhaseLog(const char* name, int64_t blocks) : name_(name), blocks_(blocks) {
        if (!core::profile_requested("kda_phases")) return;
        keep_ = Tensor::zeros({blocks * kMaxPhases}, DType::i64, core::Device::cuda);
    }
    PhaseClock clock() const {
        return {keep_.defined() ? static_cast<long long*>(keep_.raw()) : nullptr};
    }
    // Waits for the kernel, then prints the mean cycles between consecutive marks 0..n-1.
    void print(int n) const {
        if (!keep_.defined()) return;
        std::vector<long long> h(static_cast<size_t>(blocks_ * kMaxPhases));
        MT_CUDA_CHECK(cudaStreamSynchronize(core::exec_stream()));
        MT_CUDA_CHECK(cudaMemcpy(h.data(), keep_.raw(), h.size() * sizeof(long long), cudaMemcpyDeviceToHost));
        std::string line = std::string("kda-phases ") + name_;
        for (int i = 1; i < n; ++i) {
            double s = 0.0;
            for (int64_t b = 0; b < blocks_; ++b)
                s += static_cast<double>(h[b * kMaxPhases + i] - h[b * kMaxPhases + i - 1]);
            line += " p" + std::to_string(i) + "=" + std::to_string(static_cast<long long>(s / blocks_));
        }
        std::fprintf(stderr, "%s\n", line.c_str());
    }

   private:
    const char* name_;
    int64_t blocks_;
    Tensor keep_;
};

}  // namespace mt::ops::cuda::kda
