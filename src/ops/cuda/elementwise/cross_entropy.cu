// CUDA fused softmax + cross-entropy (the classifier's loss), one block per row; V of 32768 and more.
// Dtypes: logits and dlogits bf16|f16|f32, the same dtype (dlogits may alias logits: the in-place backward overwrites
// the logits with their gradient, so no f32 copy of [N, V] ever exists); targets i32; losses, lse, dlosses f32.
// Forward: one pass over the row with an online max / sum of exp per thread (8 elements at a time), combined over
// the block in a fixed order, so loss and lse are the same on every run. Backward: one pass that reads each logit
// and writes its gradient in f32 math.
// Targets outside [0, V) that are not ignore_index are found on the device and reported as the CPU path does
// (exit 3); this copies one int back, so both calls synchronise with the host.
// Sharded (ops/op_common.h VocabShard): the columns are the ids [first, first + V) and targets are checked against
// [0, total); the forward's lse is the shard's own and its loss the target's logit (0 where the target lies outside
// the shard); the backward takes the whole vocabulary's lse and applies the one-hot term only inside the shard.
#include <cfloat>

#include "ops/cross_entropy.h"
#include "ops/cuda/common.cuh"
#include "ops/registry.h"

namespace mt::ops::cuda {

namespace {

constexpr int kMaxThreads = 512;

// The running (max, sum of exp(x - max)) of a set of values merged with another's.
__device__ __forceinline__ void merge(float& m, float& s, float m2, float s2) {
    const float mx = fmaxf(m, m2);
    if (mx == -INFINITY) return;  // both empty
    s = s * expf(m - mx) + s2 * expf(m2 - mx);
    m = mx;
}

template <int VEC, typename T>
__global__ void cross_entropy_fwd_kernel(const T* __restrict__ logits,
                                         const int32_t* __restrict__ targets,
                                         int32_t ignore_index,
                                         float* __restrict__ losses,
                                         float* __restrict__ lse,
                                         int64_t n,
                                         int64_t v,
                                         int64_t first,
                                         int64_t id_range,
                                         bool sharded,
                                         int* bad) {
    __shared__ float shared_m[32], shared_s[32];
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
    for (int64_t row = blockIdx.x; row < n; row += gridDim.x) {
        const T* x = logits + row * v;  // [v]
        float m = -INFINITY, s = 0.0f;
        for (int64_t j = static_cast<int64_t>(threadIdx.x) * VEC; j < v; j += static_cast<int64_t>(blockDim.x) * VEC) {
            float e[VEC];
            load_vec<VEC>(x + j, e);
            float mx = e[0];
#pragma unroll
            for (int k = 1; k < VEC; ++k) mx = fmaxf(mx, e[k]);
            const float m_new = fmaxf(m, mx);
            float sum = 0.0f;
#pragma unroll
            for (int k = 0; k < VEC; ++k) sum += expf(e[k] - m_new);
            s = s * expf(m - m_new) + sum;
            m = m_new;
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            const float m2 = __shfl_xor_sync(0xffffffffu, m, o), s2 = __shfl_xor_sync(0xffffffffu, s, o);
            merge(m, s, m2, s2);
        }
        __syncthreads();  // the shared slots may still be read for the previous row
        if (lane == 0) {
            shared_m[warp] = m;
            shared_s[warp] = s;
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            float bm = shared_m[0], bs = shared_s[0];
            for (int w = 1; w < warps; ++w) merge(bm, bs, shared_m[w], shared_s[w]);
            const float l = bm + logf(bs);
            lse[row] = l;
            const int32_t t = targets[row];
            const int64_t col = static_cast<int64_t>(t) - first;
            if (t == ignore_index) {
                losses[row] = 0.0f;
            } else if (t < 0 || t >= id_range) {
                note_bad_index(bad, n, row);
                losses[row] = 0.0f;
            } else if (col < 0 || col >= v) {
                losses[row] = 0.0f;  // the target is another shard's column
            } else {
                losses[row] = sharded ? to_f32(x[col]) : l - to_f32(x[col]);
            }
        }
    }
}

// dlogits[row, j] = dlosses[row] (exp(logits[row, j] - lse[row]) - [j == target - first]); 0 for ignored rows. Each
// element is read and then written by the same thread, so dlogits may alias logits.
template <int VEC, typename T>
__global__ void cross_entropy_bwd_kernel(const T* logits,
                                         const int32_t* __restrict__ targets,
                                         const float* __restrict__ lse,
                                         int32_t ignore_index,
                                         const float* __restrict__ dlosses,
                                         T* dlogits,
                                         int64_t n,
                                         int64_t v,
                                         int64_t first,
                                         int64_t id_range,
                                         int* bad) {
    for (int64_t row = blockIdx.x; row < n; row += gridDim.x) {
        const T* x = logits + row * v;  // [v]
        T* dx = dlogits + row * v;      // [v]
        const int32_t t = targets[row];
        const bool ignored = t == ignore_index, valid = !ignored && t >= 0 && t < id_range;
        const int64_t col = static_cast<int64_t>(t) - first;  // outside [0, v) where another shard holds the target
        if (!ignored && !valid && threadIdx.x == 0) note_bad_index(bad, n, row);
        const float scale = valid ? dlosses[row] : 0.0f, l = lse[row];
        for (int64_t j = static_cast<int64_t>(threadIdx.x) * VEC; j < v; j += static_cast<int64_t>(blockDim.x) * VEC) {
            float e[VEC];
            load_vec<VEC>(x + j, e);
#pragma unroll
            for (int k = 0; k < VEC; ++k) {
                e[k] = valid ? expf(e[k] - l) * scale : 0.0f;
                if (j + k == col) e[k] -= scale;
            }
            store_vec<VEC>(dx + j, e);
        }
    }
}

int threads_for(int64_t v, bool vec) {
    const int64_t lanes = vec ? v / 8 : v;
    return static_cast<int>(std::min<int64_t>(kMaxThreads, std::max<int64_t>(32, (lanes + 31) / 32 * 32)));
}

[[noreturn]] void fail_bad_target(
    const Tensor& targets, int64_t pos, int64_t id_range, int32_t ignore_index, std::string_view op) {
    const int64_t value = static_cast<int64_t>(targets.slice(0, pos, pos + 1).item());
    core::fail_hint(core::ExitCode::data,
                    "the token data holds ids outside the vocabulary; check model.vocab_size and the tokenizer used "
                    "to write the data",
                    "{}: targets[{}] = {} is outside [0, {}) and is not ignore_index ({})",
                    op,
                    pos,
                    value,
                    id_range,
                    ignore_index);
}

}  // namespace

void cross_entropy_fwd(const Tensor& logits,
                       const Tensor& targets,
                       int32_t ignore_index,
                       const Tensor& losses,
                       const Tensor& lse,
                       const VocabShard& shard) {
    constexpr std::string_view op = "cross_entropy_fwd";
    check_cuda_float(logits, op, "logits");
    check_f32(losses, op, "losses");
    check_f32(lse, op, "lse");
    const int64_t n = logits.size(0), v = logits.size(1);
    const int64_t id_range = shard.sharded() ? shard.total : v;
    if (n == 0) return;
    core::NvtxRange range("cross_entropy_fwd");
    const BadIndexFlag bad;
    const bool vec = vec_ok(v, {&logits});
    const int threads = threads_for(v, vec);
    const unsigned blocks = static_cast<unsigned>(std::min<int64_t>(n, 1 << 20));
    MT_CUDA_DISPATCH(logits.dtype(), T, {
        const T* lp = static_cast<const T*>(logits.raw());
        auto kernel = vec ? cross_entropy_fwd_kernel<8, T> : cross_entropy_fwd_kernel<1, T>;
        kernel<<<blocks, threads, 0, core::exec_stream()>>>(lp,
                                                            targets.data<int32_t>(),
                                                            ignore_index,
                                                            losses.data<float>(),
                                                            lse.data<float>(),
                                                            n,
                                                            v,
                                                            shard.first,
                                                            id_range,
                                                            shard.sharded(),
                                                            bad.ptr());
    });
    MT_CUDA_CHECK(cudaGetLastError());
    const int64_t pos = bad.first_bad(n);
    if (pos >= 0) fail_bad_target(targets, pos, id_range, ignore_index, op);
}
MT_REGISTER_KERNEL(cross_entropy_fwd, cuda, cross_entropy_fwd, ::mt::ops::half_and_float_dtypes);

void cross_entropy_bwd(const Tensor& logits,
                       const Tensor& targets,
                       const Tensor& lse,
                       int32_t ignore_index,
                       const Tensor& dlosses,
                       const Tensor& dlogits,
                       const VocabShard& shard) {
    constexpr std::string_view op = "cross_entropy_bwd";
    check_cuda_float(logits, op, "logits");
    check_f32(lse, op, "lse");
    check_f32(dlosses, op, "dlosses");
    check_dtype_as(dlogits, logits, op, "dlogits", "logits");
    const int64_t n = logits.size(0), v = logits.size(1);
    const int64_t id_range = shard.sharded() ? shard.total : v;
    if (n == 0) return;
    core::NvtxRange range("cross_entropy_bwd");
    const BadIndexFlag bad;
    const bool vec = vec_ok(v, {&logits, &dlogits});
    const int threads = threads_for(v, vec);
    const unsigned blocks = static_cast<unsigned>(std::min<int64_t>(n, 1 << 20));
    MT_CUDA_DISPATCH(logits.dtype(), T, {
        const T* lp = static_cast<const T*>(logits.raw());
        T* dp = static_cast<T*>(dlogits.raw());
        auto kernel = vec ? cross_entropy_bwd_kernel<8, T> : cross_entropy_bwd_kernel<1, T>;
        kernel<<<blocks, threads, 0, core::exec_stream()>>>(lp,
                                                            targets.data<int32_t>(),
                                                            lse.data<float>(),
                                                            ignore_index,
                                                            dlosses.data<float>(),
                                                            dp,
                                                            n,
                                                            v,
                                                            shard.first,
                                                            id_range,
                                                            bad.ptr());
    });
    MT_CUDA_CHECK(cudaGetLastError());
    const int64_t pos = bad.first_bad(n);
    if (pos >= 0) fail_bad_target(targets, pos, id_range, ignore_index, op);
}
MT_REGISTER_KERNEL(cross_entropy_bwd, cuda, cross_entropy_bwd, ::mt::ops::half_and_float_dtypes);

}  // namespace mt::ops::cuda
