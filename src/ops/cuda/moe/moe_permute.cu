// CUDA MoE permutation: the plan computed on the device (a stable counting sort of the (token, slot) pairs by
// expert, with integer work only), the row gather and its backward.
// Plan: slots are cut into chunks of kChunk; (1) one block per chunk counts its slots per expert (shared-memory
// integer atomics), (2) one block turns the [chunks, E] counts into the offsets and each chunk's first row per
// expert (exclusive scans over chunks and experts, in order), (3) one warp per chunk walks its slots 32 at a time in
// (token, slot) order and ranks each among the equal experts of the warp (__match_any_sync), so rows within an
// expert come out in ascending (i, q) order, as on the CPU. Capacity (moe.md §1.3) reuses the dropless plan: the
// position policy keeps the first C rows of an expert, the probs policy ranks every row of an over-full expert by
// (gate desc, slot asc) against the other rows of that expert; the kept slots are then planned again. Everything is
// integer arithmetic or a comparison, so the plan is exact and deterministic.
// Dtypes: x, xp, dxp, dx bf16|f16|f32 (one dtype), gates bf16|f16|f32; sums in f32, in slot order.
#include "core/backend.h"
#include "ops/cuda/moe/moe_common.cuh"
#include "ops/moe_permute.h"
#include "ops/registry.h"

namespace mt::ops::cuda {

namespace {

constexpr int kChunk = 1024;  // slots per chunk of the plan
constexpr int kScanThreads = 1024;

// counts[c, e] = slots of chunk c routed to expert e (and kept, when keep is given).
__global__ void plan_count_kernel(
    const int32_t* __restrict__ idx, const uint8_t* __restrict__ keep, int32_t* counts, int64_t slots, int e) {
    extern __shared__ int32_t local[];  // [E]
    for (int j = threadIdx.x; j < e; j += blockDim.x) local[j] = 0;
    __syncthreads();
    const int64_t s0 = static_cast<int64_t>(blockIdx.x) * kChunk;
    for (int64_t s = s0 + threadIdx.x; s < s0 + kChunk && s < slots; s += blockDim.x) {
        const int32_t j = idx[s];
        if (j >= 0 && j < e && (!keep || keep[s])) atomicAdd(&local[j], 1);
    }
    __syncthreads();
    for (int j = threadIdx.x; j < e; j += blockDim.x) counts[static_cast<int64_t>(blockIdx.x) * e + j] = local[j];
}

// counts[c, e] <- the first row of chunk c's slots of expert e; offsets[0..E] the exclusive scan of the totals.
__global__ void plan_scan_kernel(int32_t* counts, int32_t* offsets, int64_t chunks, int e) {
    extern __shared__ int32_t total[];  // [E]
    for (int j = threadIdx.x; j < e; j += blockDim.x) {
        int32_t run = 0;
        for (int64_t c = 0; c < chunks; ++c) {
            const int32_t v = counts[c * e + j];
            counts[c * e + j] = run;
            run += v;
        }
        total[j] = run;
    }
    __syncthreads();
    if (threadIdx.x == 0) {  // E is small (<= a few thousand): a serial scan is cheaper than a second launch
        int32_t run = 0;
        for (int j = 0; j < e; ++j) {
            const int32_t v = total[j];
            total[j] = run;
            offsets[j] = run;
            run += v;
        }
        offsets[e] = run;
    }
    __syncthreads();
    for (int j = threadIdx.x; j < e; j += blockDim.x)
        for (int64_t c = 0; c < chunks; ++c) counts[c * e + j] += total[j];
}

// One warp per chunk: rows in (i, q) order within each expert. Dropped (or invalid) slots get slot_row -1.
__global__ void plan_assign_kernel(const int32_t* __restrict__ idx,
                                   const uint8_t* __restrict__ keep,
                                   const int32_t* __restrict__ base,
                                   int32_t* __restrict__ slot_row,
                                   int32_t* __restrict__ row_token,
                                   int32_t* __restrict__ row_slot,
                                   int64_t slots,
                                   int k,
                                   int e) {
    extern __shared__ int32_t next[];  // [E] the next free row of each expert
    const int lane = threadIdx.x;
    for (int j = lane; j < e; j += 32) next[j] = base[static_cast<int64_t>(blockIdx.x) * e + j];
    __syncwarp();
    const int64_t s0 = static_cast<int64_t>(blockIdx.x) * kChunk;
    for (int it = 0; it < kChunk / 32; ++it) {
        const int64_t s = s0 + it * 32 + lane;
        int32_t j = -1;
        if (s < slots) {
            j = idx[s];
            if (j < 0 || j >= e || (keep && !keep[s])) j = -1;
        }
        const unsigned same = __match_any_sync(0xffffffffu, j);
        const int rank = __popc(same & ((1u << lane) - 1u));
        int32_t row = -1;
        if (j >= 0) row = next[j] + rank;
        __syncwarp();
        if (j >= 0 && rank == __popc(same) - 1) next[j] = row + 1;  // the last lane of the group advances it
        __syncwarp();
        if (s < slots) {
            slot_row[s] = row;
            if (row >= 0) {
                if (row_token) row_token[row] = static_cast<int32_t>(s / k);
                if (row_slot) row_slot[row] = static_cast<int32_t>(s);
            }
        }
    }
}

// keep[s] for the capacity C: position keeps the first C rows of the expert, probs the C best (gate desc, slot asc).
template <typename G>
__global__ void capacity_keep_kernel(const int32_t* __restrict__ idx,
                                     const G* __restrict__ gates,
                                     const int32_t* __restrict__ offsets,
                                     const int32_t* __restrict__ slot_row,
                                     const int32_t* __restrict__ row_slot,
                                     uint8_t* __restrict__ keep,
                                     int64_t slots,
                                     int64_t capacity,
                                     bool probs,
                                     int e) {
    const int64_t s = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (s >= slots) return;
    const int32_t j = idx[s];
    if (j < 0 || j >= e) {
        keep[s] = 0;
        return;
    }
    const int32_t r0 = offsets[j], r1 = offsets[j + 1];
    if (r1 - r0 <= capacity) {
        keep[s] = 1;
        return;
    }
    if (!probs) {
        keep[s] = slot_row[s] - r0 < capacity;
        return;
    }
    const float g = to_f32(gates[s]);
    int64_t better = 0;
    for (int32_t r = r0; r < r1 && better < capacity; ++r) {
        const int32_t o = row_slot[r];
        const float go = to_f32(gates[o]);
        better += (go > g || (go == g && o < s)) ? 1 : 0;
    }
    keep[s] = better < capacity;
}

// xp[r] = x[row_token[r]], one block per row.
template <int VEC, typename T>
__global__ void gather_rows_kernel(const T* __restrict__ x, const int32_t* __restrict__ row_token, T* xp, int64_t c) {
    const int64_t r = blockIdx.x;
    const T* src = x + static_cast<int64_t>(row_token[r]) * c;
    T* dst = xp + r * c;
    for (int64_t j = threadIdx.x * VEC; j < c; j += static_cast<int64_t>(blockDim.x) * VEC) {
        float v[VEC];
        load_vec<VEC>(src + j, v);
        store_vec<VEC>(dst + j, v);
    }
}

// dx_i = sum_q dxp[slot_row(i, q)] in slot order (f32), one block per token.
template <int VEC, typename T>
__global__ void sum_rows_kernel(
    const int32_t* __restrict__ slot_row, const T* __restrict__ dxp, T* __restrict__ dx, int k, int64_t c) {
    const int64_t i = blockIdx.x;
    for (int64_t j = threadIdx.x * VEC; j < c; j += static_cast<int64_t>(blockDim.x) * VEC) {
        float acc[VEC] = {};
        for (int q = 0; q < k; ++q) {
            const int32_t r = slot_row[i * k + q];
            if (r < 0) continue;
            float v[VEC];
            load_vec<VEC>(dxp + static_cast<int64_t>(r) * c + j, v);
#pragma unroll
            for (int u = 0; u < VEC; ++u) acc[u] += v[u];
        }
        store_vec<VEC>(dx + i * c + j, acc);
    }
}

// Runs passes 1-3 (with keep, or dropless without).
void plan_passes(const int32_t* idx,
                 const uint8_t* keep,
                 int32_t* counts,
                 int32_t* offsets,
                 int32_t* slot_row,
                 int32_t* row_token,
                 int32_t* row_slot,
                 int64_t slots,
                 int k,
                 int e,
                 int64_t chunks) {
    const cudaStream_t st = core::exec_stream();
    const size_t shared = static_cast<size_t>(e) * sizeof(int32_t);
    plan_count_kernel<<<static_cast<unsigned>(chunks), 256, shared, st>>>(idx, keep, counts, slots, e);
    MT_CUDA_CHECK(cudaGetLastError());
    plan_scan_kernel<<<1, kScanThreads, shared, st>>>(counts, offsets, chunks, e);
    MT_CUDA_CHECK(cudaGetLastError());
    plan_assign_kernel<<<static_cast<unsigned>(chunks), 32, shared, st>>>(
        idx, keep, counts, slot_row, row_token, row_slot, slots, k, e);
    MT_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

int64_t moe_permute_plan(const Tensor& indices,
                         const Tensor& gates,
                         int64_t num_experts,
                         int64_t capacity,
                         MoeDropPolicy policy,
                         const Tensor& offsets,
                         const Tensor& slot_row,
                         const Tensor& row_token) {
    constexpr std::string_view op = "moe_permute_plan";
    const int64_t n = indices.size(0), k = indices.size(1), slots = n * k, e = num_experts;
    MT_CHECK(e <= 8192, "{}: num_experts = {} exceeds the CUDA plan's 8192", op, e);
    if (gates.defined()) check_cuda_float(gates, op, "gates");
    core::NvtxRange range("moe_permute_plan");
    const cudaStream_t st = core::exec_stream();
    const int64_t chunks = std::max<int64_t>(1, (slots + kChunk - 1) / kChunk);
    core::Backend& be = core::backend_get(core::Device::cuda);
    const size_t count_bytes = static_cast<size_t>(chunks * e) * sizeof(int32_t);
    auto* counts = static_cast<int32_t*>(be.alloc(count_bytes));
    const int32_t* idx = indices.data<int32_t>();
    int32_t* off = offsets.data<int32_t>();
    int32_t* srow = slot_row.data<int32_t>();
    int32_t* rtok = row_token.data<int32_t>();
    if (capacity == 0) {
        plan_passes(
            idx, nullptr, counts, off, srow, rtok, nullptr, slots, static_cast<int>(k), static_cast<int>(e), chunks);
        be.free(counts, count_bytes);
        return slots;
    }
    // dropless plan first (row_slot: the slot of every dropless row), then the kept slots planned again
    const size_t slot_bytes = static_cast<size_t>(std::max<int64_t>(slots, 1)) * sizeof(int32_t);
    auto* row_slot = static_cast<int32_t*>(be.alloc(slot_bytes));
    auto* keep = static_cast<uint8_t*>(be.alloc(static_cast<size_t>(std::max<int64_t>(slots, 1))));
    plan_passes(
        idx, nullptr, counts, off, srow, nullptr, row_slot, slots, static_cast<int>(k), static_cast<int>(e), chunks);
    const bool probs = policy == MoeDropPolicy::probs;
    const unsigned blocks = static_cast<unsigned>((slots + 255) / 256);
    if (slots > 0) {
        if (probs) {
            MT_CUDA_DISPATCH(gates.dtype(), G, {
                capacity_keep_kernel<G><<<blocks, 256, 0, st>>>(idx,
                                                                static_cast<const G*>(gates.raw()),
                                                                off,
                                                                srow,
                                                                row_slot,
                                                                keep,
                                                                slots,
                                                                capacity,
                                                                true,
                                                                static_cast<int>(e));
            });
        } else {
            capacity_keep_kernel<float><<<blocks, 256, 0, st>>>(
                idx, nullptr, off, srow, row_slot, keep, slots, capacity, false, static_cast<int>(e));
        }
        MT_CUDA_CHECK(cudaGetLastError());
    }
    MT_CUDA_CHECK(cudaMemsetAsync(rtok, 0xff, static_cast<size_t>(slots) * sizeof(int32_t), st));  // -1 past R
    plan_passes(idx, keep, counts, off, srow, rtok, nullptr, slots, static_cast<int>(k), static_cast<int>(e), chunks);
    int32_t rows = 0;
    MT_CUDA_CHECK(cudaMemcpyAsync(&rows, off + e, sizeof(rows), cudaMemcpyDeviceToHost, st));
    MT_CUDA_CHECK(cudaStreamSynchronize(st));
    be.free(keep, static_cast<size_t>(std::max<int64_t>(slots, 1)));
    be.free(row_slot, slot_bytes);
    be.free(counts, count_bytes);
    return rows;
}
MT_REGISTER_KERNEL(moe_permute_plan, cuda, moe_permute_plan, ::mt::ops::any_dtype);  // primary: indices i32

void moe_permute_fwd(const Tensor& x, const Tensor& row_token, const Tensor& xp) {
    constexpr std::string_view op = "moe_permute_fwd";
    check_cuda_float(x, op, "x");
    check_dtype_as(xp, x, op, "xp", "x");
    const int64_t rows = xp.size(0), c = x.size(1);
    if (rows == 0 || c == 0) return;
    core::NvtxRange range("moe_permute_fwd");
    const bool vec = vec_ok(c, {&x, &xp});
    MT_CUDA_DISPATCH(x.dtype(), T, {
        const T* src = static_cast<const T*>(x.raw());
        T* dst = static_cast<T*>(xp.raw());
        if (vec)
            gather_rows_kernel<8, T><<<static_cast<unsigned>(rows), moe_row_threads(c, 8), 0, core::exec_stream()>>>(
                src, row_token.data<int32_t>(), dst, c);
        else
            gather_rows_kernel<1, T><<<static_cast<unsigned>(rows), moe_row_threads(c, 1), 0, core::exec_stream()>>>(
                src, row_token.data<int32_t>(), dst, c);
    });
    MT_CUDA_CHECK(cudaGetLastError());
}
MT_REGISTER_KERNEL(moe_permute_fwd, cuda, moe_permute_fwd, ::mt::ops::half_and_float_dtypes);

void moe_permute_bwd(const Tensor& slot_row, const Tensor& dxp, const Tensor& dx) {
    constexpr std::string_view op = "moe_permute_bwd";
    check_cuda_float(dxp, op, "dxp");
    check_dtype_as(dx, dxp, op, "dx", "dxp");
    const int64_t n = slot_row.size(0), k = slot_row.size(1), c = dx.size(1);
    if (n == 0 || c == 0) return;
    core::NvtxRange range("moe_permute_bwd");
    const bool vec = vec_ok(c, {&dxp, &dx});
    MT_CUDA_DISPATCH(dx.dtype(), T, {
        const T* src = static_cast<const T*>(dxp.raw());
        T* dst = static_cast<T*>(dx.raw());
        if (vec)
            sum_rows_kernel<8, T><<<static_cast<unsigned>(n), moe_row_threads(c, 8), 0, core::exec_stream()>>>(
                slot_row.data<int32_t>(), src, dst, static_cast<int>(k), c);
        else
            sum_rows_kernel<1, T><<<static_cast<unsigned>(n), moe_row_threads(c, 1), 0, core::exec_stream()>>>(
                slot_row.data<int32_t>(), src, dst, static_cast<int>(k), c);
    });
    MT_CUDA_CHECK(cudaGetLastError());
}
MT_REGISTER_KERNEL(moe_permute_bwd, cuda, moe_permute_bwd, ::mt::ops::half_and_float_dtypes);

}  // namespace mt::ops::cuda
