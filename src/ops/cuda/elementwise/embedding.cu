// CUDA embedding lookup and its deterministic backward.
// Dtypes: ids i32; weight bf16|f16|f32 and out bf16|f16|f32 (any pair; the forward converts); dout bf16|f16|f32 and
// dweight f32|bf16|f16 (f32 is the Megatron-style choice: parameter gradients accumulate in f32). Backward, sort-free
// and deterministic (no float atomics): the grid tiles dweight into blocks of R rows x T columns; each block keeps an
// f32 accumulator for its tile in shared memory and scans all ids in position order, T at a time. The positions whose
// id falls in its rows are compacted in order (warp ballots, warp counts added in warp order), then each thread adds
// the dout values of its column in that order. At the end the tile is added to dweight once. Every dweight element is
// owned by one thread and summed in position order, so the result is the same on every run. The cost is a read of the
// ids per block (they stay in L2). Ids outside [0, V) are found on the device and reported as the CPU path does (exit
// 3); this copies one int back, so both calls synchronise with the host. Rows of valid ids may have been written when
// that error is raised. Sharded (ops/op_common.h VocabShard): the table holds the rows of the ids [first, first + V),
// the ids are checked against [0, total), the forward writes zero rows for the ids outside the shard and the backward
// skips them.
#include "ops/cuda/common.cuh"
#include "ops/embedding.h"
#include "ops/registry.h"

namespace mt::ops::cuda {

namespace {

constexpr int kFwdThreads = 256;
constexpr int kBwdAccFloats = 16384;  // f32 accumulator per block: 64 KB of shared memory

template <int VEC, typename TW, typename TO>
__global__ void embedding_fwd_kernel(const int32_t* __restrict__ ids,
                                     const TW* __restrict__ w,
                                     TO* __restrict__ out,
                                     int64_t n,
                                     int64_t vocab,
                                     int64_t c,
                                     int64_t first,
                                     int64_t id_range,
                                     int* bad) {
    for (int64_t i = blockIdx.x; i < n; i += gridDim.x) {
        const int32_t id = ids[i];
        if (id < 0 || id >= id_range) {
            if (threadIdx.x == 0) note_bad_index(bad, n, i);
            continue;
        }
        const int64_t row = static_cast<int64_t>(id) - first;
        const bool in_shard = row >= 0 && row < vocab;
        const TW* src = w + (in_shard ? row : 0) * c;  // [c]
        TO* dst = out + i * c;                         // [c]
        for (int64_t j = static_cast<int64_t>(threadIdx.x) * VEC; j < c; j += static_cast<int64_t>(blockDim.x) * VEC) {
            float v[VEC] = {};
            if (in_shard) load_vec<VEC>(src + j, v);
            store_vec<VEC>(dst + j, v);
        }
    }
}

// Block (bx, by) owns dweight rows [bx R, bx R + R) and columns [by T, by T + T), T = blockDim.x, R = acc / T; row
// r of dweight is the id first + r.
template <typename TD, typename TW>
__global__ void embedding_bwd_kernel(const int32_t* __restrict__ ids,
                                     const TD* __restrict__ dout,
                                     TW* __restrict__ dweight,
                                     int64_t n,
                                     int64_t vocab,
                                     int64_t c,
                                     int64_t first,
                                     int64_t id_range,
                                     int rows,
                                     int* bad) {
    extern __shared__ float smem[];
    float* acc = smem;                                               // [rows, T]
    int2* list = reinterpret_cast<int2*>(smem + rows * blockDim.x);  // [T]: (position, row - r0) in order
    __shared__ int warp_counts[32];
    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32, warps = blockDim.x / 32;
    const int64_t r0 = static_cast<int64_t>(blockIdx.x) * rows;
    const int64_t col = static_cast<int64_t>(blockIdx.y) * blockDim.x + tid;
    const bool col_ok = col < c;
    const bool reporter = blockIdx.x == 0 && blockIdx.y == 0;
    for (int r = 0; r < rows; ++r) acc[r * blockDim.x + tid] = 0.0f;
    for (int64_t base = 0; base < n; base += blockDim.x) {
        const int64_t i = base + tid;
        const int32_t id = i < n ? ids[i] : -1;
        if (reporter && i < n && (id < 0 || id >= id_range)) note_bad_index(bad, n, i);
        const int64_t row = static_cast<int64_t>(id) - first;
        const bool match = i < n && id >= 0 && row >= r0 && row < r0 + rows && row < vocab;
        const unsigned mask = __ballot_sync(0xffffffffu, match);
        if (lane == 0) warp_counts[warp] = __popc(mask);
        __syncthreads();
        int offset = 0, total = 0;
        for (int w = 0; w < warps; ++w) {
            offset += w < warp ? warp_counts[w] : 0;
            total += warp_counts[w];
        }
        if (match)
            list[offset + __popc(mask & ((1u << lane) - 1u))] =
                make_int2(static_cast<int>(i), static_cast<int>(row - r0));
        __syncthreads();
        if (col_ok) {
            int m = 0;
            for (; m + 4 <= total; m += 4) {  // four independent loads in flight, then the adds in order
                float v[4];
                int row[4];
#pragma unroll
                for (int k = 0; k < 4; ++k) {
                    const int2 e = list[m + k];
                    v[k] = to_f32(dout[static_cast<int64_t>(e.x) * c + col]);
                    row[k] = e.y;
                }
#pragma unroll
                for (int k = 0; k < 4; ++k) acc[row[k] * blockDim.x + tid] += v[k];
            }
            for (; m < total; ++m) {
                const int2 e = list[m];
                acc[e.y * blockDim.x + tid] += to_f32(dout[static_cast<int64_t>(e.x) * c + col]);
            }
        }
        __syncthreads();  // the list is rewritten by the next chunk
    }
    if (!col_ok) return;
    for (int r = 0; r < rows && r0 + r < vocab; ++r) {
        TW* p = dweight + (r0 + r) * c + col;
        *p = from_f32<TW>(to_f32(*p) + acc[r * blockDim.x + tid]);
    }
}

[[noreturn]] void fail_bad_id(const Tensor& ids, int64_t pos, int64_t id_range, std::string_view op) {
    const int64_t value = static_cast<int64_t>(ids.slice(0, pos, pos + 1).item());
    core::fail_hint(core::ExitCode::data,
                    "the token data holds ids outside the vocabulary; check model.vocab_size and the tokenizer used "
                    "to write the data",
                    "{}: ids[{}] = {} is outside the embedding table [0, {})",
                    op,
                    pos,
                    value,
                    id_range);
}

}  // namespace

void embedding_fwd(const Tensor& ids, const Tensor& weight, const Tensor& out, const VocabShard& shard) {
    constexpr std::string_view op = "embedding_fwd";
    check_cuda_float(weight, op, "weight");
    check_cuda_float(out, op, "out");
    const int64_t n = ids.size(0), vocab = weight.size(0), c = weight.size(1);
    const int64_t id_range = shard.sharded() ? shard.total : vocab;
    if (n == 0) return;
    core::NvtxRange range("embedding_fwd");
    const BadIndexFlag bad;
    const bool vec = vec_ok(c, {&weight, &out});
    const int threads = static_cast<int>(std::min<int64_t>(kFwdThreads, ((vec ? c / 8 : c) + 31) / 32 * 32));
    const unsigned blocks = static_cast<unsigned>(std::min<int64_t>(n, 65535 * 16));
    MT_CUDA_DISPATCH(weight.dtype(), TW, MT_CUDA_DISPATCH(out.dtype(), TO, {
                         if (vec)
                             embedding_fwd_kernel<8, TW, TO>
                                 <<<blocks, threads, 0, core::exec_stream()>>>(ids.data<int32_t>(),
                                                                               static_cast<const TW*>(weight.raw()),
                                                                               static_cast<TO*>(out.raw()),
                                                                               n,
                                                                               vocab,
                                                                               c,
                                                                               shard.first,
                                                                               id_range,
                                                                               bad.ptr());
                         else
                             embedding_fwd_kernel<1, TW, TO>
                                 <<<blocks, threads, 0, core::exec_stream()>>>(ids.data<int32_t>(),
                                                                               static_cast<const TW*>(weight.raw()),
                                                                               static_cast<TO*>(out.raw()),
                                                                               n,
                                                                               vocab,
                                                                               c,
                                                                               shard.first,
                                                                               id_range,
                                                                               bad.ptr());
                     }));
    MT_CUDA_CHECK(cudaGetLastError());
    const int64_t pos = bad.first_bad(n);
    if (pos >= 0) fail_bad_id(ids, pos, id_range, op);
}
MT_REGISTER_KERNEL(embedding_fwd, cuda, embedding_fwd, ::mt::ops::half_and_float_dtypes);

void embedding_bwd(const Tensor& ids, const Tensor& dout, const Tensor& dweight, const VocabShard& shard) {
    constexpr std::string_view op = "embedding_bwd";
    check_cuda_float(dout, op, "dout");
    check_cuda_float(dweight, op, "dweight");
    const int64_t n = ids.size(0), vocab = dweight.size(0), c = dweight.size(1);
    const int64_t id_range = shard.sharded() ? shard.total : vocab;
    if (n == 0 || c == 0 || vocab == 0) return;
    core::NvtxRange range("embedding_bwd");
    const BadIndexFlag bad;
    const int threads = static_cast<int>(std::min<int64_t>(256, (c + 31) / 32 * 32));
    const int rows = kBwdAccFloats / threads;
    const dim3 grid(static_cast<unsigned>((vocab + rows - 1) / rows),
                    static_cast<unsigned>((c + threads - 1) / threads));
    const size_t smem = (static_cast<size_t>(rows) * threads + 2 * threads) * sizeof(float);
    MT_CUDA_DISPATCH(
        dout.dtype(), TD, MT_CUDA_DISPATCH(dweight.dtype(), TW, {
            MT_CUDA_CHECK(cudaFuncSetAttribute(
                embedding_bwd_kernel<TD, TW>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
            embedding_bwd_kernel<TD, TW>
                <<<grid, threads, smem, core::exec_stream()>>>(ids.data<int32_t>(),
                                                               static_cast<const TD*>(dout.raw()),
                                                               static_cast<TW*>(dweight.raw()),
                                                               n,
                                                               vocab,
                                                               c,
                                                               shard.first,
                                                               id_range,
                                                               rows,
                                                               bad.ptr());
        }));
    MT_CUDA_CHECK(cudaGetLastError());
    const int64_t pos = bad.first_bad(n);
    if (pos >= 0) fail_bad_id(ids, pos, id_range, op);
}
MT_REGISTER_KERNEL(embedding_bwd, cuda, embedding_bwd, ::mt::ops::half_and_float_dtypes);

}  // namespace mt::ops::cuda
