// CUDA AdamW over a list of pieces (ops::adamw_step_list): the optimizer's few hundred parameter tensors in a few
// launches instead of one each. A launch takes up to kListMax pieces in its kernel parameters (4 KB of parameter
// space: pointers, sizes, rounding streams, the weight decay), a block one chunk of kChunk elements of one piece; a
// block finds its piece from the pieces' first blocks. The element update is adamw_update.cuh's, the per-tensor
// kernel's. With squared sums each block writes its partials, and one more small kernel sums each piece's chunks in
// chunk order into its update_sq / param_sq slot: deterministic, no atomics, no host sync.

#include <algorithm>

#include "ops/adamw.h"
#include "ops/cuda/common.cuh"
#include "ops/cuda/elementwise/adamw_update.cuh"
#include "ops/registry.h"

namespace mt::ops::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kListMax = 32;
constexpr int64_t kChunk = 65536;  // elements a block: 32 vectors of 8 a thread

template <typename TG, typename TS, typename TC>
struct ListArgs {
    float* param[kListMax];
    const TG* grad[kListMax];
    TS* m[kListMax];
    TS* v[kListMax];
    TC* copy[kListMax];  // null: no model copy
    int64_t n[kListMax];
    int64_t first[kListMax];
    uint64_t stream_m[kListMax], stream_v[kListMax];
    float decay[kListMax];
    int block_begin[kListMax + 1];  // piece i's blocks are [block_begin[i], block_begin[i + 1])
    uint32_t vec8;                  // bit i: piece i allows 8-wide access
    int count;
};

struct SumArgs {
    double* update_sq[kListMax];  // null: not asked
    double* param_sq[kListMax];
    int block_begin[kListMax + 1];
    int count;
};

template <typename TG, typename TS, typename TC>
__global__ void __launch_bounds__(kThreads)
    adamw_list_kernel(const __grid_constant__ ListArgs<TG, TS, TC> a, AdamWScalars s, double* __restrict__ partial) {
    int i = 0;
    while (i + 1 < a.count && static_cast<int>(blockIdx.x) >= a.block_begin[i + 1]) ++i;
    const int64_t begin = (static_cast<int64_t>(blockIdx.x) - a.block_begin[i]) * kChunk;
    const int64_t end = begin + kChunk < a.n[i] ? begin + kChunk : a.n[i];
    s.decay = a.decay[i];
    s.stream_m = a.stream_m[i], s.stream_v = a.stream_v[i], s.first = a.first[i];
    const bool sums = partial != nullptr;
    double sq = 0.0, psq = 0.0;
    if ((a.vec8 >> i) & 1u) {
        for (int64_t k = begin + threadIdx.x * 8; k < end; k += kThreads * 8)
            adamw_update<8>(a.param[i], a.grad[i], a.m[i], a.v[i], a.copy[i], k, s, sums, sq, psq);
    } else {
        for (int64_t k = begin + threadIdx.x; k < end; k += kThreads)
            adamw_update<1>(a.param[i], a.grad[i], a.m[i], a.v[i], a.copy[i], k, s, sums, sq, psq);
    }
    if (!sums) return;
    __shared__ double scratch[32];
    sq = block_sum(sq, scratch);
    psq = block_sum(psq, scratch);
    if (threadIdx.x == 0) partial[2 * blockIdx.x] = sq, partial[2 * blockIdx.x + 1] = psq;
}

// Thread i: piece i's partials in block order, added to its slots.
__global__ void list_sums_kernel(const __grid_constant__ SumArgs a, const double* __restrict__ partial) {
    const int i = static_cast<int>(threadIdx.x);
    if (i >= a.count) return;
    double change = 0.0, value = 0.0;
    for (int b = a.block_begin[i]; b < a.block_begin[i + 1]; ++b) change += partial[2 * b], value += partial[2 * b + 1];
    if (a.update_sq[i] != nullptr) *a.update_sq[i] += change;
    if (a.param_sq[i] != nullptr) *a.param_sq[i] += value;
}

// The pieces of `list` (non-empty, at most kListMax) in one launch, and the sums' launch where a piece asks for them.
template <typename TG, typename TS, typename TC>
void launch(const std::vector<const AdamWPiece*>& list, const AdamWScalars& base, int64_t step, float decay_off) {
    ListArgs<TG, TS, TC> a{};
    SumArgs sums{};
    bool any_sum = false;
    a.count = sums.count = static_cast<int>(list.size());
    for (int i = 0; i < a.count; ++i) {
        const AdamWPiece& p = *list[static_cast<size_t>(i)];
        const int64_t n = p.param.numel();
        a.param[i] = p.param.data<float>();
        a.grad[i] = static_cast<const TG*>(p.grad.raw());
        a.m[i] = static_cast<TS*>(p.m.raw());
        a.v[i] = static_cast<TS*>(p.v.raw());
        a.copy[i] = p.param_copy.defined() ? static_cast<TC*>(p.param_copy.raw()) : nullptr;
        a.n[i] = n;
        a.first[i] = p.rounding.first;
        a.stream_m[i] = core::sr_stream(p.rounding.seed, step, 0);
        a.stream_v[i] = core::sr_stream(p.rounding.seed, step, 1);
        a.decay[i] = p.decay ? base.decay : decay_off;
        // 8-wide access where every pointer allows it and the piece is whole vectors (as the per-tensor kernel).
        a.vec8 |= vec_ok(n, {&p.param, &p.grad, &p.m, &p.v, &p.param_copy}) ? (1u << i) : 0u;
        sums.update_sq[i] = p.update_sq.defined() ? p.update_sq.data<double>() : nullptr;
        sums.param_sq[i] = p.param_sq.defined() ? p.param_sq.data<double>() : nullptr;
        any_sum = any_sum || p.update_sq.defined() || p.param_sq.defined();
        const int64_t blocks = (n + kChunk - 1) / kChunk;
        MT_CHECK(a.block_begin[i] + blocks < (int64_t{1} << 31), "adamw_step_list: a launch of 2^31 blocks");
        a.block_begin[i + 1] = sums.block_begin[i + 1] = a.block_begin[i] + static_cast<int>(blocks);
    }
    const int grid = a.block_begin[a.count];
    const Tensor partial = any_sum ? Tensor::scratch({2 * int64_t{grid}}, DType::f64, core::Device::cuda) : Tensor();
    double* part = any_sum ? static_cast<double*>(partial.raw()) : nullptr;
    adamw_list_kernel<TG, TS, TC><<<grid, kThreads, 0, core::exec_stream()>>>(a, base, part);
    MT_CUDA_CHECK(cudaGetLastError());
    if (!any_sum) return;
    list_sums_kernel<<<1, kListMax, 0, core::exec_stream()>>>(sums, part);
    MT_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

void adamw_step_list(const std::vector<AdamWPiece>& pieces, const AdamWHyper& hyper, int64_t step, double grad_scale) {
    constexpr std::string_view op = "adamw_step_list";
    if (pieces.empty()) return;
    // The entry checked that every piece has piece 0's dtypes.
    const AdamWPiece& first = pieces.front();
    check_f32(first.param, op, "param");
    check_cuda_float(first.grad, op, "grad");
    if (first.m.dtype() != DType::bf16) check_f32(first.m, op, "m");
    if (first.param_copy.defined()) check_cuda_float(first.param_copy, op, "param_copy");
    core::NvtxRange range("adamw_step_list");
    AdamWHyper plain = hyper;
    plain.weight_decay = 0.0;
    const AdamWStepScalars h = adamw_step_scalars(hyper, step, grad_scale);
    const auto decay_off = static_cast<float>(adamw_step_scalars(plain, step, grad_scale).decay);
    // The rounding streams and the index of element 0 are set per piece in the launch.
    const AdamWScalars base = device_scalars(h, 0, 0, 0);
    std::vector<const AdamWPiece*> list;
    auto flush = [&] {
        if (list.empty()) return;
        MT_CUDA_DISPATCH(first.grad.dtype(), TG, {
            if (first.m.dtype() == DType::bf16) {
                if (!first.param_copy.defined())
                    launch<TG, bf16, float>(list, base, step, decay_off);
                else
                    MT_CUDA_DISPATCH(first.param_copy.dtype(), TC, launch<TG, bf16, TC>(list, base, step, decay_off));
            } else {
                if (!first.param_copy.defined())
                    launch<TG, float, float>(list, base, step, decay_off);
                else
                    MT_CUDA_DISPATCH(first.param_copy.dtype(), TC, launch<TG, float, TC>(list, base, step, decay_off));
            }
        });
        list.clear();
    };
    for (const AdamWPiece& p : pieces) {
        if (p.param.numel() == 0) continue;
        list.push_back(&p);
        if (static_cast<int>(list.size()) == kListMax) flush();
    }
    flush();
}
MT_REGISTER_KERNEL(adamw_step_list, cuda, adamw_step_list, ::mt::ops::any_dtype);

}  // namespace mt::ops::cuda
