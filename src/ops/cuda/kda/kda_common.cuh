// Shared pieces of the CUDA KDA op (kda.md §4): the problem sizes, the fp32 workspace of per-chunk quantities and
// the index helpers of the forward (kda.cu) and backward (kda_bwd.cu) kernels. Every chunk quantity lives in the
// workspace at [unit, chunk, row, col] with unit = b * HV + hv; rows past T inside the last chunk hold zeros (q, k,
// v, g, beta and dO read as zero there), which leaves every real row exactly as with a short chunk.
#pragma once

#include <string>
#include <type_traits>
#include <vector>

#include "ops/cuda/common.cuh"
#include "ops/kda.h"

namespace mt::ops::cuda::kda {

constexpr int kMaxChunk = 64;  // C is 64 or 32
constexpr int kMaxK = 256;     // key head dim limit of the op
constexpr int kBV = 16;        // value columns per block of the scans
constexpr int kThreads = 256;

struct Dims {
    int b, t, h, hv, k, v, c, nc, group;
    __host__ __device__ int units() const {
        return b * hv;
    }
};

// The model's head shape (chunk 64, K = V = 128) as compile-time constants. The fast kernels take a bool kModel and
// read their Dims through model_dims, which with kModel = true replaces c, k and v by these constants, so that every
// stride, tile offset and copy loop that depends on them is built from immediates (with them read at run time the
// forward scan issued ~45% integer instructions, and each 16-byte copy ~12 instructions). with_model_shape picks
// the instance for a call.
inline constexpr int kModelC = 64, kModelK = 128, kModelV = 128;
__host__ __device__ inline bool is_model_shape(const Dims& d) {
    return d.c == kModelC && d.k == kModelK && d.v == kModelV;
}
template <bool kModel>
__device__ __forceinline__ Dims model_dims(Dims d) {
    if constexpr (kModel) {
        d.c = kModelC;
        d.k = kModelK;
        d.v = kModelV;
    }
    return d;
}
// fn(std::true_type{}) when d has the model's shape, else fn(std::false_type{}).
template <typename Fn>
void with_model_shape(const Dims& d, Fn&& fn) {
    if (is_model_shape(d))
        fn(std::true_type{});
    else
        fn(std::false_type{});
}

// Per-chunk fp32 quantities (kda.md §4.1), each [units, nc, C, cols]. gam is Gamma (natural log, in-chunk cumsum);
// qg = q e^Gamma; kg = k e^(Gamma_last - Gamma); xw = beta k e^Gamma; w = T xw; u = T beta v; a = A, m = M
// (L = Diag(beta) M), tm = T = (I + L)^-1, all with zeros above the diagonal.
// reset is not a workspace buffer: the caller's ops::KdaOptions::chunk_reset flags [B, nc] (null: none), which the
// scans read at each chunk (chunk_resets).
struct Work {
    float *gam, *qg, *kg, *xw, *w, *u, *a, *m, *tm;
    const int32_t* reset;
};

// The state entering each chunk and Vn ([units, nc, K, V] and [units, nc, C, V]) as a forward scan writes them and
// the backward's products over V read them: fp32 (the backward's own scan, KdaOptions::save_states) or bf16
// (save_states_bf16). At most one of the two pairs is set; none: not written.
template <typename F, typename H>
struct ChunkStates {
    F* hs = nullptr;
    F* vn = nullptr;
    H* hs16 = nullptr;
    H* vn16 = nullptr;
};
using StatesOut = ChunkStates<float, bf16>;
using StatesIn = ChunkStates<const float, const bf16>;

// Two consecutive elements from two f32 (one store; p aligned to the pair).
template <typename T>
__device__ __forceinline__ void store_pair(T* p, float a, float b) {
    *reinterpret_cast<typename Pair<T>::type*>(p) = Pair<T>::from(a, b);
}
__device__ __forceinline__ void store_pair(float* p, float a, float b) {
    *reinterpret_cast<float2*>(p) = make_float2(a, b);
}

// Offsets of (unit, chunk) blocks.
__host__ __device__ inline int64_t chunk_index(const Dims& d, int unit, int n) {
    return static_cast<int64_t>(unit) * d.nc + n;
}
__device__ inline int64_t ck_off(const Dims& d, int64_t cb) {
    return cb * d.c * d.k;
}
__device__ inline int64_t cv_off(const Dims& d, int64_t cb) {
    return cb * d.c * d.v;
}
__device__ inline int64_t cc_off(const Dims& d, int64_t cb) {
    return cb * d.c * d.c;
}
// Whether the state entering chunk n of unit's row is zero (ops::KdaOptions::chunk_reset): the forward scans start
// the chunk from zero instead of the carried state (or s0 at n = 0), and the reverse scans drop the gradient of the
// state entering it, so none reaches chunk n - 1 (or ds0). The flag is one per (row, chunk), the same for every
// thread of a scan block, so a branch on it never splits a block at a barrier.
__device__ inline bool chunk_resets(const Dims& d, const Work& w, int unit, int n) {
    return w.reset != nullptr && w.reset[static_cast<int64_t>(unit / d.hv) * d.nc + n] != 0;
}

// Token rows of the inputs: q/k row of (b, t, h), v/g/beta rows of (b, t, hv).
__device__ inline int64_t qk_row(const Dims& d, int b, int t, int h) {
    return ((static_cast<int64_t>(b) * d.t + t) * d.h + h) * d.k;
}
__device__ inline int64_t v_row(const Dims& d, int b, int t, int hv) {
    return ((static_cast<int64_t>(b) * d.t + t) * d.hv + hv) * d.v;
}
__device__ inline int64_t g_row(const Dims& d, int b, int t, int hv) {
    return ((static_cast<int64_t>(b) * d.t + t) * d.hv + hv) * d.k;
}
__device__ inline int64_t beta_at(const Dims& d, int b, int t, int hv) {
    return (static_cast<int64_t>(b) * d.t + t) * d.hv + hv;
}

// p[i] as f32, or 0 when !valid (rows past T read as zero).
template <typename T>
__device__ __forceinline__ float ld(const T* p, int64_t i, bool valid) {
    return valid ? to_f32(p[i]) : 0.0f;
}

// Cooperative copy of n floats from global to shared memory (coalesced); the caller synchronises.
__device__ __forceinline__ void stage(float* dst, const float* src, int n) {
    for (int i = threadIdx.x; i < n; i += blockDim.x) dst[i] = src[i];
}

// Shared memory of the scans: fwd s [K, kBV], svn [C, kBV], one chunk tile [C, K], A [C, C], gamma [K]; bwd ds, dO,
// dVn (each as s / svn), two chunk tiles, A, gamma.
inline size_t scan_smem_bytes(const Dims& d) {
    return static_cast<size_t>(d.k * kBV + kMaxChunk * kBV + kMaxChunk * d.k + kMaxChunk * kMaxChunk + d.k) *
           sizeof(float);
}
inline size_t rscan_smem_bytes(const Dims& d) {
    return static_cast<size_t>(d.k * kBV + 2 * kMaxChunk * kBV + 2 * kMaxChunk * d.k + kMaxChunk * kMaxChunk + d.k) *
           sizeof(float);
}

// Allocates the workspace (fp32 device tensors kept alive by `keep`). Pointers already set in `given` (buffers of
// an ops::KdaSaved) are used as they are; of the rest, scan_only leaves xw, m, tm null (prep_tc's forward does not
// write them) and with_u = false leaves u null.
Work work_alloc(
    const Dims& d, std::vector<Tensor>& keep, bool scan_only = false, const Work& given = {}, bool with_u = true);
// Fills the workspace for every (unit, chunk) in exact fp32 for the fp32 scans (the tensor-core path has prep_tc):
// one block per pair.
void prep_launch(const Tensor& q,
                 const Tensor& k,
                 const Tensor& v,
                 const Tensor& g,
                 const Tensor& beta,
                 const Dims& d,
                 const Work& w);
// The sequential scan over chunks, blocks over (value-column tile, unit): Vn = U - W S, O = Qg S + A Vn (written to
// out when defined), S <- Diag(gamma) S + Kg^T Vn. hs [units, nc, K, V] (state entering each chunk) and vn
// [units, nc, C, V] are stored when non-null; st gets the final state when defined.
void scan_launch(
    const Tensor& s0, const Tensor& out, const Tensor& st, const Dims& d, const Work& w, float* hs, float* vn);

// The kernels of one call, chosen once in host code (make_plan, kda.cu) from the shapes, the dtype and the caller's
// ops::KdaKernels:
//   tc:         the tensor-core prep, scans and backward intra-chunk/dT products (3xTF32): bf16/f16 inputs,
//               K % 16 == 0, K <= 128, V % 16 == 0, and KdaKernels::tensor_cores. Otherwise the fp32 kernels (the
//               only path of f32 inputs, within 1e-5 of the CPU reference).
//   chunk_tc:   the backward chunk step's products over V on tensor cores (kda_chunk_tc.cu): tc and V % 32 == 0.
//   chunk_smem: the rest of that step in shared memory (kda_chunk_smem.cu): chunk_tc, K = V = 128 and
//               KdaKernels::chunk_smem.
//   scan_bv, rscan_bv: the value tiles of the tensor-core scans (tc only; pick_bv).
struct Plan {
    bool tc = false, chunk_tc = false, chunk_smem = false;
    int scan_bv = 0, rscan_bv = 0;
};
Plan make_plan(const Dims& d, DType dt, const ops::KdaKernels& kernels);
// The plan in words (KdaOptions::chosen), e.g. "cuda-tc scan_bv=64 rscan_bv=128 chunk=smem".
std::string plan_name(const Plan& plan, bool backward);
// Whether the tensor-core kernels take these shapes and dtype (the first part of Plan::tc).
bool tc_shapes(const Dims& d, DType dt);
// The tensor-core scans (kda_scan_tc.cu), plan.tc: same contract as scan_launch, with the value tile bv.
void scan_tc_launch(DType dt,
                    const Tensor& s0,
                    const Tensor& out,
                    const Tensor& st,
                    const Dims& d,
                    const Work& w,
                    const StatesOut& states,
                    int bv);
// The forward and reverse scans' value tile for d: `forced` (KdaKernels::scan_bv, rscan_bv) where it divides V and
// fits, else the one pick_bv models fastest.
int scan_tile(const Dims& d, int forced);
int rscan_tile(const Dims& d, int forced);
// The tensor-core prep (kda_prep_tc.cu), plan.tc. Fills the same workspace as
// prep_launch. Modes: fwd writes what the scan reads (qg, kg, w, u, a and Gamma's last row), and m and tm when
// they are non-null (kept for the backward); fwd_all also Gamma's every row (all of it kept); bwd everything;
// bwd_tiles reads tm (and leaves a, m alone) instead of forming A, M and T, and writes the rest (u only when
// non-null). xw is written whenever it is non-null.
enum class PrepMode { fwd, fwd_all, bwd, bwd_tiles };
void prep_tc_launch(const Tensor& q,
                    const Tensor& k,
                    const Tensor& v,
                    const Tensor& g,
                    const Tensor& beta,
                    const Dims& d,
                    const Work& w,
                    PrepMode mode);
// The reverse scan on tensor cores (plan.tc; kda_bwd.cu's rscan otherwise), value tile bv: stores dS leaving each
// chunk into dhs and dVn into dvn; ds0 gets dS_0.
void rscan_tc_launch(const Tensor& dout,
                     const Tensor& dst,
                     const Tensor& ds0,
                     const Dims& d,
                     const Work& w,
                     float* dhs,
                     float* dvn,
                     int bv);
// The shapes the backward chunk step's V products on tensor cores take (kda_chunk_tc.cu): V % 32 == 0.
bool chunk_tc_shapes(const Dims& d);
// dqg = dO h^T, dkg = Vn dS^T, dw = -dVn h^T into the chunk scratch ([chunks, C, K]), da = tril(dO Vn^T)
// [chunks, C, C], dgl = gamma * rowsum(h * dS) [chunks, K]; h and Vn fp32 or bf16 (states).
void chunk_mm_tc_launch(const Tensor& dout,
                        const Dims& d,
                        const Work& w,
                        const StatesIn& states,
                        const float* dvn,
                        const float* dhs,
                        float* dqg,
                        float* dkg,
                        float* dw,
                        float* da,
                        float* dgl);

// The rest of the backward chunk step with every operand in shared memory (kda_chunk_smem.cu), plan.chunk_smem;
// chunk_smem_shapes: K = V = 128. Reads what
// chunk_mm_tc_launch wrote; writes dq, dk (dqh, dkh when HV > H), dv, dg, dbeta of every chunk except those it marks
// in fallback[units * nc] (Gamma beyond the anchors' bound), which chunk_kernel then does.
bool chunk_smem_shapes(const Dims& d);
void chunk_smem_launch(const Tensor& q,
                       const Tensor& k,
                       const Tensor& v,
                       const Tensor& beta,
                       const Dims& d,
                       const Work& w,
                       const float* dvn,
                       const float* dqg,
                       const float* dkg,
                       const float* dw,
                       const float* dgl,
                       float* dqh,
                       float* dkh,
                       const Tensor& dq,
                       const Tensor& dk,
                       const Tensor& dv,
                       const Tensor& dg,
                       const Tensor& dbeta,
                       int* fallback);
// An attribute of the current device.
int device_attr(cudaDeviceAttr attr);

}  // namespace mt::ops::cuda::kda

namespace mt::ops::cuda {

// Problem sizes of a call (shapes already checked by the entry point).
kda::Dims kda_dims(const Tensor& q, const Tensor& v, int64_t chunk);
// The CUDA dtype rules: q, k, v, g, beta and the tensors of like_q share one dtype (bf16, f16 or f32); the states
// are f32; chunk 64 or 32.
void kda_check_dtypes(const Tensor& q,
                      const Tensor& k,
                      const Tensor& v,
                      const Tensor& g,
                      const Tensor& beta,
                      std::initializer_list<NamedArg> like_q,
                      std::initializer_list<NamedArg> states,
                      int64_t chunk,
                      std::string_view op);

}  // namespace mt::ops::cuda
