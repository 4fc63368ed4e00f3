// Argument checks used by the op entry points beyond those of ops/op_common.h: index tensors, document maps, the
// float arguments of an op whose tensors share one dtype (exit 1, as every argument error).
#pragma once

#include <initializer_list>
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

// The values of a host map [B, T] i32 (contiguous): element t of a row is t (a document starts there) or the value at
// t - 1; so every row starts a document at 0.
inline void check_doc_start_values(const Tensor& ds, std::string_view op, std::string_view arg) {
    const int64_t b = ds.size(0), t = ds.size(1);
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

// Document masking's argument check: fails unless ds is a document-start map of the rows of the data tensor x
// ([B, T, ...]; AttentionMask::doc_start): a contiguous i32 [B, T] tensor on x's device whose element t of a row is t
// (a document starts there) or the value at t - 1. The values are read on the CPU only: a device map is not copied
// back (that would synchronise every call), so its maker checks it (the model builds it on the host).
inline void check_doc_start_map(const Tensor& ds, const Tensor& x, std::string_view op, std::string_view arg) {
    const int64_t b = x.size(0), t = x.size(1);
    check_arg(ds, op, arg, 2);
    MT_CHECK(ds.dtype() == DType::i32, "{}: {} has dtype {}, expected i32", op, arg, core::dtype_name(ds.dtype()));
    check_shape(ds, {b, t}, op, arg);
    MT_CHECK(ds.device() == x.device(),
             "{}: {} is on the {} and the data on the {}",
             op,
             arg,
             core::device_name(ds.device()),
             core::device_name(x.device()));
    if (ds.device() == core::Device::cpu) check_doc_start_values(ds, op, arg);
}

// The float checks of an op whose tensors all take q's dtype: q a float CPU tensor of rank 4, and every defined
// tensor of args a float CPU tensor of that dtype (an undefined one is an optional argument left out).
inline void check_float_args_like_q(const Tensor& q, std::initializer_list<NamedArg> args, std::string_view op) {
    check_float_arg(q, op, "q", 4);
    for (const NamedArg& a : args)
        if (a.tensor.defined()) {
            check_float_arg(a.tensor, op, a.name, a.tensor.ndim());
            check_dtype_as(a.tensor, q, op, a.name, "q");
        }
}

// An optional tensor's data (null when undefined).
template <typename T>
T* data_or_null(const Tensor& t) {
    return t.defined() ? t.data<T>() : nullptr;
}

}  // namespace mt::ops::cpu
