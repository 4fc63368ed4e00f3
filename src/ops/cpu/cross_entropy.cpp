// CPU reference of the fused softmax + cross-entropy, one row per task; the backward may run in place.
#include "ops/cross_entropy.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "ops/cpu/checks.h"
#include "ops/cpu/threading.h"
#include "ops/cpu/vec_math.h"
#include "ops/registry.h"

namespace mt::ops {

// Every target must be a class index (of the whole vocabulary when sharded) or ignore_index; anything else means bad
// label data (exit 3), not a bug. (The CUDA side checks on the device and reports the same message.)
void check_cross_entropy_targets(const Tensor& targets, int64_t vocab, int32_t ignore_index, std::string_view op) {
    const int32_t* p = targets.data<int32_t>();
    for (int64_t i = 0; i < targets.numel(); ++i) {
        if (p[i] != ignore_index && (p[i] < 0 || p[i] >= vocab))
            core::fail_hint(core::ExitCode::data,
                            "the token data holds ids outside the vocabulary; check model.vocab_size and the "
                            "tokenizer used to write the data",
                            "{}: targets[{}] = {} is outside [0, {}) and is not ignore_index ({})",
                            op,
                            i,
                            p[i],
                            vocab,
                            ignore_index);
    }
}

}  // namespace mt::ops

namespace mt::ops::cpu {

// lse[i] = max + log(sum_j exp(logits[i, j] - max));  losses[i] = lse[i] - logits[i, target] (0 if ignored).
// Sharded (the columns are the ids [first, first + v)): losses[i] = logits[i, target - first] where the target lies
// in the shard, else 0.
template <typename T>
void cross_entropy_fwd(const T* logits,
                       const int32_t* targets,
                       int32_t ignore_index,
                       T* losses,
                       T* lse,
                       int64_t n,
                       int64_t v,
                       int64_t first,
                       bool sharded) {
#pragma omp parallel if (n * v >= kParallelMinWork)
    {
        std::vector<T> e(static_cast<size_t>(v));  // [v]: exp(row - max)
#pragma omp for schedule(static)
        for (int64_t i = 0; i < n; ++i) {
            const T* row = logits + i * v;  // [v]
            const T mx = max_value(row, v);
            exp_affine(row, e.data(), v, T(1), -mx);
            T sum = 0;
#pragma omp simd reduction(+ : sum)
            for (int64_t j = 0; j < v; ++j) sum += e[j];
            lse[i] = mx + std::log(sum);
            const int64_t t = static_cast<int64_t>(targets[i]) - first;
            if (targets[i] == ignore_index || t < 0 || t >= v)
                losses[i] = T(0);
            else
                losses[i] = sharded ? row[t] : lse[i] - row[t];
        }
    }
}

// dlogits[i, :] = dlosses[i] * (exp(logits[i, :] - lse[i]) - onehot(target - first)), 0 for ignored rows; the
// one-hot term only where the target lies in the columns [first, first + v). Each element is read before it is
// written and the one-hot term is applied after the row, so dlogits may alias logits.
template <typename T>
void cross_entropy_bwd(const T* logits,
                       const int32_t* targets,
                       const T* lse,
                       int32_t ignore_index,
                       const T* dlosses,
                       T* dlogits,
                       int64_t n,
                       int64_t v,
                       int64_t first) {
#pragma omp parallel for schedule(static) if (n * v >= kParallelMinWork)
    for (int64_t i = 0; i < n; ++i) {
        const T* row = logits + i * v;  // [v]
        T* drow = dlogits + i * v;      // [v]
        if (targets[i] == ignore_index) {
            std::fill(drow, drow + v, T(0));
            continue;
        }
        const T scale = dlosses[i];
        exp_affine(row, drow, v, T(1), -lse[i]);
        for (int64_t j = 0; j < v; ++j) drow[j] *= scale;
        const int64_t t = static_cast<int64_t>(targets[i]) - first;
        if (t >= 0 && t < v) drow[t] -= scale;
    }
}

template void cross_entropy_fwd<float>(
    const float*, const int32_t*, int32_t, float*, float*, int64_t, int64_t, int64_t, bool);
template void cross_entropy_fwd<double>(
    const double*, const int32_t*, int32_t, double*, double*, int64_t, int64_t, int64_t, bool);
template void cross_entropy_bwd<float>(
    const float*, const int32_t*, const float*, int32_t, const float*, float*, int64_t, int64_t, int64_t);
template void cross_entropy_bwd<double>(
    const double*, const int32_t*, const double*, int32_t, const double*, double*, int64_t, int64_t, int64_t);

// The CPU kernel of ops::cross_entropy_fwd (registered in the op registry): the CPU dtypes, then the float dispatch.
void cross_entropy_fwd(const Tensor& logits,
                       const Tensor& targets,
                       int32_t ignore_index,
                       const Tensor& losses,
                       const Tensor& lse,
                       const VocabShard& shard) {
    constexpr std::string_view op = "cross_entropy_fwd";
    const int64_t n = logits.size(0), v = logits.size(1);
    check_float_arg(logits, op, "logits", 2);
    check_float_arg(losses, op, "losses", 1);
    check_float_arg(lse, op, "lse", 1);
    check_dtype_as(losses, logits, op, "losses", "logits");
    check_dtype_as(lse, logits, op, "lse", "logits");
    check_cross_entropy_targets(targets, shard.sharded() ? shard.total : v, ignore_index, op);
    MT_DISPATCH_FLOAT(logits.dtype(),
                      op,
                      cpu::cross_entropy_fwd(logits.data<scalar_t>(),
                                             targets.data<int32_t>(),
                                             ignore_index,
                                             losses.data<scalar_t>(),
                                             lse.data<scalar_t>(),
                                             n,
                                             v,
                                             shard.first,
                                             shard.sharded()));
}
MT_REGISTER_KERNEL(cross_entropy_fwd, cpu, cross_entropy_fwd, ::mt::ops::float_dtypes);

// The CPU kernel of ops::cross_entropy_bwd (registered in the op registry): the CPU dtypes, then the float dispatch.
void cross_entropy_bwd(const Tensor& logits,
                       const Tensor& targets,
                       const Tensor& lse,
                       int32_t ignore_index,
                       const Tensor& dlosses,
                       const Tensor& dlogits,
                       const VocabShard& shard) {
    constexpr std::string_view op = "cross_entropy_bwd";
    const int64_t n = logits.size(0), v = logits.size(1);
    check_float_arg(logits, op, "logits", 2);
    check_float_arg(lse, op, "lse", 1);
    check_float_arg(dlosses, op, "dlosses", 1);
    check_float_arg(dlogits, op, "dlogits", 2);
    check_dtype_as(lse, logits, op, "lse", "logits");
    check_dtype_as(dlosses, logits, op, "dlosses", "logits");
    check_dtype_as(dlogits, logits, op, "dlogits", "logits");
    check_cross_entropy_targets(targets, shard.sharded() ? shard.total : v, ignore_index, op);
    MT_DISPATCH_FLOAT(logits.dtype(),
                      op,
                      cpu::cross_entropy_bwd(logits.data<scalar_t>(),
                                             targets.data<int32_t>(),
                                             lse.data<scalar_t>(),
                                             ignore_index,
                                             dlosses.data<scalar_t>(),
                                             dlogits.data<scalar_t>(),
                                             n,
                                             v,
                                             shard.first));
}
MT_REGISTER_KERNEL(cross_entropy_bwd, cpu, cross_entropy_bwd, ::mt::ops::float_dtypes);

}  // namespace mt::ops::cpu
