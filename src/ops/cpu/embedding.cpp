// CPU reference of the embedding lookup and its scatter-add backward.
#include "ops/embedding.h"

#include <algorithm>

#include "ops/cpu/checks.h"
#include "ops/cpu/threading.h"
#include "ops/registry.h"

namespace mt::ops {

// Every id must index a row of the table (of the whole vocabulary when sharded); a bad id means bad token data
// (exit 3), not a bug. (The CUDA side checks on the device and reports the same message.)
void check_embedding_ids(const Tensor& ids, int64_t range, std::string_view op) {
    const int32_t* p = ids.data<int32_t>();
    for (int64_t i = 0; i < ids.numel(); ++i) {
        if (p[i] < 0 || p[i] >= range)
            core::fail_hint(core::ExitCode::data,
                            "the token data holds ids outside the vocabulary; check model.vocab_size and the "
                            "tokenizer used to write the data",
                            "{}: ids[{}] = {} is outside the embedding table [0, {})",
                            op,
                            i,
                            p[i],
                            range);
    }
}

}  // namespace mt::ops

namespace mt::ops::cpu {

namespace {
constexpr int64_t kColumnBlock = 64;  // columns of dweight owned by one task in the backward
}

// out[i, :] = weight[ids[i] - first, :], zeros where the id lies outside the table's rows [first, first + vocab).
template <typename T>
void embedding_fwd(const int32_t* ids, const T* weight, T* out, int64_t n, int64_t vocab, int64_t c, int64_t first) {
#pragma omp parallel for schedule(static) if (n * c >= kParallelMinWork)
    for (int64_t i = 0; i < n; ++i) {
        const int64_t row = static_cast<int64_t>(ids[i]) - first;
        if (row < 0 || row >= vocab) {
            std::fill(out + i * c, out + (i + 1) * c, T(0));
            continue;
        }
        const T* src = weight + row * c;  // [c]
        std::copy(src, src + c, out + i * c);
    }
}

// dweight[ids[i] - first, :] += dout[i, :] for the ids in the table's rows [first, first + vocab). Rows repeat, so
// threads split the columns instead: each task owns a column block of every row and adds the positions in order
// i = 0, 1, ..., which keeps the sum deterministic.
template <typename T>
void embedding_bwd(const int32_t* ids, const T* dout, T* dweight, int64_t n, int64_t vocab, int64_t c, int64_t first) {
    const int64_t blocks = (c + kColumnBlock - 1) / kColumnBlock;
#pragma omp parallel for schedule(static) if (n * c >= kParallelMinWork)
    for (int64_t blk = 0; blk < blocks; ++blk) {
        const int64_t c0 = blk * kColumnBlock, c1 = std::min(c, c0 + kColumnBlock);
        for (int64_t i = 0; i < n; ++i) {
            const int64_t row = static_cast<int64_t>(ids[i]) - first;
            if (row < 0 || row >= vocab) continue;
            const T* src = dout + i * c;  // [c]
            T* dst = dweight + row * c;   // [c]
            for (int64_t j = c0; j < c1; ++j) dst[j] += src[j];
        }
    }
}

template void embedding_fwd<float>(const int32_t*, const float*, float*, int64_t, int64_t, int64_t, int64_t);
template void embedding_fwd<double>(const int32_t*, const double*, double*, int64_t, int64_t, int64_t, int64_t);
template void embedding_bwd<float>(const int32_t*, const float*, float*, int64_t, int64_t, int64_t, int64_t);
template void embedding_bwd<double>(const int32_t*, const double*, double*, int64_t, int64_t, int64_t, int64_t);

// The CPU kernel of ops::embedding_fwd (registered in the op registry): the CPU dtypes, then the float dispatch.
void embedding_fwd(const Tensor& ids, const Tensor& weight, const Tensor& out, const VocabShard& shard) {
    constexpr std::string_view op = "embedding_fwd";
    const int64_t n = ids.size(0), vocab = weight.size(0), c = weight.size(1);
    check_float_arg(weight, op, "weight", 2);
    check_float_arg(out, op, "out", 2);
    check_dtype_as(out, weight, op, "out", "weight");
    check_embedding_ids(ids, shard.sharded() ? shard.total : vocab, op);
    MT_DISPATCH_FLOAT(
        weight.dtype(),
        op,
        cpu::embedding_fwd(
            ids.data<int32_t>(), weight.data<scalar_t>(), out.data<scalar_t>(), n, vocab, c, shard.first));
}
MT_REGISTER_KERNEL(embedding_fwd, cpu, embedding_fwd, ::mt::ops::float_dtypes);

// The CPU kernel of ops::embedding_bwd (registered in the op registry): the CPU dtypes, then the float dispatch.
void embedding_bwd(const Tensor& ids, const Tensor& dout, const Tensor& dweight, const VocabShard& shard) {
    constexpr std::string_view op = "embedding_bwd";
    const int64_t n = ids.size(0), vocab = dweight.size(0), c = dweight.size(1);
    check_float_arg(dout, op, "dout", 2);
    check_float_arg(dweight, op, "dweight", 2);
    check_dtype_as(dweight, dout, op, "dweight", "dout");
    check_embedding_ids(ids, shard.sharded() ? shard.total : vocab, op);
    MT_DISPATCH_FLOAT(
        dout.dtype(),
        op,
        cpu::embedding_bwd(
            ids.data<int32_t>(), dout.data<scalar_t>(), dweight.data<scalar_t>(), n, vocab, c, shard.first));
}
MT_REGISTER_KERNEL(embedding_bwd, cpu, embedding_bwd, ::mt::ops::float_dtypes);

}  // namespace mt::ops::cpu
