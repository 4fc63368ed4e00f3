// CPU reference of splice_rows (ops/splice_rows.h): row copies from src into x at the index rows, and backward the
// gathered rows of dx into dsrc, each row then zeroed in dx.
#include "ops/splice_rows.h"

#include <cstddef>
#include <cstring>

#include "ops/cpu/checks.h"
#include "ops/cpu/threading.h"
#include "ops/registry.h"

namespace mt::ops::cpu {

namespace {

// backward = false: seq[index[i]] = rows[i]; true: rows[i] = seq[index[i]], then seq[index[i]] = 0. The index entries
// are distinct (checked), so every row of seq is touched by at most one iteration.
template <typename T>
void splice_rows_copy(const int32_t* index, T* rows, T* seq, int64_t m, int64_t c, bool backward) {
    const size_t bytes = static_cast<size_t>(c) * sizeof(T);
#pragma omp parallel for schedule(static) if (m * c >= kParallelMinWork)
    for (int64_t i = 0; i < m; ++i) {
        T* row = rows + i * c;                               // [c]
        T* slot = seq + static_cast<int64_t>(index[i]) * c;  // [c]
        if (backward) {
            std::memcpy(row, slot, bytes);
            for (int64_t j = 0; j < c; ++j) slot[j] = T(0);
        } else {
            std::memcpy(slot, row, bytes);
        }
    }
}

void splice_rows_run(const Tensor& rows,
                     std::string_view rows_arg,
                     const Tensor& index,
                     const Tensor& seq,
                     std::string_view seq_arg,
                     bool backward,
                     std::string_view op) {
    check_float_arg(seq, op, seq_arg, 2);
    check_float_arg(rows, op, rows_arg, 2);
    check_dtype_as(rows, seq, op, rows_arg, seq_arg);
    const int64_t m = rows.size(0);
    if (m == 0) return;
    MT_DISPATCH_FLOAT(
        seq.dtype(),
        op,
        splice_rows_copy(index.data<int32_t>(), rows.data<scalar_t>(), seq.data<scalar_t>(), m, seq.size(1), backward));
}

}  // namespace

// The CPU kernel of ops::splice_rows_fwd (registered in the op registry): the CPU dtypes, then the row copies.
void splice_rows_fwd(const Tensor& src, const Tensor& index, const Tensor& x) {
    splice_rows_run(src, "src", index, x, "x", false, "splice_rows_fwd");
}
MT_REGISTER_KERNEL(splice_rows_fwd, cpu, splice_rows_fwd, ::mt::ops::float_dtypes);

// The CPU kernel of ops::splice_rows_bwd (registered in the op registry): the CPU dtypes, then gather and zero.
void splice_rows_bwd(const Tensor& index, const Tensor& dx, const Tensor& dsrc) {
    splice_rows_run(dsrc, "dsrc", index, dx, "dx", true, "splice_rows_bwd");
}
MT_REGISTER_KERNEL(splice_rows_bwd, cpu, splice_rows_bwd, ::mt::ops::float_dtypes);

}  // namespace mt::ops::cpu
