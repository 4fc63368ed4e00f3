// Argument checks used by the op entry points beyond those of ops/op_common.h: index tensors (exit 1, as every
// argument error).
#pragma once

#include <string_view>

#include "ops/op_common.h"

namespace mt::ops::cpu {

// Fails unless t is a defined, contiguous CPU i32 tensor of the given rank.
inline void check_i32_arg(const Tensor& t, std::string_view op, std::string_view arg, int ndim) {
    check_arg(t, op, arg, ndim);
    MT_CHECK(t.dtype() == DType::i32, "{}: {} has dtype {}, expected i32", op, arg, core::dtype_name(t.dtype()));
}

// Fails (naming the first offending element) unless every index of the CPU i32 tensor t lies in [lo, hi). A device
// tensor is not read (that would synchronise): its kernel checks its own indices.
inline void check_index_range(const Tensor& t, int64_t lo, int64_t hi, std::string_view op, std::string_view arg) {
    if (t.device() != core::Device::cpu) return;
    const int32_t* v = t.data<int32_t>();
    for (int64_t i = 0; i < t.numel(); ++i)
        MT_CHECK(v[i] >= lo && v[i] < hi, "{}: {}[{}] = {} is outside [{}, {})", op, arg, i, v[i], lo, hi);
}

// Document masking's argument check, shared by the entry points that take a map (attention, KDA, the short conv):
// fails unless the data tensor x ([B, T, ...]) is on the CPU, the only path with document masking so far (a clear
// error on CUDA, not a wrong result), and ds is a document-start map of x's rows (AttentionMask::doc_start): a
// contiguous CPU i32 [B, T] tensor whose element t of a row is t (a document starts there) or the value at t - 1.
inline void check_doc_start(const Tensor& ds, const Tensor& x, std::string_view op, std::string_view arg) {
    MT_CHECK(x.device() == core::Device::cpu,
             "{}: document masking ({}) runs on the CPU only so far; the CUDA kernels do not take it yet",
             op,
             arg);
    const int64_t b = x.size(0), t = x.size(1);
    check_i32_arg(ds, op, arg, 2);
    check_shape(ds, {b, t}, op, arg);
    MT_CHECK(ds.device() == core::Device::cpu, "{}: {} must be a CPU tensor", op, arg);
    const int32_t* d = ds.data<int32_t>();
    for (int64_t row = 0; row < b; ++row)
        for (int64_t i = 0; i < t; ++i) {
            const int32_t v = d[row * t + i];
            MT_CHECK(v == i || (i > 0 && v == d[row * t + i - 1]),
                     "{}: {}[{}, {}] = {} is not a document start map (t or the previous value)",
                     op,
                     arg,
                     row,
                     i,
                     v);
        }
}

}  // namespace mt::ops::cpu
